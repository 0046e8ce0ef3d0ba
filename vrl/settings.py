"""
train.py's settings checked before anything touches out_dir (check), and the model they describe
(model_config).
"""
import contextlib
import ipaddress
import math
import os
import socket
import struct
import sys
from dataclasses import fields
from types import SimpleNamespace

import torch

from ablations import AblationConfig


FLOAT32_MAX = torch.finfo(torch.float32).max


MAX_LAYERS = 1024


def check(config, world_size):
    """End train.py with one line at the first setting out of range or combination that cannot run (a
    step's passes that do not split over the ranks, wandb missing, a launch that cannot form its ranks),
    before anything touches out_dir: a run that cannot start changes nothing on disk."""
    check_settings(config, world_size)
    check_launch(world_size)
    if config['wandb_log']:
        import_wandb()


def check_settings(config, world_size=1):
    """End train.py with one line at the first setting out of range, before anything touches out_dir: a run
    that cannot start changes nothing on disk."""
    c = SimpleNamespace(**config)
    for ok, problem in [
        (str(c.out_dir).strip() != '',
         f"out_dir={c.out_dir!r}; name the run's folder, e.g. --out_dir=out/run"),
        # a folder that exists and takes no file (/proc/1), before the lock in it is tried; eval_only writes
        # nothing there
        (c.eval_only or not os.path.isdir(c.out_dir) or os.access(c.out_dir, os.W_OK | os.X_OK),
         f"cannot write to {c.out_dir} (permission denied); pick another --out_dir"),
        (c.init_from in ('scratch', 'resume', 'auto'),
         f"init_from={c.init_from!r}; use 'scratch', 'resume' or 'auto' (resume where out_dir holds a "
         f"checkpoint, else scratch)"),
        (not (c.overwrite and c.init_from != 'scratch'),
         f"overwrite=True starts over and init_from={c.init_from!r} continues; pick one"),
        # a depth no config means: it would pass the size check at a small width and then build modules
        # for minutes in silence
        (not isinstance(c.n_layer, int) or c.n_layer <= MAX_LAYERS,
         f"n_layer={c.n_layer}; the paper's deepest model has 24 layers, and building more than "
         f"{MAX_LAYERS} takes minutes before anything runs: use at most {MAX_LAYERS}"),
        (c.save_checkpoint or c.init_from == 'scratch',
         f"save_checkpoint=False with init_from={c.init_from!r} would continue a run and save none of "
         f"it; drop one"),
        (c.batch_size >= 1, f"batch_size={c.batch_size}; use 1 or more sequences a pass"),
        (c.block_size >= 1, f"block_size={c.block_size}; use 1 or more tokens"),
        (c.gradient_accumulation_steps >= 1,
         f"gradient_accumulation_steps={c.gradient_accumulation_steps}; use 1 or more"),
        (c.gradient_accumulation_steps % world_size == 0,
         f"gradient_accumulation_steps={c.gradient_accumulation_steps} passes a step do not split over "
         f"{world_size} ranks; use a multiple of {world_size} (nanoGPT's meaning: all ranks together)"),
        (c.ckpt_interval >= 0 and c.max_time >= 0,
         f"ckpt_interval={c.ckpt_interval}, max_time={c.max_time}; use 0 (off) or more"),
        # a depth no config means: an evaluation step list, a progress bar, an estimate are all sized by it
        (c.max_iters <= 10 ** 9, f"max_iters={c.max_iters}; use at most 10**9 steps"),
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
        (not c.muon or hasattr(torch.optim, 'Muon'),
         f"muon=True needs torch.optim.Muon, in torch 2.9 and later (this is torch "
         f"{torch.__version__}); upgrade torch, or train with AdamW alone (muon=False)"),
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


# One srun task per node, each a torchrun whose ranks meet at MASTER_ADDR through torchrun's own rendezvous
SRUN_TORCHRUN = ("srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc_per_node=8 "
                 "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 train.py ...")


def check_launch(world_size):
    """End train.py with one line where its processes cannot form the ranks they mean to: several tasks
    of one srun step without torchrun, or RANK without MASTER_ADDR; warn where ranks come from something
    other than torchrun (the first collective waits, silently, for every rank); and on more than one
    node, name the interface gloo binds (gloo_interface)."""
    # srun python train.py: every task of the step would train alone on GPU 0, silently. The step's own
    # count, not the allocation's (SLURM_NTASKS in a batch script): one python there is one process.
    step_tasks = int(os.environ.get('SLURM_STEP_NUM_TASKS') or 1)
    if step_tasks > 1 and 'RANK' not in os.environ:
        if int(os.environ.get('SLURM_PROCID') or 0) > 0:
            raise SystemExit(1)  # task 0 says why, once
        raise SystemExit(
            f"train.py: {step_tasks} tasks in this srun step but no torchrun: each would train alone on "
            f"GPU 0; on N nodes run `{SRUN_TORCHRUN}` (docs/training.md), or, to train in one process "
            f"on purpose, `SLURM_STEP_NUM_TASKS=1 python train.py ...`")
    if 'RANK' in os.environ and 'TORCHELASTIC_RUN_ID' not in os.environ and world_size > 1:  # torchrun's
        missing = [name for name in ('MASTER_ADDR', 'MASTER_PORT') if not os.environ.get(name)]
        if missing:
            raise SystemExit(f"train.py: RANK={os.environ.get('RANK')} WORLD_SIZE={world_size} without "
                             f"{' and '.join(missing)}: the ranks have nowhere to meet; launch with "
                             f"torchrun (docs/training.md)")
        if os.environ.get('RANK') == '0':
            print(f"train.py: RANK=0 WORLD_SIZE={world_size} come from outside torchrun: rank 0 waits, "
                  f"silently, at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} until all "
                  f"{world_size} ranks have started; Ctrl-C if they never will", file=sys.stderr)
    gloo_interface()


def gloo_interface(script='train.py'):
    """On a launch over several nodes, set GLOO_SOCKET_IFNAME, if unset, to the interface of this node's
    route to MASTER_ADDR. Without it gloo binds to the address the host name resolves to, which on
    Debian-like images and in many containers is 127.0.1.1: the other nodes would then wait on loopback
    for the process group's whole timeout. Where the route is loopback (node 0 reaching its own name,
    127.0.1.1), the node's one network interface serves; with several, and a host name that resolves to
    loopback, the script ends with one line naming the variable."""
    local_ranks = os.environ.get('LOCAL_WORLD_SIZE')  # torchrun's ranks on this node
    if (os.environ.get('GLOO_SOCKET_IFNAME') or not local_ranks
            or int(os.environ.get('WORLD_SIZE', '1')) <= int(local_ranks)):
        return
    master = os.environ.get('MASTER_ADDR', '')
    interfaces = ipv4_interfaces()
    route = route_source(master, int(os.environ.get('MASTER_PORT') or 29500))
    names = [name for name, address in interfaces.items() if address == route]
    if names and (not is_loopback(route) or master == 'localhost' or is_loopback(master)):
        os.environ['GLOO_SOCKET_IFNAME'] = names[0]  # (loopback: every "node" is this machine)
        return
    host = socket.gethostname()
    if not resolves_to_loopback(host):
        return  # gloo's own choice, the host name's address, reaches the other nodes
    network = [name for name, address in interfaces.items() if not is_loopback(address)]
    if len(network) == 1:
        os.environ['GLOO_SOCKET_IFNAME'] = network[0]
        return
    raise SystemExit(f"{script}: this host's name {host} resolves to loopback and the route to "
                     f"MASTER_ADDR={master} names no network interface, so gloo would listen where no "
                     f"other node can reach it; set GLOO_SOCKET_IFNAME to the interface the nodes reach "
                     f"each other on (this node has: {', '.join(network) or 'none'})")


def route_source(address, port):
    """The IPv4 address this host sends to address (a name or an IPv4 address) from, or None: a UDP
    socket's connect() picks the route, and with it the source address, without sending anything."""
    try:
        address = socket.getaddrinfo(address, port, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, port))
            return probe.getsockname()[0]
    except (OSError, UnicodeError):  # no such host, or no route to it
        return None


SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


def ipv4_interfaces():
    """{interface name: its IPv4 address} of this host's interfaces that have one ({} but on Linux)."""
    try:
        import fcntl
        interfaces = {}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            for _, name in socket.if_nameindex():
                with contextlib.suppress(OSError):  # an interface without an IPv4 address
                    request = struct.pack('256s', name.encode()[:15])
                    reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
                    interfaces[name] = socket.inet_ntoa(reply[20:24])
        return interfaces
    except (ImportError, OSError):  # not Linux
        return {}


def is_loopback(address):
    """Whether address (an IPv4 address; None, or a name, is not) is a loopback one, 127.x."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def resolves_to_loopback(host):
    """Whether every IPv4 address host resolves to is a loopback one, or it resolves to none."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except (OSError, UnicodeError):
        return True
    return all(is_loopback(address) for address in addresses)


def lr_scales_ok(lr_scales):
    names = [pair[0] for pair in lr_scales if isinstance(pair, (list, tuple)) and len(pair) == 2]
    return (len(names) == len(lr_scales) == len(set(names)) and all(isinstance(n, str) for n in names)
            and all(isinstance(m, (int, float)) and not isinstance(m, bool) and 0 <= m < math.inf
                    for _, m in lr_scales))


def model_config(config, vocab_size):
    """The AblationConfig of train.py's settings, its vocabulary vocab_size padded to a multiple of 64
    (faster matmuls); a bad setting ends train.py with one line."""
    args = {f.name: config[f.name] for f in fields(AblationConfig) if f.name in config}
    try:
        return AblationConfig(**args | {'vocab_size': -(-vocab_size // 64) * 64})
    except (TypeError, ValueError) as e:
        raise SystemExit(f"train.py: bad model settings: {e}")


def import_wandb():
    """Whether wandb imports (only when wandb_log asks for it): one line if not."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise SystemExit("train.py: wandb_log=True needs wandb; pip install wandb, "
                         "or drop --wandb_log") from None
