"""
Train a ResFormer / SVFormer / baseline language model. One process on a CPU or GPU:

    python train.py                                   # small Identity ResFormer on Shakespeare (CPU, minutes)
    python train.py config/resformer_82m.py --variant=vanilla

or data-parallel on N devices, with the same global batch (and the same result) as one process:

    torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py

An out_dir that holds a run is continued with --init_from=resume or replaced with --overwrite=True;
Ctrl-C or SIGTERM (a scheduler's) saves a checkpoint at the step it stops, to resume from; one run at a
time writes to it.

Settings are the globals below; config files and --key=value arguments override them (configurator.py).
"""
import functools
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import support
import train_support
from configurator import configure
from model import GPT, GPTConfig
from tokens import load_meta, open_split, open_val_domains, prepare_command

# -----------------------------------------------------------------------------
# defaults: a small Identity ResFormer on char-level Shakespeare that trains on a laptop CPU in minutes
# I/O
out_dir = 'out'
eval_interval = 100  # evaluate, then write ckpt.pt (and best.pt when val improves), every this many steps
log_interval = 10
eval_iters = 10  # validation batches of batch_size windows, the same every time (curves compare across runs);
# a validation split kept by domain (SlimPajama's) shares as many windows equally among its domains, each
# share rounded up to whole batches: about the same cost
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
data_order = 'auto'  # training windows: 'random' = drawn with replacement, as nanoGPT does; 'epoch' = each
# window once, in a seeded order (the paper's one epoch, ICLR Sec. 4.1.2), refusing a run that needs more;
# 'epochs' = the same, a new order each epoch; 'auto' = 'epoch' on data whose validation is kept by domain
# (SlimPajama, the full-scale data), else 'random' (the small datasets' runs, and the results committed from
# them, stay as they were)
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
optimizer = 'adamw'  # 'adamw' (the paper's), or 'muon': torch.optim.Muon (torch 2.9+) for the blocks' linear
# weights, AdamW for the rest (embeddings, LM head, norms, λ, value tables), one schedule driving both
muon_lr = 0.02  # Muon's peak rate, scaled by the schedule as learning_rate is (Keller Jordan's Muon default)
muon_adjust_lr = 'original'  # Muon's rate per matrix shape: 'original' (Keller Jordan's, torch's default:
# x sqrt(max(1, rows/cols))) or 'match_rms_adamw' (Moonshot's Moonlight: x 0.2 sqrt(max(rows, cols)))
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
model_args = {f.name: globals()[f.name] for f in fields(GPTConfig) if f.name in globals()}
model_args['vocab_size'] = -(-data_meta['vocab_size'] // 64) * 64  # a multiple of 64: faster matmuls
try:
    model_config = GPTConfig(**model_args)
except (TypeError, ValueError) as e:
    raise SystemExit(f"train.py: bad model settings: {e}")
global_batch = gradient_accumulation_steps * batch_size
tokens_per_iter = global_batch * block_size

# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the process group starts once everything has been checked
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1))
master_process = ddp_rank == 0
too_big_for_cpu = None if eval_only else train_support.needs_gpu(model_config, block_size,
                                                                 tokens_per_iter * max_iters)
device = support.pick_device(device, too_big_for_cpu)
if ddp and device.startswith('cuda'):
    device = f'cuda:{ddp_local_rank}'
device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
if deterministic:  # bench.py's node check: a resumed run must then end as a straight one, bit for bit
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # cuBLAS reads it once, at its first call
    # an op with no deterministic kernel warns rather than stops the run: the node check then finds the runs
    # apart and falls back to its bound
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device_type == 'cuda':  # the fused attention kernels' backwards add in no fixed order
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
if device_type == 'cuda':  # before anything touches CUDA, or every rank's context opens on GPU 0 as well
    torch.cuda.set_device(device)
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
if any(len(shard) <= block_size + 1 for shard in train_shards):
    raise SystemExit(f"train.py: a training shard in {data_dir} is shorter than block_size={block_size}; "
                     f"lower block_size")
train_room = torch.tensor([len(shard) - block_size - 1 for shard in train_shards],
                          dtype=torch.float64)  # window starts
val_domains = open_val_domains(data_dir)
order = data_order if data_order != 'auto' else 'random' if val_domains is None else 'epoch'


def window_starts(shard):
    """Where a shard's windows that share no target start: every block_size tokens, each window overlapping
    the next by the one token that is its last target and the next one's first input, so every token but a
    shard's first is a target once. (The paper's 2,048-token chunks share no token, and the first of each is
    no target.)"""
    return range(0, len(shard) - block_size, block_size)


def every_window(shards):
    return [(s, i) for s, shard in enumerate(shards) for i in window_starts(shard)]


# the epoch orders' windows, numbered shard after shard: shard s holds numbers first_window[s] onwards
first_window = np.cumsum([0] + [len(window_starts(shard)) for shard in train_shards])
train_windows = int(first_window[-1])
if order == 'epoch' and max_iters * global_batch > train_windows:
    needed = max_iters * global_batch * block_size
    # 0.1% to spare (a shard's last, partial window is none), rounded up to 3 digits: 21e9 for 10,000 steps
    unit = 10 ** max(int(math.log10(needed)) - 2, 0)
    enough = math.ceil(needed * 1.001 / unit) * unit
    more = (f"`python prepare.py --dataset=slimpajama --tokenizer={data_meta['tokenizer']} "
            f"--max_tokens={enough:_} --out_dir={data_dir}`" if val_domains is not None else "more text")
    raise SystemExit(f"train.py: {max_iters} steps of {global_batch} windows read "
                     f"{max_iters * global_batch:,} windows of {block_size} tokens ({needed:,} tokens), but "
                     f"the training split of {data_dir} holds {train_windows:,}, each read once "
                     f"(data_order={data_order!r}); prepare enough with {more}, or allow repeats with "
                     f"--data_order=epochs")


def seeded(*keys):
    """A seed derived from `seed` and integer keys: batches and dropout depend on the step alone, not on
    RNG state carried across steps, so a resumed run and a run on any number of ranks draw the same ones."""
    return hash((seed, *keys)) & (2 ** 63 - 1)  # int tuples hash identically in every process


@functools.lru_cache(maxsize=2)  # the epoch at hand, and the next one, which a batch may run into
def epoch_order(epoch):
    """A seeded random order of the training split's windows: 9.8M numbers, 78 MB, at 20B tokens."""
    generator = torch.Generator().manual_seed(seeded(-1, epoch))  # no step's seed: steps are never -1
    return torch.randperm(train_windows, generator=generator).numpy()


def global_batch_places(step):
    """(shard, start) of the step's global batch of windows, drawn from a generator seeded by the step
    (data_order 'random'), or the epoch order's next ones: either way the step alone says which, so a resumed
    run continues exactly, and the ranks split the batch as ever."""
    if order != 'random':
        return epoch_places(step)
    generator = torch.Generator().manual_seed(seeded(step))
    which = torch.multinomial(train_room, global_batch, replacement=True, generator=generator)
    starts = (torch.rand(global_batch, generator=generator, dtype=torch.float64) * train_room[which]).long()
    return list(zip(which.tolist(), starts.tolist()))


def epoch_places(step):
    epochs, index = np.divmod(np.arange(step * global_batch, (step + 1) * global_batch), train_windows)
    number = np.array([epoch_order(epoch)[i] for epoch, i in zip(epochs.tolist(), index.tolist())])
    shard = np.searchsorted(first_window, number, side='right') - 1
    return list(zip(shard.tolist(), ((number - first_window[shard]) * block_size).tolist()))


def read_windows(shards, places):
    """Windows of block_size + 1 tokens at places, as one block of rows on the CPU (pinned for a CUDA copy),
    to be copied whole and sliced on the device: a slice's strides would send the copy through pageable
    memory."""
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


def windows(shards, places):
    return on_device(read_windows(shards, places))


def rank_rows(step):
    """This rank's micro-batches of the step's training windows, read: the loop reads the next step's in a
    thread while this one computes, so a slow (network) file system stalls no step."""
    places = global_batch_places(step)
    return [read_windows(train_shards, places[start:stop]) for start, stop in rank_micro_batches]


def validation_set(shards, count, what):
    """(shards, count windows evenly spaced over them): a validation split, scored the same in every run."""
    places = every_window(shards)
    if len(places) < count:
        raise SystemExit(f"train.py: {what} has {len(places)} windows of {block_size} tokens, fewer than the "
                         f"{count} evaluation takes; lower eval_iters or batch_size")
    return shards, [places[round(k * (len(places) - 1) / max(count - 1, 1))] for k in range(count)]


# What evaluation scores, {name: (shards, windows)}: the validation split's eval_iters x batch_size windows;
# or, where the data keeps it by domain (SlimPajama), each domain's (the paper scores them one by one),
# sharing as many equally in whole batches (so training's micro-batches divide them, and micro_batch_size,
# which a resumed run may change, changes no window). There, the last evaluation of a run, and eval_only,
# also score every window of every domain (full_val_sets), as the paper reports (ICLR A.6; the official
# src/training_args.py's max_eval_samples=None); the sample is cheap and the same at every step, so curves
# compare. A single corpus keeps its sample alone: its runs, and the results committed from them, stay as
# they were (Shakespeare's whole split, 3,572 windows, beside the 9,600 the default run trains on).
if val_domains is None:
    val_sets = {'val': validation_set(open_split(data_dir, 'val'), eval_iters * batch_size,
                                      'the validation split')}
else:
    share = -(-eval_iters // len(val_domains)) * batch_size
    val_sets = {name: validation_set(shards, share, f"the validation split of domain {name}")
                for name, shards in val_domains.items()}
full_val_sets = {name: (shards, every_window(shards)) for name, shards in (val_domains or {}).items()}
# This rank's share of them, in pieces the size of its training micro-batch (a last, smaller piece padded to
# it): a compiled model then meets no batch size of evaluation's own, and memory stays what training takes.
piece = rank_micro_batches[0][1] - rank_micro_batches[0][0]


def rank_pieces(sets):
    return [(name, places[i:i + piece]) for name, (_, places) in sets.items()
            for i in range(0, len(places), piece)][ddp_rank::ddp_world_size]


rank_val_pieces, rank_full_val_pieces = rank_pieces(val_sets), rank_pieces(full_val_sets)

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
    optimizer = raw_model.configure_optimizers(  # the setting's name; from here on, the optimizer
        weight_decay, learning_rate, (beta1, beta2), device_type, lr_scales,
        muon=(muon_lr, muon_adjust_lr) if optimizer == 'muon' else None)
except (TypeError, ValueError) as e:  # a name that is no parameter, or not [name, multiplier] pairs
    raise SystemExit(f"train.py: bad lr_scales={lr_scales!r}: {e}") from None
if init_from == 'resume':
    train_support.load_optimizer_state(optimizer, scaler, saved, run.ckpt_path)
    del saved

# everything checked: take out_dir and tidy it, then start the process group (a rank 0 that stops here leaves
# the others waiting for it in init_process_group, which torchrun ends quietly)
if run.writes:
    run.take(overwrite, resumed_step=iter_num if init_from == 'resume' else None)
if ddp:
    init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
signals = train_support.StopSignals(ddp, ddp_rank, device_type)  # Ctrl-C, SIGTERM
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
autocast = (nullcontext() if ptdtype == 'float32'
            else torch.autocast(device_type, dtype=getattr(torch, ptdtype)))
compiled = device_type == 'cuda' if compile is None else compile
model = raw_model
if ddp:
    model = ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                            **train_support.ddp_options(raw_model))
# compiled once, for training and evaluation alike; DDP compiled, not the reverse: DDPOptimizer splits the
# graph at DDP's buckets, to overlap all-reduces (under no_grad, evaluation's forward syncs nothing)
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
    """The mean loss over each validation set's windows (val_sets or full_val_sets), the ranks sharing out
    their pieces: (val_loss, {domain: loss}), val_loss being the unweighted mean over the domains (the
    paper's), or (val_loss, None) for one split. A bar shows when it takes a while."""
    fast_model.eval()
    names = list(sets)
    sums = torch.zeros(len(names), device=device)  # of the windows' mean losses, per set
    for name, places in tqdm(pieces, desc='evaluating', leave=False, delay=5,
                             disable=not master_process, dynamic_ncols=True):
        x, y = windows(sets[name][0], places + places[:1] * (piece - len(places)))
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
    """Say what the run will cost (train_support.estimate_time), timing a training micro-batch and an
    evaluation batch."""
    start, stop = rank_micro_batches[0]
    x, y = windows(train_shards, global_batch_places(iter_num)[start:stop])

    def micro_batch():
        with autocast:
            model(x, y)[1].backward()

    def eval_batch():
        name, places = rank_val_pieces[0]
        with autocast:
            fast_model(*windows(val_sets[name][0], places))

    train_support.estimate_time(micro_batch, eval_batch,
                                (len(rank_micro_batches), len(rank_val_pieces), len(rank_full_val_pieces)),
                                fast_model, optimizer, compiled, device_type == 'cuda',
                                (iter_num, max_iters, eval_interval), tokens_per_iter, say)


def log_step(train_loss, grad_norm, lr, tokens_per_sec, grad_norms):
    """The step's record in log.jsonl, and its line: the training loss (the mean over ranks), the gradient
    norm and rate, the job's tokens/s, and MFU, peak memory, learned λ and per-matrix gradient norms where
    they apply."""
    if ddp:  # the mean over ranks (gloo has no ReduceOp.AVG in older torch, 2.5.1 say)
        torch.distributed.all_reduce(train_loss)
        train_loss /= ddp_world_size
    record = {'step': iter_num, 'train_loss': train_loss.item(), 'grad_norm': grad_norm.item(),
              'lr': lr, 'tokens_per_sec': tokens_per_sec}  # the job's, all ranks together
    if peak:  # of one GPU: what each rank trains on, against its peak; 'mfu_palm' counts the full T x T
        # attention, as PaLM's and nanoGPT's MFU do
        rate = tokens_per_sec / ddp_world_size
        record['mfu'] = raw_model.estimate_mfu(rate, block_size, peak * 1e12)
        record['mfu_palm'] = raw_model.estimate_mfu(rate, block_size, peak * 1e12, causal=False)
    if device_type == 'cuda':  # rank 0's; a host-side counter, so no wait for the GPU
        record['peak_memory_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    if raw_model.config.lambda_mode != 'fixed':
        record['lambdas'] = raw_model.lambdas.tolist()
    if grad_norms is not None:
        record['grad_norms'] = grad_norms
    run.log(record)
    mfu = (f", mfu {100 * record['mfu']:.1f}% (PaLM's count {100 * record['mfu_palm']:.1f}%) of "
           f"{peak:g} TFLOP/s per GPU" if peak else "")
    progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
    say(f"step {iter_num}: loss {record['train_loss']:.4f}, lr {lr:.2e}, {tokens_per_sec:,.0f} tok/s{mfu}")


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
                full_loss, full_domains = evaluate(full_val_sets, rank_full_val_pieces)
                full = {'val_loss_full': full_loss, 'val_loss_full_domains': full_domains,
                        'val_windows_full': sum(len(places) for _, places in full_val_sets.values())}
                said += (f"; all {full['val_windows_full']:,} windows: {full_loss:.4f}"
                         f"{train_support.by_domain(full_domains)}")
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
                # not at the step it started from (step 0's weights are the seed's; a resumed run's, its
                # checkpoint's), unless the run ends there
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
        torch.manual_seed(seeded(iter_num, -1 - ddp_rank))  # dropout noise for this step and rank
        # read while the last step computed (an error in the read is raised here, by result())
        rows = next_rows.result() if next_rows else rank_rows(iter_num)
        next_rows = reader.submit(rank_rows, iter_num + 1) if iter_num + 1 < max_iters else None
        train_loss = torch.zeros((), device=device)
        for micro_step, ((start, stop), batch) in enumerate(zip(rank_micro_batches, rows)):
            x, y = on_device(batch)
            if ddp:  # all-reduce the gradients once a step, in the last micro-step's backward
                ddp_model.require_backward_grad_sync = micro_step == len(rank_micro_batches) - 1
            with autocast:
                # the loss alone: logits kept until the next forward would hold B x T x vocab (6.6 GB at 82M)
                loss = model(x, y)[1]
                # the mean over this rank's share; DDP averages the shares
                loss = loss * ((stop - start) / rank_share)
            train_loss += loss.detach()
            scaler.scale(loss).backward()
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        with signals.deferred():  # a stop signal waits for the update and its log record
            scaler.unscale_(optimizer)
            # per-matrix norms, e.g. layer 1's W_V against W_O (the paper's Sec. 4.3)
            if log_grad_norms and logging_now:
                grad_norms = {name: p.grad.norm().item() for name, p in raw_model.named_parameters()
                              if p.grad is not None}
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(),
                                                       grad_clip if grad_clip > 0 else float('inf'),
                                                       foreach=True)  # one fused kernel per dtype, on CPU too
            nonfinite.observe(iter_num, train_loss, grad_norm, scaler, check=logging_now)
            scaler.step(optimizer)
            scaler.update()
            # zeroed, not freed: under DDP the gradients stay views of its buckets (gradient_as_bucket_view);
            # freed, each step's first backward would allocate a second copy for DDP to copy in at the sync
            optimizer.zero_grad(set_to_none=not ddp)
            iter_num += 1
            if iter_num == first_step + 1 and device_type == 'cuda':
                say(f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2 ** 30:.1f} GiB")
            steps_timed += 1
            progress.update(1)
            if logging_now:
                tokens_per_sec = tokens_per_iter * steps_timed / (time.time() - t_log)
                t_log, steps_timed = time.time(), 0
                log_step(train_loss, grad_norm, lr, tokens_per_sec, grad_norms if log_grad_norms else None)
    if ddp:  # DDP keeps the replicas identical by construction: checked once, cheaply, at the end
        differ = train_support.replicas_differ_by(raw_model)
        say(f"weights across {ddp_world_size} ranks differ by at most {differ:.3g}")
# only after a run that went well (a failed rank just exits, and its peers' collectives fail with it):
# free everything, wait for all ranks, then tear down, or gloo aborts now and then at exit
if ddp:
    del model, ddp_model, fast_model, raw_model, optimizer
    barrier()
    destroy_process_group()
