"""
How a run stops. StopSignals: Ctrl-C or a scheduler's SIGTERM saves a checkpoint at a step boundary,
every rank stopping together and waiting for rank 0's save, and errors under torchrun as one line.
NonFinite: a NaN or inf loss stops the run without saving over the last good checkpoint.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time

import torch
from torch.distributed import barrier


class StopSignals:
    """Ctrl-C (SIGINT) or a scheduler's SIGTERM stops the run at a step boundary, with a checkpoint of that
    step to resume from. One process stops at once, or at the end of a deferred() block; under torchrun every
    rank stops at the same step_boundary() (SIGTERM may reach one rank first), and all wait for rank 0's
    save. Made by every rank where the process group starts (under torchrun on GPUs it makes a gloo group)."""

    def __init__(self, ddp, rank, device_type):
        self.ddp, self.rank = ddp, rank
        if isinstance(sys.stderr, Quiet):  # the process group has started: each rank speaks again
            sys.stderr = sys.stderr.stderr
        # the signal that asked the run to stop; whether it waits for a block to end
        self.signal, self.holding = 0, False
        # for the stop flag and the waits for rank 0's saves: on a CPU the default group, else a gloo one by
        # NCCL's
        self.group = torch.distributed.new_group(backend='gloo') if ddp and device_type == 'cuda' else None

    @contextlib.contextmanager
    def caught(self, run, checkpoint, nonfinite):
        """Run the block with stop signals caught: when one stops it, rank 0 saves checkpoint()
        (run.save_at_stop), every rank waits for it, and all exit together with the shell's code for death by
        that signal (130 for Ctrl-C). The weights are those of a step boundary (updates are deferred), and
        every rank's are the same. An error in the block, or in the save, ends the rank: end_rank. Either
        way the process group is destroyed on the way out (after a run that went well, train.py does it)."""
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        except (SystemExit, RuntimeError) as error:
            run.let_go()
            leave_group()
            end_rank(error, self.ddp, self.rank)
        except KeyboardInterrupt:
            self.holding = True  # a second Ctrl-C (or torchrun's SIGTERM to the ranks left) waits for it
            how = ('interrupted' if self.signal == signal.SIGINT
                   else 'stopped by ' + signal.Signals(self.signal).name)
            try:
                run.save_at_stop(checkpoint, nonfinite, how)
                self.wait_for_rank_0()
            except (SystemExit, RuntimeError) as error:
                run.let_go()
                leave_group()
                end_rank(error, self.ddp, self.rank)
            run.let_go()
            leave_group()
            raise SystemExit(128 + self.signal) from None
        else:
            run.let_go()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def on_signal(self, signum, _frame):
        self.signal = signum
        if not (self.holding or self.ddp):
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self):
        """Hold back a stop signal until the block ends, so the weights, log and checkpoints always agree."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.signal and not self.ddp:
            raise KeyboardInterrupt

    def step_boundary(self):
        """Under torchrun, stop every rank at this step if any rank got a stop signal: a MAX all-reduce of
        the signal number. It goes over a gloo group, on the CPU, so on a GPU it never waits for queued
        kernels, only for the other ranks' CPUs: ~0.1 ms a step, against seconds of grace."""
        if self.ddp:
            flag = torch.tensor(self.signal)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
            # (never reset self.signal to 0 here: a signal may have arrived during the all-reduce)
            if flag.item():
                self.signal = flag.item()
                raise KeyboardInterrupt

    def wait_for_rank_0(self):
        """Under torchrun, hold every rank until rank 0 has written its checkpoint, then let them go
        together: no rank exits while rank 0 still writes (torchrun kills the others 30 s after one exits),
        and none waits in an NCCL collective meanwhile (its watchdog ends a wait of 10 minutes). A 1.6B
        checkpoint is about 20 GB. The wait is on the gloo group, on the CPU; gloo's timeout, 30 minutes,
        bounds it."""
        if self.ddp:
            barrier(group=self.group)


# How gloo and NCCL say that a collective failed because another rank had exited or failed
PEER_FAILED = (' by peer', 'remote process exit', 'ncclRemoteError', 'communicator was aborted')


def end_rank(error, ddp, rank):
    """Re-raise error, under torchrun as a one-line stop_rank: a SystemExit's message, or, for gloo's or
    NCCL's error in a collective whose peer has exited or failed, a line saying so (that peer says why).
    Other errors keep their traceback."""
    if ddp and isinstance(error, SystemExit) and isinstance(error.code, str):
        stop_rank(error.code)
    if ddp and isinstance(error, RuntimeError) and any(words in str(error) for words in PEER_FAILED):
        stop_rank(f"train.py: rank {rank} stopped because another rank failed", after_a_peer=True)
    raise error


def leave_group():
    """Destroy the process group if one is up: NCCL's watchdog and gloo's threads end with it, and no
    rank prints their teardown warnings over its error."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


class Quiet:
    """sys.stderr of a torchrun rank other than 0 until the process group starts (rank_0_speaks)."""

    def __init__(self, stderr):
        self.stderr = stderr

    def write(self, text):
        return len(text)

    def flush(self):
        pass


def rank_0_speaks():
    """Under torchrun every rank checks the same settings and data before the process group starts, and
    fails alike: rank 0 prints the one-line error, the other ranks keep quiet (torchrun's summary still
    gives each rank's exit code), so a bad setting shows once, not once per rank."""
    if int(os.environ.get('RANK', '0')) > 0:
        sys.stderr = Quiet(sys.stderr)


def stop_rank(message, after_a_peer=False):
    """End this rank with its one-line error. torchrun gets it in the rank's error file instead of stderr:
    its closing summary, the last thing it prints, shows the first failure's line, so the line shows once,
    last. A rank that stops because a peer failed is stamped a second later, so that the peer's failure
    stays first."""
    if 'TORCHELASTIC_ERROR_FILE' not in os.environ:  # plain python, or another launcher
        raise SystemExit(message)
    error = {'message': message, 'extraInfo': {'timestamp': int(time.time()) + after_a_peer}}
    with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
        json.dump({'message': error}, f)
    raise SystemExit(1)


class NonFinite:
    """The NaN/inf stop. A flag on the device is set at any step whose training loss or gradient norm is NaN
    or inf; reading it waits for the device, so it is read only at log and evaluation steps (and before any
    save), except on a CPU, where the read is free and every step is checked before the update. A run that
    finds one stops with one line, saving nothing: run's last checkpoint is the last good one."""

    def __init__(self, device, ddp, first_step, run):
        self.ddp, self.run, self.every_step = ddp, run, torch.device(device).type == 'cpu'
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.loss = self.grad_norm = torch.zeros((), device=device)  # the latest step's, for the message
        self.checked_step = first_step  # the first step whose loss is not yet known to be finite

    def observe(self, step, loss, grad_norm, scaler, check):
        """Note step's training loss and gradient norm (before the update), and check them now if check, or
        on a CPU."""
        self.loss, self.grad_norm = loss, grad_norm
        self.flag |= ~torch.isfinite(loss)
        # fp16's GradScaler makes inf gradients now and then, and skips those steps
        if not scaler.is_enabled():
            self.flag |= ~torch.isfinite(grad_norm)
        if check or self.every_step:
            self.check(step)

    def check(self, last_step, val_loss=None):
        """Stop if the training loss or gradient norm was NaN or inf at a step since the last check, up to
        last_step, or if val_loss, taken after it, is. Every rank calls it at the same steps."""
        flag = self.flag.int()
        if self.ddp:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item():
            steps = (f"step {last_step}" if self.checked_step == last_step
                     else f"one of steps {self.checked_step}-{last_step}")
            raise SystemExit(f"train.py: the training loss or gradient norm became NaN or inf at {steps} "
                             f"(loss {self.loss.item():.4g}, gradient norm {self.grad_norm.item():.4g}); "
                             f"stopped without saving, {self.run.kept()}")
        self.checked_step = last_step + 1
        if val_loss is not None and not math.isfinite(val_loss):
            raise SystemExit(f"train.py: validation loss {val_loss} at step {last_step + 1}; "
                             f"stopped without saving, {self.run.kept()}")

    def seen(self):
        return bool(self.flag.item())
