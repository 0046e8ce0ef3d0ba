"""
Machinery the scripts share, the same on Linux, macOS and Windows: a lock that keeps one writer per folder,
argparse that reports a bad argument in one line, the rule that no script opens a pipe to read it whole, the
check that a job fits in its device's memory, the GPUs' peak FLOP/s that MFU compares against, loading a
checkpoint and picking the device and precision, the rule for averaging runs' per-domain validation losses,
and a folder rewritten whole (claimed, partial_dir, replace_outputs, already_prepared, ShardWriter) by writes
that name the file they fail on (write_file).
"""
import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import stat

import filelock  # installed with torch: flock on Linux and macOS, msvcrt on Windows
import numpy as np

# One GPU's dense bf16 tensor-core peak in TFLOP/s, for train.py's MFU and beside bench.py's measured matmul
# peak, by the exact name torch.cuda.get_device_name gives: the vendor's datasheet figure, which NVIDIA states
# with 2:4 sparsity, halved. The exact name matters: an H100 PCIe or NVL has 76% or 84% of an SXM's peak, yet
# all three names contain 'H100'. Not listed: no MFU unless train.py's --peak_tflops gives it. (Should an H200
# NVL ever call itself plain 'NVIDIA H200', pass 835.5.)
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
    'NVIDIA L40S': 362.05,  # L40S datasheet's dense figure (its sparse one, 733, is not quite twice it)
    'NVIDIA L4': 242 / 2,  # L4 datasheet
    'NVIDIA A10': 250 / 2,  # A10 datasheet
    'NVIDIA GeForce RTX 4090': 330.4 / 2,  # Ada architecture whitepaper, bf16 with fp32 accumulation
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument ends the script with one line ("prepare.py: problem; see `python
    prepare.py --help`") instead of the usage dump. Give prog, the script's name: under a test, sys.argv[0] is
    pytest's."""

    def error(self, message):
        raise SystemExit(f"{self.prog}: {message}; see `python {self.prog} --help`")


class Lock:
    """An exclusive lock on a file, held by this process until release() or its end. The OS lets go of the
    lock of a process that dies, even by SIGKILL, so a killed run never leaves it stuck.

    The holder's pid goes into <path>.pid, for whoever is refused to name it; not into the lock file, which
    filelock 3 truncates on every attempt to take it. On Linux and macOS the lock file stays after release,
    as filelock keeps it: a run that opened it just before it was removed could lock a file no longer there
    while the next run locks a new one, and both would write."""

    def __init__(self, path, lock):
        self.path, self.pid_path, self.lock = path, path + ".pid", lock

    def release(self, remove=False):
        """Let go; remove=True also removes the lock file (while still held), from a folder about to go."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.pid_path)
        if remove:
            # Windows refuses to remove an open file; there filelock removes it on release
            with contextlib.suppress(OSError):
                os.remove(self.path)
        self.lock.release()


def try_lock(path, script):
    """(Lock, None) when this process now holds path (made if missing); (None, "process 1234") naming the
    process that holds it otherwise ("process unknown" in the instant before it writes its pid). A file
    system without file locks (flock fails with ENOSYS: Lustre mounted without -o flock, say) ends script
    with one line that says so; an OSError of the folder (read-only, missing) is the caller's to report."""
    path = os.path.abspath(path)  # the pid file is removed from the same place if the working folder changes
    try:  # filelock 4 would fall back to a marker file, which a run killed on another machine leaves held
        lock = filelock.FileLock(path, timeout=0, fallback_to_soft=False)
    except TypeError:  # filelock 3: no such argument, and no fallback (it raises NotImplementedError)
        lock = filelock.FileLock(path, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None, holder(path)
    except (NotImplementedError, OSError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOSYS:
            raise
        raise SystemExit(f"{script}: the file system of {os.path.dirname(path)} has no file "
                         f"locks (flock: ENOSYS, as on Lustre mounted without -o flock); use a folder on one "
                         f"that has them (a local disk, or Lustre mounted with -o flock)") from None
    held = Lock(path, lock)
    try:  # written in place, not swapped in: Windows refuses to replace a file that a refused run reads
        with open(held.pid_path, "w") as f:
            f.write(f"{os.getpid()}\n")
    except BaseException:
        held.release()
        raise
    return held, None


def holder(path):
    """The process that holds path's lock, as its <path>.pid says: "process 1234"."""
    try:
        with open(path + ".pid") as f:
            return f"process {int(f.read())}"
    except (OSError, ValueError):  # not written yet, or mid-write
        return "process unknown"


def hold(path, script, refusal):
    """try_lock, but when another process holds path, script ends with the one line
    f"{script}: {refusal(holder)}", holder naming that process ("process 1234")."""
    held, other = try_lock(path, script)
    if held is None:
        raise SystemExit(f"{script}: {refusal(other)}")
    return held


def refuse_pipe(path, what, fix):
    """End the script with one line "{what} {path} is not a regular file ...; {fix}" if path is a pipe,
    socket or device: opening one to read waits for a writer, perhaps forever. The one rule for every file a
    script reads whole (config files, checkpoints, meta.json, a prompt), called before opening it; a path
    that is missing, a folder or unreadable is left to the open() that follows, which says which."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise SystemExit(f"{what} {path} is not a regular file (a pipe or device may wait forever for a "
                         f"writer); {fix}")


def load_checkpoint(path, device='cpu', model_type=None):
    """(model, checkpoint) from a checkpoint of train.py; a missing, damaged or piped file exits with one
    line. model_type: the class to build (default GPT; analyze.py's AblationGPT records statistics)."""
    import torch  # here and below: only the scripts that train, sample or evaluate get here
    from model import GPT, GPTConfig
    refuse_pipe(path, "checkpoint", "point to a checkpoint file written by train.py")
    try:
        # mmap: tensors are read from the page cache as they are used, so 8 ranks resuming a 1.6B run (about
        # 20 GB with its optimizer state) share one copy in host memory instead of holding 8. Not on Windows,
        # which cannot replace a file while it is mapped (a CPU run's optimizer state keeps pointing into it).
        checkpoint = torch.load(path, map_location='cpu', weights_only=True, mmap=os.name != 'nt')
    except FileNotFoundError:
        raise SystemExit(f"checkpoint {path} not found; train one with `python train.py`") from None
    except OSError as e:  # a folder or file without read permission, an I/O error
        raise SystemExit(f"checkpoint {path} is unreadable ({(e.strerror or str(e)).lower()}); check its "
                         f"permissions or point to another checkpoint") from None
    except Exception:  # truncated, or not written by torch.save
        # never retry with weights_only=False: it runs code
        raise SystemExit(f"checkpoint {path} is unreadable: truncated, or not a checkpoint written by "
                         f"train.py; re-train or point to another checkpoint") from None
    if not isinstance(checkpoint, dict) or not {'model', 'model_args'} <= checkpoint.keys():
        raise SystemExit(f"checkpoint {path} is unreadable: not a checkpoint written by train.py "
                         "(no model or model_args)")
    if 'data_meta' not in checkpoint:  # what sample.py, eval.py and analyze.py read its text with
        raise SystemExit(f"checkpoint {path} has no data_meta, so the tokenizer its text needs is unknown; "
                         "point to a checkpoint written by train.py")
    try:
        model = (model_type or GPT)(GPTConfig(**checkpoint['model_args']))
        model.load_state_dict({current_name(k): v for k, v in checkpoint['model'].items()})
    except Exception as e:  # weights or settings that do not fit this version of the model
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SystemExit(f"checkpoint {path} does not fit this model.py ({reason}); "
                         "re-train or point to another checkpoint") from None
    return model.to(device), checkpoint


def current_name(key):
    """A saved weight's name in today's model: without the prefixes of a torch.compile'd or DDP-wrapped
    model (ours never saves them), and a token table's of before it moved into its layer renamed
    (value_embeds.3.weight: blocks.3.attn.value_embed.weight; value_bank.5.weight: ...attn.bank.weight)."""
    key = re.sub(r'^(module\.|_orig_mod\.)+', '', key)
    key = re.sub(r'^value_embeds\.(\d+)\.', r'blocks.\1.attn.value_embed.', key)
    return re.sub(r'^value_bank\.(\d+)\.', r'blocks.\1.attn.bank.', key)


def pick_device(device, needs_gpu=None):
    """'auto' means cuda, else cpu (mps only by name); a device this torch cannot use exits with one line.
    needs_gpu: why the job is too big for a CPU (train.py's full-scale runs), so that 'auto' stops rather than
    fall back to one: a CUDA wheel the driver is too old for looks like a machine without a GPU."""
    import torch
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
    import torch
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
        import torch  # only the scripts that train or sample get here, and they have imported it already
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


def mean_domain_losses(scored):
    """{domain: mean loss} over runs' per-domain validation losses (SlimPajama's 7 domains, whose unweighted
    mean is val_loss), one {domain: loss} or None per run; None unless every run has them, so that the means
    cover the same runs as the mean val_loss beside them."""
    if not scored or not all(scored):
        return None
    return {d: sum(s[d] for s in scored) / len(scored) for d in sorted(scored[0])}


# -----------------------------------------------------------------------------
# A folder rewritten whole, as prepare.py rewrites its out_dir: one run at a time, on a lock on .<name>.lock
# beside it (Lock says why the lock file stays, unless the run failed and left no out_dir). The new files are
# written into out_dir/.partial/; only when they are complete is the old data swapped out: its meta.json goes
# first and the new meta.json comes last, so a folder is either the old data, the new, or (after a crash
# mid-swap) one without meta.json, which reads as unprepared. Files the script does not write are left alone.
# A rerun with the same settings finds the folder already_prepared; big outputs are written shard by shard
# (ShardWriter).


@contextlib.contextmanager
def claimed(out_dir, script):
    """Hold out_dir for this run of script: its parent folders made, and the lock on .<name>.lock beside it
    (see Lock: the OS releases it if the process dies), so a second run on out_dir is refused instead of
    writing into it too. If the run fails, the folders made here go, and so does the lock file when out_dir is
    gone too."""
    parent, name = os.path.split(os.path.abspath(out_dir))
    lock_path, made = os.path.join(parent, f".{name}.lock"), []
    try:
        make_folders(parent, made)
        held = hold(lock_path, script,
                    lambda holder: f"another {script} ({holder}) is writing {out_dir} (it holds "
                                   f"{lock_path}); wait for it to finish, or pass another --out_dir")
    except BaseException as e:
        remove_folders(made)
        if isinstance(e, OSError):
            raise SystemExit(f"{script}: cannot write to {out_dir} ({e.strerror}); "
                             f"pass a writable --out_dir") from None
        raise
    try:
        yield
        made = []  # the run went well: its folders stay
    finally:
        held.release(remove=not os.path.isdir(out_dir))  # a failed run that left no out_dir leaves no lock
        remove_folders(made)


def make_folders(path, made):
    """Make path and its missing parents, appending each folder made to `made`."""
    if os.path.exists(path):
        if not os.path.isdir(path):  # said here, as filelock would say "File exists"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return
    make_folders(os.path.dirname(path), made)
    try:
        os.mkdir(path)
        made.append(path)
    except FileExistsError:  # made meanwhile by another run: not ours to remove
        pass


def remove_folders(made):
    for folder in reversed(made):
        with contextlib.suppress(OSError):  # not empty: another run is using it
            os.rmdir(folder)


@contextlib.contextmanager
def partial_dir(out_dir, script):
    """A fresh out_dir/.partial/ to write the new files into (taken under claimed(out_dir), so no other run is
    using it). If writing fails it is removed, and so is out_dir when this made it; the data out_dir held is
    never touched here."""
    made = not os.path.exists(out_dir)
    partial = os.path.join(out_dir, ".partial")
    try:
        os.makedirs(out_dir, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by a run that crashed
        os.mkdir(partial)
    except OSError as e:
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise SystemExit(f"{script}: cannot write to {out_dir} ({e.strerror}); "
                         f"pass a writable --out_dir") from None
    try:
        yield partial
    except BaseException as e:
        shutil.rmtree(out_dir if made else partial, ignore_errors=True)
        if isinstance(e, OSError):  # a full disk, say
            fix = "free space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "check the folder"
            raise SystemExit(f"{script}: cannot write {e.filename or out_dir} ({e.strerror or e}); "
                             f"{fix} or pass another --out_dir") from None
        raise


def replace_outputs(partial, out_dir, outputs):
    """Swap the finished files in partial for the data out_dir held, those whose names the regular expression
    outputs matches: its meta.json goes first, so that a crash mid-swap leaves a folder that reads as
    unprepared, and the new meta.json comes last."""
    old_meta = os.path.join(out_dir, "meta.json")
    if os.path.exists(old_meta):
        os.remove(old_meta)
    for name in os.listdir(out_dir):
        if outputs.fullmatch(name):  # the new run may have fewer shards
            os.remove(os.path.join(out_dir, name))
    for name in sorted(os.listdir(partial), key=lambda name: name == "meta.json"):
        os.replace(os.path.join(partial, name), os.path.join(out_dir, name))
    os.rmdir(partial)


def already_prepared(out_dir, settings):
    """meta.json if out_dir holds a finished run with these settings, else None."""
    try:
        with open(os.path.join(out_dir, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta["settings"] != settings:
            return None
        files = meta["files"].items()
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # missing or damaged: prepare again
        return None
    for name, tokens in files:
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path) or os.path.getsize(path) != 2 * tokens:
            return None
    return meta


class ShardWriter:
    """Writes a stream of token ids as {split}_00000.bin, {split}_00001.bin, ... of shard_tokens each."""

    def __init__(self, out_dir, split, shard_tokens):
        self.out_dir, self.split = out_dir, split
        self.buffer = np.empty(shard_tokens, dtype=np.uint16)
        self.filled = 0
        self.files = {}  # file name -> tokens
        self.max_token = 0

    def write(self, ids):
        ids = np.asarray(ids, dtype=np.uint16)
        while len(ids):
            n = min(len(ids), len(self.buffer) - self.filled)
            self.buffer[self.filled:self.filled + n] = ids[:n]
            self.filled += n
            ids = ids[n:]
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self, append=False):
        """Write the buffer as the next shard, or with append=True onto the end of the last one."""
        if self.filled:
            name = f"{self.split}_{len(self.files) - append:05d}.bin"
            write_file(os.path.join(self.out_dir, name), self.buffer[:self.filled].tobytes(),
                       "ab" if append else "wb")
            self.files[name] = self.files.get(name, 0) + self.filled
            self.max_token = max(self.max_token, int(self.buffer[:self.filled].max()))
            self.filled = 0

    def close(self):
        """Write what is left. A tail under half a shard (the quotas' overshoot, say) joins the last shard: a
        short shard would stop train.py at any block_size longer than it."""
        self.flush(append=bool(self.files) and self.filled < len(self.buffer) // 2)


def write_file(path, data, mode="wb"):
    """Write bytes to path; a failure (a full disk, say) names the path, which Python's write errors
    do not."""
    try:
        with open(path, mode) as f:
            f.write(data)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), path) from None
