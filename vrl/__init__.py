"""
The helpers that keep train.py, sample.py and prepare.py short, each module named for what it holds.
Three define what trains: settings.model_config (the GPTConfig), data (which windows a step reads, and
its seeds) and optim (the optimizer); hardware picks the device and precision, run_folder loads a run
to resume. The rest only check, report and keep a run safe: what a first reading skips.

    settings     train.py's settings checked, and the GPTConfig they describe
    data         prepared data read and checked; batches in a seeded order; each rank's share
    run_folder   out_dir: the lock, atomic checkpoints, the log; loading and resuming a checkpoint
    stops        Ctrl-C and SIGTERM save at a step boundary; NaN/inf stops; one-line errors under torchrun
    metrics      each step's log record, MFU (PEAK_TFLOPS), the estimate of a run's cost
    hardware     the device and precision, and whether a model fits its memory
    data_parallel  DDP's options, and the check that the replicas agree
    optim        AdamW as nanoGPT builds it, and Muon beside it
    tokenizer    characters, GPT-2 BPE and the paper's GPT-NeoX BPE
    datafiles    prepare.py's output folder, rewritten whole; .jsonl corpora
    slimpajama   the paper's data (prepare.py --dataset=slimpajama)
    locks        one writer per folder
    cli          one-line command-line errors; no file read whole from a pipe
"""
