"""train.py end to end on a tiny model and corpus: learning, exact resume, DDP, and its one-line errors."""
import ast
import builtins
import contextlib
import importlib.util
import inspect
import itertools
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from ablations import BASELINES, AblationConfig, build_model
from configurator import configure
from model import GPT, VARIANTS, GPTConfig
from testing import run_script, train_defaults
from vrl import locks, run_folder, settings
from vrl.optim import configure_optimizers
from vrl.run_folder import load_checkpoint

REPO = Path(__file__).resolve().parents[1]  # the repository root
TINY = ['--dataset=tiny_char', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32',
        '--batch_size=8', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2', '--learning_rate=3e-3',
        '--min_lr=3e-4']
# a step of 2 passes of 8 sequences (nanoGPT's meaning: passes over all ranks together), so that it splits
# over 2 ranks, one pass each; a one-process run with it reads the same 16 sequences a step
TWO_PASSES = ['--gradient_accumulation_steps=2']


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    """A folder holding data/tiny_char, prepared by prepare.py from a small generated corpus."""
    workdir = tmp_path_factory.mktemp('train')
    rng = random.Random(0)
    words = ['value', 'residual', 'first', 'layer', 'attention', 'token', 'sink', 'drain', 'query', 'key']
    lines = [' '.join(rng.choice(words) for _ in range(rng.randint(3, 9))) + '.' for _ in range(3000)]
    (workdir / 'tiny.txt').write_text('\n'.join(lines))
    run([REPO / 'prepare.py', '--input=tiny.txt', '--out_dir=data/tiny_char'], workdir)
    return workdir


def run(args, cwd, check=True, timeout=300, **kw):
    result = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def train(workdir, *args, check=True):
    return train_here(workdir, [*TINY, *args], check)


def train_here(workdir, args, check=True, script=REPO / 'train.py'):
    """`python train.py args` run from workdir, in this process: a CompletedProcess."""
    return run_script(script, args, workdir, check)


def log(workdir, out_dir, key):
    """{step: value} of one metric from out_dir/log.jsonl."""
    with open(workdir / out_dir / 'log.jsonl') as f:
        return {r['step']: r[key] for r in map(json.loads, f) if key in r}


def records(workdir, out_dir):
    """Every record of out_dir/log.jsonl, in order, without its timing fields."""
    with open(workdir / out_dir / 'log.jsonl') as f:
        return [{k: v for k, v in json.loads(line).items() if k not in ('tokens_per_sec', 'mfu')}
                for line in f]


LOCK_FILES = ('.lock', '.lock.pid')


def snapshot(folder):
    """Every file under `folder` with its size and modification time, and every folder: to show that nothing
    changed. Not out_dir's lock files, nor a folder's modification time: a run takes out_dir's lock before it
    checks anything else (so two runs racing into one folder never both write), which makes out_dir/.lock (an
    empty file, left there as filelock does) and, for a moment, .lock.pid."""
    return {path: None if path.is_dir() else (path.stat().st_size, path.stat().st_mtime_ns)
            for path in Path(folder).rglob('*') if path.name not in LOCK_FILES}


def one_line_error(result, *words):
    """A non-zero exit whose last stderr line (after any progress bar) names the problem, and no traceback."""
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last


def stop_line(stdout, stderr):
    """The line a run stopped at a step boundary ends with: its console's last (rank 0's, above the progress
    bar, which is on stderr), with no traceback anywhere."""
    assert 'Traceback' not in stderr and 'Traceback' not in stdout, stderr[-3000:]
    return stdout.strip().splitlines()[-1]


def test_training_lowers_the_loss(workdir):
    """The loss falls; each evaluation's record holds the step, the loss, its domains' (none for one split)
    and the best so far, and its console line says the loss and the best."""
    result = train(workdir, '--out_dir=out_learn', '--max_iters=60', '--eval_interval=30',
                   '--lr_decay_iters=60')
    val = log(workdir, 'out_learn', 'val_loss')
    assert val[60] < 0.75 * val[0], val
    evaluations = [r for r in records(workdir, 'out_learn') if 'val_loss' in r]
    assert [list(r) for r in evaluations] == [['step', 'val_loss', 'val_loss_domains', 'best_val_loss']] * 3
    assert [r['val_loss_domains'] for r in evaluations] == [None] * 3
    assert [r['best_val_loss'] for r in evaluations] == list(itertools.accumulate(val.values(), min))
    assert f'step 60: val loss {val[60]:.4f} (best {min(val.values()):.4f})' in result.stdout
    assert '256 tokens per step' in result.stdout
    # the time to go, once step 0's evaluation and a step past the first two have been timed
    assert re.search(r'^about \S+ (s|min|h) to go: 57 steps of \S+ (s|min|h) and 2 evaluation\(s\)$',
                     result.stdout, re.M), result.stdout


def flip_a_byte(path, member=None, at=None, bit=0x40):
    """Flip one bit of a member of the checkpoint path (a zip that torch.save stores uncompressed), as a disk or
    a copy may: by default the middle byte of its biggest member, a tensor's; else of the member whose name
    ends in `member`, at offset at(its bytes)."""
    with zipfile.ZipFile(path) as archive:
        info = (max(archive.infolist(), key=lambda i: i.file_size) if member is None else
                next(i for i in archive.infolist() if i.filename.endswith(member)))
    data = bytearray(path.read_bytes())
    header = info.header_offset  # the local header's name and extra field (torch pads the latter)
    name_length, extra_length = (int.from_bytes(data[header + i:header + i + 2], 'little') for i in (26, 28))
    start = header + 30 + name_length + extra_length
    offset = info.file_size // 2 if at is None else at(bytes(data[start:start + info.file_size]))
    data[start + offset] ^= bit
    path.write_bytes(bytes(data))


def test_best_pt_is_a_file_of_its_own(workdir):
    """best.pt is a copy of the checkpoint it was (not a second name of ckpt.pt's file): a flipped byte in
    either leaves the other loadable."""
    train(workdir, '--out_dir=out_own_best', '--max_iters=2', '--eval_interval=2')
    val = log(workdir, 'out_own_best', 'val_loss')
    best, ckpt = workdir / 'out_own_best' / 'best.pt', workdir / 'out_own_best' / 'ckpt.pt'
    assert val[2] < val[0]  # the last evaluation was the best: both hold step 2
    assert not os.path.samefile(best, ckpt) and best.read_bytes() == ckpt.read_bytes()
    for damaged, intact in (ckpt, best), (best, ckpt):
        good = damaged.read_bytes()
        flip_a_byte(damaged)
        with pytest.raises(SystemExit, match=f'checkpoint {damaged} is damaged'):
            load_checkpoint(damaged)
        assert load_checkpoint(intact)[1]['iter_num'] == 2
        damaged.write_bytes(good)


def test_reading_the_next_steps_windows_ahead_changes_nothing(workdir, monkeypatch):
    """Training windows are read a step ahead, in a thread, while the step before computes (a network file
    system stalls every read): the log and weights are bit-identical to those of the same train.py reading
    each step's windows in the step (dropout on, 2 passes a step)."""
    source = (REPO / 'train.py').read_text()
    ahead = 'reader.submit(get_batch, iter_num + 1) if iter_num + 1 < max_iters else None'
    assert source.count(ahead) == 1
    (workdir / 'train_in_step.py').write_text(source.replace(ahead, 'None'))
    stack, in_main_thread = np.stack, []

    def noted(*args, **kwargs):
        in_main_thread.append(threading.current_thread() is threading.main_thread())
        return stack(*args, **kwargs)

    monkeypatch.setattr(np, 'stack', noted)
    args = [*TINY, '--max_iters=6', '--eval_interval=3', '--lr_decay_iters=6', '--dropout=0.1',
            '--variant=resformer_learnable', '--gradient_accumulation_steps=2', '--batch_size=4']
    train_here(workdir, [*args, '--out_dir=out_ahead'])
    assert in_main_thread.count(False) == 5 * 2  # steps 1-5, each 2 passes; step 0 in the main thread
    in_main_thread.clear()
    train_here(workdir, [*args, '--out_dir=out_in_step'], script=workdir / 'train_in_step.py')
    assert in_main_thread and all(in_main_thread)
    assert records(workdir, 'out_ahead') == records(workdir, 'out_in_step')
    assert_same_weights(weights(workdir, 'out_ahead'), weights(workdir, 'out_in_step'))


def test_a_pass_returns_the_loss_alone(workdir, monkeypatch):
    """Every forward pass train.py makes, training's or evaluation's, gives the model targets and gets back
    its loss alone, a scalar, no logits (B x T x vocab: 13 GB at 82M), so none is held past it. Each training
    pass's inputs and targets are two views of one block of windows, copied to the device once (evaluation's
    targets are a new tensor, so that its padded pieces have the layout of the others)."""
    forward, returned, one_block = GPT.forward, [], []

    def watched_forward(model, idx, targets=None, **kwargs):
        if model.training:
            one_block.append(idx.untyped_storage().data_ptr() == targets.untyped_storage().data_ptr())
        loss = forward(model, idx, targets, **kwargs)
        returned.append((targets is not None, loss.shape))
        return loss

    monkeypatch.setattr(GPT, 'forward', watched_forward)
    train(workdir, '--out_dir=out_logits', '--max_iters=3', '--eval_interval=3', '--batch_size=4',
          '--gradient_accumulation_steps=2', '--eval_iters=4')
    monkeypatch.undo()
    # 4 evaluation passes at step 0 (16 windows), 3 steps of 2 passes, 4 at step 3
    assert returned == [(True, ())] * (4 + 3 * 2 + 4)
    assert len(one_block) == 3 * 2 and all(one_block)


def test_evaluation_takes_passes_of_batch_size_and_keeps_its_loss(workdir, monkeypatch):
    """Evaluation forwards passes of batch_size sequences, as training's are (so a compiled model compiles
    no batch size of its own, and memory stays what training takes), every validation window too
    (eval_full), the last piece padded; and the loss stays that of any other split: the same weights score
    every window alike in passes of 4 (which divide them) and of 3 (the last one padded)."""
    forward, sizes = GPT.forward, []

    def counted(model, idx, *args, **kwargs):
        sizes.append((model.training, idx.size(0)))
        return forward(model, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, 'forward', counted)
    train(workdir, '--out_dir=out_eval_passes', '--max_iters=4', '--eval_interval=2', '--lr_decay_iters=4',
          '--batch_size=4', '--gradient_accumulation_steps=2', '--eval_full=True')
    monkeypatch.undo()
    assert {n for training, n in sizes if training} == {n for training, n in sizes if not training} == {4}
    tokens = len(np.fromfile(workdir / 'data' / 'tiny_char' / 'val.bin', dtype=np.uint16))
    windows = len(range(0, tokens - 32, 32))
    assert windows % 4 == 0 and windows % 3 != 0
    full = []
    for size in 4, 3:  # max_iters=0: step 0's weights, scored on every window (the run's last evaluation)
        train(workdir, f'--out_dir=out_eval_passes_{size}', '--max_iters=0', f'--batch_size={size}',
              '--eval_full=True')
        full.append(log(workdir, f'out_eval_passes_{size}', 'val_loss_full')[0])
    assert log(workdir, 'out_eval_passes_3', 'val_windows_full')[0] == windows
    assert full[1] == pytest.approx(full[0], rel=1e-6)


DOMAINS = {'arxiv': [300], 'github': [600, 200], 'wikipedia': [2000]}  # tokens in each validation file


def domain_data(workdir, name='domains_char', train_shards=None):
    """data/<name>, SlimPajama's layout built by hand: a training shard (or shards of random tokens of the
    lengths train_shards gives), and a validation split kept by domain, with domains of different sizes (one
    in two files) and kinds of text: random tokens, a cycle, and a random walk. Returns {domain: its
    validation arrays}."""
    folder, rng, vocab = workdir / 'data' / name, np.random.default_rng(0), 16
    kinds = {'arxiv': lambda n: rng.integers(0, vocab, n), 'github': lambda n: np.arange(n) % vocab,
             'wikipedia': lambda n: np.cumsum(rng.choice([-1, 1], n)) % vocab}
    files = ({f'train_{i:05d}.bin': rng.integers(0, vocab, n) for i, n in enumerate(train_shards or [])}
             or {'train_00000.bin': np.concatenate([kind(3000) for kind in kinds.values()])})
    val_domains = {domain: [] for domain in DOMAINS}
    for domain, sizes in DOMAINS.items():
        for i, n in enumerate(sizes):
            files[f'val_{domain}_{i:05d}.bin'] = kinds[domain](n)
            val_domains[domain].append(f'val_{domain}_{i:05d}.bin')
    folder.mkdir(parents=True, exist_ok=True)
    for name, tokens in files.items():
        tokens.astype(np.uint16).tofile(folder / name)
    meta = {'tokenizer': 'char', 'chars': [chr(97 + i) for i in range(vocab)], 'vocab_size': vocab,
            'files': {name: len(tokens) for name, tokens in files.items()}, 'max_token': vocab - 1,
            'val_domains': val_domains}
    (folder / 'meta.json').write_text(json.dumps(meta))
    return {domain: [files[name].astype(np.int64) for name in names] for domain, names in val_domains.items()}


def test_validation_by_domain_is_the_unweighted_mean_of_each_domains_loss(workdir):
    """Where the data keeps its validation split by domain (SlimPajama), each domain is scored on its own
    fixed windows: each val record of log.jsonl holds every domain's loss, and val_loss is their unweighted
    mean (the paper's measure); the checkpoint keeps that evaluation, and each domain's loss is the
    checkpoint's, computed here by hand on that domain's windows. A domain too small for its share of windows
    is one line."""
    val = domain_data(workdir)
    train(workdir, '--dataset=domains_char', '--out_dir=out_domains', '--max_iters=4', '--eval_interval=2',
          '--lr_decay_iters=4')
    evaluations = [r for r in records(workdir, 'out_domains') if 'val_loss' in r]
    assert [r['step'] for r in evaluations] == [0, 2, 4]
    for record in evaluations:
        assert list(record['val_loss_domains']) == list(DOMAINS)
        assert record['val_loss'] == pytest.approx(sum(record['val_loss_domains'].values()) / len(DOMAINS))
    model, checkpoint = load_checkpoint(workdir / 'out_domains' / 'ckpt.pt')
    assert checkpoint['iter_num'] == 4 and checkpoint['last_eval'] == evaluations[-1]
    T, count = 32, 8  # eval_iters x batch_size = 16 windows over 3 domains: a batch of 8 each
    for domain, arrays in val.items():
        places = [(a, i) for a, array in enumerate(arrays) for i in range(0, len(array) - T - 1, T)]
        rows = torch.tensor(np.stack([arrays[a][i:i + T + 1] for a, i in
                                      (places[round(k * (len(places) - 1) / (count - 1))]
                                       for k in range(count))]))
        with torch.no_grad():
            loss = model.eval()(rows[:, :-1], rows[:, 1:]).item()
        assert evaluations[-1]['val_loss_domains'][domain] == pytest.approx(loss, abs=1e-5), domain
    one_line_error(train(workdir, '--dataset=domains_char', '--out_dir=out_domains_few', '--eval_iters=20',
                         '--max_iters=4', check=False),
                   'train.py: the validation split of domain arxiv has 9 windows of 32 tokens, fewer than '
                   'the 56 evaluation takes; lower eval_iters or batch_size')


def test_the_last_evaluation_scores_every_validation_window_of_every_domain(workdir):
    """On data kept by domain, the last evaluation (and eval_only) scores every validation window of every
    domain beside the fixed sample: val_loss_full_domains holds each domain's mean loss over all its windows
    (computed here by hand from the checkpoint), val_loss_full their unweighted mean, and the checkpoint's
    last_eval records it; the console says both losses. Evaluation passes of 3 leave a domain's last piece
    short: it is padded."""
    val = domain_data(workdir)
    common = ['--dataset=domains_char', '--out_dir=out_full_val', '--lr_decay_iters=2', '--batch_size=3']
    train(workdir, *common, '--max_iters=2', '--eval_interval=1')
    evaluations = [r for r in records(workdir, 'out_full_val') if 'val_loss' in r]
    assert ['val_loss_full' in r for r in evaluations] == [False, False, True]
    last = evaluations[-1]
    model, checkpoint = load_checkpoint(workdir / 'out_full_val' / 'ckpt.pt')
    assert checkpoint['last_eval'] == last and list(last['val_loss_full_domains']) == list(DOMAINS)
    T, total = 32, 0
    for domain, arrays in val.items():
        rows = torch.tensor(np.stack([array[i:i + T + 1] for array in arrays
                                      for i in range(0, len(array) - T, T)]))
        total += len(rows)
        with torch.no_grad():
            loss = model.eval()(rows[:, :-1], rows[:, 1:]).item()
        assert last['val_loss_full_domains'][domain] == pytest.approx(loss, abs=1e-5), domain
    assert last['val_windows_full'] == total == 9 + 18 + 6 + 62
    assert last['val_loss_full'] == pytest.approx(sum(last['val_loss_full_domains'].values()) / len(DOMAINS))
    scored = train(workdir, *common, '--max_iters=2', '--eval_only=True', '--init_from=resume')
    assert f"step 2: val loss {last['val_loss']:.4f}; all 95 windows: {last['val_loss_full']:.4f}" \
        in scored.stdout.splitlines(), scored.stdout


RECORD_FORWARDS = """import json, os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from model import GPT
forward, calls = GPT.forward, []
def recorded(model, idx, *args, **kwargs):
    calls.append((model.training, idx.tolist()))
    return forward(model, idx, *args, **kwargs)
GPT.forward = recorded
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
finally:
    with open(f"forwards_{os.environ['RANK']}.json", 'w') as f:
        json.dump(calls, f)
"""


def batches_read(calls):
    """The training batches a run's forward calls [(training, rows)] read, step by step (one pass a step
    here)."""
    return [rows for training, rows in calls if training]


def test_one_epoch_reads_every_training_window_once_over_ranks_and_resumes_in_order(workdir, monkeypatch):
    """On data kept by domain (SlimPajama's layout), data_order='auto' reads each training window once: 2
    shards of 20 and 28 windows, 6 steps of 8 windows on 2 ranks read all 48 once; one process, stopped at
    step 3 and resumed, reads the same batches in the same order; data_order='epochs' goes on into a second
    epoch, in a new order. A run that needs more windows than the split holds stops at start with one line.
    (Under torchrun a step of 8 windows is 2 passes of 4, one a rank; on one process, one pass of 8.)"""
    T = 32
    domain_data(workdir, 'epoch_char', train_shards=[20 * T + 1, 28 * T + 1])
    shards = [np.fromfile(workdir / 'data' / 'epoch_char' / f'train_0000{i}.bin', dtype=np.uint16)
              for i in (0, 1)]
    window = {tuple(shard[i:i + T].tolist()): (s, i) for s, shard in enumerate(shards)
              for i in range(0, len(shard) - T, T)}
    assert len(window) == 48  # no two windows alike: a batch's rows say which windows it read
    common = [*TINY, '--dataset=epoch_char', '--eval_interval=3', '--lr_decay_iters=6']
    (workdir / 'record_forwards.py').write_text(RECORD_FORWARDS)
    torchrun(workdir, *common, '--gradient_accumulation_steps=2', '--batch_size=4', '--max_iters=6',
             '--out_dir=out_epoch_ddp', script=(workdir / 'record_forwards.py', REPO / 'train.py'))
    ranks = [batches_read(json.loads((workdir / f'forwards_{rank}.json').read_text())) for rank in (0, 1)]
    steps = [first + second for first, second in zip(*ranks)]  # rank 0's half of each batch, then rank 1's
    assert len(steps) == 6
    assert sorted(window[tuple(row)] for rows in steps for row in rows) == sorted(window.values())

    forward, calls = GPT.forward, []

    def recorded(model, idx, *args, **kwargs):
        calls.append((model.training, idx.tolist()))
        return forward(model, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, 'forward', recorded)
    train(workdir, *common, '--max_iters=3', '--out_dir=out_epoch')
    resumed = batches_read(calls)
    calls.clear()
    train(workdir, *common, '--max_iters=6', '--out_dir=out_epoch', '--init_from=resume')
    assert resumed + batches_read(calls) == steps
    calls.clear()
    train(workdir, *common, '--max_iters=12', '--out_dir=out_epochs', '--data_order=epochs')
    twice = batches_read(calls)
    assert twice[:6] == steps and twice[6:] != steps
    assert sorted(window[tuple(row)] for rows in twice[6:] for row in rows) == sorted(window.values())

    one_line_error(train(workdir, *common, '--max_iters=7', '--out_dir=out_epoch_long', check=False),
                   'train.py: 7 steps of 8 windows read 56 windows of 32 tokens (1,792 tokens), but the '
                   "training split of data/epoch_char holds 48, each read once (data_order='auto'); prepare "
                   'enough with `python prepare.py --dataset=slimpajama --tokenizer=char --max_tokens=1_800 '
                   '--out_dir=data/epoch_char`, or allow repeats with --data_order=epochs')
    assert not (workdir / 'out_epoch_long').exists()


def test_an_lr_scale_of_0_leaves_its_parameter_unchanged(workdir):
    """lr_scales=[[name, 0]]: that parameter keeps its initial value exactly (no update, no weight decay)
    while every other one trains."""
    frozen, common = 'blocks.0.attn.c_v.weight', ['--out_dir=out_lr_scales', '--eval_interval=3']
    scales = f'--lr_scales=[["{frozen}", 0]]'
    train(workdir, *common, scales, '--max_iters=0')  # evaluates and saves the initial weights
    initial = weights(workdir, 'out_lr_scales')
    train(workdir, *common, scales, '--max_iters=3', '--init_from=resume')
    trained = weights(workdir, 'out_lr_scales')
    assert torch.equal(trained[frozen], initial[frozen])
    assert all(not torch.equal(trained[name], initial[name]) for name in initial if name != frozen)


def test_a_lambda_table_resumes_whether_written_as_tuples_or_lists(workdir):
    """A config file writes λ as tuples, the command line as lists: the same setting, so a run started from
    the one resumes with the other."""
    (workdir / 'tuples.py').write_text("variant = 'custom'\nvalue_residual = True\n"
                                       "lambdas = ((0.0, 1.0), (0.5, 0.5))\n")
    common = ['--out_dir=out_tuples', '--eval_interval=2', '--lr_decay_iters=4']
    train(workdir, 'tuples.py', *common, '--max_iters=2')
    train(workdir, '--variant=custom', '--value_residual=True', '--lambdas=[[0.0, 1.0], [0.5, 0.5]]', *common,
          '--max_iters=4', '--init_from=resume')
    assert max(log(workdir, 'out_tuples', 'train_loss')) == 4


@pytest.fixture(scope='module')
def straight(workdir):
    """out_straight: 40 steps without a break, to compare interrupted and resumed runs against."""
    train(workdir, '--out_dir=out_straight', *LONG)
    return records(workdir, 'out_straight')


LONG = ['--max_iters=40', '--eval_interval=4', '--lr_decay_iters=40', '--variant=resformer_learnable']


def test_resume_continues_exactly(workdir, straight):
    """40 steps straight == 6 steps, stop, resume: the same log record for record, bit for bit, even when the
    log ends in a half-written line, or holds lines that are not records. The 6-step run's last evaluation,
    at step 6 (its end), stays in the log: its checkpoint holds it, and the resumed run does not repeat it."""
    train(workdir, '--out_dir=out_resumed', *LONG, '--max_iters=6')
    val_6 = records(workdir, 'out_resumed')[-1]
    assert val_6['step'] == 6 and 'val_loss' in val_6
    with open(workdir / 'out_resumed' / 'log.jsonl', 'a') as f:
        f.write('{}\n[1, 2]\n"step"\n{"step": 7, "train_lo')
    train(workdir, '--out_dir=out_resumed', *LONG, '--init_from=resume')
    step_7 = next(i for i, r in enumerate(straight) if r['step'] == 7)
    assert records(workdir, 'out_resumed') == straight[:step_7] + [val_6] + straight[step_7:]
    assert [r['step'] for r in straight if 'train_loss' in r] == list(range(1, 41))
    assert_same_weights(weights(workdir, 'out_resumed'), weights(workdir, 'out_straight'))


def test_a_run_resumed_at_an_evaluation_does_not_repeat_it(workdir, straight, monkeypatch):
    """A run resumed from the checkpoint of an evaluation step (step 8, the end of an 8-step run, and an
    evaluation step of the 40-step schedule) does not evaluate that step again: the log keeps the evaluation's
    record, and ends as the straight run's, record for record (timing fields aside)."""
    train(workdir, '--out_dir=out_no_repeat', *LONG, '--max_iters=8')
    forward, evaluated = GPT.forward, []

    def counted(model, idx, *args, **kwargs):
        if not model.training:
            evaluated.append(idx.size(0))
        return forward(model, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, 'forward', counted)
    result = train(workdir, '--out_dir=out_no_repeat', *LONG, '--init_from=resume')
    monkeypatch.undo()
    # 2 passes (16 windows) at each of steps 12, 16, ..., 40
    assert len(evaluated) == 2 * 8, evaluated
    assert 'step 8: val loss' not in result.stdout and 'step 12: val loss' in result.stdout
    assert records(workdir, 'out_no_repeat') == straight
    assert_same_weights(weights(workdir, 'out_no_repeat'), weights(workdir, 'out_straight'))


STOP_AT_STEP = """import os, runpy, signal, sys, threading, time
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
stop_step, stop_rank, sys.argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
updates = 0
def stop_at_step(optimizer, args, kwargs):
    global updates
    updates += 1
    if updates == stop_step and os.environ.get('RANK', '0') == stop_rank:
        for thread in threading.enumerate():  # the checkpoints before this step have landed: a kill
            if thread.name == 'checkpoint writer':  # mid-write is a test of its own (SLOW_SAVE)
                thread.join()
        os.kill(os.getpid(), signal.SIGSTOP)
register_optimizer_step_post_hook(stop_at_step)
save = torch.save
def slow_save(*args, **kwargs):  # a slow disk: the file written, not yet renamed into place
    save(*args, **kwargs)
    if updates >= stop_step:
        time.sleep(float(os.environ.get('SLOW_SAVE', 0)))
torch.save = slow_save
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def stopping_at(workdir, step, rank=0):
    """The start of a command line running train.py that stops itself (SIGSTOP) inside its step-th update on
    that rank, so a test signals it at a known step whatever the machine's load (polling the log lost that
    race on a busy machine), once the checkpoints written in the background before it have landed. With SLOW_SAVE=s in its environment, each checkpoint from that step on takes s
    seconds more to write."""
    script = workdir / 'stop_at_step.py'
    script.write_text(STOP_AT_STEP)
    return [script, str(step), str(rank), REPO / 'train.py']


def wait_until_stopped(process, find_pid=None):
    """The pid of the process that has stopped itself: the run's own, or find_pid()'s (tried until it exists,
    for a rank under torchrun); waits for its state in Linux's /proc to read T."""
    deadline = time.time() + 120
    while True:
        assert process.poll() is None and time.time() < deadline, 'the run did not stop at its step'
        with contextlib.suppress(OSError, StopIteration):
            pid = find_pid() if find_pid else process.pid
            if Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'T':
                return pid
        time.sleep(0.01)


def test_resume_after_sigkill(workdir, straight):
    """Kill a run mid-way with SIGKILL; resuming from its last checkpoint reproduces the uninterrupted log."""
    process = subprocess.Popen([sys.executable, *stopping_at(workdir, 6), *TINY, '--out_dir=out_killed',
                                *LONG], cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_stopped(process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert max(log(workdir, 'out_killed', 'train_loss')) == 5  # killed in step 6's update, before its record
    left = json.loads((workdir / 'out_killed' / '.lock.pid').read_text())
    assert left['pid'] == process.pid  # left, yet no obstacle
    train(workdir, '--out_dir=out_killed', '--init_from=resume', *LONG)
    assert records(workdir, 'out_killed') == straight
    assert not list((workdir / 'out_killed').glob('*.tmp'))


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGHUP, signal.SIGUSR1], ids=lambda sig: sig.name)
def test_a_stop_signal_saves_a_checkpoint_to_resume_exactly(workdir, straight, sig):
    """Ctrl-C, a dropped ssh session's SIGHUP, SLURM's warning SIGUSR1 (and SIGTERM, below) stop a run at the
    next step boundary: one line naming the signal, the step and how to go on, exit 128 + the signal's
    number, a checkpoint at that step, and a resume equal to the uninterrupted run, log and weights."""
    out = f'out_stopped_by_{sig.name}'
    process = subprocess.Popen([sys.executable, *stopping_at(workdir, 5), *TINY, f'--out_dir={out}', *LONG],
                               cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # even if we ignore it
                               preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    wait_until_stopped(process)
    process.send_signal(sig)
    process.send_signal(signal.SIGCONT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + sig, stderr[-3000:]
    assert stop_line(stdout, stderr) == (f'train.py: stopped by {sig.name} at step 5; saved {out}/ckpt.pt; '
                                         f'continue with --init_from=resume')
    assert torch.load(workdir / out / 'ckpt.pt', weights_only=True)['iter_num'] == 5
    assert max(log(workdir, out, 'train_loss')) == 5 and not list((workdir / out).glob('*.tmp'))
    train(workdir, f'--out_dir={out}', '--init_from=resume', *LONG)
    assert records(workdir, out) == straight
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_straight'))


def weights(workdir, out_dir, name='ckpt.pt'):
    return torch.load(workdir / out_dir / name, weights_only=True)['model']


def assert_same_weights(first, second):
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def signalling(function, sig, when):
    """function, sending this process sig before the calls for which when(*args) holds."""
    def wrapper(*args, **kwargs):
        if when(*args):
            os.kill(os.getpid(), sig)
        return function(*args, **kwargs)
    return wrapper


def nth_call(n):
    """A when() for signalling that holds at its n-th call only."""
    calls = []
    return lambda *_: calls.append(1) or len(calls) == n


@pytest.mark.parametrize('sig, during, step', [(signal.SIGINT, 'update', 8), (signal.SIGTERM, 'update', 8),
                                               (signal.SIGTERM, 'forward', 4)],
                         ids=['SIGINT in the update', 'SIGTERM in the update', 'SIGTERM in the forward pass'])
def test_a_signal_mid_step_stops_at_the_next_step_boundary_to_resume_exactly(workdir, straight, monkeypatch,
                                                                             sig, during, step):
    """SIGINT or SIGTERM sent from inside a step is noted, and the run goes on to the step's end: sent in the
    8th weight update (its gradient clipping) it stops the run at step 8, and in the 4th step's training
    forward pass at step 4; the evaluation due at that step
    waits for the resumed run. Each way: one line, exit 128 + the signal's number, a checkpoint at that step
    (no ckpt.pt.tmp), and a resume equal to the uninterrupted run, log and weights, bit for bit."""
    if during == 'forward':  # training calls only, not evaluation's
        nth = nth_call(4)
        monkeypatch.setattr(GPT, 'forward', signalling(GPT.forward, sig, lambda model, *_: model.training
                                                       and nth()))
    else:
        monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                            signalling(torch.nn.utils.clip_grad_norm_, sig, nth_call(8)))
    out = f"out_{sig.name}_{during}"
    result = train(workdir, f'--out_dir={out}', *LONG, check=False)
    monkeypatch.undo()
    assert result.returncode == 128 + sig
    assert stop_line(result.stdout, result.stderr) == (f'train.py: stopped by {sig.name} at step {step}; saved '
                                                       f'{out}/ckpt.pt; continue with --init_from=resume')
    assert torch.load(workdir / out / 'ckpt.pt', weights_only=True)['iter_num'] == step
    assert [r['step'] for r in records(workdir, out) if 'train_loss' in r] == list(range(1, step + 1))
    assert [r['step'] for r in records(workdir, out) if 'val_loss' in r] == list(range(0, step, 4))
    assert not list((workdir / out).glob('*.tmp'))
    train(workdir, f'--out_dir={out}', '--init_from=resume', *LONG)
    assert records(workdir, out) == straight
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_straight'))


def test_a_second_ctrl_c_stops_at_once_and_the_last_checkpoint_stays(workdir, straight, monkeypatch):
    """Ctrl-C in the 8th update, and again while the stop's checkpoint is written (the file written, not yet
    renamed into place): the second stops the run at once, in one line, exit 130. ckpt.pt stays step 4's,
    whole; the next start removes the ckpt.pt.tmp left behind, saying so, and resumes as the straight run."""
    save = torch.save

    def saved_then_interrupted(*args, **kwargs):
        save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                        signalling(torch.nn.utils.clip_grad_norm_, signal.SIGINT, nth_call(8)))
    monkeypatch.setattr(torch, 'save', lambda *args, **kwargs: (
        saved_then_interrupted if str(args[1]).endswith('ckpt.pt.tmp') and args[0]['iter_num'] == 8 else save)(
        *args, **kwargs))
    out = 'out_ctrl_c_twice'
    result = train(workdir, f'--out_dir={out}', *LONG, check=False)
    monkeypatch.undo()
    assert result.returncode == 130 and 'Traceback' not in result.stderr, result.stderr
    # its line, perhaps after the progress bar it interrupted, and then only the bar's last state, drawn as the
    # loop's with-block closes it
    lines = [line.strip() for line in result.stderr.replace('\r', '\n').splitlines() if line.strip()]
    said = [line for line in lines if not re.fullmatch(r'\d+%\|.*\]', line)]
    assert said[-1].endswith('train.py: stopped by SIGINT again: at once, nothing more saved'), lines[-5:]
    assert torch.load(workdir / out / 'ckpt.pt', weights_only=True)['iter_num'] == 4
    assert torch.load(workdir / out / 'ckpt.pt.tmp', weights_only=True)['iter_num'] == 8  # never in place
    result = train(workdir, f'--out_dir={out}', '--init_from=resume', *LONG)
    assert f'train.py: removed {out}/ckpt.pt.tmp, a checkpoint write cut short by a kill' in result.stderr
    assert records(workdir, out) == straight
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_straight'))


SIGNAL_AT_OPEN = """import os, runpy, signal, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from vrl import data
open_dataset, sig = data.open_dataset, int(os.environ['SIGNAL'])
def signalled(*args, **kwargs):
    os.kill(os.getpid(), sig)
    return open_dataset(*args, **kwargs)
data.open_dataset = signalled
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('sig', [signal.SIGHUP, signal.SIGUSR1], ids=lambda sig: sig.name)
def test_a_stop_signal_before_training_starts_ends_the_run_in_one_line(workdir, sig):
    """Before the loop (here: as the data is opened) a stop signal ends the run at once, with one line and exit
    128 + its number, writing nothing."""
    script = workdir / 'signal_at_open.py'
    script.write_text(SIGNAL_AT_OPEN)
    result = run([script, REPO / 'train.py', *TINY, '--out_dir=out_early_stop'], workdir, check=False,
                 env=dict(os.environ, SIGNAL=str(int(sig))))
    assert result.returncode == 128 + sig, result.stderr[-3000:]
    one_line_error(result, f'train.py: stopped by {sig.name} before training started; nothing saved')
    assert not (workdir / 'out_early_stop').exists()


def test_a_stop_in_the_first_evaluation_ends_the_run_before_any_step(workdir, monkeypatch):
    """SIGTERM in step 0's evaluation (nothing runs before it: no start-up passes) stops the run as that
    evaluation ends, before any training pass: one line, exit 143, its record logged, no checkpoint."""
    forward, training_passes = GPT.forward, []

    def first_evaluation_pass(model, *_):
        training_passes.append(model.training)
        return len(training_passes) == 1

    monkeypatch.setattr(GPT, 'forward', signalling(forward, signal.SIGTERM, first_evaluation_pass))
    out = 'out_term_in_first_evaluation'
    result = train(workdir, f'--out_dir={out}', *LONG, check=False)
    monkeypatch.undo()
    assert result.returncode == 128 + signal.SIGTERM
    assert stop_line(result.stdout, result.stderr) == ('train.py: stopped by SIGTERM at step 0; nothing new to '
                                                       'save; no checkpoint written')
    assert training_passes == [False, False]  # step 0's evaluation, to its end, and no training pass
    assert [r['step'] for r in records(workdir, out)] == [0] and not list((workdir / out).glob('*.pt'))


@pytest.mark.parametrize('way', ['SIGTERM', 'SIGINT', 'max_time', 'SIGTERM in the evaluation'])
def test_a_stop_at_or_in_an_evaluation_loses_no_best_weights(workdir, monkeypatch, way):
    """A stop at step 8's boundary (a signal in its update, or max_time), or one inside its evaluation of
    every window (cut short), saves step 8 unevaluated; the resumed run evaluates step 8, the best yet, and
    writes ckpt.pt and best.pt of it before it trains on. Stopped one step later (a signal, or max_time),
    best.pt holds step 8, as the log and ckpt.pt say it is the best."""
    out = f"out_best_{way.replace(' ', '_')}"
    args = [*TINY, *(FULL if 'evaluation' in way else LONG), '--max_iters=40', f'--out_dir={out}']
    if way == 'max_time':  # a clock that each update advances by one second (test_max_time...)
        (workdir / 'step_clock.py').write_text(STEP_CLOCK)
        run([workdir / 'step_clock.py', REPO / 'train.py', *args, '--max_time=8'], workdir)
        run([workdir / 'step_clock.py', REPO / 'train.py', *args, '--max_time=1', '--init_from=resume'], workdir)
    else:
        sig = signal.SIGINT if way == 'SIGINT' else signal.SIGTERM
        if 'evaluation' in way:  # 2 passes at step 0, 2 + 46 at step 4, then step 8's sample and 3 of 46
            nth = nth_call(2 + 48 + 2 + 3)
            monkeypatch.setattr(GPT, 'forward', signalling(GPT.forward, sig, lambda model, *_: not model.training
                                                           and nth()))
        else:  # in the 8th update
            monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                                signalling(torch.nn.utils.clip_grad_norm_, sig, nth_call(8)))
        assert train_here(workdir, args, check=False).returncode == 128 + sig
        monkeypatch.undo()
        monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',  # in the resumed run's first update
                            signalling(torch.nn.utils.clip_grad_norm_, sig, nth_call(1)))
        assert train_here(workdir, [*args, '--init_from=resume'], check=False).returncode == 128 + sig
        monkeypatch.undo()
    bests = log(workdir, out, 'best_val_loss')
    assert list(bests) == [0, 4, 8] and bests[8] < bests[4]  # step 8 is the best
    ckpt, best = (torch.load(workdir / out / name, weights_only=True) for name in ('ckpt.pt', 'best.pt'))
    assert ckpt['iter_num'] == 9 and ckpt['best_val_loss'] == bests[8]
    assert best['iter_num'] == 8 and best['last_eval']['step'] == 8


def test_a_stop_on_a_ckpt_interval_step_saves_once(workdir, monkeypatch):
    """SIGTERM in the 8th update with ckpt_interval=4: ckpt.pt at step 4, then once at step 8."""
    saved, save = [], run_folder.RunFolder.save
    monkeypatch.setattr(run_folder.RunFolder, 'save', lambda run, checkpoint, best, background=False: (
        saved.append(checkpoint['iter_num']), save(run, checkpoint, best, background)))
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                        signalling(torch.nn.utils.clip_grad_norm_, signal.SIGTERM, nth_call(8)))
    result = train(workdir, '--out_dir=out_stop_on_ckpt_interval', *LONG, '--eval_interval=50',
                   '--ckpt_interval=4', check=False)
    assert result.returncode == 128 + signal.SIGTERM and saved == [4, 8]


SLOW_START = """import os, runpy, sys, time
import tqdm  # keeps the real clock
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
readings = iter(range(0, 10 ** 9, 10))
time.time = lambda: next(readings)  # ten seconds at every reading: a start-up longer than max_time
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_max_time_before_a_launchs_first_step_exits_1(workdir):
    """max_time that passes before this launch trains a step (a start-up longer than it): exit 1 in one
    line that says why, so that a job chain resubmitting on exit 0 does not loop without progress."""
    (workdir / 'slow_start.py').write_text(SLOW_START)
    result = run([workdir / 'slow_start.py', REPO / 'train.py', *TINY, *LONG, '--max_time=5',
                  '--out_dir=out_max_time_no_step'], workdir, check=False)
    one_line_error(result, 'train.py: past max_time=5 s at step 0, before this launch trained a step; '
                   'raise max_time above the start-up')
    assert result.returncode == 1 and not (workdir / 'out_max_time_no_step').exists()


@pytest.fixture(scope='module')
def straight_full(workdir):
    """out_full_straight: 12 steps without a break, every evaluation after step 0 scoring every one of the
    validation split's windows (eval_full): 46 passes of 8."""
    train(workdir, '--out_dir=out_full_straight', *FULL)
    return records(workdir, 'out_full_straight')


FULL = ['--max_iters=12', '--eval_interval=4', '--lr_decay_iters=12', '--eval_full=True']


def test_a_stop_during_a_long_evaluation_cuts_it_short_to_resume_exactly(workdir, straight_full, monkeypatch):
    """SIGTERM in the 3rd pass of step 4's evaluation of every validation window (46 passes): the evaluation
    stops at its next poll (every 16 passes), logs nothing, and the run saves step 4 and exits; the resumed
    run evaluates step 4 and ends as the straight run, log and weights, bit for bit."""
    forward, evaluated = GPT.forward, []

    def third_pass_of_step_4s_full_evaluation(model, *_):
        if not model.training:
            evaluated.append(1)
        # 2 passes at step 0, then step 4's: 2 of the sample, then every window's
        return not model.training and len(evaluated) == 2 + 2 + 3

    monkeypatch.setattr(GPT, 'forward', signalling(forward, signal.SIGTERM,
                                                   third_pass_of_step_4s_full_evaluation))
    out = 'out_term_in_evaluation'
    result = train(workdir, f'--out_dir={out}', *FULL, check=False)
    monkeypatch.undo()
    assert result.returncode == 128 + signal.SIGTERM
    assert stop_line(result.stdout, result.stderr) == (f'train.py: stopped by SIGTERM at step 4; saved '
                                                       f'{out}/ckpt.pt; continue with --init_from=resume')
    assert len(evaluated) == 2 + 2 + 15  # cut short at the poll before its 16th pass, of 46
    checkpoint = torch.load(workdir / out / 'ckpt.pt', weights_only=True)
    assert checkpoint['iter_num'] == 4 and checkpoint['last_eval']['step'] == 0
    assert [r['step'] for r in records(workdir, out) if 'val_loss' in r] == [0]
    train(workdir, f'--out_dir={out}', *FULL, '--init_from=resume')
    assert records(workdir, out) == straight_full
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_full_straight'))


STEP_CLOCK = """import os, runpy, sys, time
import tqdm  # keeps the real clock
from torch.optim.optimizer import register_optimizer_step_post_hook
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
updates = reads = 0
def count_update(optimizer, args, kwargs):
    global updates
    updates += 1
def step_clock():
    global reads
    reads += 1
    return updates + 1e-9 * reads  # one second a step, and never the same time twice
register_optimizer_step_post_hook(count_update)
time.time = step_clock
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_max_time_saves_and_exits_0_to_resume_exactly(workdir, straight):
    """max_time=10 on a clock that the optimizer's steps advance, one second each: the run stops at the first
    step boundary past 10 s (step 10), saves it, says so in one line and exits 0 (a job chain goes on); resumed
    without max_time it ends as the uninterrupted run, log and weights (its final val loss), bit for bit."""
    clock = workdir / 'step_clock.py'
    clock.write_text(STEP_CLOCK)
    out = 'out_max_time'
    result = run([clock, REPO / 'train.py', *TINY, *LONG, '--max_time=10', f'--out_dir={out}'], workdir)
    assert stop_line(result.stdout, result.stderr) == (f'train.py: past max_time=10 s at step 10; saved '
                                                       f'{out}/ckpt.pt; continue with --init_from=resume')
    assert torch.load(workdir / out / 'ckpt.pt', weights_only=True)['iter_num'] == 10
    assert max(log(workdir, out, 'train_loss')) == 10
    train(workdir, f'--out_dir={out}', *LONG, '--init_from=resume')
    assert records(workdir, out) == straight
    assert log(workdir, out, 'val_loss')[40] == log(workdir, 'out_straight', 'val_loss')[40]
    assert_same_weights(weights(workdir, out), weights(workdir, 'out_straight'))


def test_ckpt_interval_saves_between_evaluations_to_resume_exactly(workdir):
    """ckpt_interval=7 with eval_interval=50: ckpt.pt at steps 7, 14, ... beside the evaluations (0 and 40).
    SIGKILL in step 15's update, after step 14's checkpoint: the resume starts from step 14, not 0, and ends
    as the uninterrupted run, log and weights, bit for bit."""
    common = [*LONG, '--eval_interval=50', '--ckpt_interval=7']
    train(workdir, '--out_dir=out_every_7_straight', *common)
    process = subprocess.Popen([sys.executable, *stopping_at(workdir, 15), *TINY, *common,
                                '--out_dir=out_every_7'], cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_until_stopped(process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert torch.load(workdir / 'out_every_7' / 'ckpt.pt', weights_only=True)['iter_num'] == 14
    assert max(log(workdir, 'out_every_7', 'train_loss')) == 14
    result = train(workdir, '--out_dir=out_every_7', *common, '--init_from=resume')
    assert 'tokens to go' in result.stdout and f'{26 * 8 * 32:,} tokens to go' in result.stdout  # from 14
    assert records(workdir, 'out_every_7') == records(workdir, 'out_every_7_straight')
    assert [r['step'] for r in records(workdir, 'out_every_7') if 'val_loss' in r] == [0, 40]
    assert_same_weights(weights(workdir, 'out_every_7'), weights(workdir, 'out_every_7_straight'))


def test_a_log_whose_last_record_lacks_its_newline_resumes_on_lines_of_their_own(workdir, straight,
                                                                                 monkeypatch):
    """log.jsonl whose last record, the checkpoint's step's, lost its newline (an editor, a copy): the resumed
    run writes each record on a line of its own, keeps every record up to the checkpoint's step, and its log
    ends as the straight run's."""
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                        signalling(torch.nn.utils.clip_grad_norm_, signal.SIGTERM, nth_call(5)))
    out = 'out_no_newline'
    train(workdir, f'--out_dir={out}', *LONG, check=False)  # stopped at step 5, and saved
    monkeypatch.undo()
    path = workdir / out / 'log.jsonl'
    text = path.read_bytes()
    assert text.endswith(b'\n') and json.loads(text.splitlines()[-1])['step'] == 5
    path.write_bytes(text[:-1])
    train(workdir, f'--out_dir={out}', *LONG, '--init_from=resume')
    assert all(isinstance(json.loads(line), dict) for line in path.read_bytes().splitlines())
    assert records(workdir, out) == straight


def test_the_logged_training_loss_is_the_mean_over_its_interval(workdir, monkeypatch):
    """With log_interval=5 the record of step 5 (10) holds the mean training loss of steps 1-5 (6-10), as a run
    logging every step has them; a run stopped mid-interval (at step 8) and resumed logs the same mean at
    step 10, its checkpoint holding steps 6-8's losses."""
    common = ['--max_iters=10', '--eval_interval=4', '--lr_decay_iters=10']
    train(workdir, '--out_dir=out_mean_1', *common)
    train(workdir, '--out_dir=out_mean_5', *common, '--log_interval=5')
    every, fives = log(workdir, 'out_mean_1', 'train_loss'), log(workdir, 'out_mean_5', 'train_loss')
    assert list(every) == list(range(1, 11)) and list(fives) == [5, 10]
    for step, mean in fives.items():
        assert mean == pytest.approx(sum(every[s] for s in range(step - 4, step + 1)) / 5, rel=1e-6), step
    assert fives[5] != every[5]
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                        signalling(torch.nn.utils.clip_grad_norm_, signal.SIGTERM, nth_call(8)))
    train(workdir, '--out_dir=out_mean_resumed', *common, '--log_interval=5', check=False)  # saved at step 8
    monkeypatch.undo()
    assert torch.load(workdir / 'out_mean_resumed' / 'ckpt.pt', weights_only=True)['loss_since_log'][1] == 3
    train(workdir, '--out_dir=out_mean_resumed', *common, '--log_interval=5', '--init_from=resume')
    assert records(workdir, 'out_mean_resumed') == records(workdir, 'out_mean_5')


def test_best_checkpoint_agrees_after_a_kill_between_saves(workdir):
    """best.pt is written before ckpt.pt: after a kill between the two the run resumes from the checkpoint
    before, and its evaluation at the next step writes best.pt again; a 0-byte best.pt.tmp of the killed write
    is removed with a line that says so, a user's notes.tmp is not."""
    common = ['--out_dir=out_best', '--eval_interval=2', '--lr_decay_iters=4']
    train(workdir, *common, '--max_iters=2')
    ckpt = workdir / 'out_best' / 'ckpt.pt'
    ckpt_at_2 = ckpt.read_bytes()
    train(workdir, *common, '--max_iters=4', '--init_from=resume')
    ckpt.write_bytes(ckpt_at_2)  # as if killed after writing best.pt for step 4, before ckpt.pt
    (workdir / 'out_best' / 'best.pt.tmp').touch()
    (workdir / 'out_best' / 'notes.tmp').write_text('mine')
    result = train(workdir, *common, '--max_iters=4', '--init_from=resume')
    assert 'train.py: removed out_best/best.pt.tmp, a checkpoint write cut short by a kill' in result.stderr
    val = log(workdir, 'out_best', 'val_loss')
    assert [r['step'] for r in records(workdir, 'out_best') if 'val_loss' in r] == [0, 2, 4]
    best = torch.load(workdir / 'out_best' / 'best.pt', weights_only=True)
    assert best['iter_num'] == min(val, key=val.get) and best['best_val_loss'] == min(val.values())
    assert torch.load(ckpt, weights_only=True)['iter_num'] == 4
    assert [path.name for path in (workdir / 'out_best').glob('*.tmp')] == ['notes.tmp']
    assert (workdir / 'out_best' / 'notes.tmp').read_text() == 'mine'


def test_a_run_is_never_overwritten_by_accident(workdir):
    """A fresh run into a folder that holds one refuses, with both ways on; --overwrite=True starts over."""
    train(workdir, '--out_dir=out_taken', '--max_iters=2', '--eval_interval=2')
    before = snapshot(workdir / 'out_taken')
    refused = run([REPO / 'train.py', *TINY, '--out_dir=out_taken', '--max_iters=2'], workdir, check=False)
    one_line_error(refused, 'already holds a run', '--init_from=resume', '--overwrite=True')
    assert len(refused.stderr.strip().splitlines()) == 1  # all a refused run prints on the command line
    assert snapshot(workdir / 'out_taken') == before
    train(workdir, '--out_dir=out_taken', '--max_iters=1', '--eval_interval=2', '--overwrite=True')
    assert [r['step'] for r in records(workdir, 'out_taken')] == [0, 1, 1]


def test_one_run_at_a_time_writes_to_an_out_dir(workdir):
    """A run into an out_dir whose .lock another live process holds is refused with one line naming it,
    nothing on disk changed, whether it would resume or start over; once the lock is let go, it goes ahead."""
    common = ['--out_dir=out_locked', '--eval_interval=2']
    train(workdir, *common, '--max_iters=2')
    # as a run in another process holds it
    held, _ = locks.try_lock(str(workdir / 'out_locked' / '.lock'), 'test')
    assert held  # the last run let go
    before = snapshot(workdir / 'out_locked')
    for args in (['--init_from=resume', '--max_iters=4'], ['--overwrite=True', '--max_iters=2']):
        refused = train(workdir, *common, *args, check=False)
        one_line_error(refused, f'train.py: another run (process {os.getpid()}) is writing to out_locked; '
                                f'wait for it to end, or pick another --out_dir')
        assert snapshot(workdir / 'out_locked') == before
    held.release()
    train(workdir, *common, '--init_from=resume', '--max_iters=4')
    assert [r['step'] for r in records(workdir, 'out_locked') if 'val_loss' in r] == [0, 2, 4]


HOLD_BEFORE_THE_LOCK = """import os, runpy, signal, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from vrl import locks
hold = locks.hold
def paused_first(*args, **kwargs):  # as if the machine paused it just before it takes out_dir's lock
    os.kill(os.getpid(), signal.SIGSTOP)
    return hold(*args, **kwargs)
locks.hold = paused_first
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_two_fresh_runs_into_one_folder_never_both_write(workdir):
    """Two fresh runs started into one out_dir: the second is refused in one line whether the first still
    holds the lock (it names the first's process) or has ended (its run is there), even when the second had
    looked at the folder before the first wrote anything, and the first run's files stay as they were."""
    common = ['--max_iters=4', '--eval_interval=2', '--lr_decay_iters=4']
    first = subprocess.Popen([sys.executable, *stopping_at(workdir, 3), *TINY, *common, '--out_dir=out_race'],
                             cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_stopped(first)  # in step 3's update, holding out_race/.lock
    one_line_error(train(workdir, *common, '--out_dir=out_race', check=False),
                   f'train.py: another run (process {first.pid}) is writing to out_race')
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=120) == 0
    train(workdir, *common, '--out_dir=out_race_alone')
    assert records(workdir, 'out_race') == records(workdir, 'out_race_alone')

    script = workdir / 'hold_before_the_lock.py'
    script.write_text(HOLD_BEFORE_THE_LOCK)
    second = subprocess.Popen([sys.executable, script, REPO / 'train.py', *TINY, *common, '--seed=7',
                               '--out_dir=out_race_2'], cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    wait_until_stopped(second)  # past every check that needs no lock, out_race_2 empty
    train(workdir, *common, '--out_dir=out_race_2')  # the first run, start to end
    before = snapshot(workdir / 'out_race_2')
    second.send_signal(signal.SIGCONT)
    stdout, stderr = second.communicate(timeout=120)
    one_line_error(subprocess.CompletedProcess(second.args, second.returncode, stdout, stderr),
                   'train.py: out_race_2 already holds a run (ckpt.pt, best.pt, log.jsonl, ckpt.prev.pt)')
    assert snapshot(workdir / 'out_race_2') == before
    assert records(workdir, 'out_race_2') == records(workdir, 'out_race_alone')


def test_several_slurm_tasks_without_torchrun_are_refused_in_one_line(workdir, monkeypatch):
    """`srun python train.py` with 2 tasks would train 2 runs alone, each on GPU 0, into one out_dir:
    refused in one line that names torchrun, before anything is written."""
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '2')
    monkeypatch.setenv('SLURM_PROCID', '0')
    monkeypatch.delenv('RANK', raising=False)
    before = snapshot(workdir)
    one_line_error(train(workdir, '--out_dir=out_srun', check=False),
                   'train.py: 2 tasks in this srun step but no torchrun: each would train alone',
                   '`srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES')
    assert snapshot(workdir) == before


@pytest.fixture(scope='module')
def previous_run(workdir):
    """out_prev, a finished 2-step run; out_noopt and out_nometa, its checkpoint without the optimizer state
    or the data's meta.json (an older train.py's); out_cut, cut short; data/other_char, another corpus."""
    train(workdir, '--out_dir=out_prev', '--max_iters=2', '--eval_interval=2')
    ckpt = workdir / 'out_prev' / 'ckpt.pt'
    for out, key in ('out_noopt', 'optimizer'), ('out_nometa', 'data_meta'):
        checkpoint = torch.load(ckpt, weights_only=True)
        del checkpoint[key], checkpoint['checksum']  # an older train.py wrote no checksum either
        (workdir / out).mkdir()
        torch.save(checkpoint, workdir / out / 'ckpt.pt')
    (workdir / 'out_cut').mkdir()
    (workdir / 'out_cut' / 'ckpt.pt').write_bytes(ckpt.read_bytes()[:ckpt.stat().st_size // 2])
    (workdir / 'other.txt').write_text((workdir / 'tiny.txt').read_text().upper())
    run([REPO / 'prepare.py', '--input=other.txt', '--out_dir=data/other_char'], workdir)
    return workdir


def test_eval_only_scores_a_checkpoint_with_other_settings_or_data(previous_run):
    """A resume must keep the data and the settings; an eval_only run, which writes nothing,
    may change them."""
    before = snapshot(previous_run)
    result = train(previous_run, '--out_dir=out_prev', '--init_from=resume', '--eval_only=True',
                   '--batch_size=4', '--eval_iters=3', '--seed=7')
    assert 'step 2: val loss' in result.stdout and snapshot(previous_run) == before


def read_only_folder(workdir):
    """A folder this process cannot write to: a chmod'ed one, or /sys for root (whom chmod does not stop)."""
    if os.geteuid() == 0:
        return '/sys/value_residual_run'
    folder = workdir / 'read_only'
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    return f'{folder}/run'


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason='needs a torch without CUDA')
no_wandb = pytest.mark.skipif(importlib.util.find_spec('wandb') is not None,
                              reason='needs wandb to be missing')
BAD_SETTINGS = [  # each run's out_dir is out_prev (a finished run) unless it names another
    (['--batch_size=0'], 'batch_size=0'), (['--batch_size=-1'], 'batch_size=-1'),
    (['--block_size=0'], 'block_size=0'), (['--block_size=-5'], 'block_size=-5'),
    (['--eval_interval=0'], 'eval_interval=0'), (['--log_interval=0'], 'log_interval=0'),
    (['--eval_iters=0'], 'eval_iters=0'), (['--max_iters=-1'], 'max_iters=-1'),
    (['--data_order=shuffled'], "data_order='shuffled'", "use 'auto', 'random', 'epoch' or 'epochs'"),
    (['--out_dir=out_fresh', '--data_order=epoch', '--max_iters=100000'], '100000 steps of 8 windows read',
     'prepare enough with more text, or allow repeats with --data_order=epochs'),
    (['--gradient_accumulation_steps=0'], 'gradient_accumulation_steps=0'),
    (['--ckpt_interval=-1'], 'ckpt_interval=-1', 'use 0 (off) or more'),
    (['--max_time=-5'], 'max_time=-5', 'use 0 (off) or more'),
    (['--max_iters=1000000001'], 'max_iters=1000000001; use at most 10**9 steps'),
    (['--learning_rate=-1'], 'learning_rate=-1'), (['--learning_rate=0'], 'learning_rate=0'),
    (['--learning_rate=3e38'], 'learning_rate=3e+38', 'float32'),
    (['--min_lr=1'], 'min_lr=1.0'), (['--min_lr=-1e-4'], 'min_lr=-0.0001'),
    (['--warmup_iters=-1'], 'warmup_iters=-1'),
    (['--warmup_iters=20', '--lr_decay_iters=10'], 'warmup_iters=20'),
    (['--beta1=1'], 'beta1=1.0'), (['--grad_clip=-1'], 'grad_clip=-1.0'),
    (['--init_from=bogus'], "init_from='bogus'"), (['--init_from=resume', '--overwrite=True'], 'pick one'),
    pytest.param((['--device=cuda'], "device='cuda'", 'no CUDA GPU'), marks=no_cuda),
    (['--device=nosuch'], "device='nosuch'"),
    pytest.param((['--wandb_log=True'], 'pip install wandb'), marks=no_wandb),
    (['--out_dir=tiny.txt'], 'out_dir=tiny.txt is a file'),
    (['--out_dir=tiny.txt/run'], 'cannot write', 'tiny.txt'),
    (['--out_dir={read_only}'], 'cannot write'),
    (['--out_dir=out_fresh', '--batch_size=0'], 'batch_size=0'),  # no empty out_fresh either
    ([], 'out_prev already holds a run', '--init_from=resume', '--overwrite=True'),
    (['--init_from=resume', '--out_dir=out_noopt'], 'has no optimizer'),
    (['--init_from=resume', '--out_dir=out_nometa'], 'has no data_meta'),
    (['--init_from=resume', '--dataset=other_char'], 'data/other_char is not the data out_prev/ckpt.pt',
     'differs in chars, settings, source', '--dataset=tiny_char'),
    (['--init_from=resume', '--batch_size=4', '--seed=7', '--learning_rate=1e-3', '--eval_interval=3'],
     'trained with other settings: learning_rate=0.003 (now 0.001), seed=1337 (now 7), '
     'gradient_accumulation_steps x batch_size = 8 sequences a step (now 4), '
     'eval_iters x batch_size = 16 sequences an evaluation (now 8); '
     'resume with the settings it was trained with'),
    (['--init_from=resume', '--warmup_iters=3', '--dtype=float32'],
     "warmup_iters=2 (now 3), dtype='auto' (now 'float32')"),
    (['--init_from=resume', '--n_layer=3'], 'n_layer', 'different model'),
    (['--init_from=resume', '--out_dir=out_cut'], 'ckpt.pt', 'unreadable'),
    (['--init_from=resume', '--out_dir=out_none'], 'not found'),
    (['--out_dir=out_fresh', '--dataset=missing_char'], 'data/missing_char', 'python prepare.py'),
    (['--out_dir=out_fresh', '--n_embd=33'], 'n_embd=33', 'n_head'),
    (['--n_layers=3'], "did you mean 'n_layer'"),
    (['--out_dir=out_fresh', '--seed=99999999999999999999999'], 'seed=99999999999999999999999', '2**64 - 1'),
    (['--out_dir=out_fresh', '--lr_scales=[["blocks.0.attn.c_vv.weight", 2]]'],
     "bad lr_scales=[['blocks.0.attn.c_vv.weight', 2]]", 'not parameters of this model'),
    (['--init_from=resume', '--lr_scales=[["wte.weight", 2]]'],
     "trained with other settings: lr_scales=[] (now [['wte.weight', 2]])"),
    # the paper's first run on the small corpus: too small for its evaluation...
    ([str(REPO / 'config' / 'resformer_82m.py'), '--dataset=tiny_char', '--out_dir=out_fresh'],
     'the validation split has 5 windows of 2048 tokens, fewer than the 1792 evaluation takes'),
    # ... and, evaluating what it has, sized for 8 GPUs: it stops rather than fall back to the CPU, unless the
    # CPU is asked for by name (this one then gets as far as finding no checkpoint to resume)
    pytest.param(([str(REPO / 'config' / 'resformer_82m.py'), '--dataset=tiny_char', '--eval_iters=1',
                   '--batch_size=5', '--init_from=resume', '--out_dir=out_none'],
                  "device='auto' found no usable GPU", 'FLOPs', 'or run on the CPU anyway with --device=cpu'),
                 marks=no_cuda),
    ([str(REPO / 'config' / 'resformer_82m.py'), '--dataset=tiny_char', '--eval_iters=1', '--batch_size=5',
      '--init_from=resume', '--out_dir=out_none', '--device=cpu'], 'checkpoint out_none/ckpt.pt not found'),
]


@pytest.mark.parametrize('case', BAD_SETTINGS, ids=lambda case: ' '.join(case[0]) or 'no flags')
def test_bad_settings_are_one_line_errors_that_change_nothing(previous_run, case):
    """Run in this process (no start-up cost): the one line train.py stops with, and not a file touched."""
    args, *words = case
    args = [arg.format(read_only=read_only_folder(previous_run)) for arg in args]
    before = snapshot(previous_run)
    result = train_here(previous_run, [*TINY, '--max_iters=2', '--out_dir=out_prev', *args], check=False)
    message = result.stderr.removesuffix('\n')  # all of stderr: train.py prints its Overriding lines on stdout
    assert result.returncode == 1 and '\n' not in message and all(word in message for word in words), message
    assert snapshot(previous_run) == before


def test_non_finite_losses_stop_without_saving(workdir):
    """A NaN validation or training loss stops the run with one factual line; ckpt.pt keeps the last good
    step, and a run that saved none (its first evaluation writes no checkpoint) says so."""
    blow_up = ['--learning_rate=1e20', '--warmup_iters=0', '--min_lr=0', '--max_iters=8']
    result = train(workdir, '--out_dir=out_nan_often', *blow_up, '--eval_interval=1', check=False)
    one_line_error(result, 'loss', 'stopped without saving', 'is the last good checkpoint')
    checkpoint = torch.load(workdir / 'out_nan_often' / 'ckpt.pt', weights_only=True)
    assert f"ckpt.pt (step {checkpoint['iter_num']})" in result.stderr and checkpoint['iter_num'] > 0
    assert all(t.isfinite().all() for t in checkpoint['model'].values())
    result = train(workdir, '--out_dir=out_nan_once', *blow_up, '--eval_interval=10', check=False)
    one_line_error(result, 'training loss or gradient norm became NaN or inf by step 1 (',
                   'stopped without saving, no checkpoint written')
    assert not (workdir / 'out_nan_once' / 'ckpt.pt').exists()
    (workdir / 'nan.py').write_text("variant = 'custom'\nvalue_residual = True\n"
                                    "lambdas = [(0, 1), (float('nan'), 1)]\n")
    one_line_error(train(workdir, 'nan.py', '--out_dir=out_nan', '--max_iters=5', check=False),
                   'lambdas must be finite')  # a NaN λ is refused before anything runs
    assert not (workdir / 'out_nan').exists()


def test_a_full_disk_or_bad_data_mid_run_stops_with_one_line(workdir, monkeypatch):
    """A full disk when the log is appended to (its 4th record): one line, and ckpt.pt of step 1 kept.
    A token id outside the vocabulary in the training data (prepare.py's checks on reading do not scan
    that split): one line."""
    real_open = builtins.open
    appends = []

    def full_disk_open(path, mode='r', *args, **kwargs):
        if str(path).endswith('log.jsonl') and mode.startswith('a'):
            appends.append(path)
            if len(appends) == 4:
                return real_open('/dev/full', mode)  # the write fails with ENOSPC
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, 'open', full_disk_open)
    result = train(workdir, '--out_dir=out_full', '--max_iters=8', '--eval_interval=1', check=False)
    monkeypatch.undo()
    one_line_error(result, 'train.py: cannot write out_full/log.jsonl (no space left on device); free disk '
                           'space or fix out_dir, out_full/ckpt.pt (step 1) is the last good checkpoint')
    assert [r['step'] for r in records(workdir, 'out_full')] == [0, 1, 1]

    bad = workdir / 'data' / 'badtoken_char'
    bad.mkdir()
    for name in ('meta.json', 'val.bin', 'train.bin'):
        (bad / name).write_bytes((workdir / 'data' / 'tiny_char' / name).read_bytes())
    tokens = np.fromfile(bad / 'train.bin', dtype=np.uint16)
    tokens[::50] = 60000
    tokens.tofile(bad / 'train.bin')
    result = train(workdir, '--out_dir=out_badtoken', '--dataset=badtoken_char', '--max_iters=8', check=False)
    one_line_error(result, 'train.py: data/badtoken_char holds token id 60000, outside its vocabulary',
                   'python prepare.py', 'no checkpoint written')  # step 0's batch, after its evaluation
    assert [r['step'] for r in records(workdir, 'out_badtoken')] == [0]
    assert not list((workdir / 'out_badtoken').glob('*.pt'))


def test_a_full_disk_at_a_checkpoint_says_so_and_leaves_no_partial_file(workdir, monkeypatch):
    """torch.save on a full disk fails with a RuntimeError that quotes PyTorch's internals ('unexpected
    pos'): one line that says no space is left, and the partial ckpt.pt.tmp removed at once."""
    save = torch.save

    def full_disk_save(obj, path, *args, **kwargs):
        if str(path).endswith('ckpt.pt.tmp') and obj['iter_num'] == 2:
            open(path, 'wb').write(b'PK partial')
            raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 6400 vs 6272')
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', full_disk_save)
    result = train(workdir, '--out_dir=out_full_save', '--max_iters=4', '--eval_interval=1', check=False)
    monkeypatch.undo()
    one_line_error(result, 'train.py: cannot write out_full_save/ckpt.pt (no space left on device); free '
                           'disk space or fix out_dir, out_full_save/ckpt.pt (step 1) is the last good '
                           'checkpoint')
    assert sorted(p.name for p in (workdir / 'out_full_save').iterdir() if not p.name.startswith('.')) == \
        ['best.pt', 'ckpt.pt', 'log.jsonl']


def test_save_checkpoint_false_trains_and_writes_no_checkpoint(workdir, monkeypatch):
    """save_checkpoint=False (the node check's speed and fit runs): the log is written, no ckpt.pt or
    best.pt, even when a stop signal ends the run (its line says nothing was saved); with init_from=resume
    it is refused in one line."""
    train(workdir, '--out_dir=out_no_save', '--max_iters=2', '--eval_interval=1', '--save_checkpoint=False')
    assert sorted(p.name for p in (workdir / 'out_no_save').iterdir() if not p.name.startswith('.')) == \
        ['log.jsonl']
    assert [r['step'] for r in records(workdir, 'out_no_save') if 'val_loss' in r] == [0, 1, 2]
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_',
                        signalling(torch.nn.utils.clip_grad_norm_, signal.SIGTERM, nth_call(2)))
    result = train(workdir, '--out_dir=out_no_save_stopped', '--max_iters=4', '--save_checkpoint=False',
                   check=False)
    monkeypatch.undo()
    assert result.returncode == 128 + signal.SIGTERM
    assert stop_line(result.stdout, result.stderr) == ('train.py: stopped by SIGTERM at step 2; nothing saved '
                                                       '(save_checkpoint=False)')
    assert sorted(p.name for p in (workdir / 'out_no_save_stopped').iterdir() if not p.name.startswith('.')) \
        == ['log.jsonl']
    one_line_error(train(workdir, '--out_dir=out_no_save', '--init_from=resume', '--save_checkpoint=False',
                         check=False),
                   "train.py: save_checkpoint=False with init_from='resume' would continue a run and save "
                   "none of it; drop one")


def after_key(key, opcode, skip=0):
    """An at() for flip_a_byte: the offset of the value that follows key in a pickle, skip bytes into the
    first `opcode` op after it (K: a 1-byte int, G: an 8-byte float)."""
    def at(pickled):
        pickled_key = b'X' + len(key).to_bytes(4, 'little') + key.encode()  # BINUNICODE: not a path's part
        key_end = pickled.index(pickled_key) + len(pickled_key)
        return pickled.index(opcode.encode(), key_end, key_end + 8) + 1 + skip
    return at


@pytest.mark.parametrize('flip', ['a tensor', 'iter_num', 'best_val_loss'])
def test_a_flipped_byte_in_a_checkpoint_is_refused_in_one_line(workdir, flip):
    """Every checkpoint records one CRC-32 of all of it: a byte flipped in ckpt.pt, in a tensor or in the
    pickled fields beside them (the step to resume from: 2 read as 66; the best validation loss, in its
    last bit), stops a resume and sample.py with one line naming the file, before anything is touched."""
    out = f"out_flip_{flip.replace(' ', '_')}"
    train(workdir, f'--out_dir={out}', '--max_iters=2', '--eval_interval=2')
    path = workdir / out / 'ckpt.pt'
    assert isinstance(torch.load(path, weights_only=True)['checksum'], int)
    if flip == 'a tensor':
        flip_a_byte(path)
    elif flip == 'iter_num':
        flip_a_byte(path, 'data.pkl', after_key('iter_num', 'K'))
        assert torch.load(path, weights_only=True)['iter_num'] == 66  # a pickle that reads, wrongly
    else:
        flip_a_byte(path, 'data.pkl', after_key('best_val_loss', 'G', skip=7), bit=0x01)
    log_before = (workdir / out / 'log.jsonl').read_bytes()
    result = train(workdir, f'--out_dir={out}', '--init_from=resume', '--max_iters=4', check=False)
    one_line_error(result, f'checkpoint {out}/ckpt.pt is damaged: it no longer matches the checksum written '
                           f'with it')
    assert (workdir / out / 'log.jsonl').read_bytes() == log_before
    sampled = run_script(REPO / 'sample.py', [f'--out_dir={out}', '--max_new_tokens=2'], workdir, check=False)
    assert sampled.returncode == 1 and 'is damaged' in sampled.stderr, sampled.stderr


def test_a_log_that_is_not_utf8_resumes_without_its_bad_line(workdir):
    """A stray byte in log.jsonl (a crash, a copy): the resume keeps every readable record up to the
    checkpoint and drops the line it cannot read."""
    train(workdir, '--out_dir=out_bad_log', '--max_iters=2', '--eval_interval=2')
    path = workdir / 'out_bad_log' / 'log.jsonl'
    path.write_bytes(path.read_bytes() + b'\xff\xfe not json\n')
    train(workdir, '--out_dir=out_bad_log', '--init_from=resume', '--max_iters=4', '--eval_interval=2')
    assert [r['step'] for r in records(workdir, 'out_bad_log') if 'val_loss' in r] == [0, 2, 4]


def test_a_checkpoint_with_nan_weights_is_refused_before_the_log_is_touched(workdir):
    """NaN weights in ckpt.pt: the resume stops with one line before cutting log.jsonl back."""
    train(workdir, '--out_dir=out_nan_ckpt', '--max_iters=2', '--eval_interval=1')
    path = workdir / 'out_nan_ckpt' / 'ckpt.pt'
    checkpoint = torch.load(path, weights_only=True)
    checkpoint['model']['norm_f.weight'][0] = float('nan')
    del checkpoint['checksum']  # as a checkpoint whose weights were NaN when written
    torch.save(checkpoint, path)
    log_before = (workdir / 'out_nan_ckpt' / 'log.jsonl').read_bytes()
    result = train(workdir, '--out_dir=out_nan_ckpt', '--init_from=resume', '--max_iters=4', check=False)
    one_line_error(result, 'train.py: out_nan_ckpt/ckpt.pt holds NaN or inf weights (norm_f.weight)')
    assert (workdir / 'out_nan_ckpt' / 'log.jsonl').read_bytes() == log_before


def test_a_fifo_as_a_data_file_is_named_for_what_it_is(workdir):
    fifo = workdir / 'data' / 'fifo_char'
    fifo.mkdir()
    for name in ('meta.json', 'val.bin'):
        (fifo / name).write_bytes((workdir / 'data' / 'tiny_char' / name).read_bytes())
    os.mkfifo(fifo / 'train.bin')
    one_line_error(train(workdir, '--out_dir=out_fifo', '--dataset=fifo_char', check=False),
                   'prepare.py: data/fifo_char/train.bin is not a regular file (a folder, a pipe or a device)')


def test_the_paper_config_without_its_data_says_what_preparing_it_takes(workdir):
    """The first command of the paper's run, on a node without data: one line from train.py naming the
    prepare command, its cost, and that the node check needs no data."""
    result = run([REPO / 'train.py', REPO / 'config' / 'resformer_82m.py'], workdir, check=False)
    one_line_error(result, 'train.py: data/slimpajama_neox/meta.json not found; prepare the data first with '
                           '`python prepare.py --dataset=slimpajama` (about 42 GB of disk',
                   '`python lab/bench.py --node_check --nproc=8` checks a node without it')


def test_a_depth_no_config_means_is_refused_at_once(workdir):
    one_line_error(train(workdir, '--out_dir=out_deep', '--n_layer=100000', check=False),
                   "train.py: n_layer=100000; the paper's deepest model has 24 layers")


def test_every_evaluation_scores_every_window_with_eval_full(workdir):
    """eval_full=True (the paper's recipe): val_loss_full at every evaluation but step 0's (random weights),
    per domain, on data kept by domain; on a single corpus too, where without it no evaluation scores every
    window. Its console line's loss is then every window's."""
    domain_data(workdir)
    result = train(workdir, '--dataset=domains_char', '--out_dir=out_eval_full', '--max_iters=2',
                   '--eval_interval=1', '--lr_decay_iters=2', '--eval_full=True')
    evaluations = [r for r in records(workdir, 'out_eval_full') if 'val_loss' in r]
    assert [r['step'] for r in evaluations] == [0, 1, 2]
    full = [r for r in evaluations if 'val_loss_full' in r]
    assert [r['step'] for r in full] == [1, 2]
    assert all(list(r['val_loss_full_domains']) == list(DOMAINS) for r in full)
    assert f"step 2: val loss {full[-1]['val_loss_full']:.4f} (all 95 windows) (best " in result.stdout
    train(workdir, '--out_dir=out_eval_full_one', '--max_iters=2', '--eval_interval=1', '--eval_full=True')
    one = [r for r in records(workdir, 'out_eval_full_one') if 'val_loss_full' in r]
    tokens = len(np.fromfile(workdir / 'data' / 'tiny_char' / 'val.bin', dtype=np.uint16))
    assert [r['val_windows_full'] for r in one] == [len(range(0, tokens - 32, 32))] * 2


COUNT_RECOMPILES = """import json, os, runpy, sys
from torch._dynamo.utils import counters
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
finally:
    print('RECOMPILES', json.dumps(dict(counters['recompiles'])), 'FRAMES', counters['frames']['ok'])
"""


def test_a_compiled_whole_split_evaluation_with_a_padded_piece_does_not_recompile(workdir):
    """Compiled (inductor, on the CPU), every validation window scored in pieces of 4, the last of each
    domain padded: every piece's targets have one layout, so dynamo compiles evaluation once (a recompile for a view's strides against a copy's, or for a batch
    size, would show in torch's log of recompilations)."""
    domain_data(workdir)
    script = workdir / 'count_recompiles.py'
    script.write_text(COUNT_RECOMPILES)
    result = run([script, REPO / 'train.py', *TINY[1:], '--dataset=domains_char', '--batch_size=4',
                  '--out_dir=out_compiled_full', '--max_iters=2', '--eval_interval=2', '--lr_decay_iters=2',
                  '--eval_full=True', '--compile=True', '--overwrite=True'], workdir,
                 env=dict(os.environ, OMP_NUM_THREADS='1', TORCH_LOGS='recompiles'), timeout=600)
    recompiles = result.stderr.count('Recompiling function')
    reasons = [line for line in result.stderr.splitlines() if 'stride' in line or 'size mismatch' in line]
    assert reasons == [], reasons
    assert recompiles <= 1, result.stderr[-3000:]  # training's graph, then evaluation's (model.training)


def test_a_model_too_big_for_memory_is_one_line(workdir):
    """n_embd=200000 asks for 160 GB matrices: one line (run with an address-space limit, so that no machine
    really tries to find the memory; on the CPU by name, as device='auto' refuses a model this size one)."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    result = run([REPO / 'train.py', *TINY, '--out_dir=out_huge', '--n_embd=200000', '--device=cpu'], workdir,
                 check=False, preexec_fn=limit_memory)
    one_line_error(result, 'train.py: n_layer=2, n_embd=200000', 'it does not fit in the',
                   'lower n_layer, n_embd')
    assert not (workdir / 'out_huge').exists()


def torchrun(workdir, *args, script=(REPO / 'train.py',), **kw):
    """torchrun with 2 CPU ranks of train.py, or of a wrapper's command line (script) that runs it."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return run(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', *script, *args],
               workdir, env=env, **kw)


DDP_SETUPS = {  # the same 16 sequences a step on one process and on 2 ranks
    # 4 passes of 4: each rank accumulates 2 (its gradients all-reduced in the second's backward alone)
    'accumulate 4 x 4': [*TINY, '--gradient_accumulation_steps=4', '--batch_size=4'],
    # the shipped config's 16 sequences a step as 2 passes of 8 (one a rank), on the small model and corpus
    'config/shakespeare_char.py': [REPO / 'config' / 'shakespeare_char.py', *TINY, *TWO_PASSES],
}


@pytest.mark.parametrize('setup', DDP_SETUPS)
def test_ddp_matches_single_process(workdir, setup):
    """torchrun with 2 CPU ranks (gloo) and a single process see the same global batches
    and learn the same weights."""
    common = [*DDP_SETUPS[setup], '--max_iters=6', '--eval_interval=3', '--lr_decay_iters=6']
    out = setup.split()[-1].replace('/', '_')
    train_here(workdir, [*common, f'--out_dir=out_single_{out}'])
    result = torchrun(workdir, *common, f'--out_dir=out_ddp_{out}')
    assert 'weights across 2 ranks differ by at most 0' in result.stdout
    assert result.stdout.count(' to go: ') == 1  # the time to go, said by rank 0 alone
    assert 'Warning' not in result.stderr, result.stderr  # e.g. DDP's broadcast_buffers FutureWarning
    single, ddp = (log(workdir, f'out_single_{out}', 'train_loss'),
                   log(workdir, f'out_ddp_{out}', 'train_loss'))
    assert list(single) == list(ddp) == list(range(1, 7))
    # The same global mean gradient every step (grad_norm would be off by the rank count if the per-rank
    # losses were scaled wrongly, which Adam's scale invariance would otherwise hide), hence the same losses
    # and weights.
    norms = log(workdir, f'out_single_{out}', 'grad_norm'), log(workdir, f'out_ddp_{out}', 'grad_norm')
    assert all(abs(norms[0][s] - norms[1][s]) < 1e-5 * norms[0][s] for s in single), norms
    assert all(abs(single[s] - ddp[s]) < 1e-5 for s in single), (single, ddp)
    weights = [torch.load(workdir / f'{o}_{out}' / 'ckpt.pt', weights_only=True)['model']
               for o in ('out_single', 'out_ddp')]
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, atol=1e-5, rtol=0)


def test_a_failing_rank_ends_every_rank(workdir):
    """Rank 0 cannot write its checkpoint while rank 1 waits for it (a barrier): both end, with rank 0's
    message, printed once, as the root cause in torchrun's closing summary (its last lines); no traceback of
    ours."""
    (workdir / 'out_ddp_fail' / 'ckpt.pt.tmp').mkdir(parents=True)
    result = torchrun(workdir, *TINY, *TWO_PASSES, '--out_dir=out_ddp_fail', '--max_iters=4', check=False,
                      timeout=60)
    assert result.returncode != 0
    assert 'train.py: cannot write out_ddp_fail/ckpt.pt' in result.stderr, result.stderr[-3000:]
    assert result.stderr.count('train.py: cannot write') == 1 and 'train.py", line' not in result.stderr
    last = result.stderr.strip().splitlines()[-5:]
    assert 'rank      : 0 (local_rank: 0)' in last[0], last
    assert 'traceback : train.py: cannot write' in last[-2], last
    assert 'traceback : train.py: rank 1 stopped because another rank failed' in result.stderr


def test_a_bad_setting_under_torchrun_is_said_once_by_rank_0(workdir):
    """Every rank checks the settings before the process group starts, and fails alike: the one line is
    printed once, by rank 0, right after the settings, not once per rank before torchrun's summary."""
    result = torchrun(workdir, *TINY, *TWO_PASSES, '--out_dir=out_ddp_bad', '--eval_iters=0', check=False,
                      timeout=120)
    line = 'train.py: eval_iters=0; use 1 or more validation batches'
    assert result.returncode != 0 and (result.stdout + result.stderr).count(line) == 1, result.stderr[-2000:]
    assert not (workdir / 'out_ddp_bad').exists()


def test_a_failure_of_rank_1_alone_before_training_is_printed_marked_with_its_rank(workdir):
    """Rank 1 alone cannot find its data (its node's copy is missing) while rank 0 waits for it in the
    process group: rank 1's line is printed once, marked with its rank, and torchrun ends both. (Before, ranks
    other than 0 were quiet until the loop and the line was printed nowhere.)"""
    script = workdir / 'rank_1_without_data.py'
    script.write_text("import os, runpy, sys\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    sys.argv.append('--dataset=not_on_this_node')\n"
                      "sys.argv[0] = sys.argv.pop(1)\n"
                      "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
                      "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = torchrun(workdir, *TINY, *TWO_PASSES, '--out_dir=out_ddp_rank_1', check=False, timeout=120,
                      script=(script, REPO / 'train.py'))
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if 'not_on_this_node/meta.json' in line]
    assert result.returncode != 0 and len(lines) == 1, output[-3000:]
    assert lines[0].startswith('[rank 1, before training] train.py: data/not_on_this_node/meta.json not fo')
    assert 'train.py", line' not in output


def test_a_nan_stop_under_torchrun_is_said_once(workdir):
    """Every rank meets a NaN loss alike (its count is all-reduced): rank 0 says so in one line, torchrun's
    summary names it as the root cause, and rank 1 ends without repeating it."""
    result = torchrun(workdir, *TINY, *TWO_PASSES, '--out_dir=out_ddp_nan', '--learning_rate=1e20',
                      '--warmup_iters=0', '--min_lr=0', '--max_iters=8', '--eval_interval=10', check=False,
                      timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and output.count('became NaN or inf') == 1, output[-3000:]
    assert 'traceback : train.py: the training loss or gradient norm became NaN or inf by step 1' in output
    assert 'train.py", line' not in output and not (workdir / 'out_ddp_nan' / 'ckpt.pt').exists()


def rank_pid(torchrun_pid, rank):
    """The process id of one rank of a torchrun, found through /proc (Linux)."""
    children = Path(f'/proc/{torchrun_pid}/task/{torchrun_pid}/children').read_text().split()
    return next(int(pid) for pid in children
                if f'RANK={rank}'.encode() in Path(f'/proc/{pid}/environ').read_bytes().split(b'\0'))


@pytest.fixture(scope='module')
def ddp_straight(workdir):
    """out_ddp_straight: torchrun with 2 ranks, 40 steps of 2 passes (one a rank) without a break."""
    torchrun(workdir, *TINY, *TWO_PASSES, *LONG, '--out_dir=out_ddp_straight')
    return records(workdir, 'out_ddp_straight')


def test_sigterm_to_one_rank_stops_every_rank_at_one_step_to_resume_exactly(workdir, ddp_straight):
    """SIGTERM to rank 1 alone (a scheduler's signal may reach the ranks at different steps): every rank stops
    at the same step, rank 0 saves it once, and a resumed torchrun equals an uninterrupted one, log and
    weights. The save takes 35 s (a 1.6B checkpoint is about 20 GB), longer than torchrun waits after a rank
    exits before it kills the others (30 s): rank 1 must wait for rank 0's save instead of exiting at once."""
    process = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                '--nproc_per_node=2', *stopping_at(workdir, 5, rank=1), *TINY, *TWO_PASSES,
                                *LONG, '--out_dir=out_ddp_term'], cwd=workdir,
                               env=dict(os.environ, OMP_NUM_THREADS='1', SLOW_SAVE='35'),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank_1 = wait_until_stopped(process, lambda: rank_pid(process.pid, 1))
    os.kill(rank_1, signal.SIGTERM)
    os.kill(rank_1, signal.SIGCONT)
    output = ''.join(process.communicate(timeout=180))
    step = torch.load(workdir / 'out_ddp_term' / 'ckpt.pt', weights_only=True)['iter_num']
    assert step == 5 and output.count('train.py: stopped by SIGTERM') == 1, output[-3000:]
    assert (f'train.py: stopped by SIGTERM at step {step}; saved out_ddp_term/ckpt.pt; continue with '
            f'--init_from=resume') in output.splitlines()
    # torchrun's closing summary (its own traceback), none of ours
    assert 'train.py", line' not in output and process.returncode != 0
    assert not list((workdir / 'out_ddp_term').glob('*.tmp'))
    assert max(log(workdir, 'out_ddp_term', 'train_loss')) == step
    torchrun(workdir, *TINY, *TWO_PASSES, *LONG, '--out_dir=out_ddp_term', '--init_from=resume')
    assert records(workdir, 'out_ddp_term') == ddp_straight
    assert_same_weights(weights(workdir, 'out_ddp_term'), weights(workdir, 'out_ddp_straight'))



def test_a_ddp_resume_between_log_steps_logs_what_the_uninterrupted_run_logs(workdir):
    """A stop under torchrun between two log steps: each rank's training loss summed since the last log
    differs, and the checkpoint carries their mean, so the resumed run's next log line (the mean over the
    interval and the ranks) equals the uninterrupted run's, every record alike."""
    common = [*TINY, *TWO_PASSES, '--max_iters=12', '--lr_decay_iters=12', '--eval_interval=12',
              '--log_interval=4']
    torchrun(workdir, *common, '--out_dir=out_ddp_log_straight')
    process = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                '--nproc_per_node=2', *stopping_at(workdir, 6, rank=1), *common,
                                '--out_dir=out_ddp_log'], cwd=workdir, env=dict(os.environ, OMP_NUM_THREADS='1'),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank_1 = wait_until_stopped(process, lambda: rank_pid(process.pid, 1))
    os.kill(rank_1, signal.SIGTERM)
    os.kill(rank_1, signal.SIGCONT)
    output = ''.join(process.communicate(timeout=180))
    checkpoint = torch.load(workdir / 'out_ddp_log' / 'ckpt.pt', weights_only=True)
    assert checkpoint['iter_num'] == 6 and checkpoint['loss_since_log'][1] == 2, output[-3000:]
    torchrun(workdir, *common, '--out_dir=out_ddp_log', '--init_from=resume')
    assert records(workdir, 'out_ddp_log') == records(workdir, 'out_ddp_log_straight')


def two_nodes(workdir, *args, node_1=(), script=(REPO / 'train.py',)):
    """Two torchruns of one CPU rank each, as two nodes start them (a static rendezvous at a free port here):
    node 1's rank has RANK=1 and LOCAL_RANK=0. node_1: more arguments for node 1's rank alone."""
    with socket.socket() as s:
        s.bind(('localhost', 0))
        port = s.getsockname()[1]
    return [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nnodes=2',
                              '--nproc_per_node=1', f'--node_rank={node}', '--master_addr=localhost',
                              f'--master_port={port}', *script, *args, *(node_1 if node else ())],
                             cwd=workdir, env=dict(os.environ, OMP_NUM_THREADS='1'),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (0, 1)]


def ended(nodes, code=0):
    """Both nodes' output (stdout, then stderr), once each has exited with code."""
    outputs = [''.join(node.communicate(timeout=120)) for node in nodes]
    assert [node.returncode for node in nodes] == [code, code], outputs[0][-3000:] + outputs[1][-3000:]
    return outputs


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason='needs torch.distributed with gloo')
def test_two_nodes_train_as_one_and_resume_after_sigterm_to_node_1(workdir, ddp_straight):
    """Two simulated nodes of one rank each train exactly as 2 ranks on one node do, log and weights, and only
    global rank 0 writes: node 1's rank, given an out_dir of its own, never makes it. SIGTERM to node 1's rank
    stops both at one step, rank 0 saves it once (into out_dir, which a resume needs on a shared file system),
    and the resumed run ends as the straight one."""
    ended(two_nodes(workdir, *TINY, *TWO_PASSES, *LONG, '--out_dir=out_2n',
                    node_1=['--out_dir=out_2n_node_1']))
    assert records(workdir, 'out_2n') == ddp_straight and not (workdir / 'out_2n_node_1').exists()
    assert_same_weights(weights(workdir, 'out_2n'), weights(workdir, 'out_ddp_straight'))

    nodes = two_nodes(workdir, *TINY, *TWO_PASSES, *LONG, '--out_dir=out_2n_term',
                      script=stopping_at(workdir, 5, rank=1))
    rank_1 = wait_until_stopped(nodes[1], lambda: rank_pid(nodes[1].pid, 1))
    os.kill(rank_1, signal.SIGTERM)
    os.kill(rank_1, signal.SIGCONT)
    outputs = ended(nodes, code=1)
    assert 'train.py: stopped by SIGTERM at step 5; saved out_2n_term/ckpt.pt' in outputs[0], outputs[0]
    assert ''.join(outputs).count('train.py: stopped by SIGTERM') == 1
    ended(two_nodes(workdir, *TINY, *TWO_PASSES, *LONG, '--out_dir=out_2n_term', '--init_from=resume'))
    assert records(workdir, 'out_2n_term') == ddp_straight
    assert_same_weights(weights(workdir, 'out_2n_term'), weights(workdir, 'out_ddp_straight'))


def test_mfu_is_per_gpu(workdir):
    """MFU is one GPU's: 2 ranks that each train on as many tokens a second as one process (a pass of 8
    sequences a step) report that process's MFU, and twice its tokens/s (the job's). Every step takes one
    second of a clock that the optimizer's steps advance, on any machine."""
    clock = workdir / 'step_clock.py'
    clock.write_text(STEP_CLOCK)
    common = [*TINY, '--max_iters=3', '--eval_interval=3', '--lr_decay_iters=3', '--peak_tflops=1']
    run([clock, REPO / 'train.py', *common, '--out_dir=out_mfu_one'], workdir)
    torchrun(workdir, *common, *TWO_PASSES, '--out_dir=out_mfu_two', script=(clock, REPO / 'train.py'))
    one, two = (log(workdir, out, 'mfu') for out in ('out_mfu_one', 'out_mfu_two'))
    assert list(one) == list(two) == [1, 2, 3] and all(one[s] > 0 for s in one)
    assert all(two[s] == pytest.approx(one[s], rel=1e-6) for s in one), (one, two)
    one, two = (log(workdir, out, 'tokens_per_sec') for out in ('out_mfu_one', 'out_mfu_two'))
    assert all(one[s] == pytest.approx(8 * 32, rel=1e-6) and two[s] == pytest.approx(2 * one[s]) for s in one)


COUNTED_COMPILES = """import os, runpy, sys
import torch
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
compiles, compile = [], torch.compile
torch.compile = lambda *args, **kwargs: compiles.append(args) or compile(*args, **kwargs)
runpy.run_path(sys.argv[0], run_name='__main__')
print(f"rank {os.environ['RANK']}: torch.compile called {len(compiles)} time(s)")
"""


def test_compiled_ddp_matches_one_compiled_process(workdir):
    """--compile=True: torchrun with 2 ranks (the DDP-wrapped model compiled, once, for training and
    evaluation, DDPOptimizer cutting its graph at the gradient buckets) logs the losses of one compiled
    process, and that process compiles evaluation for no batch size of its own (torch's log of recompilations
    names no size)."""
    script = workdir / 'counted_compiles.py'
    script.write_text(COUNTED_COMPILES)
    common = [*TINY, '--compile=True', '--max_iters=3', '--eval_interval=3', '--lr_decay_iters=3',
              '--gradient_accumulation_steps=2', '--batch_size=4']
    single = run([REPO / 'train.py', *common, '--out_dir=out_compiled_one'], workdir,
                 env=dict(os.environ, OMP_NUM_THREADS='1', TORCH_LOGS='recompiles'))
    assert 'Recompiling' in single.stderr and 'size mismatch' not in single.stderr, single.stderr[-3000:]
    result = torchrun(workdir, *common, '--out_dir=out_compiled_two', script=(script, REPO / 'train.py'))
    assert 'weights across 2 ranks differ by at most 0' in result.stdout
    assert all(f'rank {rank}: torch.compile called 1 time(s)' in result.stdout for rank in (0, 1))
    one, two = (log(workdir, out, 'train_loss') for out in ('out_compiled_one', 'out_compiled_two'))
    assert list(one) == list(two) == [1, 2, 3]
    assert all(abs(one[s] - two[s]) < 1e-5 for s in one), (one, two)


def train_py(*names):
    """The module-level statements of train.py that assign names, compiled: what a test runs is train.py's own
    code for them (DDP's options, each rank's share of a step)."""
    tree = ast.parse((REPO / 'train.py').read_text())
    nodes = [node for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(target, ast.Name) and target.id in names for target in node.targets)]
    assert len(nodes) == len(names), names
    return compile(ast.Module(nodes, type_ignores=[]), 'train.py', 'exec')


def paper_model(config_file, vocab_size=50304):
    """The model a config file's settings build, on the meta device (no memory), and the settings."""
    config = configure(train_defaults(), [str(config_file)], verbose=False)
    with torch.device('meta'):
        return build_model(AblationConfig(**{f.name: config[f.name] for f in fields(AblationConfig)
                                             if f.name in config}, vocab_size=vocab_size)), config


def test_ddp_buckets_hold_about_one_block():
    """DDP's gradient buckets hold about one block each, so a compiled 1.6B model's graph is cut into a few
    dozen pieces rather than hundreds, and gradients are views into them (no second copy)."""
    for name in ('resformer_82m.py', 'resformer_1b6.py'):
        raw_model, config = paper_model(REPO / 'config' / name)
        scope = {'raw_model': raw_model}
        exec(train_py('block_mb'), scope)
        buckets = 4 * raw_model.num_params() / 2 ** 20 / max(25, scope['block_mb'])
        assert config['n_layer'] / 2 < buckets < 2 * config['n_layer'], (name, buckets)
    ddp = next(node for node in ast.walk(ast.parse((REPO / 'train.py').read_text()))
               if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'DDP')
    options = {keyword.arg: ast.unparse(keyword.value) for keyword in ddp.keywords if keyword.arg}
    assert options['gradient_as_bucket_view'] == 'True' and options['bucket_cap_mb'] == 'max(25, block_mb)'


def test_ddp_gets_the_buffer_keyword_its_torch_has():
    """forward_sync_buffers where DDP has it (recent torch), else broadcast_buffers (older torch)."""
    class OlderDDP:
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            pass

    installed = torch.nn.parallel.DistributedDataParallel
    for ddp in OlderDDP, installed:
        scope = {'inspect': inspect, 'DDP': ddp}
        exec(train_py('buffer_sync'), scope)
        assert scope['buffer_sync'] in inspect.signature(ddp).parameters
        if ddp is OlderDDP:
            assert scope['buffer_sync'] == 'broadcast_buffers'


def test_every_config_splits_its_steps_over_the_ranks_it_runs_on():
    """nanoGPT's meaning: gradient_accumulation_steps counts the passes of a step over all ranks together, so
    a config for torchrun's 8 GPUs has a multiple of 8 (and so runs on 1, 2, 4 or 8), and each rank takes an
    equal, contiguous share of the step's sequences in passes of batch_size; a count that does not split is
    refused in one line."""
    for path in sorted((REPO / 'config').glob('*.py')):
        config = configure(train_defaults(), [str(path)], verbose=False)
        passes, batch_size = config['gradient_accumulation_steps'], config['batch_size']
        for world_size in (1, 2, 4, 8) if 'torchrun' in path.read_text() else (1,):
            settings.check_settings(config, world_size)
            shares = []
            for rank in range(world_size):
                scope = {'global_batch': passes * batch_size, 'ddp_world_size': world_size, 'ddp_rank': rank,
                         'batch_size': batch_size}
                exec(train_py('rank_share', 'rank_passes'), scope)
                shares.append(scope['rank_passes'])
            pieces = [piece for share in shares for piece in share]
            assert [start for start, _ in pieces] == [0] + [stop for _, stop in pieces[:-1]], (path, world_size)
            assert pieces[-1][1] == passes * batch_size and len(pieces) == passes
            assert all(stop - start == batch_size for start, stop in pieces)
            assert len({len(share) for share in shares}) == 1  # every rank runs as many passes
    config = configure(train_defaults(), ['--gradient_accumulation_steps=12'], verbose=False)
    with pytest.raises(SystemExit, match=r'^train.py: gradient_accumulation_steps=12 passes a step do not '
                                         r'split over 8 ranks; use a multiple of 8 '):
        settings.check_settings(config, 8)


def test_help_explains_every_model_flag(workdir):
    """--help prints each setting's comment: every model flag has one, and variant's names every preset, the
    paper's (model.py) and the baselines' (ablations.py)."""
    text = train_here(workdir, ['--help']).stdout
    flags = [f.name for f in fields(AblationConfig) if f.name in train_defaults()]
    comments = {line.split()[0].split('=')[0]: line.split(maxsplit=1)[1:] for line in text.splitlines()
                if line.startswith('  --')}
    assert len(flags) > 20 and [flag for flag in flags if not comments[f'--{flag}']] == []
    variant = ' '.join(comments['--variant'])
    assert [name for name in [*VARIANTS, *BASELINES] if name.split('_')[-1] not in variant] == [], variant


PAPER_SIZES = {'resformer_82m.py': 82e6, 'resformer_180m.py': 180e6, 'resformer_468m.py': 468e6,
               'resformer_1b6.py': 1.67e9, 'svformer_82m.py': 80e6}  # 1b6: the inferred shape gives 1.67B


@pytest.mark.parametrize('path', sorted((REPO / 'config').glob('*.py')), ids=lambda path: path.name)
def test_config_files_load_and_build_their_model(path):
    """Every config file names only real settings, builds a valid model,
    and the paper's give the paper's sizes."""
    model, config = paper_model(path)
    assert config['block_size'] >= 128 and config['max_iters'] == config['lr_decay_iters']
    if path.name in PAPER_SIZES:
        assert abs(model.num_params() / PAPER_SIZES[path.name] - 1) < 0.03, model.num_params()
        # the paper's global batch
        assert config['batch_size'] * config['gradient_accumulation_steps'] == 1024


# the other process in the next test: holds a lock through vrl/locks.py, says so, and waits for a line on stdin
HOLDER = """import sys
sys.path.insert(0, sys.argv[2])
from vrl import locks
held, _ = locks.try_lock(sys.argv[1], "holder")
print("held" if held else "refused", flush=True)
sys.stdin.readline()
held.release()
"""


def test_without_fcntl_as_on_windows(tmp_path):
    """Windows has no fcntl: prepare.py and train.py run without it, and train.py's out_dir lock (msvcrt
    there; here the marker file filelock uses without fcntl) refuses a second writer, naming it. Simulated on
    Linux."""
    (tmp_path / 'no_fcntl').mkdir()
    (tmp_path / 'no_fcntl' / 'sitecustomize.py').write_text("import sys\nsys.modules['fcntl'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / 'no_fcntl'))
    assert run(['-c', 'import fcntl'], tmp_path, check=False, env=env).returncode == 1  # the simulation holds
    (tmp_path / 'tiny.txt').write_text('\n'.join(f'line {i}: value residual first layer.'
                                                 for i in range(2000)))
    run([REPO / 'prepare.py', '--input=tiny.txt', '--out_dir=data/tiny_char'], tmp_path, env=env)
    (tmp_path / 'out').mkdir()
    holder = subprocess.Popen([sys.executable, '-c', HOLDER, str(tmp_path / 'out' / '.lock'), str(REPO)],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        refused = run([REPO / 'train.py', *TINY, '--max_iters=2', '--device=cpu', '--out_dir=out'], tmp_path,
                      check=False, env=env)
        one_line_error(refused, f'train.py: another run (process {holder.pid}) is writing to out; '
                                f'wait for it to end')
    finally:
        holder.communicate('\n')  # it lets go
    run([REPO / 'train.py', *TINY, '--max_iters=2', '--device=cpu', '--out_dir=out'], tmp_path, env=env)
    assert [r['step'] for r in records(tmp_path, 'out') if 'val_loss' in r] == [0, 2]


GRAD_VIEWS = """import json, os, runpy, sys
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import model
buckets, seen, updates = set(), [], 0
def count_update(optimizer, args, kwargs):
    global updates
    updates += 1
register_optimizer_step_post_hook(count_update)
def noting_hook(state, bucket):  # DDP's own all-reduce, noting where each bucket lives
    buckets.add(bucket.buffer().untyped_storage().data_ptr())
    return allreduce_hook(state, bucket)
ddp_init = torch.nn.parallel.DistributedDataParallel.__init__
def init(self, *args, **kwargs):
    ddp_init(self, *args, **kwargs)
    self.register_comm_hook(None, noting_hook)
torch.nn.parallel.DistributedDataParallel.__init__ = init
forward = model.GPT.forward
def watched(self, *args, **kwargs):  # after the second update: is every gradient a view into a bucket?
    if updates >= 2:
        seen.append(all(p.grad is not None and p.grad.untyped_storage().data_ptr() in buckets
                        for p in self.parameters() if p.requires_grad))
    return forward(self, *args, **kwargs)
model.GPT.forward = watched
runpy.run_path(sys.argv[0], run_name='__main__')
print(f"rank {os.environ['RANK']}: views at {sum(seen)} of {len(seen)} forward passes after step 2")
"""


def test_ddp_gradients_stay_views_into_its_buckets(workdir):
    """Under DDP (gradient_as_bucket_view), every parameter's gradient lives in one of DDP's buckets at every
    forward pass, passes without a sync included: zeroed, never freed, so no step allocates a second copy of
    the gradients for DDP to copy in. Checked from the second update on: DDP rebuilds its buckets once, in the
    second step's forward, and the script learns where they live from the all-reduce at that step's end."""
    script = workdir / 'grad_views.py'
    script.write_text(GRAD_VIEWS)
    result = torchrun(workdir, *TINY, '--max_iters=3', '--eval_interval=3', '--gradient_accumulation_steps=4',
                      '--batch_size=2', '--eval_iters=8', '--out_dir=out_views',
                      script=(script, REPO / 'train.py'))
    # step 3 (the last): 2 passes of 2 sequences a rank; then 16 validation windows: 4 passes of 2 a rank
    for rank in (0, 1):
        assert f'rank {rank}: views at 6 of 6 forward passes after step 2' in result.stdout, result.stdout


def test_the_compiled_training_step_makes_no_logits_gradient():
    """Compiled, a training forward given targets returns its loss alone, so the backward graph takes no
    B x T x vocab gradient of the logits: only the loss's. Returning the logits too would add one."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    tangents = []

    def backward_compiler(graph, _):
        tangents.append([tuple(node.meta['val'].shape) for node in graph.graph.nodes
                         if node.op == 'placeholder' and node.name.startswith('tangents')])
        return make_boxed_func(graph)

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    x, y = torch.randint(64, (2, 16)), torch.randint(64, (2, 16))
    backend = aot_autograd(fw_compiler=lambda graph, _: make_boxed_func(graph), bw_compiler=backward_compiler)
    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x, y).backward()
    with_logits = torch.compile(lambda x, y: (model(x), model(x, y)), backend=backend)
    with_logits(x, y)[1].backward()
    assert tangents == [[()], [(2, 16, 64), ()]], tangents


def test_the_checkpoint_a_run_starts_from_is_not_written_again(workdir, monkeypatch):
    """A fresh run's step 0 evaluation writes no checkpoint (at 1.6B one is about 20 GB, of weights the
    seed makes again), and a run resumed from a checkpoint that holds its step's evaluation neither repeats
    it nor writes that step again (test_a_stop_at_or_in_an_evaluation_loses_no_best_weights: one without)."""
    saved, save = [], run_folder.RunFolder.save
    monkeypatch.setattr(run_folder.RunFolder, 'save', lambda run, checkpoint, best, background=False: (
        saved.append(checkpoint['iter_num']), save(run, checkpoint, best, background)))
    train(workdir, '--out_dir=out_no_step_0', '--max_iters=2', '--eval_interval=1')
    train(workdir, '--out_dir=out_no_step_0', '--max_iters=3', '--eval_interval=1', '--init_from=resume')
    assert saved == [1, 2, 3]
    assert [r['step'] for r in records(workdir, 'out_no_step_0') if 'val_loss' in r] == [0, 1, 2, 3]


@pytest.mark.parametrize('piped', ['pipe.py', 'out_pipe/ckpt.pt', 'data/pipe_char/meta.json'])
def test_a_pipe_where_a_file_is_read_whole_is_refused_in_one_line(workdir, piped):
    """A config file, the checkpoint to resume, the data's meta.json: a pipe there is refused before it is
    opened (opening it waits for a writer, perhaps forever), and nothing is written. A process of its own with
    a timeout, so the suite cannot hang on it."""
    os.makedirs(workdir / os.path.dirname(piped), exist_ok=True)
    os.mkfifo(workdir / piped)
    args = {'pipe.py': ['pipe.py', '--out_dir=out_piped'], 'out_pipe/ckpt.pt': ['--out_dir=out_pipe',
            '--init_from=resume'], 'data/pipe_char/meta.json': ['--dataset=pipe_char', '--out_dir=out_piped']}
    before = snapshot(workdir)
    try:
        result = run([REPO / 'train.py', *TINY, '--device=cpu', *args[piped]], workdir, check=False,
                     timeout=60)
        after = snapshot(workdir)
    finally:
        os.remove(workdir / piped)
    one_line_error(result, piped, 'is not a regular file (a pipe or device may wait forever for a writer)')
    assert after == before


def test_a_pipe_for_the_log_of_a_run_to_resume_is_refused_in_one_line(workdir):
    train(workdir, '--out_dir=out_pipe_log', '--max_iters=2')
    os.remove(workdir / 'out_pipe_log' / 'log.jsonl')
    os.mkfifo(workdir / 'out_pipe_log' / 'log.jsonl')
    before = snapshot(workdir)
    result = run([REPO / 'train.py', *TINY, '--device=cpu', '--out_dir=out_pipe_log', '--max_iters=4',
                  '--init_from=resume'], workdir, check=False, timeout=60)
    one_line_error(result, "train.py: the run's log", 'log.jsonl is not a regular file')
    assert snapshot(workdir) == before


@pytest.mark.parametrize('args, words', [
    (['--n_layer=1000000'], ['n_layer=1000000', 'use at most 1024']),
    (['--n_embd=100000000000'], ['n_embd=100000000000', 'does not fit in the']),  # was a torch overflow
    (['--lr_scales=["blocks.0.attn.c_v.weight", 2.0]'], ["lr_scales=['blocks.0.attn.c_v.weight', 2.0]",
                                                         "[['blocks.0.attn.c_v.weight', 2.0], ...]"]),
    (['--lr_scales=[[["blocks.0.attn.c_v.weight", 2.0]]]'], ["[['blocks.0.attn.c_v.weight', 2.0], ...]"]),
    (['--lr_scales=[["blocks.0.attn.c_v.weight", -2.0]]'], ['-2.0', 'finite number, 0 or more']),
    (['--lr_scales=[["wte.weight", 2], ["wte.weight", 3]]'], ['each name once']),
    (['--weight_decay=1e999'], ['weight_decay=inf', 'finite']),
    (['--grad_clip=1e999'], ['grad_clip=inf', 'finite']),
])
def test_settings_too_large_or_malformed_stop_in_one_line_writing_nothing(workdir, args, words):
    before = snapshot(workdir)
    result = train(workdir, '--device=cpu', '--out_dir=out_refused', *args, check=False)
    one_line_error(result, 'train.py: ', *words)
    assert snapshot(workdir) == before


def test_resuming_with_max_iters_below_the_checkpoints_step_leaves_it_alone(workdir):
    train(workdir, '--out_dir=out_below', '--max_iters=4', '--eval_interval=2')
    before = {name: (workdir / 'out_below' / name).read_bytes() for name in ('ckpt.pt', 'log.jsonl')}
    result = train(workdir, '--out_dir=out_below', '--init_from=resume', '--max_iters=2', check=False)
    one_line_error(result, f"train.py: max_iters=2 is below step 4 of {os.path.join('out_below', 'ckpt.pt')}"
                           f", which is left as it is; resume with --max_iters above it")
    assert {name: (workdir / 'out_below' / name).read_bytes() for name in before} == before


# ------------------------------------------------------------------------------------------------------------
# muon=True

# 2 passes a step, so that one process and 2 ranks train on the same 16 sequences a step
MUON = ['--muon=True', '--muon_lr=0.02', '--max_iters=8', '--eval_interval=4', '--lr_decay_iters=8', *TWO_PASSES]


@pytest.mark.parametrize('flag, table', [('value_embeds', 'attn.value_embed.'), ('value_bank', 'attn.bank.')])
def test_muon_takes_the_blocks_linear_weights_and_adamw_everything_else(flag, table):
    model = build_model(AblationConfig(vocab_size=64, n_layer=3, n_head=2, n_embd=32, block_size=16,
                                       value_residual=True, lambda_mode='learnable', **{flag: True}))
    optimizer = configure_optimizers(model, 0.1, 2e-3, (0.9, 0.95), 'cpu', [['blocks.0.attn.c_q.weight', 2.0]],
                                     muon=(0.02, 'original'))
    muon = {id(p) for group in optimizer.muon.param_groups for p in group['params']}
    adamw = {id(p) for group in optimizer.adamw.param_groups for p in group['params']}
    names = {id(p): name for name, p in model.named_parameters()}
    linear = {id(m.weight) for m in model.blocks.modules() if isinstance(m, torch.nn.Linear)}
    assert muon == linear and not muon & adamw and muon | adamw == set(names)
    assert {names[i] for i in adamw} >= {'wte.weight', 'lm_head.weight', 'lambda_1', 'lambda_2', 'norm_f.weight'}
    assert any(table in names[i] for i in adamw) and not any(table in names[i] for i in muon)
    # one schedule: learning_rate's multiple lr_scale, Muon's at muon_lr (twice that where lr_scales says so)
    scales = {names[id(p)]: group['lr_scale'] for group in optimizer.param_groups for p in group['params']}
    assert scales['blocks.1.attn.c_q.weight'] == 10.0 and scales['blocks.0.attn.c_q.weight'] == 20.0
    assert scales['wte.weight'] == 1.0


def test_muon_resumes_exactly_in_one_process_and_on_two_ranks(workdir):
    """Muon's momenta are in the checkpoint: 8 steps == 4, stop, resume, bit for bit, on one process and on
    2 ranks (whose replicas stay identical), and the two agree."""
    train(workdir, '--out_dir=out_muon', *MUON)
    train(workdir, '--out_dir=out_muon_resumed', *MUON, '--max_iters=4')
    train(workdir, '--out_dir=out_muon_resumed', *MUON, '--init_from=resume')
    assert records(workdir, 'out_muon_resumed') == records(workdir, 'out_muon')
    assert_same_weights(weights(workdir, 'out_muon_resumed'), weights(workdir, 'out_muon'))
    torchrun(workdir, *TINY, *MUON, '--out_dir=out_muon_ddp')
    torchrun(workdir, *TINY, *MUON, '--max_iters=4', '--out_dir=out_muon_ddp_resumed')
    result = torchrun(workdir, *TINY, *MUON, '--init_from=resume', '--out_dir=out_muon_ddp_resumed')
    assert 'weights across 2 ranks differ by at most 0' in result.stdout  # every rank's update the same
    assert records(workdir, 'out_muon_ddp_resumed') == records(workdir, 'out_muon_ddp')
    assert_same_weights(weights(workdir, 'out_muon_ddp_resumed'), weights(workdir, 'out_muon_ddp'))
    one, two = log(workdir, 'out_muon', 'train_loss'), log(workdir, 'out_muon_ddp', 'train_loss')
    assert all(abs(one[s] - two[s]) < 1e-4 for s in one) and list(one) == list(range(1, 9))
    assert log(workdir, 'out_muon', 'val_loss')[8] < log(workdir, 'out_muon', 'val_loss')[0] - 0.5


def test_compiled_muon_matches_eager(workdir):
    common = [*TINY, *MUON, '--max_iters=3', '--eval_interval=3']
    run([REPO / 'train.py', *common, '--compile=True', '--out_dir=out_muon_compiled'], workdir,
        env=dict(os.environ, OMP_NUM_THREADS='1'))
    train(workdir, *MUON, '--max_iters=3', '--eval_interval=3', '--out_dir=out_muon_eager')
    compiled, eager = (log(workdir, out, 'train_loss') for out in ('out_muon_compiled', 'out_muon_eager'))
    assert list(compiled) == list(eager) == [1, 2, 3]
    assert all(abs(compiled[s] - eager[s]) < 1e-4 for s in eager), (compiled, eager)


def test_muon_on_a_torch_without_it_is_one_line(workdir, monkeypatch):
    monkeypatch.delattr(torch.optim, 'Muon')
    result = train(workdir, '--muon=True', '--out_dir=out_no_muon', check=False)
    one_line_error(result, "train.py: muon=True needs torch.optim.Muon, in torch 2.9 and later "
                           f"(this is torch {torch.__version__})")
    assert not (workdir / 'out_no_muon').exists()
