"""
A run's out_dir and its checkpoints (RunFolder): never overwritten by accident, one writer at a time,
what a kill left tidied, checkpoints written atomically, the log cut back on resume; and reading a
checkpoint back (load_checkpoint), resuming only with the data and settings it was trained with
(check_resume).
"""
import contextlib
import errno
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
from dataclasses import fields

import torch

from ablations import AblationConfig as GPTConfig, build_model
from vrl import cli, locks


RUN_FILES = ('ckpt.pt', 'best.pt', 'log.jsonl')  # what a run writes to out_dir


class RunFolder:
    """out_dir and the files a run writes there (RUN_FILES). Only the process that writes (writes=True: rank
    0, unless eval_only) saves and logs."""

    def __init__(self, out_dir, writes, wandb=None, saves=True):
        self.out_dir, self.writes, self.wandb = out_dir, writes, wandb
        self.saves = saves  # False (save_checkpoint=False): never write ckpt.pt or best.pt
        self.ckpt_path, self.best_path, self.log_path = (os.path.join(out_dir, name) for name in RUN_FILES)
        self.saved_step = None  # the step of the last good checkpoint, once there is one
        self.lock, self.made_out_dir = None, False

    def check_can_start(self, init_from, overwrite, eval_only):
        """Before anything touches it: out_dir is a folder, holds no run unless told what to do with it, and
        can be made and written to. Not for eval_only, the one run that writes nothing."""
        if eval_only:
            return
        if os.path.exists(self.out_dir) and not os.path.isdir(self.out_dir):
            raise SystemExit(f"train.py: out_dir={self.out_dir} is a file, not a folder; "
                             f"pick another --out_dir")
        existing = [name for name in RUN_FILES if os.path.exists(os.path.join(self.out_dir, name))]
        if existing and init_from == 'scratch' and not overwrite:
            raise SystemExit(f"train.py: {self.out_dir} already holds a run ({', '.join(existing)}); "
                             f"continue it with --init_from=resume, or start over with --overwrite=True "
                             f"(deletes it), or pick another --out_dir")
        # a resume reads the log whole, to cut it back to the checkpoint's step
        cli.refuse_pipe(self.log_path, "train.py: the run's log", "remove it, or replace it with a file")
        writable = self.out_dir
        while not os.path.exists(writable):  # the folder that will hold out_dir once it is made
            writable = os.path.dirname(os.path.abspath(writable))
        try:
            tempfile.TemporaryFile(dir=writable).close()
        except OSError as e:
            raise SystemExit(f"train.py: cannot write to {writable} ({e.strerror}); "
                             f"pick another --out_dir") from None

    def take(self, overwrite, resumed_step):
        """Make out_dir and hold out_dir/.lock while this process lives, so a second run into it is refused
        (one that dies, even by SIGKILL, lets go: locks.hold); remove the half-written files of a killed
        run; then delete the old run (overwrite) or, resuming from resumed_step, cut the log back to what it
        said up to the checkpoint (its evaluation is repeated, so not its val record). Only the writer."""
        if not self.writes:
            return
        try:
            self.made_out_dir = not os.path.isdir(self.out_dir)
            os.makedirs(self.out_dir, exist_ok=True)
            self.lock = locks.hold(os.path.join(self.out_dir, '.lock'), 'train.py', self.refusal)
            self.remove_half_written_files()
            if overwrite:
                for name in RUN_FILES:
                    if os.path.exists(os.path.join(self.out_dir, name)):
                        os.remove(os.path.join(self.out_dir, name))
            if resumed_step is not None and os.path.exists(self.log_path):
                with open(self.log_path, 'rb') as f:  # bytes: a line that is not UTF-8 is no record
                    kept = [line for line in f if is_record_before(line, resumed_step)]
                with open(self.log_path + '.tmp', 'wb') as f:
                    f.writelines(kept)
                os.replace(self.log_path + '.tmp', self.log_path)
        except OSError as e:
            raise SystemExit(f"train.py: cannot write to {self.out_dir} ({e}); "
                             f"pick another --out_dir") from None

    def let_go(self):
        """At the end of the run, whatever ended it: let go of out_dir's lock. A run that wrote nothing
        there, in an out_dir it made (a start refused partway), leaves no trace: the lock files and the
        folder go too."""
        if self.lock is None:
            return
        empty = self.made_out_dir and not any(os.path.exists(os.path.join(self.out_dir, name))
                                              for name in RUN_FILES)
        self.lock.release(remove=empty)
        self.lock = None
        if empty:
            with contextlib.suppress(OSError):  # not empty after all: leave it
                os.rmdir(self.out_dir)

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

    def save(self, checkpoint, best):
        """Write ckpt.pt, and best.pt too when best, from one serialization: each atomically (a crash
        mid-write leaves the previous file intact), best.pt first (a kill between the two repeats that
        evaluation on resume), and best.pt as a second name of the same file where the filesystem has hard
        links, else a copy. Nothing with saves=False."""
        if not self.saves:
            return
        written = self.ckpt_path + '.tmp'
        try:
            if os.path.lexists(written):  # a killed save's, perhaps linked to best.pt: never write through it
                os.remove(written)
            checkpoint['checksums'] = checksums(checkpoint)  # checked when it is read (load_checkpoint)
            torch.save(checkpoint, written)
            if best:
                link_or_copy(written, self.best_path + '.tmp')
                os.replace(self.best_path + '.tmp', self.best_path)
            os.replace(written, self.ckpt_path)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            full = is_disk_full(e)
            for partial in (written, self.best_path + '.tmp'):  # gone now, not at the next start
                with contextlib.suppress(OSError):
                    os.remove(partial)
            self.cannot_write(self.ckpt_path, e, full)
        self.saved_step = checkpoint['iter_num']

    def save_at_stop(self, checkpoint, nonfinite, how):
        """After a stop signal, save the step the run stopped at (checkpoint() gives it) unless its loss had
        become NaN or inf, and say so in one line."""
        if not self.writes:
            return
        state = checkpoint()
        if not self.saves:
            outcome = "nothing saved (save_checkpoint=False)"
        elif nonfinite.seen():
            outcome = f"the loss had become NaN or inf, so nothing saved; {self.kept()}"
        else:
            self.save(state, best=False)
            outcome = f"saved {self.ckpt_path}; continue with --init_from=resume and the same settings"
        print(f"train.py: {how} at step {state['iter_num']}; {outcome}", file=sys.stderr)

    def log(self, record):
        """Append record to log.jsonl (and wandb)."""
        if self.writes:
            try:  # a record cut short by a full disk is skipped on resume, like one cut by a kill
                with open(self.log_path, 'a') as f:
                    f.write(json.dumps(record) + '\n')
            except OSError as e:
                self.cannot_write(self.log_path, e, is_disk_full(e))
            if self.wandb:
                self.wandb.log(record, step=record['step'])

    def kept(self):
        """What a run that stops now leaves, for the line that says why it stopped."""
        return (f"{self.ckpt_path} (step {self.saved_step}) is the last good checkpoint"
                if self.saved_step is not None else "no checkpoint written")

    def cannot_write(self, path, error, full=False):
        why = "no space left on device" if full else f"{type(error).__name__}: {error}"
        raise SystemExit(f"train.py: cannot write {path} ({why}); free disk space or fix out_dir, "
                         f"{self.kept()}") from None


def is_record_before(line, step):
    """Whether a line of log.jsonl is a record of a step before step, or step's training record: what a run
    resumed at step keeps. A line cut by a kill or a full disk, or not a record, is not."""
    try:
        record = json.loads(line)
        return record['step'] < step or (record['step'] == step and 'val_loss' not in record)
    except (ValueError, TypeError, KeyError):
        return False


def is_disk_full(error):
    """Whether a write failed for want of space: an OSError's ENOSPC or EDQUOT, or what torch.save's zip
    writer says of it (a RuntimeError 'unexpected pos', or 'file write failed')."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(words in str(error) for words in ('unexpected pos', 'file write failed', 'No space left'))


def checksums(checkpoint):
    """CRC-32 of each tensor's bytes in a checkpoint (the weights, the optimizer's moments, ...), in the order
    the checkpoint holds them: recorded when it is written, compared when it is read, so that a flipped byte
    in ckpt.pt stops a resume instead of training on. About 0.4 s a GB on one core (docs/training.md)."""
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
    def as_bytes(tensor):  # a flat copy where the tensor is strided (a 1-element slice may have stride 2)
        flat = tensor.detach().reshape(-1).cpu()
        if flat.numel() and flat.stride(0) != 1:
            flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
        return flat.view(torch.uint8).numpy()
    return [zlib.crc32(as_bytes(t)) for t in tensors(checkpoint)]


def link_or_copy(source, target):
    if os.path.lexists(target):
        os.remove(target)
    try:
        os.link(source, target)
    except OSError:  # no hard links here (some network and FUSE filesystems)
        shutil.copyfile(source, target)


def resume(run, model_config, config, data_meta, eval_only):
    """(model, checkpoint) of run's ckpt.pt, checked to continue exactly (check_resume) before anything
    touches out_dir; run then knows the checkpoint's step as its last good one."""
    model, checkpoint = load_checkpoint(run.ckpt_path)
    check_resume(checkpoint, run.ckpt_path, model.config, model_config, config, data_meta, eval_only)
    broken = next((name for name, w in model.state_dict().items()
                   if w.is_floating_point() and not torch.isfinite(w).all()), None)
    if broken and not eval_only:
        raise SystemExit(f"train.py: {run.ckpt_path} holds NaN or inf weights ({broken}), so it cannot be "
                         f"resumed; start over with --overwrite=True, or resume from a copy of best.pt")
    run.saved_step = checkpoint['iter_num']
    checkpoint.setdefault('last_eval', None)  # written by a train.py before it was saved
    return model, checkpoint


def load_checkpoint(path, device='cpu', model_type=build_model):
    """(model, checkpoint) from a checkpoint of train.py; a missing, damaged or piped file exits with one
    line. model_type: the class to build (analyze.py's AblationGPT records statistics)."""
    cli.refuse_pipe(path, "checkpoint", "point to a checkpoint file written by train.py")
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
    if 'checksums' in checkpoint and checksums(checkpoint) != checkpoint['checksums']:  # older: none
        raise SystemExit(f"checkpoint {path} is damaged: its tensors no longer match the checksums written "
                         "with them (a flipped byte on disk or in a copy); use another checkpoint")
    if 'data_meta' not in checkpoint:  # what sample.py, eval.py and analyze.py read its text with
        raise SystemExit(f"checkpoint {path} has no data_meta, so the tokenizer its text needs is unknown; "
                         "point to a checkpoint written by train.py")
    try:
        model = model_type(GPTConfig(**checkpoint['model_args']))
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


# The settings a resumed run may change: where it writes and what it reports, the device it runs on and the
# memory it takes (micro_batch_size: the same batches), and where it stops (max_iters, on purpose). Every
# other one shapes the batches, the update or the numbers the run compares (eval_iters: best_val_loss), so it
# must match the checkpoint's; so must the data (its meta.json).
MAY_CHANGE_ON_RESUME = ('out_dir', 'init_from', 'overwrite', 'save_checkpoint', 'eval_interval',
                        'log_interval', 'eval_only', 'wandb_log', 'wandb_project', 'wandb_run_name',
                        'log_grad_norms', 'dataset', 'data_dir', 'max_iters', 'device', 'compile',
                        'peak_tflops', 'micro_batch_size')


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
        raise SystemExit(f"train.py: {config['data_dir']} is not the data {ckpt_path} was trained on "
                         f"(meta.json differs in {', '.join(differ)}); resume with "
                         f"--dataset={saved_config['dataset']} as it was prepared, or start over with "
                         f"--overwrite=True")
    if saved_model_config != model_config:
        changed = [f.name for f in fields(GPTConfig)
                   if getattr(saved_model_config, f.name) != getattr(model_config, f.name)]
        raise SystemExit(f"train.py: the settings give a different model than {ckpt_path} "
                         f"({', '.join(changed)}); resume with the settings it was trained with")
    # a setting added to train.py since the checkpoint was written counts as unchanged
    changed = [f"{key}={saved_config[key]!r} (now {config[key]!r})" for key in config if key not in
               MAY_CHANGE_ON_RESUME and as_lists(saved_config.get(key, config[key])) != as_lists(config[key])]
    if changed and not eval_only:
        raise SystemExit(f"train.py: {ckpt_path} was trained with other settings: {', '.join(changed)}; "
                         f"resume with the settings it was trained with, or start over with --overwrite=True")


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
