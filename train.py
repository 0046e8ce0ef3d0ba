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
import inspect
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import support
from configurator import configure
from model import GPT, GPTConfig, load_checkpoint, pick_device, pick_dtype
from prepare import load_meta, open_split, open_val_domains, prepare_command

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
# model: see GPTConfig in model.py for what each flag means
variant = 'resformer_identity'  # 'custom' (the flags below) or a preset: vanilla, svformer, resformer_identity/constant/sparse/learnable(_plus), neutreno(_resformer), denseformer, cla, share_k/v
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
device = 'auto'  # 'auto' picks cuda, then mps, then cpu; or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' = bfloat16 on GPUs that have it, else float16 on CUDA, else float32; or name one
compile = None  # torch.compile: None = on for CUDA, off elsewhere (where it does not pay for itself)
peak_tflops = 0.0  # one accelerator's peak for MFU at this dtype; 0 = the GPU's, PEAK_TFLOPS (no MFU on CPU)
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# -----------------------------------------------------------------------------

# One GPU's dense bf16 tensor-core peak in TFLOP/s, for MFU, by the exact name torch.cuda.get_device_name
# gives: the vendor's datasheet figure, which NVIDIA states with 2:4 sparsity, halved. The exact name matters:
# an H100 PCIe or NVL has 76% or 84% of an SXM's peak, yet all three names contain 'H100'. Not listed: no
# MFU unless --peak_tflops gives it. (Should an H200 NVL ever call itself plain 'NVIDIA H200', pass 835.5.)
PEAK_TFLOPS = {
    'NVIDIA H100 80GB HBM3': 1979 / 2,  # H100 SXM5 (H100 datasheet)
    'NVIDIA H100 PCIe': 1513 / 2,
    'NVIDIA H100 NVL': 1671 / 2,
    'NVIDIA H200': 1979 / 2,  # H200 SXM (H200 datasheet)
    'NVIDIA H200 NVL': 1671 / 2,
    'NVIDIA GH200 480GB': 1979 / 2,  # GH200 datasheet
    'NVIDIA A100-SXM4-40GB': 624 / 2, 'NVIDIA A100-SXM4-80GB': 624 / 2,  # A100 datasheet, every form factor
    'NVIDIA A100-PCIE-40GB': 624 / 2, 'NVIDIA A100 80GB PCIe': 624 / 2,
    'NVIDIA B200': 4500 / 2,  # HGX B200 datasheet, per GPU
    'NVIDIA L4': 242 / 2,  # L4 datasheet
    'NVIDIA A10': 250 / 2,  # A10 datasheet
    'NVIDIA GeForce RTX 4090': 330.4 / 2,  # Ada architecture whitepaper, bf16 with fp32 accumulation
}
RUN_FILES = ('ckpt.pt', 'best.pt', 'log.jsonl')  # what a run writes to out_dir
# The settings a resumed run may change: where it writes and what it reports, the device it runs on and the
# memory it takes (micro_batch_size: the same batches), and where it stops (max_iters, on purpose). Every
# other one shapes the batches, the update or the numbers the run compares (eval_iters: best_val_loss), so it
# must match the checkpoint's; so must the data (its meta.json).
MAY_CHANGE_ON_RESUME = ('out_dir', 'init_from', 'overwrite', 'eval_interval', 'log_interval', 'eval_only',
                        'wandb_log', 'wandb_project', 'wandb_run_name', 'log_grad_norms', 'dataset',
                        'data_dir', 'max_iters', 'device', 'compile', 'peak_tflops', 'micro_batch_size')


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


def seeded(*keys):
    """A seed derived from `seed` and integer keys: batches and dropout depend on the step alone, not on
    RNG state carried across steps, so a resumed run and a run on any number of ranks draw the same ones."""
    return hash((seed, *keys)) & (2 ** 63 - 1)  # int tuples hash identically in every process


def global_batch_places(step):
    """(shard, start) of the step's global batch of windows, drawn from a generator seeded by the step."""
    generator = torch.Generator().manual_seed(seeded(step))
    which = torch.multinomial(train_room, global_batch, replacement=True, generator=generator)
    starts = (torch.rand(global_batch, generator=generator, dtype=torch.float64) * train_room[which]).long()
    return list(zip(which.tolist(), starts.tolist()))


def windows(shards, places):
    """Windows of block_size + 1 tokens at places, as (inputs, next-token targets) on the device. One
    contiguous block is pinned and copied, then sliced there: a slice's strides would send the copy through
    pageable memory."""
    rows = torch.from_numpy(np.stack([shards[s][i:i + block_size + 1].astype(np.int64) for s, i in places]))
    if rows.max() >= data_meta['vocab_size']:  # open_split scans only the (small) validation split
        raise SystemExit(f"train.py: {data_dir} holds token id {rows.max()}, outside the vocabulary of "
                         f"{data_meta['vocab_size']}; run `{prepare_command(data_dir)}` again; "
                         f"stopped, {kept()}")
    rows = rows.pin_memory().to(device, non_blocking=True) if device_type == 'cuda' else rows.to(device)
    return rows[:, :-1], rows[:, 1:]


def validation_windows(shards, count, what):
    """count windows evenly spaced over the shards of a validation split: the same ones in every run."""
    places = [(s, i) for s, shard in enumerate(shards)
              for i in range(0, len(shard) - block_size - 1, block_size)]
    if len(places) < count:
        raise SystemExit(f"train.py: {what} has {len(places)} windows of {block_size} tokens, fewer than the "
                         f"{count} evaluation takes; lower eval_iters or batch_size")
    return [places[round(k * (len(places) - 1) / max(count - 1, 1))] for k in range(count)]


def validation_sets(domains):
    """{name: (shards, windows)} that evaluation scores: each of the domains (SlimPajama's, scored one by one
    as the paper does), sharing eval_iters x batch_size windows equally in whole batches (so that training's
    micro-batches divide them, and micro_batch_size, which a resumed run may change, changes no window); or,
    domains being None, the one validation split."""
    if domains is None:
        shards = open_split(data_dir, 'val')
        return {'val': (shards, validation_windows(shards, eval_iters * batch_size, 'the validation split'))}
    count = -(-eval_iters // len(domains)) * batch_size
    return {domain: (shards, validation_windows(shards, count, f"the validation split of domain {domain}"))
            for domain, shards in domains.items()}


def evaluation_pieces():
    """This rank's share of the validation windows as (set, windows) pieces the size of its training
    micro-batch, so that a compiled model meets no batch size of evaluation's own, and memory stays what
    training takes."""
    size = rank_micro_batches[0][1] - rank_micro_batches[0][0]
    pieces = [(name, places[i:i + size]) for name, (_, places) in val_sets.items()
              for i in range(0, len(places), size)]
    return pieces[ddp_rank::ddp_world_size]


def get_lr(it):
    """Linear warmup to learning_rate, then cosine decay to min_lr at lr_decay_iters
    (the paper's schedule)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


@torch.no_grad()
def evaluate():
    """The mean loss over each validation set's fixed windows, the ranks sharing them out: (val_loss,
    {domain: loss}), val_loss being the unweighted mean over the domains (the paper's), or (val_loss, None)
    for one split. A bar shows when it takes a while."""
    fast_model.eval()
    names = list(val_sets)
    sums = torch.zeros(len(names), device=device)  # of the windows' mean losses, per set
    pieces = tqdm(rank_val_pieces, desc='evaluating', leave=False, delay=5, disable=not master_process,
                  dynamic_ncols=True)
    for name, places in pieces:
        x, y = windows(val_sets[name][0], places)
        with autocast:
            loss = fast_model(x, y)[1]
        sums[names.index(name)] += loss.float() * len(places)
    if ddp:
        torch.distributed.all_reduce(sums)
    fast_model.train()
    losses = {name: total / len(val_sets[name][1]) for name, total in zip(names, sums.tolist())}
    return sum(losses.values()) / len(losses), (None if val_domains is None else losses)


def stop_if_not_finite(last_step):
    """Stop, saving nothing, if the training loss or gradient norm was NaN or inf at a step since the last
    check, up to last_step. Every rank calls it at the same steps."""
    global checked_step
    flag = not_finite.int()
    if ddp:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    if flag.item():
        steps = (f"step {last_step}" if checked_step == last_step
                 else f"one of steps {checked_step}-{last_step}")
        raise SystemExit(f"train.py: the training loss or gradient norm became NaN or inf at {steps} "
                         f"(loss {train_loss.item():.4g}, gradient norm {grad_norm.item():.4g}); "
                         f"stopped without saving, {kept()}")
    checked_step = last_step + 1


def kept():
    return (f"{ckpt_path} (step {saved_step}) is the last good checkpoint" if saved_step is not None
            else "no checkpoint written")


def save_checkpoint(best):
    """Write ckpt.pt, and best.pt too when best, from one serialization: each atomically (a crash mid-write
    leaves the previous file intact), best.pt first (a kill between the two repeats that evaluation on
    resume), and best.pt as a second name of the same file where the filesystem has hard links, else a
    copy."""
    global saved_step
    checkpoint = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                  'scaler': scaler.state_dict(), 'model_args': asdict(raw_model.config), 'iter_num': iter_num,
                  'best_val_loss': best_val_loss, 'last_eval': last_eval, 'config': config,
                  'data_meta': data_meta}
    try:
        written = ckpt_path + '.tmp'
        if os.path.lexists(written):  # a killed save's, perhaps linked to best.pt: never write through it
            os.remove(written)
        torch.save(checkpoint, written)
        if best:
            link_or_copy(written, best_path + '.tmp')
            os.replace(best_path + '.tmp', best_path)
        os.replace(written, ckpt_path)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        cannot_write(ckpt_path, e)
    saved_step = iter_num


def link_or_copy(source, target):
    if os.path.lexists(target):
        os.remove(target)
    try:
        os.link(source, target)
    except OSError:  # no hard links here (some network and FUSE filesystems)
        shutil.copyfile(source, target)


def wait_for_rank_0():
    """Under torchrun, hold every rank until rank 0 has written its checkpoint, then let them go together: no
    rank exits while rank 0 still writes (torchrun kills the others 30 s after one exits), and none waits in
    an NCCL collective meanwhile (its watchdog ends a wait of 10 minutes). A 1.6B checkpoint is about 20 GB.
    The wait is on the gloo group, on the CPU; gloo's timeout, 30 minutes, bounds it."""
    if ddp:
        barrier(group=cpu_group)


def cannot_write(path, error):
    raise SystemExit(f"train.py: cannot write {path} ({type(error).__name__}: {error}); free disk space "
                     f"or fix out_dir, {kept()}") from None


def lock_out_dir():
    """Hold out_dir/.lock while this process lives, so a second run into out_dir is refused; one that dies,
    even by SIGKILL, lets go (support.hold)."""
    return support.hold(os.path.join(out_dir, '.lock'), 'train.py',
                        lambda holder: f"another run ({holder}) is writing to {out_dir}; wait for it to end, "
                                       f"or pick another --out_dir")


def remove_half_written_files():
    """Remove the .tmp files of writes a kill cut short (only ours: never a user's notes.tmp), saying so for a
    checkpoint's: a save killed mid-way, perhaps a stop-save that outlasted the scheduler's grace time."""
    for name in RUN_FILES:
        path = os.path.join(out_dir, name + '.tmp')
        if os.path.isfile(path):
            if name.endswith('.pt'):
                print(f"train.py: removed {path}, a checkpoint write cut short by a kill (docs/training.md, "
                      f"'Preemption', says how to give a stopped job time to save)", file=sys.stderr)
            os.remove(path)


def log_metrics(record):
    if master_process:
        try:  # a record cut short by a full disk is skipped on resume, like one cut by a kill
            with open(log_path, 'a') as f:
                f.write(json.dumps(record) + '\n')
        except OSError as e:
            cannot_write(log_path, e)
        if wandb_log:
            wandb.log(record, step=record['step'])


def on_stop_signal(signum, _frame):
    """Ctrl-C (SIGINT) or a scheduler's SIGTERM: stop at a step boundary and save. One process stops at once,
    or at the end of an uninterruptible block; ranks stop together at the next step_boundary."""
    global stop_signal
    stop_signal = signum
    if not (holding or ddp):
        raise KeyboardInterrupt


@contextmanager
def uninterruptible():
    """Hold back a stop signal until the block ends, so the weights, log and checkpoints always agree."""
    global holding
    holding = True
    try:
        yield
    finally:
        holding = False
    if stop_signal and not ddp:
        raise KeyboardInterrupt


def step_boundary():
    """Under torchrun, stop every rank at this step if any rank got a stop signal (SIGTERM may reach one rank
    first): a MAX all-reduce of the signal number. It goes over a gloo group, on the CPU, so on a GPU it never
    waits for queued kernels, only for the other ranks' CPUs: ~0.1 ms a step, against seconds of grace."""
    global stop_signal
    if ddp:
        flag = torch.tensor(stop_signal)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=cpu_group)
        # (never reset stop_signal to 0 here: a signal may have arrived during the all-reduce)
        if flag.item():
            stop_signal = flag.item()
            raise KeyboardInterrupt


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


def save_at_stop():
    """After a stop signal: rank 0 saves ckpt.pt at this step, every rank waits for it, and all exit together
    with the shell's code for death by that signal (130 for Ctrl-C). The weights are those of step iter_num
    (updates are uninterruptible), and every rank's are the same."""
    if master_process and not eval_only:
        if not_finite.item():
            outcome = f"the loss had become NaN or inf, so nothing saved; {kept()}"
        else:
            save_checkpoint(best=False)
            outcome = f"saved {ckpt_path}; continue with --init_from=resume and the same settings"
        how = ('interrupted' if stop_signal == signal.SIGINT
               else 'stopped by ' + signal.Signals(stop_signal).name)
        print(f"train.py: {how} at step {iter_num}; {outcome}", file=sys.stderr)
    wait_for_rank_0()
    raise SystemExit(128 + stop_signal) from None


def end_rank(error):
    """Re-raise error, under torchrun as a one-line stop_rank: a SystemExit's message, or, for gloo's error in
    a collective whose peer has exited, a line saying so (that peer says why). Other errors keep their
    traceback."""
    if ddp and isinstance(error, SystemExit) and isinstance(error.code, str):
        stop_rank(error.code)
    if ddp and isinstance(error, RuntimeError) and ' by peer' in str(error):
        stop_rank(f"train.py: rank {ddp_rank} stopped because another rank failed", after_a_peer=True)
    raise error


def by_domain(losses):
    """' (domain loss, ...)' to follow a printed val loss, or nothing for one validation split."""
    return '' if losses is None else f" ({', '.join(f'{name} {loss:.4f}' for name, loss in losses.items())})"


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


def seconds_of(work):
    """Seconds one call of work() takes, waiting for the device; when compiled, the second call's (the first
    one compiles)."""
    for _ in range(1 + compiled):
        start = time.time()
        work()
        if device_type == 'cuda':
            torch.cuda.synchronize()
    return time.time() - start


def estimate_time():
    """Say what the run costs before any long work: time one training micro-batch (its gradients then dropped,
    so the run is unchanged: no update, and every step seeds its own randomness) and one evaluation batch."""
    start, stop = rank_micro_batches[0]
    x, y = windows(train_shards, global_batch_places(iter_num)[start:stop])

    def micro_batch():
        with autocast:
            model(x, y)[1].backward()

    @torch.no_grad()
    def eval_batch():
        name, places = rank_val_pieces[0]
        with autocast:
            fast_model(*windows(val_sets[name][0], places))

    began = time.time()
    step = seconds_of(micro_batch) * len(rank_micro_batches)
    optimizer.zero_grad(set_to_none=True)
    fast_model.eval()
    evaluation = seconds_of(eval_batch) * len(rank_val_pieces) if rank_val_pieces else 0.0
    fast_model.train()
    compiling = f"; compiling took {duration(time.time() - began - step - evaluation)}" if compiled else ""
    first_eval = -(-iter_num // eval_interval) * eval_interval
    evaluations = len(set(range(first_eval, max_iters + 1, eval_interval)) | {max_iters})
    steps = max_iters - iter_num
    if master_process:  # every rank times its share, rank 0 says it
        progress.write(f"about {duration(step)} a step ({tokens_per_iter / step:,.0f} tokens/s): "
                       f"{duration(step * steps)} for the {steps} steps to go, "
                       f"plus {duration(evaluation * evaluations)} for {evaluations} evaluations{compiling}")


def as_lists(value):
    """value with every tuple in it a list: a λ table or lr_scales is the same setting whether a config file
    wrote it with tuples or the command line with lists."""
    return [as_lists(item) for item in value] if isinstance(value, (list, tuple)) else value


def duration(seconds):
    return (f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min" if seconds >= 90
            else f"{seconds:.3g} s")


def needs_gpu(model_config):
    """Why this run must not fall back to the CPU when device='auto' finds no GPU (a CUDA wheel the driver is
    too old for looks just like that), or None: training it would take over a day at 1 TFLOP/s, a fast CPU's
    pace. Every CPU config here takes 1e13-1e14 FLOPs, every GPU one 1e18 or more."""
    with torch.device('meta'):
        flops = GPT(model_config).flops_per_token(block_size) * tokens_per_iter * max_iters
    days = flops / 1e12 / 86400
    return f"training this run takes {flops:.1e} FLOPs, {days:,.0f} days at 1 TFLOP/s" if days > 1 else None


# -----------------------------------------------------------------------------
# the type of each setting whose default is None, which configure cannot read off the default
none_default_types = {'n_kv_head': int, 'ffn_hidden': int, 'lambdas': list, 'compile': bool,
                      'micro_batch_size': int}
globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], types=none_default_types,
                           script=__file__, verbose=os.environ.get('RANK', '0') == '0'))
config = {k: globals()[k] for k in config_keys}  # what this run used, for the log and the checkpoint

# Check every setting before anything touches out_dir: a run that cannot start changes nothing on disk.
FLOAT32_MAX = torch.finfo(torch.float32).max
for ok, problem in [
    (init_from in ('scratch', 'resume'), f"init_from={init_from!r}; use 'scratch' or 'resume'"),
    (not (overwrite and init_from == 'resume'),
     "overwrite=True starts over and init_from='resume' continues; pick one"),
    (batch_size >= 1, f"batch_size={batch_size}; use 1 or more sequences"),
    (micro_batch_size is None or micro_batch_size >= 1,
     f"micro_batch_size={micro_batch_size}; use 1 or more sequences"),
    (block_size >= 1, f"block_size={block_size}; use 1 or more tokens"),
    (gradient_accumulation_steps >= 1,
     f"gradient_accumulation_steps={gradient_accumulation_steps}; use 1 or more"),
    (max_iters >= 0, f"max_iters={max_iters}; use 0 (evaluate only) or more steps"),
    (eval_interval >= 1, f"eval_interval={eval_interval}; use 1 or more steps"),
    (log_interval >= 1, f"log_interval={log_interval}; use 1 or more steps"),
    (eval_iters >= 1, f"eval_iters={eval_iters}; use 1 or more validation batches"),
    (0 <= beta1 < 1 and 0 <= beta2 < 1, f"beta1={beta1}, beta2={beta2}; use values in [0, 1)"),
    # AdamW's first step moves each weight by up to learning_rate/(1-beta1) (its bias correction): beyond
    # float32's range that is inf and the model is lost at once; smaller rates that are still too high
    # stop on a NaN loss.
    (0 < learning_rate < FLOAT32_MAX * (1 - beta1),
     f"learning_rate={learning_rate}; use a rate above 0 with learning_rate/(1-beta1) below float32's "
     f"{FLOAT32_MAX:.3g}"),
    (0 <= min_lr <= learning_rate, f"min_lr={min_lr}; use a value from 0 to learning_rate={learning_rate}"),
    (0 <= warmup_iters <= lr_decay_iters, f"warmup_iters={warmup_iters}, lr_decay_iters={lr_decay_iters}; "
                                          f"use 0 <= warmup_iters <= lr_decay_iters"),
    (weight_decay >= 0 and grad_clip >= 0,
     f"weight_decay={weight_decay}, grad_clip={grad_clip}; use 0 or more"),
    (peak_tflops >= 0, f"peak_tflops={peak_tflops}; use 0 (look it up) or the accelerator's peak"),
    (0 <= seed < 2 ** 64, f"seed={seed}; use an integer from 0 to 2**64 - 1"),  # what torch.manual_seed takes
]:
    if not ok:
        raise SystemExit(f"train.py: {problem}")
if wandb_log:
    try:
        import wandb
    except ImportError:
        raise SystemExit("train.py: wandb_log=True needs wandb; pip install wandb, "
                         "or drop --wandb_log") from None

data_dir = os.path.join('data', dataset)
config['data_dir'] = data_dir
data_meta = load_meta(data_dir)
model_args = {f.name: globals()[f.name] for f in fields(GPTConfig) if f.name in globals()}
# padded to a multiple of 64 for faster matmuls
model_args['vocab_size'] = -(-data_meta['vocab_size'] // 64) * 64
try:
    model_config = GPTConfig(**model_args)
except (TypeError, ValueError) as e:
    raise SystemExit(f"train.py: bad model settings: {e}")
global_batch = gradient_accumulation_steps * batch_size
tokens_per_iter = global_batch * block_size

# torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the process group starts once everything else
# has been checked
ddp = 'RANK' in os.environ
ddp_rank, ddp_local_rank, ddp_world_size = (
    (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1))
master_process = ddp_rank == 0
device = pick_device(device, None if eval_only else needs_gpu(model_config))
if ddp and device.startswith('cuda'):
    device = f'cuda:{ddp_local_rank}'
device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
ptdtype = pick_dtype(dtype, device_type)
rank_micro_batches = micro_batches(global_batch, ddp_world_size, ddp_rank, micro_batch_size or batch_size)
rank_share = rank_micro_batches[-1][1] - rank_micro_batches[0][0]

ckpt_path, best_path, log_path = (os.path.join(out_dir, name) for name in RUN_FILES)
if not eval_only:  # the only run that writes nothing
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise SystemExit(f"train.py: out_dir={out_dir} is a file, not a folder; pick another --out_dir")
    existing = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if existing and init_from == 'scratch' and not overwrite:
        raise SystemExit(f"train.py: {out_dir} already holds a run ({', '.join(existing)}); continue it with "
                         f"--init_from=resume, or start over with --overwrite=True (deletes it), "
                         f"or pick another --out_dir")
    writable = out_dir
    while not os.path.exists(writable):  # the folder that will hold out_dir once it is made
        writable = os.path.dirname(os.path.abspath(writable))
    try:
        tempfile.TemporaryFile(dir=writable).close()
    except OSError as e:
        raise SystemExit(f"train.py: cannot write to {writable} ({e.strerror}); "
                         f"pick another --out_dir") from None

train_shards = open_split(data_dir, 'train')
if any(len(shard) <= block_size + 1 for shard in train_shards):
    raise SystemExit(f"train.py: a training shard in {data_dir} is shorter than block_size={block_size}; "
                     f"lower block_size")
train_room = torch.tensor([len(shard) - block_size - 1 for shard in train_shards],
                          dtype=torch.float64)  # window starts
val_domains = open_val_domains(data_dir)  # None: one validation split
val_sets = validation_sets(val_domains)
rank_val_pieces = evaluation_pieces()

# model: from scratch, or the architecture, weights and optimizer state of out_dir/ckpt.pt
iter_num, best_val_loss, saved_step, checkpoint, last_eval = 0, float('inf'), None, None, None
if init_from == 'resume':
    raw_model, checkpoint = load_checkpoint(ckpt_path)
    missing = [key for key in ('optimizer', 'scaler', 'iter_num', 'best_val_loss', 'config')
               if key not in checkpoint]
    if missing:
        raise SystemExit(f"train.py: {ckpt_path} has no {', '.join(missing)}, so it cannot be resumed "
                         f"exactly; start over with --overwrite=True")
    saved_meta, saved_config = checkpoint['data_meta'], checkpoint['config']
    if saved_meta != data_meta and not eval_only:  # eval_only, which writes nothing, may score it any way
        differ = sorted(key for key in saved_meta.keys() | data_meta.keys()
                        if saved_meta.get(key) != data_meta.get(key))
        raise SystemExit(f"train.py: {data_dir} is not the data {ckpt_path} was trained on (meta.json "
                         f"differs in {', '.join(differ)}); resume with --dataset={saved_config['dataset']} "
                         f"as it was prepared, or start over with --overwrite=True")
    if raw_model.config != model_config:
        changed = [f.name for f in fields(GPTConfig)
                   if getattr(raw_model.config, f.name) != getattr(model_config, f.name)]
        raise SystemExit(f"train.py: the settings give a different model than {ckpt_path} "
                         f"({', '.join(changed)}); resume with the settings it was trained with")
    # a setting added to train.py since the checkpoint was written counts as unchanged
    changed = [f"{key}={saved_config[key]!r} (now {config[key]!r})" for key in config if key not in
               MAY_CHANGE_ON_RESUME and as_lists(saved_config.get(key, config[key])) != as_lists(config[key])]
    if changed and not eval_only:
        raise SystemExit(f"train.py: {ckpt_path} was trained with other settings: {', '.join(changed)}; "
                         f"resume with the settings it was trained with, or start over with --overwrite=True")
    iter_num = saved_step = checkpoint['iter_num']
    best_val_loss, last_eval = checkpoint['best_val_loss'], checkpoint.get('last_eval')
try:
    if checkpoint is None:
        torch.manual_seed(seed)
        raw_model = GPT(model_config)
    raw_model.to(device)
except RuntimeError as e:  # the allocator's "can't allocate memory", on the CPU or a GPU
    raise SystemExit(f"train.py: the model does not fit in {device} memory ({str(e).splitlines()[0]}); use a "
                     f"smaller model (n_layer, n_embd, ...) or a device with more memory") from None
scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == 'float16')
try:
    optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type,
                                               lr_scales)
except (TypeError, ValueError) as e:  # a name that is no parameter, or not [name, multiplier] pairs
    raise SystemExit(f"train.py: bad lr_scales={lr_scales!r}: {e}") from None
if checkpoint is not None:
    try:
        optimizer.load_state_dict(checkpoint['optimizer'])
        scaler.load_state_dict(checkpoint['scaler'])
    except (ValueError, KeyError, RuntimeError) as e:
        raise SystemExit(f"train.py: the optimizer state in {ckpt_path} does not fit the model ({e}); "
                         f"start over with --overwrite=True") from None
    del checkpoint
# on resume, what the log says up to the checkpoint: its evaluation is repeated, so not its val record
kept_log = None
if init_from == 'resume' and os.path.exists(log_path):
    kept_log = []
    with open(log_path) as f:
        for line in f:
            try:
                record = json.loads(line)
                if record['step'] < iter_num or (record['step'] == iter_num and 'val_loss' not in record):
                    kept_log.append(line)
            except (ValueError, TypeError, KeyError):  # a line cut by a kill or a full disk, or not a record
                continue

# everything checked: make out_dir, take it and tidy it, then start the process group (a rank 0 that stops
# here leaves the others waiting for it in init_process_group, which torchrun ends quietly)
if master_process and not eval_only:
    try:
        os.makedirs(out_dir, exist_ok=True)
        out_dir_lock = lock_out_dir()
        remove_half_written_files()
        if overwrite:
            for name in RUN_FILES:
                if os.path.exists(os.path.join(out_dir, name)):
                    os.remove(os.path.join(out_dir, name))
        if kept_log is not None:
            with open(log_path + '.tmp', 'w') as f:
                f.writelines(kept_log)
            os.replace(log_path + '.tmp', log_path)
    except OSError as e:
        raise SystemExit(f"train.py: cannot write to {out_dir} ({e}); pick another --out_dir") from None
if ddp:
    init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    # for the stop flag and the waits for rank 0's saves: on a CPU the default group, else a gloo one by NCCL
    cpu_group = torch.distributed.new_group(backend='gloo') if device_type == 'cuda' else None
    if device_type == 'cuda':
        torch.cuda.set_device(device)
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
autocast = (nullcontext() if ptdtype == 'float32'
            else torch.autocast(device_type, dtype=getattr(torch, ptdtype)))
compiled = device_type == 'cuda' if compile is None else compile
fast_model = torch.compile(raw_model) if compiled else raw_model  # evaluation's, and one process's training
model = fast_model  # what the training step calls
# compile DDP, not the reverse: DDPOptimizer splits the graph at DDP's buckets, to overlap all-reduces
if ddp:
    ddp_model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None,
                    **buffer_sync_off(inspect.signature(DDP).parameters), **gradient_buckets(raw_model))
    model = torch.compile(ddp_model) if compiled else ddp_model
if master_process:
    print(f"{ddp_world_size} rank(s) on {device} ({ptdtype}); {tokens_per_iter:,} tokens per step = "
          f"{global_batch} sequences x {block_size} tokens, {rank_share} per rank in micro-batches of up to "
          f"{micro_batch_size or batch_size}; "
          f"{tokens_per_iter * max(max_iters - iter_num, 0):,} tokens to go")
    print(f"{raw_model.config.variant} model: {raw_model.num_params() / 1e6:.2f}M parameters; λ per layer "
          f"{[tuple(round(v, 3) for v in row) for row in raw_model.lambdas.tolist()]}")
gpu_name = torch.cuda.get_device_name(device) if device_type == 'cuda' else None
peak = peak_tflops or PEAK_TFLOPS.get(gpu_name, 0.0)
if master_process and gpu_name:
    print(f"MFU per GPU, of {peak:g} TFLOP/s ({'peak_tflops' if peak_tflops else 'PEAK_TFLOPS'}: {gpu_name})"
          if peak else f"no MFU: {gpu_name} is not in PEAK_TFLOPS; give one GPU's dense bf16 TFLOP/s with "
                       f"--peak_tflops")
if wandb_log and master_process:
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)

# -----------------------------------------------------------------------------
# Reading a value off an accelerator waits for it, so there the loss is read and checked for NaN/inf only at
# log and evaluation steps (and before any save); on a CPU the read is free, so every step is checked before
# the update.
check_every_step = device_type == 'cpu'
# set at any step whose loss or gradient norm is NaN/inf
not_finite = torch.zeros((), dtype=torch.bool, device=device)
train_loss = grad_norm = torch.zeros((), device=device)
# the first step whose loss is not yet known to be finite; where this run began
checked_step = first_step = iter_num
progress = tqdm(total=max_iters, initial=iter_num, disable=not master_process, dynamic_ncols=True,
                mininterval=1.0)
stop_signal, holding = 0, False  # the signal that asked the run to stop; whether it waits for a block to end
previous_handlers = {sig: signal.signal(sig, on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
try:
    if not eval_only and iter_num < max_iters:
        estimate_time()  # before the step-0 evaluation, and every rank (a backward all-reduces under DDP)
        progress.unpause()  # the bar's clock skips it
    t_log, steps_timed = time.time(), 0
    while True:
        step_boundary()
        if eval_only:
            val_loss, domain_losses = evaluate()
            if master_process:
                progress.write(f"step {iter_num}: val loss {val_loss:.4f}{by_domain(domain_losses)}")
            break
        if iter_num % eval_interval == 0 or iter_num == max_iters:
            val_loss, domain_losses = evaluate()
            stop_if_not_finite(iter_num - 1)
            if not math.isfinite(val_loss):
                raise SystemExit(f"train.py: validation loss {val_loss} at step {iter_num}; "
                                 f"stopped without saving, {kept()}")
            with uninterruptible():
                best = val_loss < best_val_loss
                best_val_loss = min(best_val_loss, val_loss)
                last_eval = {'step': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss}
                if domain_losses:
                    last_eval['val_loss_domains'] = domain_losses
                log_metrics(last_eval)
                if master_process:
                    save_checkpoint(best)
                wait_for_rank_0()
            if master_process:
                progress.write(f"step {iter_num}: val loss {val_loss:.4f} (best {best_val_loss:.4f})"
                               f"{by_domain(domain_losses)}")
            t_log, steps_timed = time.time(), 0  # throughput counts training steps only
        if iter_num >= max_iters:
            break

        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group['lr'] = lr * group['lr_scale']
        torch.manual_seed(seeded(iter_num, -1 - ddp_rank))  # dropout noise for this step and rank
        places = global_batch_places(iter_num)
        train_loss = torch.zeros((), device=device)
        for micro_step, (start, stop) in enumerate(rank_micro_batches):
            x, y = windows(train_shards, places[start:stop])
            if ddp:
                # once a step
                ddp_model.require_backward_grad_sync = micro_step == len(rank_micro_batches) - 1
            with autocast:
                # the loss alone: logits kept until the next forward would hold B x T x vocab (6.6 GB at 82M)
                loss = model(x, y)[1]
                # the mean over this rank's share; DDP averages the shares
                loss = loss * ((stop - start) / rank_share)
            train_loss += loss.detach()
            scaler.scale(loss).backward()
        logging_now = (iter_num + 1) % log_interval == 0 or iter_num + 1 == max_iters
        with uninterruptible():  # a stop signal waits for the update and its log record
            scaler.unscale_(optimizer)
            # per-matrix norms, e.g. layer 1's W_V against W_O (the paper's Sec. 4.3)
            if log_grad_norms and logging_now:
                grad_norms = {name: p.grad.norm().item() for name, p in raw_model.named_parameters()
                              if p.grad is not None}
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(),
                                                       grad_clip if grad_clip > 0 else float('inf'),
                                                       foreach=True)  # one fused kernel per dtype, on CPU too
            not_finite |= ~torch.isfinite(train_loss)
            # fp16's GradScaler makes inf gradients now and then, and skips those steps
            if not scaler.is_enabled():
                not_finite |= ~torch.isfinite(grad_norm)
            if check_every_step or logging_now:
                stop_if_not_finite(iter_num)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num == first_step + 1 and device_type == 'cuda' and master_process:
                progress.write(f"peak GPU memory: "
                               f"{torch.cuda.max_memory_allocated(device) / 2 ** 30:.1f} GiB")
            steps_timed += 1
            progress.update(1)
            if logging_now:
                if ddp:  # the mean over ranks (gloo has no ReduceOp.AVG in older torch, 2.5.1 say)
                    torch.distributed.all_reduce(train_loss)
                    train_loss /= ddp_world_size
                tokens_per_sec = tokens_per_iter * steps_timed / (time.time() - t_log)
                t_log, steps_timed = time.time(), 0
                record = {'step': iter_num, 'train_loss': train_loss.item(), 'grad_norm': grad_norm.item(),
                          'lr': lr, 'tokens_per_sec': tokens_per_sec}  # the job's, all ranks together
                if peak:  # of one GPU: what each rank trains on, against its peak
                    record['mfu'] = raw_model.estimate_mfu(tokens_per_sec / ddp_world_size, block_size,
                                                           peak * 1e12)
                if device_type == 'cuda':  # rank 0's; a host-side counter, so no wait for the GPU
                    record['peak_memory_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
                if raw_model.config.lambda_mode != 'fixed':
                    record['lambdas'] = raw_model.lambdas.tolist()
                if log_grad_norms:
                    record['grad_norms'] = grad_norms
                log_metrics(record)
                if master_process:
                    mfu = f", mfu {100 * record['mfu']:.1f}% of {peak:g} TFLOP/s per GPU" if peak else ""
                    progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
                    progress.write(f"step {iter_num}: loss {record['train_loss']:.4f}, lr {lr:.2e}, "
                                   f"{tokens_per_sec:,.0f} tok/s{mfu}")
    if ddp:  # DDP keeps the replicas identical by construction; check it once, cheaply, at the end
        weights = torch.cat([p.detach().reshape(-1).float() for p in raw_model.parameters()])
        highest, lowest = weights.clone(), weights.clone()
        torch.distributed.all_reduce(highest, op=torch.distributed.ReduceOp.MAX)
        torch.distributed.all_reduce(lowest, op=torch.distributed.ReduceOp.MIN)
        if master_process:
            progress.write(f"weights across {ddp_world_size} ranks differ by at most "
                           f"{(highest - lowest).max().item():.3g}")
except (SystemExit, RuntimeError) as error:
    end_rank(error)
except KeyboardInterrupt:
    holding = True  # a second Ctrl-C (or torchrun's SIGTERM to the ranks left) waits for the checkpoint
    progress.close()
    try:
        save_at_stop()
    except (SystemExit, RuntimeError) as error:
        end_rank(error)
finally:
    progress.close()
    for sig, handler in previous_handlers.items():
        signal.signal(sig, handler)
# only after a run that went well (a failed rank just exits, and its peers' collectives fail with it):
# free everything, wait for all ranks, then tear down, or gloo aborts now and then at exit
if ddp:
    del model, ddp_model, fast_model, raw_model, optimizer
    barrier()
    destroy_process_group()
