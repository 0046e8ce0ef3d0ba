"""
What each variant costs, measured here: training step time against vanilla, model FLOP/s against this
machine's own matmul peak (and against nanoGPT's and the official code's models at the same shape), decoding
speed with the KV cache against full recompute, KV cache bytes, and peak memory. Every contender lives in this
one process and they take turns, round by round, so noise from the machine hits them all alike.

    python lab/bench.py                              # train.py's default shape (the README's main job), CPU or CUDA
    python lab/bench.py --shape=82m                  # the paper's 82M model
    python lab/bench.py --nanogpt=../refs/nanoGPT/model.py --official=../refs/official   # add the reference rows
    python lab/bench.py --compile=True --dtype=bfloat16
    python lab/bench.py --smoke                      # seconds: tiny counts that check every section runs
    python lab/bench.py --logits_cost --shape=82m --device=cpu --rounds=5   # the training forward's logits' cost
    python lab/bench.py --node_check --nproc=8       # a fresh 8-GPU node, before a long job (docs/training.md)
    python lab/bench.py --link_check --rdzv_endpoint=node0:29500   # on each of 2 nodes: the links between them
    python lab/bench.py --estimate_check --device=cpu    # train.py's time to go against its real steps
    python lab/bench.py --save_cost                  # what a checkpoint save costs at each config's size

Prints markdown tables (the settings overridden and the progress go to stderr) and writes them, with every
per-round timing, as JSON to `out`. The reference models are local copies that this repository does not ship:
nanoGPT's model.py (github.com/karpathy/nanoGPT) and the official
modeling_llama_{baseline,resformer,svformer}.py (github.com/Zcchill/Value-Residual-Learning, src/modeling;
they need transformers==4.44.2). Rows whose files or packages are missing are skipped with a note.
"""
import ast
import functools
import glob
import importlib.util
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from configurator import _read_config_file, configure
from ablations import BASELINES, CONNECTIONS, SUCCESSORS, AblationConfig, build_model
from model import GPT, VARIANTS, GPTConfig
from vrl import cli, hardware, metrics, optim
from vrl.settings import model_config

PRESETS = VARIANTS | BASELINES  # every named variant: the paper's (model.py) and the baselines (ablations.py)
# presets='successors': the value residual's successors (ablations.py) beside Identity ResFormer
NAMED = {'all': list(PRESETS), 'successors': ['vanilla', 'resformer_identity', *SUCCESSORS, *CONNECTIONS]}

# -----------------------------------------------------------------------------
shape = 'small'  # 'small' (train.py's defaults, the README's main job), '82m' or '468m': see SHAPES
batch_size = 0  # sequences per training step; 0 = the shape's default for this device
block_size = 0  # tokens per sequence; 0 = the shape's default for this device
presets = 'all'  # comma-separated names from model.VARIANTS, ablations.BASELINES, SUCCESSORS and
#   CONNECTIONS; or 'all' (the paper's and its baselines) or 'successors'; vanilla is always included
rounds = 10  # each round times every contender once, in a rotated order
steps = 4  # timed training steps per contender and round
warmup = 3  # untimed steps per contender before the first round (allocator, optimizer state, compile)
decode_tokens = (256, 1024)  # new tokens per decoding run (batch 1, greedy, from a 16-token prompt);
#   () = skip
decode_rounds = 3  # rounds of every (variant, length, cached/recompute) decode; the table gives medians
loop_rounds = 2  # train.py runs per length for the training-loop throughput (0 = skip)
loop_iters = (100, 200)  # train.py runs this long; the difference in wall time is the cost of the extra steps
memory = True  # peak memory per preset, each in a fresh process
nanogpt = ''  # path to a copy of nanoGPT's model.py ('' = skip its row)
official = ''  # folder with the official modeling_llama_{baseline,resformer,svformer}.py ('' = skip)
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name)
dtype = 'auto'  # as in train.py: bfloat16 on GPUs that have it, else float32
compile = False  # torch.compile every training model (ours and the references)
seed = 1337  # model weights, batches and prompts, alike for every contender
out = 'bench.json'  # the report as JSON, with every per-round timing
smoke = False  # 1 round of tiny counts, no train.py loop: checks that every section runs, in seconds
logits_cost = False  # instead of the benchmark: a compiled step returning the logits vs the loss alone
# --node_check: instead of the benchmark, check a fresh GPU node before a long job (docs/training.md)
node_check = False  # run node_config under torchrun on synthetic tokens: speed, MFU, memory, exact resume
node_config = 'config/resformer_82m.py'  # the config whose model, batch and dtype the node check trains
nproc = 0  # ranks torchrun starts, one per GPU; 0 = every GPU here
node_iters = 10  # steps of the straight run; a second run stops halfway, resumes, and must end the same
train_args = ''  # more train.py arguments, after the check's common ones, e.g. '--batch_size=16'
fit_config = 'config/resformer_1b6.py'  # the largest config the node is meant for, tried for a few steps
#   at its own batch_size (CUDA only); '' = skip
run_timeout = 1800  # seconds a run may take, start-up and compiling included; past it the check kills the
#   run, ranks and all, and fails (a hung NCCL collective waits for ever)
min_mfu = None  # fail below this MFU per GPU (ours: 0.15 = 15%); None = MFU_FLOORS's for this GPU, 0 = none
min_tokens_per_sec = 0.0  # fail below this many tokens/s per rank; 0 = none. Any device, a CPU too, which
#   has no MFU
max_memory_ratio = 1.25  # fail if a rank's peak memory is above this times the estimate (unrounded, with
#   what it leaves out: unestimated_gb); above 1.0 it is marked ABOVE, a warning
min_gpu_speed = 0.8  # fail a GPU whose bf16 matmul is below this times the node's median (GPU only)
min_matmul_fraction = 0.4  # fail if the node's median matmul is below this share of the GPU's datasheet
#   dense bf16 peak (metrics.PEAK_TFLOPS; GPU only)
min_allreduce_gbps = None  # fail below this all-reduce bus bandwidth (GB/s); None = ALLREDUCE_FLOORS's for
#   this GPU, 0 = none
max_memory_fraction = 0.9  # fail if a peak (the straight run's, the fit's) is above this share of the GPU
burn_seconds = 30.0  # how long each GPU's matmul burns in the probe, its health read meanwhile (CPU: 1 s)
# --link_check: instead of the benchmark, the links between nodes (docs/training.md, 'Checking a node')
link_check = False  # the probe alone, under one torchrun over nnodes nodes (run it on each): every GPU's
#   matmul and health, and the all-reduce over the links between the nodes
nnodes = 2  # nodes the link check spans
rdzv_endpoint = ''  # HOST:PORT where the nodes meet (torchrun's c10d rendezvous), e.g. node0:29500
# --estimate_check: instead of the benchmark, train.py's "to go: N steps of X" against its measured steps
estimate_check = False  # run train.py at each of estimate_configs for estimate_iters steps, on device
estimate_configs = ('', 'config/small_ablation.py', 'config/small_svformer.py')  # '' = train.py's defaults
estimate_iters = 100  # steps a run; the measured mean leaves out the first 10 (the first log record)
# --save_cost: instead of the benchmark, what train.py's checkpoint save costs at each config's size
save_cost = False  # build each of save_configs in fp32 with AdamW's state, save it as train.py does, here
save_configs = ('config/resformer_82m.py', 'config/resformer_180m.py', 'config/resformer_468m.py')
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
argv = [arg + '=True' if arg in ('--smoke', '--node_check', '--logits_cost', '--estimate_check', '--save_cost',
                                 '--link_check')
        else arg
        for arg in sys.argv[1:]]  # flags, no value
if '--smoke=True' in argv:  # tiny defaults, which other arguments still override
    rounds, steps, warmup, decode_tokens, decode_rounds, loop_rounds, loop_iters = (
        1, 1, 1, (2, 4), 1, 0, (1, 2))
    batch_size, block_size = 2, 32
cli.keep_going_without_stdout()  # `--help | head` ends quietly; a closed stdout stops no check
globals().update(configure({k: globals()[k] for k in config_keys}, argv, script=__file__, log_to=sys.stderr,
                           types={'min_mfu': float, 'min_allreduce_gbps': float}))
SMOKE_WARNING = "SMOKE RUN: tiny counts that only check the plumbing; these numbers measure nothing"
if smoke:
    print(SMOKE_WARNING)
# -----------------------------------------------------------------------------

# --------------------------------------------------------------------------- node check (--node_check)
# Before a 10,000-step job on a fresh node, in minutes: node_config's model, batch and dtype on synthetic
# tokens, under torchrun as the job runs (nccl on GPUs, compiled), node_iters steps straight; then in
# train.py's deterministic mode straight again, and stopped halfway and resumed; then fit_config for FIT_STEPS
# steps; then the verdicts, each against a threshold. Writes data/node_check and out/node_check in the
# current folder, as train.py. No GPU has run it yet: what only a GPU settles is marked "GPU only" below.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, whose train.py runs
NODE_DATA = 'node_check'  # under data/
GPT2_VOCAB = 50257  # every full-scale config trains on GPT-2 BPE tokens
TIMING_KEYS = ('tokens_per_sec', 'mfu', 'mfu_palm', 'peak_memory_gib')  # may differ in two runs of a step
# a config header's memory estimate, as every full-scale config states it
MEMORY_LINE = re.compile(r'^# Memory: about (?P<eager>\d+) GB eager, (?P<compiled>\d+) GB compiled per GPU '
                         r'at (?P<sequences>\d+) sequences of (?P<tokens>\d+) tokens', re.M)
TOO_HIGH = 0.7  # a peak under this times the estimate is flagged (the estimate is too high), not failed
NOISE_FACTOR, NOISE_FLOOR = 2, 1e-6  # within_noise's bound on a resumed run's drift
FIT_STEPS = 3  # fit_config's run: compiling, then steps at its full memory
# The MFU (ours: causal attention's half of T x T) below which min_mfu=None fails a node, by the exact name
# torch.cuda.get_device_name gives, as vrl.metrics.PEAK_TFLOPS. GPU only, and chosen before any GPU ran this
# code, for the paper's 82M config (node_config's default; a larger model only does better): its step is
# half the LM head's big matmul, half small ones (d = 512) and memory-bound work (norms, RoPE, the loss over
# 32 x 2048 x 50,304 logits), so we expect 30-50% on a healthy node, as compiled GPT-2-small-sized models
# reach on these GPUs. The floors sit at about half the low end, lower on the H100 and H200, whose compute
# outruns their memory more than the A100's: a node fails only if something is broken (no compiling, no
# flash attention, a throttled GPU, NCCL falling back to sockets), not if it is merely slow. Measure a
# healthy node, then raise them; --min_mfu overrides, and a tiny shape in train_args needs --min_mfu=0.
MFU_FLOORS = {name: 0.15 for name in ('NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe', 'NVIDIA H100 NVL',
                                      'NVIDIA H200', 'NVIDIA H200 NVL')}
MFU_FLOORS |= {name: 0.2 for name in ('NVIDIA A100-SXM4-40GB', 'NVIDIA A100-SXM4-80GB',
                                      'NVIDIA A100-PCIE-40GB', 'NVIDIA A100 80GB PCIe')}


# The all-reduce bus bandwidth (GB/s, nccl-tests' busbw of 256 MB in float32) below which
# min_allreduce_gbps=None fails a node of several of these GPUs. GPU only, chosen before any GPU ran this code:
# 8 NVLink/NVSwitch GPUs reach about 350-480 (H100, H200) and 200-230 (A100); without P2P, with NVLink down
# or NCCL on sockets, a node falls to PCIe's or the network's 10-25. PCIe cards have no floor.
ALLREDUCE_FLOORS = {name: 100.0 for name in ('NVIDIA H100 80GB HBM3', 'NVIDIA H200',
                                             'NVIDIA A100-SXM4-40GB', 'NVIDIA A100-SXM4-80GB')}
NVIDIA_SMI = 'nvidia-smi'  # the command the health check asks (a test's stand-in replaces it)
# nvidia-smi's throttle reasons that mean a sick GPU, not a busy one (nvml's bits): hardware slowdown,
# software and hardware thermal slowdown, the power brake
BAD_THROTTLE = {0x8: 'hardware slowdown', 0x20: 'thermal slowdown (software)',
                0x40: 'thermal slowdown (hardware)', 0x80: 'power brake'}


def unestimated_gb(settings):
    """What memory_estimate_gb leaves out, in GB: the final norm's saved tensors (its fp32 input and bf16
    output, 6 bytes a token and channel), flash attention's log-sum-exp (fp32, a token, head and layer) and
    cuBLAS's workspaces (about 32 MiB each for the two streams a step uses). GPU only, as measured there."""
    c = model_config(settings, GPT2_VOCAB)
    tokens = train_setting(settings, 'batch_size') * c.block_size
    return (tokens * (6 * c.n_embd + 4 * c.n_head * c.n_layer) + 2 * 32 * 2 ** 20) / 1e9


def probe_verdicts(report, gpu_name, held=None, floors=ALLREDUCE_FLOORS):
    """(lines, failures) on node_probe.py's report: each GPU's matmul against the node's median (and the
    median against the datasheet peak), the end of its burn against its start, the all-reduce against its
    floor (floors: by GPU; a setting overrides), and the memory that other processes hold on each GPU:
    held, {GPU index: GB} as nvidia-smi lists them before the probe, or else what each rank found in use
    before it allocated anything (its own CUDA context included)."""
    lines, failures = [], []
    speeds = [r['matmul_tflops'] for r in report['ranks']]
    median = statistics.median(speeds)
    lines.append(f"matmul per GPU: {' '.join(f'{x:.4g}' for x in speeds)} TFLOP/s ({report['ranks'][0]['matmul_n']}"
                 f"^3 {report['ranks'][0]['matmul_dtype']}); median {median:.4g}")
    for r, speed in zip(report['ranks'], speeds):
        if gpu_name and speed < min_gpu_speed * median:
            failures.append(f"rank {r['rank']}'s GPU ({r['host']}, local {r['local_rank']}) multiplies at "
                            f"{speed:.4g} TFLOP/s, below min_gpu_speed={min_gpu_speed:g} x the node's median "
                            f"{median:.4g}")
        slowed = r.get('matmul_tflops_last', speed) / r.get('matmul_tflops_first', speed)
        if gpu_name and slowed < min_gpu_speed:
            failures.append(f"rank {r['rank']}'s GPU ({r['host']}, local {r['local_rank']}) slowed from "
                            f"{r['matmul_tflops_first']:.4g} to {r['matmul_tflops_last']:.4g} TFLOP/s in its "
                            f"{r['matmul_seconds']:g} s burn, below min_gpu_speed={min_gpu_speed:g} x its "
                            f"start (heat or power?)")
    peak = metrics.PEAK_TFLOPS.get(gpu_name, 0) if gpu_name else 0
    if peak and median < min_matmul_fraction * peak:
        failures.append(f"the node's median matmul, {median:.4g} TFLOP/s, is below min_matmul_fraction="
                        f"{min_matmul_fraction:g} x {gpu_name}'s datasheet {peak:g}")
    bandwidth = report['all_reduce_busbw_gbps']
    floor = (floors.get(gpu_name, 0) if gpu_name else 0) if min_allreduce_gbps is None \
        else min_allreduce_gbps
    if bandwidth is None:
        lines.append("all-reduce: one rank, none to time")
    else:
        nodes = report.get('nodes', 1)
        lines.append(f"all-reduce: {bandwidth:.4g} GB/s bus bandwidth ({report['all_reduce_bytes'] >> 20} MB "
                     f"over {len(speeds)} ranks{f' on {nodes} nodes' if nodes > 1 else ''}, "
                     f"{report['backend']}); "
                     + (f"floor {floor:g}: {'BELOW it' if bandwidth < floor else 'passed'}" if floor
                        else "no floor"))
        if bandwidth < floor:
            failures.append(f"all-reduce bus bandwidth {bandwidth:.4g} GB/s, below {floor:g} (NVLink down, "
                            f"NCCL without P2P, or on sockets?)")
    if held is not None:
        failures += [f"GPU {index} already holds {gb:.1f} GB of other processes' before any run "
                     f"(nvidia-smi --query-compute-apps)" for index, gb in held.items() if gb > 1]
        return lines, failures
    for r in report['ranks']:
        if r.get('memory_used_gb', 0) > 1:
            failures.append(f"rank {r['rank']}'s GPU already holds {r['memory_used_gb']:.1f} GB before any run "
                            f"(another process?)")
    return lines, failures


def other_processes_gb():
    """{GPU index: GB} that processes hold on each GPU now, as nvidia-smi lists them (before the probe: none
    of them the check's); None where it lists none that it can read (no nvidia-smi; a container that
    shows no other process's memory says [N/A])."""
    gpus = smi_rows('query-gpu', ['index', 'pci.bus_id'])
    apps = smi_rows('query-compute-apps', ['gpu_bus_id', 'pid', 'used_memory'])
    if gpus is None or apps is None or any(not app['used_memory'].isdigit() for app in apps):
        return None
    held = {gpu['index']: 0.0 for gpu in gpus}
    index = {gpu['pci.bus_id'].lower(): gpu['index'] for gpu in gpus}
    for app in apps:  # MiB
        held[index.get(app['gpu_bus_id'].lower(), app['gpu_bus_id'])] += int(app['used_memory']) * 2 ** 20 / 1e9
    return held


def smi_rows(query, fields):
    """nvidia-smi's rows for a --query-* of fields, as dicts; None where nvidia-smi or the query is not
    available (a field it cannot read says so in its value: [N/A], [Not Supported])."""
    try:
        result = subprocess.run([NVIDIA_SMI, f'--{query}={",".join(fields)}', '--format=csv,noheader,nounits'],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode:
        return None
    return [dict(zip(fields, (v.strip() for v in line.split(',')))) for line in result.stdout.splitlines()
            if line.strip()]


def gpu_health():
    """nvidia-smi's rows of each GPU's uncorrected ECC errors since boot and active throttle reasons, the
    throttle field under whichever name the driver knows; None where nvidia-smi cannot say."""
    for throttle in ('clocks_event_reasons.active', 'clocks_throttle_reasons.active'):  # before driver 535
        gpus = smi_rows('query-gpu', ['index', 'ecc.errors.uncorrected.volatile.total', throttle])
        if gpus is not None:
            return [{'index': gpu['index'], 'ecc': gpu['ecc.errors.uncorrected.volatile.total'],
                     'throttle': gpu[throttle]} for gpu in gpus]
    return None


class HealthUnderLoad:
    """Reads gpu_health every `every` seconds in a thread while its with-block runs (the probe's burn):
    `readings`, a list of gpu_health's rows each time it could read them."""

    def __init__(self, every=5.0):
        self.every, self.readings, self.done = every, [], threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()
        return self

    def read(self):
        while not self.done.wait(self.every):
            rows = gpu_health()
            if rows is not None:
                self.readings.append(rows)

    def __exit__(self, *_):
        self.done.set()
        self.thread.join(120)


def health_verdicts(under_load=()):
    """(lines, failures) on nvidia-smi's health fields, each where present: uncorrected ECC errors since
    boot, remapped rows pending (a reset applies them) or failed, and throttle reasons of a sick GPU, read
    now (at rest, after the probe) and in under_load, gpu_health's readings during the probe's burn, where
    a hot or power-starved GPU shows them."""
    gpus = gpu_health()
    if gpus is None:
        return [f"health: not read ({NVIDIA_SMI} not found or refused the query)"], []
    failures, read = [], set()
    seen = {}  # GPU index: the throttle bits active in any reading
    for gpu in [row for rows in under_load for row in rows] + gpus:
        if gpu['throttle'].startswith('0x'):
            seen[gpu['index']] = seen.get(gpu['index'], 0) | int(gpu['throttle'], 16)
    for gpu in gpus:
        ecc = max([gpu['ecc']] + [row['ecc'] for rows in under_load for row in rows
                                  if row['index'] == gpu['index'] and row['ecc'].isdigit()], key=ecc_count)
        if ecc.isdigit():
            read.add('ECC')
            if int(ecc):
                failures.append(f"GPU {gpu['index']}: {ecc} uncorrected ECC errors since boot")
        if gpu['index'] in seen:
            read.add('throttle reasons')
            bad = [name for bit, name in BAD_THROTTLE.items() if seen[gpu['index']] & bit]
            if bad:
                failures.append(f"GPU {gpu['index']}: throttled ({', '.join(bad)})")
    rows = smi_rows('query-remapped-rows', ['gpu_bus_id', 'remapped_rows.pending', 'remapped_rows.failure'])
    for row in rows or []:
        pending, failed = (row[k].lower() for k in ('remapped_rows.pending', 'remapped_rows.failure'))
        if pending in ('yes', 'no', '0', '1'):
            read.add('remapped rows')
        if pending in ('yes', '1'):
            failures.append(f"GPU {row['gpu_bus_id']}: remapped rows pending (reset the GPU to apply them)")
        if failed in ('yes', '1'):
            failures.append(f"GPU {row['gpu_bus_id']}: a row remapping failed (the GPU needs service)")
    said = ', '.join(sorted(read)) or 'no field readable'
    during = f"; read at rest and {len(under_load)} times in the burn" if under_load else ''
    return [f"health ({len(gpus)} GPUs; {said}{during}): {'passed' if not failures else 'FAILED'}"], failures


def ecc_count(text):
    return int(text) if text.isdigit() else -1


def write_synthetic_data(folder, shape):
    """Uniform random GPT-2 token ids, laid out as prepare.py lays out a prepared folder: train.bin and
    val.bin (uint16), then meta.json, last, each swapped in whole. The validation split holds 16 of the
    run's batches (shape: its settings), of which an evaluation scores one, or all 16 under eval_full (the
    paper's recipe): as cheap at a test's tiny shape as at 82M's 32 x 2048 tokens."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    val_tokens = 16 * shape.get('batch_size', 32) * shape.get('block_size', 2048) + 1
    files = {'train.bin': rng.integers(GPT2_VOCAB, size=2 ** 22, dtype=np.uint16),
             'val.bin': rng.integers(GPT2_VOCAB, size=val_tokens, dtype=np.uint16)}
    meta = {'tokenizer': 'gpt2', 'vocab_size': GPT2_VOCAB,
            'files': {name: len(a) for name, a in files.items()},
            'max_token': max(int(a.max()) for a in files.values()),
            'source': 'synthetic: uniform random token ids (bench.py --node_check)'}
    for name, tokens in [*files.items(), ('meta.json', json.dumps(meta, indent=1).encode())]:
        path = os.path.join(folder, name)
        with open(path + '.tmp', 'wb') as f:
            f.write(tokens if isinstance(tokens, bytes) else tokens.tobytes())
        os.replace(path + '.tmp', path)


@functools.cache
def train_defaults():
    """train.py's settings that its source assigns a literal, with their defaults, read without running it."""
    with open(os.path.join(HERE, 'train.py'), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    defaults = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                defaults[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                continue  # computed, not a setting
    return defaults


def train_setting(settings, key):
    """A train.py setting as the run gets it: from settings (a config file's, train_args's), else its default."""
    return settings[key] if key in settings else train_defaults()[key]


def memory_estimate(path):
    """What a config's header states: {'eager': GB, 'compiled': GB, 'sequences': n, 'tokens': T}, or None."""
    with open(path, encoding='utf-8') as f:
        found = MEMORY_LINE.search(f.read())
    return found and {key: int(value) for key, value in found.groupdict().items()}


def memory_estimate_gb(settings, compiled):
    """The peak memory per GPU of training with these settings (a config file's, as configurator reads it), in
    GB: bf16 autocast, a forward pass of batch_size sequences, eager or compiled. The
    method: docs/training.md, 'How the memory estimates are made'; each config header states the result."""
    with torch.device('meta'):  # padded as train.py pads it (GPT-NeoX's 50,277 tokens pad to the same 50,304)
        model = build_model(model_config(settings, GPT2_VOCAB))
    c = model.config
    d, f, kv = c.n_embd, c.ffn_hidden, c.n_kv_head * (c.n_embd // c.n_head)
    # Bytes a token keeps for the backward in one layer. Eager: the fp32 residual stream at both norms (8d),
    # each linear's own bf16 copy of its normed input (q, k, v, gate, up: 10d), q and the output of attention
    # (4d), k and the values attended over (4kv), SwiGLU's gate, silu, up and their product (8f). Compiled,
    # inductor fuses the casts and the norms' scaling into one bf16 normed input per norm, which every linear
    # after it reads, and keeps: the norms' fp32 inputs (8d), their bf16 outputs (4d), q and the output of
    # attention (4d), k and v (4kv), SwiGLU's gate, up and their product, the down projection's input (6f).
    # Measured (CPU, inductor, torch 2.13, bf16 autocast, saved_tensors_hooks, 3 layers against 2 at d = 64,
    # kv = d, f = 3.5d): 41.2d a layer, this count's 41d; inductor's partitioner decides the same on CUDA,
    # bar SDPA's kernel (GPU only: the node check's measured/estimated ratio settles it).
    layer = 16 * d + 4 * kv + 6 * f if compiled else 22 * d + 4 * kv + 8 * f
    # The loss, per vocabulary entry. Eager: the fp32 log-softmax output and the gradients into and out of
    # it, alive at once in its backward (12 bytes; measured on the CPU as above, from the profiler's memory
    # timeline at two vocabulary sizes: 11.75). Compiled: the bf16 logits alone (2 bytes; fp32 logits would
    # be 4, with their gradient 8): the forward saves the bf16 matmul output and each row's max and log-sum
    # (8 bytes a token, left out), and the backward's one fused kernel writes the gradient over the logits
    # in place (inductor reuses a saved buffer that nothing reads later). Measured as above: 2.00 bytes saved
    # a token and entry (hooks), 1.8-1.9 at the step's peak (profiler, less the vocabulary-sized parameters'
    # share), and the generated backward's `buf1 = ...(mm_14, ...); del mm_14  # reuse`. GPU only: the same.
    head = (2 if compiled else 12) * c.vocab_size
    tokens = train_setting(settings, 'batch_size') * c.block_size
    # per parameter: fp32 weights and gradients (DDP's buckets hold them as views: no second copy), AdamW's
    # two fp32 moments (Muon's one momentum, for the blocks' matrices it trains), autocast's bf16 copy
    muon = sum(w.numel() for w in optim.hidden_matrices(model)) if train_setting(settings, 'muon') else 0
    return (18 * model.num_params() - 4 * muon + tokens * (c.n_layer * layer + head)) / 1e9


# Each full-scale config's batch_size (sequences a GPU takes a pass) is micro_batch's: the largest power of
# two whose compiled estimate, with what it leaves out, fits this budget, dividing the step's sequences.
MICRO_BATCH_BUDGET_GB = 60.0  # an 80 GB H100 less 25% headroom: the allocator's fragmentation, an
#   evaluation's buffers, and the estimate's own error until a GPU has measured it (the node check)


def micro_batch(settings):
    """The batch_size micro_batch's rule gives a config's settings (1 if even one sequence is over budget)."""
    step = train_setting(settings, 'batch_size') * train_setting(settings, 'gradient_accumulation_steps')
    fits = [b for b in (2 ** k for k in range(12)) if step % b == 0 and memory_estimate_gb(
        settings | {'batch_size': b}, compiled=True) + unestimated_gb(settings | {'batch_size': b})
        <= MICRO_BATCH_BUDGET_GB]
    return max(fits, default=1)


def children(pid):
    """The processes whose parent is pid, from Linux's /proc (elsewhere, none)."""
    found = []
    for stat in glob.glob('/proc/[0-9]*/stat'):
        try:
            with open(stat) as f:
                if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:  # the name may hold spaces: after it
                    found.append(int(stat.split('/')[2]))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return found


def kill_run(process):
    """SIGKILL a run: its process group (torchrun's) and each of torchrun's children's, since torchrun starts
    every rank in a session of its own (with any compile workers the rank starts), where killing torchrun's
    group would not reach it."""
    for group in (process.pid, *children(process.pid)):  # the ranks, before torchrun's end hands them to init
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # ended already, or no group of its own (then it was in torchrun's)
    process.wait()


def stream(name, command, timeout):
    """Run command, each line of its output (stdout and stderr) printed to stderr as it comes, prefixed with
    [name]: (exit status, the lines). Past timeout seconds the run is killed, ranks and all, and the check
    ends in one line; so does Ctrl-C, after the kill."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors='replace', start_new_session=True,
                               env=dict(os.environ, PYTHONUNBUFFERED='1'))  # a pipe would hold lines back
    lines = []

    def read():  # in text mode '\r' ends a line too: each of tqdm's updates comes as one
        for line in process.stdout:
            if line.strip():
                lines.append(line.rstrip())
                print(f"[{name}] {lines[-1]}", file=sys.stderr, flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_run(process)
        reader.join(10)
        raise SystemExit(f"bench.py: node check: the {name} run did not end within run_timeout={timeout:g} s "
                         f"(a hung rank or collective?); killed it and its ranks") from None
    except KeyboardInterrupt:
        kill_run(process)
        raise SystemExit(f"bench.py: node check interrupted; killed the {name} run and its ranks") from None
    finally:
        if process.poll() is None:  # Ctrl-C: its own session does not get it, so the ranks would stay
            kill_run(process)
    reader.join(30)  # its last lines; a stray process that kept the pipe open does not hold the check
    return process.returncode, lines


def launch(name, ranks, args, out_of_memory_ok=False, script='train.py', rendezvous=('--standalone',)):
    """Run train.py (or lab/node_probe.py) under torchrun, its output streamed: True once it ran. A run that
    fails ends the check with one line; with out_of_memory_ok, one that ran out of memory returns False.
    rendezvous: torchrun's, this node alone by default."""
    where = os.path.join(HERE, 'lab' if script == 'node_probe.py' else '', script)
    command = ['-m', 'torch.distributed.run', *rendezvous, f'--nproc_per_node={ranks}',
               os.path.relpath(where), *args]
    print(f"{name} run: python {shlex.join(command)}", flush=True)
    began = time.perf_counter()
    status, lines = stream(name, [sys.executable, *command], run_timeout)
    out_of_memory = any(re.search(r'out of memory|does not fit in ', line) for line in lines)  # CUDA's, or
    if status and out_of_memory_ok and out_of_memory:  # train.py's line
        return False
    if status:
        # train.py's one-line error: printed by the rank, or
        # in torchrun's summary, whose root cause comes last
        root = next((i for i, line in enumerate(lines) if line.startswith('Root Cause')), 0)
        said = [line[line.index('train.py: '):] for line in lines[root:] + lines[:root]
                if 'train.py: ' in line]
        raise SystemExit(f"bench.py: node check: the {name} run failed with exit status {status} "
                         f"({said[0] if said else f'its output is above, each line headed [{name}]'})")
    print(f"  took {time.perf_counter() - began:.1f} s, start-up, any compiling and checkpoints included",
          flush=True)
    return True


def log_records(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def untimed_records(out_dir):
    """A run's log without the fields that may differ between two runs of the same step."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in log_records(out_dir)]


def weight_distance(dir_a, dir_b):
    """(root mean square, largest) difference between two runs' final weights, over every weight."""
    a, b = (torch.load(os.path.join(d, 'ckpt.pt'), map_location='cpu', mmap=True, weights_only=True)['model']
            for d in (dir_a, dir_b))
    squares, count, largest = 0.0, 0, 0.0
    for k in a:
        if a[k].is_floating_point():
            gap = a[k].double() - b[k].double()
            squares, count = squares + gap.square().sum().item(), count + gap.numel()
            largest = max(largest, gap.abs().max().item())
    return (squares / count) ** 0.5, largest


def same_run(dir_a, dir_b):
    """Whether two runs ended alike, bit for bit: their logs (timing aside) and final weights."""
    return untimed_records(dir_a) == untimed_records(dir_b) and weight_distance(dir_a, dir_b)[1] == 0


def compare_resume(straight_dir, resumed_dir, stopped_at):
    """(verdict, a line on it) on whether the resumed run ended as the straight one. Both ran train.py's
    deterministic mode on the same batches, so their logs (timing aside) and weights are equal bit for bit:
    True. False if they differ only from the stop on: a resume that loses state, or nondeterminism that
    first shows after the stop (check_resume tells them apart). None if they differ already in the steps
    both ran before the stop: deterministic mode did not hold on this node (train.py lets an op that has no
    deterministic kernel run, with a warning), and within_noise judges instead."""
    straight, resumed = untimed_records(straight_dir), untimed_records(resumed_dir)
    gap = weight_distance(straight_dir, resumed_dir)[1]
    first = next((a or b for a, b in itertools.zip_longest(straight, resumed, fillvalue={}) if a != b), None)
    if first is None and gap == 0:
        return True, (f"exact: stopped at step {stopped_at} and resumed, the run's log ({len(resumed)} "
                      f"records) and final weights equal the straight run's, bit for bit")
    drift = f"the final weights differ by up to {gap:.3g}"
    # the records the first half wrote: its steps up to the stop and the evaluation there, which the resumed
    # run does not repeat (train.py keeps the log on resume, and the checkpoint holds that evaluation)
    if first and first['step'] <= stopped_at:
        return None, (f"not bit for bit: the two runs already differ at step {first['step']}, before the "
                      f"second one stopped (step {stopped_at}), so this node's kernels are not deterministic "
                      f"even in deterministic mode; {drift}")
    where = f"from step {first['step']}" if first else "in the final weights"
    return False, (f"NOT exact: the runs agree up to the stop at step {stopped_at}, the resumed one differs "
                   f"{where}; {drift}")


def within_noise(straight_dir, again_dir, resumed_dir):
    """(passed, a line): where kernels add in no fixed order, the resumed run's distance from the straight
    one against a second straight run's, as the root mean square over every weight. The largest difference
    would not tell: a weight whose gradient is near zero may take AdamW's step (about the learning rate)
    either way in two runs, drift alone; a resume that loses AdamW's moments changes every weight's step, by
    a good part of the rate (the check runs at the config's full rate for this). Drift puts both runs about
    as far; the bound is NOISE_FACTOR times the straight runs' distance, plus NOISE_FLOOR."""
    (noise, noise_max), (gap, gap_max) = (weight_distance(straight_dir, d) for d in (again_dir, resumed_dir))
    bound = NOISE_FACTOR * noise + NOISE_FLOOR
    return gap <= bound, (f"{'within' if gap <= bound else 'NOT within'} the noise: the resumed run's final "
                          f"weights differ from the straight run's by {gap:.3g} (root mean square; up to "
                          f"{gap_max:.3g}), a second straight run's by {noise:.3g} (up to {noise_max:.3g}); "
                          f"bound {NOISE_FACTOR} x that + {NOISE_FLOOR:g} = {bound:.3g}")


def check_resume(ranks, exact, exact_dir, resumed_dir, stopped_at):
    """(passed, lines): compare_resume; where it finds the runs apart, a second deterministic straight run
    says why. Apart only after the stop and the two straight runs bit for bit alike: the node is
    deterministic, so the resume lost state, and that fails. Otherwise the node is not deterministic:
    within_noise judges."""
    passed, how = compare_resume(exact_dir, resumed_dir, stopped_at)
    if passed:
        return passed, [how]
    print("resume: not bit for bit; a second deterministic straight run tells a node that is not "
          "deterministic from a resume that lost state", flush=True)
    again_dir = os.path.join('out', 'node_check', 'deterministic_again')
    launch('deterministic again', ranks, [*exact, f'--out_dir={again_dir}', f'--max_iters={node_iters}',
                                          '--overwrite=True'])
    if passed is False and same_run(exact_dir, again_dir):
        return False, [how, "a second deterministic straight run equals the first bit for bit: this node is "
                            "deterministic, so the resumed run lost state (AdamW's moments, a step of the "
                            "schedule, a batch, a seed)"]
    passed, judged = within_noise(exact_dir, again_dir, resumed_dir)
    return passed, [how, judged]


def try_fit(ranks, precision):
    """fit_config's peak memory per GPU in GB, trained for FIT_STEPS steps on this node's GPUs at its own
    batch_size, or None if it ran out of memory. It saves no checkpoint (a 1.6B one is about 20 GB)."""
    fit_dir = os.path.join('out', 'node_check', 'fit')
    # one pass of batch_size sequences a rank a step, not the config's gradient_accumulation_steps passes:
    # the same memory, fewer passes
    args = [fit_config, f'--dataset={NODE_DATA}', '--device=cuda', f'--dtype={precision}', '--log_interval=1',
            '--eval_iters=1', f'--eval_interval={FIT_STEPS}', f'--max_iters={FIT_STEPS}',
            f'--gradient_accumulation_steps={ranks}', '--save_checkpoint=False', f'--out_dir={fit_dir}',
            '--overwrite=True']
    peak = None
    if launch('fit', ranks, args, out_of_memory_ok=True):
        peak = max(r.get('peak_memory_gib', 0) for r in log_records(fit_dir)) * 2 ** 30 / 1e9
    shutil.rmtree(fit_dir, ignore_errors=True)  # its log: nothing to keep
    return peak


def mfu_floor(gpu_name):
    """(floor, where it comes from) for the MFU per GPU: min_mfu if set, else MFU_FLOORS's for this GPU
    (gpu_name None: a CPU), else 0, none."""
    if min_mfu is not None:
        return min_mfu, "min_mfu" if min_mfu else "no floor (min_mfu=0)"
    if gpu_name in MFU_FLOORS:
        return MFU_FLOORS[gpu_name], f"MFU_FLOORS's for {gpu_name}"
    return 0, ("no floor on a CPU (min_mfu sets one)" if gpu_name is None else
               f"no floor for {gpu_name}, which MFU_FLOORS does not name (min_mfu sets one)")


def memory_verdict(peaks, estimate, stated, have):
    """(line, failures) on the straight run's peak memory, each rank's in GB (GPU only), against the estimate
    (GB; None: none), which stated names, and the GPU's have GB. The highest rank's is judged: above the
    estimate it is marked ABOVE (a warning), above max_memory_ratio times it the check fails."""
    peak = max(peaks)
    spread = f" (ranks {min(peaks):.1f}-{peak:.1f})" if len(peaks) > 1 else ""
    said, failures = [f"peak memory per GPU: {peak:.1f} GB{spread}"], []
    if estimate:
        ratio = peak / estimate
        flag = (f" (ABOVE it: a warning; fails above {max_memory_ratio:g} x)" if ratio > 1 else
                f" (under {TOO_HIGH:g} x: the estimate is too high)" if ratio < TOO_HIGH else "")
        said.append(f"{ratio:.2f} x {stated}{flag}")
        if ratio > max_memory_ratio:
            failures.append(f"peak memory {peak:.1f} GB per GPU is {ratio:.2f} x the estimate of "
                            f"{estimate:.3g} GB, above max_memory_ratio={max_memory_ratio:g}")
    else:
        said.append(stated)
    share = peak / have
    said.append(f"{share:.0%} of the GPU's {have:.1f} GB")
    if share > max_memory_fraction:
        failures.append(f"peak memory {peak:.1f} GB per GPU is {share:.0%} of the GPU's {have:.1f} GB, above "
                        f"max_memory_fraction={max_memory_fraction:g}")
    return ', '.join(said[:2]) + '; ' + said[2], failures


def fit_verdict(peak, have):
    """(line, failures) on try_fit's peak (GB; None: out of memory) against the GPU's have GB. GPU only."""
    estimate = memory_estimate(fit_config)
    stated = f"; its header estimates {estimate['compiled']} GB compiled" if estimate else ""
    if peak is None:
        return (f"fit: {fit_config} does NOT fit: out of memory in its first steps; lower batch_size in it "
                f"and raise gradient_accumulation_steps to keep the step's sequences{stated}",
                [f"{fit_config} does not fit: out of memory"])
    share = peak / have
    if estimate:
        stated += f" ({peak / estimate['compiled']:.2f} x)"
    if share > max_memory_fraction:
        return (f"fit: {fit_config} peaks at {peak:.1f} GB of {have:.1f} GB per GPU ({share:.0%}), ABOVE "
                f"max_memory_fraction={max_memory_fraction:g}{stated}",
                [f"{fit_config} peaks at {peak:.1f} GB per GPU, {share:.0%} of the GPU's {have:.1f} GB, "
                 f"above max_memory_fraction={max_memory_fraction:g}"])
    return (f"fit: {fit_config} fits: peak {peak:.1f} GB of {have:.1f} GB per GPU ({share:.0%}) in "
            f"{FIT_STEPS} steps{stated}", [])


def run_settings():
    """node_config's settings with train_args's applied, as train.py reads them (a str setting as typed)."""
    settings = _read_config_file(node_config)
    for arg in shlex.split(train_args):
        key, _, text = arg.removeprefix('--').partition('=')
        try:
            settings[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            settings[key] = text
    return settings


def run_estimate(compiled):
    """(GB, a phrase naming it) for the straight run: memory_estimate_gb for the run's settings (node_config's
    with train_args applied), unrounded, plus what it leaves out (unestimated_gb); (None, a phrase) for a
    config whose header states no estimate."""
    mode, header = 'compiled' if compiled else 'eager', memory_estimate(node_config)
    if not header:
        return None, f"{node_config}'s header states no estimate"
    computed, left_out = memory_estimate_gb(run_settings(), compiled), unestimated_gb(run_settings())
    return computed + left_out, (f"the estimate of {computed + left_out:.3g} GB ({mode}: memory_estimate_gb's "
                                 f"{computed:.3g} and {left_out:.2g} it leaves out; {node_config}'s header "
                                 f"states {header[mode]} GB for its own settings)")


def node_ranks():
    """(device kind, GPUs here, ranks to start) for the node check and the link check; one line where the
    device cannot run them."""
    if (device == 'auto' or device.startswith('cuda')) and not torch.cuda.is_available():
        raise SystemExit("bench.py: the node check found no GPU (torch.cuda.is_available() is False: no "
                         "GPU, or a CUDA wheel the driver cannot run); to try it on this CPU, --device=cpu "
                         "with a tiny shape (docs/training.md, 'Checking a node')")
    kind = hardware.pick_device(device).split(':')[0]  # each rank takes its own GPU
    if kind not in ('cuda', 'cpu'):
        raise SystemExit(f"bench.py: device={device!r}; the node check runs on CUDA GPUs (nccl) or, to try "
                         f"it, on the CPU (gloo)")
    if not 0 <= burn_seconds <= 600:
        raise SystemExit(f"bench.py: burn_seconds={burn_seconds}; use 0 to 600 seconds (30 shows a GPU that "
                         f"slows down when hot)")
    gpus = torch.cuda.device_count() if kind == 'cuda' else 0
    ranks = nproc or gpus or 1
    if gpus and not torch.distributed.is_nccl_available():
        raise SystemExit("bench.py: this torch has no NCCL, which torchrun's GPU ranks use; install a CUDA "
                         "build of torch from pytorch.org")
    if ranks < 1:
        raise SystemExit(f"bench.py: nproc={nproc}; use 1 or more ranks, or 0 for one per GPU")
    if gpus and ranks > gpus:
        raise SystemExit(f"bench.py: nproc={nproc}, but {gpus} GPU(s) are here; use 1 to {gpus}, "
                         f"or 0 for all")
    return kind, gpus, ranks


def run_probe(name, kind, gpus, ranks, rendezvous=('--standalone',)):
    """node_probe.py under torchrun: (its report, other_processes_gb before it, gpu_health's readings during
    it). GPU only: the memory that other processes hold, and the health under the burn's load. The report
    is None on a node of several whose rank 0 ran elsewhere (it writes the report on its own node)."""
    held = other_processes_gb() if gpus else None
    probe_path = os.path.join('out', 'node_check', f'{name}.json')
    os.makedirs(os.path.dirname(probe_path), exist_ok=True)
    if os.path.exists(probe_path):
        os.remove(probe_path)  # an earlier check's
    seconds = burn_seconds if gpus else min(burn_seconds, 1.0)
    with HealthUnderLoad() if gpus else nullcontext() as health:
        launch(name, ranks, [probe_path, kind, f'{seconds:g}'], script='node_probe.py', rendezvous=rendezvous)
    if not os.path.exists(probe_path):
        return None, held, ()
    with open(probe_path) as f:
        return json.load(f), held, health.readings if gpus else ()


def check_node():
    if not torch.distributed.is_available():
        raise SystemExit("bench.py: this torch has no torch.distributed, so no torchrun; install a build "
                         "with it (pytorch.org's Linux wheels have it)")
    if not os.path.isfile(node_config):
        raise SystemExit(f"bench.py: node_config={node_config!r} not found; name a config file, "
                         f"e.g. config/resformer_82m.py")
    if fit_config and not os.path.isfile(fit_config):
        raise SystemExit(f"bench.py: fit_config={fit_config!r} not found; name a config file, or '' to skip "
                         f"the fit")
    if node_iters < 2:
        raise SystemExit(f"bench.py: node_iters={node_iters}; use 2 or more (a run stops halfway to resume)")
    if run_timeout <= 0:
        raise SystemExit(f"bench.py: run_timeout={run_timeout}; use seconds above 0")
    if min(min_mfu or 0, min_tokens_per_sec) < 0 or max_memory_ratio <= 0 or not 0 < max_memory_fraction <= 1:
        raise SystemExit(f"bench.py: min_mfu={min_mfu}, min_tokens_per_sec={min_tokens_per_sec}, "
                         f"max_memory_ratio={max_memory_ratio}, max_memory_fraction={max_memory_fraction}; "
                         f"use floors of 0 or more, a ratio above 0 and a fraction above 0, at most 1")
    if not (0 <= min_gpu_speed <= 1 and 0 <= min_matmul_fraction <= 1) or (min_allreduce_gbps or 0) < 0:
        raise SystemExit(f"bench.py: min_gpu_speed={min_gpu_speed}, min_matmul_fraction={min_matmul_fraction}, "
                         f"min_allreduce_gbps={min_allreduce_gbps}; use fractions from 0 to 1 and a bandwidth "
                         f"of 0 or more")
    kind, gpus, ranks = node_ranks()
    precision = hardware.pick_dtype(dtype, kind)
    write_synthetic_data(os.path.join('data', NODE_DATA), run_settings())
    half = node_iters // 2
    straight_dir, exact_dir, resumed_dir = (os.path.join('out', 'node_check', name)
                                            for name in ('straight', 'deterministic', 'resumed'))
    # every step logged; one validation batch, at the start, where the second run stops (so that both runs
    # have the same best_val_loss there) and at the end
    common = [node_config, f'--dataset={NODE_DATA}', f'--device={kind}', f'--dtype={precision}',
              '--log_interval=1', '--eval_iters=1', f'--eval_interval={half}', *shlex.split(train_args)]
    # The resume is judged in deterministic mode at the config's learning_rate from the first step (no
    # warm-up; a decay 100 times the run's length keeps the rate within 0.1% of it): a resume that loses
    # AdamW's moments then changes every weight's step by a good part of the rate (6e-4 at 82M), where in
    # the warm-up (step 5 of 120: 3e-5) its trace would be near drift's. Deterministic mode's math
    # attention keeps the T x T matrices on CUDA: a sequence a pass keeps them small, in as many passes as
    # the step has sequences (the same batches).
    settings = run_settings()
    sequences = train_setting(settings, 'gradient_accumulation_steps') * train_setting(settings, 'batch_size')
    exact = [*common, '--deterministic=True', '--batch_size=1', f'--gradient_accumulation_steps={sequences}',
             '--warmup_iters=0', f'--lr_decay_iters={100 * node_iters}']
    print(f"node check: {node_config} on {ranks} {'GPU' if gpus else 'CPU rank'}{'s' * (ranks > 1)} "
          f"({'nccl' if gpus else 'gloo'}, {precision}), synthetic GPT-2 tokens in data/{NODE_DATA}",
          flush=True)
    # first each GPU alone and the links between them, before any training run
    probe, held, under_load = run_probe('probe', kind, gpus, ranks)
    # speed and memory as the job runs, with no checkpoint to write; the resume compared in deterministic
    # mode, which is slower
    launch('straight', ranks, [*common, '--save_checkpoint=False', f'--out_dir={straight_dir}',
                               f'--max_iters={node_iters}', '--overwrite=True'])
    launch('deterministic', ranks, [*exact, f'--out_dir={exact_dir}', f'--max_iters={node_iters}',
                                    '--overwrite=True'])
    launch('first half', ranks, [*exact, f'--out_dir={resumed_dir}', f'--max_iters={half}',
                                 '--overwrite=True'])
    launch('resumed', ranks, [*exact, f'--out_dir={resumed_dir}', f'--max_iters={node_iters}',
                              '--init_from=resume'])
    resumed, resume_lines = check_resume(ranks, exact, exact_dir, resumed_dir, half)
    fit_peak = try_fit(ranks, precision) if fit_config and gpus else None
    # GPU only: asked once every run has ended, so that this process holds no GPU memory while they run
    gpu = torch.cuda.get_device_properties(0) if gpus else None  # rank 0's, whose peak the log holds

    failures = []  # each a line's worth: what was measured, and the threshold it passed
    lines, failed = probe_verdicts(probe, gpu.name if gpu else None, held)
    if gpus:
        health, unhealthy = health_verdicts(under_load)
        lines, failed = lines + health, failed + unhealthy
    for line in lines:
        print(line)
    failures += failed
    steps = [r for r in log_records(straight_dir) if 'train_loss' in r]
    speed = statistics.median(r['tokens_per_sec'] for r in steps)
    floor = ""
    if min_tokens_per_sec:
        floor = f"; {'BELOW' if speed / ranks < min_tokens_per_sec else 'above'} min_tokens_per_sec"
        if speed / ranks < min_tokens_per_sec:
            failures.append(f"{speed / ranks:,.0f} tokens/s per rank, below min_tokens_per_sec="
                            f"{min_tokens_per_sec:,.0f}")
    print(f"tokens/s: {speed:,.0f} for the job, {speed / ranks:,.0f} per rank (median of the straight run's "
          f"{len(steps)} steps){floor}")
    model_args = torch.load(os.path.join(exact_dir, 'ckpt.pt'), map_location='cpu', mmap=True,  # same model
                            weights_only=True)['model_args']
    with torch.device('meta'):
        model = build_model(AblationConfig(**model_args))
    ours, palm = (metrics.flops_per_token(model, model.config.block_size, causal) * speed / ranks / 1e12
                  for causal in (True, False))
    print(f"model FLOP/s per GPU: {ours:.3g} TFLOP/s counting causal attention's half of the T x T matrices "
          f"(ours), {palm:.3g} TFLOP/s counting all of them (PaLM's and nanoGPT's)")
    floor, source = mfu_floor(gpu.name if gpu else None)
    if 'mfu' in steps[0]:
        mfu = statistics.median(r['mfu'] for r in steps)
        mfu_palm = statistics.median(r['mfu_palm'] for r in steps)
        verdict = (f"floor {100 * floor:g}% ({source}): {'BELOW it' if mfu < floor else 'passed'}" if floor
                   else source)
        print(f"MFU per GPU: {100 * mfu:.1f}% (ours), {100 * mfu_palm:.1f}% (PaLM's); {verdict}")
        if mfu < floor:
            failures.append(f"MFU {100 * mfu:.1f}% per GPU (ours), below the floor of {100 * floor:g}% "
                            f"({source})")
    else:
        print("MFU per GPU: none, train.py knows no peak FLOP/s for this device (metrics.PEAK_TFLOPS); give "
              f"one GPU's dense bf16 TFLOP/s with --train_args='--peak_tflops=...'; {source}")
        if floor:
            failures.append(f"no MFU to hold to the floor of {100 * floor:g}% ({source}): give a peak with "
                            f"--train_args='--peak_tflops=...'")
    # train.py compiles on CUDA unless told otherwise
    compiled = run_settings().get('compile')
    estimate, stated = run_estimate(kind == 'cuda' if compiled is None else compiled)
    if gpu and 'peak_memory_gib' in steps[0]:  # GPU only
        ranks_peaks = [r.get('peak_memory_gib_ranks', [r['peak_memory_gib']]) for r in steps]
        peaks = [max(rank) * 2 ** 30 / 1e9 for rank in zip(*ranks_peaks)]  # each rank's over the steps
        line, failed = memory_verdict(peaks, estimate, stated, gpu.total_memory / 1e9)
        print(line)
        failures += failed
    else:
        print(f"peak memory per GPU: not measured ({'not in log.jsonl' if gpus else 'CUDA only'}); {stated}")
    for line in resume_lines:
        print(f"resume: {line}")
    if not resumed:
        failures.append("the resumed run does not continue the straight one (the resume lines above)")
    if fit_config and gpus:  # GPU only
        line, failed = fit_verdict(fit_peak, gpu.total_memory / 1e9)
        print(line)
        failures += failed
    else:
        print(f"fit: not tried ({'CUDA only' if fit_config else 'fit_config is empty'})")
    if failures:
        raise SystemExit(f"bench.py: node check failed: {'; '.join(failures)}")
    print(f"node check passed (logs: {straight_dir}, {exact_dir}, {resumed_dir}; a ckpt.pt in the last two)")


def check_links():
    """The probe alone, under one torchrun over nnodes nodes that meet at rdzv_endpoint (this command runs
    on each): every GPU's matmul and health as the node check judges them, and the all-reduce over the
    links between the nodes, held to min_allreduce_gbps alone (a node's own floor is NVLink's)."""
    if nnodes < 2 or not re.fullmatch(r'[^\s:]+:\d+', rdzv_endpoint):
        raise SystemExit(f"bench.py: link check: nnodes={nnodes}, rdzv_endpoint={rdzv_endpoint!r}; use 2 or "
                         f"more nodes and node 0's HOST:PORT, e.g. --rdzv_endpoint=node0:29500, the same on "
                         f"every node")
    kind, gpus, ranks = node_ranks()
    print(f"link check: {ranks} {'GPU' if gpus else 'CPU rank'}{'s' * (ranks > 1)} a node on {nnodes} nodes, "
          f"meeting at {rdzv_endpoint}", flush=True)
    probe, held, under_load = run_probe('links', kind, gpus, ranks, rendezvous=(
        f'--nnodes={nnodes}', '--rdzv_backend=c10d', f'--rdzv_endpoint={rdzv_endpoint}'))
    if probe is None:
        print("link check: rank 0 ran on another node, whose link check judges the links")
        return
    gpu_name = torch.cuda.get_device_name(0) if gpus else None
    lines, failures = probe_verdicts(probe, gpu_name, held, floors={})
    if gpus:
        health, unhealthy = health_verdicts(under_load)
        lines, failures = lines + health, failures + unhealthy
    for line in lines:
        print(line)
    if failures:
        raise SystemExit(f"bench.py: link check failed: {'; '.join(failures)}")
    print("link check passed")


if node_check:
    check_node()
    raise SystemExit(0)
if link_check:
    check_links()
    raise SystemExit(0)


# ------------------------------------------------------------------------- estimate check (--estimate_check)
def seconds(number, unit):
    """metrics.duration's text back in seconds: '0.25', 's' -> 0.25."""
    return float(number) * {'s': 1, 'min': 60, 'h': 3600}[unit]


def estimate_against_steps(config_file):
    """(estimated, measured) seconds a step of train.py with config_file ('' for its defaults): its
    time to go's seconds a step, and the mean of its logged steps after the first log record (the first
    steps pay warm-up)."""
    with tempfile.TemporaryDirectory() as out_dir:
        command = [sys.executable, os.path.join(HERE, 'train.py'), *([config_file] if config_file else []),
                   f'--device={device}', f'--dtype={dtype}', f'--max_iters={estimate_iters}',
                   f'--eval_interval={estimate_iters}', '--log_interval=10', f'--out_dir={out_dir}',
                   *shlex.split(train_args)]
        run = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"bench.py: estimate check: `{shlex.join(command[1:])}` failed: "
                             f"{(run.stderr.strip().splitlines() or ['no output'])[-1]}")
        estimated = re.search(r'to go: \d+ steps of ([\d.]+) (s|min|h)', run.stdout)
        tokens = int(re.search(r'([\d,]+) tokens per step', run.stdout)[1].replace(',', ''))
        steps = [r for r in log_records(out_dir) if 'tokens_per_sec' in r][1:]
    if not steps:
        raise SystemExit(f"bench.py: estimate_iters={estimate_iters}; use 20 or more (2 log records of 10)")
    return seconds(*estimated.groups()), statistics.mean(tokens / r['tokens_per_sec'] for r in steps)


if estimate_check:
    print("| config | estimated s/step | measured s/step | estimated / measured |\n|---|---|---|---|")
    for config_file in estimate_configs:
        estimated, measured = estimate_against_steps(config_file)
        print(f"| {config_file or 'defaults'} | {estimated:.3g} | {measured:.3g} | "
              f"{estimated / measured:.2f} |", flush=True)
    raise SystemExit(0)

# model shape, then (batch, T) on a CPU and on a GPU; 'small'
# is train.py's defaults (84 characters padded to 128)
SHAPES = {
    'small': (dict(n_layer=4, n_head=4, n_embd=128, vocab_size=128), (16, 128), (16, 128)),
    '82m': (dict(n_layer=8, n_head=8, n_embd=512, vocab_size=50304), (2, 256), (16, 2048)),
    '468m': (dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304), (1, 256), (8, 2048)),
}
OFFICIAL_FILES = {'official baseline': 'modeling_llama_baseline.py',
                  'official resformer': 'modeling_llama_resformer.py',
                  'official svformer': 'modeling_llama_svformer.py'}

if shape not in SHAPES:
    raise SystemExit(f"bench.py: shape={shape!r}; use one of {', '.join(SHAPES)}")
names = NAMED.get(presets) or ['vanilla'] + [p for p in presets.split(',') if p != 'vanilla']
if unknown := [p for p in names if p not in NAMED['successors'] + NAMED['all']]:
    raise SystemExit(f"bench.py: unknown preset(s) {', '.join(unknown)}; choose from 'all', 'successors' "
                     f"or {', '.join(dict.fromkeys(NAMED['all'] + NAMED['successors']))}")
counts = (('rounds', rounds, 1), ('steps', steps, 1), ('decode_rounds', decode_rounds, 1),
          ('warmup', warmup, 0), ('loop_rounds', loop_rounds, 0))
if too_low := [f"{name}={value}" for name, value, least in counts if value < least]:
    raise SystemExit(f"bench.py: {', '.join(too_low)}; rounds, steps and decode_rounds take at least 1, "
                     "warmup and loop_rounds at least 0")
if loop_rounds and len(set(loop_iters)) < 2:
    raise SystemExit(f"bench.py: loop_iters={loop_iters}; give two different lengths, e.g. (100, 200)")
if os.path.isdir(out) or not os.path.isdir(os.path.dirname(out) or '.'):  # now, not after the whole benchmark
    raise SystemExit(f"bench.py: out={out!r}; name a file in an existing folder")
device = hardware.pick_device(device)
device_type = device.split(':')[0]
dtype = hardware.pick_dtype(dtype, device_type)
ptdtype = getattr(torch, dtype)
autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=ptdtype)
if device_type == 'cuda':
    hardware.allow_tf32()
dims, cpu_bt, gpu_bt = SHAPES[shape]
B, T = gpu_bt if device_type == 'cuda' else cpu_bt
B, T = batch_size or B, block_size or T
L, d, H, V = dims['n_layer'], dims['n_embd'], dims['n_head'], dims['vocab_size']
notes = [SMOKE_WARNING] if smoke else []  # what was skipped, and why


def sync():
    if device_type == 'cuda':
        torch.cuda.synchronize()


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adamw(model):
    """The AdamW that train.py builds (it only reads model.parameters()), for any of the models."""
    return optim.configure_optimizers(model, 0.1, 1e-4, (0.9, 0.95), device_type)


def flops(non_embedding_params):
    """Training FLOPs per token of a reference model with this many non-embedding weights at our shape,
    counted by vrl.metrics.flops_per_token as ours are (6 per weight, plus causal attention): every row
    alike."""
    counted = SimpleNamespace(config=SimpleNamespace(n_layer=L, n_embd=d),
                              num_params=lambda exclude_embedding: non_embedding_params)
    return metrics.flops_per_token(counted, T)


# --------------------------------------------------------------------------- contenders
# Each is (name, build), build() -> (model, loss(model, x, y), optimizer, FLOPs per token), seeded alike.

def ours(variant):
    def build():
        model = build_model(AblationConfig(variant=variant, block_size=T, **dims)).to(device)
        return model, lambda m, x, y: m(x, y), adamw(model), metrics.flops_per_token(model, T)
    return variant, build


def nanogpt_model():
    """nanoGPT's GPT-2: LayerNorm, GELU MLP of 4d, learned positions, tied embeddings, no biases,
    at our shape."""
    module = load_module('nanogpt_model', nanogpt)

    def build():
        model = module.GPT(module.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=d,
                                            dropout=0.0, bias=False)).to(device)
        return model, lambda m, x, y: m(x, y)[1], adamw(model), flops(model.get_num_params())  # wpe left out
    return 'nanoGPT', build


def official_model(name, path):
    """The official Hugging Face Llama (baseline, Identity ResFormer or SVFormer) at our shape. Its patched
    files have eager attention (and flash_attention_2 on CUDA with flash-attn installed), no SDPA."""
    module = load_module(name.replace(' ', '_'), path)
    from transformers import LlamaConfig
    attn = ('flash_attention_2' if device_type == 'cuda' and importlib.util.find_spec('flash_attn')
            else 'eager')

    def build():
        config = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=round(3.5 * d),
                             num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H,
                             max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=False,
                             use_cache=False, attn_implementation=attn)
        model = module.LlamaForCausalLM(config).to(device)
        n = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
        # it shifts the labels itself, so x serves as labels:
        # a loss over T - 1 positions, as good as T for timing
        return model, lambda m, x, y: m(input_ids=x, labels=x).loss, adamw(model), flops(n)
    return f'{name} ({attn})', build


contenders = [ours(v) for v in names]
if nanogpt:
    if os.path.exists(nanogpt):
        contenders.append(nanogpt_model())
    else:
        notes.append(f"nanoGPT row skipped: {nanogpt} not found")
else:
    notes.append("nanoGPT row skipped: pass --nanogpt=PATH/model.py (a copy of karpathy/nanoGPT's model.py)")
if official:
    try:
        for name, file in OFFICIAL_FILES.items():
            if os.path.exists(os.path.join(official, file)):
                contenders.append(official_model(name, os.path.join(official, file)))
            else:
                notes.append(f"{name} row skipped: {os.path.join(official, file)} not found")
    # most often: no transformers, or a version whose internals the patched file predates
    except Exception as e:
        notes.append(f"official rows skipped: {type(e).__name__}: {str(e).splitlines()[0]} "
                     f"(they need transformers==4.44.2)")
else:
    notes.append("official rows skipped: pass --official=FOLDER holding Zcchill/Value-Residual-Learning's "
                 "src/modeling files")
if compile:
    # All our contenders run one code object, GPT.forward, and torch keeps a compiled entry on it per
    # variant's structure (and per decoding shape: up to 5 a decoder). Past recompile_limit entries (8 by
    # default) it would run the rest eager with a log line only, and they would be timed as compiled: give
    # every contender the room torch gives one model, and make running out a hard error instead of a silent
    # fallback.
    torch._dynamo.config.recompile_limit *= len(contenders)
    torch._dynamo.config.fail_on_recompile_limit_hit = True


# --------------------------------------------------------------------------- timing helpers

def timed(fn, n):
    """Seconds per call of fn, over n calls, with the device drained before and after (not in between)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def summary(values):
    """Median, range, and a 95% bootstrap interval for the median: how well the rounds pin the ratio down."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values),
            'ci95': (medians[50], medians[1949])}


def table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
    return '\n'.join(lines + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows])


class Trainer:
    """One contender's model, optimizer and batches; step() is the bare training step of train.py, without its
    data loading, logging or checks: forward, backward, clipping and the AdamW update."""

    def __init__(self, build):
        torch.manual_seed(seed)
        model, self.loss, self.optimizer, self.flops_per_token = build()
        self.params = sum(p.numel() for p in model.parameters())
        self.model = torch.compile(model) if compile else model
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
        g = torch.Generator().manual_seed(seed)
        rows = [torch.randint(V, (B, T + 1), generator=g) for _ in range(2)]
        self.batches = [(r[:, :-1].contiguous().to(device), r[:, 1:].contiguous().to(device)) for r in rows]
        self.n = 0

    def step(self):
        x, y = self.batches[self.n % len(self.batches)]
        self.n += 1
        with autocast:
            loss = self.loss(self.model, x, y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)  # as train.py
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


def matmul_peak():
    """(FLOP per call, calls per timing, description, call): a square matmul large enough to run at the
    device's peak, fp32 on a CPU and bf16 on a GPU."""
    n, mm_dtype, reps = (8192, torch.bfloat16, 20) if device_type == 'cuda' else (2048, torch.float32, 2)
    n = 256 if smoke else n
    a, b = torch.randn(n, n, device=device, dtype=mm_dtype), torch.randn(n, n, device=device, dtype=mm_dtype)
    return 2 * n ** 3, reps, f"{n}x{n} {str(mm_dtype).split('.')[1]} matmul", lambda: a @ b


def available_bytes():
    if device_type == 'cuda':
        return torch.cuda.mem_get_info()[0]
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


# ------------------------------------------------------------------- training steps in a fresh process
# For peak memory: on CUDA, torch's max_memory_allocated; on a CPU, the peak resident set (VmHWM, Linux) over
# what the process held after `import torch`, its high-water mark reset there. step_s: the median step after
# the first two (allocator, optimizer state, compiling). logits: the forward as it was before it returned
# the loss alone given targets, the logits returned beside it (--logits_cost).
TRAIN_CHILD = """
import json, statistics, sys, time, torch
import torch.nn.functional as F
from ablations import AblationConfig, build_model
from vrl import optim
variant, dims, B, T, device, dtype, compiled, logits, steps = json.loads(sys.argv[1])
def status(field):  # kB
    return next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith(field))
open('/proc/self/clear_refs', 'w').write('5')  # reset VmHWM to the current resident set
base = status('VmRSS:')
torch.manual_seed(0)
model = build_model(AblationConfig(variant=variant, block_size=T, **dims)).to(device)
optimizer = optim.configure_optimizers(model, 0.1, 1e-4, (0.9, 0.95), device.split(':')[0])
def with_logits(x, y):
    out = model(x)
    return out, F.cross_entropy(out.float().view(-1, out.size(-1)), y.reshape(-1), ignore_index=-1)
forward = with_logits if logits else model
forward = torch.compile(forward) if compiled else forward
x = torch.randint(dims['vocab_size'], (B, T + 1), device=device)
times = []
for _ in range(steps):
    start = time.perf_counter()
    with torch.autocast(device.split(':')[0], dtype=getattr(torch, dtype), enabled=dtype != 'float32'):
        loss = forward(x[:, :-1], x[:, 1:])
        loss = loss[1] if logits else loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(json.dumps({'rss_mb': status('VmHWM:') / 1024, 'rss_growth_mb': (status('VmHWM:') - base) / 1024,
                  'cuda_mb': torch.cuda.max_memory_allocated() / 2**20 if device.startswith('cuda') else None,
                  'step_s': statistics.median(times[2:] or times)}))
"""


def train_child(what, variant, compiled=False, logits=False, steps=3, env=None):
    """TRAIN_CHILD's measurements, as a dict, of `steps` training steps of variant at the shape set."""
    run = subprocess.run([sys.executable, '-c', TRAIN_CHILD,
                          json.dumps([variant, dims, B, T, device, dtype, compiled, logits, steps])],
                         cwd=HERE, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"bench.py: measuring {what} failed: "
                         f"{(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def compare_logits_cost():
    """A compiled training step at the shape set that returns the logits beside the loss, against one that
    returns the loss alone: step time and peak memory, one thread, the two taking turns in fresh processes."""
    if not os.path.exists('/proc/self/clear_refs'):
        raise SystemExit("bench.py: --logits_cost reads the peak resident set from Linux's /proc")
    env = dict(os.environ, OMP_NUM_THREADS='1')
    runs = {True: [], False: []}
    for r in tqdm(range(rounds), desc='logits cost', dynamic_ncols=True):
        for logits in (True, False)[::1 - 2 * (r % 2)]:
            runs[logits].append(train_child(f"the step with logits={logits}", 'resformer_identity', True,
                                            logits, warmup + steps, env))
    key = 'cuda_mb' if device_type == 'cuda' else 'rss_growth_mb'
    ratios = {k: summary([a[k] / b[k] for a, b in zip(runs[False], runs[True])]) for k in ('step_s', key)}
    print(f"## Compiled training step, resformer_identity at shape {shape} (L={L}, d={d}, vocab={V}), "
          f"batch {B} x T {T}, {device} ({dtype}), one thread; loss alone against logits returned too, "
          f"{rounds} rounds\n")
    print(table(['returns', 'ms/step (median)', f'peak {key} (median)'],
                [[name, f"{1e3 * statistics.median(r['step_s'] for r in runs[logits]):.1f}",
                  f"{statistics.median(r[key] for r in runs[logits]):.1f}"]
                 for name, logits in (('logits and loss', True), ('loss alone', False))]))
    for k, s in ratios.items():
        print(f"- {k}, loss alone / logits too: median {s['median']:.3f} (95% CI {s['ci95'][0]:.3f}-"
              f"{s['ci95'][1]:.3f}; range {s['min']:.3f}-{s['max']:.3f})")


if logits_cost:
    compare_logits_cost()
    raise SystemExit(0)


# ----------------------------------------------------------------------------- save cost (--save_cost)
def measure_save_cost():
    """Each config's checkpoint as train.py writes it (vrl.run_folder: the whole-checkpoint checksum, then
    torch.save to a temporary file and a rename) into a folder under the current one, on this disk: its
    size, the checksum's seconds and the write's. A GPU run adds the device-to-host copies (state_dict()
    of CUDA tensors), which this CPU cannot measure."""
    from vrl import run_folder
    print("| config | parameters | checkpoint | checksum | torch.save + rename | GB/s |\n|---|---|---|---|---|---|")
    for path in save_configs:
        settings = _read_config_file(path)
        model = build_model(model_config(settings, GPT2_VOCAB))
        adam = torch.optim.AdamW(model.parameters(), lr=1e-9, fused=False)
        for p in model.parameters():  # one step makes AdamW's two moments, as a run's checkpoint holds
            p.grad = torch.zeros_like(p)
        adam.step()
        with tempfile.TemporaryDirectory(dir='.') as folder:
            run = run_folder.RunFolder(os.path.join(folder, 'out'), 'scratch', False, writes=True)
            checkpoint = {'model': model.state_dict(), 'optimizer': adam.state_dict(), 'iter_num': 1,
                          'config': {k: v for k, v in settings.items()  # the settings, not `import os`
                                     if isinstance(v, (bool, int, float, str, tuple, list, type(None)))}}
            began = time.perf_counter()
            run_folder.checksum(checkpoint)
            summing = time.perf_counter() - began
            began = time.perf_counter()
            run.save(checkpoint, best=False)
            os.sync()  # on the disk, not in the page cache
            writing = time.perf_counter() - began - summing  # save() sums again: counted once, above
            size = os.path.getsize(run.ckpt_path) / 1e9
            run.let_go()
        print(f"| {os.path.basename(path)} | {model.num_params() / 1e6:,.0f}M | {size:.2f} GB | {summing:.1f} s "
              f"| {writing:.1f} s | {size / (summing + writing):.2f} |", flush=True)
        del model, adam, checkpoint


if save_cost:
    measure_save_cost()
    raise SystemExit(0)

# --------------------------------------------------------------------------- 1. training step, FLOP/s
progress = tqdm(desc='bench', total=0, dynamic_ncols=True, mininterval=1.0)
results = {'settings': {k: globals()[k] for k in config_keys}, 'torch': torch.__version__, 'device': device,
           'device_name': (torch.cuda.get_device_name() if device_type == 'cuda'
                           else f'cpu, {torch.get_num_threads()} threads'),
           'dtype': dtype, 'shape': dict(dims, batch_size=B, block_size=T)}

# Keep every model built if all fit comfortably (weights, gradients and AdamW state are ~16 bytes a parameter,
# activations aside); otherwise rebuild each one in every round, which costs time but not accuracy.
with torch.device('meta'):
    vanilla_params = sum(p.numel()
                         for p in GPT(GPTConfig(variant='vanilla', block_size=T, **dims)).parameters())
resident = 20 * vanilla_params * len(contenders) < available_bytes() / 2
info = {}  # name -> (parameters, FLOPs per token)


def ready(name, build):
    progress.set_description(f'build {name}')
    trainer = Trainer(build)
    for _ in range(warmup):
        trainer.step()
    info[name] = trainer.params, trainer.flops_per_token
    return trainer


mm_flop, mm_reps, mm_name, mm_call = matmul_peak()
progress.total += rounds * (len(contenders) + 1)
trainers = {name: ready(name, build) for name, build in contenders} if resident else {}
times = {name: [] for name, _ in contenders}
mm_times = []
for r in range(rounds):
    for name, build in contenders[r % len(contenders):] + contenders[:r % len(contenders)]:
        trainer = trainers[name] if resident else ready(name, build)
        progress.set_description(f'round {r + 1}/{rounds} {name}')
        times[name].append(timed(trainer.step, steps))
        del trainer
        progress.update(1)
    mm_times.append(timed(mm_call, mm_reps))
    progress.update(1)
trainers.clear()

peak = mm_flop / min(mm_times)  # a peak is what the device can do: the fastest round
# the datasheet's dense bf16 peak (metrics.PEAK_TFLOPS, train.py's MFU peak), printed beside the measured one
datasheet = metrics.PEAK_TFLOPS.get(results['device_name'], 0) if device_type == 'cuda' else 0
results['matmul'] = {'what': mm_name, 'flops_per_s': peak,
                     'median_flops_per_s': mm_flop / statistics.median(mm_times),
                     'datasheet_bf16_flops_per_s': datasheet * 1e12 or None}
results['train'] = []
for name, _ in contenders:
    params, fpt = info[name]
    step_s = statistics.median(times[name])
    achieved = fpt * B * T / step_s
    results['train'].append({'contender': name, 'params': params, 'flops_per_token': fpt, 'step_s': step_s,
                             'step_s_per_round': times[name], 'tokens_per_s': B * T / step_s,
                             'flops_per_s': achieved, 'fraction_of_matmul_peak': achieved / peak,
                             'vs_vanilla': summary([t / v for t, v in zip(times[name], times['vanilla'])])})
# the official ResFormer and SVFormer against the official baseline, as ours against vanilla
official_base = next((name for name, _ in contenders if name.startswith('official baseline')), None)
official_ratios = {name: summary([t / b for t, b in zip(times[name], times[official_base])])
                   for name, _ in contenders
                   if official_base and name.startswith('official') and name != official_base}
results['official_vs_official_baseline'] = official_ratios

# ------------------------------------------------------------------- 2. train.py's loop against the bare step
# train.py is run for two lengths: the difference in wall time is the cost of the extra steps with everything
# the loop does (data loading, logging, checks, syncs, and its evaluation and checkpoint every eval_interval
# steps), while start-up and the first evaluation, the same in both runs, cancel out.
loop_variant = 'resformer_identity'
data_dir = os.path.join(HERE, 'data', 'shakespeare_char')
if not loop_rounds:
    notes.append("train.py loop skipped (--loop_rounds=0)")
elif shape != 'small':
    notes.append("train.py loop skipped: it runs on train.py's own data, at the small shape only")
elif not os.path.exists(data_dir):
    notes.append("train.py loop skipped: no data/shakespeare_char; run `python prepare.py` first")
else:
    progress.total += 2 * loop_rounds
    walls = {n: [] for n in loop_iters}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(loop_rounds):
            for n in loop_iters:
                progress.set_description(f'train.py loop {r + 1}/{loop_rounds} max_iters={n}')
                cmd = [sys.executable, 'train.py', f'--variant={loop_variant}', f'--max_iters={n}',
                       f'--out_dir={tmp}', f'--device={device}', f'--dtype={dtype}', f'--compile={compile}',
                       f'--batch_size={B}', f'--block_size={T}',
                       '--overwrite=True']  # each timed run starts afresh in the same folder
                t0 = time.perf_counter()
                run = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
                walls[n].append(time.perf_counter() - t0)
                if run.returncode:
                    raise SystemExit(f"bench.py: {' '.join(cmd)} failed: "
                                     f"{(run.stderr.strip().splitlines() or ['?'])[-1]}")
                progress.update(1)
    loop_s = ((statistics.median(walls[max(loop_iters)]) - statistics.median(walls[min(loop_iters)]))
              / (max(loop_iters) - min(loop_iters)))
    bare_s = next((row['step_s'] for row in results['train'] if row['contender'] == loop_variant), None)
    if loop_s <= 0:
        notes.append("train.py loop: the longer runs were not slower (machine noise); raise loop_iters or "
                     "loop_rounds")
    else:
        results['loop'] = {'variant': loop_variant, 'step_s': loop_s, 'tokens_per_s': B * T / loop_s,
                           'walls': walls, 'bare_step_s': bare_s,
                           'bare_tokens_per_s': bare_s and B * T / bare_s}
    if bare_s is None:
        notes.append(f"train.py loop: no bare-step row for {loop_variant} to compare with (not in --presets)")

# --------------------------------------------------------------------------- 3. decoding
# The small shape's block_size is 128, so its RoPE table is made long enough for prompt + new tokens: the
# weights do not depend on it, and a 128-token cache would be refilled from scratch at every step past 128.
results['decode'] = []
if decode_tokens:
    prompt = torch.randint(dims['vocab_size'], (1, 16),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    decoders = {}
    for name in names:
        torch.manual_seed(seed)
        decoders[name] = build_model(AblationConfig(variant=name, block_size=16 + max(decode_tokens),
                                                    **dims)).to(device).eval()
        # as sample.py --compile; an untimed first run of each kind compiles it (prompt, then one token)
        if compile:
            # on a CPU a small model's tokens cost mostly per-call overhead, which the C++ wrapper removes
            decoders[name].compile(options={'cpp_wrapper': device_type == 'cpu'})
            for n in decode_tokens:
                with autocast:
                    list(decoders[name].generate_tokens(prompt, n, temperature=0, use_cache=True))
                    list(decoders[name].generate_tokens(prompt, min(n, 32), temperature=0, use_cache=False))
    progress.total += decode_rounds * len(names) * len(decode_tokens) * 2
    decode_times = {(name, n, cache): [] for name in names for n in decode_tokens for cache in (True, False)}
    for r in range(decode_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for n in decode_tokens:
                for cache in (True, False):
                    progress.set_description(f'decode {name} {n} {"cached" if cache else "recompute"}')
                    with autocast:
                        s = timed(lambda: list(decoders[name].generate_tokens(prompt, n, temperature=0,
                                                                              use_cache=cache)), 1)
                    decode_times[name, n, cache].append(s)
                    progress.update(1)
    decoders.clear()
    results['decode'] = [{'variant': name, 'new_tokens': n,
                          'cached_tokens_per_s': n / statistics.median(decode_times[name, n, True]),
                          'recompute_tokens_per_s': n / statistics.median(decode_times[name, n, False]),
                          'speedup': (statistics.median(decode_times[name, n, False])
                                      / statistics.median(decode_times[name, n, True]))}
                         for name in names for n in decode_tokens]
else:
    notes.append("decoding skipped (--decode_tokens=())")

# --------------------------------------------------------------------------- 4. KV cache bytes
# Filled by a real forward of 2,048 tokens on the 'meta'
# device: the cache our code builds, without the memory.
KV_CONTEXT = 2048
KV_ROWS = [  # (label, AblationConfig flags, ratio to vanilla MHA predicted by the formulas of test_model.py)
    ('vanilla', dict(variant='vanilla'), lambda L, g: Fraction(1)),
    ('resformer_identity', dict(variant='resformer_identity'), lambda L, g: Fraction(1)),
    ('svformer', dict(variant='svformer'), lambda L, g: Fraction(L + 1, 2 * L)),
    ('vanilla + GQA (n_kv_head = n_head/4)', dict(variant='vanilla', gqa=4), lambda L, g: Fraction(1, g)),
    ('svformer + GQA (n_kv_head = n_head/4)', dict(variant='svformer', gqa=4),
     lambda L, g: Fraction(L + 1, 2 * L * g)),
    ('cla', dict(variant='cla'), lambda L, g: Fraction((L + 1) // 2, L)),
    ('share_k', dict(variant='share_k'), lambda L, g: Fraction(L + (L + 1) // 2, 2 * L)),
    ('share_v', dict(variant='share_v'), lambda L, g: Fraction(L + (L + 1) // 2, 2 * L)),
]


def kv_bytes(shape_dims, flags):
    flags = dict(flags)
    group = flags.pop('gqa', 1)
    with torch.device('meta'):
        model = build_model(AblationConfig(block_size=KV_CONTEXT, n_kv_head=shape_dims['n_head'] // group,
                                           **shape_dims, **flags))
        cache = model.new_kv_cache(KV_CONTEXT)
        model.to(ptdtype)(torch.zeros(1, KV_CONTEXT, dtype=torch.long), kv_cache=cache)
    return cache_bytes(cache)


def cache_bytes(cache):
    """Bytes a KV cache holds: its K and V tensors, and the token ids a TokenKVCache keeps (a bank of values)."""
    tensors = [*cache.k, *cache.v, getattr(cache, 'tokens', None)]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


results['kv'] = []
for kv_shape in ('82m', '468m'):
    shape_dims = SHAPES[kv_shape][0]
    vanilla_bytes = kv_bytes(shape_dims, KV_ROWS[0][1])
    for label, flags, formula in KV_ROWS:
        nbytes = kv_bytes(shape_dims, flags)
        expected = formula(shape_dims['n_layer'], flags.get('gqa', 1))
        results['kv'].append({'shape': kv_shape, 'variant': label, 'bytes': nbytes,
                              'ratio': nbytes / vanilla_bytes, 'formula': str(expected),
                              'matches': Fraction(nbytes, vanilla_bytes) == expected})

# --------------------------------------------------------------------------- 5. peak memory
# Each preset trains for a few steps in a fresh process (train_child).
results['memory'] = []
if memory and not os.path.exists('/proc/self/clear_refs'):
    notes.append("memory skipped: the peak resident set is read from Linux's /proc")
elif memory:
    memory_names = names[:1] if smoke else names
    progress.total += len(memory_names)
    for name in memory_names:
        progress.set_description(f'memory {name}')
        measured = train_child(f"the memory of {name}", name)
        results['memory'].append({'variant': name} | {k: measured[k] for k in ('rss_mb', 'rss_growth_mb',
                                                                                'cuda_mb')})
        progress.update(1)
    if smoke:
        notes.append("memory: vanilla only (--smoke)")
else:
    notes.append("memory skipped (--memory=False)")
progress.close()
results['notes'] = notes

# --------------------------------------------------------------------------- report


def si(x, unit):
    for scale, prefix in ((1e12, 'T'), (1e9, 'G'), (1e6, 'M'), (1e3, 'k')):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


m = results['matmul']
peak_text = f"measured peak {si(m['flops_per_s'], 'FLOP/s')} ({m['what']}, fastest of {rounds} rounds)"
if m['datasheet_bf16_flops_per_s']:
    peak_text += f"; datasheet bf16 dense peak {si(m['datasheet_bf16_flops_per_s'], 'FLOP/s')}"
report = [f"## Training step: shape {shape} (L={L}, d={d}, heads={H}, vocab={V}), batch {B} x T {T}, "
          f"{results['device_name']}, {dtype}, compile {compile}",
          f"{rounds} rounds x {steps} steps per contender; "
          f"ratios are per round, to vanilla in the same round. {peak_text}.",
          '',
          table(['contender', 'params', 'ms/step', 'vs vanilla (median)', 'median 95% CI',
                 'vs vanilla (min-max)', 'tokens/s', 'model FLOP/s', '% of matmul peak'],
                [[r['contender'], f"{r['params'] / 1e6:.2f}M", f"{1e3 * r['step_s']:.1f}",
                  f"{r['vs_vanilla']['median']:.3f}", '{:.3f}-{:.3f}'.format(*r['vs_vanilla']['ci95']),
                  f"{r['vs_vanilla']['min']:.3f}-{r['vs_vanilla']['max']:.3f}", f"{r['tokens_per_s']:,.0f}",
                  si(r['flops_per_s'], 'FLOP/s'), f"{100 * r['fraction_of_matmul_peak']:.1f}"]
                 for r in results['train']])]
if official_ratios:
    report += [''] + [f"- {name} against {official_base}: median {s['median']:.3f} "
                      f"(95% CI {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}; range {s['min']:.3f}-{s['max']:.3f})"
                      for name, s in official_ratios.items()]
if 'loop' in results:
    lp = results['loop']
    report += ['', f"## train.py's loop against the bare step ({lp['variant']}, same shape)", '',
               table(['what', 'ms/step', 'tokens/s', 'vs bare step'],
                     [['bare step (above)', f"{1e3 * lp['bare_step_s']:.1f}" if lp['bare_step_s'] else '-',
                       f"{lp['bare_tokens_per_s']:,.0f}" if lp['bare_step_s'] else '-', '1.000'],
                      ['train.py loop', f"{1e3 * lp['step_s']:.1f}", f"{lp['tokens_per_s']:,.0f}",
                       f"{lp['step_s'] / lp['bare_step_s']:.3f}" if lp['bare_step_s'] else '-']])]
if results['decode']:
    report += ['', f"## Decoding: batch 1, greedy, 16-token prompt, shape {shape}, compile {compile}; "
               f"KV cache against full recompute, median of {decode_rounds} rounds", '',
               table(['variant'] + [c for n in decode_tokens
                                    for c in (f'cached tok/s @{n}', f'recompute tok/s @{n}',
                                              f'speedup @{n}')],
                     [[name] + [c for n in decode_tokens for row in results['decode']
                                if row['variant'] == name and row['new_tokens'] == n
                                for c in (f"{row['cached_tokens_per_s']:,.0f}",
                                          f"{row['recompute_tokens_per_s']:,.0f}", f"{row['speedup']:.1f}x")]
                      for name in names])]
report += ['', f"## KV cache at {KV_CONTEXT} context, batch 1, {dtype}", '',
           table(['shape', 'variant', 'KV bytes', 'vs vanilla', 'formula', 'matches'],
                 [[r['shape'], r['variant'], f"{r['bytes']:,}", f"{r['ratio']:.4f}", r['formula'],
                   'yes' if r['matches'] else 'NO']
                  for r in results['kv']])]
if results['memory']:
    report += ['', f"## Peak memory, 3 training steps in a fresh process, shape {shape}, batch {B} x T {T}",
               '']
    vanilla_mem = results['memory'][0]
    if device_type == 'cuda':
        report.append(table(['variant', 'max allocated MB', 'vs vanilla'],
                            [[r['variant'], f"{r['cuda_mb']:.1f}",
                              f"{r['cuda_mb'] / vanilla_mem['cuda_mb']:.3f}"]
                             for r in results['memory']]))
    else:
        report.append(table(['variant', 'peak RSS MB', 'growth after import MB', 'growth vs vanilla'],
                            [[r['variant'], f"{r['rss_mb']:.1f}", f"{r['rss_growth_mb']:.1f}",
                              f"{r['rss_growth_mb'] / vanilla_mem['rss_growth_mb']:.3f}"
                              if vanilla_mem['rss_growth_mb'] else '-']
                             for r in results['memory']]))
if notes:
    report += [''] + [f"- {note}" for note in notes]
if smoke:  # beside every table, so that none of its numbers is read without it
    report = [f"{line} ({SMOKE_WARNING})" if line.startswith('## ') else line for line in report]
print('\n'.join(report))
with open(out, 'w') as f:
    json.dump(results, f, indent=1)
print(f"\nwrote {out}")
