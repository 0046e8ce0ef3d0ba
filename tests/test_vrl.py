"""Tests for vrl's small parts: the lock (one holder, named when refused, freed when its holder is killed),
the one-line argparse errors, the mean per-domain losses, the reader thread's device, the timed update at
rate 0, the gradient norms, out-of-memory errors and a rank ended by its peer's failure."""

import errno
import json
import os
import subprocess
import sys

import pytest
import torch

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


def test_the_reader_thread_sets_the_ranks_device_before_any_work(monkeypatch):
    """The thread that reads (and pins) training windows first sets the rank's CUDA device, as PyTorch's
    DataLoader pin thread does, or every rank would open a context on GPU 0 (mocked: no GPU here)."""
    import threading
    calls = []
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(
        (device, threading.current_thread() is threading.main_thread())))
    with hardware.reader_thread('cuda:3') as reader:
        assert reader.submit(lambda: 'read').result() == 'read'
    assert calls == [('cuda:3', False)]
    with hardware.reader_thread('cpu') as reader:
        reader.submit(lambda: None).result()
    assert calls == [('cuda:3', False)]  # a CPU run's thread touches no CUDA device


@pytest.mark.parametrize('muon', [False, True])
def test_a_zero_rate_update_changes_no_weight_and_leaves_no_state(muon):
    """The cost estimate times one update at rate 0 on zeroed gradients: the weights stay bit for bit,
    clear_state forgets the moments it made, and the next update equals a fresh optimizer's first."""
    from model import GPT, GPTConfig
    from vrl import optim
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16,
                          variant='resformer_learnable'))
    twin = GPT(model.config)
    twin.load_state_dict(model.state_dict())
    make = lambda m: optim.configure_optimizers(m, 0.1, 1e-2, (0.9, 0.95), 'cpu',
                                                muon=(0.02, 'original') if muon else None)
    optimizer, fresh = make(model), make(twin)
    x = torch.randint(64, (2, 16))
    model(x, x)[1].backward()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optim.zero_rate_step(optimizer)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optim.has_state(optimizer) and all(p.grad.abs().sum() == 0 for p in model.parameters())
    optim.clear_state(optimizer)
    assert not optim.has_state(optimizer)
    for m, o in ((model, optimizer), (twin, fresh)):
        o.zero_grad()
        m(x, x)[1].backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))


def test_gradient_norms_are_each_parameters():
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    x = torch.randint(64, (2, 16))
    model(x, x)[1].backward()
    norms = metrics.grad_norms(model)
    assert list(norms) == [n for n, p in model.named_parameters() if p.grad is not None]
    assert all(norms[n] == pytest.approx(p.grad.norm().item(), rel=1e-6) for n, p in model.named_parameters())


def test_only_running_out_of_memory_is_reported_as_memory():
    """A GPU's OutOfMemoryError or the CPU allocator's "can't allocate memory" is one line about memory;
    any other RuntimeError (an ECC error, a busy device) keeps its own message and traceback."""
    for error in (torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB'),
                  RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")):
        with pytest.raises(SystemExit, match='^train.py: the model does not fit in cuda:0 memory'):
            with hardware.memory_error_in_one_line('cuda:0'):
                raise error
    with pytest.raises(RuntimeError, match='uncorrectable ECC error'):
        with hardware.memory_error_in_one_line('cuda:0'):
            raise RuntimeError('CUDA error: uncorrectable ECC error encountered')


@pytest.mark.parametrize('message', [
    'Connection closed by peer [127.0.0.1]:1234',  # gloo
    'NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error',
    'DistBackendError: NCCL communicator was aborted on rank 1.'])
def test_a_rank_ended_by_a_peers_failure_says_so_in_one_line(tmp_path, monkeypatch, message):
    """gloo's and NCCL's words for a collective whose peer failed become the one line 'stopped because
    another rank failed', in the rank's error file for torchrun's summary, stamped after the peer's."""
    from vrl import stops
    monkeypatch.setenv('TORCHELASTIC_ERROR_FILE', str(tmp_path / 'error.json'))
    with pytest.raises(SystemExit) as stopped:
        stops.end_rank(RuntimeError(message), ddp=True, rank=1)
    assert stopped.value.code == 1
    error = json.loads((tmp_path / 'error.json').read_text())['message']
    assert error['message'] == 'train.py: rank 1 stopped because another rank failed'
    with pytest.raises(RuntimeError, match='an ordinary bug'):  # anything else keeps its traceback
        stops.end_rank(RuntimeError('an ordinary bug'), ddp=True, rank=1)
