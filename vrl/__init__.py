"""
The helpers that keep train.py, sample.py and prepare.py short, each module named for what it holds. None of
them defines what trains: train.py builds the batches, the model's config, the schedule and the step itself;
optim builds the optimizer's groups (nanoGPT's AdamW, or Muon). The rest check, report and keep a run safe:
what a first reading skips.

    settings     train.py's settings checked (one line for a bad one), and the model config they describe
    data         prepared data read and checked; the seeded order of the training windows; the
                 validation windows each evaluation scores
    run_folder   out_dir: the lock, atomic checkpoints with a checksum, the log; loading and resuming
    stops        Ctrl-C, SIGTERM, SIGHUP, SIGUSR1: noted and acted on at a step boundary; one-line errors
                 under torchrun
    metrics      each logged step's record, MFU (PEAK_TFLOPS), the estimate of a run's cost
    hardware     the device and precision, and whether a model fits its memory
    optim        AdamW as nanoGPT builds it, and Muon beside it
    tokenizer    characters, GPT-2 BPE and the paper's GPT-NeoX BPE
    datafiles    prepare.py's output folder, rewritten whole; .jsonl corpora
    slimpajama   the paper's data (prepare.py --dataset=slimpajama)
    locks        one writer per folder
    cli          one-line command-line errors; no file read whole from a pipe; a closed stdout is no error
"""
