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

from ablations import AblationConfig, build_model
from configurator import configure
from testing import train_defaults
from vrl import settings as train_settings
from vrl.optim import configure_optimizers

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]  # the repository root
CONFIGS = sorted((REPO / 'config').glob('*.py'))
# settings shared by the full-scale configs, which exec it; it lists no runs itself
FRAGMENTS = {'paper_recipe.py'}
# (n_layer, n_embd) -> the paper's parameter count for that shape;
# the "1.6B" shape is inferred and has 1.67B (resformer_1b6.py)
PAPER_SIZES = {(8, 512): 82e6, (12, 768): 180e6, (24, 1024): 468e6, (24, 2048): 1.67e9}
# the same on GPT-2's blocks (backbone='gpt2'): the official GPT-2 78M (ICLR Fig. 15c)
GPT2_PAPER_SIZES = {(8, 512): 78e6}
# sequence length -> sequences per step, about 2M tokens at every length (the paper's Table 3, ICLR A.5)
PAPER_BATCH = {512: 4096, 2048: 1024, 8192: 256, 32_000: 64, 64_000: 32}
# config -> its steps when not the recipe's 10,000: the 1.6B model's second-hand 200B tokens
LONGER_RUNS = {'resformer_1b6.py': 100_000}
# (n_layer, n_embd) -> the most tokens one GPU may take per forward pass (batch_size x block_size) to fit in
# 80 GB with 25% headroom, as lab/bench.py's micro_batch has it (x 2048 tokens: 82M 64, 180M 32, 468M 16,
# 1.6B 4); the explicit-attention ablation needs a quarter
PASS_TOKENS = {(8, 512): 131_072, (12, 768): 65_536, (24, 1024): 32_768, (24, 2048): 8_192}
# SlimPajama's validation domains, which share eval_iters (vrl.data.validation_sets)
DOMAINS = 7
# settings train.py no longer has, by what replaced them
REMOVED = {'micro_batch_size': 'batch_size and gradient_accumulation_steps', 'residual_source': 'residual_from',
           'optimizer': 'muon=True', 'tie_embeddings': 'nothing'}


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
    """train.py's settings for these arguments, as its configure call makes them (AblationConfig's fields
    included); a removed setting in them fails the test naming it."""
    try:
        return configure(train_defaults(), [str(REPO / args[0]), *args[1:]], verbose=False,
                         fields_of=AblationConfig, except_fields=('vocab_size',), types={'compile': bool})
    except SystemExit as error:
        removed = [key for key in REMOVED if f'--{key}=' in ' '.join(args) or f"'{key}'" in str(error)]
        if not removed:
            raise
        stale = error
    pytest.fail(f"{args[0]} (or its header's command) sets {', '.join(removed)}, which train.py no longer has "
                f"(now {', '.join(REMOVED[key] for key in removed)}): {stale}", pytrace=False)


def model_config(settings, **overrides):
    model_args = {f.name: settings[f.name] for f in fields(AblationConfig) if f.name in settings}
    return AblationConfig(**(model_args | overrides))


def test_headers_use_only_settings_train_py_has():
    """No config's header runs train.py with a removed setting (micro_batch_size, residual_source,
    optimizer, tie_embeddings): the failure names every config that still does."""
    stale = sorted({f'{path.name} (--{key}=)' for path, _, args in RUNS for key in REMOVED
                    for arg in args if arg.startswith(f'--{key}=')})
    assert not stale, f"config headers that run train.py with a removed setting: {', '.join(stale)}"


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
    the SVFormer warmup study's), and the recipe's validation sample (4 passes of 64 windows a domain at
    2048 tokens: 256 windows, about 0.5M tokens a domain at every length) whatever batch_size fits a GPU."""
    settings = settings_of(args)
    assert settings['max_iters'] == settings['lr_decay_iters']
    with torch.device('meta'):
        model = build_model(model_config(settings, vocab_size=50304))
    L, d, ffn = model.config.n_layer, model.config.n_embd, model.config.ffn_hidden
    gpt2 = model.config.backbone == 'gpt2'
    sizes = GPT2_PAPER_SIZES if gpt2 else PAPER_SIZES
    if (L, d) in sizes:
        # embedding, head, blocks, norms; GPT-2's: a GELU MLP of two matrices, biases, LayerNorm's biases,
        # learned positions
        vanilla = (2 * 50304 * d + L * (4 * d * d + 2 * d * ffn) + L * (5 * d + ffn) + (2 * L + 1) * 2 * d
                   + model.config.block_size * d) if gpt2 else \
            2 * 50304 * d + L * (4 * d * d + 3 * d * ffn) + (2 * L + 1) * d
        assert abs(vanilla / sizes[L, d] - 1) < 0.03, vanilla
        assert abs(model.num_params() / sizes[L, d] - 1) < 0.06, model.num_params()
        if model.config.variant == 'vanilla':
            assert model.num_params() == vanilla
    if settings['dataset'].startswith('slimpajama'):
        sequences = settings['gradient_accumulation_steps'] * settings['batch_size']
        assert sequences == PAPER_BATCH.get(settings['block_size']), (settings['block_size'], sequences)
        assert settings['gradient_accumulation_steps'] % ranks == 0  # train.py refuses it otherwise
        train_settings.check(settings, ranks)  # train.py's own check of every setting, on its ranks
        assert settings['max_iters'] in (10_000, LONGER_RUNS.get(path.name)), settings['max_iters']
        assert settings['warmup_iters'] in (120, 1200), settings['warmup_iters']
        share = settings['gradient_accumulation_steps'] * settings['batch_size'] // ranks  # sequences per GPU
        per_pass = settings['batch_size']  # sequences a GPU takes in one forward pass
        limit = PASS_TOKENS.get((L, d), PASS_TOKENS[8, 512])  # smaller: what the 82M model fits
        limit //= 4 if settings['residual_type'] == 'attention' else 1
        assert per_pass <= share and per_pass * settings['block_size'] <= limit, (per_pass, settings['block_size'])
        windows = -(-settings['eval_iters'] // DOMAINS) * settings['batch_size']  # a domain's sample
        assert windows == PAPER_BATCH[settings['block_size']] // 4, (
            f"{path.name}: eval_iters={settings['eval_iters']} at batch_size={settings['batch_size']} scores "
            f"{windows} windows a domain, not the recipe's {PAPER_BATCH[settings['block_size']] // 4}")
        # to fit a smaller GPU: a quarter of the sequences a pass, four times the passes, the same step
        smaller = max(per_pass // 4, 1)
        lowered = settings_of([*args, f'--batch_size={smaller}',
                               f"--gradient_accumulation_steps={sequences // smaller}"])
        assert lowered['gradient_accumulation_steps'] * lowered['batch_size'] == sequences
        train_settings.check(lowered, ranks)


@pytest.mark.parametrize('path, ranks, args', RUNS, ids=[run_id(p, a) for p, _, a in RUNS])
def test_run_trains_one_step_at_toy_size(path, ranks, args):
    """The run's model, as many layers and heads and the same flags, but 4 wide per head over a 64-token
    vocabulary: one forward, backward and optimizer step (AdamW, or Muon and AdamW) with the run's settings
    gives a finite loss, a finite gradient for every parameter, and moves every parameter (λ included when
    learned); parameters the run names in lr_scales take their multiple of the rate."""
    settings = settings_of(args)
    torch.manual_seed(0)
    model = build_model(model_config(settings, n_embd=4 * settings['n_head'], ffn_hidden=None, block_size=16,
                                     vocab_size=64))
    muon = (settings['muon_lr'], settings['muon_adjust_lr']) if settings['muon'] else None
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
    loss = model(idx, targets=idx.roll(-1, dims=1))
    loss.backward()
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(64)) < 1.0
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    optimizer.step()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f'{name} did not move'


def test_a_smaller_batch_size_takes_the_same_step(tmp_path):
    """Two steps of a tiny model on 8 sequences per step, in 2 passes of 4 and in 8 passes of 1
    (gradient_accumulation_steps x batch_size, nanoGPT's meaning): the same training losses and the same
    validation loss after the updates (up to float rounding); the run says how it splits the step. The
    removed micro_batch_size, and a batch_size of 0, are refused in one line."""
    (tmp_path / 'tiny.txt').write_text(''.join(f'line {i}: to be or not to be\n' for i in range(300)))
    subprocess.run([sys.executable, REPO / 'prepare.py', '--input=tiny.txt', '--out_dir=data/tiny_char'],
                   cwd=tmp_path, check=True, capture_output=True)
    losses = {}
    for batch_size in (4, 1):
        passes = 8 // batch_size
        result = subprocess.run([sys.executable, REPO / 'train.py', '--dataset=tiny_char', '--n_layer=2',
                                 '--n_head=2', '--n_embd=16', '--block_size=8', f'--batch_size={batch_size}',
                                 f'--gradient_accumulation_steps={passes}', f'--eval_iters={8 // batch_size}',
                                 '--max_iters=2', '--eval_interval=2', '--log_interval=1',
                                 '--warmup_iters=0', '--lr_decay_iters=2', '--device=cpu', '--compile=False',
                                 f'--out_dir=out{batch_size}'], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert (f'64 tokens per step = {passes} passes of {batch_size} sequences x 8 tokens;'
                in result.stdout), result.stdout
        log = [json.loads(line) for line in (tmp_path / f'out{batch_size}' / 'log.jsonl').read_text().splitlines()]
        losses[batch_size] = [record.get('train_loss', record.get('val_loss')) for record in log]
    assert len(losses[4]) == 4 and losses[1] == pytest.approx(losses[4], rel=1e-5)
    for arg, line in (('--batch_size=0', 'train.py: batch_size=0; use 1 or more sequences a pass'),
                      ('--micro_batch_size=4',
                       "config error: unknown config key 'micro_batch_size' (did you mean 'batch_size'?)")):
        result = subprocess.run([sys.executable, REPO / 'train.py', arg], cwd=tmp_path,
                                capture_output=True, text=True)
        assert result.returncode == 1 and result.stderr == line + '\n', (arg, result.stderr)
