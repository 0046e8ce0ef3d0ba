"""Tests for vrl's small parts: the lock (one holder, named when refused, freed when its holder is killed),
the one-line argparse errors, the mean per-domain losses, the reader thread's device, the gradient norms,
out-of-memory errors and a rank ended by its peer's failure; open_dataset's checks, settings.check, the
whole-checkpoint checksum and old checkpoints' names."""

import ast
import errno
import io
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

from test_train import TINY, run, workdir  # noqa: F401
from vrl import cli, data, hardware, locks, metrics, run_folder, settings

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
    assert other is None and json.loads(open(path + ".pid").read())["pid"] == os.getpid()
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


class FailingStream:
    """A stream whose every write and flush fails with error."""

    def __init__(self, error):
        self.error = error

    def write(self, text):
        raise self.error

    flush = write


def test_a_closed_pipe_or_terminal_is_dropped_and_other_write_errors_are_not():
    for gone in BrokenPipeError(errno.EPIPE, 'Broken pipe'), OSError(errno.EIO, 'Input/output error'):
        stream = cli.ClosedStdoutIgnored(FailingStream(gone))
        assert stream.write('step 1\n') == 7 and stream.closed_by_reader
        stream.flush()
    with pytest.raises(OSError, match='No space'):  # not the reader's going: a real error
        cli.ClosedStdoutIgnored(FailingStream(OSError(errno.ENOSPC, 'No space left'))).write('x')


# writes to its terminal (stdout and stderr) until the terminal is gone, then saves, as a training run's stop
# after a dropped ssh session must
AFTER_A_HANGUP = """import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from vrl import cli
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # train.py's: a stop, noted
cli.keep_going_without_stdout()
print('ready', flush=True)
for _ in range(40):
    print('step', flush=True)
    sys.stderr.write('progress\\n')
    time.sleep(0.05)
open(sys.argv[2], 'w').write('saved')
"""


# runs train.py (argv[1:]) with a Ctrl-C that lands inside tqdm as it first calls tqdm.std's WHERE: as it
# makes its write lock for train.py's first line, or as it starts drawing the progress bar
CTRL_C_IN_TQDM = """import os, runpy, signal, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import tqdm.std
owner, name = os.environ['WHERE'].split('.')
cls = getattr(tqdm.std, owner)
real = getattr(cls, name)
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
setattr(cls, name, staticmethod(interrupted) if isinstance(cls.__dict__[name], (staticmethod, classmethod))
        else interrupted)
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('where', ['TqdmDefaultWriteLock.__init__', 'tqdm._get_free_pos'])
def test_a_ctrl_c_while_tqdm_draws_the_first_lines_stops_in_one_line(workdir, where):
    """A Ctrl-C that lands inside tqdm as train.py draws its first line (tqdm then lets go of a lock it never
    took: a traceback under the stop's line) or its progress bar (a half-made bar whose __del__ fails) is
    held for the loop, which starts right after and stops at step 0: one line, exit 130, nothing saved."""
    script = workdir / 'ctrl_c_in_tqdm.py'
    script.write_text(CTRL_C_IN_TQDM)
    result = run([script, os.path.join(REPO, 'train.py'), *TINY, '--out_dir=out_ctrl_c_in_tqdm'], workdir,
                 check=False, env=dict(os.environ, WHERE=where))
    assert result.returncode == 130, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr and 'Exception ignored' not in result.stderr, result.stderr
    assert result.stdout.splitlines()[-1] == ('train.py: stopped by SIGINT at step 0; nothing new to save; no '
                                              'checkpoint written')
    assert not (workdir / 'out_ctrl_c_in_tqdm').exists()


@pytest.mark.skipif(not hasattr(os, 'openpty'), reason='needs a pseudo-terminal')
def test_a_run_whose_terminal_closes_keeps_going_and_saves(tmp_path):
    """An ssh session dropped mid-run closes the terminal: writes then fail with EIO, which the run drops
    as it drops a closed pipe's, and goes on to save."""
    terminal, its_end = os.openpty()
    process = subprocess.Popen([sys.executable, '-c', AFTER_A_HANGUP, REPO, tmp_path / 'saved'],
                               stdout=its_end, stderr=its_end, start_new_session=True)
    os.close(its_end)
    assert os.read(terminal, 100).startswith(b'ready')
    os.close(terminal)  # the session drops
    assert process.wait(timeout=60) == 0
    assert (tmp_path / 'saved').read_text() == 'saved'


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


def test_tf32_is_set_so_that_every_precision_getter_still_reads(monkeypatch):
    """On a GPU, train.py turns TF32 on in a way that leaves torch's generic getter readable: inductor's
    autotuning calls torch.get_float32_matmul_precision(), which raises on torch 2.9+ after the backend
    flag alone is set (mocked device: no GPU here)."""
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: None)
    monkeypatch.setattr(hardware, 'pick_device', lambda device, needs_gpu: 'cuda')
    before = torch.get_float32_matmul_precision()
    try:
        assert hardware.setup_device('cuda', 'float32', None, False, None)[1] == 'cuda'
        assert torch.get_float32_matmul_precision() == 'high'
        if hasattr(torch.backends.cuda.matmul, 'fp32_precision'):
            assert torch.backends.cuda.matmul.fp32_precision == 'tf32'
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before)


def train_py_statement(name):
    """train.py's statement that assigns name, as source: a line of the script tested where it runs."""
    with open(os.path.join(REPO, 'train.py')) as f:
        source = f.read()
    return next(ast.get_source_segment(source, node) for node in ast.parse(source).body
                if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == name for t in node.targets))


def test_the_reader_thread_sets_the_ranks_device_before_any_work(monkeypatch):
    """The thread that reads (and pins) training windows first sets the rank's CUDA device, as PyTorch's
    DataLoader pin thread does, or every rank would open a context on GPU 0 (mocked: no GPU here). The
    thread is train.py's own line, run here."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    calls = []
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(
        (device, threading.current_thread() is threading.main_thread())))
    statement = train_py_statement('reader')
    for device, device_type in (('cuda:3', 'cuda'), ('cpu', 'cpu')):
        scope = {'ThreadPoolExecutor': ThreadPoolExecutor, 'torch': torch, 'device': device,
                 'device_type': device_type}
        exec(statement, scope)
        with scope['reader'] as reader:
            assert reader.submit(lambda: 'read').result() == 'read'
        assert calls == [('cuda:3', False)]  # a CPU run's thread touches no CUDA device


def test_gradient_norms_are_each_parameters():
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    x = torch.randint(64, (2, 16))
    model(x, x).backward()
    norms = metrics.grad_norms(model)
    assert list(norms) == [n for n, p in model.named_parameters() if p.grad is not None]
    assert all(norms[n] == pytest.approx(p.grad.norm().item(), rel=1e-6) for n, p in model.named_parameters())


@pytest.mark.parametrize('ddp', [False, True])
def test_only_running_out_of_memory_is_reported_as_memory(tmp_path, monkeypatch, ddp):
    """An error in train.py's loop ends the rank through stops.end_rank: a GPU's OutOfMemoryError or the CPU
    allocator's "can't allocate memory" is one line about memory (under torchrun, in the rank's error
    file); any other RuntimeError (an ECC error, a busy device) keeps its own message and traceback."""
    from vrl import stops
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(tmp_path / 'error.json'))
    if not ddp:
        monkeypatch.delenv('TORCHELASTIC_ERROR_FILE')
    for error in (torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB\nmore'),
                  RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")):
        with pytest.raises(SystemExit) as stopped:
            stops.end_rank(error, ddp=ddp)
        first_line = str(error).splitlines()[0]
        line = (f"train.py: out of memory ({first_line}); lower batch_size (and raise "
                "gradient_accumulation_steps) or use a smaller model")
        if ddp:
            assert stopped.value.code == 1
            assert json.loads((tmp_path / 'error.json').read_text())['message']['message'] == line
        else:
            assert stopped.value.code == line
    with pytest.raises(RuntimeError, match='uncorrectable ECC error'):
        stops.end_rank(RuntimeError('CUDA error: uncorrectable ECC error encountered'), ddp=ddp)


@pytest.mark.parametrize('message', [
    'Connection closed by peer [127.0.0.1]:1234',  # gloo
    'NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error',
    'DistBackendError: NCCL communicator was aborted on rank 1.'])
def test_a_rank_ended_by_a_peers_failure_says_so_in_one_line(tmp_path, monkeypatch, message):
    """gloo's and NCCL's words for a collective whose peer failed become the one line 'stopped because
    another rank failed', in the rank's error file for torchrun's summary, stamped after the peer's."""
    from vrl import stops
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(tmp_path / 'error.json'))
    monkeypatch.setenv('RANK', '1')  # torchrun's
    with pytest.raises(SystemExit) as stopped:
        stops.end_rank(RuntimeError(message), ddp=True)
    assert stopped.value.code == 1
    error = json.loads((tmp_path / 'error.json').read_text())['message']
    assert error['message'] == 'train.py: rank 1 stopped because another rank failed'
    with pytest.raises(RuntimeError, match='an ordinary bug'):  # anything else keeps its traceback
        stops.end_rank(RuntimeError('an ordinary bug'), ddp=True)


def tiny_data(folder, vocab=3, **meta):
    """A char-level folder as prepare.py writes it: meta.json, train.bin (1,000 tokens), val.bin (300)."""
    import numpy as np
    folder.mkdir()
    tokens = {'train.bin': 1000, 'val.bin': 300}
    for name, count in tokens.items():
        (np.arange(count) % vocab).astype(np.uint16).tofile(folder / name)
    meta = {'tokenizer': 'char', 'vocab_size': vocab, 'chars': [chr(97 + i) for i in range(vocab)],
            'files': tokens, 'max_token': vocab - 1} | meta
    (folder / 'meta.json').write_text(json.dumps(meta))
    return str(folder)


def open_tiny(folder):
    return data.open_dataset(folder, block_size=8, seed=1, data_order='random', steps=10, global_batch=4,
                             eval_iters=2, batch_size=2, every_window=False)


def test_uint32_token_ids_with_a_meta_json_edited_to_match_are_refused(tmp_path):
    """Token ids written as uint32, meta.json's counts doubled to match their bytes: read as uint16 every
    other id is 0, which open_dataset refuses in one line instead of training on it."""
    import numpy as np
    folder = tmp_path / 'wide'
    folder.mkdir()
    tokens = {'train.bin': 1000, 'val.bin': 300}
    for name, count in tokens.items():
        (np.arange(count) % 3).astype(np.uint32).tofile(folder / name)
    (folder / 'meta.json').write_text(json.dumps({
        'tokenizer': 'char', 'vocab_size': 3, 'chars': ['a', 'b', 'c'], 'max_token': 2,
        'files': {name: 2 * count for name, count in tokens.items()}}))
    with pytest.raises(SystemExit) as refused:
        open_tiny(str(folder))
    assert refused.value.code == (
        f"prepare.py: the val data in {folder} has token id 0 at every odd place, as uint32 (or wider) token "
        f"ids read as prepare.py's uint16 do; run `python prepare.py --input=YOUR_CORPUS --out_dir={folder}` "
        f"again")


def test_a_ranks_own_data_error_is_printed_though_prepare_py_words_it(monkeypatch):
    """A rank other than 0 whose node lacks a data file ends before the loop with prepare.py's line: held
    while rank 0 might say it too, then printed, marked with the rank, rather than nowhere."""
    from vrl import stops
    monkeypatch.setattr(stops, 'LONE_FAILURE_WAIT', 0)
    monkeypatch.setattr(stops.signal, 'signal', lambda *args: None)
    monkeypatch.setenv('RANK', '1')
    terminal = io.StringIO()
    monkeypatch.setattr(sys, 'stderr', stops.Quiet(terminal))
    line = "prepare.py: data/x/train.bin not found; run `python prepare.py` again"
    sys.stderr.write(line + '\n')
    sys.stderr.say_a_lone_failure()
    assert terminal.getvalue() == f"[rank 1, before training] {line}\n"


def test_open_dataset_reads_a_prepared_folder(tmp_path):
    dataset = open_tiny(tiny_data(tmp_path / 'tiny'))
    assert dataset.meta['vocab_size'] == 3 and not dataset.by_domain and dataset.val_full == {}
    assert [len(shard) for shard in dataset.train] == [1000]
    assert len(dataset.val['val'][1]) == 2 * 2  # eval_iters x batch_size windows
    places = dataset.places(5, 4)
    assert len(places) == 4 and places == dataset.places(5, 4)  # the seed and the step alone
    assert dataset.prepare_command == f"python prepare.py --input=YOUR_CORPUS --out_dir={tmp_path / 'tiny'}"


def test_a_char_meta_json_whose_characters_disagree_with_its_vocabulary_is_refused(tmp_path):
    folder = tiny_data(tmp_path / 'tiny', chars=['a', 'b'])
    with pytest.raises(SystemExit) as refused:
        open_tiny(folder)
    assert refused.value.code == (f"prepare.py: {os.path.join(folder, 'meta.json')} lists 2 characters for a "
                                  f"vocabulary of 3 (damaged); run `python prepare.py --input=YOUR_CORPUS "
                                  f"--out_dir={folder}` again")


def test_an_unreadable_bin_file_is_said_in_one_line(tmp_path, monkeypatch):
    """A .bin without read permission (as root, which reads it anyway: a folder in its place) stops
    open_dataset with one line; so does any error the memory map meets opening it."""
    folder = tiny_data(tmp_path / 'tiny')
    path = os.path.join(folder, 'val.bin')
    again = f"run `python prepare.py --input=YOUR_CORPUS --out_dir={folder}` again"
    os.chmod(path, 0)
    try:
        with pytest.raises(SystemExit) as refused:
            if os.access(path, os.R_OK):  # root: permissions do not stop it
                os.remove(path)
                os.mkdir(path)
            open_tiny(folder)
    finally:
        if os.path.isfile(path):
            os.chmod(path, 0o644)
    if os.path.isdir(path):
        assert refused.value.code == (f"prepare.py: {path} is not a regular file (a folder, a pipe or a "
                                      f"device); {again}")
    else:
        assert refused.value.code == (f"prepare.py: {path} is unreadable (Permission denied); check its "
                                      f"permissions, or {again}")
    folder = tiny_data(tmp_path / 'other')
    path = os.path.join(folder, 'train.bin')

    def denied(name, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)

    monkeypatch.setattr(data.np, 'memmap', denied)
    with pytest.raises(SystemExit) as refused:
        open_tiny(folder)
    assert refused.value.code == (f"prepare.py: {path} is unreadable ({os.strerror(errno.EACCES)}); check its "
                                  f"permissions, or run `python prepare.py --input=YOUR_CORPUS "
                                  f"--out_dir={folder}` again")


def test_an_unreadable_data_folder_is_said_in_one_line(tmp_path, monkeypatch):
    """A data folder without read permission is said as such, not as a missing meta.json (as root, which
    reads it anyway, os.access answers as it would for another user)."""
    folder = tiny_data(tmp_path / 'tiny')
    os.chmod(folder, 0)
    try:
        if os.access(folder, os.R_OK | os.X_OK):  # root
            real_access = os.access
            monkeypatch.setattr(os, 'access', lambda path, mode, *args, **kwargs: False
                                if str(path) == folder else real_access(path, mode, *args, **kwargs))
        with pytest.raises(SystemExit) as refused:
            open_tiny(folder)
    finally:
        os.chmod(folder, 0o755)
    assert refused.value.code == (f"train.py: the data folder {folder} is unreadable (permission denied); "
                                  "check its permissions")


def train_settings(**changes):
    from testing import train_defaults
    return train_defaults() | changes


def test_settings_check_refuses_the_tasks_of_one_srun_step_without_torchrun(monkeypatch, capsys):
    """srun's step counts, not the allocation's: one python in a batch script of a 4-task allocation
    trains; 2 tasks of one srun step are refused by task 0 in one line that names a command for N nodes
    and the override, and task 1 ends quietly."""
    for name in 'RANK', 'SLURM_STEP_NUM_TASKS', 'SLURM_PROCID':
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('SLURM_NTASKS', '4')  # the batch script's allocation, no step
    settings.check(train_settings(), 1)
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '2')
    monkeypatch.setenv('SLURM_PROCID', '0')
    with pytest.raises(SystemExit) as refused:
        settings.check(train_settings(), 1)
    assert refused.value.code == (
        "train.py: 2 tasks in this srun step but no torchrun: each would train alone on GPU 0; on N nodes "
        "run `srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc_per_node=8 "
        "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 train.py ...` (docs/training.md), or, to "
        "train in one process on purpose, `SLURM_STEP_NUM_TASKS=1 python train.py ...`")
    monkeypatch.setenv('SLURM_PROCID', '1')
    with pytest.raises(SystemExit) as quiet:
        settings.check(train_settings(), 1)
    assert quiet.value.code == 1
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '1')  # the override
    settings.check(train_settings(), 1)
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '2')
    monkeypatch.setenv('RANK', '0')  # torchrun under srun: fine
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'job')
    settings.check(train_settings(), 1)
    assert capsys.readouterr().err == ''


def test_ranks_set_without_torchrun_are_refused_or_warned_in_one_line(monkeypatch, capsys):
    """RANK=0 WORLD_SIZE=2 from something other than torchrun: with nowhere to meet, refused in one line;
    with MASTER_ADDR and MASTER_PORT, rank 0 says in one line that it waits for the other rank."""
    for name in 'SLURM_STEP_NUM_TASKS', 'TORCHELASTIC_RUN_ID', 'MASTER_ADDR', 'MASTER_PORT', \
            'LOCAL_WORLD_SIZE':
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('RANK', '0')
    with pytest.raises(SystemExit) as refused:
        settings.check(train_settings(gradient_accumulation_steps=2), 2)
    assert refused.value.code == ("train.py: RANK=0 WORLD_SIZE=2 without MASTER_ADDR and MASTER_PORT: "
                                  "the ranks have nowhere to meet; launch with torchrun (docs/training.md)")
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', '29500')
    settings.check(train_settings(gradient_accumulation_steps=2), 2)
    assert capsys.readouterr().err == (
        "train.py: RANK=0 WORLD_SIZE=2 come from outside torchrun: rank 0 waits, silently, at "
        "127.0.0.1:29500 until all 2 ranks have started; Ctrl-C if they never will\n")
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'job')  # torchrun's: nothing to say
    settings.check(train_settings(gradient_accumulation_steps=2), 2)
    assert capsys.readouterr().err == ''


@pytest.fixture
def second_node(monkeypatch):
    """The environment torchrun gives a rank on node 1 of 2 (one rank each), GLOO_SOCKET_IFNAME unset,
    and a host name, node1, that resolves to 127.0.1.1 as Debian's /etc/hosts makes it."""
    monkeypatch.delenv('GLOO_SOCKET_IFNAME', raising=False)
    for name, value in dict(RANK='1', LOCAL_WORLD_SIZE='1', WORLD_SIZE='2', MASTER_PORT='29500').items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(settings.socket, 'gethostname', lambda: 'node1')
    real_getaddrinfo = settings.socket.getaddrinfo

    def getaddrinfo(host, *args):
        if host == 'nowhere':
            raise settings.socket.gaierror(settings.socket.EAI_NONAME, 'Name or service not known')
        return real_getaddrinfo('127.0.1.1' if host in ('node0', 'node1') else host, *args)
    monkeypatch.setattr(settings.socket, 'getaddrinfo', getaddrinfo)


def test_gloo_takes_the_interface_of_the_route_to_master_addr(second_node, monkeypatch):
    """A multi-node launch without GLOO_SOCKET_IFNAME: set to the interface of the route to MASTER_ADDR
    (here this machine's own, its address taken as node 0's), never the loopback the host name gives."""
    interfaces = settings.ipv4_interfaces()
    network = {name: address for name, address in interfaces.items()
               if not settings.is_loopback(address)}
    if not network:
        pytest.skip('this machine has no network interface with an IPv4 address')
    name, address = next(iter(network.items()))
    monkeypatch.setenv('MASTER_ADDR', address)
    settings.gloo_interface()
    assert os.environ['GLOO_SOCKET_IFNAME'] == name
    monkeypatch.setenv('GLOO_SOCKET_IFNAME', 'ib0')  # the user's choice stays
    settings.gloo_interface()
    assert os.environ['GLOO_SOCKET_IFNAME'] == 'ib0'


def test_gloo_on_a_host_name_that_resolves_to_loopback_is_set_or_refused(second_node, monkeypatch):
    """Node 0's own name resolves to 127.0.1.1, so its route to MASTER_ADDR is loopback: its one network
    interface serves; with two it cannot tell which, and says so in one line naming the variable. All
    "nodes" on one machine (MASTER_ADDR loopback): loopback. One node alone: nothing to set."""
    monkeypatch.setenv('MASTER_ADDR', 'node0')
    addresses = {'lo': '127.0.0.1', 'eth0': '192.0.2.2'}
    monkeypatch.setattr(settings, 'ipv4_interfaces', lambda: addresses)
    settings.gloo_interface()
    assert os.environ['GLOO_SOCKET_IFNAME'] == 'eth0'
    monkeypatch.delenv('GLOO_SOCKET_IFNAME')
    addresses['ib0'] = '10.0.0.2'
    with pytest.raises(SystemExit) as refused:
        settings.gloo_interface()
    assert refused.value.code == (
        "train.py: this host's name node1 resolves to loopback and the route to MASTER_ADDR=node0 names "
        "no network interface, so gloo would listen where no other node can reach it; set "
        "GLOO_SOCKET_IFNAME to the interface the nodes reach each other on (this node has: eth0, ib0)")
    monkeypatch.setenv('MASTER_ADDR', 'nowhere')  # a name that resolves to nothing: the same line
    with pytest.raises(SystemExit, match='MASTER_ADDR=nowhere names no network'):
        settings.gloo_interface()
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    settings.gloo_interface()
    assert os.environ['GLOO_SOCKET_IFNAME'] == 'lo'
    monkeypatch.delenv('GLOO_SOCKET_IFNAME')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')  # both ranks on this node
    settings.gloo_interface()
    assert 'GLOO_SOCKET_IFNAME' not in os.environ


# a rank of a two-node launch: its host name resolves to 127.0.1.1 (Debian's /etc/hosts), it names gloo's
# interface as train.py does, then all-reduces its rank over gloo (a 30 s timeout: a wrong address fails)
GLOO_RANK = """import os, socket, sys
from datetime import timedelta
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from vrl import settings
lookup = socket.getaddrinfo
socket.gethostname = lambda: 'node' + os.environ['RANK']
socket.getaddrinfo = lambda host, *a: lookup('127.0.1.1' if host.startswith('node') else host, *a)
settings.gloo_interface()
dist.init_process_group('gloo', timeout=timedelta(seconds=30))
total = dist.all_reduce(ones := dist.torch.ones(1)) or ones.item()
print(os.environ['RANK'], os.environ['GLOO_SOCKET_IFNAME'], total, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason='needs torch.distributed with gloo')
def test_two_simulated_nodes_whose_host_names_resolve_to_loopback_meet_over_gloo(tmp_path):
    """Two torchruns of one rank each, as two nodes start them, on one machine: each sets the interface
    of its route to MASTER_ADDR (loopback here, where both "nodes" are) and the two ranks all-reduce."""
    script = tmp_path / 'gloo_rank.py'
    script.write_text(GLOO_RANK)
    with socket.socket() as s:
        s.bind(('localhost', 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != 'GLOO_SOCKET_IFNAME'} | {'OMP_NUM_THREADS': '1'}
    nodes = [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nnodes=2',
                               '--nproc_per_node=1', f'--node_rank={node}', '--master_addr=localhost',
                               f'--master_port={port}', script, REPO], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for node in (0, 1)]
    outputs = [node.communicate(timeout=120)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    # each rank's own line (rank, interface, sum); torchrun's agent may log after it as the other node's
    # store goes away at the end (seen under load: "Failed to recv ... remote server shutdown")
    said = [[line for line in output.splitlines() if re.fullmatch(r'\d \S+ \d+\.\d+', line)]
            for output in outputs]
    assert said == [['0 lo 2.0'], ['1 lo 2.0']], outputs


def test_an_empty_or_unwritable_out_dir_is_named_in_one_line(tmp_path):
    """An empty out_dir and an existing folder that takes no file (/proc's, or a chmod'ed one where chmod
    binds) are said as such, not as a blank path or a lock held by an unknown process; eval_only, which
    writes nothing, may read a run in either."""
    with pytest.raises(SystemExit) as refused:
        settings.check_settings(train_settings(out_dir=''))
    assert refused.value.code == "train.py: out_dir=''; name the run's folder, e.g. --out_dir=out/run"
    folder = tmp_path / 'read_only'
    folder.mkdir()
    folder.chmod(0o555)
    unwritable = str(folder) if not os.access(folder, os.W_OK) else '/proc/1'  # root: chmod binds not
    with pytest.raises(SystemExit) as refused:
        settings.check_settings(train_settings(out_dir=unwritable))
    assert refused.value.code == (f"train.py: cannot write to {unwritable} (permission denied); pick another "
                                  f"--out_dir")
    settings.check_settings(train_settings(out_dir=unwritable, eval_only=True))
    settings.check_settings(train_settings(out_dir=str(tmp_path / 'new' / 'run')))


def test_settings_check_refuses_passes_that_do_not_split_over_the_ranks(monkeypatch):
    """gradient_accumulation_steps counts a step's passes over all ranks together (nanoGPT's meaning), so
    it must be a multiple of the world size."""
    monkeypatch.delenv('SLURM_STEP_NUM_TASKS', raising=False)
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'job')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
    settings.check(train_settings(gradient_accumulation_steps=4), 2)
    settings.check(train_settings(gradient_accumulation_steps=3), 1)
    with pytest.raises(SystemExit) as refused:
        settings.check(train_settings(gradient_accumulation_steps=3), 2)
    assert refused.value.code == (
        "train.py: gradient_accumulation_steps=3 passes a step do not split over 2 ranks; use a multiple "
        "of 2 (nanoGPT's meaning: all ranks together)")


def test_the_checksum_covers_every_field_not_only_the_tensors(tmp_path):
    """One checksum over the whole checkpoint: a flipped byte in a tensor or in any other field (a step, a
    setting) changes it, and load_checkpoint then refuses the file as damaged in one line; the old
    per-tensor checksums did not see the other fields."""
    import copy
    from model import GPT, GPTConfig
    from dataclasses import asdict
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    checkpoint = {'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 100,
                  'config': {'learning_rate': 2e-3, 'lr_scales': [['lm_head.weight', 0.5]]},
                  'data_meta': {'tokenizer': 'char', 'vocab_size': 64}}
    before = run_folder.checksum(checkpoint)
    assert before == run_folder.checksum(copy.deepcopy(checkpoint))
    for flip in (lambda c: c.update(iter_num=101), lambda c: c['config'].update(learning_rate=2e-2),
                 lambda c: c['config']['lr_scales'][0].__setitem__(1, 0.25),
                 lambda c: c['data_meta'].update(vocab_size=65)):
        changed = copy.deepcopy(checkpoint)
        flip(changed)
        assert run_folder.checksum(changed) != before
        assert run_folder.tensor_checksums(changed) == run_folder.tensor_checksums(checkpoint)
    changed = copy.deepcopy(checkpoint)
    weight = changed['model']['lm_head.weight']
    weight.view(-1).view(torch.int32)[7] ^= 1  # one bit of one weight
    assert run_folder.checksum(changed) != before
    checkpoint['checksum'] = before
    path = tmp_path / 'ckpt.pt'
    torch.save(checkpoint, path)
    assert run_folder.load_checkpoint(str(path))[1]['iter_num'] == 100
    checkpoint['iter_num'] = 101  # the checksum written before the flip
    torch.save(checkpoint, path)
    with pytest.raises(SystemExit) as damaged:
        run_folder.load_checkpoint(str(path))
    assert damaged.value.code.startswith(f"checkpoint {path} is damaged: it no longer matches the checksum")
    assert '\n' not in damaged.value.code


def test_an_old_checkpoints_names_map_to_todays(tmp_path):
    """A checkpoint of before the redesign: residual_source (0-based) is residual_from ('first', 'second'),
    tie_embeddings=False is dropped (True is no longer built), and the λ parameters' old names load."""
    from ablations import AblationConfig, build_model
    from dataclasses import asdict
    assert run_folder.current_args({'residual_source': 0, 'n_layer': 4}) == {'residual_from': 'first',
                                                                              'n_layer': 4}
    assert run_folder.current_args({'residual_source': 1, 'tie_embeddings': False}) == {
        'residual_from': 'second'}
    with pytest.raises(ValueError, match='tie_embeddings=True is no longer built'):
        run_folder.current_args({'tie_embeddings': True})
    config = AblationConfig(n_layer=4, n_head=2, n_embd=32, vocab_size=64, block_size=16,
                            variant='resformer_learnable', residual_from='second')
    model = build_model(config)
    old_args = {k: v for k, v in asdict(config).items() if k != 'residual_from'}
    old_args |= {'residual_source': 1, 'tie_embeddings': False}
    old_names = {'lambda_1': 'lambda_v1', 'lambda_2': 'lambda_vn', 'lambda_prime': 'lambda_logits'}
    state = {old_names.get(k, k): v for k, v in model.state_dict().items()}
    assert any(k in state for k in old_names.values())
    path = tmp_path / 'old.pt'
    torch.save({'model': state, 'model_args': old_args, 'data_meta': {'tokenizer': 'char'}}, path)
    loaded, _ = run_folder.load_checkpoint(str(path))
    assert loaded.config == config
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
