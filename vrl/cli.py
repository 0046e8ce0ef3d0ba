"""
The command line's rules, for every script: argparse that reports a bad argument in one line, no file
read whole from a pipe (it may wait forever for a writer), and a closed stdout (`| head`) or terminal no
error.
"""
import argparse
import errno
import os
import stat
import sys


class ClosedStdoutIgnored:
    """sys.stdout (or sys.stderr), but once its reader has gone, what is written is dropped instead of
    raising: BrokenPipeError when a pipe's reader has exited (`python train.py | head -3`), EIO when the
    terminal has (a dropped ssh session: train.py's SIGHUP stop still has to save). A training run goes
    on, and saves, without its console."""

    def __init__(self, stream):
        self.stream, self.closed_by_reader = stream, False

    def write(self, text):
        if not self.closed_by_reader:
            try:
                return self.stream.write(text)
            except OSError as error:
                self.reader_gone(error)
        return len(text)

    def flush(self):
        if not self.closed_by_reader:
            try:
                self.stream.flush()
            except OSError as error:
                self.reader_gone(error)

    def reader_gone(self, error):
        """Note that the reader has gone, if error says so; re-raise any other error (a full disk)."""
        if not (isinstance(error, BrokenPipeError) or error.errno == errno.EIO):
            raise error
        self.closed_by_reader = True

    def __getattr__(self, name):
        return getattr(self.stream, name)


def keep_going_without_stdout():
    """Install ClosedStdoutIgnored as sys.stdout and as sys.stderr (once each): a run's progress bar and
    messages go to stderr, which a closed terminal fails alike."""
    if not isinstance(sys.stdout, ClosedStdoutIgnored):
        sys.stdout = ClosedStdoutIgnored(sys.stdout)
    if not isinstance(sys.stderr, ClosedStdoutIgnored):
        sys.stderr = ClosedStdoutIgnored(sys.stderr)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument ends the script with one line ("prepare.py: problem; see `python
    prepare.py --help`") instead of the usage dump. Give prog, the script's path from the repository root
    (lab/reproduce.py): under a test, sys.argv[0] is pytest's."""

    def error(self, message):
        raise SystemExit(f"{os.path.basename(self.prog)}: {message}; see `python {self.prog} --help`")


def refuse_pipe(path, what, fix):
    """End the script with one line "{what} {path} is not a regular file ...; {fix}" if path is a pipe,
    socket or device: opening one to read waits for a writer, perhaps forever. The one rule for every file a
    script reads whole (config files, checkpoints, meta.json, a prompt), called before opening it; a path
    that is missing, a folder or unreadable is left to the open() that follows, which says which."""
    if file_kind(path) not in (None, 'a folder'):
        raise SystemExit(f"{what} {path} is not a regular file (a pipe or device may wait forever for a "
                         f"writer); {fix}")


def file_kind(path):
    """What path is where a file is wanted: 'a folder', 'a pipe (FIFO)', 'a device', 'a socket', or None for
    a regular file or a path that cannot be looked at (missing, say)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    kinds = ((stat.S_ISDIR, 'a folder'), (stat.S_ISFIFO, 'a pipe (FIFO)'), (stat.S_ISSOCK, 'a socket'))
    return next((kind for is_kind, kind in kinds if is_kind(mode)),
                None if stat.S_ISREG(mode) else 'a device')
