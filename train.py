"""
Train a ResFormer / SVFormer / baseline language model. One process on a CPU or GPU:

    python train.py                                   # small Identity ResFormer on Shakespeare (CPU, minutes)
    python train.py config/resformer_82m.py --variant=vanilla

or data-parallel on N devices (each rank gets batch_size sequences per micro-step):

    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py

Settings are the globals below; config files and --key=value arguments override them (configurator.py).
"""
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import configure
from model import GPT, GPTConfig, load_checkpoint, pick_device, pick_dtype
from prepare import load_meta, open_split

# -----------------------------------------------------------------------------
# defaults: a small Identity ResFormer on character-level Shakespeare that trains on a laptop CPU in minutes
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate, then write ckpt.pt (and best.pt when val improves), every this many steps
log_interval = 10
eval_iters = 10  # fixed validation batches (the same windows every time, so curves compare across runs)
eval_only = False
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
wandb_log = False
wandb_project = 'value-residual'
wandb_run_name = 'run'
log_grad_norms = False  # also log every parameter's gradient norm (before clipping) at each log step
# data
dataset = 'shakespeare_char'  # a folder under data/ written by prepare.py
gradient_accumulation_steps = 1  # micro-steps per optimizer step, summed over all ranks
batch_size = 16  # sequences per micro-step per rank
block_size = 128
# model: see GPTConfig in model.py for what each flag means
variant = 'resformer_identity'  # a name from model.VARIANTS, or 'custom' to set the flags below yourself
n_layer = 4
n_head = 4
n_kv_head = None
n_embd = 128
ffn_hidden = None
rope_theta = 10000.0
dropout = 0.0
tie_embeddings = False
value_residual = False
lambdas = None
lambda_mode = 'fixed'
value_rescale = False
residual_source = 0  # layer the residual is taken from: 0 = V1 (the paper), 1 = V2; H0/H1 for residual_type='hidden'
residual_type = 'value'  # what it mixes: 'value' (ResFormer), 'query', 'key', 'attention' or 'hidden' (Sec. 4.4)
value_mapping = 'current'  # 'current' (A_n maps V1, ResFormer) or 'first' (layer 1's own A_1 V1 mixed in; Sec. 4.4)
neutreno_lambda = 0.0
denseformer = False
share_kv = 'none'
# AdamW and the learning-rate schedule: linear warmup, then cosine down to min_lr at lr_decay_iters
learning_rate = 2e-3
max_iters = 600
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
warmup_iters = 50
lr_decay_iters = 600
min_lr = 2e-4
# system
device = 'auto'  # 'auto' picks cuda, then mps, then cpu; or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' = bfloat16 on GPUs that have it, else float16 on CUDA, else float32; or name one
compile = None  # torch.compile: None = on for CUDA, off elsewhere (where it does not pay for itself)
peak_tflops = 0.0  # accelerator peak for MFU at this dtype; 0 = look the GPU up in PEAK_TFLOPS (no MFU on CPU)
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# -----------------------------------------------------------------------------

# dense bf16 TFLOP/s by GPU name, for MFU; say which one is used so the figure can be checked
PEAK_TFLOPS = {'H200': 989.0, 'H100': 989.0, 'A100': 312.0, 'L40S': 362.0, 'A10G': 125.0, 'L4': 121.0, '4090': 165.0, 'V100': 125.0}


def setup_distributed():
    """(rank, local_rank, world_size, device) from the variables torchrun sets; a single process otherwise."""
    if 'RANK' not in os.environ:
        return 0, 0, 1, pick_device(device)
    rank, local_rank, world_size = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    use_cuda = pick_device(device).startswith('cuda')
    init_process_group(backend='nccl' if use_cuda else 'gloo')
    if use_cuda:
        torch.cuda.set_device(local_rank)
    return rank, local_rank, world_size, f'cuda:{local_rank}' if use_cuda else 'cpu'


def seeded(*keys):
    """A seed derived from `seed` and integer keys: batches and dropout depend on the step alone, not on
    RNG state carried across steps, so a resumed run and a run on any number of ranks draw the same ones."""
    return hash((seed, *keys)) & (2 ** 63 - 1)  # int tuples hash identically in every process


def get_batch(shards, generator):
    """batch_size random windows of block_size + 1 tokens (inputs, next-token targets), drawn by `generator`."""
    room = torch.tensor([len(shard) - block_size - 1 for shard in shards], dtype=torch.float64)
    which = torch.multinomial(room, batch_size, replacement=True, generator=generator)
    starts = (torch.rand(batch_size, generator=generator, dtype=torch.float64) * room[which]).long()
    return windows(shards, zip(which.tolist(), starts.tolist()))


def windows(shards, places):
    rows = torch.from_numpy(np.stack([shards[s][i:i + block_size + 1].astype(np.int64) for s, i in places]))
    x, y = rows[:, :-1], rows[:, 1:]
    if device_type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def validation_batches(shards):
    """eval_iters batches of windows evenly spaced over the validation split: the same ones in every run."""
    places = [(s, i) for s, shard in enumerate(shards) for i in range(0, len(shard) - block_size - 1, block_size)]
    count = eval_iters * batch_size
    if len(places) < count:
        raise SystemExit(f"train.py: the validation split has {len(places)} windows of {block_size} tokens, "
                         f"fewer than eval_iters*batch_size={count}; lower eval_iters or batch_size")
    chosen = [places[round(k * (len(places) - 1) / max(count - 1, 1))] for k in range(count)]
    return [chosen[b * batch_size:(b + 1) * batch_size] for b in range(eval_iters)]


def get_lr(it):
    """Linear warmup to learning_rate, then cosine decay to min_lr at lr_decay_iters (the paper's schedule)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


@torch.no_grad()
def evaluate():
    """Mean loss over the fixed validation batches, shared out across ranks."""
    fast_model.eval()
    total = torch.zeros(2, device=device)
    for places in val_batches[ddp_rank::ddp_world_size]:
        x, y = windows(val_shards, places)
        with autocast:
            _, loss = fast_model(x, y)
        total += torch.stack([loss.float(), torch.ones((), device=device)])
    if ddp:
        torch.distributed.all_reduce(total)
    fast_model.train()
    return (total[0] / total[1]).item()


def save_checkpoint(name):
    """Write out_dir/name atomically: a crash mid-write leaves the previous file intact."""
    checkpoint = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(), 'scaler': scaler.state_dict(),
                  'model_args': asdict(raw_model.config), 'iter_num': iter_num, 'best_val_loss': best_val_loss,
                  'config': config, 'data_meta': data_meta}
    path = os.path.join(out_dir, name)
    torch.save(checkpoint, path + '.tmp')
    os.replace(path + '.tmp', path)


def log_metrics(record):
    if master_process:
        with open(log_path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        if wandb_log:
            wandb.log(record, step=record['step'])


# -----------------------------------------------------------------------------
# the type of each setting whose default is None, which configure cannot read off the default
none_default_types = {'n_kv_head': int, 'ffn_hidden': int, 'lambdas': list, 'compile': bool}
globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], types=none_default_types,
                           script=__file__, verbose=os.environ.get('RANK', '0') == '0'))
config = {k: globals()[k] for k in config_keys}  # what this run used, for the log and the checkpoint
if init_from not in ('scratch', 'resume'):
    raise SystemExit(f"train.py: init_from={init_from!r}; use 'scratch' or 'resume'")

ddp_rank, ddp_local_rank, ddp_world_size, device = setup_distributed()
ddp = ddp_world_size > 1 or 'RANK' in os.environ
master_process = ddp_rank == 0
device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
if gradient_accumulation_steps % ddp_world_size:
    raise SystemExit(f"train.py: gradient_accumulation_steps={gradient_accumulation_steps} must be a multiple of "
                     f"the {ddp_world_size} ranks, so the global batch does not depend on the number of ranks")
micro_steps = gradient_accumulation_steps // ddp_world_size
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
ptdtype = pick_dtype(dtype, device_type)
autocast = nullcontext() if ptdtype == 'float32' else torch.autocast(device_type, dtype=getattr(torch, ptdtype))
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
if master_process:
    os.makedirs(out_dir, exist_ok=True)
    print(f"{ddp_world_size} rank(s) on {device} ({ptdtype}); {tokens_per_iter:,} tokens per step "
          f"= {gradient_accumulation_steps} micro-steps x {batch_size} sequences x {block_size} tokens")

data_dir = os.path.join('data', dataset)
config['data_dir'] = data_dir
data_meta = load_meta(data_dir)
train_shards, val_shards = open_split(data_dir, 'train'), open_split(data_dir, 'val')
if any(len(shard) <= block_size + 1 for shard in train_shards):
    raise SystemExit(f"train.py: a training shard in {data_dir} is shorter than block_size={block_size}; lower block_size")
val_batches = validation_batches(val_shards)

# model: from scratch, or the architecture, weights and optimizer state of out_dir/ckpt.pt
model_args = {f.name: globals()[f.name] for f in fields(GPTConfig) if f.name in globals()}
model_args['vocab_size'] = -(-data_meta['vocab_size'] // 64) * 64  # padded to a multiple of 64 for faster matmuls
try:
    model_config = GPTConfig(**model_args)
except (TypeError, ValueError) as e:
    raise SystemExit(f"train.py: bad model settings: {e}")
iter_num, best_val_loss, checkpoint = 0, float('inf'), None
log_path = os.path.join(out_dir, 'log.jsonl')
if init_from == 'resume':
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    raw_model, checkpoint = load_checkpoint(ckpt_path)
    if raw_model.config != model_config:
        changed = [f.name for f in fields(GPTConfig) if getattr(raw_model.config, f.name) != getattr(model_config, f.name)]
        raise SystemExit(f"train.py: the settings give a different model than {ckpt_path} ({', '.join(changed)}); "
                         f"resume with the settings it was trained with")
    iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
    if master_process and os.path.exists(log_path):  # forget what the log says about steps after the checkpoint
        with open(log_path) as f:
            kept = [line for line in f if json.loads(line)['step'] <= iter_num]
        with open(log_path, 'w') as f:
            f.writelines(kept)
else:
    torch.manual_seed(seed)
    raw_model = GPT(model_config)
    if master_process and os.path.exists(log_path):
        os.remove(log_path)
raw_model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == 'float16')
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint['optimizer'])
    scaler.load_state_dict(checkpoint['scaler'])
    del checkpoint
fast_model = torch.compile(raw_model) if (device_type == 'cuda' if compile is None else compile) else raw_model
model = fast_model  # what the training step calls: wrapped for DDP below; evaluation calls fast_model directly
if ddp:  # our buffers (RoPE table, fixed λ) never change, so DDP need not broadcast them every step
    model = DDP(fast_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None, broadcast_buffers=False)
if master_process:
    print(f"{raw_model.config.variant} model: {raw_model.num_params() / 1e6:.2f}M parameters; λ per layer "
          f"{[tuple(round(v, 3) for v in row) for row in raw_model.lambdas.tolist()]}")
peak = peak_tflops or next((tflops for name, tflops in PEAK_TFLOPS.items()
                            if device_type == 'cuda' and name in torch.cuda.get_device_name()), 0.0)
if wandb_log and master_process:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)

# -----------------------------------------------------------------------------
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, dynamic_ncols=True, mininterval=1.0)
try:
    while True:
        if iter_num % eval_interval == 0 or iter_num == max_iters or eval_only:
            val_loss = evaluate()
            best = val_loss < best_val_loss
            best_val_loss = min(best_val_loss, val_loss)
            log_metrics({'step': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss})
            if master_process:
                progress.write(f"step {iter_num}: val loss {val_loss:.4f} (best {best_val_loss:.4f})")
                if not eval_only:
                    save_checkpoint('ckpt.pt')
                    if best:
                        save_checkpoint('best.pt')
        if iter_num >= max_iters or eval_only:
            break

        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group['lr'] = lr
        t0 = time.time()
        torch.manual_seed(seeded(iter_num, -1 - ddp_rank))  # dropout noise for this step and rank
        train_loss = torch.zeros((), device=device)
        for micro_step in range(micro_steps):
            # this rank's share of the global micro-steps: the same batches whatever the number of ranks
            batch_index = ddp_rank * micro_steps + micro_step
            x, y = get_batch(train_shards, torch.Generator().manual_seed(seeded(iter_num, batch_index)))
            if ddp:
                model.require_backward_grad_sync = micro_step == micro_steps - 1  # all-reduce once, on the last
            with autocast:
                _, loss = model(x, y)
                loss = loss / micro_steps  # the mean over this rank's micro-steps; DDP then averages over ranks
            train_loss += loss.detach()
            scaler.scale(loss).backward()
        if ddp:
            torch.distributed.all_reduce(train_loss, op=torch.distributed.ReduceOp.AVG)
        scaler.unscale_(optimizer)
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        if log_grad_norms and logging_now:  # per-matrix norms, e.g. layer 1's W_V against W_O (the paper's Sec. 4.3)
            grad_norms = {name: p.grad.norm().item() for name, p in raw_model.named_parameters() if p.grad is not None}
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip if grad_clip > 0 else float('inf')).item()
        train_loss = train_loss.item()
        # (with fp16 the GradScaler itself makes inf gradients now and then, and skips those steps)
        if not math.isfinite(train_loss) or not (scaler.is_enabled() or math.isfinite(grad_norm)):
            last = iter_num - iter_num % eval_interval
            kept = f"kept {out_dir}/ckpt.pt (step {last})" if os.path.exists(f"{out_dir}/ckpt.pt") else "no checkpoint yet"
            raise SystemExit(f"train.py: loss {train_loss}, gradient norm {grad_norm} at step {iter_num}; stopped before "
                             f"updating the weights, {kept}; lower learning_rate or use dtype='float32'")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        dt = time.time() - t0
        iter_num += 1
        progress.update(1)
        progress.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", refresh=False)
        if logging_now:
            record = {'step': iter_num, 'train_loss': train_loss, 'grad_norm': grad_norm, 'lr': lr,
                      'tokens_per_sec': tokens_per_iter / dt}
            if peak:
                record['mfu'] = raw_model.estimate_mfu(tokens_per_iter / dt, block_size, peak * 1e12)
            if raw_model.config.lambda_mode != 'fixed':
                record['lambdas'] = raw_model.lambdas.tolist()
            if log_grad_norms:
                record['grad_norms'] = grad_norms
            log_metrics(record)
            if master_process:
                mfu = f", mfu {100 * record['mfu']:.1f}% of {peak:g} TFLOP/s" if peak else ""
                progress.write(f"step {iter_num}: loss {train_loss:.4f}, lr {lr:.2e}, "
                               f"{record['tokens_per_sec']:,.0f} tok/s{mfu}")
    if ddp:  # DDP keeps the replicas identical by construction; check it once, cheaply, at the end
        weights = torch.cat([p.detach().reshape(-1).float() for p in raw_model.parameters()])
        highest, lowest = weights.clone(), weights.clone()
        torch.distributed.all_reduce(highest, op=torch.distributed.ReduceOp.MAX)
        torch.distributed.all_reduce(lowest, op=torch.distributed.ReduceOp.MIN)
        if master_process:
            progress.write(f"weights across {ddp_world_size} ranks differ by at most {(highest - lowest).max().item():.3g}")
finally:
    progress.close()
    if ddp:  # free everything, wait for all ranks, then tear down: gloo aborts otherwise (SPEC.md)
        del model, fast_model, raw_model, optimizer
        barrier()
        destroy_process_group()
