"""
The device and its memory: picking the device and precision (setup, train.py's one call), and refusing,
in one line and before anything is allocated, a model that cannot fit (check_model_fits) or that would
take days on a CPU that device='auto' fell back to (needs_gpu).
"""
import os

import torch


def setup(config, model_config, local_rank):
    """(device, device_type, dtype name) for a train.py process with these settings (setup_device), after
    checking that the model fits the device's memory (check_model_fits) and that a full-scale run does
    not fall back to a CPU that device='auto' found instead of an unusable GPU (needs_gpu)."""
    c = config
    tokens = c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size'] * c['max_iters']
    needs = None if c['eval_only'] else needs_gpu(model_config, c['block_size'], tokens)
    device, device_type, dtype = setup_device(c['device'], c['dtype'], local_rank, c['deterministic'], needs)
    check_model_fits(model_config, device, training=not c['eval_only'])
    return device, device_type, dtype


def setup_device(device, dtype, local_rank, deterministic, needs_gpu):
    """(device, device_type, dtype name) for a train.py process: the device picked (under torchrun, the
    rank's GPU, cuda:local_rank), set as the current CUDA device before anything touches CUDA (else every
    rank also opens a context on GPU 0), TF32 matmuls allowed, deterministic kernels if asked for."""
    device = pick_device(device, needs_gpu)
    if local_rank is not None and device.startswith('cuda'):
        device = f'cuda:{local_rank}'
    device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
    if deterministic:  # lab/bench.py's node check: a resumed run must end as a straight one, bit for bit
        use_deterministic_kernels(device_type)
    if device_type == 'cuda':
        torch.cuda.set_device(device)
        allow_tf32()
    if device_type == 'cuda' and local_rank is not None:  # under torchrun, before NCCL's group
        # NCCL's flight recorder: a rank hung in a collective dumps its last 2,000 collectives into
        # /tmp/nccl_trace_rank_* when the group times out (the variable was renamed in torch 2.8)
        new_name = tuple(map(int, torch.__version__.split('.')[:2])) >= (2, 8)
        name = 'TORCH_FR_BUFFER_SIZE' if new_name else 'TORCH_NCCL_TRACE_BUFFER_SIZE'
        os.environ.setdefault(name, '2000')
    return device, device_type, pick_dtype(dtype, device_type)


def allow_tf32():
    """TF32 matmuls on CUDA, through the one switch every torch since 1.12 reads alike. On torch 2.9+,
    setting torch.backends.cuda.matmul.fp32_precision instead leaves torch.get_float32_matmul_precision(),
    which inductor's autotuning reads, raising "mix of legacy and new APIs"; allow_tf32 warns."""
    torch.set_float32_matmul_precision('high')


def pick_device(device, needs_gpu=None):
    """'auto' means cuda, else cpu (mps only by name); a device this torch cannot use exits with one line.
    needs_gpu: why the job is too big for a CPU (train.py's full-scale runs), so that 'auto' stops rather than
    fall back to one: a CUDA wheel the driver is too old for looks like a machine without a GPU."""
    if device == 'auto':
        # mps only when asked (as nanoGPT): no test runs there, and at this size a Mac's CPU may be faster
        if torch.cuda.is_available():
            return 'cuda'
        if needs_gpu:
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise SystemExit(f"device='auto' found no usable GPU (torch {torch.__version__}, {build}), and "
                             f"{needs_gpu}; install a torch whose CUDA the driver supports (nvidia-smi "
                             f"names the newest), or run on the CPU anyway with --device=cpu")
        return 'cpu'
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ('cpu', 'cuda', 'mps'):
        raise SystemExit(f"device={device!r}; use 'auto', 'cpu', 'cuda', 'cuda:1' or 'mps'")
    if parsed.type == 'cuda' and (parsed.index or 0) >= torch.cuda.device_count():
        have = f"only {torch.cuda.device_count()} GPU(s) are" if torch.cuda.is_available() \
            else "no CUDA GPU is"
        raise SystemExit(f"device={device!r}, but {have} available; use device='auto' or 'cpu'")
    if parsed.type == 'mps' and not torch.backends.mps.is_available():
        raise SystemExit(f"device={device!r}, but MPS is not available here; use device='auto' or 'cpu'")
    return device


def pick_dtype(dtype, device_type):
    """'auto' means bfloat16 on GPUs that have it, else float16 on CUDA, else float32 (CPU autocast does bf16
    only, which is slower than fp32 on most CPUs).
    An unknown name, or float16 off CUDA, exits with one line."""
    if dtype == 'auto':
        if device_type == 'cuda':
            return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
        return 'float32'
    if dtype not in ('float32', 'bfloat16', 'float16'):
        raise SystemExit(f"dtype={dtype!r}; use 'auto', 'float32', 'bfloat16' or 'float16'")
    if dtype == 'float16' and device_type != 'cuda':
        raise SystemExit(f"float16 autocast needs CUDA, not {device_type}; use dtype='bfloat16' or 'float32'")
    return dtype


def memory_bytes(device):
    """The memory a job on device may use: a CUDA GPU's free memory, else the machine's RAM (an MPS GPU
    shares it); None where the OS does not say (Windows has no os.sysconf)."""
    if device.startswith('cuda'):
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(needed, device, what, fix):
    """End the script with one line if needed bytes (a lower bound, computed from the settings before
    anything is allocated) exceed device's memory: "{what} needs at least N GB: it does not fit in the M GB
    ...; {fix}"."""
    have = memory_bytes(device)
    if have is not None and needed > have:
        kind = 'free on' if device.startswith('cuda') else 'of RAM for'
        raise SystemExit(f"{what} needs at least {needed / 1e9:,.3g} GB: it does not fit in the "
                         f"{have / 1e9:,.3g} GB {kind} {device}; {fix}")


def min_params(cfg):
    """Lower bounds on GPT(cfg)'s parameters, (all, those in the blocks), from the shape alone, in no time at
    any size (building even a 'meta' model of 100,000 layers takes minutes): every layer's W_Q, W_O and
    SwiGLU MLP, the embedding and the output layer (untied, as model.py's GPT). K, V, norms, λ and token
    tables come on top."""
    blocks = cfg.n_layer * (2 * cfg.n_embd ** 2 + 3 * cfg.n_embd * cfg.ffn_hidden)
    return blocks + cfg.vocab_size * cfg.n_embd * 2, blocks


def needs_gpu(model_config, block_size, tokens):
    """Why a run of model_config on this many tokens must not fall back to the CPU when device='auto' finds no
    GPU (a CUDA wheel the driver is too old for looks just like that), or None: training it would take over a
    day at 1 TFLOP/s, a fast CPU's pace, by vrl/metrics.py's flops_per_token formula on min_params's count. Every CPU
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
    check_fits(params * (16 if training else 4), device,
                       f"train.py: n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, ffn_hidden={cfg.ffn_hidden} "
                       f"and vocab_size={cfg.vocab_size} make over {params:.3g} parameters, and "
                       f"{'training' if training else 'evaluating'} them",
                       "lower n_layer, n_embd or ffn_hidden, or use a device with more memory")


def use_deterministic_kernels(device_type):
    """Deterministic kernels (deterministic=True), for bench.py's node check. An op that has none warns rather
    than stops the run: the node check then finds the runs apart and falls back to its bound."""
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')  # cuBLAS reads it once, at its first call
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device_type == 'cuda':  # the fused attention kernels' backwards add in no fixed order
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
