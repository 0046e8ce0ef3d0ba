"""Tests for vrl's small parts: the lock (one holder, named when refused, freed when its holder is killed),
the one-line argparse errors, the mean per-domain losses."""

import errno
import os
import subprocess
import sys

import pytest

from vrl import cli, hardware, locks, metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

# holds argv[1]'s lock in a process of its own, says so, and waits to be killed
HOLDER = """import sys, time
sys.path.insert(0, sys.argv[2])
from vrl import locks
held, _ = locks.try_lock(sys.argv[1], "holder")
print("held" if held else "refused", flush=True)
time.sleep(120)
"""


def other_process(path):
    """A process that takes path's lock or is refused, says which ("held", "refused"),
    and waits for a kill."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, path, REPO], stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def ended(process):
    process.kill()  # SIGKILL: it does no cleanup of its own
    process.wait()


def test_the_lock_refuses_a_second_holder_names_it_and_is_freed_by_sigkill(tmp_path):
    path = str(tmp_path / "run.lock")
    holder, said = other_process(path)
    try:
        assert said == "held"
        assert locks.try_lock(path, "test.py") == (None, f"process {holder.pid}")
        with pytest.raises(SystemExit) as refused:
            locks.hold(path, "test.py", lambda who: f"{who} holds it; wait")
        assert refused.value.code == f"test.py: process {holder.pid} holds it; wait"
    finally:
        ended(holder)
    held, other = locks.try_lock(path, "test.py")
    assert other is None and open(path + ".pid").read() == f"{os.getpid()}\n"
    process, said = other_process(path)
    ended(process)
    assert said == "refused"
    held.release()
    assert not os.path.exists(path + ".pid")
    process, said = other_process(path)
    ended(process)
    assert said == "held"


def test_one_holder_per_process_too(tmp_path):
    path = str(tmp_path / "run.lock")
    held, _ = locks.try_lock(path, "test.py")
    assert locks.try_lock(path, "test.py") == (None, f"process {os.getpid()}")
    held.release(remove=True)
    assert os.listdir(tmp_path) == []
    again, _ = locks.try_lock(path, "test.py")
    again.release()


def test_a_file_system_without_flock_is_named_in_one_line(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")

    def no_flock(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)  # as Lustre mounted without -o flock answers
    with pytest.raises(SystemExit) as error:
        locks.try_lock(str(tmp_path / "run.lock"), "train.py")
    assert error.value.code == (f"train.py: the file system of {tmp_path} has no file locks (flock: ENOSYS, "
                                f"as on Lustre mounted without -o flock); use a folder on one that has them "
                                f"(a local disk, or Lustre mounted with -o flock)")


def test_argument_errors_are_one_line():
    parser = cli.ArgumentParser(prog="tool.py")
    parser.add_argument("--seeds", type=int)
    with pytest.raises(SystemExit) as error:
        parser.parse_args(["--seeds=abc"])
    assert error.value.code == ("tool.py: argument --seeds: invalid int value: 'abc'; "
                                "see `python tool.py --help`")


def test_refuse_pipe_refuses_a_pipe_and_leaves_the_rest_to_open(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SystemExit) as refused:
        cli.refuse_pipe(str(tmp_path / "pipe"), "test.py: the file", "save it as a file")
    assert refused.value.code == (f"test.py: the file {tmp_path / 'pipe'} is not a regular file (a pipe or "
                                  f"device may wait forever for a writer); save it as a file")
    (tmp_path / "file").write_text("x")
    for path in ("file", "missing", "."):  # open() says what is wrong with a missing path or a folder
        cli.refuse_pipe(str(tmp_path / path), "test.py: the file", "save it as a file")


def test_check_fits_names_what_does_not_fit_in_one_line():
    have = hardware.memory_bytes("cpu")
    assert have > 2 ** 20  # the machine's RAM
    hardware.check_fits(2 ** 20, "cpu", "test.py: a job", "make it smaller")
    with pytest.raises(SystemExit) as refused:
        hardware.check_fits(10 * have, "cpu", "test.py: a job", "make it smaller")
    assert refused.value.code == (f"test.py: a job needs at least {10 * have / 1e9:,.3g} GB: it does not fit "
                                  f"in the {have / 1e9:,.3g} GB of RAM for cpu; make it smaller")


def test_per_domain_losses_average_every_run_or_none():
    """analyze.py's groups of checkpoints and reproduce.py's groups of runs share the rule: a run without
    per-domain losses (a single corpus, an older train.py) leaves its group without their means."""
    scored = [{'Github': 1.0, 'C4': 3.0}, {'C4': 2.0, 'Github': 2.0}]
    assert list(metrics.mean_domain_losses(scored).items()) == [('C4', 2.5), ('Github', 1.5)]
    assert metrics.mean_domain_losses(scored + [None]) is None and metrics.mean_domain_losses([]) is None
