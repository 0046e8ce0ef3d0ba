"""bench.py --smoke: every section runs and the report is well formed. No timing is checked: the numbers of a
smoke run mean nothing, and a loaded machine must not fail the suite. bench.py --compile=True compiles every
contender. bench.py --node_check, on 2 CPU ranks at a tiny shape."""
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import torch

from ablations import BASELINES
from configurator import _read_config_file
from model import VARIANTS
from testing import with_stdout_closed
from vrl.data import load_meta, open_split

PRESETS = VARIANTS | BASELINES  # bench.py's: the paper's variants and the baselines

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench') / 'bench.json'
    run = subprocess.run([sys.executable, 'lab/bench.py', '--smoke', f'--out={out}', '--device=cpu'], cwd=HERE,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, json.loads(out.read_text())


def test_smoke_says_at_the_top_and_beside_every_table_that_its_numbers_mean_nothing(smoke):
    warning = "SMOKE RUN: tiny counts that only check the plumbing; these numbers measure nothing"
    lines = smoke[0].splitlines()
    assert lines[0] == warning  # stdout is the report alone: the Overriding lines go to stderr
    headings = [line for line in lines if line.startswith('## ')]
    assert len(headings) >= 4 and all(line.endswith(f' ({warning})') for line in headings)
    assert smoke[1]['notes'][0] == warning
    assert smoke[1]['settings']['rounds'] == 1 and 'loop' not in smoke[1]  # one round, no train.py runs


def test_help_into_a_closed_pipe_ends_quietly():
    """`python lab/bench.py --help | head`: no BrokenPipeError once head has its lines."""
    result = with_stdout_closed([sys.executable, 'lab/bench.py', '--help'], cwd=HERE)
    assert (result.returncode, result.stderr) == (0, '')


def test_help_lists_every_setting_with_its_default_and_a_comment():
    run = subprocess.run([sys.executable, 'lab/bench.py', '--help'], cwd=HERE, capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (0, '')
    settings = [line.split() for line in run.stdout.splitlines() if line.startswith('  --')]
    assert settings[4][:2] == ['--rounds=10', 'each'] and settings[19][0] == '--smoke=False'
    # the node check's and the estimate check's, each under a heading of their own
    assert settings[25][0] == "--train_args=''" and settings[-3][0] == '--estimate_iters=100'
    assert [words[0] for words in settings[-2:]] == ['--save_cost=False', "--save_configs=('config/resformer_82m.py',"]
    assert [words[0] for words in settings[27:35]] == [  # the node check's thresholds, after fit_config
        '--run_timeout=1800', '--min_mfu=None', '--min_tokens_per_sec=0.0', '--max_memory_ratio=1.25',
        '--min_gpu_speed=0.8', '--min_matmul_fraction=0.4', '--min_allreduce_gbps=None',
        '--max_memory_fraction=0.9']
    assert len(settings) == 44 and all(len(words) > 1 for words in settings)  # a comment beside each


@pytest.mark.parametrize('args, message', [
    (['--rounds=0'], "bench.py: rounds=0; rounds, steps and decode_rounds take at least 1, "
                     "warmup and loop_rounds at least 0"),
    (['--out=taken/x.json'], "bench.py: out='taken/x.json'; name a file in an existing folder"),
    (['--out=.'], "bench.py: out='.'; name a file in an existing folder"),
])
def test_bad_settings_exit_with_one_line_before_any_measuring(tmp_path, args, message):
    (tmp_path / 'taken').write_text('keep me')
    run = subprocess.run([sys.executable, os.path.join(HERE, 'lab', 'bench.py'), '--device=cpu', *args],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1] == message and run.stdout == ''  # stdout: no table, nothing measured
    assert sorted(os.listdir(tmp_path)) == ['taken'] and (tmp_path / 'taken').read_text() == 'keep me'


def tables(text):
    """Markdown tables in text, each a list of rows, each a list of cells."""
    found, current = [], []
    for line in text.splitlines() + ['']:
        if line.startswith('|'):
            current.append([cell.strip() for cell in line.strip().strip('|').split('|')])
        elif current:
            found.append(current)
            current = []
    return found


def test_every_table_has_a_header_a_separator_and_rows_of_its_width(smoke):
    found = tables(smoke[0])
    assert len(found) >= 4  # training step, decoding, KV cache, memory (and train.py's loop, with the data)
    for rows in found:
        header, separator, body = rows[0], rows[1], rows[2:]
        assert all(cell == '---' for cell in separator) and len(separator) == len(header)
        assert body and all(len(row) == len(header) for row in body)


def test_the_training_table_has_a_row_per_preset_with_vanilla_at_one(smoke):
    train = tables(smoke[0])[0]
    assert train[0][:2] == ['contender', 'params']
    rows = {row[0]: row for row in train[2:]}
    assert set(PRESETS) <= set(rows)
    assert rows['vanilla'][3] == '1.000'


def test_the_json_holds_every_section(smoke):
    results = smoke[1]
    assert {row['contender'] for row in results['train']} >= set(PRESETS)
    assert all(len(row['step_s_per_round']) == results['settings']['rounds'] for row in results['train'])
    assert {row['variant'] for row in results['decode']} == set(PRESETS)
    assert results['matmul']['flops_per_s'] > 0
    assert results['memory'] and results['memory'][0]['variant'] == 'vanilla'


def test_kv_ratios_equal_the_formulas(smoke):
    kv = smoke[1]['kv']
    assert {row['shape'] for row in kv} == {'82m', '468m'}
    assert all(row['matches'] for row in kv), [row for row in kv if not row['matches']]


# Runs bench.py with torch.compile's backend swapped for 'eager': dynamo still traces every contender and
# keeps its cache entries and recompile limit exactly as with inductor, but no kernels are generated, so this
# takes seconds. It prints, after the report, how many frames dynamo tried and how many it compiled.
EAGER_BACKEND_BENCH = """
import runpy, sys, torch
from torch._dynamo.utils import counters
compile = torch.compile
torch.compile = lambda model, **options: compile(model, backend='eager')
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('lab/bench.py', run_name='__main__')
print('frames', counters['frames']['total'], counters['frames']['ok'])
"""


def test_compile_true_compiles_every_contender_even_past_torchs_recompile_limit(tmp_path):
    # 15 presets share two forwards (GPT's, AblationGPT's), more than the 8 entries torch keeps for one code
    # object by default
    assert len(PRESETS) > 8
    run = subprocess.run([sys.executable, '-c', EAGER_BACKEND_BENCH, '--smoke', '--compile=True',
                          '--memory=False', '--decode_tokens=(2,)', '--device=cpu',
                          f'--out={tmp_path / "bench.json"}'], cwd=HERE, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'recompile_limit' not in run.stderr
    total, ok = map(int, run.stdout.splitlines()[-1].split()[1:])
    assert total == ok > len(PRESETS)  # every frame dynamo met was compiled: none fell back to eager
    results = json.loads((tmp_path / 'bench.json').read_text())
    assert results['settings']['compile'] and {row['variant'] for row in results['decode']} == set(PRESETS)


# The 82M config's model at a tiny width and depth, its step of 1024 sequences cut to 8 (2 passes of 4, one a
# rank), on 2 CPU ranks; no fit run (it runs on CUDA alone)
NODE_CHECK = ['--node_check', '--nproc=2', '--device=cpu', '--node_iters=4', '--fit_config=',
              f'--node_config={HERE}/config/resformer_82m.py']
TINY_SHAPE = ('--n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --batch_size=4 '
              '--gradient_accumulation_steps=2')


def node_check(cwd, train_args, *more, bench=os.path.join(HERE, 'lab', 'bench.py')):
    return subprocess.run([sys.executable, bench, *NODE_CHECK, f'--train_args={train_args}', *more], cwd=cwd,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope='module')
def node_run(tmp_path_factory):
    """A node check that passes, and the folder it ran in."""
    folder = tmp_path_factory.mktemp('node_check')
    return folder, node_check(folder, f'{TINY_SHAPE} --peak_tflops=1')  # a made-up peak, for an MFU on a CPU


@functools.cache
def bench_globals():
    """bench.py's functions and constants, without running it: a node check that stops at its settings
    checks, which come after them all."""
    argv, sys.argv = sys.argv, ['bench.py', '--node_check', '--node_iters=1']
    namespace = {'__name__': 'bench', '__file__': os.path.join(HERE, 'lab', 'bench.py')}
    try:
        with pytest.raises(SystemExit):
            exec(compile(Path(namespace['__file__']).read_text(), namespace['__file__'], 'exec'), namespace)
    finally:
        sys.argv = argv
    return namespace


def test_node_check_reports_speed_mfu_memory_and_an_exact_resume_on_two_cpu_ranks(node_run):
    tmp_path, run = node_run
    assert run.returncode == 0 and 'Traceback' not in run.stderr, run.stdout + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f'node check: {HERE}/config/resformer_82m.py on 2 CPU ranks (gloo, float32)')
    torchrun = ' run: python -m torch.distributed.run --standalone --nproc_per_node=2 '
    launched = [line for line in lines if torchrun in line and not line.startswith('probe run')]
    probe = next(line for line in lines if line.startswith('probe run: '))
    assert probe.endswith(' --nproc_per_node=2 lab/node_probe.py out/node_check/probe.json cpu 1') or \
        probe.endswith('/lab/node_probe.py out/node_check/probe.json cpu 1'), probe
    assert [line.split(' run:')[0] for line in launched] == ['straight', 'deterministic', 'first half',
                                                             'resumed']
    # each CPU rank's matmul, the all-reduce over gloo; no floor on a CPU (nothing about GPUs to judge)
    assert re.fullmatch(r"matmul per GPU: \S+ \S+ TFLOP/s \(256\^3 float32\); median \S+",
                        next(line for line in lines if line.startswith('matmul per GPU'))), lines
    assert re.fullmatch(r"all-reduce: \S+ GB/s bus bandwidth \(1 MB over 2 ranks, gloo\); no floor",
                        next(line for line in lines if line.startswith('all-reduce'))), lines
    assert [r['rank'] for r in json.loads((tmp_path / 'out' / 'node_check' / 'probe.json').read_text())
            ['ranks']] == [0, 1]
    # speed and memory as the job runs, and no checkpoint, which nothing reads
    assert '--deterministic' not in launched[0] and ' --save_checkpoint=False ' in launched[0]
    # the resume at the config's full rate (6e-4) from the first step, with the checkpoints it compares, a
    # sequence a pass: the step's 8 sequences in 8 passes
    exact = (' --deterministic=True --batch_size=1 --gradient_accumulation_steps=8 --warmup_iters=0 '
             '--lr_decay_iters=400 --out_dir=out/node_check/')
    assert launched[1].endswith(f'{exact}deterministic --max_iters=4 --overwrite=True')
    assert launched[3].endswith(f'{exact}resumed --max_iters=4 --init_from=resume')
    assert all('--save_checkpoint' not in line for line in launched[1:])
    runs = tmp_path / 'out' / 'node_check'
    assert sorted(os.listdir(runs / 'straight')) == ['.lock', 'log.jsonl']  # the lock file stays
    rates = [r['lr'] for name in ('deterministic', 'resumed')
             for r in bench_globals()['log_records'](runs / name) if 'lr' in r]
    assert len(rates) == 8 and all(abs(lr - 6e-4) < 6e-7 for lr in rates)
    # each run's output streamed to stderr as it came, each line headed with its run's name, in run order
    streamed = [line for line in run.stderr.splitlines() if line.startswith('[')]
    heads = [line[1:line.index(']')] for line in streamed]
    assert heads == sorted(heads, key=['probe', 'straight', 'deterministic', 'first half', 'resumed'].index)
    for name in ('straight', 'deterministic', 'resumed'):
        assert any(line.startswith(f'[{name}] step 4: loss ') for line in streamed), name
    assert not any(line.startswith('[') for line in lines)  # stdout: the check's own lines
    job, per_rank = (float(n.replace(',', '')) for n in re.fullmatch(
        r"tokens/s: ([\d,]+) for the job, ([\d,]+) per rank \(median of the straight run's 4 steps\)",
        next(line for line in lines if line.startswith('tokens/s'))).groups())
    assert job > 0 and abs(per_rank - job / 2) <= 1
    # both conventions: PaLM's counts the full T x T attention, so it credits more FLOPs (here, at T = 64, a
    # fraction of a percent more: the printed figures may round alike)
    ours, palm = map(float, re.fullmatch(
        r"model FLOP/s per GPU: (\S+) TFLOP/s counting causal attention's half of the T x T matrices "
        r"\(ours\), (\S+) TFLOP/s counting all of them \(PaLM's and nanoGPT's\)",
        next(line for line in lines if line.startswith('model FLOP/s'))).groups())
    mfu, mfu_palm = map(float, re.fullmatch(
        r"MFU per GPU: (\d+\.\d)% \(ours\), (\d+\.\d)% \(PaLM's\); no floor on a CPU \(min_mfu sets one\)",
        next(line for line in lines if line.startswith('MFU'))).groups())
    assert 0 < ours <= palm and 0 < mfu <= mfu_palm
    # no GPU, no peak memory; the estimate for the mode that ran (eager, on a CPU), at the tiny shape
    estimate = next(line for line in lines if line.startswith('peak memory'))
    assert re.fullmatch(rf"peak memory per GPU: not measured \(CUDA only\); the estimate of \S+ GB \(eager: "
                        rf"memory_estimate_gb's \S+ and \S+ it leaves out; {HERE}/config/resformer_82m.py's "
                        rf"header states 110 GB for its own settings\)", estimate), estimate
    assert lines[-3].startswith("resume: exact: stopped at step 2 and resumed, the run's log (7 records) and")
    assert lines[-2] == 'fit: not tried (fit_config is empty)'
    assert lines[-1].startswith('node check passed')
    # what it wrote: data that prepare.py's reader accepts, and two deterministic runs that ended alike
    meta = load_meta(tmp_path / 'data' / 'node_check')
    # the validation split: 16 of the run's evaluation batches (a pass's 4 x 64 tokens), and one token for the
    # last target
    assert meta['vocab_size'] == 50257 and len(open_split(tmp_path / 'data' / 'node_check', 'val')[0]) == 4097
    straight, resumed = (torch.load(runs / name / 'ckpt.pt', weights_only=True)
                         for name in ('deterministic', 'resumed'))
    assert straight['iter_num'] == resumed['iter_num'] == 4
    assert straight['model'].keys() == resumed['model'].keys()
    assert all(torch.equal(straight['model'][k], resumed['model'][k]) for k in straight['model'])
    # a true resume passes both verdicts: bit for bit, and (as a node that is not deterministic would judge
    # it) within the noise, here none
    bench = bench_globals()
    assert bench['compare_resume'](runs / 'deterministic', runs / 'resumed', 2)[0] is True
    assert bench['within_noise'](runs / 'deterministic', runs / 'deterministic', runs / 'resumed')[0] is True


def nudge(run_dir, by):
    """Add `by` to every final weight of the run's checkpoint: their root mean square difference is by."""
    checkpoint = torch.load(run_dir / 'ckpt.pt', weights_only=True)
    for weight in checkpoint['model'].values():
        if weight.is_floating_point():
            weight += by
    torch.save(checkpoint, run_dir / 'ckpt.pt')


def test_a_resumed_run_whose_weights_differ_fails_and_within_the_noise_up_to_the_bound(node_run, tmp_path):
    bench = bench_globals()
    runs = shutil.copytree(node_run[0] / 'out' / 'node_check', tmp_path / 'runs')
    straight, resumed, again = runs / 'deterministic', runs / 'resumed', runs / 'again'
    assert bench['compare_resume'](straight, resumed, 2)[0] is True
    nudge(resumed, 1e-3)  # the logs still agree: only the weights tell
    passed, how = bench['compare_resume'](straight, resumed, 2)
    assert passed is False and how.startswith(
        'NOT exact: the runs agree up to the stop at step 2, the resumed one differs in the final weights')
    assert not bench['same_run'](straight, resumed) and bench['same_run'](straight, straight)
    # where deterministic mode does not hold: a second straight run 1e-3 away allows 2 x 1e-3 + 1e-6
    shutil.copytree(straight, again)
    nudge(again, 1e-3)
    assert bench['within_noise'](straight, again, resumed)[0] is True
    nudge(resumed, 2e-3)
    passed, how = bench['within_noise'](straight, again, resumed)
    assert passed is False and how.startswith("NOT within the noise: the resumed run's final weights differ "
                                              "from the straight run's by 0.003 (root mean square; up to")


def test_a_run_out_of_memory_is_what_the_fit_reports_rather_than_a_failed_run(tmp_path, monkeypatch):
    """launch as the fit calls it: a model too big for memory, which train.py refuses in one line before it
    allocates anything (and under an address-space limit all the same), returns False."""
    bench = bench_globals()
    limited = tmp_path / 'python'
    limited.write_text(f'#!/bin/sh\nulimit -v {8 << 20}\nexec {sys.executable} "$@"\n')  # 8 GB, in kB
    limited.chmod(0o755)
    monkeypatch.setattr(sys, 'executable', str(limited))
    monkeypatch.chdir(tmp_path)
    bench['write_synthetic_data'](os.path.join('data', 'node_check'), {})
    assert bench['launch']('fit', 1, ['--dataset=node_check', '--device=cpu', '--n_embd=200000',
                                      '--out_dir=out/fit'], out_of_memory_ok=True) is False
    assert not (tmp_path / 'out' / 'fit').exists()


# A stand-in for torchrun: it starts a "rank" in a session of its own, as torchrun does, says so, and waits
FAKE_TORCHRUN = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)
print(rank.pid)
print('waiting', end='\\r')
print('for ever')
time.sleep(600)
"""


def gone(pid, wait=10):
    """Whether process pid ends (or is left a zombie) within wait seconds."""
    for _ in range(int(wait / 0.1)):
        try:
            if Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'Z':
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_run_streams_each_line_as_it_comes_and_past_its_timeout_is_killed_ranks_and_all(capfd):
    bench = bench_globals()
    capfd.readouterr()  # bench.py's Overriding lines, when this test is the first to read it
    began = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        bench['stream']('fake', [sys.executable, '-c', FAKE_TORCHRUN], 5)
    assert str(stop.value) == ("bench.py: node check: the fake run did not end within run_timeout=5 s (a "
                               "hung rank or collective?); killed it and its ranks")
    assert time.monotonic() - began < 60
    streamed = capfd.readouterr().err.splitlines()  # before the run ended, which it never did
    assert streamed[1:] == ['[fake] waiting', '[fake] for ever']  # a '\r' (tqdm's) ends a line too
    assert gone(int(streamed[0].removeprefix('[fake] ')))  # the rank, in a session of its own
    # a run that ends: its exit status and lines, also when its last line has no newline
    assert bench['stream']('ends', [sys.executable, '-c', "print('one'); print('two', end='')"], 60) == (
        0, ['one', 'two'])
    assert capfd.readouterr().err.splitlines() == ['[ends] one', '[ends] two']


def test_ctrl_c_during_a_run_kills_it_ranks_and_all_and_ends_in_one_line(capfd):
    bench = bench_globals()
    # Python's own Ctrl-C handler, whatever an earlier in-process test left installed (once in the whole
    # suite the SIGINT was not raised as KeyboardInterrupt, and the run ended at its timeout instead)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(5, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, while stream waits
        with pytest.raises(SystemExit) as stop:
            bench['stream']('fake', [sys.executable, '-c', FAKE_TORCHRUN], 60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert str(stop.value) == "bench.py: node check interrupted; killed the fake run and its ranks"
    rank = next(line for line in capfd.readouterr().err.splitlines() if line.removeprefix('[fake] ').isdigit())
    assert gone(int(rank.removeprefix('[fake] ')))


def processes_in(folder):
    """The processes whose working folder is folder or under it (Linux's /proc)."""
    found = []
    for cwd in Path('/proc').glob('[0-9]*/cwd'):
        try:
            if Path(os.readlink(cwd)).is_relative_to(folder):
                found.append(cwd.parent.name)
        except OSError:
            continue  # ended meanwhile, or a zombie
    return found


def test_node_check_kills_a_run_past_run_timeout_with_its_ranks_and_names_it_in_its_last_line(tmp_path):
    # 5,000 steps, far more than 30 s
    run = node_check(tmp_path, TINY_SHAPE, '--node_iters=5000', '--run_timeout=30')
    assert run.returncode == 1 and run.stderr.splitlines()[-1] == (
        "bench.py: node check: the straight run did not end within run_timeout=30 s (a hung rank or "
        "collective?); killed it and its ranks")
    assert run.stdout.splitlines()[-1].startswith('straight run: ')  # no wall time: it never ended
    assert all(line.startswith(('[probe] ', '[straight] ')) for line in run.stderr.splitlines()[:-1]
               if line.strip() and not line.startswith('Overriding: '))  # bench.py's settings, the runs' lines
    for _ in range(100):  # torchrun and both ranks, each in a session of its own, and their workers
        if not processes_in(tmp_path):
            break
        time.sleep(0.1)
    assert processes_in(tmp_path) == []


def test_node_check_fails_past_its_thresholds_and_on_a_resume_that_drops_the_optimizer_state(tmp_path):
    """A copy of the code whose --init_from=resume keeps the fresh optimizer (AdamW's moments lost, its step
    count at 0), checked with floors no CPU reaches. The first step after the stop then moves each weight
    by about the rate, 6e-4, in the sign of its gradient: the logs part at step 4, the weights differ, and a
    second straight run, bit for bit the first on this deterministic CPU, tells a lost state from noise."""
    code = tmp_path / 'code'
    for name in ('vrl', 'lab', 'config'):
        shutil.copytree(Path(HERE, name), code / name, ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('train.py', 'model.py', 'ablations.py', 'configurator.py'):
        shutil.copy(Path(HERE, name), code / name)
    train = (code / 'train.py').read_text()
    load = "run_folder.load_optimizer_state(optimizer, scaler, ckpt, run.ckpt_path)"
    assert train.count(load) == 1
    (code / 'train.py').write_text(train.replace(load, 'pass  # a resume that loses the optimizer state'))
    (tmp_path / 'run').mkdir()
    run = node_check(tmp_path / 'run', f'{TINY_SHAPE} --peak_tflops=1', '--min_tokens_per_sec=1e9',
                     '--min_mfu=0.99', f'--node_config={code}/config/resformer_82m.py',
                     bench=code / 'lab' / 'bench.py')
    assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stdout + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert [line.split(' run:')[0] for line in lines if ' run: python ' in line] == [
        'probe', 'straight', 'deterministic', 'first half', 'resumed', 'deterministic again']
    said = {line.split(':')[0]: line for line in lines}
    assert re.fullmatch(r"tokens/s: [\d,]+ for the job, [\d,]+ per rank \(median of the straight run's 4 "
                        r"steps\); BELOW min_tokens_per_sec", said['tokens/s'])
    assert re.fullmatch(r"MFU per GPU: \d+\.\d% \(ours\), \d+\.\d% \(PaLM's\); floor 99% \(min_mfu\): "
                        r"BELOW it", said['MFU per GPU'])
    resume = [line for line in lines if line.startswith('resume: ')]
    assert resume[0].startswith('resume: not bit for bit; a second deterministic straight run')
    assert resume[1].startswith('resume: NOT exact: the runs agree up to the stop at step 2, the resumed one '
                                'differs from step 4; the final weights differ by up to ')
    assert resume[2].startswith('resume: a second deterministic straight run equals the first bit for bit: '
                                'this node is deterministic, so the resumed run lost state')
    # one line: each failure, with what was measured and the threshold it passed
    assert re.fullmatch(r"bench\.py: node check failed: [\d,]+ tokens/s per rank, below min_tokens_per_sec="
                        r"1,000,000,000; MFU \d+\.\d% per GPU \(ours\), below the floor of 99% \(min_mfu\); "
                        r"the resumed run does not continue the straight one \(the resume lines above\)",
                        run.stderr.splitlines()[-1]), run.stderr.splitlines()[-1]
    # both verdicts fail it: bit for bit, and against the noise of two straight runs (none here)
    bench, runs = bench_globals(), tmp_path / 'run' / 'out' / 'node_check'
    straight, again, resumed = runs / 'deterministic', runs / 'deterministic_again', runs / 'resumed'
    assert bench['compare_resume'](straight, resumed, 2)[0] is False
    passed, how = bench['within_noise'](straight, again, resumed)
    assert passed is False and float(re.search(r"straight run's by (\S+) \(root mean square", how)[1]) > 1e-5


def test_the_memory_verdicts_fail_past_their_thresholds_in_one_line_each(monkeypatch):
    """GPU only in the check (no peak memory on a CPU): here with made-up numbers."""
    bench = bench_globals()
    stated = "x.py's header estimate of 20 GB compiled"
    verdict = bench['memory_verdict']
    assert verdict([19.0], 20, stated, 143.8) == (
        f"peak memory per GPU: 19.0 GB, 0.95 x {stated}; 13% of the GPU's 143.8 GB", [])
    assert verdict([10.0, 9.5], 20, stated, 143.8) == (  # flagged, not failed: the estimate is too high
        f"peak memory per GPU: 10.0 GB (ranks 9.5-10.0), 0.50 x {stated} (under 0.7 x: the estimate is too "
        f"high); 7% of the GPU's 143.8 GB", [])
    # above the estimate: a warning up to max_memory_ratio (1.25), where a healthy node's missing bytes land
    assert verdict([20.4] * 8, 20, stated, 80) == (
        f"peak memory per GPU: 20.4 GB (ranks 20.4-20.4), 1.02 x {stated} (ABOVE it: a warning; fails above "
        f"1.25 x); 26% of the GPU's 80.0 GB", [])
    # one rank of eight far above the rest is judged by its own peak
    assert verdict([19.0] * 7 + [26.0], 20, stated, 80)[1] == [
        "peak memory 26.0 GB per GPU is 1.30 x the estimate of 20 GB, above max_memory_ratio=1.25"]
    assert verdict([75.0], 100, stated, 80)[1] == [
        "peak memory 75.0 GB per GPU is 94% of the GPU's 80.0 GB, above max_memory_fraction=0.9"]
    assert verdict([75.0], None, "x.py's header states no estimate", 80)[0] == (
        "peak memory per GPU: 75.0 GB, x.py's header states no estimate; 94% of the GPU's 80.0 GB")
    monkeypatch.setitem(bench, 'max_memory_ratio', 1.4)
    assert verdict([26.0], 20, stated, 80)[1] == []  # still marked ABOVE the estimate
    monkeypatch.setitem(bench, 'fit_config', f'{HERE}/config/resformer_1b6.py')
    fit = f'fit: {HERE}/config/resformer_1b6.py'
    assert bench['fit_verdict'](40.0, 80) == (
        f"{fit} fits: peak 40.0 GB of 80.0 GB per GPU (50%) in 3 steps; its header estimates 47 GB compiled "
        f"(0.85 x)", [])
    line, failed = bench['fit_verdict'](76.0, 80)
    assert line.startswith(f"{fit} peaks at 76.0 GB of 80.0 GB per GPU (95%), ABOVE max_memory_fraction=0.9")
    assert failed == [f"{HERE}/config/resformer_1b6.py peaks at 76.0 GB per GPU, 95% of the GPU's 80.0 GB, "
                      f"above max_memory_fraction=0.9"]
    assert bench['fit_verdict'](None, 80)[1] == [f"{HERE}/config/resformer_1b6.py does not fit: out of "
                                                 f"memory"]


def test_the_mfu_floor_is_the_gpus_from_mfu_floors_or_min_mfus_and_none_on_a_cpu(monkeypatch):
    bench = bench_globals()
    floor = bench['mfu_floor']
    assert floor('NVIDIA H100 80GB HBM3') == (0.15, "MFU_FLOORS's for NVIDIA H100 80GB HBM3")
    assert floor('NVIDIA A100-SXM4-80GB')[0] == 0.2 and floor('NVIDIA H200')[0] == 0.15
    assert floor(None) == (0, 'no floor on a CPU (min_mfu sets one)')
    assert floor('NVIDIA H800') == (0, 'no floor for NVIDIA H800, which MFU_FLOORS does not name (min_mfu '
                                       'sets one)')
    assert set(bench['MFU_FLOORS']) <= set(bench['metrics'].PEAK_TFLOPS)  # a GPU with a floor has an MFU
    monkeypatch.setitem(bench, 'min_mfu', 0.3)
    assert floor('NVIDIA H100 80GB HBM3') == floor(None) == (0.3, 'min_mfu')
    monkeypatch.setitem(bench, 'min_mfu', 0)
    assert floor('NVIDIA H100 80GB HBM3') == (0, 'no floor (min_mfu=0)')


def test_the_runs_estimate_is_unrounded_and_counts_what_the_header_leaves_out(monkeypatch):
    """The verdict's estimate is memory_estimate_gb's for the run's settings, unrounded (the header rounds
    it), plus the final norm's saved tensors, flash attention's log-sum-exp and cuBLAS's workspaces."""
    bench = bench_globals()
    config = f'{HERE}/config/resformer_82m.py'
    monkeypatch.setitem(bench, 'node_config', config)
    monkeypatch.setitem(bench, 'train_args', '--compile=True --peak_tflops=989')
    settings = bench['run_settings']()
    computed = bench['memory_estimate_gb'](settings, True)
    left_out = bench['unestimated_gb'](settings)
    # 82M: 64 x 2048 tokens a pass, d = 512, 8 heads, 8 layers: 6 x 512 + 4 x 8 x 8 bytes a token, 64 MiB
    assert left_out == pytest.approx((64 * 2048 * (6 * 512 + 4 * 64) + 64 * 2 ** 20) / 1e9)
    assert 0.3 < left_out < 0.6 and round(computed) == 37 and computed != 37
    assert bench['run_estimate'](True) == (computed + left_out, (
        f"the estimate of {computed + left_out:.3g} GB (compiled: memory_estimate_gb's {computed:.3g} and "
        f"{left_out:.2g} it leaves out; {config}'s header states 37 GB for its own settings)"))
    monkeypatch.setitem(bench, 'train_args', '--batch_size=16 --variant=vanilla')
    estimate, stated = bench['run_estimate'](True)
    assert 5 < estimate < 15 and estimate < computed


def test_the_probe_verdicts_fail_a_slow_gpu_a_slow_node_a_slow_all_reduce_and_a_busy_gpu(monkeypatch):
    """node_probe.py's report judged (GPU only in the check; here with made-up numbers of 8 H100s)."""
    bench = bench_globals()
    h100 = 'NVIDIA H100 80GB HBM3'

    def report(speeds, bandwidth=400.0, used=0.5):
        return {'ranks': [{'rank': i, 'local_rank': i, 'host': 'node7', 'matmul_tflops': x, 'matmul_n': 8192,
                           'matmul_dtype': 'bfloat16', 'memory_used_gb': used if i == 3 else 0.5}
                          for i, x in enumerate(speeds)],
                'all_reduce_busbw_gbps': bandwidth, 'all_reduce_bytes': 256 << 20, 'backend': 'nccl'}
    healthy = [700.0, 690.0, 710.0, 705.0, 695.0, 700.0, 702.0, 698.0]
    lines, failures = bench['probe_verdicts'](report(healthy), h100)
    assert failures == [] and lines == [
        'matmul per GPU: 700 690 710 705 695 700 702 698 TFLOP/s (8192^3 bfloat16); median 700',
        'all-reduce: 400 GB/s bus bandwidth (256 MB over 8 ranks, nccl); floor 100: passed']
    # one GPU throttled to half speed; all eight at a third of the datasheet's 989
    assert bench['probe_verdicts'](report(healthy[:7] + [350.0]), h100)[1] == [
        "rank 7's GPU (node7, local 7) multiplies at 350 TFLOP/s, below min_gpu_speed=0.8 x the node's median "
        "700"]
    assert bench['probe_verdicts'](report([330.0] * 8), h100)[1] == [
        "the node's median matmul, 330 TFLOP/s, is below min_matmul_fraction=0.4 x NVIDIA H100 80GB HBM3's "
        "datasheet 989.5"]
    # NVLink down: NCCL over PCIe or sockets; a GPU another process holds memory on
    assert bench['probe_verdicts'](report(healthy, bandwidth=18.0), h100)[1] == [
        "all-reduce bus bandwidth 18 GB/s, below 100 (NVLink down, NCCL without P2P, or on sockets?)"]
    assert bench['probe_verdicts'](report(healthy, used=12.0), h100)[1] == [
        "rank 3's GPU already holds 12.0 GB before any run (another process?)"]
    # a PCIe card has no bandwidth floor, a setting gives one, and 0 none
    assert bench['probe_verdicts'](report(healthy, bandwidth=18.0), 'NVIDIA H100 PCIe')[1] == []
    monkeypatch.setitem(bench, 'min_allreduce_gbps', 500.0)
    assert len(bench['probe_verdicts'](report(healthy), 'NVIDIA H100 PCIe')[1]) == 1
    monkeypatch.setitem(bench, 'min_allreduce_gbps', 0.0)
    assert bench['probe_verdicts'](report(healthy, bandwidth=1.0), h100)[1] == []


def test_the_probe_verdicts_fail_a_gpu_that_slows_in_its_burn_and_memory_of_other_processes():
    """A GPU whose matmul slows as it burns (hot, power-starved) fails, though its mean keeps up with the
    node's; the memory verdict counts what nvidia-smi lists for other processes where it can, not the
    probe's own CUDA context (which each rank's reading before it allocates includes)."""
    bench = bench_globals()
    h100 = 'NVIDIA H100 80GB HBM3'
    ranks = [{'rank': i, 'local_rank': i, 'host': 'node7', 'matmul_tflops': 700.0, 'matmul_tflops_first': 720.0,
              'matmul_tflops_last': 500.0 if i == 2 else 700.0, 'matmul_seconds': 30.0, 'matmul_n': 8192,
              'matmul_dtype': 'bfloat16', 'memory_used_gb': 1.3} for i in range(8)]
    report = {'ranks': ranks, 'all_reduce_busbw_gbps': 400.0, 'all_reduce_bytes': 256 << 20, 'backend': 'nccl'}
    held = {str(i): 0.0 for i in range(8)}
    assert bench['probe_verdicts'](report, h100, held)[1] == [
        "rank 2's GPU (node7, local 2) slowed from 720 to 500 TFLOP/s in its 30 s burn, below "
        "min_gpu_speed=0.8 x its start (heat or power?)"]
    ranks[2]['matmul_tflops_last'] = 700.0
    held['5'] = 12.5
    assert bench['probe_verdicts'](report, h100, held)[1] == [
        "GPU 5 already holds 12.5 GB of other processes' before any run (nvidia-smi --query-compute-apps)"]
    assert len(bench['probe_verdicts'](report, h100)[1]) == 8  # no listing: each rank's own reading


def test_other_processes_memory_is_read_per_gpu_from_nvidia_smi(tmp_path, monkeypatch):
    bench = bench_globals()
    script = tmp_path / 'nvidia-smi'
    script.write_text('#!/bin/sh\ncase "$1" in\n'
                      '  --query-gpu=*) printf "0, 00000000:18:00.0\\n1, 00000000:2A:00.0\\n" ;;\n'
                      f'  --query-compute-apps=*) cat {tmp_path}/apps.csv ;;\nesac\n')
    script.chmod(0o755)
    monkeypatch.setitem(bench, 'NVIDIA_SMI', str(script))
    (tmp_path / 'apps.csv').write_text('00000000:2a:00.0, 4242, 2048\n00000000:2A:00.0, 4343, 1024\n')
    assert bench['other_processes_gb']() == {'0': 0.0, '1': pytest.approx(3072 * 2 ** 20 / 1e9)}
    (tmp_path / 'apps.csv').write_text('')  # none running
    assert bench['other_processes_gb']() == {'0': 0.0, '1': 0.0}
    (tmp_path / 'apps.csv').write_text('00000000:18:00.0, 4242, [N/A]\n')  # a container's view: unknown
    assert bench['other_processes_gb']() is None


def test_the_health_read_during_the_burn_fails_a_gpu_throttled_only_under_load(tmp_path, monkeypatch):
    """At rest every GPU looks well; a reading during the probe's burn shows GPU 5 in thermal slowdown and
    GPU 1 with ECC errors: both fail. HealthUnderLoad reads nvidia-smi while its block runs."""
    bench = bench_globals()
    at_rest = ''.join(f'{i}, 0, 0x0000000000000001\n' for i in range(8))
    rows = ''.join(f'00000000:{i:02X}:00.0, No, No\n' for i in range(8))
    monkeypatch.setitem(bench, 'NVIDIA_SMI', fake_nvidia_smi(tmp_path, at_rest, rows))
    loaded = [{'index': str(i), 'ecc': '2' if i == 1 else '0', 'throttle': '0x0000000000000044' if i == 5
               else '0x0000000000000004'} for i in range(8)]  # 0x4: the power cap, a busy GPU's
    assert bench['health_verdicts']([loaded, loaded]) == (
        ['health (8 GPUs; ECC, remapped rows, throttle reasons; read at rest and 2 times in the burn): FAILED'],
        ['GPU 1: 2 uncorrected ECC errors since boot', 'GPU 5: throttled (thermal slowdown (hardware))'])
    with bench['HealthUnderLoad'](every=0.05) as watch:
        time.sleep(1)
    assert watch.readings and watch.readings[0][7] == {'index': '7', 'ecc': '0', 'throttle': '0x0000000000000001'}


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason='needs torch.distributed with gloo')
def test_the_link_check_runs_the_probe_over_two_simulated_nodes(tmp_path):
    """bench.py --link_check on each of two "nodes" (here one machine, one CPU rank each): one torchrun over
    both, meeting at rdzv_endpoint; the node that ran rank 0 judges the all-reduce between them, the other
    says where the verdict is. A bad endpoint is refused in one line before anything starts."""
    import socket
    with socket.socket() as s:
        s.bind(('localhost', 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([sys.executable, os.path.join(HERE, 'lab', 'bench.py'), '--link_check',
                               '--device=cpu', '--nproc=1', '--burn_seconds=0', f'--rdzv_endpoint=localhost:{port}'],
                              cwd=tmp_path / name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS='1'))
             for name in ('node0', 'node1') if (tmp_path / name).mkdir() is None]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    verdicts = [stdout.splitlines()[-1] for stdout, _ in outputs]
    assert sorted(verdicts) == ['link check passed',
                                'link check: rank 0 ran on another node, whose link check judges the links']
    judged = outputs[verdicts.index('link check passed')][0]
    assert re.search(r"all-reduce: \S+ GB/s bus bandwidth \(1 MB over 2 ranks, gloo\); no floor", judged), judged
    refused = subprocess.run([sys.executable, 'lab/bench.py', '--link_check', '--rdzv_endpoint=node0'],
                             cwd=HERE, capture_output=True, text=True)
    assert (refused.returncode, refused.stderr.splitlines()[-1]) == (1, (
        "bench.py: link check: nnodes=2, rdzv_endpoint='node0'; use 2 or more nodes and node 0's HOST:PORT, "
        "e.g. --rdzv_endpoint=node0:29500, the same on every node"))


def fake_nvidia_smi(tmp_path, gpu_rows, remapped_rows, old_driver=False):
    """A stand-in nvidia-smi that prints canned CSV for the health check's two queries (an old driver refuses
    clocks_event_reasons, as drivers before 535 do)."""
    script = tmp_path / 'nvidia-smi'
    script.write_text("#!/bin/sh\n"
                      'case "$1" in\n'
                      f"  *clocks_event_reasons*) {'exit 2' if old_driver else 'cat gpus.csv'} ;;\n"
                      "  --query-gpu=*) cat gpus.csv ;;\n"
                      "  --query-remapped-rows=*) cat remapped.csv ;;\n"
                      "esac\n".replace('cat ', f'cat {tmp_path}/'))
    script.chmod(0o755)
    (tmp_path / 'gpus.csv').write_text(gpu_rows)
    (tmp_path / 'remapped.csv').write_text(remapped_rows)
    return str(script)


def test_the_health_check_reads_ecc_remapped_rows_and_throttle_reasons_where_present(tmp_path, monkeypatch):
    bench = bench_globals()
    good_gpus = ''.join(f'{i}, 0, 0x0000000000000001\n' for i in range(8))  # idle
    good_rows = ''.join(f'00000000:{i:02X}:00.0, No, No\n' for i in range(8))
    monkeypatch.setitem(bench, 'NVIDIA_SMI', fake_nvidia_smi(tmp_path, good_gpus, good_rows))
    assert bench['health_verdicts']() == (
        ['health (8 GPUs; ECC, remapped rows, throttle reasons): passed'], [])
    bad_gpus = good_gpus.replace('2, 0, 0x0000000000000001', '2, 3, 0x0000000000000001').replace(
        '5, 0, 0x0000000000000001', '5, 0, 0x0000000000000048')  # hardware slowdown and thermal
    bad_rows = good_rows.replace('00000000:04:00.0, No, No', '00000000:04:00.0, Yes, No')
    monkeypatch.setitem(bench, 'NVIDIA_SMI', fake_nvidia_smi(tmp_path, bad_gpus, bad_rows, old_driver=True))
    lines, failures = bench['health_verdicts']()
    assert lines == ['health (8 GPUs; ECC, remapped rows, throttle reasons): FAILED'] and failures == [
        'GPU 2: 3 uncorrected ECC errors since boot',
        'GPU 5: throttled (hardware slowdown, thermal slowdown (hardware))',
        'GPU 00000000:04:00.0: remapped rows pending (reset the GPU to apply them)']
    # fields a GPU cannot report are left unjudged, and a missing nvidia-smi is said, not failed
    monkeypatch.setitem(bench, 'NVIDIA_SMI', fake_nvidia_smi(tmp_path, '0, [N/A], [Not Supported]\n', ''))
    assert bench['health_verdicts']() == (['health (1 GPUs; no field readable): passed'], [])
    monkeypatch.setitem(bench, 'NVIDIA_SMI', str(tmp_path / 'no-such-nvidia-smi'))
    assert bench['health_verdicts']() == ([f"health: not read ({tmp_path / 'no-such-nvidia-smi'} not found or "
                                           f"refused the query)"], [])


def test_every_full_scale_configs_header_states_the_memory_bench_computes_for_it():
    """bench.py reads each header's estimate; memory_estimate_gb recomputes it from the config's settings,
    so no header drifts from the one method (docs/training.md, 'How the memory estimates are made')."""
    bench = bench_globals()
    checked = []
    for path in sorted(Path(HERE, 'config').glob('*.py')):
        if path.name == 'paper_recipe.py' or 'paper_recipe.py' not in path.read_text():
            continue  # the full-scale configs run the recipe first
        settings = _read_config_file(str(path))
        assert bench['memory_estimate'](path) == {
            'eager': round(bench['memory_estimate_gb'](settings, compiled=False)),
            'compiled': round(bench['memory_estimate_gb'](settings, compiled=True)),
            'sequences': settings['batch_size'],
            'tokens': settings['block_size']}, path.name
        checked.append(path.name)
    assert len(checked) >= 15 and 'resformer_1b6.py' in checked


def test_every_full_scale_configs_batch_size_is_the_largest_that_fits_its_memory_with_headroom():
    """batch_size (a GPU's pass) is micro_batch's: the largest power of two whose compiled estimate, with
    what it leaves out, fits 60 GB (80 GB less 25%); the step keeps its 1024 sequences."""
    bench = bench_globals()
    sizes = {}
    for path in sorted(Path(HERE, 'config').glob('*.py')):
        if path.name == 'paper_recipe.py' or 'paper_recipe.py' not in path.read_text():
            continue
        settings = _read_config_file(str(path))
        b, steps = settings['batch_size'], settings['gradient_accumulation_steps']
        assert b == bench['micro_batch'](settings) and b * steps == 1024, path.name
        doubled = settings | {'batch_size': 2 * b}
        assert (bench['memory_estimate_gb'](doubled, compiled=True) + bench['unestimated_gb'](doubled)
                > bench['MICRO_BATCH_BUDGET_GB']), path.name  # twice as many would not fit
        sizes[path.name] = b
    assert (sizes['resformer_82m.py'], sizes['resformer_180m.py'], sizes['resformer_468m.py'],
            sizes['resformer_1b6.py']) == (64, 32, 16, 4)


def test_save_cost_saves_each_config_as_train_py_does_and_leaves_nothing(tmp_path):
    """--save_cost writes each config's checkpoint (fp32 weights and AdamW's two moments: 12 bytes a
    parameter) through train.py's RunFolder, and says its size and times; a config's own imports (as the
    full-scale configs' `import os`) stay out of it; the folder it wrote in is gone afterwards."""
    config = tmp_path / 'tiny.py'
    config.write_text("import os\nn_layer = 2\nn_head = 2\nn_embd = 64\nblock_size = 64\n")
    run = subprocess.run([sys.executable, os.path.join(HERE, 'lab', 'bench.py'), '--save_cost',
                          f"--save_configs=('{config}',)"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    row = run.stdout.splitlines()[-1].split(' | ')
    # GPT-2's padded vocabulary in and out (2 x 50,304 x 64) and two blocks: 6.56M parameters, 79 MB
    assert row[0] == '| tiny.py' and row[1] == '7M' and row[2] == '0.08 GB', row
    assert os.listdir(tmp_path) == ['tiny.py']


def test_node_check_names_the_failing_runs_error_in_its_last_line(tmp_path):
    # the loss becomes NaN at the first step: train.py's rank stops, and torchrun's summary holds its one line
    run = node_check(tmp_path, f'{TINY_SHAPE} --learning_rate=1e30 --warmup_iters=0')
    assert run.returncode == 1 and 'Root Cause' in run.stderr  # torchrun's last lines, shown above
    assert run.stderr.splitlines()[-1].startswith(
        'bench.py: node check: the straight run failed with exit status 1 (train.py: the training loss or '
        'gradient norm became NaN or inf by step 1')


@pytest.mark.parametrize('args, message', [
    (['--device=cpu', '--nproc=-1'], "bench.py: nproc=-1; use 1 or more ranks, or 0 for one per GPU"),
    (['--device=cpu', '--node_iters=1'], "bench.py: node_iters=1; use 2 or more (a run stops halfway to "
                                         "resume)"),
    (['--device=cpu', '--run_timeout=0'], "bench.py: run_timeout=0; use seconds above 0"),
    (['--device=cpu', '--max_memory_fraction=1.5'], "bench.py: min_mfu=None, min_tokens_per_sec=0.0, "
                                                    "max_memory_ratio=1.25, max_memory_fraction=1.5; use floors "
                                                    "of 0 or more, a ratio above 0 and a fraction above 0, at "
                                                    "most 1"),
    (['--device=cpu', '--node_config=nope.py'], "bench.py: node_config='nope.py' not found; name a config "
                                                "file, e.g. config/resformer_82m.py"),
    (['--device=cpu', '--fit_config=nope.py'], "bench.py: fit_config='nope.py' not found; name a config "
                                               "file, or '' to skip the fit"),
    (['--device=cuda'], "bench.py: the node check found no GPU (torch.cuda.is_available() is False: no GPU, "
                        "or a CUDA wheel the driver cannot run); to try it on this CPU, --device=cpu with a "
                        "tiny shape (docs/training.md, 'Checking a node')"),
])
def test_node_check_settings_it_cannot_run_exit_with_one_line_before_any_run(tmp_path, args, message):
    if args == ['--device=cuda'] and torch.cuda.is_available():
        pytest.skip('a GPU is here')
    run = subprocess.run([sys.executable, os.path.join(HERE, 'lab', 'bench.py'), '--node_check', NODE_CHECK[-1],
                          '--fit_config=', *args], cwd=tmp_path, capture_output=True, text=True)
    assert (run.returncode, run.stdout, run.stderr.splitlines()[-1]) == (1, '', message)
    assert os.listdir(tmp_path) == []  # no data written, no run started


def test_estimate_check_tables_train_pys_estimate_against_its_measured_steps(tmp_path):
    """The plumbing on one tiny run: the estimate parsed from train.py's output, the measured mean from its
    log. No number is checked: a loaded machine makes them anything."""
    lines = (f'line {i}: value residual first layer.' for i in range(2000))
    (tmp_path / 'tiny.txt').write_text('\n'.join(lines))
    subprocess.run([sys.executable, os.path.join(HERE, 'prepare.py'), '--input=tiny.txt',
                    '--out_dir=data/tiny_char'], cwd=tmp_path, check=True, capture_output=True)
    tiny = ('--dataset=tiny_char --n_layer=2 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 '
            '--eval_iters=1 --warmup_iters=2')
    run = subprocess.run([sys.executable, os.path.join(HERE, 'lab', 'bench.py'), '--estimate_check', '--device=cpu',
                          "--estimate_configs=('',)", '--estimate_iters=20', f'--train_args={tiny}'],
                         cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert run.returncode == 0, run.stderr
    header, rule, row = run.stdout.splitlines()
    assert header == '| config | estimated s/step | measured s/step | estimated / measured |'
    name, estimated, measured, ratio = (cell.strip() for cell in row.strip('|').split('|'))
    assert name == 'defaults'
    assert float(ratio) == pytest.approx(float(estimated) / float(measured), rel=0.01, abs=0.01)
