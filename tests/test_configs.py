"""
Every config file, and every run its header comment lists (the `train.py config/...` command lines), on a CPU:
the settings load through train.py's defaults, the paper-size model builds (on the meta device, no memory)
with the paper's parameter count and tokens per step, and the same model shrunk to a toy trains for one step.
A new config file, or a new command line in a header, is picked up automatically.
"""

import ast
import json
import math
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from configurator import configure
from model import GPT, GPTConfig
from testing import train_defaults
from vrl.optim import configure_optimizers

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]  # the repository root
CONFIGS = sorted((REPO / 'config').glob('*.py'))
# settings shared by the full-scale configs, which exec it; it lists no runs itself
FRAGMENTS = {'paper_recipe.py'}
# (n_layer, n_embd) -> the paper's parameter count for that shape;
# the "1.6B" shape is inferred and has 1.67B (resformer_1b6.py)
PAPER_SIZES = {(8, 512): 82e6, (12, 768): 180e6, (24, 1024): 468e6, (24, 2048): 1.67e9}
# sequence length -> sequences per step, about 2M tokens at every length (the paper's Table 3, ICLR A.5)
PAPER_BATCH = {512: 4096, 2048: 1024, 8192: 256, 32_000: 64, 64_000: 32}
# config -> its steps when not the recipe's 10,000: the 1.6B model's second-hand 200B tokens
LONGER_RUNS = {'resformer_1b6.py': 100_000}
# (n_layer, n_embd) -> the most tokens one GPU may take per forward pass to fit in 80 GB, as the config
# headers' estimates have it (x 2048 tokens: 82M 32, 180M 16, 468M 8, 1.6B 4); the explicit-attention
# ablation needs half
MICRO_BATCH_TOKENS = {(8, 512): 65_536, (12, 768): 32_768, (24, 1024): 16_384, (24, 2048): 8_192}


def header_runs(path):
    """(ranks, arguments after train.py) for each `train.py config/...` line in the file's comments."""
    runs = []
    for line in path.read_text().splitlines():
        if line.startswith('#') and 'train.py config/' in line:
            words = shlex.split(line.lstrip('#'))
            at = words.index('train.py')
            ranks = next((int(w.split('=')[1]) for w in words[:at] if w.startswith('--nproc_per_node=')), 1)
            runs.append((ranks, words[at + 1:]))
    return runs


def header_evals(path):
    """(downstream task list, eval.py command lines) from the file's comments: the
    `# Downstream tasks: a,b,...` line (None without one) and the arguments after each `python lab/eval.py`."""
    tasks, evals = None, []
    for line in path.read_text().splitlines():
        if line.startswith('# Downstream tasks:'):
            tasks = line.split(':', 1)[1].split()[0].split(',')
        elif line.startswith('#') and 'python lab/eval.py' in line:
            words = shlex.split(line.lstrip('#'))
            evals.append(words[words.index('lab/eval.py') + 1:])
    return tasks, evals


def eval_default_tasks():
    """eval.py's default task list, as its --help prints it (without lm_eval: settings load before it)."""
    code = ("import sys, runpy; sys.modules['lm_eval'] = None; sys.argv = ['eval.py', '--help']; "
            f"runpy.run_path({str(REPO / 'lab' / 'eval.py')!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    [line] = [line for line in result.stdout.splitlines() if line.startswith('  --tasks=')]
    return ast.literal_eval(line.split()[0].split('=', 1)[1]).split(',')


def run_id(path, args):
    out_dir = next((a.split('=', 1)[1] for a in args if a.startswith('--out_dir=')), 'default')
    return f'{path.name}:{out_dir}'


RUNS = [(path, ranks, args) for path in CONFIGS for ranks, args in header_runs(path)]
RUNS += [(path, 1, [f'config/{path.name}'])
         for path in CONFIGS if not header_runs(path)]  # the file on its own


def settings_of(args):
    return configure(train_defaults(), [str(REPO / args[0]), *args[1:]], verbose=False)


def model_config(settings, **overrides):
    model_args = {f.name: settings[f.name] for f in fields(GPTConfig) if f.name in settings}
    return GPTConfig(**(model_args | overrides))


@pytest.mark.parametrize('path', [p for p in CONFIGS if p.name not in FRAGMENTS], ids=lambda p: p.name)
def test_header_lists_its_runs_each_into_its_own_folder(path):
    """Each config names the runs of its comparison, all on this file, none writing into another's out_dir."""
    runs = header_runs(path)
    assert runs, f'{path.name} lists no `train.py config/{path.name} ...` command in its header'
    assert all(args[0] == f'config/{path.name}' for _, args in runs)
    out_dirs = [settings_of(args)['out_dir'] for _, args in runs]
    assert len(set(out_dirs)) == len(out_dirs), out_dirs


def test_headers_that_speak_of_downstream_name_eval_py_defaults_and_its_commands():
    """Every config that mentions downstream results names eval.py's default tasks, the paper's, and gives an
    eval.py command, with those defaults, for runs its header lists; and eval.py's default is the paper's six
    zero-shot tasks (HellaSwag, OpenBookQA, WinoGrande, ARC-Easy, ARC-Challenge, PIQA) plus WikiText."""
    default = eval_default_tasks()
    assert default == ['hellaswag', 'openbookqa', 'winogrande', 'arc_easy', 'arc_challenge', 'piqa',
                       'wikitext']
    speaking = [path for path in CONFIGS if 'downstream' in path.read_text().lower()]
    assert {path.name for path in speaking} >= {'baselines_468m.py', 'lengths_82m.py'}
    for path in speaking:
        tasks, evals = header_evals(path)
        assert tasks == default, (path.name, tasks)
        assert evals, f'{path.name} gives no `python lab/eval.py` command'
        out_dirs = {settings_of(args)['out_dir'] for _, args in header_runs(path)}
        for args in evals:
            settings = configure({'out_dir': 'out', 'ckpt': 'ckpt.pt'}, args, verbose=False)
            assert settings['out_dir'] in out_dirs, (path.name, args)


@pytest.mark.parametrize('path, ranks, args', RUNS, ids=[run_id(p, a) for p, _, a in RUNS])
def test_run_builds_the_paper_model(path, ranks, args):
    """The run's settings load and build its model at full size; the paper's shapes have the paper's parameter
    count (within 3% for the Transformer of that shape, 6% for a variant that drops projections: SVFormer's
    23 W_V are 5.2% of 468M), and a full-scale run keeps the paper's recipe: one of its sequence lengths with
    its batch (2,097,152 tokens a step at 2048) on any number of ranks, 10,000 steps, warmup 120 (or 1,200,
    the SVFormer warmup study's)."""
    settings = settings_of(args)
    assert settings['max_iters'] == settings['lr_decay_iters']
    with torch.device('meta'):
        model = GPT(model_config(settings, vocab_size=50304))
    L, d, ffn = model.config.n_layer, model.config.n_embd, model.config.ffn_hidden
    if (L, d) in PAPER_SIZES:
        # embedding, head, blocks, norms
        vanilla = 2 * 50304 * d + L * (4 * d * d + 3 * d * ffn) + (2 * L + 1) * d
        assert abs(vanilla / PAPER_SIZES[L, d] - 1) < 0.03, vanilla
        assert abs(model.num_params() / PAPER_SIZES[L, d] - 1) < 0.06, model.num_params()
    if settings['dataset'].startswith('slimpajama'):
        sequences = settings['gradient_accumulation_steps'] * settings['batch_size']
        assert sequences == PAPER_BATCH.get(settings['block_size']), (settings['block_size'], sequences)
        assert settings['gradient_accumulation_steps'] % ranks == 0  # train.py refuses it otherwise
        assert settings['max_iters'] in (10_000, LONGER_RUNS.get(path.name)), settings['max_iters']
        assert settings['warmup_iters'] in (120, 1200), settings['warmup_iters']
        share = settings['gradient_accumulation_steps'] * settings['batch_size'] // ranks  # sequences per GPU
        micro = settings['micro_batch_size'] or settings['batch_size']
        limit = MICRO_BATCH_TOKENS.get((L, d), MICRO_BATCH_TOKENS[8, 512])  # smaller: what the 82M model fits
        limit //= 2 if settings['residual_type'] == 'attention' else 1
        assert micro <= share and micro * settings['block_size'] <= limit, (micro, settings['block_size'])
        lowered = settings_of([*args, f'--micro_batch_size={max(micro // 4, 1)}'])  # to fit a smaller GPU
        assert lowered['gradient_accumulation_steps'] * lowered['batch_size'] == sequences


@pytest.mark.parametrize('path, ranks, args', RUNS, ids=[run_id(p, a) for p, _, a in RUNS])
def test_run_trains_one_step_at_toy_size(path, ranks, args):
    """The run's model, as many layers and heads and the same flags, but 4 wide per head over a 64-token
    vocabulary: one forward, backward and optimizer step (AdamW, or Muon and AdamW) with the run's settings
    gives a finite loss, a finite gradient for every parameter, and moves every parameter (λ included when
    learned); parameters the run names in lr_scales take their multiple of the rate."""
    settings = settings_of(args)
    torch.manual_seed(0)
    model = GPT(model_config(settings, n_embd=4 * settings['n_head'], ffn_hidden=None, block_size=16,
                             vocab_size=64))
    muon = (settings['muon_lr'], settings['muon_adjust_lr']) if settings['optimizer'] == 'muon' else None
    optimizer = configure_optimizers(model, settings['weight_decay'], settings['learning_rate'],
                                           (settings['beta1'], settings['beta2']), 'cpu',
                                           settings['lr_scales'], muon=muon)
    # the rate train.py sets at each step: the schedule's x the group's scale
    for group in optimizer.param_groups:
        group['lr'] = settings['learning_rate'] * group['lr_scale']
    scaled = {id(p): group['lr_scale'] for group in optimizer.param_groups for p in group['params']}
    for name, multiplier in settings['lr_scales']:
        assert scaled[id(model.get_parameter(name))] == multiplier
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    idx = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(0))
    _, loss = model(idx, targets=idx.roll(-1, dims=1))
    loss.backward()
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(64)) < 1.0
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    optimizer.step()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f'{name} did not move'


def test_a_smaller_micro_batch_takes_the_same_step(tmp_path):
    """Two steps of a tiny model on 8 sequences per step, in micro-batches of 4 and of 1: the same training
    losses and the same validation loss after the updates (up to float rounding); the run says which
    micro-batch it took."""
    (tmp_path / 'tiny.txt').write_text(''.join(f'line {i}: to be or not to be\n' for i in range(300)))
    subprocess.run([sys.executable, REPO / 'prepare.py', '--input=tiny.txt', '--out_dir=data/tiny_char'],
                   cwd=tmp_path, check=True, capture_output=True)
    losses = {}
    for micro in (4, 1):
        result = subprocess.run([sys.executable, REPO / 'train.py', '--dataset=tiny_char', '--n_layer=2',
                                 '--n_head=2', '--n_embd=16', '--block_size=8', '--batch_size=4',
                                 '--gradient_accumulation_steps=2', f'--micro_batch_size={micro}',
                                 '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--log_interval=1',
                                 '--warmup_iters=0', '--lr_decay_iters=2', '--device=cpu', '--compile=False',
                                 f'--out_dir=out{micro}'], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert (f'64 tokens per step = 8 sequences x 8 tokens, 8 per rank in micro-batches of up to {micro};'
                in result.stdout)
        log = [json.loads(line) for line in (tmp_path / f'out{micro}' / 'log.jsonl').read_text().splitlines()]
        losses[micro] = [record.get('train_loss', record.get('val_loss')) for record in log]
    assert len(losses[4]) == 4 and losses[1] == pytest.approx(losses[4], rel=1e-5)
    result = subprocess.run([sys.executable, REPO / 'train.py', '--micro_batch_size=0'], cwd=tmp_path,
                            capture_output=True, text=True)
    assert (result.returncode == 1
            and result.stderr == 'train.py: micro_batch_size=0; use 1 or more sequences\n')
