"""
How a run stops. StopSignals: Ctrl-C, a scheduler's SIGTERM, a dropped ssh session's SIGHUP or SLURM's
warning SIGUSR1 stop a run at once until its loop starts (nothing to save yet; one that lands inside tqdm
waits for the loop, a moment later), then only at a step boundary, where train.py polls
StopSignals.signal, saves and exits: a run never saves a half-made state.
A second Ctrl-C stops at once; a second SIGTERM, SIGHUP or SIGUSR1 changes nothing. Errors inside the
loop end the rank in one line, under torchrun too (end_rank). The only collective here is leave_group's
destroy_process_group. First what train.py calls (StopSignals, leave_group, end_rank), then their helpers.
Imports no torch at module level: train.py imports this first, so Ctrl-C during the imports is caught.
"""
import atexit
import contextlib
import json
import os
import signal
import sys
import time

SIGNALS = [getattr(signal, name) for name in ('SIGINT', 'SIGTERM', 'SIGHUP', 'SIGUSR1')
           if hasattr(signal, name)]  # Windows has neither SIGHUP nor SIGUSR1


class StopSignals:
    """The stop signals of a train.py process, installed when made. Until the loop starts (listen()), a
    signal ends the process at once with one line (exit 128 + its number); from then on it is noted in
    `signal` (the first one's number; 0 = none) for train.py to act on at the next step boundary, and a
    second Ctrl-C ends the process at once. Under torchrun, ranks other than 0 keep quiet until the loop:
    a bad setting or missing data, which every rank meets alike, shows once (Quiet says a failure of
    theirs alone)."""

    def __init__(self):
        from vrl import cli
        cli.keep_going_without_stdout()  # `python train.py | head` trains on
        self.signal, self.polling = 0, False
        for sig in SIGNALS:
            signal.signal(sig, self.on_signal)
        if int(os.environ.get('RANK', '0')) > 0:
            sys.stderr = Quiet(sys.stderr)
            atexit.register(sys.stderr.say_a_lone_failure)

    def on_signal(self, signum, frame):
        if self.polling and not (self.signal and signum == signal.SIGINT):
            self.signal = self.signal or signum
            return
        if not self.signal and in_tqdm(frame):
            # tqdm cut short mid-draw (train.py's first lines, its progress bar) fails in its cleanup (a lock
            # let go that it never took) with a traceback under the stop's line: the stop is held for the
            # loop, which starts right after those lines and stops at its first step boundary
            self.signal = signum
            return
        if isinstance(sys.stderr, Quiet):  # torchrun ends the ranks (another failed), or the user does
            sys.stderr.held = None
        name = signal.Signals(signum).name
        print(f"train.py: stopped by {name}" + (" again: at once, nothing more saved"
              if self.polling else " before training started; nothing saved"), file=sys.stderr)
        raise SystemExit(128 + signum)

    def listen(self):
        """From now on (train.py's loop) a signal is noted, not acted on, and ranks > 0 speak again."""
        if isinstance(sys.stderr, Quiet):
            sys.stderr = sys.stderr.stderr
        self.polling = True


def leave_group():
    """Destroy the process group if one is up: NCCL's watchdog and gloo's threads end with it, and no
    rank prints their teardown warnings over its error."""
    import torch
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


def end_rank(error, ddp):
    """Re-raise error, as one line where it is known: a SystemExit's message (under torchrun through
    its error file, stop_rank), running out of memory, or, under torchrun, gloo's or NCCL's error in a
    collective whose peer has exited or failed (that peer says why). Others keep their traceback."""
    import torch
    if isinstance(error, SystemExit) and not isinstance(error.code, str):
        raise error  # an exit code: train.py's own stop, which said why
    if isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error):
        error = SystemExit(f"train.py: out of memory ({str(error).splitlines()[0]}); lower "
                           "batch_size (and raise gradient_accumulation_steps) or use a smaller model")
    if ddp and isinstance(error, RuntimeError) and any(words in str(error) for words in PEER_FAILED):
        error = SystemExit(f"train.py: rank {os.environ.get('RANK')} stopped because another rank "
                           "failed")
        stop_rank(error.code, after_a_peer=True)
    if ddp and isinstance(error, SystemExit):
        stop_rank(error.code)
    raise error


# How gloo and NCCL say that a collective failed because another rank had exited or failed
PEER_FAILED = (' by peer', 'remote process exit', 'ncclRemoteError', 'communicator was aborted')


def stop_rank(message, after_a_peer=False):
    """End this rank with its one-line error. torchrun gets it in the rank's error file instead of
    stderr: its closing summary, the last thing it prints, shows the first failure's line, so the line
    shows once, last. A rank that stops because a peer failed is stamped a second later, so that the
    peer's failure stays first."""
    if 'TORCHELASTIC_ERROR_FILE' not in os.environ:  # plain python, or another launcher
        raise SystemExit(message)
    error = {'message': message, 'extraInfo': {'timestamp': int(time.time()) + after_a_peer}}
    with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
        json.dump({'message': error}, f)
    raise SystemExit(1)


def in_tqdm(frame):
    """Whether frame, or a frame that called it, runs tqdm's code."""
    tqdm = sys.modules.get('tqdm')
    folder = tqdm and os.path.dirname(tqdm.__file__) + os.sep
    while folder and frame:
        if frame.f_code.co_filename.startswith(folder):
            return True
        frame = frame.f_back
    return False


class Quiet:
    """sys.stderr of a torchrun rank other than 0 until the loop starts (StopSignals): it holds what the
    rank writes. If the rank ends before the loop with something written (its one-line error, a traceback),
    it waits LONE_FAILURE_WAIT seconds: a failure that rank 0 meets too (a bad setting) ends rank 0 first,
    and torchrun ends this rank in its wait, silently; one of this rank's alone (its node's data missing, its
    GPU) is then printed, marked with the rank, rather than nowhere."""

    def __init__(self, stderr):
        self.stderr, self.held = stderr, []

    def write(self, text):
        if self.held is not None:
            self.held.append(text)
        return len(text)

    def flush(self):
        pass

    def say_a_lone_failure(self):
        held = ''.join(self.held or [])
        said = any(f'\n{script}: ' in '\n' + held for script in ('train.py', 'prepare.py'))  # (its data's)
        if sys.stderr is not self or not (said or 'Traceback (most' in held):
            return  # the loop started (its errors end the rank in one line), a stop signal, or no failure
        for sig in SIGNALS:  # torchrun's SIGTERM in the wait ends the rank silently
            signal.signal(sig, signal.SIG_DFL)
        time.sleep(LONE_FAILURE_WAIT)
        print(f"[rank {os.environ.get('RANK')}, before training] {held.strip()}", file=self.stderr, flush=True)


LONE_FAILURE_WAIT = 10.0  # seconds; ranks start within a second or two of each other, and torchrun
# polls its ranks every 0.1 s (every 5 s before torch 2.2: raise it there)
