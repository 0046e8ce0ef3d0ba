"""
One writer per folder: an exclusive file lock the OS releases when its holder dies (even by SIGKILL),
the same on Linux, macOS and Windows, and beside it <path>.pid, made only where it is absent, naming the
holder's host, pid and SLURM job. train.py holds out_dir/.lock, prepare.py .<out_dir>.lock,
lab/reproduce.py one per run.

The two together, because shared file systems bend flock: on Lustre mounted with -o localflock it locks
one node only (two jobs on two nodes would both hold it), and on NFS a dead node's lock lives on until its
lease lapses. The .pid file, made with O_EXCL, is one holder across nodes; a batch job retries a lock held
from another host for a while (LOCK_WAIT); and one whose holder is gone from another host is broken by hand:
    python -m vrl.locks break out/.lock
"""
import contextlib
import errno
import json
import os
import socket
import sys
import time

import filelock  # installed with torch: flock on Linux and macOS, msvcrt on Windows

HOST = socket.gethostname()
# seconds a SLURM job retries a lock held from another host before it gives up (a requeued job can start
# before the NFS or Lustre lock of its dead node has lapsed); none elsewhere: a person is there to see it
LOCK_WAIT = 300 if 'SLURM_JOB_ID' in os.environ else 0
RETRY_EVERY = 5  # seconds between tries


class Lock:
    """An exclusive lock on a file, held by this process until release() or its end. The OS lets go of the
    lock of a process that dies, even by SIGKILL, so a killed run never leaves it stuck; the .pid file it
    leaves is taken over by the next holder on its host (see claim).

    On Linux and macOS the lock file stays after release, as filelock keeps it: a run that opened it just
    before it was removed could lock a file no longer there while the next run locks a new one, and both
    would write."""

    def __init__(self, path, lock):
        self.path, self.pid_path, self.lock = path, path + ".pid", lock

    def release(self, remove=False):
        """Let go; remove=True also removes the lock file (while still held), from a folder about to go."""
        with contextlib.suppress(OSError):  # gone already, or its folder no longer writable
            os.remove(self.pid_path)
        if remove:
            # Windows refuses to remove an open file; there filelock removes it on release
            with contextlib.suppress(OSError):
                os.remove(self.path)
        # an unlock that fails (the folder's file system gone, an NFS handle gone stale) is left to the OS,
        # which lets go of the lock when the process ends: a run's end does not fail over it
        with contextlib.suppress(OSError):
            self.lock.release()


def me():
    """This process, as a .pid file records it."""
    return {'host': HOST, 'pid': os.getpid(), 'job': os.environ.get('SLURM_JOB_ID'),
            'restart': int(os.environ.get('SLURM_RESTART_COUNT', '0') or 0)}


def owner(pid_path):
    """The holder a .pid file names ({'host', 'pid', 'job', 'restart'}), {'pid': 1234} for one an older
    train.py wrote (its pid alone), or None: missing, or not written yet."""
    try:
        with open(pid_path) as f:
            text = f.read()
        left = json.loads(text)
        return left if isinstance(left, dict) and 'pid' in left else {'pid': int(left)}
    except (OSError, ValueError, TypeError):
        return None


def describe(left):
    """'process 1234', with 'on host node7' where that is not this host."""
    if left is None:
        return "process unknown"
    host = left.get('host')
    return f"process {left['pid']}" + (f" on host {host}" if host and host != HOST else "")


def gone(left):
    """Why the holder a .pid file names has ended, given that this process holds the flock; None where it
    may live on. flock is sure on one host; a SLURM job runs once at a time, so a requeued one's earlier
    run (a lower restart count) has ended wherever it ran."""
    if left.get('host') in (None, HOST):
        return "a process on this host that has ended"
    if left.get('job') and left['job'] == os.environ.get('SLURM_JOB_ID') \
            and left.get('restart', 0) < me()['restart']:
        return f"an earlier run of this SLURM job (job {left['job']}, requeued)"
    return None


def claim(pid_path, script):
    """Make pid_path, naming this process, only where it is absent (O_EXCL: one holder across nodes, where
    flock locks one node alone); one left by a holder that is gone (gone()) is taken over, with one line that
    says so. None once claimed, else the holder that keeps it ("process 1234 on host node7")."""
    for _ in range(2):
        try:
            fd = os.open(pid_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            left = owner(pid_path)
            why = left and gone(left)
            if not why:
                return describe(left)
            print(f"{script}: {pid_path} names {describe(left)}, {why}; taking its lock over",
                  file=sys.stderr)
            with contextlib.suppress(FileNotFoundError):
                os.remove(pid_path)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me()) + "\n")
        return None
    return describe(owner(pid_path))  # another process claimed it in between


def file_lock(path):
    """filelock's exclusive lock on path, tried once (no waiting)."""
    try:  # filelock 4 would fall back to a marker file, which a run killed on another machine leaves held
        return filelock.FileLock(path, timeout=0, fallback_to_soft=False)
    except TypeError:  # filelock 3: no such argument, and no fallback (it raises NotImplementedError)
        return filelock.FileLock(path, timeout=0)


def try_lock(path, script):
    """(Lock, None) when this process now holds path (made if missing); (None, "process 1234") naming the
    process that holds it otherwise ("process 1234 on host node7" on another host, "process unknown" when
    its .pid file is not written yet). A file system without file locks (flock fails with ENOSYS: Lustre
    mounted without -o flock, say) ends script with one line that says so; an OSError of the folder
    (read-only, missing) is the caller's to report."""
    path = os.path.abspath(path)  # the pid file is removed from the same place if the working folder changes
    lock = file_lock(path)
    try:
        lock.acquire()
    except filelock.Timeout:
        return None, describe(owner(path + ".pid"))
    except (NotImplementedError, OSError) as e:
        if isinstance(e, OSError) and e.errno != errno.ENOSYS:
            raise
        raise SystemExit(f"{script}: the file system of {os.path.dirname(path)} has no file "
                         f"locks (flock: ENOSYS, as on Lustre mounted without -o flock); use a folder on one "
                         f"that has them (a local disk, or Lustre mounted with -o flock)") from None
    try:
        holder = claim(path + ".pid", script)
    except BaseException:
        lock.release()
        raise
    if holder is not None:
        lock.release()
        return None, holder
    return Lock(path, lock), None


def hold(path, script, refusal, wait=None):
    """try_lock; where another process holds path, script ends with the one line
    f"{script}: {refusal(holder)}", holder naming that process ("process 1234"). A holder on this host is
    refused at once (flock is sure there); one on another host, or none named, is retried for up to wait
    seconds (LOCK_WAIT by default), with one line that says so, and then refused with how to break the
    lock."""
    wait = LOCK_WAIT if wait is None else wait
    deadline, said = time.monotonic() + wait, False
    while True:
        held, other = try_lock(path, script)
        if held:
            return held
        left = owner(os.path.abspath(path) + ".pid")
        elsewhere = left is None or left.get('host', HOST) != HOST
        if not elsewhere or time.monotonic() >= deadline:
            raise SystemExit(f"{script}: {refusal(other)}" + (
                f" (if that process is gone, its node down, break the lock with `python -m vrl.locks break "
                f"{path}`)" if elsewhere else ""))
        if not said:
            print(f"{script}: {path} is held by {other}; retrying for up to {wait:.0f} s (a dead node's "
                  f"lock lapses with its lease)", file=sys.stderr)
            said = True
        time.sleep(min(RETRY_EVERY, max(deadline - time.monotonic(), 0)))


def break_lock(path):
    """Remove path and its .pid file, for a holder the user knows is gone: refused while a process on this
    host holds it (flock is sure there). A next run then locks a new file."""
    path = os.path.abspath(path)
    lock = file_lock(path)
    try:
        lock.acquire()
        lock.release()
    except filelock.Timeout:
        left = owner(path + ".pid")
        if left is not None and left.get('host', HOST) == HOST:
            raise SystemExit(f"locks.py: {describe(left)} on this host holds {path} and is running; "
                             f"stop it first") from None
    for name in (path + ".pid", path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
    print(f"locks.py: removed {path} and {path}.pid")


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] != 'break':
        raise SystemExit("locks.py: usage: python -m vrl.locks break PATH_OF_THE_LOCK (e.g. out/.lock)")
    break_lock(sys.argv[2])
