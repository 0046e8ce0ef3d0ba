"""
A run's out_dir and its checkpoints (RunFolder): never overwritten by accident, one writer at a time,
what a kill left tidied, checkpoints written atomically and durably (the previous one kept), in the
background where asked, the log cut back on resume; and reading a checkpoint back (load_checkpoint),
resuming only with the data and settings it was trained with (check_resume).
"""
import atexit
import contextlib
import errno
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import zlib
from dataclasses import fields

import torch

from ablations import AblationConfig as GPTConfig, build_model
from vrl import cli, locks


RUN_FILES = ('ckpt.pt', 'best.pt', 'log.jsonl')  # what a run writes to out_dir
PREVIOUS = 'ckpt.prev.pt'  # and the checkpoint before ckpt.pt, for a resume when ckpt.pt is torn


class RunFolder:
    """out_dir and the files a run writes there (RUN_FILES). Only the process that writes (writes=True: rank
    0, unless eval_only) takes out_dir's lock, checks it under the lock and writes; it lets go when the
    process ends (atexit; the OS when it is killed). saves=False (save_checkpoint=False): no ckpt.pt or
    best.pt. A fresh run that overwrites, or a resumed one, changes the old files only when it first
    writes: a run that fails before that leaves them as they were. resuming: whether the run continues
    out_dir's checkpoint (init_from 'resume', or 'auto' where there is one), the same on every rank.
    Below, what train.py's loop calls (save, wait, kept, log, let_go), then the start (take, resume).
    No call here is a collective: each acts on its own rank, and only the writer writes."""

    def __init__(self, out_dir, init_from, overwrite, writes, saves=True):
        self.out_dir, self.writes, self.saves = out_dir, writes, saves
        self.ckpt_path, self.best_path, self.log_path = (os.path.join(out_dir, name) for name in RUN_FILES)
        self.previous_path = os.path.join(out_dir, PREVIOUS)
        self.saved_step, self.saved_path = None, None  # the last good checkpoint, once there is one
        self.keep_previous = True  # whether the next save keeps ckpt.pt as ckpt.prev.pt (not a torn one)
        self.writing, self.failure = None, None  # a background write under way; what went wrong in it
        self.host_copy = []  # the tensors of the last background save's copy, which the next one refills
        self.lock, self.made_out_dir = None, False
        self.before_first_write = 'overwrite' if overwrite else None  # or ('resume', step), below
        if writes:
            self.take(init_from, overwrite)
        # no rank writes before every rank has read this (the process group starts after the resume)
        self.resuming = init_from == 'resume' or init_from == 'auto' and self.has_checkpoint()

    def save(self, checkpoint, best, background=False):
        """Write ckpt.pt, and best.pt too when best: each its own file (damage to one leaves the other),
        best.pt first (a kill between the two repeats that evaluation on resume), each written to a .tmp,
        flushed to disk (fsync) and only then renamed into place, the folder flushed after; the ckpt.pt it
        replaces stays as ckpt.prev.pt (resume falls back to it). background=True copies the checkpoint to
        the host and writes it in a thread, returning at once: the caller waits only for the copy. A save
        waits for the write before it, and the process's end for the last (let_go). Only the writer;
        nothing with saves=False."""
        if not (self.writes and self.saves):
            return
        self.wait()
        try:
            if self.before_first_write:
                self.first_write()
        except OSError as e:
            raise SystemExit(self.cannot_write(self.log_path, e)) from None
        if background:
            # a copy, not the live weights and moments: the next steps change those while it writes
            self.writing = threading.Thread(target=self.write, args=(self.copy_to_host(checkpoint), best),
                                            name='checkpoint writer')
            self.writing.start()
        else:
            self.write(checkpoint, best)
            self.wait()

    def copy_to_host(self, checkpoint):
        """checkpoint with every tensor copied to the host, into the last copy's tensors where they fit: after
        the first save no new memory, whose page faults made a copy 3 times slower (docs/training.md), and on
        CUDA pinned memory, which a copy fills at the link's full speed."""
        last, copies = iter(self.host_copy), []

        def copy(value):
            if isinstance(value, torch.Tensor):
                host = next(last, None)
                if host is None or host.shape != value.shape or host.dtype != value.dtype:
                    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=value.is_cuda)
                copies.append(host.copy_(value.detach(), non_blocking=value.is_cuda))
                return host
            if isinstance(value, dict):
                return {key: copy(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(copy(item) for item in value)
            return value
        copied = copy(checkpoint)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copies have landed before the thread reads them
        self.host_copy = copies
        return copied

    def write(self, checkpoint, best):
        """save()'s write, in this thread or the writer's: a failure is kept for wait() to report."""
        written, best_written = self.ckpt_path + '.tmp', self.best_path + '.tmp'
        try:
            checkpoint['checksum'] = checksum(checkpoint)  # checked when it is read (load_checkpoint)
            torch.save(checkpoint, written)
            flush_to_disk(written)
            if best:
                shutil.copyfile(written, best_written)
                flush_to_disk(best_written)
                os.replace(best_written, self.best_path)
                flush_folder(self.out_dir)  # best.pt's new name on disk before ckpt.pt's
            if self.keep_previous and os.path.exists(self.ckpt_path):
                os.replace(self.ckpt_path, self.previous_path)
            os.replace(written, self.ckpt_path)
            flush_folder(self.out_dir)
        except Exception as e:  # any, in a thread too, is the run's one line (a full disk: a RuntimeError)
            if not isinstance(e, OSError) and at_file_size_limit(written):  # torch.save's words hide EFBIG
                e = OSError(errno.EFBIG, os.strerror(errno.EFBIG))
            for partial in (written, best_written):  # gone now, not at the next start
                with contextlib.suppress(OSError):
                    os.remove(partial)
            self.failure = e
            return
        self.keep_previous = True
        self.saved_step, self.saved_path = checkpoint['iter_num'], self.ckpt_path

    def wait(self):
        """Wait for the background write under way, if any; end the run with one line if a write failed."""
        if self.writing:
            self.writing.join()
            self.writing = None
        if self.failure:
            error, self.failure = self.failure, None
            raise SystemExit(self.cannot_write(self.ckpt_path, error))

    @property
    def kept(self):
        """What a run that stops now leaves, for the line that says why it stopped: once the write under way
        has landed (the process's end waits for it anyway)."""
        if self.writing:
            self.writing.join()
        return (f"{self.saved_path} (step {self.saved_step}) is the last good checkpoint"
                if self.saved_step is not None else "no checkpoint written")

    def log(self, record):
        """Append record to log.jsonl (only the writer)."""
        if not self.writes:
            return
        try:  # a record cut short by a full disk is skipped on resume, like one cut by a kill
            if self.before_first_write:
                self.first_write()
            with open(self.log_path, 'a+b') as f:
                ends_a_line = f.tell() == 0 or (f.seek(-1, os.SEEK_END) or f.read(1) == b'\n')
                f.write((b'' if ends_a_line else b'\n') + (json.dumps(record) + '\n').encode())
        except OSError as e:
            raise SystemExit(self.cannot_write(self.log_path, e)) from None

    def let_go(self):
        """At the end of the process, whatever ended it: let go of out_dir's lock. A run that wrote nothing
        there, in an out_dir it made (a start refused partway), leaves no trace: the lock files and the
        folder go too."""
        if self.lock is None:
            return
        if self.writing:  # the process ends once its checkpoint is on disk, under the lock
            self.writing.join()
            if self.failure:
                print(self.cannot_write(self.ckpt_path, self.failure), file=sys.stderr)
        empty = self.made_out_dir and not any(os.path.exists(os.path.join(self.out_dir, name))
                                              for name in (*RUN_FILES, PREVIOUS))
        self.lock.release(remove=empty)
        self.lock = None
        if empty:
            with contextlib.suppress(OSError):  # not empty after all: leave it
                os.rmdir(self.out_dir)

    def cannot_write(self, path, error):
        """The line that ends a run whose write of path failed."""
        if getattr(error, 'errno', None) == errno.EFBIG:  # not the disk: this process may write no more
            return (f"train.py: cannot write {path} (past the file size limit, `ulimit -f`); raise the "
                    f"limit (`ulimit -f unlimited`), {self.kept}")
        if is_disk_full(error):
            return f"train.py: cannot write {path} (no space left on device); free disk space or fix out_dir, " \
                   f"{self.kept}"
        return f"train.py: cannot write {path} ({type(error).__name__}: {error}); fix out_dir, {self.kept}"

    def has_checkpoint(self):
        return os.path.exists(self.ckpt_path) or os.path.exists(self.previous_path)

    def take(self, init_from, overwrite):
        """Make out_dir and hold out_dir/.lock, then check under it that out_dir holds no run unless told what
        to do with it: a run that starts while another ends into the same folder sees its files."""
        if os.path.exists(self.out_dir) and not os.path.isdir(self.out_dir):
            raise SystemExit(f"train.py: out_dir={self.out_dir} is a file, not a folder; pick another --out_dir")
        try:
            self.made_out_dir = not os.path.isdir(self.out_dir)
            os.makedirs(self.out_dir, exist_ok=True)
            self.lock = locks.hold(os.path.join(self.out_dir, '.lock'), 'train.py', self.refusal)
            atexit.register(self.let_go)
            tempfile.TemporaryFile(dir=self.out_dir).close()
        except OSError as e:
            raise SystemExit(f"train.py: cannot write to {self.out_dir} ({e.strerror or e}); "
                             f"pick another --out_dir") from None
        existing = [name for name in (*RUN_FILES, PREVIOUS)
                    if os.path.exists(os.path.join(self.out_dir, name))]
        if existing and init_from == 'scratch' and not overwrite:
            raise SystemExit(f"train.py: {self.out_dir} already holds a run ({', '.join(existing)}); "
                             f"continue it with --init_from=resume (or auto), or start over with "
                             f"--overwrite=True (deletes it), or pick another --out_dir")
        if existing and init_from == 'auto' and not self.has_checkpoint():
            print(f"train.py: {self.out_dir} holds {', '.join(existing)} but no checkpoint (a run stopped "
                  f"before its first save): starting from scratch, which replaces them", file=sys.stderr)
            self.before_first_write = 'overwrite'
        # a resume reads the log whole, to cut it back to the checkpoint's step
        cli.refuse_pipe(self.log_path, "train.py: the run's log", "remove it, or replace it with a file")
        self.remove_half_written_files()

    def resume(self, model_config, config, data_meta, eval_only):
        """(model, checkpoint) of ckpt.pt, or of ckpt.prev.pt where ckpt.pt is missing or cannot be read
        (torn by a crash, damaged), with one line that says so; checked to continue exactly (check_resume)
        before anything touches out_dir. Its step is then the last good one, and the log is cut back to it
        when the run first writes (an evaluation its checkpoint holds stays: the run does not repeat it).
        eval_only scores ckpt.pt alone."""
        path = self.ckpt_path
        if not (eval_only or self.has_checkpoint()):  # a kill before the first save leaves a log alone
            raise SystemExit(f"train.py: checkpoint {path} not found, so there is nothing to resume; start "
                             f"the run with --init_from=auto, which starts over where there is no checkpoint")
        try:
            model, checkpoint = load_checkpoint(path, resuming=True)
        except SystemExit as unreadable:
            if eval_only or not os.path.exists(self.previous_path):
                raise
            path, self.keep_previous = self.previous_path, False  # the next save replaces ckpt.pt alone
            model, checkpoint = load_checkpoint(path, resuming=True)
            if self.writes:
                print(f"train.py: {str(unreadable.code).split(';')[0]}; resuming from {path} (step "
                      f"{checkpoint['iter_num']}), the checkpoint saved before it", file=sys.stderr)
        check_resume(checkpoint, path, model.config, model_config, config, data_meta, eval_only)
        broken = next((name for name, w in model.state_dict().items()
                       if w.is_floating_point() and not torch.isfinite(w).all()), None)
        if broken and not eval_only:
            raise SystemExit(f"train.py: {path} holds NaN or inf weights ({broken}), so it cannot be "
                             f"resumed; start over with --overwrite=True, or resume from a copy of best.pt")
        self.saved_step, self.saved_path = checkpoint['iter_num'], path
        checkpoint.setdefault('last_eval', None)  # written by a train.py before it kept the last evaluation
        checkpoint.setdefault('loss_since_log', (0.0, 0))  # or before it logged interval means
        evaluated = (checkpoint['last_eval'] or {}).get('step') == self.saved_step
        self.before_first_write = ('resume', self.saved_step, evaluated)
        return model, checkpoint

    def refusal(self, holder):
        return (f"another run ({holder}) is writing to {self.out_dir}; wait for it to end, "
                f"or pick another --out_dir")

    def remove_half_written_files(self):
        """Remove the .tmp files of writes a kill cut short (only ours: never a user's notes.tmp), saying so
        for a checkpoint's: a save killed mid-way, perhaps a stop-save that outlasted the scheduler's grace
        time."""
        for name in RUN_FILES:
            path = os.path.join(self.out_dir, name + '.tmp')
            if os.path.isfile(path):
                if name.endswith('.pt'):
                    print(f"train.py: removed {path}, a checkpoint write cut short by a kill "
                          f"(docs/training.md, 'Preemption', says how to give a stopped job time to save)",
                          file=sys.stderr)
                os.remove(path)

    def first_write(self):
        """Before the run's first write: delete the old run (overwrite), or cut the log of a resumed one back
        to what it said up to the checkpoint's step."""
        pending, self.before_first_write = self.before_first_write, None
        if pending == 'overwrite':
            for name in (*RUN_FILES, PREVIOUS):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.out_dir, name))
        elif pending and os.path.exists(self.log_path):
            _, step, evaluated = pending
            with open(self.log_path, 'rb') as f:  # bytes: a line that is not UTF-8 is no record
                kept = [line if line.endswith(b'\n') else line + b'\n'
                        for line in f if is_record_before(line, step, evaluated)]
            with open(self.log_path + '.tmp', 'wb') as f:
                f.writelines(kept)
            flush_to_disk(self.log_path + '.tmp')
            os.replace(self.log_path + '.tmp', self.log_path)
            flush_folder(self.out_dir)

def flush_to_disk(path):
    """Flush a written file to the disk (fsync): a rename that follows then never names a file whose bytes
    a crash of the machine lost (XFS, Lustre, GPFS may otherwise keep the new name over missing data)."""
    with open(path, 'r+b') as f:  # (Windows flushes no file opened to read only)
        os.fsync(f.fileno())


def flush_folder(folder):
    """Flush a folder's names to disk (fsync), so that a rename in it outlives a crash of the machine.
    Not on Windows, which cannot open a folder (its renames are journaled)."""
    if os.name == 'nt':
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a file system that cannot flush a folder (some FUSE mounts) keeps no more
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def is_record_before(line, step, evaluated=False):
    """Whether a line of log.jsonl is a record of a step before step, or step's training record (or its
    evaluation, where the checkpoint holds it): what a run resumed at step keeps. A line cut by a kill or a
    full disk, or not a record, is not."""
    try:
        record = json.loads(line)
        return record['step'] < step or (record['step'] == step and (evaluated or 'val_loss' not in record))
    except (ValueError, TypeError, KeyError):
        return False


def is_disk_full(error):
    """Whether a write failed for want of space: an OSError's ENOSPC or EDQUOT, or what torch.save's zip
    writer says of it (a RuntimeError 'unexpected pos', or 'file write failed')."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(words in str(error) for words in ('unexpected pos', 'file write failed', 'No space left'))


def at_file_size_limit(path):
    """Whether path has grown to this process's file size limit (`ulimit -f`; none on Windows), where a write
    fails with EFBIG, which torch.save's zip writer reports in the words of a full disk."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return limit != resource.RLIM_INFINITY and os.path.getsize(path) >= limit
    except (ImportError, OSError):
        return False


def checksum(checkpoint):
    """One CRC-32 of a whole checkpoint: each tensor's bytes (the weights, the optimizer's moments, ...) and
    every other field (steps, settings, the data's meta), in the order it holds them. Written with the
    checkpoint, compared when it is read, so a flipped byte anywhere in ckpt.pt stops a resume as damage
    instead of training on. About 0.4 s a GB on one core (docs/training.md)."""
    crc = 0
    def walk(value):
        nonlocal crc
        if isinstance(value, torch.Tensor):
            crc = zlib.crc32(f"tensor {value.dtype} {tuple(value.shape)}".encode(), crc)
            crc = zlib.crc32(tensor_bytes(value), crc)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key not in ('checksum', 'checksums'):
                    crc = zlib.crc32(repr(key).encode(), crc)
                    walk(item)
        elif isinstance(value, (list, tuple)):
            crc = zlib.crc32(f"{type(value).__name__} {len(value)}".encode(), crc)
            for item in value:
                walk(item)
        else:
            crc = zlib.crc32(repr(value).encode(), crc)
    walk(checkpoint)
    return crc


def tensor_checksums(checkpoint):
    """CRC-32 of each tensor's bytes in a checkpoint, in order: what older train.py wrote ('checksums')."""
    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            for key, item in value.items():
                if key != 'checksums':
                    yield from tensors(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from tensors(item)
    return [zlib.crc32(tensor_bytes(t)) for t in tensors(checkpoint)]


def tensor_bytes(tensor):
    """A tensor's bytes, for a checksum: a flat copy where it is strided (a 1-element slice may be)."""
    flat = tensor.detach().reshape(-1).cpu()
    if flat.numel() and flat.stride(0) != 1:
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy()


def load_checkpoint(path, device='cpu', model_type=build_model, resuming=False):
    """(model, checkpoint) from a checkpoint of train.py; a missing, damaged or piped file exits with one
    line, as does one with NaN or inf weights unless resuming (which says so itself). model_type: what
    builds the model (analyze.py's AblationGPT records statistics)."""
    cli.refuse_pipe(path, "checkpoint", "point to a checkpoint file written by train.py")
    try:
        # mmap: tensors are read from the page cache as they are used, so 8 ranks resuming a 1.6B run (about
        # 20 GB with its optimizer state) share one copy in host memory instead of holding 8. Not on Windows,
        # which cannot replace a file while it is mapped (a CPU run's optimizer state keeps pointing into it).
        checkpoint = torch.load(path, map_location='cpu', weights_only=True, mmap=os.name != 'nt')
    except FileNotFoundError:
        raise SystemExit(f"checkpoint {path} not found; train one first (python train.py --out_dir=...)") \
            from None
    except OSError as e:  # a folder or file without read permission, an I/O error
        raise SystemExit(f"checkpoint {path} is unreadable ({(e.strerror or str(e)).lower()}); check its "
                         f"permissions or point to another checkpoint") from None
    except Exception:  # truncated, or not written by torch.save
        # never retry with weights_only=False: it runs code
        raise SystemExit(f"checkpoint {path} is unreadable: truncated, or not a checkpoint written by "
                         f"train.py; {another_checkpoint(path)}") from None
    if not isinstance(checkpoint, dict) or not {'model', 'model_args'} <= checkpoint.keys():
        raise SystemExit(f"checkpoint {path} is unreadable: not a checkpoint written by train.py "
                         "(no model or model_args)")
    if ('checksum' in checkpoint and checksum(checkpoint) != checkpoint['checksum']
            or 'checksums' in checkpoint and tensor_checksums(checkpoint) != checkpoint['checksums']):
        raise SystemExit(f"checkpoint {path} is damaged: it no longer matches the checksum written with it "
                         f"(a flipped byte on disk or in a copy); {another_checkpoint(path)}")
    if 'data_meta' not in checkpoint:  # what sample.py, eval.py and analyze.py read its text with
        raise SystemExit(f"checkpoint {path} has no data_meta, so the tokenizer its text needs is unknown; "
                         "point to a checkpoint written by train.py")
    try:
        model = model_type(GPTConfig(**current_args(checkpoint['model_args'])))
        model.load_state_dict({current_name(k): v for k, v in checkpoint['model'].items()})
    except Exception as e:  # weights or settings that do not fit this version of the model
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SystemExit(f"checkpoint {path} does not fit this model.py ({reason}); "
                         "re-train or point to another checkpoint") from None
    broken = next((name for name, w in model.state_dict().items()
                   if w.is_floating_point() and not torch.isfinite(w).all()), None)
    if broken and not resuming:
        raise SystemExit(f"checkpoint {path} holds NaN or inf weights ({broken}): its run diverged; "
                         f"{another_checkpoint(path)}")
    return model.to(device), checkpoint


def another_checkpoint(path):
    """The advice for a checkpoint that cannot be used: the other checkpoints of its run beside it, each a
    separate file (for best.pt: ckpt.pt and ckpt.prev.pt), where there are any."""
    folder, name = os.path.split(path)
    others = [os.path.join(folder, other) for other in ('best.pt', 'ckpt.pt', PREVIOUS)
              if other != name and os.path.isfile(os.path.join(folder, other))]
    return f"use {' or '.join(others)} instead" if others else "re-train or point to another checkpoint"


def current_args(model_args):
    """A checkpoint's model_args in today's names: residual_source (0-based) is residual_from, and
    tie_embeddings (never set by a config) is gone."""
    args = dict(model_args)
    if 'residual_source' in args:
        args['residual_from'] = ('first', 'second')[args.pop('residual_source')]
    if not args.pop('tie_embeddings', False):
        return args
    raise ValueError("tie_embeddings=True is no longer built")


def current_name(key):
    """A saved weight's name in today's model: without the prefixes of a torch.compile'd or DDP-wrapped
    model (ours never saves them), and a token table's of before it moved into its layer renamed
    (value_embeds.3.weight: blocks.3.attn.value_embed.weight; value_bank.5.weight: ...attn.bank.weight)."""
    key = re.sub(r'^(module\.|_orig_mod\.)+', '', key)
    key = {'lambda_v1': 'lambda_1', 'lambda_vn': 'lambda_2', 'lambda_logits': 'lambda_prime'}.get(key, key)
    key = re.sub(r'^value_embeds\.(\d+)\.', r'blocks.\1.attn.value_embed.', key)
    return re.sub(r'^value_bank\.(\d+)\.', r'blocks.\1.attn.bank.', key)


# The settings a resumed run may change: where it writes and what it reports, the device it runs on, and
# where it stops (max_iters, max_time, on purpose); batch_size too, for memory, where the step's sequences
# (gradient_accumulation_steps x batch_size) and the evaluation's (eval_iters x batch_size) stay the same.
# Every other one shapes the batches, the update or the numbers the run compares (eval_iters: best_val_loss),
# so it must match the checkpoint's; so must the data (its meta.json).
MAY_CHANGE_ON_RESUME = ('out_dir', 'init_from', 'overwrite', 'save_checkpoint', 'eval_interval',
                        'log_interval', 'eval_only', 'wandb_log', 'wandb_project', 'wandb_run_name',
                        'log_grad_norms', 'dataset', 'data_dir', 'max_iters', 'device', 'compile',
                        'peak_tflops', 'ckpt_interval', 'max_time', 'batch_size',
                        'gradient_accumulation_steps', 'eval_iters')
SEQUENCES = (('gradient_accumulation_steps', 'a step'), ('eval_iters', 'an evaluation'))


def check_resume(checkpoint, ckpt_path, saved_model_config, model_config, config, data_meta, eval_only):
    """End train.py with one line unless the checkpoint continues exactly: it holds what a resume needs, was
    trained on this data (its meta.json) with these settings and this model. An eval_only run, which writes
    nothing, may score it with other data or settings."""
    missing = [key for key in ('optimizer', 'scaler', 'iter_num', 'best_val_loss', 'config')
               if key not in checkpoint]
    if missing:
        raise SystemExit(f"train.py: {ckpt_path} has no {', '.join(missing)}, so it cannot be resumed "
                         f"exactly; start over with --overwrite=True")
    if config['max_iters'] < checkpoint['iter_num'] and not eval_only:
        raise SystemExit(f"train.py: max_iters={config['max_iters']} is below step {checkpoint['iter_num']} "
                         f"of {ckpt_path}, which is left as it is; resume with --max_iters above it to train "
                         f"on, or score it with --eval_only=True")
    saved_meta, saved_config = checkpoint['data_meta'], checkpoint['config']
    if saved_meta != data_meta and not eval_only:
        differ = sorted(key for key in saved_meta.keys() | data_meta.keys()
                        if saved_meta.get(key) != data_meta.get(key))
        data_dir = os.path.join('data', config['dataset'])  # (train.py's config has no data_dir)
        raise SystemExit(f"train.py: {data_dir} is not the data {ckpt_path} was trained on "
                         f"(meta.json differs in {', '.join(differ)}); resume with "
                         f"--dataset={saved_config['dataset']} as it was prepared, {ELSEWHERE}")
    if saved_model_config != model_config:
        changed = [f.name for f in fields(GPTConfig)
                   if getattr(saved_model_config, f.name) != getattr(model_config, f.name)]
        raise SystemExit(f"train.py: the settings give a different model than {ckpt_path} "
                         f"({', '.join(changed)}); resume with the settings it was trained with")
    # a setting added to train.py since the checkpoint was written counts as unchanged
    keys = [key for key in config if key not in MAY_CHANGE_ON_RESUME
            and as_lists(saved_config.get(key, config[key])) != as_lists(config[key])]
    changed = [f"{key}={saved_config[key]!r} (now {config[key]!r})" for key in keys]
    for key, what in SEQUENCES:
        before, now = saved_config[key] * saved_config['batch_size'], config[key] * config['batch_size']
        if before != now:
            changed.append(f"{key} x batch_size = {before} sequences {what} (now {now})")
            keys += [key, 'batch_size']
    if changed and not eval_only:
        flags = ' '.join(dict.fromkeys(as_flag(key, saved_config[key]) for key in keys))
        raise SystemExit(f"train.py: {ckpt_path} was trained with other settings: {', '.join(changed)}; "
                         f"resume with the settings it was trained with ({flags}), {ELSEWHERE}")


# the other way out of a refused resume: never --overwrite=True, which deletes a run that is fine
ELSEWHERE = "or train with these in another --out_dir (--overwrite=True would delete this run)"


def as_flag(key, value):
    """A setting as train.py's command line takes it, ready to paste into a shell: a string as typed
    (--dtype=auto), any other value as a Python literal, in double quotes where the shell would read it
    ("--lr_scales=[['wte.weight',2]]")."""
    flag = f"--{key}={value if isinstance(value, str) else repr(as_lists(value)).replace(', ', ',')}"
    return flag if re.fullmatch(r'[\w.,=+:/-]*', flag) else f'"{flag}"'


def as_lists(value):
    """value with every tuple in it a list: a λ table or lr_scales is the same setting whether a config file
    wrote it with tuples or the command line with lists."""
    return [as_lists(item) for item in value] if isinstance(value, (list, tuple)) else value


def load_optimizer_state(optimizer, scaler, checkpoint, ckpt_path):
    try:
        optimizer.load_state_dict(checkpoint['optimizer'])
        scaler.load_state_dict(checkpoint['scaler'])
    except (ValueError, KeyError, RuntimeError) as e:
        raise SystemExit(f"train.py: the optimizer state in {ckpt_path} does not fit the model ({e}); "
                         f"start over with --overwrite=True") from None
