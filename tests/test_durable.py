"""Nothing lost on a cluster: init_from='auto' after a kill before and after the first checkpoint, a resume
from ckpt.prev.pt when ckpt.pt is torn, the writes flushed to disk before their renames, a checkpoint written
in the background, and out_dir's lock on shared file systems (a stale holder on this host, one on another
host, a requeued job's, a retry, breaking it by hand)."""
import errno
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from test_train import (LONG, REPO, TINY, TWO_PASSES, assert_same_weights, ddp_straight,  # noqa: F401
                        log, records, stopping_at, straight, train, wait_until_stopped, weights, workdir)
from vrl import locks, run_folder, settings
from testing import train_defaults


def killed_at(workdir, step, out_dir):
    """A run of LONG with init_from='auto' into out_dir, killed (SIGKILL: no save, no cleanup) in its
    step-th update."""
    process = subprocess.Popen([sys.executable, *stopping_at(workdir, step), *TINY, f'--out_dir={out_dir}',
                                '--init_from=auto', *LONG], cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_until_stopped(process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return process


def test_auto_after_a_kill_before_the_first_checkpoint_trains_from_scratch(workdir, straight):
    """Killed in step 3, before its first checkpoint (step 4): the folder holds a log and no checkpoint, which
    is no run (a resume says to use auto); the relaunch with the same command line starts over, says so in
    one line, and trains the uninterrupted run."""
    killed_at(workdir, 3, 'out_auto_early')
    assert not (workdir / 'out_auto_early' / 'ckpt.pt').exists()
    assert max(log(workdir, 'out_auto_early', 'train_loss')) == 2
    refused = train(workdir, '--out_dir=out_auto_early', '--init_from=resume', *LONG, check=False)
    assert refused.stderr.splitlines()[-1] == (
        'train.py: checkpoint out_auto_early/ckpt.pt not found, so there is nothing to resume; start the run '
        'with --init_from=auto, which starts over where there is no checkpoint')
    result = train(workdir, '--out_dir=out_auto_early', '--init_from=auto', *LONG)
    assert ('train.py: out_auto_early holds log.jsonl but no checkpoint (a run stopped before its first '
            'save): starting from scratch, which replaces them') in result.stderr
    assert records(workdir, 'out_auto_early') == straight


def test_auto_after_a_kill_past_a_checkpoint_resumes_exactly(workdir, straight):
    """Killed in step 6, its checkpoint of step 4 there: the relaunch with the same command line resumes it
    (taking over the lock file the killed run left) and ends as the uninterrupted run, log and weights."""
    process = killed_at(workdir, 6, 'out_auto_late')
    assert json.loads((workdir / 'out_auto_late' / '.lock.pid').read_text())['pid'] == process.pid
    result = train(workdir, '--out_dir=out_auto_late', '--init_from=auto', *LONG)
    assert f'names process {process.pid}, a process on this host that has ended; taking its lock over' \
        in result.stderr
    assert records(workdir, 'out_auto_late') == straight
    assert_same_weights(weights(workdir, 'out_auto_late'), weights(workdir, 'out_straight'))
    # a finished run: the same command again (a requeue after the end) changes nothing
    before = (workdir / 'out_auto_late' / 'log.jsonl').read_bytes()
    train(workdir, '--out_dir=out_auto_late', '--init_from=auto', *LONG)
    assert (workdir / 'out_auto_late' / 'log.jsonl').read_bytes() == before


KILLED_BEFORE_THE_RENAME = """import os, runpy, signal, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
replace, renames = os.replace, []
def killed_in_the_second_save(source, target):  # after ckpt.pt became ckpt.prev.pt, before the new one
    if str(source).endswith('ckpt.pt.tmp'):
        renames.append(target)
        if len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return replace(source, target)
os.replace = killed_in_the_second_save
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('torn', ['truncated', 'killed before its rename'])
def test_a_torn_checkpoint_resumes_from_the_one_before(workdir, straight, torn):
    """ckpt.pt cut short (a crash that lost its tail), or missing (a kill in the second save, step 8's,
    between ckpt.pt's rename to ckpt.prev.pt and the new one's into place): the resume says so in one line,
    goes on from ckpt.prev.pt (step 4) and ends as the uninterrupted run; the torn file is not kept as the
    next previous checkpoint."""
    out = f"out_torn_{torn.split()[0]}"
    folder = workdir / out
    ckpt, previous = folder / 'ckpt.pt', folder / 'ckpt.prev.pt'
    if torn == 'truncated':
        train(workdir, f'--out_dir={out}', *LONG, '--max_iters=8')
        ckpt.write_bytes(ckpt.read_bytes()[:ckpt.stat().st_size // 2])
        said = f'train.py: checkpoint {out}/ckpt.pt is unreadable: truncated, or not a checkpoint written by ' \
               f'train.py; resuming from {out}/ckpt.prev.pt (step 4), the checkpoint saved before it'
    else:
        script = workdir / 'killed_before_the_rename.py'
        script.write_text(KILLED_BEFORE_THE_RENAME)
        killed = subprocess.run([sys.executable, script, REPO / 'train.py', *TINY, *LONG, f'--out_dir={out}'],
                                cwd=workdir, capture_output=True, timeout=120)
        assert killed.returncode == -signal.SIGKILL and not ckpt.exists()
        assert (folder / 'ckpt.pt.tmp').exists()
        said = f'train.py: checkpoint {out}/ckpt.pt not found; resuming from {out}/ckpt.prev.pt (step 4)'
    assert torch.load(previous, weights_only=True)['iter_num'] == 4
    result = train(workdir, f'--out_dir={out}', '--init_from=auto', *LONG)
    assert said in result.stderr
    assert records(workdir, out) == straight
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_straight'))
    _, kept = run_folder.load_checkpoint(str(previous))  # checked whole (its CRC)
    assert kept['iter_num'] == 36


KILLED_IN_ITS_FIRST_LAUNCH = """import os, runpy, signal, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
updates = 0
def killed_at_step_6(optimizer, args, kwargs):
    global updates
    updates += any(group['lr'] for group in optimizer.param_groups)  # not the start-up estimate's
    if updates == 6 and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':
        os.kill(os.getpid(), signal.SIGKILL)
register_optimizer_step_post_hook(killed_at_step_6)
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_torchrun_max_restarts_continues_an_auto_run(workdir, ddp_straight):
    """torchrun --max-restarts=1 relaunches its 2 ranks, killed in step 6, with the same arguments: with
    init_from=auto each resumes the checkpoint of step 4 (rank 0 taking over the lock its killed run left),
    and the run ends as the uninterrupted one. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: without it the
    relaunched ranks read the first launch's addresses from torchrun's store, and gloo cannot connect
    (pytorch/pytorch#135712)."""
    script = workdir / 'killed_in_its_first_launch.py'
    script.write_text(KILLED_IN_ITS_FIRST_LAUNCH)
    result = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                             '--max-restarts=1', script, REPO / 'train.py', *TINY, *TWO_PASSES, *LONG,
                             '--init_from=auto', '--out_dir=out_restarted'], cwd=workdir, capture_output=True,
                            text=True, timeout=240,
                            env=dict(os.environ, OMP_NUM_THREADS='1', TORCH_DISABLE_SHARE_RDZV_TCP_STORE='1'))
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'taking its lock over' in result.stderr
    assert records(workdir, 'out_restarted') == ddp_straight
    assert_same_weights(weights(workdir, 'out_restarted'), weights(workdir, 'out_ddp_straight'))


def test_eval_only_never_scores_the_previous_checkpoint(workdir):
    train(workdir, '--out_dir=out_torn_eval', *LONG, '--max_iters=8')
    ckpt = workdir / 'out_torn_eval' / 'ckpt.pt'
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    result = train(workdir, '--out_dir=out_torn_eval', '--init_from=resume', '--eval_only=True', *LONG,
                   check=False)
    assert result.returncode == 1 and 'ckpt.pt is unreadable' in result.stderr.splitlines()[-1]


def test_a_resume_refused_for_its_settings_names_them_and_never_advises_deleting_the_run(workdir):
    """A resume with other settings (dtype='auto' made float32, as auto is on a CPU) is refused in one line
    that gives the flags it was trained with, and as the other way out a new --out_dir, never --overwrite=True
    (which deletes the run); the command with those flags resumes."""
    train(workdir, '--out_dir=out_other_settings', '--max_iters=2', '--eval_interval=2')
    refused = train(workdir, '--out_dir=out_other_settings', '--init_from=resume', '--max_iters=4',
                    '--dtype=float32', '--lr_scales=[["wte.weight", 2]]', check=False)
    assert refused.returncode == 1 and refused.stderr.count('\n') == 1, refused.stderr
    assert refused.stderr.strip().endswith(
        "resume with the settings it was trained with (\"--lr_scales=[]\" --dtype=auto), or train with these in "
        "another --out_dir (--overwrite=True would delete this run)"), refused.stderr
    train(workdir, '--out_dir=out_other_settings', '--init_from=resume', '--max_iters=4', '--dtype=auto',
          '--lr_scales=[]')
    assert max(log(workdir, 'out_other_settings', 'train_loss')) == 4


@pytest.mark.skipif(os.name == 'nt', reason='no file size limit (ulimit -f) on Windows')
def test_a_checkpoint_past_the_file_size_limit_names_the_limit_not_the_disk(workdir):
    """Under `ulimit -f` a checkpoint's write fails with EFBIG, which torch.save words as a full disk's
    failure: the line names the limit."""
    import resource
    limit = 100 * 1024  # the log fits, a checkpoint (some 400 KB) does not
    result = subprocess.run([sys.executable, REPO / 'train.py', *TINY, '--out_dir=out_file_size_limit',
                             '--max_iters=4', '--eval_interval=2'], cwd=workdir, capture_output=True, text=True,
                            timeout=120, preexec_fn=lambda: resource.setrlimit(
                                resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1])))
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        'train.py: cannot write out_file_size_limit/ckpt.pt (past the file size limit, `ulimit -f`); raise the '
        'limit (`ulimit -f unlimited`), no checkpoint written')
    assert not list((workdir / 'out_file_size_limit').glob('*.pt*'))


def test_an_out_dir_that_stops_taking_files_at_the_last_save_ends_the_run_in_one_line(workdir, monkeypatch):
    """out_dir refuses the last checkpoint's rename (written in the background as the run ends): one line
    and exit 1, not exit 0 with the line above the bar; the lock let go."""
    replace = os.replace

    def refused(source, target):
        if str(source).endswith('ckpt.pt.tmp'):
            raise PermissionError(13, 'Permission denied', str(target))
        return replace(source, target)

    monkeypatch.setattr(os, 'replace', refused)
    result = train(workdir, '--out_dir=out_unwritable', '--max_iters=2', '--eval_interval=2', check=False)
    monkeypatch.undo()
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "train.py: cannot write out_unwritable/ckpt.pt (PermissionError: [Errno 13] Permission denied: "
        "'out_unwritable/ckpt.pt'); fix out_dir, no checkpoint written")
    assert not (workdir / 'out_unwritable' / '.lock.pid').exists()


def test_a_lock_whose_unlock_fails_is_let_go_without_an_error(tmp_path):
    """An unlock that fails (out_dir's file system gone) is left to the OS, which lets go at the process's
    end; the .pid file goes, and nothing is raised at the end of a run."""
    held, _ = locks.try_lock(str(tmp_path / '.lock'), 'test.py')
    unlock = held.lock.release

    def stale(*args, **kwargs):
        unlock(*args, **kwargs)
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    held.lock.release = stale
    held.release()
    assert not (tmp_path / '.lock.pid').exists()


def small_checkpoint(step):
    return {'model': {'w': torch.arange(1e6) + step}, 'iter_num': step, 'model_args': {}}


def test_a_save_flushes_each_file_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    """The order a crash of the machine needs (a rename is durable only once its folder is flushed, and names
    its file's bytes only where they were flushed first): ckpt.pt.tmp and best.pt.tmp flushed, then renamed,
    the folder flushed after each rename; ckpt.pt kept as ckpt.prev.pt; and before them a resumed run's log,
    cut back to its checkpoint, the same way."""
    run = run_folder.RunFolder(str(tmp_path / 'out'), 'scratch', False, writes=True)
    run.save(small_checkpoint(1), best=False)
    (tmp_path / 'out' / 'log.jsonl').write_text('{"step": 1}\n{"step": 2}\n')
    run.before_first_write = ('resume', 1, False)  # as a run resumed at step 1: its log is cut back first
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, 'fsync', lambda fd: events.append(
        ('fsync', os.path.basename(os.readlink(f'/proc/self/fd/{fd}')))) or fsync(fd))
    monkeypatch.setattr(os, 'replace', lambda a, b: events.append(
        ('rename', os.path.basename(a), os.path.basename(b))) or replace(a, b))
    run.save(small_checkpoint(2), best=True)
    monkeypatch.undo()
    run.let_go()
    assert events == [('fsync', 'log.jsonl.tmp'), ('rename', 'log.jsonl.tmp', 'log.jsonl'), ('fsync', 'out'),
                      ('fsync', 'ckpt.pt.tmp'), ('fsync', 'best.pt.tmp'),
                      ('rename', 'best.pt.tmp', 'best.pt'), ('fsync', 'out'),
                      ('rename', 'ckpt.pt', 'ckpt.prev.pt'), ('rename', 'ckpt.pt.tmp', 'ckpt.pt'),
                      ('fsync', 'out')]
    assert [torch.load(tmp_path / 'out' / name, weights_only=True)['iter_num']
            for name in ('ckpt.prev.pt', 'ckpt.pt', 'best.pt')] == [1, 2, 2]


def test_a_background_save_writes_the_weights_of_its_step(tmp_path, monkeypatch):
    """background=True returns once the checkpoint is copied: the weights changed after that (the next steps)
    are not in it; the next save waits for it, and so does the end of the process."""
    run = run_folder.RunFolder(str(tmp_path / 'out'), 'scratch', False, writes=True)
    checkpoint = small_checkpoint(1)
    writing, save = threading.Event(), torch.save

    def slow_save(*args, **kwargs):  # a slow disk: the write still under way when save() returns
        writing.wait(10)
        save(*args, **kwargs)

    monkeypatch.setattr(torch, 'save', slow_save)
    run.save(checkpoint, best=False, background=True)
    assert run.writing.is_alive() and not (tmp_path / 'out' / 'ckpt.pt').exists()
    checkpoint['model']['w'].zero_()  # the next step's update, in place
    writing.set()
    run.wait()
    monkeypatch.undo()
    written = torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)
    assert torch.equal(written['model']['w'], torch.arange(1e6) + 1)
    assert written['checksum'] == run_folder.checksum(written) and run.saved_step == 1
    first_copy = run.host_copy[0].data_ptr()
    run.save(small_checkpoint(2), best=False, background=True)  # refills the first copy's memory
    run.wait()
    assert run.host_copy[0].data_ptr() == first_copy
    written = torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)
    assert torch.equal(written['model']['w'], torch.arange(1e6) + 2)
    assert torch.load(tmp_path / 'out' / 'ckpt.prev.pt', weights_only=True)['iter_num'] == 1
    run.let_go()


BACKGROUND_SAVE_THEN_EXIT = """import sys, torch
sys.path.insert(0, sys.argv[2])
from vrl import run_folder
run = run_folder.RunFolder(sys.argv[1], 'scratch', False, writes=True)
run.save({'model': {'w': torch.ones(20_000_000)}, 'iter_num': 7}, best=False, background=True)
sys.exit(143)  # a stop right after the save returned
"""


def test_the_process_ends_only_once_its_background_save_is_on_disk(tmp_path):
    out = tmp_path / 'out'
    subprocess.run([sys.executable, '-c', BACKGROUND_SAVE_THEN_EXIT, out, REPO], check=False, timeout=120)
    written = torch.load(out / 'ckpt.pt', weights_only=True)
    assert written['iter_num'] == 7 and written['checksum'] == run_folder.checksum(written)
    assert not (out / 'ckpt.pt.tmp').exists() and not (out / '.lock.pid').exists()


def test_init_from_auto_is_checked_with_the_settings():
    defaults = train_defaults()
    settings.check_settings(defaults | {'init_from': 'auto'})
    for changed, said in [({'overwrite': True}, "overwrite=True starts over and init_from='auto' continues"),
                          ({'save_checkpoint': False}, "save_checkpoint=False with init_from='auto'")]:
        with pytest.raises(SystemExit) as refused:
            settings.check_settings(defaults | {'init_from': 'auto'} | changed)
        assert said in refused.value.code
    with pytest.raises(SystemExit) as refused:
        settings.check_settings(defaults | {'init_from': 'latest'})
    assert "use 'scratch', 'resume' or 'auto'" in refused.value.code


# ----------------------------------------------------------------------------- the lock on shared storage
def dead_pid():
    process = subprocess.Popen([sys.executable, '-c', 'pass'])
    process.wait()
    return process.pid


def left_by(path, **holder):
    with open(path + '.pid', 'w') as f:
        f.write(json.dumps(holder) + '\n')


def test_a_stale_lock_from_a_dead_pid_on_this_host_is_taken_over_in_one_line(tmp_path, capsys):
    path, pid = str(tmp_path / 'run.lock'), dead_pid()
    left_by(path, host=locks.HOST, pid=pid, job=None, restart=0)
    held, other = locks.try_lock(path, 'train.py')
    assert other is None
    assert capsys.readouterr().err == (f"train.py: {path}.pid names process {pid}, a process on this host that "
                                       f"has ended; taking its lock over\n")
    assert json.loads(open(path + '.pid').read()) == locks.me()
    held.release()


def test_a_lock_held_from_another_host_is_refused_until_broken_by_hand(tmp_path, capsys):
    """A .pid file of another host: flock cannot tell whether that process lives (Lustre's localflock locks
    one node; an NFS lock outlives its dead node), so the run is refused in one line that says how to break
    the lock; `python -m vrl.locks break` does, and the next run goes ahead."""
    path = str(tmp_path / 'run.lock')
    left_by(path, host='node-gone', pid=4242, job='91', restart=0)
    assert locks.try_lock(path, 'train.py') == (None, 'process 4242 on host node-gone')
    with pytest.raises(SystemExit) as refused:
        locks.hold(path, 'train.py', lambda who: f"another run ({who}) is writing to out", wait=0)
    assert refused.value.code == (f"train.py: another run (process 4242 on host node-gone) is writing to out "
                                  f"(if that process is gone, its node down, break the lock with `python -m "
                                  f"vrl.locks break {path}`)")
    broken = subprocess.run([sys.executable, '-m', 'vrl.locks', 'break', path], cwd=REPO,
                            capture_output=True, text=True)
    assert broken.returncode == 0 and broken.stdout == f"locks.py: removed {path} and {path}.pid\n"
    held, other = locks.try_lock(path, 'train.py')
    assert other is None
    held.release()


def test_a_requeued_job_takes_over_the_lock_of_its_earlier_run_on_another_node(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / 'run.lock')
    left_by(path, host='node-gone', pid=4242, job='91', restart=0)
    monkeypatch.setenv('SLURM_JOB_ID', '91')
    assert locks.try_lock(path, 'train.py') == (None, 'process 4242 on host node-gone')  # the same run
    monkeypatch.setenv('SLURM_RESTART_COUNT', '1')
    held, other = locks.try_lock(path, 'train.py')
    assert other is None and 'an earlier run of this SLURM job (job 91, requeued)' in capsys.readouterr().err
    held.release()


def test_break_refuses_a_lock_whose_holder_runs_on_this_host(tmp_path):
    path = str(tmp_path / 'run.lock')
    held, _ = locks.try_lock(path, 'test')
    broken = subprocess.run([sys.executable, '-m', 'vrl.locks', 'break', path], cwd=REPO,
                            capture_output=True, text=True)
    assert broken.returncode == 1 and broken.stderr == (f"locks.py: process {os.getpid()} on this host holds "
                                                        f"{path} and is running; stop it first\n")
    held.release()


def test_a_lock_held_from_another_host_is_retried_until_let_go(tmp_path, monkeypatch, capsys):
    """A batch job retries (LOCK_WAIT) a lock held from another host: here its holder lets go after a
    moment, and the run goes ahead. A holder on this host is refused at once (flock is sure there)."""
    path = str(tmp_path / 'run.lock')
    left_by(path, host='node-busy', pid=4242, job='90', restart=0)
    monkeypatch.setattr(locks, 'RETRY_EVERY', 0.05)
    threading.Timer(0.3, os.remove, [path + '.pid']).start()  # that run ends
    held = locks.hold(path, 'train.py', lambda who: f"{who} holds it", wait=60)
    assert capsys.readouterr().err == (f'train.py: {path} is held by process 4242 on host node-busy; retrying '
                                       f'for up to 60 s (a dead node\'s lock lapses with its lease)\n')
    with pytest.raises(SystemExit) as refused:  # now by this process, on this host
        locks.hold(path, 'train.py', lambda who: f"{who} holds it", wait=60)
    assert refused.value.code == f'train.py: process {os.getpid()} holds it'
    held.release()
