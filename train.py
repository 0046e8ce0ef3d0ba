"""
Train a ResFormer / SVFormer / baseline language model. One process on a CPU or GPU:

    python train.py                                   # small Identity ResFormer on Shakespeare (CPU, minutes)
    python train.py config/resformer_82m.py --variant=vanilla

or data-parallel on N devices, with the same global batch (and the same result) as one process:

    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py

A run in out_dir is continued with --init_from=resume or replaced with --overwrite=True; Ctrl-C or SIGTERM
saves a checkpoint to resume from. Settings are the globals below, which config files and --key=value
arguments override (configurator.py).
"""
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import optim
import support
import train_support
from configurator import configure
from model import GPT
from tokens import load_meta, open_split, open_val_domains, prepare_command

# -----------------------------------------------------------------------------
# defaults: a small Identity ResFormer on char-level Shakespeare that trains on a laptop CPU in minutes
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate, then write ckpt.pt (and best.pt when val improves), every this many steps
log_interval = 10
eval_iters = 10  # validation batches of batch_size windows, the same every time (by domain: shared equally)
eval_only = False  # evaluate once, print the loss and stop; writes nothing
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
overwrite = False  # let a fresh run replace the ckpt.pt, best.pt and log.jsonl of a run already in out_dir
wandb_log = False
wandb_project = 'value-residual'
wandb_run_name = 'run'
log_grad_norms = False  # also log every parameter's gradient norm (before clipping) at each log step
# data
dataset = 'shakespeare_char'  # a folder under data/ written by prepare.py
gradient_accumulation_steps = 1  # global batch per optimizer step is gradient_accumulation_steps x batch_size
batch_size = 16  # sequences, whatever the number of ranks
micro_batch_size = None  # most sequences one pass takes; None = batch_size. Lower it to fit memory: same step
block_size = 128  # tokens per sequence: the context length T
data_order = 'auto'  # 'random': drawn with replacement (nanoGPT); 'epoch': each window once (the paper's one
#   epoch, ICLR Sec. 4.1.2); 'epochs': a new order each epoch; 'auto': 'epoch' for SlimPajama, else 'random'
# model: see GPTConfig in model.py for what each flag means
variant = 'resformer_identity'  # 'custom' (the flags below) or a preset: vanilla, svformer,
#   resformer_identity/constant/sparse/learnable(_plus), neutreno(_resformer), denseformer, cla, share_k/v
n_layer = 4  # transformer blocks
n_head = 4  # query heads; head_dim = n_embd / n_head
n_kv_head = None  # key/value heads: None = n_head (MHA), fewer = GQA, 1 = MQA
n_embd = 128  # model width d
ffn_hidden = None  # SwiGLU hidden size: None = 3.5 x n_embd, as in the paper
rope_theta = 10000.0  # RoPE base frequency
dropout = 0.0  # on attention probabilities and residual branches (the paper uses 0)
tie_embeddings = False  # share the input embedding with the LM head (the paper does not)
value_residual = False  # mix V1 into every later layer's values, weighted by lambdas (ResFormer / SVFormer)
lambdas = None  # n_layer rows (weight on V1, weight on V_n); None = Identity, (0.5, 0.5) after layer 1
lambda_mode = 'fixed'  # 'fixed', 'learnable' (starting from lambdas) or 'plus' (Learnable-Plus)
value_rescale = False  # divide the mixed values by λ_{n,1} + λ_{n,2} (our reading of the paper)
residual_source = 0  # residual's source layer: 0 = V1 (the paper), 1 = V2; H0/H1 for residual_type='hidden'
residual_type = 'value'  # it mixes: 'value' (ResFormer), 'query', 'key', 'attention' or 'hidden' (Sec. 4.4)
value_mapping = 'current'  # 'current' (A_n maps V1: ResFormer), 'first' (A_1 V1) or 'identity' (V1; Sec. 4.4)
neutreno_lambda = 0.0  # NeuTRENO baseline: U_n = A_n V'_n + λ (V1 - V'_n); 0 = off
denseformer = False  # DenseFormer baseline: each block's input a learned average of all earlier outputs
share_kv = 'none'  # sharing across pairs of layers: 'kv' (CLA), 'k' or 'v' (Table 1 ablation), or 'none'
value_embeds = False  # nanochat's value embeddings: every other layer adds a gated token table to its values
value_bank = False  # Bank of Values (arXiv 2606.02780): the last third of the layers look values up in tables
h0_residual = True  # False: block 1 drops its residual connection from H0 (Sec. 4.4's V2-source ablation)
# AdamW and the learning-rate schedule: linear warmup, then cosine down to min_lr at lr_decay_iters
optimizer = 'adamw'  # 'adamw' (the paper's), or 'muon': torch.optim.Muon (torch 2.9+) for the blocks'
#   matrices, AdamW for the rest, one schedule driving both
muon_lr = 0.02  # Muon's peak rate, scaled by the schedule as learning_rate is (Keller Jordan's Muon default)
muon_adjust_lr = 'original'  # Muon's rate per matrix shape: 'original' (Keller Jordan's, torch's default:
#   x sqrt(max(1, rows/cols))) or 'match_rms_adamw' (Moonshot's Moonlight: x 0.2 sqrt(max(rows, cols)))
learning_rate = 2e-3
max_iters = 600
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
lr_scales = []  # [parameter name, multiplier] pairs trained at multiplier x the rate (Sec. 4.3's control)
warmup_iters = 50
lr_decay_iters = 600
min_lr = 2e-4
# system
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name); or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' = bfloat16 on GPUs that have it, else float16 on CUDA, else float32; or name one
compile = None  # torch.compile: None = on for CUDA, off elsewhere (where it does not pay for itself)
peak_tflops = 0.0  # one accelerator's peak for MFU at this dtype; 0 = the GPU's, support.PEAK_TFLOPS
deterministic = False  # deterministic kernels (math attention on CUDA): repeatable bit for bit, slower
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# the type of each setting whose default is None, which configure cannot read off the default
none_default_types = {'n_kv_head': int, 'ffn_hidden': int, 'lambdas': list, 'compile': bool,
                      'micro_batch_size': int}
globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], types=none_default_types,
                           script=__file__, verbose=os.environ.get('RANK', '0') == '0'))
config = {k: globals()[k] for k in config_keys}  # what this run used, for the log and the checkpoint
# -----------------------------------------------------------------------------
# Everything is checked before anything touches out_dir: a run that cannot start changes nothing on disk.
train_support.check_settings(config)
wandb = train_support.import_wandb() if wandb_log else None

data_dir = os.path.join('data', dataset)
config['data_dir'] = data_dir
data_meta = load_meta(data_dir)
model_config = train_support.model_config(config, data_meta['vocab_size'])  # padded to a multiple of 64
global_batch = gradient_accumulation_steps * batch_size
tokens_per_iter = global_batch * block_size

# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the process group starts once everything has been checked
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1))
master_process = ddp_rank == 0
device = support.pick_device(device, needs_gpu=None if eval_only else train_support.needs_gpu(
    model_config, block_size, tokens_per_iter * max_iters))
if ddp and device.startswith('cuda'):
    device = f'cuda:{ddp_local_rank}'
device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
if deterministic:  # bench.py's node check: a resumed run must then end as a straight one, bit for bit
    train_support.use_deterministic_kernels(device_type)
if device_type == 'cuda':  # before anything touches CUDA, or every rank's context opens on GPU 0 as well
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
ptdtype = support.pick_dtype(dtype, device_type)
train_support.check_model_fits(model_config, device, training=not eval_only)
run = train_support.RunFolder(out_dir, writes=master_process and not eval_only, wandb=wandb)
if not eval_only:  # the only run that writes nothing
    run.check_can_start(init_from, overwrite)
# this rank's share of each global batch, as (start, stop) pieces of at most micro_batch_size sequences
rank_micro_batches = train_support.micro_batches(global_batch, ddp_world_size, ddp_rank,
                                                 micro_batch_size or batch_size)
rank_share = rank_micro_batches[-1][1] - rank_micro_batches[0][0]

# -----------------------------------------------------------------------------
# data: windows of block_size + 1 tokens from the token shards prepare.py wrote
train_shards = open_split(data_dir, 'train')
epochs = train_support.EpochOrder(train_shards, block_size, seed, data_dir)  # each window once an epoch
train_room = torch.tensor([len(shard) - block_size - 1 for shard in train_shards], dtype=torch.float64)
val_domains = open_val_domains(data_dir)
order = data_order if data_order != 'auto' else 'random' if val_domains is None else 'epoch'
if order == 'epoch':
    epochs.refuse_a_second_epoch(max_iters, global_batch, data_meta, data_order, val_domains is not None)

def global_batch_places(step):
    """(shard, start) of the step's global batch of windows, drawn with replacement or in the epoch order: the
    step alone says which, so a resumed run continues exactly, and the ranks split the batch as ever."""
    if order != 'random':
        return epochs.places(step, global_batch)
    generator = torch.Generator().manual_seed(train_support.seeded(seed, step))
    which = torch.multinomial(train_room, global_batch, replacement=True, generator=generator)
    starts = (torch.rand(global_batch, generator=generator, dtype=torch.float64) * train_room[which]).long()
    return list(zip(which.tolist(), starts.tolist()))

def read_windows(shards, places):
    """Windows of block_size + 1 tokens at places, as one block of rows on the CPU (pinned for a CUDA copy),
    copied whole and sliced on the device (a slice's strides would copy through pageable memory)."""
    rows = torch.from_numpy(np.stack([shards[s][i:i + block_size + 1].astype(np.int64) for s, i in places]))
    return rows.pin_memory() if device_type == 'cuda' else rows

def on_device(rows):
    """(inputs, next-token targets) on the device, from read_windows's rows."""
    if rows.max() >= data_meta['vocab_size']:  # open_split scans only the (small) validation split
        raise SystemExit(f"train.py: {data_dir} holds token id {rows.max()}, outside the vocabulary of "
                         f"{data_meta['vocab_size']}; run `{prepare_command(data_dir)}` again; "
                         f"stopped, {run.kept()}")
    rows = rows.to(device, non_blocking=device_type == 'cuda')
    return rows[:, :-1], rows[:, 1:]

def rank_rows(step):
    """This rank's micro-batches of the step's training windows, read: the loop reads the next step's in a
    thread while this one computes, so a slow (network) file system stalls no step."""
    places = global_batch_places(step)
    return [read_windows(train_shards, places[start:stop]) for start, stop in rank_micro_batches]


# what evaluation scores, {name: (shards, windows)}: a sample, the same at every step (and full_val_sets)
val_split = open_split(data_dir, 'val') if val_domains is None else None  # else the domains' files
val_sets, full_val_sets = train_support.validation_sets(val_split, val_domains, eval_iters, batch_size,
                                                        block_size)
# this rank's share, in pieces of its training micro-batch's size: compiled, no new batch size, no new memory
piece = rank_micro_batches[0][1] - rank_micro_batches[0][0]
rank_val_pieces, rank_full_val_pieces = (train_support.rank_pieces(sets, piece, ddp_rank, ddp_world_size)
                                         for sets in (val_sets, full_val_sets))

# -----------------------------------------------------------------------------
# model: from scratch, or the architecture, weights and optimizer state of out_dir/ckpt.pt
iter_num, best_val_loss, last_eval = 0, float('inf'), None
if init_from == 'resume':
    raw_model, saved = support.load_checkpoint(run.ckpt_path)
    train_support.check_resume(saved, run.ckpt_path, raw_model.config, model_config, config, data_meta,
                               eval_only)
    iter_num = run.saved_step = saved['iter_num']
    best_val_loss, last_eval = saved['best_val_loss'], saved.get('last_eval')
with train_support.memory_error_in_one_line(device):
    if init_from == 'scratch':
        torch.manual_seed(seed)
        raw_model = GPT(model_config)
    raw_model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == 'float16')
try:
    optimizer = optim.configure_optimizers(  # the setting's name; from here on, the optimizer
        raw_model, weight_decay, learning_rate, (beta1, beta2), device_type, lr_scales,
        muon=(muon_lr, muon_adjust_lr) if optimizer == 'muon' else None)
except (TypeError, ValueError) as e:  # a name that is no parameter, or not [name, multiplier] pairs
    raise SystemExit(f"train.py: bad lr_scales={lr_scales!r}: {e}") from None
if init_from == 'resume':
    train_support.load_optimizer_state(optimizer, scaler, saved, run.ckpt_path)
    del saved

# everything checked: take out_dir, then start the process group (torchrun ends ranks left waiting in it)
if run.writes:
    run.take(overwrite, resumed_step=iter_num if init_from == 'resume' else None)
if ddp:
    init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
signals = train_support.StopSignals(ddp, ddp_rank, device_type)  # Ctrl-C, SIGTERM
autocast = nullcontext() if ptdtype == 'float32' else torch.autocast(device_type, getattr(torch, ptdtype))
compiled = device_type == 'cuda' if compile is None else compile
model = raw_model
if ddp:
    model = ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                            **train_support.ddp_options(raw_model))
# compiled once, for training and evaluation; DDP compiled, not the reverse: DDPOptimizer splits the graph at
# DDP's buckets, to overlap all-reduces
fast_model = model = torch.compile(model) if compiled else model
if master_process:
    print(f"{ddp_world_size} rank(s) on {device} ({ptdtype}); {tokens_per_iter:,} tokens per step = "
          f"{global_batch} sequences x {block_size} tokens, {rank_share} per rank in micro-batches of up to "
          f"{micro_batch_size or batch_size}; "
          f"{tokens_per_iter * max(max_iters - iter_num, 0):,} tokens to go")
    print(f"{raw_model.config.variant} model: {raw_model.num_params() / 1e6:.2f}M parameters; λ per layer "
          f"{[tuple(round(v, 3) for v in row) for row in raw_model.lambdas.tolist()]}")
peak = train_support.mfu_peak(peak_tflops, device, say=print if master_process else lambda _: None)
if wandb and master_process:
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)

def get_lr(it):
    """Linear warmup to learning_rate, then cosine decay to min_lr at lr_decay_iters (the paper's)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)

@torch.no_grad()
def evaluate(sets, pieces):
    """(val_loss, {domain: loss}) over the windows of sets (val_sets or full_val_sets), the ranks sharing
    their pieces; val_loss is the unweighted mean over the domains (the paper's); no domains for one split."""
    fast_model.eval()
    names = list(sets)
    sums = torch.zeros(len(names), device=device)  # of the windows' mean losses, per set
    for name, places in tqdm(pieces, desc='evaluating', leave=False, delay=5,
                             disable=not master_process, dynamic_ncols=True):
        x, y = on_device(read_windows(sets[name][0], places + places[:1] * (piece - len(places))))
        if len(places) < piece:  # a last piece, padded with rows whose targets, -1, the loss ignores
            y = y.masked_fill(torch.arange(piece, device=device).unsqueeze(1) >= len(places), -1)
        with autocast:
            loss = fast_model(x, y)[1]
        sums[names.index(name)] += loss.float() * len(places)
    if ddp:
        torch.distributed.all_reduce(sums)
    fast_model.train()
    losses = {name: total / len(sets[name][1]) for name, total in zip(names, sums.tolist())}
    return sum(losses.values()) / len(losses), (None if val_domains is None else losses)

def checkpoint():
    """All a resume needs: nanoGPT's checkpoint, plus the loss scaler, the last evaluation and the data."""
    return {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict(), 'model_args': asdict(raw_model.config), 'iter_num': iter_num,
            'best_val_loss': best_val_loss, 'last_eval': last_eval, 'config': config, 'data_meta': data_meta}

def estimate_time():
    """Say what the run will cost (train_support.estimate_time): a training micro-batch and an evaluation
    batch (the first of this rank's, if it has one), each read, computed and timed."""
    start, stop = rank_micro_batches[0]
    x, y = on_device(read_windows(train_shards, global_batch_places(iter_num)[start:stop]))
    name, places = rank_val_pieces[0] if rank_val_pieces else (None, None)
    counts = len(rank_micro_batches), len(rank_val_pieces), len(rank_full_val_pieces)
    train_support.estimate_time(lambda: model(x, y)[1].backward(),
                                lambda: fast_model(*on_device(read_windows(val_sets[name][0], places))),
                                autocast, counts, fast_model, optimizer, compiled, device_type == 'cuda',
                                (iter_num, max_iters, eval_interval), tokens_per_iter, say)

def log_step(train_loss, grad_norm, lr, tokens_per_sec, grad_norms):
    """The step's record in log.jsonl, and its line (train_support.step_record: what it holds)."""
    if ddp:  # the mean over ranks (gloo has no ReduceOp.AVG in older torch, 2.5.1 say)
        torch.distributed.all_reduce(train_loss)
        train_loss /= ddp_world_size
    record, line = train_support.step_record(iter_num, train_loss.item(), grad_norm.item(), lr,
                                             tokens_per_sec, grad_norms, raw_model, block_size, peak,
                                             ddp_world_size, device)
    run.log(record)
    progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
    say(line)


# -----------------------------------------------------------------------------
# the training loop
nonfinite = train_support.NonFinite(device, ddp, iter_num, run)  # the NaN/inf stop
first_step = iter_num
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, dynamic_ncols=True,
                mininterval=1.0)
say = progress.write if master_process else lambda line: None  # rank 0 speaks, above the bar
# a stop signal saves; an error ends every rank; reader reads training windows a step ahead
with signals.caught(run, checkpoint, nonfinite), progress, ThreadPoolExecutor(1) as reader:
    if not eval_only and iter_num < max_iters:
        estimate_time()  # before the step-0 evaluation, and every rank (a backward all-reduces under DDP)
        progress.unpause()  # the bar's clock skips it
    t_log, steps_timed, next_rows = time.time(), 0, None
    while True:
        signals.step_boundary()  # under torchrun, a stop signal to any rank stops them all here
        if eval_only or iter_num % eval_interval == 0 or iter_num == max_iters:
            val_loss, domain_losses = evaluate(val_sets, rank_val_pieces)
            said, full = train_support.by_domain(domain_losses), {}
            if full_val_sets and (eval_only or iter_num == max_iters):  # the last: every window too
                full, on_all = train_support.full_evaluation(evaluate(full_val_sets, rank_full_val_pieces),
                                                             full_val_sets)
                said += on_all
            if eval_only:
                say(f"step {iter_num}: val loss {val_loss:.4f}{said}")
                break
            nonfinite.check(iter_num - 1, val_loss)
            with signals.deferred():  # a stop signal waits for the log record and the checkpoint
                best = val_loss < best_val_loss
                best_val_loss = min(best_val_loss, val_loss)
                last_eval = {'step': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss}
                if domain_losses:
                    last_eval['val_loss_domains'] = domain_losses
                last_eval.update(full)
                run.log(last_eval)
                # not at the step it started from (its weights are the seed's or the checkpoint's)
                if master_process and (iter_num > first_step or iter_num == max_iters):
                    run.save(checkpoint(), best)
                signals.wait_for_rank_0()
            say(f"step {iter_num}: val loss {val_loss:.4f} (best {best_val_loss:.4f}){said}")
            t_log, steps_timed = time.time(), 0  # throughput counts training steps only
        if iter_num >= max_iters:
            break

        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_scale']
        torch.manual_seed(train_support.seeded(seed, iter_num, -1 - ddp_rank))  # this step's dropout
        rows = next_rows.result() if next_rows else rank_rows(iter_num)  # read while the last step computed
        next_rows = reader.submit(rank_rows, iter_num + 1) if iter_num + 1 < max_iters else None
        train_loss = torch.zeros((), device=device)
        for micro_step, ((start, stop), batch) in enumerate(zip(rank_micro_batches, rows)):
            x, y = on_device(batch)
            if ddp:  # all-reduce the gradients once a step, in the last micro-step's backward
                ddp_model.require_backward_grad_sync = micro_step == len(rank_micro_batches) - 1
            with autocast:  # the mean over this rank's share; DDP averages the shares
                loss = model(x, y)[1] * ((stop - start) / rank_share)
            train_loss += loss.detach()
            scaler.scale(loss).backward()
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        with signals.deferred():  # a stop signal waits for the update and its log record
            scaler.unscale_(optimizer)
            # per-matrix norms, e.g. layer 1's W_V against W_O (the paper's Sec. 4.3)
            grad_norms = {name: p.grad.norm().item() for name, p in raw_model.named_parameters()
                          if p.grad is not None} if log_grad_norms and logging_now else None
            grad_norm = torch.nn.utils.clip_grad_norm_(  # foreach: one fused kernel per dtype, on CPU too
                raw_model.parameters(), grad_clip if grad_clip > 0 else float('inf'), foreach=True)
            nonfinite.observe(iter_num, train_loss, grad_norm, scaler, check=logging_now)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=not ddp)  # under DDP the gradients stay views of its buckets
            iter_num += 1
            if iter_num == first_step + 1 and device_type == 'cuda':
                say(f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2 ** 30:.1f} GiB")
            steps_timed += 1
            progress.update(1)
            if logging_now:
                tokens_per_sec = tokens_per_iter * steps_timed / (time.time() - t_log)
                t_log, steps_timed = time.time(), 0
                log_step(train_loss, grad_norm, lr, tokens_per_sec, grad_norms)
    if ddp:  # DDP keeps the replicas identical: checked once, cheaply
        differ = train_support.replicas_differ_by(raw_model)
        say(f"weights across {ddp_world_size} ranks differ by at most {differ:.3g}")
# after a run that went well: free everything, wait for all ranks, then tear down (else gloo may abort)
if ddp:
    del model, ddp_model, fast_model, raw_model, optimizer
    barrier()
    destroy_process_group()
