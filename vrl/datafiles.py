"""
The files prepare.py reads and writes. Its out_dir is rewritten whole, one run at a time, on a lock on
.<name>.lock beside it (locks.Lock says why the lock file stays, unless the run failed and left no out_dir).
The new files are written into out_dir/.partial/; only when they are complete is the old data swapped out:
its meta.json goes first and the new meta.json comes last, so a folder is either the old data, the new, or
(after a crash mid-swap) one without meta.json, which reads as unprepared. Files the script does not write
are left alone. A rerun with the same settings finds the folder already_prepared; big outputs are written
shard by shard (ShardWriter). jsonl_records reads a .jsonl corpus (yours, or SlimPajama's).
"""
import contextlib
import errno
import json
import os
import shutil

import numpy as np

from vrl import locks


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
        held = locks.hold(lock_path, script,
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
            fix = ("free space" if e.errno in (errno.ENOSPC, errno.EDQUOT)
                   else "raise the file size limit (`ulimit -f`)" if e.errno == errno.EFBIG
                   else "check the folder")
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


def jsonl_records(path, text_field):
    """The records of a .jsonl file, each checked to have a string text_field."""
    try:
        with open_text(path) as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise SystemExit(f"prepare.py: {path} line {line_number} is not JSON; "
                                     f"fix or remove it") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise SystemExit(f"prepare.py: {path} line {line_number} has no text field "
                                     f"{text_field!r}; name the field with --text_field=NAME")
                yield record
    except UnicodeDecodeError:
        raise SystemExit(f"prepare.py: {path} is not UTF-8 text; convert it to UTF-8") from None
    except OSError as e:
        raise SystemExit(f"prepare.py: cannot read {path} ({e.strerror}); check --input") from None


def open_text(path):
    """A UTF-8 text file, decompressed on the fly when it is .zst (as SlimPajama ships its files)."""
    if path.endswith(".zst"):
        import zstandard  # slimpajama.slimpajama_paths checked that it is installed
        return zstandard.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")
