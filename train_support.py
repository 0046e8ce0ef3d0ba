"""
What keeps train.py's runs safe on a laptop, a shared machine or a cluster, kept out of the way of a reader
who came to see how the model trains: that reader can skip this file. train.py calls each part by name:

    check_settings, needs_gpu     every setting checked before anything touches out_dir, the model sized
    model_config, check_model_fits  (its GPTConfig) against the device's memory before it is built
    RunFolder                     out_dir: a run never overwritten by accident, one writer at a time (a lock),
                                  what a kill left tidied, checkpoints written atomically, the log, and a line
                                  naming the last good checkpoint when a write fails
    check_resume                  a run continues only with the data and settings it was trained with
    memory_error_in_one_line      a model too big for the device
    estimate_time                 what the run will cost, said before any long work
    NonFinite                     the NaN/inf stop
    StopSignals                   Ctrl-C or SIGTERM: a checkpoint at a step boundary, every rank stopping
                                  together and waiting for rank 0's save; errors as one line under torchrun
    step_record, full_evaluation  what a step's and the last evaluation's log records and lines hold
    EpochOrder, validation_sets   the training windows' epoch order and the one-epoch refusal; what evaluation
    rank_pieces, seeded           scores, each rank's share of it; seeds drawn from the step alone
    micro_batches, ddp_options    each rank's share of a batch, DDP's gradient buckets
    mfu_peak                      the peak FLOP/s that MFU compares against (support.PEAK_TFLOPS)
    use_deterministic_kernels     deterministic=True, for bench.py's node check
"""
import contextlib
import functools
import inspect
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import torch
from torch.distributed import barrier
from torch.nn.parallel import DistributedDataParallel as DDP

import support
from model import GPTConfig

RUN_FILES = ('ckpt.pt', 'best.pt', 'log.jsonl')  # what a run writes to out_dir
# The settings a resumed run may change: where it writes and what it reports, the device it runs on and the
# memory it takes (micro_batch_size: the same batches), and where it stops (max_iters, on purpose). Every
# other one shapes the batches, the update or the numbers the run compares (eval_iters: best_val_loss), so it
# must match the checkpoint's; so must the data (its meta.json).
MAY_CHANGE_ON_RESUME = ('out_dir', 'init_from', 'overwrite', 'eval_interval', 'log_interval', 'eval_only',
                        'wandb_log', 'wandb_project', 'wandb_run_name', 'log_grad_norms', 'dataset',
                        'data_dir', 'max_iters', 'device', 'compile', 'peak_tflops', 'micro_batch_size')
FLOAT32_MAX = torch.finfo(torch.float32).max


# ------------------------------------------------------------------------------------------------------------
# before the run: settings, the machine, resuming

def check_settings(config):
    """End train.py with one line at the first setting out of range, before anything touches out_dir: a run
    that cannot start changes nothing on disk."""
    c = SimpleNamespace(**config)
    for ok, problem in [
        (c.init_from in ('scratch', 'resume'), f"init_from={c.init_from!r}; use 'scratch' or 'resume'"),
        (not (c.overwrite and c.init_from == 'resume'),
         "overwrite=True starts over and init_from='resume' continues; pick one"),
        (c.batch_size >= 1, f"batch_size={c.batch_size}; use 1 or more sequences"),
        (c.micro_batch_size is None or c.micro_batch_size >= 1,
         f"micro_batch_size={c.micro_batch_size}; use 1 or more sequences"),
        (c.block_size >= 1, f"block_size={c.block_size}; use 1 or more tokens"),
        (c.gradient_accumulation_steps >= 1,
         f"gradient_accumulation_steps={c.gradient_accumulation_steps}; use 1 or more"),
        (c.max_iters >= 0, f"max_iters={c.max_iters}; use 0 (evaluate only) or more steps"),
        (c.eval_interval >= 1, f"eval_interval={c.eval_interval}; use 1 or more steps"),
        (c.log_interval >= 1, f"log_interval={c.log_interval}; use 1 or more steps"),
        (c.eval_iters >= 1, f"eval_iters={c.eval_iters}; use 1 or more validation batches"),
        (c.data_order in ('auto', 'random', 'epoch', 'epochs'),
         f"data_order={c.data_order!r}; use 'auto', 'random', 'epoch' or 'epochs'"),
        (0 <= c.beta1 < 1 and 0 <= c.beta2 < 1, f"beta1={c.beta1}, beta2={c.beta2}; use values in [0, 1)"),
        # AdamW's first step moves each weight by up to learning_rate/(1-beta1) (its bias correction): beyond
        # float32's range that is inf and the model is lost at once; smaller rates that are still too high
        # stop on a NaN loss.
        (0 < c.learning_rate < FLOAT32_MAX * (1 - c.beta1),
         f"learning_rate={c.learning_rate}; use a rate above 0 with learning_rate/(1-beta1) below float32's "
         f"{FLOAT32_MAX:.3g}"),
        (0 <= c.min_lr <= c.learning_rate,
         f"min_lr={c.min_lr}; use a value from 0 to learning_rate={c.learning_rate}"),
        (0 <= c.warmup_iters <= c.lr_decay_iters,
         f"warmup_iters={c.warmup_iters}, lr_decay_iters={c.lr_decay_iters}; "
         f"use 0 <= warmup_iters <= lr_decay_iters"),
        (0 <= c.weight_decay < math.inf and 0 <= c.grad_clip < math.inf,
         f"weight_decay={c.weight_decay}, grad_clip={c.grad_clip}; use finite values, 0 or more"),
        (c.optimizer in ('adamw', 'muon'), f"optimizer={c.optimizer!r}; use 'adamw' or 'muon'"),
        (c.optimizer == 'adamw' or hasattr(torch.optim, 'Muon'),
         f"optimizer='muon' needs torch.optim.Muon, in torch 2.9 and later (this is torch "
         f"{torch.__version__}); upgrade torch, or use optimizer='adamw'"),
        (0 < c.muon_lr < math.inf and c.muon_adjust_lr in ('original', 'match_rms_adamw'),
         f"muon_lr={c.muon_lr}, muon_adjust_lr={c.muon_adjust_lr!r}; use a finite rate above 0, and "
         f"'original' or 'match_rms_adamw'"),
        (0 <= c.peak_tflops < math.inf,
         f"peak_tflops={c.peak_tflops}; use 0 (look it up) or the accelerator's peak"),
        (lr_scales_ok(c.lr_scales),
         f"lr_scales={c.lr_scales!r}; use [parameter name, multiplier] pairs, each name once and each "
         f"multiplier a finite number, 0 or more: [['blocks.0.attn.c_v.weight', 2.0], ...]"),
        (0 <= c.seed < 2 ** 64, f"seed={c.seed}; use an integer from 0 to 2**64 - 1"),  # torch.manual_seed's
    ]:
        if not ok:
            raise SystemExit(f"train.py: {problem}")


def model_config(config, vocab_size):
    """The GPTConfig of train.py's settings, its vocabulary vocab_size padded to a multiple of 64 (faster
    matmuls); a bad setting ends train.py with one line."""
    args = {f.name: config[f.name] for f in fields(GPTConfig) if f.name in config}
    try:
        return GPTConfig(**args | {'vocab_size': -(-vocab_size // 64) * 64})
    except (TypeError, ValueError) as e:
        raise SystemExit(f"train.py: bad model settings: {e}")


def lr_scales_ok(lr_scales):
    names = [pair[0] for pair in lr_scales if isinstance(pair, (list, tuple)) and len(pair) == 2]
    return (len(names) == len(lr_scales) == len(set(names)) and all(isinstance(n, str) for n in names)
            and all(isinstance(m, (int, float)) and not isinstance(m, bool) and 0 <= m < math.inf
                    for _, m in lr_scales))


def import_wandb():
    """wandb, imported only when wandb_log asks for it."""
    try:
        import wandb
    except ImportError:
        raise SystemExit("train.py: wandb_log=True needs wandb; pip install wandb, "
                         "or drop --wandb_log") from None
    return wandb


def min_params(cfg):
    """Lower bounds on GPT(cfg)'s parameters, (all, those in the blocks), from the shape alone, in no time at
    any size (building even a 'meta' model of 100,000 layers takes minutes): every layer's W_Q, W_O and
    SwiGLU MLP, and the embedding, twice unless tied. K, V, norms, λ and token tables come on top."""
    blocks = cfg.n_layer * (2 * cfg.n_embd ** 2 + 3 * cfg.n_embd * cfg.ffn_hidden)
    return blocks + cfg.vocab_size * cfg.n_embd * (1 if cfg.tie_embeddings else 2), blocks


def needs_gpu(model_config, block_size, tokens):
    """Why a run of model_config on this many tokens must not fall back to the CPU when device='auto' finds no
    GPU (a CUDA wheel the driver is too old for looks just like that), or None: training it would take over a
    day at 1 TFLOP/s, a fast CPU's pace, by GPT.flops_per_token's formula on min_params's count. Every CPU
    config here takes 1e13-1e14 FLOPs, every GPU one 1e18 or more."""
    cfg = model_config
    flops = (6 * min_params(cfg)[1] + 6 * cfg.n_layer * cfg.n_embd * block_size) * tokens
    days = flops / 1e12 / 86400
    return f"training this run takes over {flops:.1e} FLOPs, {days:,.0f} days at 1 TFLOP/s" \
        if days > 1 else None


def check_model_fits(cfg, device, training):
    """End train.py with one line, before anything is allocated, if the model cannot fit in device's memory:
    min_params at 16 bytes a parameter to train (fp32 weights and gradients, AdamW's two moments; activations
    come on top), 4 to evaluate."""
    params = min_params(cfg)[0]
    support.check_fits(params * (16 if training else 4), device,
                       f"train.py: n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, ffn_hidden={cfg.ffn_hidden} "
                       f"and vocab_size={cfg.vocab_size} make over {params:.3g} parameters, and "
                       f"{'training' if training else 'evaluating'} them",
                       "lower n_layer, n_embd or ffn_hidden, or use a device with more memory")


def check_resume(checkpoint, ckpt_path, saved_model_config, model_config, config, data_meta, eval_only):
    """End train.py with one line unless the checkpoint continues exactly: it holds what a resume needs, was
    trained on this data (its meta.json) with these settings and this model. An eval_only run, which writes
    nothing, may score it with other data or settings."""
    missing = [key for key in ('optimizer', 'scaler', 'iter_num', 'best_val_loss', 'config')
               if key not in checkpoint]
    if missing:
        raise SystemExit(f"train.py: {ckpt_path} has no {', '.join(missing)}, so it cannot be resumed "
                         f"exactly; start over with --overwrite=True")
    if config['max_iters'] < checkpoint['iter_num'] and not eval_only:
        raise SystemExit(f"train.py: max_iters={config['max_iters']} is below step {checkpoint['iter_num']} "
                         f"of {ckpt_path}, which is left as it is; resume with --max_iters above it to train "
                         f"on, or score it with --eval_only=True")
    saved_meta, saved_config = checkpoint['data_meta'], checkpoint['config']
    if saved_meta != data_meta and not eval_only:
        differ = sorted(key for key in saved_meta.keys() | data_meta.keys()
                        if saved_meta.get(key) != data_meta.get(key))
        raise SystemExit(f"train.py: {config['data_dir']} is not the data {ckpt_path} was trained on "
                         f"(meta.json differs in {', '.join(differ)}); resume with "
                         f"--dataset={saved_config['dataset']} as it was prepared, or start over with "
                         f"--overwrite=True")
    if saved_model_config != model_config:
        changed = [f.name for f in fields(GPTConfig)
                   if getattr(saved_model_config, f.name) != getattr(model_config, f.name)]
        raise SystemExit(f"train.py: the settings give a different model than {ckpt_path} "
                         f"({', '.join(changed)}); resume with the settings it was trained with")
    # a setting added to train.py since the checkpoint was written counts as unchanged
    changed = [f"{key}={saved_config[key]!r} (now {config[key]!r})" for key in config if key not in
               MAY_CHANGE_ON_RESUME and as_lists(saved_config.get(key, config[key])) != as_lists(config[key])]
    if changed and not eval_only:
        raise SystemExit(f"train.py: {ckpt_path} was trained with other settings: {', '.join(changed)}; "
                         f"resume with the settings it was trained with, or start over with --overwrite=True")


def as_lists(value):
    """value with every tuple in it a list: a λ table or lr_scales is the same setting whether a config file
    wrote it with tuples or the command line with lists."""
    return [as_lists(item) for item in value] if isinstance(value, (list, tuple)) else value


@contextlib.contextmanager
def memory_error_in_one_line(device):
    """End train.py with one line if the block runs out of memory: the allocator's "can't allocate memory", a
    RuntimeError, on the CPU or a GPU."""
    try:
        yield
    except RuntimeError as e:
        raise SystemExit(f"train.py: the model does not fit in {device} memory ({str(e).splitlines()[0]}); "
                         f"use a smaller model (n_layer, n_embd, ...) or a device with more memory") from None


def load_optimizer_state(optimizer, scaler, checkpoint, ckpt_path):
    try:
        optimizer.load_state_dict(checkpoint['optimizer'])
        scaler.load_state_dict(checkpoint['scaler'])
    except (ValueError, KeyError, RuntimeError) as e:
        raise SystemExit(f"train.py: the optimizer state in {ckpt_path} does not fit the model ({e}); "
                         f"start over with --overwrite=True") from None


# ------------------------------------------------------------------------------------------------------------
# out_dir

class RunFolder:
    """out_dir and the files a run writes there (RUN_FILES). Only the process that writes (writes=True: rank
    0, unless eval_only) saves and logs."""

    def __init__(self, out_dir, writes, wandb=None):
        self.out_dir, self.writes, self.wandb = out_dir, writes, wandb
        self.ckpt_path, self.best_path, self.log_path = (os.path.join(out_dir, name) for name in RUN_FILES)
        self.saved_step = None  # the step of the last good checkpoint, once there is one
        self.lock = None

    def check_can_start(self, init_from, overwrite):
        """Before anything touches it: out_dir is a folder, holds no run unless told what to do with it, and
        can be made and written to."""
        if os.path.exists(self.out_dir) and not os.path.isdir(self.out_dir):
            raise SystemExit(f"train.py: out_dir={self.out_dir} is a file, not a folder; "
                             f"pick another --out_dir")
        existing = [name for name in RUN_FILES if os.path.exists(os.path.join(self.out_dir, name))]
        if existing and init_from == 'scratch' and not overwrite:
            raise SystemExit(f"train.py: {self.out_dir} already holds a run ({', '.join(existing)}); "
                             f"continue it with --init_from=resume, or start over with --overwrite=True "
                             f"(deletes it), or pick another --out_dir")
        # a resume reads the log whole, to cut it back to the checkpoint's step
        support.refuse_pipe(self.log_path, "train.py: the run's log", "remove it, or replace it with a file")
        writable = self.out_dir
        while not os.path.exists(writable):  # the folder that will hold out_dir once it is made
            writable = os.path.dirname(os.path.abspath(writable))
        try:
            tempfile.TemporaryFile(dir=writable).close()
        except OSError as e:
            raise SystemExit(f"train.py: cannot write to {writable} ({e.strerror}); "
                             f"pick another --out_dir") from None

    def take(self, overwrite, resumed_step):
        """Make out_dir and hold out_dir/.lock while this process lives, so a second run into it is refused
        (one that dies, even by SIGKILL, lets go: support.hold); remove the half-written files of a killed
        run; then delete the old run (overwrite) or, resuming from resumed_step, cut the log back to what it
        said up to the checkpoint (its evaluation is repeated, so not its val record)."""
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            self.lock = support.hold(os.path.join(self.out_dir, '.lock'), 'train.py', self.refusal)
            self.remove_half_written_files()
            if overwrite:
                for name in RUN_FILES:
                    if os.path.exists(os.path.join(self.out_dir, name)):
                        os.remove(os.path.join(self.out_dir, name))
            if resumed_step is not None and os.path.exists(self.log_path):
                with open(self.log_path) as f:
                    kept = [line for line in f if is_record_before(line, resumed_step)]
                with open(self.log_path + '.tmp', 'w') as f:
                    f.writelines(kept)
                os.replace(self.log_path + '.tmp', self.log_path)
        except OSError as e:
            raise SystemExit(f"train.py: cannot write to {self.out_dir} ({e}); "
                             f"pick another --out_dir") from None

    def refusal(self, holder):
        return (f"another run ({holder}) is writing to {self.out_dir}; wait for it to end, "
                f"or pick another --out_dir")

    def remove_half_written_files(self):
        """Remove the .tmp files of writes a kill cut short (only ours: never a user's notes.tmp), saying so
        for a checkpoint's: a save killed mid-way, perhaps a stop-save that outlasted the scheduler's grace
        time."""
        for name in RUN_FILES:
            path = os.path.join(self.out_dir, name + '.tmp')
            if os.path.isfile(path):
                if name.endswith('.pt'):
                    print(f"train.py: removed {path}, a checkpoint write cut short by a kill "
                          f"(docs/training.md, 'Preemption', says how to give a stopped job time to save)",
                          file=sys.stderr)
                os.remove(path)

    def save(self, checkpoint, best):
        """Write ckpt.pt, and best.pt too when best, from one serialization: each atomically (a crash
        mid-write leaves the previous file intact), best.pt first (a kill between the two repeats that
        evaluation on resume), and best.pt as a second name of the same file where the filesystem has hard
        links, else a copy."""
        try:
            written = self.ckpt_path + '.tmp'
            if os.path.lexists(written):  # a killed save's, perhaps linked to best.pt: never write through it
                os.remove(written)
            torch.save(checkpoint, written)
            if best:
                link_or_copy(written, self.best_path + '.tmp')
                os.replace(self.best_path + '.tmp', self.best_path)
            os.replace(written, self.ckpt_path)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            self.cannot_write(self.ckpt_path, e)
        self.saved_step = checkpoint['iter_num']

    def save_at_stop(self, checkpoint, nonfinite, how):
        """After a stop signal, save the step the run stopped at (checkpoint() gives it) unless its loss had
        become NaN or inf, and say so in one line."""
        if not self.writes:
            return
        state = checkpoint()
        if nonfinite.seen():
            outcome = f"the loss had become NaN or inf, so nothing saved; {self.kept()}"
        else:
            self.save(state, best=False)
            outcome = f"saved {self.ckpt_path}; continue with --init_from=resume and the same settings"
        print(f"train.py: {how} at step {state['iter_num']}; {outcome}", file=sys.stderr)

    def log(self, record):
        """Append record to log.jsonl (and wandb)."""
        if self.writes:
            try:  # a record cut short by a full disk is skipped on resume, like one cut by a kill
                with open(self.log_path, 'a') as f:
                    f.write(json.dumps(record) + '\n')
            except OSError as e:
                self.cannot_write(self.log_path, e)
            if self.wandb:
                self.wandb.log(record, step=record['step'])

    def kept(self):
        """What a run that stops now leaves, for the line that says why it stopped."""
        return (f"{self.ckpt_path} (step {self.saved_step}) is the last good checkpoint"
                if self.saved_step is not None else "no checkpoint written")

    def cannot_write(self, path, error):
        raise SystemExit(f"train.py: cannot write {path} ({type(error).__name__}: {error}); free disk space "
                         f"or fix out_dir, {self.kept()}") from None


def is_record_before(line, step):
    """Whether a line of log.jsonl is a record of a step before step, or step's training record: what a run
    resumed at step keeps. A line cut by a kill or a full disk, or not a record, is not."""
    try:
        record = json.loads(line)
        return record['step'] < step or (record['step'] == step and 'val_loss' not in record)
    except (ValueError, TypeError, KeyError):
        return False


def link_or_copy(source, target):
    if os.path.lexists(target):
        os.remove(target)
    try:
        os.link(source, target)
    except OSError:  # no hard links here (some network and FUSE filesystems)
        shutil.copyfile(source, target)


# ------------------------------------------------------------------------------------------------------------
# during the run

TIMED_PASSES = 5  # the training micro-batches the estimate times, after two untimed ones (three if compiled)


def estimate_time(micro_batch, eval_batch, autocast, counts, model, optimizer, compiled, cuda, schedule,
                  tokens_per_step, say):
    """Say what the run will cost before any long work, from micro_batch() (a training forward and backward,
    whose gradients are then dropped: no update, and every step seeds its own randomness, so the run is
    unchanged) and eval_batch(), timed on every rank. The first calls pay for allocation, kernel selection
    and any compiling, and come out up to 1.6x slower than the steps that follow (the second still up to
    1.3x): they are not timed; the estimate is the median of TIMED_PASSES timed calls, their range said. The
    optimizer's update is not timed (it would change the weights). counts: this rank's
    (micro-batches a step, evaluation batches, the last evaluation's more on every validation window);
    schedule: (this run's first step, max_iters, eval_interval); say: rank 0's print. Both run under
    autocast."""
    micro_batches, eval_batches, full_eval_batches = counts
    first_step, max_iters, eval_interval = schedule
    with autocast:
        warming, times = seconds_of(micro_batch, 2 + compiled, TIMED_PASSES, cuda)
    optimizer.zero_grad(set_to_none=False)  # as train.py's loop: DDP's gradients stay views of its buckets
    model.eval()
    with autocast:  # (no evaluation batches: a rank with no share of the validation windows)
        eval_warming, eval_times = seconds_of(torch.no_grad()(eval_batch), compiled, 1, cuda) \
            if eval_batches else (0, [0])
    model.train()
    steps = [t * micro_batches for t in times]
    step, evaluation = statistics.median(steps), eval_times[0] * eval_batches
    compiling = warming + eval_warming - (2 + compiled) * times[0] - compiled * eval_times[0]
    compiling = f"; compiling took {duration(compiling)}" if compiled else ""
    first_eval = -(-first_step // eval_interval) * eval_interval
    evaluations = len(set(range(first_eval, max_iters + 1, eval_interval)) | {max_iters})
    to_go = max_iters - first_step
    say(f"about {duration(step)} a step ({duration(min(steps))} to {duration(max(steps))} over "
        f"{len(steps)} timed ones; {tokens_per_step / step:,.0f} tokens/s): {duration(step * to_go)} for the "
        f"{to_go} steps to go, plus {duration(evaluation * evaluations + eval_times[0] * full_eval_batches)} "
        f"for {evaluations} evaluations"
        f"{' (the last also of every validation window)' if full_eval_batches else ''}{compiling}")


def seconds_of(work, untimed, timed, cuda):
    """(seconds of untimed calls of work(), [seconds of each of the timed calls that follow]), waiting for
    the device after each."""
    seconds = []
    for _ in range(untimed + timed):
        start = time.time()
        work()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.time() - start)
    return sum(seconds[:untimed]), seconds[untimed:]


def duration(seconds):
    return (f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min" if seconds >= 90
            else f"{seconds:.3g} s")


def step_record(step, train_loss, grad_norm, lr, tokens_per_sec, grad_norms, model, block_size, peak, ranks,
                device):
    """A training step's record for log.jsonl, and its line: the loss (the mean over ranks), the gradient norm
    and rate, the job's tokens/s, and MFU, peak memory, learned λ and per-matrix gradient norms where they
    apply."""
    record = {'step': step, 'train_loss': train_loss, 'grad_norm': grad_norm, 'lr': lr,
              'tokens_per_sec': tokens_per_sec}  # the job's, all ranks together
    if peak:  # of one GPU: what each rank trains on, against its peak; 'mfu_palm' counts the full T x T
        # attention, as PaLM's and nanoGPT's MFU do
        for key, causal in (('mfu', True), ('mfu_palm', False)):
            record[key] = model.flops_per_token(block_size, causal) * (tokens_per_sec / ranks) / (peak * 1e12)
    if torch.device(device).type == 'cuda':  # rank 0's; a host-side counter, so no wait for the GPU
        record['peak_memory_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    if model.config.lambda_mode != 'fixed':
        record['lambdas'] = model.lambdas.tolist()
    if grad_norms is not None:
        record['grad_norms'] = grad_norms
    mfu = (f", mfu {100 * record['mfu']:.1f}% (PaLM's count {100 * record['mfu_palm']:.1f}%) of "
           f"{peak:g} TFLOP/s per GPU" if peak else "")
    return record, f"step {step}: loss {train_loss:.4f}, lr {lr:.2e}, {tokens_per_sec:,.0f} tok/s{mfu}"


def use_deterministic_kernels(device_type):
    """Deterministic kernels (deterministic=True), for bench.py's node check. An op that has none warns rather
    than stops the run: the node check then finds the runs apart and falls back to its bound."""
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # cuBLAS reads it once, at its first call
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device_type == 'cuda':  # the fused attention kernels' backwards add in no fixed order
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)


def full_evaluation(losses, full_val_sets):
    """The log record's fields and the line's words of an evaluation on every validation window: losses is
    train.py's evaluate(full_val_sets, ...)."""
    loss, domain_losses = losses
    full = {'val_loss_full': loss, 'val_loss_full_domains': domain_losses,
            'val_windows_full': sum(len(places) for _, places in full_val_sets.values())}
    return full, f"; all {full['val_windows_full']:,} windows: {loss:.4f}{by_domain(domain_losses)}"


def by_domain(losses):
    """' (domain loss, ...)' to follow a printed val loss, or nothing for one validation split."""
    return '' if losses is None else f" ({', '.join(f'{name} {loss:.4f}' for name, loss in losses.items())})"


class NonFinite:
    """The NaN/inf stop. A flag on the device is set at any step whose training loss or gradient norm is NaN
    or inf; reading it waits for the device, so it is read only at log and evaluation steps (and before any
    save), except on a CPU, where the read is free and every step is checked before the update. A run that
    finds one stops with one line, saving nothing: run's last checkpoint is the last good one."""

    def __init__(self, device, ddp, first_step, run):
        self.ddp, self.run, self.every_step = ddp, run, torch.device(device).type == 'cpu'
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.loss = self.grad_norm = torch.zeros((), device=device)  # the latest step's, for the message
        self.checked_step = first_step  # the first step whose loss is not yet known to be finite

    def observe(self, step, loss, grad_norm, scaler, check):
        """Note step's training loss and gradient norm (before the update), and check them now if check, or
        on a CPU."""
        self.loss, self.grad_norm = loss, grad_norm
        self.flag |= ~torch.isfinite(loss)
        # fp16's GradScaler makes inf gradients now and then, and skips those steps
        if not scaler.is_enabled():
            self.flag |= ~torch.isfinite(grad_norm)
        if check or self.every_step:
            self.check(step)

    def check(self, last_step, val_loss=None):
        """Stop if the training loss or gradient norm was NaN or inf at a step since the last check, up to
        last_step, or if val_loss, taken after it, is. Every rank calls it at the same steps."""
        flag = self.flag.int()
        if self.ddp:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item():
            steps = (f"step {last_step}" if self.checked_step == last_step
                     else f"one of steps {self.checked_step}-{last_step}")
            raise SystemExit(f"train.py: the training loss or gradient norm became NaN or inf at {steps} "
                             f"(loss {self.loss.item():.4g}, gradient norm {self.grad_norm.item():.4g}); "
                             f"stopped without saving, {self.run.kept()}")
        self.checked_step = last_step + 1
        if val_loss is not None and not math.isfinite(val_loss):
            raise SystemExit(f"train.py: validation loss {val_loss} at step {last_step + 1}; "
                             f"stopped without saving, {self.run.kept()}")

    def seen(self):
        return bool(self.flag.item())


class StopSignals:
    """Ctrl-C (SIGINT) or a scheduler's SIGTERM stops the run at a step boundary, with a checkpoint of that
    step to resume from. One process stops at once, or at the end of a deferred() block; under torchrun every
    rank stops at the same step_boundary() (SIGTERM may reach one rank first), and all wait for rank 0's
    save. Made by every rank where the process group starts (under torchrun on GPUs it makes a gloo group)."""

    def __init__(self, ddp, rank, device_type):
        self.ddp, self.rank = ddp, rank
        # the signal that asked the run to stop; whether it waits for a block to end
        self.signal, self.holding = 0, False
        # for the stop flag and the waits for rank 0's saves: on a CPU the default group, else a gloo one by
        # NCCL's
        self.group = torch.distributed.new_group(backend='gloo') if ddp and device_type == 'cuda' else None

    @contextlib.contextmanager
    def caught(self, run, checkpoint, nonfinite):
        """Run the block with stop signals caught: when one stops it, rank 0 saves checkpoint()
        (run.save_at_stop), every rank waits for it, and all exit together with the shell's code for death by
        that signal (130 for Ctrl-C). The weights are those of a step boundary (updates are deferred), and
        every rank's are the same. An error in the block, or in the save, ends the rank: end_rank."""
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        except (SystemExit, RuntimeError) as error:
            end_rank(error, self.ddp, self.rank)
        except KeyboardInterrupt:
            self.holding = True  # a second Ctrl-C (or torchrun's SIGTERM to the ranks left) waits for it
            how = ('interrupted' if self.signal == signal.SIGINT
                   else 'stopped by ' + signal.Signals(self.signal).name)
            try:
                run.save_at_stop(checkpoint, nonfinite, how)
                self.wait_for_rank_0()
            except (SystemExit, RuntimeError) as error:
                end_rank(error, self.ddp, self.rank)
            raise SystemExit(128 + self.signal) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def on_signal(self, signum, _frame):
        self.signal = signum
        if not (self.holding or self.ddp):
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self):
        """Hold back a stop signal until the block ends, so the weights, log and checkpoints always agree."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.signal and not self.ddp:
            raise KeyboardInterrupt

    def step_boundary(self):
        """Under torchrun, stop every rank at this step if any rank got a stop signal: a MAX all-reduce of
        the signal number. It goes over a gloo group, on the CPU, so on a GPU it never waits for queued
        kernels, only for the other ranks' CPUs: ~0.1 ms a step, against seconds of grace."""
        if self.ddp:
            flag = torch.tensor(self.signal)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
            # (never reset self.signal to 0 here: a signal may have arrived during the all-reduce)
            if flag.item():
                self.signal = flag.item()
                raise KeyboardInterrupt

    def wait_for_rank_0(self):
        """Under torchrun, hold every rank until rank 0 has written its checkpoint, then let them go
        together: no rank exits while rank 0 still writes (torchrun kills the others 30 s after one exits),
        and none waits in an NCCL collective meanwhile (its watchdog ends a wait of 10 minutes). A 1.6B
        checkpoint is about 20 GB. The wait is on the gloo group, on the CPU; gloo's timeout, 30 minutes,
        bounds it."""
        if self.ddp:
            barrier(group=self.group)


def end_rank(error, ddp, rank):
    """Re-raise error, under torchrun as a one-line stop_rank: a SystemExit's message, or, for gloo's error in
    a collective whose peer has exited, a line saying so (that peer says why). Other errors keep their
    traceback."""
    if ddp and isinstance(error, SystemExit) and isinstance(error.code, str):
        stop_rank(error.code)
    if ddp and isinstance(error, RuntimeError) and ' by peer' in str(error):
        stop_rank(f"train.py: rank {rank} stopped because another rank failed", after_a_peer=True)
    raise error


def stop_rank(message, after_a_peer=False):
    """End this rank with its one-line error. torchrun gets it in the rank's error file instead of stderr:
    its closing summary, the last thing it prints, shows the first failure's line, so the line shows once,
    last. A rank that stops because a peer failed is stamped a second later, so that the peer's failure
    stays first."""
    if 'TORCHELASTIC_ERROR_FILE' not in os.environ:  # plain python, or another launcher
        raise SystemExit(message)
    error = {'message': message, 'extraInfo': {'timestamp': int(time.time()) + after_a_peer}}
    with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
        json.dump({'message': error}, f)
    raise SystemExit(1)


# ------------------------------------------------------------------------------------------------------------
# training and validation windows: train.py draws them, and reads them, through these

def seeded(seed, *keys):
    """A seed derived from `seed` and integer keys: batches and dropout depend on the step alone, not on RNG
    state carried across steps, so a resumed run and a run on any number of ranks draw the same ones."""
    return hash((seed, *keys)) & (2 ** 63 - 1)  # int tuples hash identically in every process


def window_starts(shard, block_size):
    """Where a shard's windows of block_size + 1 tokens that share no target start: every block_size tokens,
    each overlapping the next by the token that is its last target and the next one's first input, so every
    token but a shard's first is a target once. (The paper's 2,048-token chunks share no token.)"""
    return range(0, len(shard) - block_size, block_size)


def every_window(shards, block_size):
    return [(s, i) for s, shard in enumerate(shards) for i in window_starts(shard, block_size)]


class EpochOrder:
    """data_order 'epoch' and 'epochs': every training window once an epoch, in a seeded random order (the
    paper's one epoch, ICLR Sec. 4.1.2). Built for every run, as it first checks what every data order needs:
    each training shard holds a window."""

    def __init__(self, shards, block_size, seed, data_dir):
        if any(len(shard) <= block_size + 1 for shard in shards):
            raise SystemExit(f"train.py: a training shard in {data_dir} is shorter than "
                             f"block_size={block_size}; lower block_size")
        self.block_size, self.seed, self.data_dir = block_size, seed, data_dir
        # the windows numbered shard after shard: shard s holds numbers first_window[s] onwards
        self.first_window = np.cumsum([0] + [len(window_starts(shard, block_size)) for shard in shards])
        self.windows = int(self.first_window[-1])
        self.order = functools.lru_cache(maxsize=2)(self.order)  # the epoch at hand, and the next one

    def order(self, epoch):
        """A seeded random order of the windows: 9.8M numbers, 78 MB, at 20B tokens."""
        generator = torch.Generator().manual_seed(seeded(self.seed, -1, epoch))  # steps are never -1
        return torch.randperm(self.windows, generator=generator).numpy()

    def places(self, step, global_batch):
        """(shard, start) of the windows of the step's global batch."""
        epochs, index = np.divmod(np.arange(step * global_batch, (step + 1) * global_batch), self.windows)
        number = np.array([self.order(epoch)[i] for epoch, i in zip(epochs.tolist(), index.tolist())])
        shard = np.searchsorted(self.first_window, number, side='right') - 1
        return list(zip(shard.tolist(), ((number - self.first_window[shard]) * self.block_size).tolist()))

    def refuse_a_second_epoch(self, max_iters, global_batch, data_meta, data_order, by_domain):
        """data_order='epoch' reads each window once at most: a run that needs more stops here, naming the
        prepare.py command that makes enough (SlimPajama) or the fix."""
        if max_iters * global_batch <= self.windows:
            return
        needed = max_iters * global_batch * self.block_size
        # 0.1% to spare (a shard's last, partial window is none), rounded up to 3 digits: 21e9 for 10k steps
        unit = 10 ** max(int(math.log10(needed)) - 2, 0)
        enough = math.ceil(needed * 1.001 / unit) * unit
        more = (f"`python prepare.py --dataset=slimpajama --tokenizer={data_meta['tokenizer']} "
                f"--max_tokens={enough:_} --out_dir={self.data_dir}`" if by_domain else "more text")
        raise SystemExit(f"train.py: {max_iters} steps of {global_batch} windows read "
                         f"{max_iters * global_batch:,} windows of {self.block_size} tokens "
                         f"({needed:,} tokens), but the training split of {self.data_dir} holds "
                         f"{self.windows:,}, each read once (data_order={data_order!r}); prepare enough with "
                         f"{more}, or allow repeats with --data_order=epochs")


def validation_sets(val_split, val_domains, eval_iters, batch_size, block_size):
    """(val_sets, full_val_sets), each {name: (shards, windows)}. val_sets, what every evaluation scores: the
    validation split's eval_iters x batch_size windows, evenly spaced; or, where the data keeps it by domain
    (SlimPajama), each domain's, as the paper scores them, sharing as many equally in whole batches (so
    training's micro-batches divide them). full_val_sets: every window of every domain, which the last
    evaluation of a run also scores, as the paper reports (ICLR A.6; the official src/training_args.py's
    max_eval_samples=None); none for a single corpus (Shakespeare's runs, and their results, stay as they
    were)."""
    def sample(shards, places, count, what):
        if len(places) < count:
            raise SystemExit(f"train.py: {what} has {len(places)} windows of {block_size} tokens, fewer than "
                             f"the {count} evaluation takes; lower eval_iters or batch_size")
        return shards, [places[round(k * (len(places) - 1) / max(count - 1, 1))] for k in range(count)]

    if val_domains is None:
        places = every_window(val_split, block_size)
        return {'val': sample(val_split, places, eval_iters * batch_size, 'the validation split')}, {}
    share = -(-eval_iters // len(val_domains)) * batch_size
    full_val_sets = {name: (shards, every_window(shards, block_size)) for name, shards in val_domains.items()}
    return ({name: sample(shards, places, share, f"the validation split of domain {name}")
             for name, (shards, places) in full_val_sets.items()}, full_val_sets)


def rank_pieces(sets, piece, rank, world_size):
    """This rank's share of the windows of sets ({name: (shards, windows)}), in pieces of piece windows."""
    return [(name, places[i:i + piece]) for name, (_, places) in sets.items()
            for i in range(0, len(places), piece)][rank::world_size]


# ------------------------------------------------------------------------------------------------------------
# data parallel, and MFU

def micro_batches(global_batch, world_size, rank, batch_size):
    """The micro-batches of one rank as (start, stop) into the global batch: its contiguous share of
    global_batch / world_size sequences, in pieces of at most batch_size."""
    if global_batch % world_size:
        raise SystemExit(f"train.py: the global batch, gradient_accumulation_steps x batch_size = "
                         f"{global_batch} sequences, does not split evenly over {world_size} ranks; "
                         f"make it a multiple of {world_size}")
    share = global_batch // world_size
    return [(rank * share + i, rank * share + min(i + batch_size, share))
            for i in range(0, share, batch_size)]


def ddp_options(model):
    """DDP's keyword arguments for model: gradient_buckets, and buffers that are never synced."""
    return {**buffer_sync_off(inspect.signature(DDP).parameters), **gradient_buckets(model)}


def buffer_sync_off(ddp_parameters):
    """DDP's keyword for not syncing buffers before every forward (ours, the RoPE table and fixed λ,
    never change): recent torch's forward_sync_buffers, which deprecates broadcast_buffers, older
    torch's only one."""
    return {'forward_sync_buffers' if 'forward_sync_buffers' in ddp_parameters
            else 'broadcast_buffers': False}


def gradient_buckets(model):
    """DDP's gradient buckets: each about one block's fp32 gradients (DDP's default 25 MB at the least), and
    the gradients kept as views into them. Compiled, DDPOptimizer cuts the graph at every bucket: at 1.6B,
    25 MB buckets would make ~270 pieces, one block's make ~26, and each block's all-reduce still overlaps the
    backward of the block below. As views, the gradients need no second copy (6.7 GB at 1.6B)."""
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return {'bucket_cap_mb': max(25, 4 * block / 2 ** 20), 'gradient_as_bucket_view': True}


def replicas_differ_by(model):
    """The most any weight differs across the ranks. DDP keeps the replicas identical by construction: checked
    once, cheaply, at the end."""
    weights = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    highest, lowest = weights.clone(), weights.clone()
    torch.distributed.all_reduce(highest, op=torch.distributed.ReduceOp.MAX)
    torch.distributed.all_reduce(lowest, op=torch.distributed.ReduceOp.MIN)
    return (highest - lowest).max().item()


def mfu_peak(peak_tflops, device, say):
    """One accelerator's peak TFLOP/s that MFU compares against: peak_tflops if given, else the GPU's in
    support.PEAK_TFLOPS, else 0 (no MFU; always so on a CPU). On a GPU, say() which, or that there is none."""
    gpu_name = torch.cuda.get_device_name(device) if torch.device(device).type == 'cuda' else None
    peak = peak_tflops or support.PEAK_TFLOPS.get(gpu_name, 0.0)
    if gpu_name:
        source = 'peak_tflops' if peak_tflops else 'PEAK_TFLOPS'
        say(f"MFU per GPU, of {peak:g} TFLOP/s ({source}: {gpu_name})" if peak
            else f"no MFU: {gpu_name} is not in PEAK_TFLOPS (support.py); give one GPU's dense bf16 TFLOP/s "
                 f"with --peak_tflops")
    return peak
