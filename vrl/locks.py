"""
One writer per folder: an exclusive file lock the OS releases when its holder dies (even by SIGKILL),
the same on Linux, macOS and Windows. train.py holds out_dir/.lock, prepare.py .<out_dir>.lock,
lab/reproduce.py one per run.
"""
import contextlib
import errno
import os

import filelock  # installed with torch: flock on Linux and macOS, msvcrt on Windows


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
