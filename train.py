"""
Train a ResFormer / SVFormer / baseline on one CPU or GPU, or on N GPUs with the same global batch:

    python train.py                                # a small Identity ResFormer on Shakespeare (CPU)
    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=vanilla

Settings: the globals below and every field of GPTConfig (model.py), overridden by config files and
--key=value arguments, left to right, as nanoGPT's configurator. Three vrl modules define what
trains: settings.model_config (the GPTConfig), data (the windows a step reads, its seeds) and optim
(AdamW's groups, or Muon); hardware picks the precision, run_folder resumes; the rest only check.
"""
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict

import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import configure
from ablations import AblationConfig, build_model
from vrl import data, data_parallel, hardware, metrics, optim, run_folder, settings, stops
stops.rank_0_speaks()  # under torchrun: a bad setting or missing data said once, by rank 0

# defaults: a small Identity ResFormer on char-level Shakespeare, trained on a laptop CPU in minutes
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate, then write ckpt.pt (and best.pt if val improved), every this often
log_interval = 10
eval_iters = 10  # validation batches of batch_size windows, the same each time (split over domains)
eval_full = False  # every validation window at every evaluation (the paper's curve), too
eval_only = False  # evaluate once, print the loss and stop; writes nothing
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
overwrite = False  # let a fresh run replace a run already in out_dir (ckpt.pt, best.pt, log.jsonl)
save_checkpoint = True  # False: write no ckpt.pt or best.pt (lab/bench.py's node check times runs)
wandb_log = False
wandb_project = 'value-residual'
wandb_run_name = 'run'
log_grad_norms = False  # also log each parameter's gradient norm (before clipping) at each log step
# data
dataset = 'shakespeare_char'  # a folder under data/ written by prepare.py
gradient_accumulation_steps = 1  # global batch: this x batch_size (all ranks; not nanoGPT's passes)
batch_size = 16  # sequences, whatever the number of ranks
micro_batch_size = None  # most sequences a pass takes (None: batch_size); lower it to fit memory
block_size = 128  # tokens per sequence: the context length T
data_order = 'auto'  # 'random' (nanoGPT), 'epoch' (once each), 'epochs'; 'auto': epoch if by domain
# model: these, and every other field of GPTConfig (model.py) at GPTConfig's default
variant = 'resformer_identity'
n_layer = 4
n_head = 4
n_embd = 128
# optimizer: AdamW (or Muon for the blocks' matrices); warmup, then cosine decay to min_lr
optimizer = 'adamw'  # 'adamw' (the paper's) or 'muon' (torch 2.9+'s Muon; AdamW for the rest)
muon_lr = 0.02  # Muon's peak rate, scaled by the schedule as learning_rate is
muon_adjust_lr = 'original'  # Muon's rate per matrix shape: 'original' or 'match_rms_adamw'
learning_rate = 2e-3
max_iters = 600
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
lr_scales = []  # [parameter name, multiplier] pairs trained at multiplier x the rate (v5 Sec. 4.3)
warmup_iters = 50
lr_decay_iters = 600
min_lr = 2e-4
# system
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name); or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto': bfloat16 on GPUs that have it, else float16 on CUDA, else float32
compile = None  # torch.compile: None = on for CUDA, off elsewhere (where it does not pay)
peak_tflops = 0.0  # one accelerator's peak for MFU; 0 = the GPU's, from vrl/metrics.py's table
deterministic = False  # deterministic kernels (math attention on CUDA): bit for bit, slower
seed = 1337
# -----------------------------------------------------------------------------
config = configure(globals(), sys.argv[1:], script=__file__,  # the globals of literal values above
                   fields_of=AblationConfig, except_fields=('vocab_size',),  # the data sets vocab_size
                   types={'compile': bool, 'micro_batch_size': int},
                   verbose=os.environ.get('RANK', '0') == '0')
globals().update(config)  # config: what this run used, for the log and the checkpoint
# Everything is checked before anything touches out_dir: a run that cannot start changes nothing.
settings.check_settings(config)
wandb = settings.import_wandb() if wandb_log else None
data_dir = config['data_dir'] = os.path.join('data', dataset)
data_meta = data.load_meta(data_dir, 'train.py')
model_config = settings.model_config(config, data_meta['vocab_size'])  # padded to a multiple of 64
global_batch = gradient_accumulation_steps * batch_size
tokens_per_iter = global_batch * block_size
# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the process group starts once everything is checked
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, None, 1))
master_process = ddp_rank == 0
device, device_type, dtype = hardware.setup_device(device, dtype, ddp_local_rank, deterministic,
    needs_gpu=None if eval_only else hardware.needs_gpu(model_config, block_size,
                                                        tokens_per_iter * max_iters))
hardware.check_model_fits(model_config, device, training=not eval_only)
run = run_folder.RunFolder(out_dir, master_process and not eval_only, wandb, save_checkpoint)
run.check_can_start(init_from, overwrite, eval_only)

# -----------------------------------------------------------------------------
# data: windows of block_size + 1 tokens from the token shards prepare.py wrote
train_shards = data.open_split(data_dir, 'train')
val_domains = data.open_val_domains(data_dir)  # SlimPajama's 7 domains, one by one; else None
windows = data.WindowOrder(train_shards, block_size, seed, data_dir, data_order, val_domains)
windows.refuse_a_second_epoch(max_iters, global_batch, data_meta)  # 'epoch': each window once
# this rank's share of each global batch: (start, stop) micro-batches of at most pass_size sequences
rank_share = global_batch // ddp_world_size
pass_size = min(micro_batch_size or batch_size, rank_share)  # sequences in a forward pass
rank_micro_batches = data.micro_batches(global_batch, ddp_world_size, ddp_rank, pass_size)

def read_windows(shards, places):  # rows (B, block_size + 1) on the CPU, pinned for a CUDA copy
    return data.read_windows(shards, places, block_size, pin=device_type == 'cuda')

def get_batch(step):
    """nanoGPT's get_batch keyed by step: this rank's training rows, (<= pass_size, T + 1) each."""
    places = windows.places(step, global_batch)
    return [read_windows(train_shards, places[start:stop]) for start, stop in rank_micro_batches]

def on_device(rows):
    """(inputs, next-token targets) on the device, from read_windows's rows: one copy, two views."""
    data.check_token_ids(rows, data_meta, data_dir, run)  # training shards are checked as read
    rows = rows.to(device, non_blocking=device_type == 'cuda')
    return rows[:, :-1], rows[:, 1:]

# evaluation scores {name: (shards, windows)}: a fixed sample; every window at the end (or always)
val_sets, full_val_sets = data.validation_sets(data_dir, val_domains, eval_iters, batch_size,
                                               block_size, every_window=eval_full)
# this rank's share, in pieces of training's pass size: no new batch size, no new memory
rank_val_pieces, rank_full_val_pieces = (data.rank_pieces(sets, pass_size, ddp_rank, ddp_world_size)
                                         for sets in (val_sets, full_val_sets))

# -----------------------------------------------------------------------------
# model and optimizer: from scratch, or the architecture, weights and optimizer of out_dir/ckpt.pt
iter_num, best_val_loss, last_eval = 0, float('inf'), None
loss_since_log, steps_since_log = 0.0, 0  # the training loss summed over the steps since the last log
if init_from == 'resume':  # checked to continue exactly: the settings and data it was trained on
    raw_model, ckpt = run_folder.resume(run, model_config, config, data_meta, eval_only)
    iter_num, best_val_loss, last_eval = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['last_eval']
    loss_since_log, steps_since_log = ckpt.get('loss_since_log', (0.0, 0))
loss_since_log = torch.tensor(loss_since_log, device=device)  # summed on the device: no wait a step
with hardware.memory_error_in_one_line(device):
    if init_from == 'scratch':
        torch.manual_seed(seed)
        raw_model = build_model(model_config)
    raw_model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
settings.check_lr_scales(lr_scales, raw_model)  # names of its parameters
optimizer = optim.configure_optimizers(  # the object; the setting stays in config['optimizer']
    raw_model, weight_decay, learning_rate, (beta1, beta2), device_type, lr_scales,
    muon=(muon_lr, muon_adjust_lr) if config['optimizer'] == 'muon' else None)
if init_from == 'resume':
    run_folder.load_optimizer_state(optimizer, scaler, ckpt, run.ckpt_path)
    del ckpt  # memory-mapped: let go of it
run.take(overwrite, resumed_step=iter_num if init_from == 'resume' else None)  # all checked: now
if wandb and master_process:  # before the process group: a slow login would keep the others waiting
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)
if ddp:
    init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
signals = stops.StopSignals(ddp, ddp_rank, device_type)  # Ctrl-C, SIGTERM
amp = nullcontext() if dtype == 'float32' else torch.autocast(device_type, getattr(torch, dtype))
compiled = device_type == 'cuda' if compile is None else compile
# what the loop calls: raw_model in DDP (which all-reduces the gradients), compiled after DDP so
# that DDPOptimizer splits the graph at DDP's buckets and overlaps their all-reduces
ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                **data_parallel.ddp_options(raw_model)) if ddp else None
model = torch.compile(ddp_model or raw_model) if compiled else ddp_model or raw_model
say = tqdm.write if master_process else lambda line: None  # rank 0 speaks, above any progress bar
say(f"{ddp_world_size} rank(s) on {device} ({dtype}); {tokens_per_iter:,} tokens per step = "
    f"{global_batch} sequences x {block_size} tokens, {rank_share} per rank in micro-batches of "
    f"up to {pass_size}; {tokens_per_iter * max(max_iters - iter_num, 0):,} tokens to go")
say(f"{raw_model.config.variant} model: {raw_model.num_params() / 1e6:.2f}M parameters; λ per "
    f"layer {[tuple(round(v, 3) for v in row) for row in raw_model.lambdas.tolist()]}")
peak = metrics.mfu_peak(peak_tflops, device, say=say)

def get_lr(it):
    """Linear warmup to learning_rate, then cosine down to min_lr at lr_decay_iters (the paper's)"""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)

def eval_loss(shards, places):
    """Mean loss over the windows at places, in one pass of pass_size rows (padding's targets: -1).
    A new y each piece: a view for some and a copy for others would recompile a compiled model."""
    x, y = on_device(read_windows(shards, places + [places[0]] * (pass_size - len(places))))
    y = y.masked_fill(torch.arange(pass_size, device=device)[:, None] >= len(places), -1)
    with amp:
        return model(x, y)

@torch.no_grad()
def evaluate(sets, pieces):
    """(val_loss, {domain: loss}) over the windows of sets (val_sets or full_val_sets), the ranks
    sharing the pieces; val_loss is the mean over domains (the paper's), None for one split."""
    model.eval()
    names = list(sets)
    sums = torch.zeros(len(names), device=device)  # of the windows' mean losses, per set
    for name, places in tqdm(pieces, 'eval', leave=False, delay=5, disable=not master_process):
        sums[names.index(name)] += eval_loss(sets[name][0], places).float() * len(places)
    if ddp:
        torch.distributed.all_reduce(sums)
    model.train()
    losses = {name: total / len(sets[name][1]) for name, total in zip(names, sums.tolist())}
    return sum(losses.values()) / len(losses), (None if val_domains is None else losses)

def forward_backward(batch):
    """Accumulate the gradient of the mean loss over this rank's micro-batches; return that loss."""
    loss_sum = torch.zeros((), device=device)
    for micro_step, ((start, stop), rows) in enumerate(zip(rank_micro_batches, batch)):
        x, y = on_device(rows)
        if ddp:  # all-reduce the gradients once a step, in the last micro-step's backward
            ddp_model.require_backward_grad_sync = micro_step == len(batch) - 1
        with amp:
            loss = model(x, y)
        loss = loss * ((stop - start) / rank_share)  # weighted by its share of the rank's batch
        loss_sum += loss.detach()
        scaler.scale(loss).backward()
    return loss_sum

def checkpoint():
    """All a resume needs: nanoGPT's checkpoint, the loss scaler, the last evaluation, the data."""
    return {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict(), 'model_args': asdict(raw_model.config), 'config': config,
            'iter_num': iter_num, 'best_val_loss': best_val_loss, 'last_eval': last_eval,
            'data_meta': data_meta, 'loss_since_log': (loss_since_log.item(), steps_since_log)}

# -----------------------------------------------------------------------------
# the loop: every eval_interval steps evaluate (and save), and at every step update the weights
nonfinite = stops.NonFinite(device, ddp, iter_num, run)  # the NaN/inf stop
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, mininterval=1.0)
first_step, next_batch = iter_num, None
# a stop signal saves; an error ends every rank; reader (a thread) reads step i+1's batch in step i
with signals.caught(run, checkpoint, nonfinite), progress, hardware.reader_thread(device) as reader:
    if not eval_only and iter_num < max_iters:  # the run's cost, from updates at rate 0: unchanged
        batch, (name, places) = get_batch(iter_num), (rank_val_pieces or [(None, None)])[0]
        metrics.estimate_time(lambda: forward_backward(batch),
                              lambda: eval_loss(val_sets[name][0], places),
                              (len(rank_val_pieces), len(rank_full_val_pieces)), amp, model,
                              optimizer, compiled, device_type == 'cuda',
                              (iter_num, max_iters, eval_interval), tokens_per_iter, say, eval_full)
        progress.unpause()  # the bar's clock skips it
    throughput = metrics.Throughput(tokens_per_iter)  # of the training steps since the last eval
    while True:
        signals.step_boundary()  # under torchrun, a stop signal to any rank stops them all here
        if eval_only or iter_num % eval_interval == 0 or iter_num == max_iters:
            val_loss, domain_losses = evaluate(val_sets, rank_val_pieces)
            said, full = metrics.by_domain(domain_losses), {}
            if full_val_sets and (eval_full or eval_only or iter_num == max_iters):  # every window
                losses = evaluate(full_val_sets, rank_full_val_pieces)
                full, on_all = metrics.full_evaluation(losses, full_val_sets)
                said += on_all
            if eval_only:
                say(f"step {iter_num}: val loss {val_loss:.4f}{said}")
                break
            nonfinite.check(iter_num - 1, val_loss)
            with signals.deferred():  # a stop signal waits for the log record and the checkpoint
                best, best_val_loss = val_loss < best_val_loss, min(best_val_loss, val_loss)
                last_eval = {'step': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss}
                last_eval |= ({'val_loss_domains': domain_losses} if domain_losses else {}) | full
                run.log(last_eval)
                # not at the step it started from (its weights are the seed's or the checkpoint's)
                if master_process and (iter_num > first_step or iter_num == max_iters):
                    run.save(checkpoint(), best)
                signals.wait_for_rank_0()
            say(f"step {iter_num}: val loss {val_loss:.4f} (best {best_val_loss:.4f}){said}")
            throughput.reset()
        if iter_num >= max_iters:
            break

        lr = get_lr(iter_num)
        for group in optimizer.param_groups:  # lr_scale: 1, lr_scales (v5 Sec. 4.3), or Muon's
            group['lr'] = lr * group['lr_scale']
        # dropout from (seed, step, rank) alone, a key no batch's seed uses: a resume is exact
        torch.manual_seed(data.seeded(seed, iter_num, -1 - ddp_rank))
        batch = next_batch.result() if next_batch else get_batch(iter_num)
        next_batch = reader.submit(get_batch, iter_num + 1) if iter_num + 1 < max_iters else None
        train_loss = forward_backward(batch)
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        with signals.deferred():  # a stop signal waits for the update and its log record
            scaler.unscale_(optimizer)
            grad_norms = metrics.grad_norms(raw_model) if log_grad_norms and logging_now else None
            grad_norm = torch.nn.utils.clip_grad_norm_(  # foreach: one fused kernel per dtype
                raw_model.parameters(), grad_clip if grad_clip > 0 else float('inf'), foreach=True)
            nonfinite.observe(iter_num, train_loss, grad_norm, scaler, check=logging_now)
            loss_since_log += train_loss
            steps_since_log += 1
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=not ddp)  # DDP's gradients stay views of its buckets
            iter_num += 1
            throughput.step()
            progress.update(1)
            if logging_now:  # the mean training loss since the last log line (the paper's curve)
                metrics.log_step(run, progress, say, iter_num, loss_since_log / steps_since_log,
                                 grad_norm, lr, throughput.tokens_per_sec(), grad_norms, raw_model,
                                 block_size, peak, ddp_world_size, device)
                loss_since_log, steps_since_log = torch.zeros((), device=device), 0
    if ddp:  # DDP keeps the replicas identical: checked once, cheaply
        say(data_parallel.replicas_agree(raw_model))
if ddp:  # a run that went well: free everything, wait for all ranks, tear down (or gloo may abort)
    del model, ddp_model, raw_model, optimizer
    barrier()
    destroy_process_group()
