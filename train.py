"""
Train a ResFormer, SVFormer or baseline on one CPU or GPU, or on N GPUs with torchrun (DDP):

    python train.py                                # a small Identity ResFormer on Shakespeare (CPU)
    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=vanilla

It reads as nanoGPT's train.py: settings; data (read, get_batch, on_device, pieces); model,
optimizer; get_lr, stop_now, eval_loss, evaluate, forward_backward, checkpoint, stop_unsaved, save,
scores_every_window, evaluation, eval_passes; the loop (exits: its ways out). Each helper call's
comment is its contract: no need to open vrl/, ablations.py, configurator.py. The collectives
(tests/test_collectives.py checks this list against the code):
  start-up  init_process_group  default group: NCCL on CUDA, else gloo; 10-min timeout; once
  start-up  new_group           cpu_group: gloo, 60-min timeout (for rank 0's save); once
  start-up  DDP                 default: rank 0's weights to all, once (after a check of their shapes);
                                the gradients' mean, in the backward of each step's last pass
  stop_now  all_reduce          cpu_group, MAX of the stop flag: each boundary, after an evaluation,
                                every 16 pieces of one
  evaluate  all_reduce          default, SUM of the losses: once a set scored (twice with val_full)
  save      all_reduce          default, SUM of the NaN count: each save
  save      barrier             cpu_group: all wait for rank 0's host copy, or its write (foreground)
  loop      all_reduce x3       default, SUM at logs: NaN count (CPU: every step), loss, CUDA's peaks
  end       all_reduce x2       default, MAX and MIN of the weights: once (the replicas agree)
  end       barrier             default: a run that went well waits for every rank, then
  end       destroy_process_group  tears both groups down
  vrl/stops.py:leave_group destroy_process_group  any other way out of the loop: a SystemExit or
                                RuntimeError (a stop, max_time, an error), in exits()
"""
import time
_launched = time.time()  # max_time counts from here (private: not a setting)
from vrl import stops  # first: Ctrl-C, even during the imports, ends in one line
stop = stops.StopSignals()  # Ctrl-C, SIGTERM, SIGHUP, SIGUSR1: until the loop (exits), exit 128+n

import inspect
import math
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from datetime import timedelta

import numpy as np
import torch
from torch.distributed import ReduceOp, all_reduce, barrier, destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ablations import AblationConfig, build_model
from configurator import configure
from vrl import hardware, metrics, optim, run_folder, settings
from vrl.data import open_dataset

# -----------------------------------------------------------------------------
# default settings: a small Identity ResFormer on char-level Shakespeare, minutes on a laptop CPU
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate every this many steps and at the last; then save, but not at step 0
log_interval = 10  # log the mean training loss of every this many steps
eval_iters = 10  # val batches of batch_size, fixed (by domain: ceil(eval_iters / domains) each)
eval_full = False  # score every validation window at every evaluation (not at step 0), the paper's
eval_only = False  # evaluate once, print the loss and stop; writes nothing
ckpt_interval = 0  # also write ckpt.pt every this many steps (0: at evaluations only)
max_time = 0  # seconds: save and exit 0 at the first step boundary past it (0: no limit); exit 1
#   there if this launch trained no step and so far saves nothing (raise max_time)
init_from = 'scratch'  # 'scratch', 'resume' (from out_dir/ckpt.pt) or 'auto' (resume if there is one)
overwrite = False  # let a fresh run replace a run already in out_dir (ckpt.pt, best.pt, log.jsonl)
save_checkpoint = True  # False: write no ckpt.pt or best.pt (lab/bench.py's node check times runs)
wandb_log = False
wandb_project = 'value-residual'
wandb_run_name = 'run'
log_grad_norms = False  # also log each parameter's gradient norm (before clipping) at each log step
# data
dataset = 'shakespeare_char'  # a folder under data/ written by prepare.py
gradient_accumulation_steps = 1  # passes a step, all ranks together (nanoGPT's), each batch_size
batch_size = 16  # sequences a pass: a step trains on gradient_accumulation_steps x batch_size
block_size = 128  # tokens per sequence: the context length T
data_order = 'auto'  # 'random' (nanoGPT), 'epoch' (each window once), 'epochs'; 'auto': epoch
#   on data kept by domain (SlimPajama, the paper's one epoch), random elsewhere
# model: these, and every other field of AblationConfig (ablations.py, model.py) at its default
variant = 'resformer_identity'  # vanilla, resformer_identity/constant/sparse/learnable/learnable_plus,
#   svformer (model.py's VARIANTS), a baseline (ablations.py's BASELINES: neutreno, neutreno_resformer,
#   denseformer, cla, share_k, share_v, shared_query, shared_key), or 'custom'
n_layer = 4
n_head = 4
n_embd = 128
# optimizer: AdamW (the paper's), warmup, then cosine decay to min_lr
learning_rate = 2e-3
max_iters = 600
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
warmup_iters = 50
lr_decay_iters = 600
min_lr = 2e-4
lr_scales = []  # [parameter name, multiplier] pairs trained at multiplier x the rate (v5 Sec. 4.3)
muon = False  # Muon (torch 2.9+) for the blocks' matrices instead, AdamW for the rest
muon_lr = 0.02  # Muon's peak rate, scaled by the schedule as learning_rate is
muon_adjust_lr = 'original'  # Muon's rate per matrix shape: 'original' or 'match_rms_adamw'
# system
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name); or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto': bfloat16 on GPUs that have it, else float16 on CUDA, else float32
compile = None  # torch.compile: None = on for CUDA, off elsewhere (where it does not pay)
peak_tflops = 0.0  # one accelerator's peak for MFU; 0 = the GPU's, from vrl/metrics.py's table
deterministic = False  # deterministic kernels (math attention on CUDA): bit for bit, slower
seed = 1337
# -----------------------------------------------------------------------------
config = configure(globals(), sys.argv[1:], script=__file__, fields_of=AblationConfig,
                   except_fields=('vocab_size',), types={'compile': bool},  # the data sets vocab_size
                   verbose=os.environ.get('RANK', '0') == '0')
globals().update(config)  # the settings after config files and --key=value: for the log and ckpt
# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the process group starts once everything is checked
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, None, 1))
master_process = ddp_rank == 0
settings.check(config, ddp_world_size)  # settings, ranks' shares, wandb, the launch: else one line
global_batch = gradient_accumulation_steps * batch_size  # sequences a step, on any number of ranks
tokens_per_iter = global_batch * block_size
# prepare.py's files, checked; data.places(step, n): the step's n windows, from seed and step alone
data = open_dataset(os.path.join('data', dataset), block_size, seed, data_order, max_iters,
                    global_batch, eval_iters, batch_size, eval_full)
# AblationConfig (ablations.py: model.py's GPTConfig + flags) of the settings, vocab padded to a multiple
# of 64. A paper variant sets no flag: its λ are model.py's (the table under VARIANTS; the first line of
# AblationConfig.apply_variant hands it to GPTConfig's), build_model returns model.py's GPT
model_config = settings.model_config(config, data.meta['vocab_size'])
# torchrun: cuda:LOCAL_RANK, made current; TF32 on CUDA; one line: a model too big, a big run on CPU
device, device_type, dtype = hardware.setup(config, model_config, ddp_local_rank)  # dtype: a name
run = run_folder.RunFolder(out_dir, init_from, overwrite, writes=master_process and not eval_only,
                           saves=save_checkpoint)  # rank 0 locks out_dir, then checks it

# -----------------------------------------------------------------------------
# data: each rank's share of a step's windows, in passes of batch_size (they split evenly: checked)
rank_share = global_batch // ddp_world_size
rank_passes = [(ddp_rank * rank_share + i, ddp_rank * rank_share + i + batch_size)
               for i in range(0, rank_share, batch_size)]

def read(shards, places):
    """The windows of block_size + 1 tokens at (shard, start) places: rows (B, T + 1) of token ids
    on the CPU, pinned for a CUDA copy."""
    rows = np.stack([shards[s][i:i + block_size + 1].astype(np.int64) for s, i in places])
    if rows.max() >= data.meta['vocab_size']:  # only the validation split was scanned when opened
        raise SystemExit(f"train.py: {data.dir} holds token id {rows.max()}, outside its vocabulary; "
                         f"run `{data.prepare_command}` again; stopped, {run.kept}")
    rows = torch.from_numpy(rows)
    return rows.pin_memory() if device_type == 'cuda' else rows

def get_batch(step):
    """nanoGPT's get_batch by step: this rank's passes of the step's windows, whose places depend on
    the seed and the step alone: the same batches on any number of ranks, and after a resume."""
    places = data.places(step, global_batch)
    return [read(data.train, places[start:stop]) for start, stop in rank_passes]

def on_device(rows):
    """(inputs, next-token targets) on the device: one copy, two views."""
    rows = rows.to(device, non_blocking=device_type == 'cuda')
    return rows[:, :-1], rows[:, 1:]

def pieces(sets):  # the validation windows of sets in passes of batch_size, for the ranks to share
    return [(name, places[i:i + batch_size]) for name, (_, places) in sets.items()
            for i in range(0, len(places), batch_size)]

# -----------------------------------------------------------------------------
# model and optimizer: from scratch, or the architecture, weights and optimizer of out_dir/ckpt.pt
iter_num, best_val_loss, last_eval = 0, float('inf'), None
loss_since_log, steps_since_log = 0.0, 0  # the training loss summed over the steps since a log
if run.resuming:  # ckpt.pt's (ckpt.prev.pt's if ckpt.pt is torn), checked to continue exactly: the
    raw_model, ckpt = run.resume(model_config, config, data.meta, eval_only)  # same settings and data
    iter_num, best_val_loss, last_eval = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['last_eval']
    loss_since_log, steps_since_log = ckpt['loss_since_log']
else:
    torch.manual_seed(seed)
    raw_model = build_model(model_config)  # model.py's GPT, or ablations.py's AblationGPT
raw_model.to(device)
loss_since_log = torch.tensor(loss_since_log, device=device)  # summed on the device: no wait
scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
# nanoGPT's AdamW groups (decay on matrices and embeddings, not on norms or λ), or Muon beside them
try:  # lr_scales naming what is not a parameter of this model: one line
    optimizer = optim.configure_optimizers(raw_model, weight_decay, learning_rate, (beta1, beta2), device_type,
                                           lr_scales, (muon_lr, muon_adjust_lr) if muon else None)
except ValueError as e:
    raise SystemExit(f"train.py: bad lr_scales={lr_scales!r}: {e}") from None
if run.resuming:  # loads ckpt's optimizer and scaler states; one that does not fit: one line
    run_folder.load_optimizer_state(optimizer, scaler, ckpt, run.ckpt_path)
    del ckpt  # memory-mapped: let go of it
if wandb_log and master_process:  # before the process group: a slow login keeps the others waiting
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)
if ddp:  # a hung or dead rank ends the job in 10 minutes, and on CUDA NCCL's flight recorder
    if device_type == 'cuda':  # dumps each rank's last 2,000 collectives (/tmp/nccl_trace_rank_*)
        new_name = tuple(map(int, torch.__version__.split('.')[:2])) >= (2, 8)
        os.environ.setdefault('TORCH_FR_BUFFER_SIZE' if new_name else
                              'TORCH_NCCL_TRACE_BUFFER_SIZE', '2000')  # (its name before torch 2.8)
    torch.distributed.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo',
        timeout=timedelta(minutes=10), device_id=torch.device(device) if device_type == 'cuda' else None)
# the stop flag's and the save's group (stop_now, save): gloo, on the CPU, so the stop flag never
# queues behind GPU work; the long wait is rank 0's save
cpu_group = torch.distributed.new_group(backend='gloo', timeout=timedelta(minutes=60)) if ddp else None
amp = nullcontext() if dtype == 'float32' else torch.autocast(device_type, getattr(torch, dtype))
compiled = device_type == 'cuda' if compile is None else compile
# DDP all-reduces the gradients in the backward, in buckets of max(25 MB, one block's fp32 gradients),
# kept as views of its buckets; it never syncs buffers in forward: ours never change
block_mb = 4 * sum(p.numel() for p in raw_model.blocks[0].parameters()) / 2 ** 20
no_sync = 'forward_sync_buffers' if 'forward_sync_buffers' in inspect.signature(DDP).parameters \
    else 'broadcast_buffers'  # (newer torch renamed it)
ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                gradient_as_bucket_view=True, bucket_cap_mb=max(25, block_mb),
                **{no_sync: False}) if ddp else None
model = ddp_model or raw_model
model = torch.compile(model) if compiled else model  # after DDP: its buckets split the graph
say = tqdm.write if master_process else lambda line: None  # rank 0 speaks, above the progress bar
say(f"{ddp_world_size} rank(s) on {device} ({dtype}); {tokens_per_iter:,} tokens per step = "
    f"{gradient_accumulation_steps} passes of {batch_size} sequences x {block_size} tokens; "
    f"{tokens_per_iter * max(max_iters - iter_num, 0):,} tokens to go")
say(f"{raw_model.config.variant} model: {raw_model.num_params() / 1e6:.2f}M parameters; λ per layer "
    f"{[tuple(round(v, 3) for v in row) for row in raw_model.lambdas.tolist()]}")

def get_lr(it):
    """Linear warmup to learning_rate, then cosine down to min_lr at lr_decay_iters (the paper's)"""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)

def stop_now():
    """(signal number, past max_time) if a stop signal reached any rank or this launch ran past
    max_time, else None. All ranks agree (a MAX all-reduce over cpu_group), so all stop at the same
    step."""
    flag = torch.tensor([stop.signal, max_time > 0 and time.time() - _launched > max_time])
    if ddp:
        all_reduce(flag, op=ReduceOp.MAX, group=cpu_group)
    return (int(flag[0]), bool(flag[1])) if flag.any() else None

def eval_loss(sets, piece):
    """Mean loss over a piece's windows, in one pass of batch_size rows (padding's targets: -1). A
    new y each piece: a view for some and a copy for others would recompile a compiled model."""
    name, places = piece
    x, y = on_device(read(sets[name][0], places + [places[0]] * (batch_size - len(places))))
    y = y.masked_fill(torch.arange(batch_size, device=device)[:, None] >= len(places), -1)
    with amp:
        return model(x, y)

@torch.no_grad()
def evaluate(sets):
    """(mean loss over domains, {domain: loss} or None for one split) over the windows of sets, the
    ranks sharing the pieces; None if a stop came first (it may cut a long evaluation short)."""
    model.eval()
    names, sums = list(sets), torch.zeros(len(sets), device=device)  # the windows' mean losses
    everyone = pieces(sets)
    for k, piece in enumerate(tqdm(everyone[ddp_rank::ddp_world_size], 'eval', leave=False,
                                   delay=5, disable=not master_process)):
        # every 16 pieces, as long as every rank has that many: each rank polls as often
        if k % 16 == 15 and k < len(everyone) // ddp_world_size and stop_now():
            model.train()
            return None
        sums[names.index(piece[0])] += eval_loss(sets, piece).float() * len(piece[1])
    if ddp:
        all_reduce(sums)
    model.train()
    losses = {name: total / len(sets[name][1]) for name, total in zip(names, sums.tolist())}
    return sum(losses.values()) / len(losses), losses if data.by_domain else None

def forward_backward(batch):
    """Accumulate the gradient of the mean loss over this rank's passes; return that loss."""
    loss_sum = torch.zeros((), device=device)
    for micro_step, rows in enumerate(batch):
        x, y = on_device(rows)
        if ddp:  # all-reduce the gradients once a step, in the last pass's backward
            ddp_model.require_backward_grad_sync = micro_step == len(batch) - 1
        with amp:
            loss = model(x, y) / len(batch)
        loss_sum += loss.detach()
        scaler.scale(loss).backward()
    return loss_sum

def checkpoint():
    """All a resume needs: nanoGPT's checkpoint, the loss scaler, the last evaluation, the data."""
    return {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict(), 'model_args': asdict(raw_model.config), 'config': config,
            'iter_num': iter_num, 'best_val_loss': best_val_loss, 'last_eval': last_eval,
            'data_meta': data.meta, 'loss_since_log': (loss_since_log.item(), steps_since_log)}

def stop_unsaved(why):
    """Stop without saving: the last good checkpoint stays. Every rank meets it alike (the losses and the
    NaN count are all-reduced), so rank 0 alone says why, once; the others end quietly (exit 1).
    run.kept names the last checkpoint on disk, after waiting for a background write."""
    raise SystemExit(f"train.py: {why}; stopped without saving, {run.kept}" if master_process else 1)

def save(best, background):
    """Write the checkpoint (rank 0's run.save; none if save_checkpoint=False), never of a step whose
    loss or gradient became NaN or inf (a GPU checks only at log steps): best.pt first, each a .tmp,
    fsynced, renamed; the old ckpt.pt stays as ckpt.prev.pt. Foreground: on disk when this returns.
    Background: a thread writes a host copy; the next save, run.kept or exits() waits for it, and a
    failed write ends the run there in one line. The barrier: all wait for rank 0's copy or write."""
    if ddp:
        all_reduce(nonfinite)
    if nonfinite.item():
        stop_unsaved(f"the training loss or gradient norm became NaN or inf before step {iter_num}")
    run.save(checkpoint(), best, background)
    if ddp:
        barrier(group=cpu_group)

def scores_every_window(step):  # not at step 0 (random weights), but at the end and in eval_only
    return bool(data.val_full) and (eval_full and step > 0 or step == max_iters or eval_only)

def evaluation():
    """This step's evaluation: (the sample's losses, every window's where asked, else None), or None
    if a stop cut it short (evaluate's losses: (mean over domains, {domain: loss} or None))."""
    full = scores_every_window(iter_num)
    losses = evaluate(data.val)
    full_losses = evaluate(data.val_full) if full and losses else None
    return None if losses is None or full and full_losses is None else (losses, full_losses)

def eval_passes(step):  # this rank's passes at step's evaluation (for the time to go)
    sets = [data.val, data.val_full] if scores_every_window(step) else [data.val]
    return sum(len(pieces(s)[ddp_rank::ddp_world_size]) for s in sets)

# -----------------------------------------------------------------------------
# the loop. At each step boundary, in this order: 1. stop? 2. evaluate? 3. save? 4. exit? then train
# the step. ckpt.pt is written only in 3, at most once a boundary (best.pt beside it when val improves):
#   boundary                      2. evaluate  3. save ckpt.pt                     4. exit
#   step 0 of a fresh run         yes          no (random weights)                 no
#   every eval_interval steps     yes          yes, in the background              no
#   every ckpt_interval steps     no           yes, in the background              no
#   a stop signal or max_time     no (finishing  yes, in the foreground, if this   signal n: 128 + n;
#                                 one under way) launch trained or evaluated       max_time: 0 (1 if
#                                                                                  nothing was saved)
#   max_iters (the last)          yes          yes, in the foreground              0: the loop ends
first_step, next_batch = iter_num, None
nonfinite = torch.zeros((), device=device)  # nonzero once a step's loss or gradient is NaN or inf
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, mininterval=1.0)
# reads step i+1's batch in step i; on CUDA set to the rank's GPU (else each opens a context on GPU 0)
reader = ThreadPoolExecutor(1, initializer=torch.cuda.set_device if device_type == 'cuda' else None,
                            initargs=(device,))

@contextmanager
def exits():
    """The loop's ways out. A SystemExit (a stop, max_time, a one-line error) or RuntimeError (a failed
    collective, out of memory): wait for the writer, free out_dir's lock, destroy the process group,
    re-raise, as one line where known (stops.end_rank); another error keeps its traceback. The loop's
    end: wait for the last background write (its failure: a SystemExit), free the lock."""
    stop.listen()  # from here a signal is noted, for the next boundary (a 2nd Ctrl-C: ends at once)
    try:
        yield
        run.wait()
    except (SystemExit, RuntimeError) as error:
        run.let_go()
        stops.leave_group()
        stops.end_rank(error, ddp)
    finally:
        stop.polling = False
    run.let_go()

with exits(), progress, reader:
    t_log, steps_timed = time.time(), 0  # the wall clock of the steps since a log or evaluation
    pass_seconds, time_to_go_said = None, False  # an evaluation's time a pass, once timed
    while True:
        # 1. stop? A signal to any rank, or past max_time: every rank agrees (stop_now)
        stopping = stop_now()  # (signal number or 0, past max_time), or None
        # 2. evaluate? Every eval_interval steps and at the last, unless stopping or done (a resume)
        due = (iter_num % eval_interval == 0 or iter_num == max_iters) \
            and (last_eval or {}).get('step') != iter_num
        evaluated, best = None, False
        if eval_only or (due and not stopping):
            t_eval = time.time()
            evaluated = evaluation()  # None: cut short by a stop
            stopping = stop_now()  # a stop that came during it acts now, not a step later
        if evaluated:  # the headline: the whole split's where every evaluation scores it (the paper's)
            losses, full_losses = evaluated
            val_loss = full_losses[0] if eval_full and full_losses else losses[0]
            last_eval, said = metrics.eval_record(iter_num, losses, full_losses, data.val_full, eval_full)
            if eval_only:
                say(f"step {iter_num}: val loss {val_loss:.4f}{said}")
                break
            if not math.isfinite(val_loss):
                stop_unsaved(f"validation loss {val_loss} at step {iter_num}")
            best, best_val_loss = val_loss < best_val_loss, min(best_val_loss, val_loss)
            last_eval['best_val_loss'] = best_val_loss
            run.log(last_eval)  # appended to log.jsonl (rank 0); metrics.*_record: no collective
            if wandb_log and master_process:
                wandb.log(last_eval, step=iter_num)
            pass_seconds = (time.time() - t_eval) / max(eval_passes(iter_num), 1)
        # 3. save? After an evaluation (best.pt too if best) but not step 0's unless it is the last;
        # at a stop or a ckpt_interval step once this launch trained (ckpt.pt holds its first step)
        after_eval = evaluated and (iter_num > 0 or iter_num == max_iters)
        trained_this_launch = iter_num > first_step
        at_interval = ckpt_interval and iter_num % ckpt_interval == 0
        saving = after_eval or (trained_this_launch and (stopping or at_interval))
        if saving:  # a stop's or the last step's in the foreground: the process ends after it
            save(best, background=not stopping and iter_num < max_iters)
        if evaluated:
            say(f"step {iter_num}: val loss {val_loss:.4f}{said} (best {best_val_loss:.4f})")
            t_log, steps_timed = time.time(), 0  # the evaluation's time is not training's
        # 4. exit? At a stop, or at the end
        if stopping:
            signal_number, _ = stopping
            why = (f"stopped by {signal.Signals(signal_number).name}" if signal_number
                   else f"past max_time={max_time} s")
            if not (signal_number or saving):  # exit 1 here: a job chain on exit 0 would loop
                stop_unsaved(f"{why} at step {iter_num}, before this launch trained a step; "
                             f"raise max_time above the start-up's time")
            done = ("nothing saved (save_checkpoint=False)" if not save_checkpoint else
                    f"saved {run.ckpt_path}; continue with --init_from=resume" if saving else
                    f"nothing new to save; {run.kept}")
            say(f"train.py: {why} at step {iter_num}; {done}")
            sys.exit(128 + signal_number if signal_number else 0)
        if iter_num >= max_iters:
            break

        lr = get_lr(iter_num)
        # each group's rate: the schedule's x its lr_scale, set by configure_optimizers: 1, an
        # lr_scales multiplier, or muon_lr / learning_rate for Muon's matrices (its own peak rate)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_scale']
        # dropout from (seed, step, -1 - rank) alone: a resumed run draws the same. Batches use
        # (seed, step) and (seed, -1, epoch), and a step is never -1; int tuples hash alike anywhere
        torch.manual_seed(hash((seed, iter_num, -1 - ddp_rank)) & (2 ** 63 - 1))
        batch = next_batch.result() if next_batch else get_batch(iter_num)
        next_batch = reader.submit(get_batch, iter_num + 1) if iter_num + 1 < max_iters else None
        train_loss = forward_backward(batch)
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        scaler.unscale_(optimizer)
        norms = {name: p.grad.norm() for name, p in raw_model.named_parameters()  # before clipping
                 if p.grad is not None} if log_grad_norms and logging_now else None
        grad_norm = torch.nn.utils.clip_grad_norm_(  # foreach: one fused kernel per dtype
            raw_model.parameters(), grad_clip if grad_clip > 0 else math.inf, foreach=True)
        nonfinite += ~torch.isfinite(train_loss)
        if not scaler.is_enabled():  # (fp16's GradScaler skips a step whose gradients overflowed)
            nonfinite += ~torch.isfinite(grad_norm)
        if logging_now or device_type == 'cpu':  # reading it waits for a GPU: at log steps only
            if ddp:
                all_reduce(nonfinite)
            if nonfinite.item():  # the last good checkpoint stays
                stop_unsaved(f"the training loss or gradient norm became NaN or inf by step {iter_num} "
                             f"(loss {train_loss.item():.4g}, gradient norm {grad_norm.item():.4g})")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=not ddp)  # DDP's gradients stay views of its buckets
        iter_num += 1
        loss_since_log += train_loss
        steps_since_log, steps_timed = steps_since_log + 1, steps_timed + 1
        progress.update(1)
        if logging_now:  # the mean training loss since the last log line (the paper's curve)
            loss = loss_since_log / steps_since_log
            if ddp:
                all_reduce(loss)
                loss /= ddp_world_size
            tokens_per_sec = tokens_per_iter * steps_timed / (time.time() - t_log)
            peaks = None
            if device_type == 'cuda':  # every rank's peak memory (GiB), so that one bad GPU shows
                peaks = torch.zeros(ddp_world_size, device=device)
                peaks[ddp_rank] = torch.cuda.max_memory_allocated(device) / 2 ** 30
                if ddp:
                    all_reduce(peaks)
                peaks = peaks.tolist()
            record, line = metrics.step_record(iter_num, loss, grad_norm, lr, tokens_per_sec, norms,
                                               raw_model, config, ddp_world_size, device, peaks)
            run.log(record)  # step_record's: the learned λ too, where λ learns
            if wandb_log and master_process:
                wandb.log(record, step=iter_num)
            progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
            say(line)
            # the time to go, once an evaluation and steps past the first two (compiling) are timed
            if pass_seconds and not time_to_go_said and iter_num - steps_timed >= first_step + 2:
                say(metrics.time_to_go((time.time() - t_log) / steps_timed, pass_seconds, eval_passes,
                                       iter_num, max_iters, eval_interval))
                time_to_go_said = True
            loss_since_log, steps_since_log = torch.zeros((), device=device), 0
            t_log, steps_timed = time.time(), 0
    if ddp:  # DDP keeps the replicas identical: checked once, at the end
        weights = torch.cat([p.detach().reshape(-1).float() for p in raw_model.parameters()])
        highest, lowest = weights.clone(), weights.clone()
        all_reduce(highest, op=ReduceOp.MAX)
        all_reduce(lowest, op=ReduceOp.MIN)
        say(f"weights across {ddp_world_size} ranks differ by at most "
            f"{(highest - lowest).max().item():.3g}")
if ddp:  # a run that went well: free everything, wait for all ranks, tear down (or gloo may abort)
    del model, ddp_model, raw_model, optimizer
    barrier()
    destroy_process_group()
