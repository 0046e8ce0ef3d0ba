"""
Train a ResFormer, SVFormer or baseline on one CPU or GPU, or on N GPUs with torchrun (DDP):

    python train.py                                # a small Identity ResFormer on Shakespeare
    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=vanilla

The layout is nanoGPT's: settings, data, model and optimizer, the loop's helpers, then the loop,
whose ways out are in exits(). Each helper call's comment says what it does, so you need not open
vrl/, ablations.py or configurator.py. Below is every collective, and its line in this file: no
other call makes one, as tests/test_collectives.py checks (in train.py, vrl/, model.py, ablations.py
and configurator.py, and each line given). Start-up calls run once. A call uses the default group
unless its row names cpu_group.
  start-up  init_process_group  Line 220. Makes the default group (NCCL on CUDA, else gloo), with a
                                10-minute timeout.
  start-up  new_group           Line 224. Makes cpu_group (gloo), with a 60-minute timeout for rank
                                0's save.
  start-up  DDP                 Line 232. Checks the weights' shapes, copies rank 0's weights to all
                                (our buffers are constants), averages the gradients in each step's
                                last backward, and once (second step) broadcasts its bucket order.
  stop_now  all_reduce          Line 259. Takes the MAX of the stop flag on cpu_group: at each step
                                boundary, after an evaluation, and after every 16th piece of an
                                evaluation that every rank has.
  evaluate  all_reduce          Line 286. SUMs the domains' losses, once a call that a stop did not
                                cut short (on every rank alike); two with val_full (evaluation()).
  save      all_reduce          Line 327. SUMs the NaN flag and the loss since the last log.
  save      barrier             Line 334. On cpu_group, all wait for rank 0's host copy or its write.
  loop      all_reduce x3       Lines 480, 494, 502. SUM at log steps the NaN flag (on CPU, at every
                                step), the loss, and on CUDA each rank's peak memory.
  end       all_reduce x2       Lines 521, 522. Take the weights' MAX and MIN once, to show the
                                replicas agree.
  end       barrier             Line 527. After a run that went well, every rank waits for all.
  end       destroy_process_group  Line 528. Then it tears both groups down.
  vrl/stops.py:leave_group destroy_process_group  exits() calls it when a SystemExit or a
                                RuntimeError (a stop, max_time, an error) leaves the loop.
"""
import time
_launched = time.time()  # max_time counts from here. The leading _ keeps it out of the settings.
from vrl import stops  # imported first, so that a Ctrl-C during the imports ends in one line
stop = stops.StopSignals()  # until the loop, Ctrl-C, SIGTERM, SIGHUP and SIGUSR1 exit with 128 + n
# (one that lands while tqdm draws waits for the loop's first boundary). In the loop (stop.listen()
# in exits()), a first signal only sets stop.signal, its number; a Ctrl-C after any first signal
# exits 130 at once; a second SIGTERM, SIGHUP or SIGUSR1 changes nothing.

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
# The defaults train a small Identity ResFormer on char-level Shakespeare, in minutes on a laptop.
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate every this many steps and at the end, then save (not at step 0)
log_interval = 10  # log the training loss, averaged over this many steps
eval_iters = 10  # fixed val batches of batch_size, ceil(eval_iters / domains) for each domain
eval_full = False  # score every validation window at each evaluation but step 0, as the paper does
#   (where the data has them, every window is scored at max_iters and in eval_only anyway)
eval_only = False  # evaluate once, print the loss and stop, writing nothing
ckpt_interval = 0  # also write ckpt.pt every this many steps (0: at evaluations and stops only)
max_time = 0  # seconds, 0 for no limit. The first step boundary past it saves and exits 0. It
#   exits 1 instead if this launch neither trained a step nor evaluated past step 0 (raise
#   max_time), whatever save_checkpoint says.
init_from = 'scratch'  # 'scratch', 'resume' (from out_dir/ckpt.pt), or 'auto' (resume if it exists)
overwrite = False  # let a fresh run replace out_dir's run (its ckpt*.pt, best.pt and log.jsonl)
save_checkpoint = True  # False writes no ckpt.pt or best.pt (lab/bench.py's node check times runs)
wandb_log = False
wandb_project = 'value-residual'
wandb_run_name = 'run'
log_grad_norms = False  # also log each parameter's gradient norm, before clipping, at each log step
# data
dataset = 'shakespeare_char'  # a folder under data/ written by prepare.py
gradient_accumulation_steps = 1  # passes per step, counted over all ranks as in nanoGPT
batch_size = 16  # sequences per pass. A step trains on gradient_accumulation_steps x batch_size.
block_size = 128  # tokens per sequence, the context length T
data_order = 'auto'  # 'random' (as nanoGPT), 'epoch' (each window once) or 'epochs'. 'auto' picks
#   'epoch' for data kept by domain (SlimPajama, one epoch as in the paper), else 'random'.
# model: these, and every other field of AblationConfig (ablations.py, model.py) with its default
variant = 'resformer_identity'  # vanilla, resformer_identity/constant/sparse/learnable/
#   learnable_plus, svformer (model.py's VARIANTS), a baseline (ablations.py's BASELINES: neutreno,
#   neutreno_resformer, denseformer, cla, share_k, share_v, shared_query, shared_key), a successor
#   (satformer, gated_resformer, attn_res, attn_res_block, depth_attention, hyper_connections, mhc,
#   muddformer), or 'custom'
n_layer = 4
n_head = 4
n_embd = 128
# optimizer: AdamW as in the paper, with warmup, then cosine decay to min_lr
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
muon = False  # use Muon (torch 2.9+) for the blocks' matrices, and AdamW for the rest
muon_lr = 0.02  # Muon's peak rate, which the schedule scales as it does learning_rate
muon_adjust_lr = 'original'  # Muon's rate per matrix shape: 'original' or 'match_rms_adamw'
# system
device = 'auto'  # 'auto' picks cuda, else cpu, never mps. Or name 'cpu', 'cuda', 'cuda:1' or 'mps'.
dtype = 'auto'  # 'auto' picks bfloat16 on GPUs that have it, else float16 on CUDA, else float32
compile = None  # None turns torch.compile on for CUDA, and off elsewhere, where it does not pay
peak_tflops = 0.0  # one accelerator's peak, for MFU. 0 looks the GPU up in vrl/metrics.py's table.
deterministic = False  # use deterministic kernels (math attention on CUDA): bit for bit, but slower
seed = 1337
# -----------------------------------------------------------------------------
# config: every setting above and every AblationConfig field at its default, then the config files
# and --key=value in order, each type-checked against its default (a bad key or type: one line)
config = configure(globals(), sys.argv[1:], script=__file__, fields_of=AblationConfig,
                   except_fields=('vocab_size',), types={'compile': bool},  # the data sets it
                   verbose=os.environ.get('RANK', '0') == '0')
globals().update(config)  # the final settings, which config also keeps for the log and checkpoint
# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE. The process group starts after all the checks.
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, None, 1))
master_process = ddp_rank == 0
# End in one line on a bad setting, passes that do not split over ranks, no wandb or a bad launch
settings.check(config, ddp_world_size)
global_batch = gradient_accumulation_steps * batch_size  # sequences per step on any number of ranks
tokens_per_iter = global_batch * block_size
data = open_dataset(os.path.join('data', dataset), block_size, seed, data_order, max_iters,
                    global_batch, eval_iters, batch_size, eval_full)  # checks prepare.py's files
# ablations.py's AblationConfig: model.py's GPTConfig (a subclass) plus the ablations' own fields,
# from the settings named like its fields, with vocab_size padded to a multiple of 64. A paper
# variant with no ablation field set gets model.py's flags and λ (the table under VARIANTS),
# ablations.py:134 `if self.variant in VARIANTS and not self.anchors:`, and model.py's GPT,
# ablations.py:225 `return AblationGPT(config) if ablations(config) else GPT(config)`, where
# ablations(config) lists AblationConfig's own fields set off their defaults. The start-up line
# names the class. Tested: test_model.py's test_train_py_gives_each_paper_variant_model_py_lambdas.
model_config = settings.model_config(config, data.meta['vocab_size'])
# Under torchrun the device is cuda:LOCAL_RANK, made current, with NCCL's flight recorder on; CUDA
# allows TF32; dtype: a name. A too-big model, or a full-scale run on the CPU, ends in one line.
device, device_type, dtype = hardware.setup(config, model_config, ddp_local_rank)
run = run_folder.RunFolder(out_dir, init_from, overwrite, writes=master_process and not eval_only,
                           saves=save_checkpoint)  # rank 0 locks out_dir and then checks it

# -----------------------------------------------------------------------------
# data: each rank takes an equal share of a step's windows (as checked), in passes of batch_size
rank_share = global_batch // ddp_world_size
rank_passes = [(ddp_rank * rank_share + i, ddp_rank * rank_share + i + batch_size)
               for i in range(0, rank_share, batch_size)]

def read(shards, places):
    """Read the windows of block_size + 1 tokens at (shard, start) places. Return them as rows
    (B, T + 1) of token ids on the CPU, pinned if they are to be copied to CUDA."""
    rows = np.stack([shards[s][i:i + block_size + 1].astype(np.int64) for s, i in places])
    if rows.max() >= data.meta['vocab_size']:  # open_dataset scanned only the validation split
        raise SystemExit(f"train.py: {data.dir} holds token id {rows.max()}, outside its vocabulary; "
                         f"run `{data.prepare_command}` again; stopped, {run.kept}")
    rows = torch.from_numpy(rows)
    return rows.pin_memory() if device_type == 'cuda' else rows

def get_batch(step):
    """nanoGPT's get_batch by step: this rank's passes of the step's windows (data.places). They
    depend on the seed and step alone, so they match on any number of ranks and after a resume:
    'random' draws each window's shard and start from a generator seeded with (seed, step), and
    'epoch' ('epochs' too) takes windows step x n to (step + 1) x n of an order seeded with
    (seed, -1, epoch)."""
    places = data.places(step, global_batch)
    return [read(data.train, places[start:stop]) for start, stop in rank_passes]

def on_device(rows):
    """Copy rows to the device once and return two views: the inputs and the next-token targets."""
    rows = rows.to(device, non_blocking=device_type == 'cuda')
    return rows[:, :-1], rows[:, 1:]

# sets: data.val or data.val_full, {domain: (shards, [(shard, start), ...])} ('val' alone unless the
# data is kept by domain); a piece: (domain, up to batch_size of its places), one pass
def pieces(sets):  # split the windows of sets into passes of batch_size, for the ranks to share
    return [(name, places[i:i + batch_size]) for name, (_, places) in sets.items()
            for i in range(0, len(places), batch_size)]

# -----------------------------------------------------------------------------
# model and optimizer: new, or with the architecture, weights and optimizer state of out_dir/ckpt.pt
iter_num, best_val_loss, last_eval = 0, float('inf'), None
loss_since_log, steps_since_log = 0.0, 0  # the training loss summed over the steps since a log
if run.resuming:  # load ckpt.pt (ckpt.prev.pt if it is torn), checked to match settings and data
    raw_model, ckpt = run.resume(model_config, config, data.meta, eval_only)
    iter_num, best_val_loss, last_eval = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['last_eval']
    loss_since_log, steps_since_log = ckpt['loss_since_log']
else:
    torch.manual_seed(seed)
    raw_model = build_model(model_config)  # model.py's GPT for a paper variant, else AblationGPT
raw_model.to(device)
loss_since_log = torch.tensor(loss_since_log, device=device)  # summing on the device never waits
nonfinite = torch.zeros((), device=device)  # nonzero once a step's loss or gradient is NaN or inf
scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
# nanoGPT's AdamW groups: decay on matrices and embeddings, not norms or λ, each group with its
# lr_scale, vrl/optim.py:31 `key = (p.dim() >= 2, float(scales.get(name, 1.0)))`; plus Muon if set
try:
    optimizer = optim.configure_optimizers(raw_model, weight_decay, learning_rate, (beta1, beta2), device_type,
                                           lr_scales, (muon_lr, muon_adjust_lr) if muon else None)
except ValueError as e:  # lr_scales names something that is not a parameter of this model
    raise SystemExit(f"train.py: bad lr_scales={lr_scales!r}: {e}") from None
if run.resuming:  # load the optimizer and scaler states (ends in one line if they do not fit)
    run_folder.load_optimizer_state(optimizer, scaler, ckpt, run.ckpt_path)
    del ckpt  # it is memory-mapped, so let go of it
if wandb_log and master_process:  # before the process group: a slow login keeps the others waiting
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)
if ddp:  # a rank hung in a default-group collective ends the job after 10 minutes
    torch.distributed.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo',
        timeout=timedelta(minutes=10), device_id=torch.device(device) if device_type == 'cuda' else None)
# stop_now and save's barrier use cpu_group. It runs gloo on the CPU, so the stop flag never queues
# behind GPU work. Its long timeout (60 minutes) leaves time for rank 0's save.
cpu_group = torch.distributed.new_group(backend='gloo', timeout=timedelta(minutes=60)) if ddp else None
amp = nullcontext() if dtype == 'float32' else torch.autocast(device_type, getattr(torch, dtype))
compiled = device_type == 'cuda' if compile is None else compile
# DDP all-reduces the gradients in the backward, in buckets of max(25 MB, one block's fp32 grads).
# Gradients are views of the buckets. Our buffers never change, so DDP never syncs them in forward.
block_mb = 4 * sum(p.numel() for p in raw_model.blocks[0].parameters()) / 2 ** 20
buffer_sync = 'forward_sync_buffers' if 'forward_sync_buffers' in inspect.signature(DDP).parameters \
    else 'broadcast_buffers'  # newer torch renamed it
ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                gradient_as_bucket_view=True, bucket_cap_mb=max(25, block_mb),
                **{buffer_sync: False}) if ddp else None
model = ddp_model or raw_model
model = torch.compile(model) if compiled else model  # after DDP, whose buckets split the graph
say = tqdm.write if master_process else lambda line: None  # rank 0 prints, above the progress bar
say(f"{ddp_world_size} rank(s) on {device} ({dtype}); {tokens_per_iter:,} tokens per step = "
    f"{gradient_accumulation_steps} passes of {batch_size} sequences x {block_size} tokens; "
    f"{tokens_per_iter * max(max_iters - iter_num, 0):,} tokens to go")
say(f"{raw_model.config.variant} model ({type(raw_model).__name__}): "
    f"{raw_model.num_params() / 1e6:.2f}M parameters; λ per layer "
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
    max_time, else None. A MAX all-reduce on cpu_group makes every rank stop at the same step."""
    flag = torch.tensor([stop.signal, max_time > 0 and time.time() - _launched > max_time])
    if ddp:
        all_reduce(flag, op=ReduceOp.MAX, group=cpu_group)
    return (int(flag[0]), bool(flag[1])) if flag.any() else None

def eval_loss(sets, piece):
    """Mean loss over a piece's windows, in one pass of batch_size rows; padding rows target -1.
    Each piece gets a new y, as mixing views and copies would recompile a compiled model."""
    name, places = piece
    x, y = on_device(read(sets[name][0], places + [places[0]] * (batch_size - len(places))))
    y = y.masked_fill(torch.arange(batch_size, device=device)[:, None] >= len(places), -1)
    with amp:
        return model(x, y)

@torch.no_grad()
def evaluate(sets):
    """(mean loss over domains, {domain: loss} or None for one split) over the windows of sets,
    which the ranks share. None if a stop comes first: a stop can cut a long evaluation short."""
    model.eval()
    domains, sums = list(sets), torch.zeros(len(sets), device=device)  # each domain's summed loss
    everyone = pieces(sets)
    for k, piece in enumerate(tqdm(everyone[ddp_rank::ddp_world_size], 'eval', leave=False,
                                   delay=5, disable=not master_process)):
        # poll after every 16th piece, while k < the pieces every rank has: all ranks poll alike
        if k % 16 == 15 and k < len(everyone) // ddp_world_size and stop_now():
            model.train()
            return None
        sums[domains.index(piece[0])] += eval_loss(sets, piece).float() * len(piece[1])
    if ddp:
        all_reduce(sums)
    model.train()
    losses = {domain: total / len(sets[domain][1]) for domain, total in zip(domains, sums.tolist())}
    return sum(losses.values()) / len(losses), losses if data.by_domain else None

def forward_backward(batch):
    """Accumulate the gradient of the mean loss over this rank's passes, and return that loss."""
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

def checkpoint(loss_since_log_mean):
    """All a resume needs: nanoGPT's checkpoint, the loss scaler, the last evaluation, the data, and
    the training loss summed since the last log (the ranks' mean: each rank resumes from it)."""
    return {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict(), 'model_args': asdict(raw_model.config), 'config': config,
            'iter_num': iter_num, 'best_val_loss': best_val_loss, 'last_eval': last_eval,
            'data_meta': data.meta, 'loss_since_log': (loss_since_log_mean, steps_since_log)}

def stop_unsaved(why):
    """Stop without saving, so the last good checkpoint stays. Every rank calls it alike, as the
    losses and the NaN flag are all-reduced. So rank 0 alone says why; the others exit 1 quietly.
    run.kept waits for a background write, then names the last checkpoint on disk."""
    raise SystemExit(f"train.py: {why}; stopped without saving, {run.kept}" if master_process else 1)

def save(best, background):
    """Write the checkpoint with rank 0's run.save, unless save_checkpoint=False. Never save a step
    whose loss or gradient became NaN or inf (a GPU checks only at log steps). best.pt, if best, is
    renamed into place first. Each file goes to a .tmp, is fsynced and renamed; the old ckpt.pt
    stays as ckpt.prev.pt. In the foreground, it is on disk when this returns. In the background, a thread writes a host
    copy; the next save or the loop's end (exits()) waits for it, and a failed write ends the run
    there in one line. At the barrier, all ranks wait for rank 0's copy or write."""
    summed = torch.stack([nonfinite, loss_since_log])  # the NaN flag, the loss since the last log
    if ddp:
        all_reduce(summed)
    if summed[0].item():
        stop_unsaved(f"the training loss or gradient norm became NaN or inf before step {iter_num}")
    # run.save returns at once on ranks > 0 (and with save_checkpoint=False); on rank 0, after the
    # host copy (background) or the fsynced rename (foreground). best.pt is a copy of this ckpt.pt.
    run.save(checkpoint(summed[1].item() / ddp_world_size), best, background)
    if ddp:
        barrier(group=cpu_group)

def scores_every_window(step):  # eval_full skips step 0, whose weights are random
    return bool(data.val_full) and (eval_full and step > 0 or step == max_iters or eval_only)

def evaluation():
    """Evaluate this step. Return (the sample's losses, every window's losses if asked, else None),
    each as evaluate returns them, or None if a stop cut the evaluation short."""
    full = scores_every_window(iter_num)
    losses = evaluate(data.val)
    full_losses = evaluate(data.val_full) if full and losses else None
    return None if losses is None or full and full_losses is None else (losses, full_losses)

def eval_passes(step):  # this rank's passes in step's evaluation, for the time-to-go estimate
    sets = [data.val, data.val_full] if scores_every_window(step) else [data.val]
    return sum(len(pieces(s)[ddp_rank::ddp_world_size]) for s in sets)

# -----------------------------------------------------------------------------
# the loop. Each step boundary asks, in order: 1. stop? 2. evaluate? 3. save? 4. exit? Then the
# step trains. Only 3 writes ckpt.pt, once at most, with best.pt beside it if the val loss improved.
#   boundary                   2. evaluate         3. save ckpt.pt                 4. exit
#   step 0 of a fresh run      yes                 no: its weights are random      no
#   every eval_interval steps  yes (unless done)   yes, in the background          no
#                                                  (after_eval)
#   every ckpt_interval steps  only if due         yes, in the background, if      no
#                                                  this launch trained a step
#                                                  (after_training)
#   a stop signal n            no new one; one     yes, in the foreground, if      128 + n
#                              under way ends at   this launch trained a step
#                              its next poll, or   (after_training), or if this
#                              finishes if none    boundary's evaluation (past
#                                                  step 0) finished (after_eval)
#   max_time                   as a stop signal    as a stop signal                0; 1 if no save
#   max_iters (the last step)  yes (unless done)   yes, in the foreground          0: the loop ends
#                                                  (after_eval)
# Before the loop (exits() starts it), a stop signal ends the process at once with 128 + n: there
# is nothing to save. In the loop, a Ctrl-C after any first signal raises SystemExit(130) in the
# handler, wherever the main thread is, and exits() passes it on after a background write lands.
first_step, next_batch = iter_num, None
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, mininterval=1.0)
# reads step i+1's batch into (pinned) host memory during step i; on_device copies it to the GPU.
# set_device keeps the thread on the rank's GPU (else it opens a context on GPU 0).
reader = ThreadPoolExecutor(1, initializer=torch.cuda.set_device if device_type == 'cuda' else None,
                            initargs=(device,))

@contextmanager
def exits():
    """The loop's ways out. On a SystemExit (a stop, max_time, a one-line error) or a RuntimeError
    (a failed collective, out of memory), wait for the writer, free out_dir's lock, destroy the
    process group and re-raise, as one line where stops.end_rank knows it: a stop's exit code
    passes unchanged; under torchrun a one-line message goes to the rank's error file and the rank
    exits 1. Other errors keep their traceback. At the loop's end, wait for the last background
    write, then free the lock."""
    stop.listen()  # a signal now waits for the next boundary; a 2nd Ctrl-C (not SIGTERM) ends now
    try:
        yield
        run.wait()
    except (SystemExit, RuntimeError) as error:
        run.let_go()  # waits for a background write first, then frees the lock
        stops.leave_group()
        stops.end_rank(error, ddp)  # always re-raises: the let_go below is the normal path's
    finally:
        stop.polling = False  # after the loop a signal ends the process at once again
    run.let_go()

with exits(), progress, reader:
    t_log, steps_timed = time.time(), 0  # times the steps since the last log or evaluation
    pass_seconds, time_to_go_said = None, False  # seconds per evaluation pass, once timed
    while True:
        # 1. stop? Yes if any rank got a signal or max_time passed. stop_now makes all ranks agree.
        stopping = stop_now()  # (signal number or 0, past max_time), or None
        # 2. evaluate? Every eval_interval steps and at the last, unless stopping or already done
        due = (iter_num % eval_interval == 0 or iter_num == max_iters) \
            and (last_eval or {}).get('step') != iter_num
        evaluated, best = None, False
        if eval_only or (due and not stopping):  # eval_only: even at a stop (a poll may cut it)
            t_eval = time.time()
            evaluated = evaluation()  # None if a stop cut it short
            stopping = stop_now()  # a stop that came during it acts now, not a step later
        if evaluated:  # with eval_full, the headline is the whole split's loss, as in the paper
            losses, full_losses = evaluated
            val_loss = full_losses[0] if eval_full and full_losses else losses[0]
            # the log record of this evaluation, and its per-domain losses as text (no collective)
            last_eval, said = metrics.eval_record(iter_num, losses, full_losses, data.val_full, eval_full)
            if eval_only:
                say(f"step {iter_num}: val loss {val_loss:.4f}{said}")
                break
            if not math.isfinite(val_loss):
                stop_unsaved(f"validation loss {val_loss} at step {iter_num}")
            best, best_val_loss = val_loss < best_val_loss, min(best_val_loss, val_loss)
            last_eval['best_val_loss'] = best_val_loss
            run.log(last_eval)  # rank 0 appends to log.jsonl (metrics.*_record calls no collective)
            if wandb_log and master_process:
                wandb.log(last_eval, step=iter_num)
            pass_seconds = (time.time() - t_eval) / max(eval_passes(iter_num), 1)
        # 3. save? The table's column 3. Until this launch trains a step, a ckpt_interval step or a
        # stop has nothing new to save: a resumed run's ckpt.pt holds this step.
        trained_this_launch = iter_num > first_step
        at_interval = ckpt_interval > 0 and iter_num % ckpt_interval == 0
        # rows eval_interval, max_iters and a stop's finished evaluation (step 0's if it is the last)
        after_eval = evaluated and (iter_num > 0 or iter_num == max_iters)
        after_training = trained_this_launch and (at_interval or stopping)  # ckpt_interval, stop
        saving = bool(after_eval or after_training)
        if saving:  # in the foreground at a stop or the last step, as the process ends after it
            save(best, background=not stopping and iter_num < max_iters)
        if evaluated:
            say(f"step {iter_num}: val loss {val_loss:.4f}{said} (best {best_val_loss:.4f})")
            t_log, steps_timed = time.time(), 0  # the evaluation does not count as training time
        # 4. exit? At a stop, or at the end
        if stopping:
            signal_number, _ = stopping
            why = (f"stopped by {signal.Signals(signal_number).name}" if signal_number
                   else f"past max_time={max_time} s")
            if not (signal_number or saving):  # exit 1: a job chain going on at 0 would loop
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
        # Each group's rate is the schedule's times its lr_scale. configure_optimizers set it to 1,
        # an lr_scales multiplier, or muon_lr / learning_rate (Muon's own peak) for Muon's matrices.
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_scale']
        # Dropout seeds from (seed, step, -1 - rank) alone, so a resumed run draws the same. Batches
        # use (seed, step) and (seed, -1, epoch), and a step is never -1. Int tuples hash alike.
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
        if not scaler.is_enabled():  # fp16's GradScaler skips a step whose gradients overflowed
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
        if logging_now:  # log the mean training loss since the last log line (the paper's curve)
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
            run.log(record)  # step_record includes the learned λ, where λ learns
            if wandb_log and master_process:
                wandb.log(record, step=iter_num)
            progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
            say(line)
            # the time to go, once an evaluation and steps after the first two (compiling) are timed
            if pass_seconds and not time_to_go_said and iter_num - steps_timed >= first_step + 2:
                say(metrics.time_to_go((time.time() - t_log) / steps_timed, pass_seconds, eval_passes,
                                       iter_num, max_iters, eval_interval))
                time_to_go_said = True
            loss_since_log, steps_since_log = torch.zeros((), device=device), 0
            t_log, steps_timed = time.time(), 0
    if ddp:  # DDP keeps the replicas identical, which this checks once, at the end
        weights = torch.cat([p.detach().reshape(-1).float() for p in raw_model.parameters()])
        highest, lowest = weights.clone(), weights.clone()
        all_reduce(highest, op=ReduceOp.MAX)
        all_reduce(lowest, op=ReduceOp.MIN)
        say(f"weights across {ddp_world_size} ranks differ by at most "
            f"{(highest - lowest).max().item():.3g}")
if ddp:  # a good run frees everything, waits for all ranks, then tears down (else gloo may abort)
    del model, ddp_model, raw_model, optimizer
    barrier()
    destroy_process_group()
