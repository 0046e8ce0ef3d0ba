"""reproduce.py without training: its statistics and reports on synthetic runs,
and the runner's skip/resume logic."""
import dataclasses
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lab import relative_loss, reproduce
from ablations import AblationConfig, build_model
from configurator import configure
from lab.reproduce import REPO, crossing_step, loglinear_fit, mean_std, paired_t, parameters_for_loss
from testing import train_defaults
from vrl.data import validation_sets
from vrl.settings import check as settings_check


REAL_PROBE = reproduce.probe  # before the fixture below replaces it in every test


@pytest.fixture(autouse=True)
def probe(monkeypatch):
    """The probe trains a tiny model; here every summary's code counts as today's
    unless a test says otherwise."""
    monkeypatch.setattr(reproduce, 'probe', lambda settings: [4.0, 3.9, 3.8, 3.7])


def test_statistics():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([4.0]) == (4.0, 0.0)
    mean, std, t = paired_t([1.0, 1.1, 1.2], [1.1, 1.3, 1.3])  # differences -0.1, -0.2, -0.1
    assert mean == pytest.approx(-0.4 / 3) and std == pytest.approx(math.sqrt(1 / 300))
    assert t == pytest.approx(-4.0)
    assert math.isnan(paired_t([1.0], [2.0])[2])
    curve = [[0, 4.0], [100, 3.0], [200, 2.0]]
    assert crossing_step(curve, 2.5) == 150 and crossing_step(curve, 3.0) == 100
    assert crossing_step(curve, 5.0) == 0 and crossing_step(curve, 1.0) is None
    matched, extrapolated = parameters_for_loss([(1e7, 2.0), (1e6, 3.0)], 2.5)  # halfway in log(parameters)
    assert matched == pytest.approx(math.sqrt(1e13)) and not extrapolated
    # past the largest: along its segment
    matched, extrapolated = parameters_for_loss([(1e6, 3.0), (1e7, 2.0)], 1.5)
    assert matched == pytest.approx(math.sqrt(1e15)) and extrapolated
    # least squares on ln(params) = 0, 1, 2
    a, b = loglinear_fit([(1.0, 1.0), (math.e, 0.0), (math.e ** 2, 0.5)])
    assert (a, b) == (pytest.approx(0.75), pytest.approx(-0.25))


def summary(settings, final, curve, params, kv=2048, lambdas=None, grads=None):
    return {'settings': settings, 'curve': curve, 'final_val_loss': final, 'params': params,
            'kv_bytes_per_token': kv, 'lambdas': lambdas, 'mean_grad_norms': grads, 'seconds': 60.0,
            'commit': 'abc', 'probe': [4.0, 3.9, 3.8, 3.7]}


def write_summaries(results_dir, suite, make):
    """A summary for every run of a suite at the cpu scale, seeds 1337 and 1338, from make(label, seed)."""
    for label, name, settings in reproduce.suite_runs(suite, 'cpu', [1337, 1338]):
        path = results_dir / 'runs' / f'{name}.json'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(make(label, settings)))


def test_scaling_report_gives_the_savings_of_synthetic_runs(tmp_path):
    """Transformer loss falls 0.5 per 10x parameters; ResFormer is 0.25 lower at every size (0.23 for
    seed 1338), 0.24 on average, which a Transformer reaches at 10^0.48 times the size (saving
    1 - 10^-0.48 = 66.9%). ResFormer's curve reaches the Transformer's final loss at step 300 of 600
    (token saving 50%)."""
    sizes = [d for _, d in reproduce.SIZES['cpu']]

    def make(label, settings):
        size = sizes.index(settings['n_embd'])
        params, transformer = 10 ** (5 + size), 3.0 - 0.5 * size
        if label.startswith('vanilla'):
            return summary(settings, transformer, [[0, 5.0], [600, transformer]], params)
        final = transformer - (0.25 if settings['seed'] == 1337 else 0.23)
        return summary(settings, final, [[0, 5.0], [300, transformer], [600, final]], params)
    write_summaries(tmp_path, 'scaling', make)
    report = reproduce.write_report('scaling', 'cpu', [1337, 1338], tmp_path).read_text()
    row = next(line for line in report.splitlines() if line.startswith('| resformer_identity L2 d64 | 2 |'))
    assert '| -0.2400 ± 0.0141 | -24.0 | ahead | 300 |' in row  # paired Δ, t, verdict, crossing step
    savings = [line for line in report.splitlines()
               if line.startswith('| resformer_identity') and '%' in line]
    assert len(savings) == 4
    for line in savings:  # on an exact line, the piecewise reading and the fit agree
        assert line.count('| 66.9% |') == 2 and line.endswith('| 66.9% | 50.0% |')
    assert '(extrapolated)' in savings[-1] and '(extrapolated)' not in savings[0]
    assert 'a Transformer needs 3.02x the parameters for the same loss, a saving of 66.9%.' in report


def test_lr_and_kv_reports(tmp_path):
    """Gradient-norm ratios (2x on layer 1's W_V) and KV ratios / loss gaps
    come out of the summaries as written."""
    def make_lr(label, settings):
        factor = 1.0 if label.startswith('vanilla') else 2.0
        grads = {'blocks.0.attn.c_v.weight': 0.1 * factor, 'blocks.0.attn.c_proj.weight': 0.2,
                 'blocks.1.attn.c_proj.weight': 0.4}
        return summary(settings, 2.0, [[0, 4.0], [600, 2.0]], 10 ** 6, grads=grads)
    write_summaries(tmp_path, 'lr', make_lr)
    report = reproduce.write_report('lr', 'cpu', [1337, 1338], tmp_path).read_text()
    assert ('| resformer_identity lr=0.004 | 0.200 / 0.100 = 2.00× | 0.200 / 0.200 = 1.00× | '
            '0.300 / 0.300 = 1.00× |') in report
    assert ('names this suite as their CPU counterpart: '
            '[`config/lr_sweep_82m.py`](../../config/lr_sweep_82m.py).') in report

    def make_kv(label, settings):
        kv = 1024 if label.startswith('svformer') else 2048
        return summary(settings, 2.1 if label.startswith('svformer') else 2.0, [[0, 4.0], [600, 2.0]],
                       10 ** 6, kv=kv)
    write_summaries(tmp_path, 'kv', make_kv)
    report = reproduce.write_report('kv', 'cpu', [1337, 1338], tmp_path).read_text()
    assert '| svformer T=512 | 0.500 | +0.1000 |' in report and '| cla T=128 | 1.000 | +0.0000 |' in report


def test_learned_lambdas_are_reported_per_layer(tmp_path):
    def make(label, settings):
        lambdas = [[0, 1], [0.2, 0.8], [0.6, 0.4], [1.0, 0.3]] if label == 'resformer_learnable' else None
        return summary(settings, 2.0, [[0, 4.0], [600, 2.0]], 10 ** 6, lambdas=lambdas)
    write_summaries(tmp_path, 'variants', make)
    report = reproduce.write_report('variants', 'cpu', [1337, 1338], tmp_path).read_text()
    assert '| resformer_learnable | 0.00, 1.00 | 0.20, 0.80 | 0.60, 0.40 | 1.00, 0.30 |' in report


def fake_training(monkeypatch):
    """Replace train.py by a stand-in that writes a finished run's log and checkpoint;
    returns the commands it gets."""
    commands = []

    def fake_train(command, env, stdout):
        commands.append(command)
        out_dir = Path(next(a for a in command if a.startswith('--out_dir=')).split('=', 1)[1])
        (out_dir / 'log.jsonl').write_text(json.dumps({'step': 600, 'val_loss': 2.0}) + '\n')
        torch.save({'model_args': dict(n_layer=2, n_head=2, n_embd=32, vocab_size=128, block_size=64)},
                   out_dir / 'ckpt.pt')
        return 0
    monkeypatch.setattr(reproduce, 'train', fake_train)
    return commands


def trained_runs(commands):
    """(run folder name, resumed?) for each command the stand-in got."""
    return [(Path(next(a for a in c if a.startswith('--out_dir=')).split('=', 1)[1]).name,
             '--init_from=resume' in c)
            for c in commands]


def test_runner_skips_finished_runs_and_resumes_interrupted_ones(tmp_path, monkeypatch):
    """Finished (summary written): not run. Interrupted after a checkpoint: resumed.
    Killed before one: restarted."""
    commands = fake_training(monkeypatch)
    runs = reproduce.suite_runs('variants', 'cpu', [1337])[:3]
    results, runs_dir = tmp_path / 'results', tmp_path / 'runs'
    finished, interrupted, killed = (name for _, name, _ in runs)
    (results / 'runs').mkdir(parents=True)
    (results / 'runs' / f'{finished}.json').write_text(
        json.dumps(summary(runs[0][2], 2.0, [[600, 2.0]], 10 ** 6)))
    (runs_dir / interrupted).mkdir(parents=True)
    (runs_dir / interrupted / 'ckpt.pt').write_bytes(b'a checkpoint')
    (runs_dir / interrupted / 'probe.json').write_text('[4.0, 3.9, 3.8, 3.7]')  # started by today's code
    (runs_dir / killed).mkdir(parents=True)
    (runs_dir / killed / 'log.jsonl').write_text('{"step": 0, "val_loss": 4.0}\n')

    assert reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1) == {}
    ran = {Path(next(a for a in c if a.startswith('--out_dir=')).split('=', 1)[1]).name: c for c in commands}
    assert set(ran) == {interrupted, killed}
    assert '--init_from=resume' in ran[interrupted] and '--init_from=resume' not in ran[killed]
    assert '--seed=1337' in ran[killed] and f"--variant={runs[2][2]['variant']}" in ran[killed]
    done = json.loads((results / 'runs' / f'{killed}.json').read_text())
    assert (done['final_val_loss'] == 2.0 and done['params'] > 0
            and done['kv_bytes_per_token'] == 2 * 2 * 2 * 16 * 2)
    commands.clear()
    assert (reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1) == {}
            and commands == [])  # all done now


def test_a_cut_short_probe_json_restarts_its_run_and_probe_json_is_written_whole(tmp_path, monkeypatch):
    """probe.json says which code started a run folder. Cut short (a kill while it was written, before it was
    written whole), the run cannot be trusted to resume: it restarts, with no traceback, and the new probe.json
    and summary are whole files with no temporary beside them."""
    commands = fake_training(monkeypatch)
    runs = reproduce.suite_runs('variants', 'cpu', [1337])[:1]
    results, runs_dir = tmp_path / 'results', tmp_path / 'runs'
    name = runs[0][1]
    (runs_dir / name).mkdir(parents=True)
    (runs_dir / name / 'ckpt.pt').write_bytes(b'a checkpoint')
    (runs_dir / name / 'probe.json').write_text('[4.0, 3.9, 3.')
    assert reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1) == {}
    assert trained_runs(commands) == [(name, False)]
    assert json.loads((runs_dir / name / 'probe.json').read_text()) == reproduce.probe(runs[0][2])
    assert json.loads((results / 'runs' / f'{name}.json').read_text())['final_val_loss'] == 2.0
    assert not list(runs_dir.glob('*/*.tmp')) and not list(results.glob('runs/*.tmp'))


def test_run_names_identify_settings():
    """Equal settings share a run across suites; different ones never collide."""
    names = {name for suite in reproduce.SUITES
             for _, name, _ in reproduce.suite_runs(suite, 'cpu', [1337, 1338, 1339])}
    settings = {json.dumps(s, sort_keys=True) for suite in reproduce.SUITES
                for _, _, s in reproduce.suite_runs(suite, 'cpu', [1337, 1338, 1339])}
    # depth: 7 new groups; value_embed: 2 x 3 new; value_bank: 2 x 2 new (its Transformer, Identity, SVFormer
    # and value embeddings are other suites'); controls: 4 new (its Transformer and Identity are depth's);
    # muon_lr: 5 rates at 2 depths for the Transformer, and for Identity ResFormer but at the rate its
    # optimizer group trains (one a depth); optimizer: with Muon, 3 new at 4 layers and 1 at 8 (each
    # depth's Transformer is muon_lr's), at the depths swept so far, and 3 more seeds of its 4 groups at 8
    # layers (EXTRA_SEEDS). The suites of the paper's figures: share_kv 2 new (share_k, share_v; its
    # Transformer, CLA and SVFormer are other suites'); residual_type 4 (query, key, attention, hidden);
    # lambdas 5 (λ=2 is Constant ResFormer); neutreno 4 (3 λ, λ=0.4 being the variant, and
    # NeuTRENO-ResFormer); svformer 8 (SVFormer at 3 other rates, both at 10x the warmup, SVFormer at 3
    # other sizes); lengths 7 (3 variants at 64 and at 256 tokens, Identity at 512); mapping 2 (first,
    # cross; identity is controls'); shared_qk 2; backbone 2 (GPT-2's blocks); anchors 3; source 6 (adjacent,
    # previous, second, dense, and without H0 the Transformer and second); placement 7 (Sparse L8 is depth's)
    muon = sum({4: 3, 8: 1}[depth] for scale, depth in reproduce.MUON_LR if scale == 'cpu')
    figures = 2 + 4 + 5 + 4 + 8 + 7 + 2 + 2 + 2 + 3 + 6 + 7
    assert len(names) == len(settings) == (87 + 7 * 3 + 2 * 3 * 3 + 2 * 2 * 3 + 4 * 3 + 5 * 2 * 3
                                           + (5 - 1) * 2 * 3 + muon * 3 + 4 * 3 + figures * 3
                                           + (8 + 2) * 2 * 3  # successors: 8, 2 widened, each depth
                                           + 16 + 24  # tuned's sweep, one seed: 16 new at 4 layers, 24 at 8
                                           + 3 + 5 + 5 + 5 + 3  # tuned's 6 seeds at 4 layers (TUNED_BEST)
                                           + 8 * 3  # EXTRA_SEEDS where a verdict hinged: the Transformer,
    # λ = 1 and 2, NeuTRENO, NeuTRENO-ResFormer, Identity ResFormer, DenseFormer and shared Q, 3 more each;
                                           + (6 + 1 + 6 + 2) * 3)  # and queued: lengths' 6 groups at 64 and
    # 512 tokens, the bank at 8 layers, placement's 6 (its Transformer's are optimizer's), Depth-Attention
    # and Hyper-Connections at 4 layers (their Transformer and Identity ResFormer are lambdas' and neutreno's)
    controls = [name for _, name, _ in reproduce.suite_runs('controls', 'cpu', [1337])]
    assert 'lr_scales=blocks.0.attn.c_v.weight@2+blocks.0.attn.c_proj.weight@2_' in controls[2]
    assert 'lr_scales=blocks.0.attn.c_v.weight@2+blocks.0.attn.c_proj.weight@1.5_' in controls[4]
    kv_vanilla = reproduce.suite_runs('kv', 'cpu', [1337])[0][1]
    assert (kv_vanilla == reproduce.suite_runs('variants', 'cpu', [1337])[0][1]
            == 'cpu_variant=vanilla_seed=1337')


def model_config(settings, vocab_size):
    """The AblationConfig train.py builds from these settings."""
    fields = {f.name for f in dataclasses.fields(AblationConfig)}
    return AblationConfig(**{k: v for k, v in settings.items() if k in fields}, vocab_size=vocab_size)


def test_muon_runs_are_named_muon_true_and_every_committed_summary_by_its_settings():
    """optimizer='muon' is muon=True: the Muon suites' runs are named by it, every committed summary's file
    is the name of the settings it holds (the 82 renamed ones included), and none still says optimizer."""
    assert reproduce.run_name('cpu', dict(variant='vanilla', muon=True, muon_lr=0.02, seed=1337)) == \
        'cpu_variant=vanilla_muon=True_muon_lr=0.02_seed=1337'
    muon_runs = [(name, settings) for scale in ('cpu', 'bpe') for suite in ('muon_lr', 'optimizer')
                 for _, name, settings in reproduce.suite_runs(suite, scale, [1337]) if settings.get('muon')]
    assert muon_runs and all('_muon=True_' in name and 'optimizer' not in name for name, _ in muon_runs)
    summaries = sorted((REPO / 'results' / 'runs').glob('*.json'))
    assert len(summaries) >= 82
    for path in summaries:
        settings = json.loads(path.read_text())['settings']
        assert 'optimizer' not in settings and reproduce.run_name(path.stem.split('_')[0], settings) == path.stem
    # the Muon suites' committed runs are found under their names
    assert all((REPO / 'results' / 'runs' / f'{name}.json').exists() for name, _ in muon_runs)


def test_name_parts_of_lambda_tables_anchors_and_lr_scales():
    assert reproduce.name_part([[0.0, 1.0], [0.8, 1.0], [5, 1]]) == '0,1+0.8,1+5,1'
    assert reproduce.name_part([5, 8]) == '5+8' and reproduce.name_part([8]) == '8'
    assert reproduce.name_part([['blocks.0.attn.c_v.weight', 2.0]]) == 'blocks.0.attn.c_v.weight@2'
    assert reproduce.name_part(0.002) == '0.002' and reproduce.name_part(True) == 'True'
    lambdas = [name for _, name, _ in reproduce.suite_runs('lambdas', 'cpu', [1337])]
    assert 'cpu_variant=custom_lambdas=0,1+0.8,1+0.8,1+0.8,1_value_residual=True_seed=1337' in lambdas
    assert 'cpu_variant=resformer_constant_seed=1337' in lambdas  # λ=2: the named variant's run
    anchors = [name for _, name, _ in reproduce.suite_runs('anchors', 'cpu', [1337])]
    assert [name.split('_')[2] for name in anchors[2:]] == ['anchors=8', 'anchors=5+8', 'anchors=4+6+8']


NEW_SUITES = ('share_kv', 'residual_type', 'lambdas', 'neutreno', 'svformer', 'lengths', 'mapping',
              'shared_qk', 'backbone', 'anchors', 'source', 'placement')


@pytest.mark.parametrize('scale', list(reproduce.SCALES))
def test_every_group_of_every_suite_is_a_valid_train_py_run(scale, monkeypatch):
    """Each group's command line parses as train.py's settings (AblationConfig's fields included), passes
    train.py's checks and makes a valid AblationConfig; the new suites' also build their models (on the
    meta device): a suite never starts a run that train.py refuses. The suites of the paper's figures are
    all there."""
    assert set(NEW_SUITES) <= set(reproduce.SUITES)
    import configurator  # its --help text, read from the sources each call, once here
    monkeypatch.setattr(configurator, 'field_docs', functools.cache(configurator.field_docs))
    defaults, seen = train_defaults(), set()
    for suite in reproduce.SUITES:
        groups = reproduce.suite_groups(suite, scale)
        # (Muon trains only where the muon_lr sweep has found its rate)
        assert groups or suite == 'optimizer' and not any(s == scale for s, _ in reproduce.MUON_LR), suite
        assert len({label for label, _, _ in groups}) == len(groups), suite
        labels = {label for label, _, _ in groups}
        for label, settings, baseline in groups:
            assert baseline in labels, (suite, label)
            command = reproduce.train_command(reproduce.SCALES[scale] | settings | {'seed': 1337}, 'out', False)
            if tuple(command) in seen:  # a run another suite shares
                continue
            seen.add(tuple(command))
            parsed = configure(defaults, command[2:], verbose=False, fields_of=AblationConfig,
                               except_fields=('vocab_size',), types={'compile': bool})
            settings_check(parsed, 1)
            config = model_config(parsed, reproduce.PADDED_VOCAB[scale])
            if suite in NEW_SUITES:
                with torch.device('meta'):
                    assert build_model(config).num_params() > 0, (suite, label)


def test_the_new_suites_dry_run_lists_their_runs(tmp_path, capsys):
    for suite in NEW_SUITES:
        reproduce.main([suite, '--dry_run', '--seeds=1', f'--results_dir={tmp_path}'])
        lines = capsys.readouterr().out.splitlines()
        runs = reproduce.suite_runs(suite, 'cpu', [1337])
        assert lines == [f"{'todo':10s} {suite}: {label}  ({name})" for label, name, _ in runs]


def test_value_bank_suite_reuses_runs_and_widens_the_transformer_where_the_bank_costs_parameters():
    """At the cpu scale (vocabulary 128 = d) a bank's tables cost what its layers' W_V did, so there is no
    widened Transformer, and every run but the bank's own is another suite's. At the bpe scale (vocabulary
    50,304) the widened Transformer has the bank's parameters to within half a SwiGLU unit a layer."""
    assert not any('ffn=' in label for label, _, _ in reproduce.suite_groups('value_bank', 'cpu'))
    others = {name for suite in reproduce.SUITES if suite not in ('value_bank', 'optimizer')
              for _, name, _ in reproduce.suite_runs(suite, 'cpu', [1337])}
    new = [name for _, name, _ in reproduce.suite_runs('value_bank', 'cpu', [1337])
           if name not in others and name.endswith('_seed=1337')]  # (EXTRA_SEEDS adds seeds to some)
    assert len(new) == 4 and all('value_bank=True' in name for name in new)
    groups = {label: settings for label, settings, _ in reproduce.suite_groups('value_bank', 'bpe')}

    def params(label):
        with torch.device('meta'):
            model = build_model(model_config(reproduce.SCALES['bpe'] | groups[label], 50304))
        return model.num_params()
    for depth in (4, 8):
        [wide] = [label for label in groups
                  if label.startswith('vanilla ffn=') and label.endswith(f' L{depth}')]
        bank, transformer = params(f'value_bank L{depth}'), params(f'vanilla L{depth}')
        tables = depth - 2 * depth // 3  # each 50,304 x 128 with its γ_v, in place of a 128 x 128 W_V
        assert bank - transformer == tables * ((50304 - 128) * 128 + 1)
        assert abs(params(wide) - bank) <= 3 * 128 * depth / 2


def test_value_bank_report_gives_kv_and_parameter_ratios(tmp_path):
    """Beside each loss gap, the KV bytes and the parameters against the same-depth Transformer, as the
    summaries have them."""
    def make(label, settings):
        depth = settings.get('n_layer', 4)
        kv = (3 if 'value_bank' in label else 4) * 512 * depth // 4
        loss = 2.0 - (0.05 if 'value_bank' in label else 0.0)
        params = 1_000_000 + (5_000 if 'value_bank' in label else 0)
        return summary(settings, loss, [[0, 4.0], [600, loss]], params, kv=kv)
    write_summaries(tmp_path, 'value_bank', make)
    report = reproduce.write_report('value_bank', 'cpu', [1337, 1338], tmp_path).read_text()
    assert '| value_bank L8 | 0.750 | -0.0500 | 1.005 |' in report
    assert 'No config in `config/` names this suite.' in report  # not the paper's: no full-scale config
    assert '| svformer L4 | 1.000 | +0.0000 | 1.000 |' in report


def test_every_suite_of_the_paper_is_named_by_its_full_scale_config():
    """Each suite's README links the configs whose header runs it (`lab/reproduce.py <suite>`): every suite
    has one but the two that are not the paper's experiments. A suite's name inside a longer one's
    (lr in muon_lr) or another scale's command (value_bank --scale=bpe) does not count."""
    assert [s for s in reproduce.SUITES if not reproduce.configs_naming(s, 'cpu')] == [
        'value_embed', 'value_bank', 'tuned']  # tuned: the CPU recipe's own sweep, no GPU config
    assert reproduce.configs_naming('lr', 'cpu') == ['lr_sweep_82m.py']
    assert reproduce.configs_naming('muon_lr', 'cpu') == ['muon_82m.py']
    assert reproduce.configs_naming('value_bank', 'bpe') == ['small_value_bank.py']
    assert reproduce.configs_naming('placement', 'gpu') == ['ablation_placement_82m.py']


def test_bpe_scale_trains_what_config_small_value_bank_trains():
    """config/small_value_bank.py (single runs with train.py) and the bpe scale (reproduce.py's seeded suite)
    are the same runs: every setting the file sets is the scale's, and its widened Transformer is the
    suite's."""
    path = REPO / 'config' / 'small_value_bank.py'
    settings = configure(reproduce.SCALES['bpe'] | dict(variant='vanilla', value_bank=False), [str(path)],
                         verbose=False)
    assert {k: settings[k] for k in reproduce.SCALES['bpe']} == reproduce.SCALES['bpe']
    assert settings['value_bank'] and settings['variant'] == 'vanilla'
    widths = [reproduce.matched_ffn('bpe', n_layer, dict(value_bank=True)) for n_layer in (4, 8)]
    assert re.findall(r'--ffn_hidden=(\d+)', path.read_text()) == [str(width) for width in widths[::-1]]


def test_stale_and_unreadable_summaries_are_reported_and_retrained_on_request(tmp_path, monkeypatch, capsys):
    """A summary whose probe differs from today's code's (or that has none) is stale: reported, kept, and
    retrained only with retrain=True. A truncated summary is unreadable and retrained anyway. A run folder
    started by other code is trained afresh, not resumed."""
    commands = fake_training(monkeypatch)
    runs = reproduce.suite_runs('variants', 'cpu', [1337])[:4]
    results, runs_dir = tmp_path / 'results', tmp_path / 'runs'
    (results / 'runs').mkdir(parents=True)
    names = [name for _, name, _ in runs]
    good = summary(runs[0][2], 2.0, [[600, 2.0]], 10 ** 6)
    for name, content in zip(names, [good, good | {'probe': [4.0, 3.9, 3.8, 3.6]},
                                     {k: v for k, v in good.items() if k != 'probe'}]):
        (results / 'runs' / f'{name}.json').write_text(json.dumps(content))
    (results / 'runs' / f'{names[3]}.json').write_text(json.dumps(good)[:40])  # cut short
    (runs_dir / names[3]).mkdir(parents=True)
    (runs_dir / names[3] / 'ckpt.pt').write_bytes(b'from other code')
    (runs_dir / names[3] / 'probe.json').write_text('[9.0, 9.0, 9.0, 9.0]')
    states = [reproduce.summary_state(results / 'runs' / f'{n}.json', s) for _, n, s in runs]
    assert states == ['done', 'stale', 'stale', 'unreadable']

    assert reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1) == {}
    # the unreadable one only, from scratch: its checkpoint was other code's
    assert trained_runs(commands) == [(names[3], False)]
    assert ('3 of 4 runs done; 1 to go; 2 done by code that trains differently (--retrain retrains them)'
            in capsys.readouterr().out)
    assert reproduce.summary_state(results / 'runs' / f'{names[1]}.json', runs[1][2]) == 'stale'  # kept
    report = reproduce.write_report('variants', 'cpu', [1337], results).read_text()
    assert '2 of 9 runs are in the tables, trained by commit abc (1), ' in report
    assert '**2 more were made by code that trains differently' in report
    with_runs = [line.split(' | ')[0][2:] for line in report.splitlines()
                 if line.startswith('| ') and ' | 1 | ' in line]
    assert with_runs == ['vanilla', 'resformer_sparse']  # the stale identity and constant runs are left out
    commands.clear()
    assert reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1, retrain=True) == {}
    assert sorted(trained_runs(commands)) == sorted([(names[1], False), (names[2], False)])
    summaries = [json.loads((results / 'runs' / f'{n}.json').read_text()) for n in names[1:3]]
    assert all(s['probe'] == [4.0, 3.9, 3.8, 3.7] and s['commit'] for s in summaries)


def test_a_run_another_process_trains_is_skipped(tmp_path, monkeypatch, capsys):
    """reproduce.py locks each run it trains: a second reproduce.py (say `variants` beside `kv`, which share
    runs) skips it, saying which process trains it, instead of starting a second writer on the same folder; a
    skip is no failure."""
    monkeypatch.setattr(reproduce, 'train', lambda *a: pytest.fail('trained a run another process holds'))
    runs = reproduce.suite_runs('variants', 'cpu', [1337])[:1]
    (tmp_path / 'runs').mkdir()
    holder = subprocess.Popen([sys.executable, '-c',
                               'import sys, time; sys.path.insert(0, sys.argv[2]); from vrl import locks; '
                               'held, _ = locks.try_lock(sys.argv[1], "x"); print(bool(held), flush=True); '
                               'time.sleep(60)',
                               str(tmp_path / 'runs' / f'{runs[0][1]}.lock'), str(REPO)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'True'
        assert reproduce.run_suite(runs, tmp_path / 'runs', tmp_path / 'results', gpus=0, jobs=1) == {}
        assert (f'skipped: another reproduce.py (process {holder.pid}) is training it'
                in capsys.readouterr().out)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(os.name != 'posix',
                    reason="Windows' send_signal(SIGTERM) ends a process without its handler")
@pytest.mark.parametrize('signum', ['SIGTERM', pytest.param('SIGKILL', marks=pytest.mark.skipif(
    sys.platform != 'linux', reason="the parent-death signal is Linux's"))])
def test_children_end_with_reproduce(tmp_path, signum):
    """SIGTERM to reproduce.py passes on to its train.py (which saves and stops); SIGKILL of reproduce.py
    reaches it too (Linux's parent-death signal). Either way no trainer is left running on the run's
    folder."""
    (tmp_path / 'child.py').write_text(f"import os, time\n"
                                       f"open({str(tmp_path / 'child.pid')!r}, 'w').write(str(os.getpid()))\n"
                                       "time.sleep(120)\n")
    script = tmp_path / 'driver.py'
    script.write_text(f"""import signal, sys
sys.path.insert(0, {str(REPO)!r})
from lab import reproduce
reproduce.probe = lambda settings: [1.0]
reproduce.train_command = lambda settings, out_dir, resume: [sys.executable, {str(tmp_path / 'child.py')!r}]
signal.signal(signal.SIGTERM, reproduce.stop)  # as main() does
runs = reproduce.suite_runs('variants', 'cpu', [1337])[:2]
print(reproduce.run_suite(runs, reproduce.Path({str(tmp_path / 'runs')!r}), reproduce.Path({str(tmp_path / 'results')!r}),
                          0, 1), flush=True)
""")
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid_file = tmp_path / 'child.pid'
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline and driver.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    driver.send_signal(getattr(signal, signum))
    out, _ = driver.communicate(timeout=60)
    for _ in range(100):  # the child ends within seconds
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail('train.py outlived reproduce.py')
    if signum == 'SIGTERM':  # and the second run never started
        assert "'not started: reproduce.py was stopped'" in out


def test_results_dir_mistakes_are_one_line(tmp_path, capsys):
    """A --results_dir that is a file stops at once; one outside the repository works (the report path is
    printed whole)."""
    (tmp_path / 'file').write_text('x')
    with pytest.raises(SystemExit) as stop:
        reproduce.main(['variants', f'--results_dir={tmp_path / "file"}', '--report_only'])
    assert str(stop.value) == (f"reproduce.py: --results_dir={tmp_path / 'file'} is a file, not a folder; "
                               f"pick another --results_dir")
    reproduce.main(['kv', f'--results_dir={tmp_path / "elsewhere"}', '--report_only', '--seeds=1'])
    assert f"wrote {tmp_path / 'elsewhere' / 'kv' / 'README.md'}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        reproduce.main(['bogus'])
    assert 'unknown suite' in str(stop.value)


def test_a_bad_argument_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        reproduce.main(['variants', '--seeds=abc'])
    assert stop.value.code == ("reproduce.py: argument --seeds: invalid int value: 'abc'; "
                               "see `python lab/reproduce.py --help`")
    assert capsys.readouterr() == ('', '')  # no usage dump


def test_it_imports_without_fcntl_as_on_windows(tmp_path):
    (tmp_path / 'sitecustomize.py').write_text("import sys\nsys.modules['fcntl'] = None\n")
    result = subprocess.run([sys.executable, '-c', 'import fcntl'],
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True)
    assert result.returncode == 1  # the simulation holds
    result = subprocess.run([sys.executable, '-c', 'from lab import reproduce'], cwd=REPO, capture_output=True,
                            text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr


def test_attention_analysis_runs_once_every_checkpoint_exists(tmp_path, monkeypatch):
    """analyze.py runs on the suite's checkpoints (document starts, the suite's sequence length) only when all
    of them are there, and not again once its metrics are written."""
    calls = []
    monkeypatch.setattr(reproduce.subprocess, 'run', lambda command, cwd: calls.append(command) or
                        subprocess.CompletedProcess(command, 0))
    runs = reproduce.suite_runs('depth', 'cpu', [1337])
    for _, name, _ in runs[:-1]:
        (tmp_path / 'runs' / name).mkdir(parents=True)
        (tmp_path / 'runs' / name / 'ckpt.pt').write_bytes(b'x')
    reproduce.analyse('depth', 'cpu', [1337], tmp_path / 'runs', tmp_path / 'depth')
    assert calls == []  # one run still training
    (tmp_path / 'runs' / runs[-1][1]).mkdir()
    (tmp_path / 'runs' / runs[-1][1] / 'ckpt.pt').write_bytes(b'x')
    reproduce.analyse('depth', 'cpu', [1337], tmp_path / 'runs', tmp_path / 'depth')
    assert len(calls) == 1 and calls[0][-3:] == ['--seq_len=128', '--num_seqs=4',
                                                 f"--out={tmp_path / 'depth' / 'analysis'}"]
    assert len(calls[0]) == 2 + len(runs) + 3
    (tmp_path / 'depth' / 'analysis').mkdir(parents=True)
    (tmp_path / 'depth' / 'analysis' / 'metrics.json').write_text('{}')
    reproduce.analyse('depth', 'cpu', [1337], tmp_path / 'runs', tmp_path / 'depth')
    assert len(calls) == 1


def test_per_domain_losses_get_a_table_and_single_corpus_runs_none():
    """SlimPajama runs log each domain's loss: the report gives their mean over seeds per group; runs on one
    corpus (every CPU suite) add no table."""
    run = lambda domains: {'final_val_loss_domains': domains}
    groups = {'vanilla': {'runs': [run({'C4': 3.0, 'Github': 1.0}), run({'C4': 3.5, 'Github': 2.0})]},
              'resformer_identity': {'runs': [run(None)]}}
    rows = reproduce.domain_rows(groups)
    assert rows[-1] == '| vanilla | 3.2500 | 1.5000 |' and '| group | C4 | Github |' in rows
    assert reproduce.domain_rows({'vanilla': {'runs': [run(None)]}}) == []
    assert reproduce.domain_rows({'vanilla': {'runs': [*groups['vanilla']['runs'], run(None)]}}) == []


@pytest.mark.parametrize('scale', reproduce.SCALES)
def test_every_runs_evaluation_fits_its_scales_validation_split(tmp_path, scale):
    """Each run of every suite at each scale, its settings as train.py gets them, against the validation split
    prepare.py makes for its scale (shakespeare_gpt2 for gpu: 271 windows of 512 tokens, where eval_iters=20
    took 640): train.py's own check (validation_sets) passes, so no run stops at its first evaluation."""
    dataset = reproduce.SCALES[scale]['dataset']
    tokenizer = ['--tokenizer=gpt2'] if 'gpt2' in dataset else []
    prepared = subprocess.run([sys.executable, REPO / 'prepare.py', f'--out_dir={tmp_path / dataset}', *tokenizer],
                              capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stderr
    shapes = {(s['eval_iters'], s['batch_size'], s['block_size']) for suite in reproduce.SUITES
              for _, _, s in reproduce.suite_runs(suite, scale, [1337]) if s['dataset'] == dataset}
    for eval_iters, batch_size, block_size in sorted(shapes):
        validation_sets(str(tmp_path / dataset), None, eval_iters, batch_size, block_size)


def test_the_probe_trains_every_flag_that_changes_what_a_variant_computes(monkeypatch):
    """An ablation flag (value_mapping='identity', say) reaches the probe's run, so a change to its formula
    makes the runs that set it stale; shapes and schedules stay the probe's own."""
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, '', 'stopped here')

    monkeypatch.setattr(reproduce.subprocess, 'run', fake_run)
    with pytest.raises(SystemExit):
        REAL_PROBE(dict(variant='resformer_identity', value_mapping='identity', residual_type='value',
                        n_layer=8, learning_rate=0.5))
    assert {'--variant=resformer_identity', '--value_mapping=identity', '--residual_type=value',
            f"--n_layer={reproduce.PROBE['n_layer']}", f"--learning_rate={reproduce.PROBE['learning_rate']!r}"
            } <= set(commands[0])
    # every PROBED setting reaches it; a λ table or anchors keep the run's depth (a row or layer each), and
    # fewer key/value heads stay fewer
    run = dict(variant='svformer', anchors=[5, 8], residual_from='second', lambdas=[[0.0, 1.0]] * 8,
               lambda_mode='learnable', neutreno_lambda=0.2, backbone='gpt2', muon=True, value_rescale=True,
               h0_residual=False, n_layer=8, n_head=4, n_kv_head=2, n_embd=256)
    assert set(run) - {'n_layer', 'n_head', 'n_kv_head', 'n_embd'} <= set(reproduce.PROBED)
    with pytest.raises(SystemExit):
        REAL_PROBE(run)
    assert {'--variant=svformer', '--anchors=[5, 8]', '--residual_from=second',
            f"--lambdas={[[0.0, 1.0]] * 8!r}", '--lambda_mode=learnable', '--neutreno_lambda=0.2',
            '--backbone=gpt2', '--muon=True', '--value_rescale=True', '--h0_residual=False', '--n_layer=8',
            '--n_kv_head=1', f"--n_embd={reproduce.PROBE['n_embd']}"} <= set(commands[1])


def test_optimizer_rows_pair_each_gain_with_its_own_optimizers_transformer():
    """Δ under AdamW against AdamW's Transformer, Δ under Muon against Muon's, and their paired difference."""
    def group(losses, baseline):
        return {'runs': [{'final_val_loss': x} for x in losses], 'seeds': [1, 2, 3], 'baseline': baseline}
    groups = {'vanilla L4': group([2.0, 2.1, 2.2], 'vanilla L4'),
              'svformer L4': group([1.9, 2.0, 2.15], 'vanilla L4'),
              'vanilla muon L4': group([1.5, 1.6, 1.7], 'vanilla muon L4'),
              'svformer muon L4': group([1.5, 1.62, 1.71], 'vanilla muon L4')}
    [row] = [line for line in reproduce.optimizer_rows(groups) if line.startswith('| svformer')]
    cells = row.split(' | ')
    assert cells[1] == '3' and cells[2].startswith('-0.0833') and cells[3].startswith('+0.0100')
    assert cells[4].startswith('+0.0933')



def test_successor_rows_pair_each_with_identity_and_a_transformer_of_its_parameters():
    """A successor's row: its Δ against Identity ResFormer of its depth and against the widened Transformer
    whose parameters are within 1% of its own (not another depth's, not one 5% off), each paired by seed."""
    def group(losses, params, kv=2048):
        return {'runs': [{'final_val_loss': x, 'params': params, 'kv_bytes_per_token': kv} for x in losses],
                'seeds': [1, 2, 3], 'baseline': 'vanilla L4'}
    groups = {'vanilla L4': group([2.0, 2.1, 2.2], 1000), 'resformer_identity L4': group([1.9, 2.0, 2.1], 1000),
              'mhc L4': group([1.95, 2.06, 2.13], 1100), 'satformer L4': group([1.91, 2.02, 2.0], 1001),
              'vanilla ffn=600 L4': group([1.99, 2.09, 2.2], 1099),
              'vanilla ffn=700 L4': group([1.0, 1.0, 1.0], 1150), 'vanilla ffn=600 L8': group([1.0, 1.0, 1.0], 1100)}
    rows = {line.split(' | ')[0][2:]: line.strip('| ').split(' | ')
            for line in reproduce.successor_rows(groups) if line.startswith('| ') and ' L4 ' in line}
    assert set(rows) == {'mhc L4', 'satformer L4'}
    mhc = rows['mhc L4']
    assert mhc[1:3] == ['1.1000', '1.00']
    assert mhc[3] == '+0.0467' and mhc[5] == 'behind'  # +0.05, +0.06, +0.03 against Identity: t 5.3
    assert mhc[6] == '-0.0467' and mhc[9] == 'vanilla ffn=600 L4'
    assert rows['satformer L4'][9] == 'none (adds ≤ 1%)' and rows['satformer L4'][5] == 'unresolved'


def test_muon_lr_rows_compare_at_the_transformers_rate_and_at_each_ones_own():
    """Identity's best rate differs from the Transformer's: the two Δ differ, each from the right losses;
    more seeds at the best rates give a paired mean ± std (t), and the best rate stays the sweep seed's."""
    def group(*losses):
        return {'runs': [{'final_val_loss': x} for x in losses], 'seeds': [1337, 1338, 1339][:len(losses)],
                'baseline': 'vanilla L4'}
    groups = {'vanilla L4': group(2.0), 'vanilla muon lr=0.01 L4': group(1.60),
              'vanilla muon lr=0.02 L4': group(1.50), 'resformer_identity muon lr=0.01 L4': group(1.40),
              'resformer_identity muon lr=0.02 L4': group(1.55), 'vanilla muon lr=0.04 L8': group(1.3)}

    def identity_row():
        [row] = [line for line in reproduce.muon_lr_rows(groups) if line.startswith('| resformer_identity')]
        return row.strip('| ').split(' | ')
    assert identity_row() == ['resformer_identity L4', f'2 of {len(reproduce.MUON_LRS)}', '0.01 (1.4000)',
                              '0.02 (1.5000)', '+0.0500', '-0.1000']
    # two more seeds at each best rate; seed 1338's 1.90 would make 0.02 Identity's best by the mean
    groups['resformer_identity muon lr=0.01 L4'] = group(1.40, 1.90, 1.42)
    groups['vanilla muon lr=0.02 L4'] = group(1.50, 1.92, 1.54)
    cells = identity_row()
    assert cells[2:4] == ['0.01 (1.4000)', '0.02 (1.5000)'] and cells[4] == '+0.0500'
    assert cells[5] == '-0.0800 ± 0.0529 (-2.6, 3 seeds)'  # differences -0.10, -0.02, -0.12


# -----------------------------------------------------------------------------
# the paper's relative training loss (lab/relative_loss.py) and the reports' use of it

def interval_means(losses, every=10):
    """train.py's train_curve from per-step losses {step: loss}, steps 1..N: the mean over each interval,
    at its last step."""
    return [[s, sum(losses[t] for t in range(s - every + 1, s + 1)) / every]
            for s in range(every, max(losses) + 1, every)]


def test_smoothing_interval_means_is_the_moving_average_of_the_steps():
    """A 100-step moving average of 10-step interval means equals the 100-step average of the per-step
    losses, at each window's first step (the official plot's convention); records 100 steps apart or more
    are each their own window."""
    generator = torch.Generator().manual_seed(0)
    losses = dict(enumerate((4 - torch.arange(600) / 300 + torch.rand(600, generator=generator)).tolist(),
                            start=1))
    smoothed = relative_loss.smooth(interval_means(losses))
    assert [s for s, _ in smoothed] == list(range(1, 502, 10))
    for step, mean in smoothed:
        assert mean == pytest.approx(sum(losses[t] for t in range(step, step + 100)) / 100, rel=1e-12)
    sparse = [[100, 3.0], [200, 2.5], [300, 2.0]]
    assert relative_loss.smooth(sparse) == [[1, 3.0], [101, 2.5], [201, 2.0]]
    assert relative_loss.smooth(sparse, window=200) == [[1, 2.75], [101, 2.25]]


def test_relative_loss_and_where_the_baseline_overtakes():
    """relative: the smoothed method minus the smoothed baseline at the steps both have (smoothing is
    linear, so a method c(s) above the baseline gives c's moving average, at its window's first step).
    crossing: where a curve that was below zero rises through it for good, held for `hold` steps;
    extrapolated_crossing: where a line through the last tenth would; growth: the exponential trend of
    critical points against length."""
    base = [[s, 4 - s / 1000] for s in range(10, 601, 10)]
    method = [[s, loss + (s - 400) / 1000] for s, loss in base]
    rel = relative_loss.relative(method, base)
    assert [s for s, _ in rel] == list(range(1, 502, 10))
    assert all(r == pytest.approx((s + 54 - 400) / 1000, abs=1e-12) for s, r in rel)  # c(s + 54)
    assert relative_loss.relative(method, base[:30]) == rel[:21]  # the steps both have
    assert relative_loss.crossing(rel) == pytest.approx(346)
    assert relative_loss.crossing(rel, hold=200) is None  # 346 is 155 steps before the end
    assert relative_loss.crossing([[0, 0.1], [10, 0.2]], hold=0) is None  # never below
    assert relative_loss.crossing([[0, -0.2], [10, -0.1]], hold=0) is None  # never reaches zero
    dip = [[0, -0.2], [10, 0.2], [20, -0.1], [30, 0.1]]
    assert relative_loss.crossing(dip, hold=0) == pytest.approx(25)  # the last rise, not the first
    assert relative_loss.crossing(dip + [[40, -0.1]], hold=0) is None  # ends below: no crossing
    ahead = [[s, (s - 1000) / 1000] for s in range(100, 601, 10)]
    assert relative_loss.crossing(ahead) is None
    assert relative_loss.extrapolated_crossing(ahead) == pytest.approx(1000)
    assert relative_loss.extrapolated_crossing([[s, -0.1 - s / 1000] for s in range(100, 601, 10)]) is None
    assert relative_loss.extrapolated_crossing(rel) is None  # above zero at the end already
    points = [(n, math.exp(1.5 + 0.002 * n)) for n in (128, 256, 512, 1024)]
    a, b = relative_loss.growth(points)
    assert (a, b) == (pytest.approx(1.5), pytest.approx(0.002))


def run_summary(seed, curve):
    return {'train_curve': curve, 'final_val_loss': curve[-1][1], 'seed': seed}


def test_relative_series_and_rows_of_synthetic_runs():
    """Each group against the same-seed Transformer, mean ± std over the seeds whose two runs both have a
    training curve: Identity is (s - 346) / 1000 above at step s on seed 1 and 0.02 more on seed 2 (the
    seeds cross zero at 346 and 326, their mean at 336); SVFormer stays ahead, rising towards zero."""
    steps = range(10, 601, 10)
    base = [[s, 4 - s / 1000] for s in steps]

    def shifted(offset):
        return [[s, loss + offset(s)] for s, loss in base]

    def group(runs, baseline='vanilla'):
        return {'runs': [run_summary(seed, curve) if curve else {'final_val_loss': 2.0} for seed, curve in runs],
                'seeds': [seed for seed, _ in runs], 'baseline': baseline}
    groups = {'vanilla': group([(1, base), (2, base), (3, base)]),
              'resformer_identity': group([(1, shifted(lambda s: (s - 400) / 1000)),
                                           (2, shifted(lambda s: (s - 400) / 1000 + 0.02)),
                                           (3, None)]),  # a run trained before train curves: left out
              'svformer': group([(1, shifted(lambda s: (s - 1000) / 1000))]),
              'no curves': group([(1, None)])}
    series = reproduce.relative_series(groups)
    assert list(series) == ['resformer_identity', 'svformer']
    step, mean, std = series['resformer_identity'][-1]
    assert (step, mean, std) == (501, pytest.approx(0.165), pytest.approx(0.02 / math.sqrt(2)))
    rows = reproduce.relative_rows(groups)
    assert '| group | seeds | relative training loss (mean ± std) | Transformer overtakes at step |' in rows
    # the seeds in the mean; the crossing with the seeds' range
    assert '| resformer_identity | 2 | +0.1650 ± 0.0141 at 501 | 336 (seeds 326–346) |' in rows
    assert '| svformer | 1 | -0.4450 ± 0.0000 at 501 | no crossing in 600 steps |' in rows
    # one seed of two crossing is no crossing
    groups['resformer_identity']['runs'][1]['train_curve'] = shifted(lambda s: (s - 1000) / 1000)
    assert reproduce.relative_rows(groups)[-2].endswith('| no crossing in 600 steps (1 of 2 seeds cross: 346) |')
    assert reproduce.relative_rows({'vanilla': groups['vanilla'], 'no curves': groups['no curves']}) == []


def test_relative_loss_cli(tmp_path, capsys):
    """Run folders (log.jsonl) and summaries alike; a folder without a log, a summary without a training
    curve and a bad window are one line each."""
    base = tmp_path / 'vanilla'
    base.mkdir()
    steps = range(10, 601, 10)
    records = [{'step': s, 'train_loss': 4 - s / 1000} for s in steps] + [{'step': 600, 'val_loss': 3.0}]
    (base / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    method = tmp_path / 'method.json'
    method.write_text(json.dumps({'train_curve': [[s, 4 - s / 1000 + (s - 400) / 1000] for s in steps]}))
    relative_loss.main([str(base), str(method)])
    out = capsys.readouterr().out
    assert (f"{method}: +0.1550 at step 501 (the mean over steps 501-600); the baseline overtakes it at step "
            "346 for good") in out
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'old.json').write_text(json.dumps({'final_val_loss': 2.0, 'curve': [[600, 2.0]]}))
    for args, line in (
            ([str(tmp_path / 'empty'), str(method)],
             f"relative_loss.py: cannot read {tmp_path / 'empty' / 'log.jsonl'} (FileNotFoundError); point to a "
             "run folder train.py wrote"),
            ([str(base), str(tmp_path / 'old.json')],
             f"relative_loss.py: {tmp_path / 'old.json'} has no training curve (runs trained before train.py "
             "logged the mean loss of each interval have none); retrain it"),
            ([str(base), str(method), '--window=0'], "relative_loss.py: --window=0; use 1 or more steps")):
        with pytest.raises(SystemExit) as stop:
            relative_loss.main(args)
        assert stop.value.code == line


def test_relative_loss_keeps_a_run_with_a_cut_log_line_and_refuses_a_fifo(tmp_path, capsys):
    """A log.jsonl whose last line a crash cut keeps its curve, with a note of the line left out; a FIFO
    given for a summary (or for a run's log) is refused in one line instead of waiting for a writer."""
    run = tmp_path / 'vanilla'
    run.mkdir()
    records = [{'step': s, 'train_loss': 4 - s / 1000} for s in range(10, 601, 10)]
    (run / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records) + '{"step": 610, "tra')
    assert relative_loss.train_curve(str(run)) == [[r['step'], r['train_loss']] for r in records]
    assert capsys.readouterr().err == f"relative_loss.py: skipped 1 unreadable line(s) of {run / 'log.jsonl'}\n"
    fifo = tmp_path / 'summary.json'
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as stop:
        relative_loss.main([str(run), str(fifo)])
    assert stop.value.code == (
        f"relative_loss.py: {fifo} is not a regular file (a pipe or device may wait forever for a writer); "
        "point to a run folder or a results/runs/*.json summary")


def test_reproduce_mistakes_are_one_line(tmp_path, capsys):
    """--gpus below 0 and an --only that matches no group stop at once, in one line; a summary cut short
    is left out of a --report_only report with one line that says so."""
    for args, line in (
            (['kv', '--gpus=-1'], "reproduce.py: --gpus=-1; use 0 or more (0 or 1: --jobs runs at a time)"),
            (['kv', '--only=nothing*'],
             "reproduce.py: --only='nothing*' matches no group of kv (its groups: 'vanilla T=128', "
             "'svformer T=128', 'gqa T=128', 'svformer+gqa T=128', 'cla T=128', 'vanilla T=512', "
             "'svformer T=512', 'gqa T=512', ...); --dry_run lists them all")):
        with pytest.raises(SystemExit) as stop:
            reproduce.main([*args, f'--results_dir={tmp_path}', '--report_only'])
        assert stop.value.code == line
    reproduce.main(['all', '--only=svformer*', f'--results_dir={tmp_path}', '--dry_run', '--seeds=1'])
    assert capsys.readouterr().out  # a pattern some suite's groups match
    runs = reproduce.suite_runs('kv', 'cpu', [1337])
    (tmp_path / 'runs').mkdir()
    good = summary(runs[0][2], 2.0, [[600, 2.0]], 10 ** 6)
    (tmp_path / 'runs' / f'{runs[0][1]}.json').write_text(json.dumps(good))
    (tmp_path / 'runs' / f'{runs[1][1]}.json').write_text(json.dumps(good)[:40])  # cut short
    reproduce.main(['kv', f'--results_dir={tmp_path}', '--report_only', '--seeds=1'])
    out, err = capsys.readouterr()
    assert f"wrote {tmp_path / 'kv' / 'README.md'}" in out
    assert err == (f"reproduce.py: {tmp_path / 'runs' / runs[1][1]}.json unreadable (cut short, or not a run "
                   "summary), left out of the tables; `python lab/reproduce.py kv` retrains them\n")
    assert '1 of 10 runs are in the tables' in (tmp_path / 'kv' / 'README.md').read_text()


def test_the_lengths_report_fits_svformers_critical_point_against_length():
    """ICLR Fig. 14 Right: SVFormer's critical point at each length where every seed and the mean cross,
    with the seeds' range; where none crosses, each seed's extrapolated line only with their range; the
    exponential fit only through observed crossings."""
    steps = range(10, 601, 10)
    base = [[s, 4 - s / 1000] for s in steps]
    groups = {f'vanilla T={T}': {'runs': [run_summary(1, base), run_summary(2, base)], 'seeds': [1, 2],
                                 'baseline': f'vanilla T={T}'} for T in (64, 128, 256)}
    # smoothed, seed by seed: T=64 crosses at 396 and 376, T=256 at 366 and 346; T=128 would at 946, 1,146
    for T, zeros in ((64, (450, 430)), (128, (1000, 1200)), (256, (420, 400))):
        groups[f'svformer T={T}'] = {'runs': [run_summary(seed, [[s, loss + (s - zero) / 1000] for s, loss in base])
                                              for seed, zero in zip((1, 2), zeros)],
                                     'seeds': [1, 2], 'baseline': f'vanilla T={T}'}
    rows = reproduce.critical_point_rows(groups)
    assert '| 64 | 386 (seeds 376–396) | – |' in rows and '| 256 | 356 (seeds 346–366) | – |' in rows
    assert '| 128 | no crossing in 600 steps | 1,046 (seeds 946–1,146) |' in rows
    a, b = relative_loss.growth([(64, 386), (256, 356)])
    assert rows[-1] == f"The least-squares fit through the observed crossings: step = exp({a:.3f} + {b:.6f} · T)."
    one = reproduce.critical_point_rows({k: v for k, v in groups.items() if '256' not in k})
    assert one[-1].startswith('No exponential fit: 1 of 2 lengths cross within the run')
    groups['svformer T=128']['runs'][1]['train_curve'] = [[s, loss - 0.1 - s / 1000] for s, loss in base]
    assert '| 128 | no crossing in 600 steps | none: 1 of 2 seeds\' lines do not rise |' in \
        reproduce.critical_point_rows(groups)


@pytest.mark.parametrize('ending', [
    'os.kill(os.getpid(), signal.SIGTERM)',
    'print("train.py: stopped by SIGINT at step 2", file=sys.stderr); sys.exit(130)'],
    ids=['killed by SIGTERM', 'train.py stopped by SIGINT'])
def test_a_stop_during_the_probe_is_said_as_a_stop_not_as_unprepared_data(monkeypatch, ending):
    monkeypatch.setattr(reproduce, 'train_command', lambda *args, **kwargs: [
        sys.executable, '-c', f'import os, signal, sys; {ending}'])
    with pytest.raises(SystemExit) as stopped:
        REAL_PROBE(dict(variant='vanilla', seed=1))
    name = 'SIGTERM' if 'kill' in ending else 'SIGINT'
    assert stopped.value.code == (f"reproduce.py: stopped by {name} during a probe run (3 steps that check "
                                  f"today's code); the same command goes on where the runs stand")


def test_a_stop_that_comes_while_a_run_is_set_up_stops_that_run(tmp_path, monkeypatch):
    """SIGTERM after a run passed the stop check but before its train.py started (its probe was running):
    the run is stopped as it starts, not left to train to its end."""
    monkeypatch.setattr(reproduce, 'stopping', threading.Event())
    reproduce.stopping.set()
    started = time.time()
    with open(tmp_path / 'train.out', 'w') as out:
        code = reproduce.train([sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ), out)
    assert code == -signal.SIGTERM and time.time() - started < 30
    assert not reproduce.children


def test_the_critical_value_of_t_and_the_verdict_it_gives():
    """Student's two-sided 5% critical values (the textbook table's, to its three decimals) from the exact
    series; a verdict needs |t| above them; a t that would round onto the critical value prints two
    decimals."""
    for df, table in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert reproduce.t_critical(df) == pytest.approx(table, abs=5e-4)
    assert reproduce.t_within(0.0, 4) == 0.0 and reproduce.t_within(1e6, 3) == pytest.approx(1.0)
    assert [reproduce.verdict(t, n) for t, n in ((-4.26, 3), (-4.31, 3), (2.6, 6), (2.5, 6), (9.0, 1))] == \
        ['unresolved', '<', '>', 'unresolved', 'unresolved']
    assert [reproduce.fmt_t(t, 3) for t in (-4.26, -6.24, 0.04)] == ['-4.26', '-6.2', '0.0']
    assert reproduce.fmt_t(float('nan'), 3) == '–'


def test_claims_are_checked_against_synthetic_runs(tmp_path):
    """A claim names a suite's results folder, its groups and the printed t of each comparison; every way
    it can disagree with the runs is one line naming file:line."""
    deltas = {'vanilla': (0.0, 0.0, 0.0), 'share_v': (-0.05, -0.052, -0.049), 'share_k': (0.01, -0.01, 0.005),
              'cla': (0.02, 0.023, 0.019), 'svformer': (-0.02, -0.021, -0.018)}
    for label, name, settings in reproduce.suite_runs('share_kv', 'cpu', [1337, 1338, 1339]):
        loss = 2.0 + (settings['seed'] - 1337) / 10 + deltas[label][settings['seed'] - 1337]
        path = tmp_path / 'runs' / f'{name}.json'
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(summary(settings, loss, [[600, loss]], 10 ** 6)))
    claims = tmp_path / 'claims.md'
    claims.write_text('\n'.join([
        "Fine: `share_kv: share_v < vanilla (t −57.1)`, `share_kv: share_k vs vanilla unresolved (t 0.3)`.",
        "A ranking: `share_kv: share_v < svformer < vanilla < cla (t −92.0, −22.3, −17.2)`; an interaction:",
        "`share_kv: cla − vanilla < vanilla − share_v (t -89.0)`; `lr` is no claim.",
        "Wrong: `share_kv: share_k < vanilla (t 0.3)`, `share_kv: share_v vs vanilla unresolved (t −57.1)`,",
        "`share_kv: share_v < vanilla (t −57)`, `share_kv: share vs vanilla unresolved (t 0.3)`,",
        "`nothing: a < b (t 1.0)`, `share_kv: share_v < vanilla (t −57.1, 1.0)`."]))
    problems, count = reproduce.check_verdicts([claims], [1337, 1338, 1339], tmp_path)
    assert count == 10
    assert [p.split(': `')[0] for p in problems] == [f'{claims}:4'] * 2 + [f'{claims}:5'] * 2 + [f'{claims}:6'] * 2
    assert problems[0].endswith("share_k − vanilla: +0.0017, t 0.3 over 3 seeds is 'unresolved', not '<' "
                                "(two-sided 5%: |t| above 4.303)")
    assert problems[2].endswith("share_v − vanilla: t is -57.1, printed -57")
    assert "'share' names 0 groups of share_kv (its groups: vanilla, share_k, share_v, cla, svformer)" in problems[3]
    assert "'nothing' is no suite's results folder" in problems[4]
    assert problems[5].endswith("1 comparison(s) but 2 t value(s)")


def test_every_claim_of_the_docs_agrees_with_the_runs_and_an_edited_one_does_not(tmp_path):
    """`reproduce.py --check_verdicts` passes on the committed docs and runs; the same docs with one
    verdict turned against the data fail, naming the line."""
    result = subprocess.run([sys.executable, 'lab/reproduce.py', '--check_verdicts'], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(result.stdout.split()[0]) >= 40  # claims read: the check is not vacuous
    docs = (REPO / 'docs' / 'experiments.md').read_text().splitlines()
    line = next(k for k, text in enumerate(docs) if reproduce.CLAIM.search(text) and ' < ' in text)
    claim = reproduce.CLAIM.search(docs[line])[0]
    docs[line] = docs[line].replace(claim, claim.replace(' < ', ' > ', 1))
    edited = tmp_path / 'experiments.md'
    edited.write_text('\n'.join(docs))
    problems, _ = reproduce.check_verdicts([edited], [1337, 1338, 1339], REPO / 'results')
    assert problems and problems[0].startswith(f"{edited}:{line + 1}: ") and "not '>'" in problems[0]


def test_report_only_trains_no_probe_and_reads_staleness_off_the_summaries(tmp_path, monkeypatch):
    """--report_only compares each summary's probe with those the other summaries of the same probe run
    recorded (the most common one wins) instead of training today's: one that differs is stale."""
    monkeypatch.setattr(reproduce, 'probe', lambda settings: pytest.fail('--report_only trained a probe'))
    runs = [run for run in reproduce.suite_runs('kv', 'cpu', [1337, 1338, 1339]) if run[0].startswith('vanilla')]
    (tmp_path / 'runs').mkdir()
    for k, (_, name, settings) in enumerate(runs):  # vanilla at T=128 and T=512: one probe run
        made = summary(settings, 2.0, [[600, 2.0]], 10 ** 6) | ({'probe': [4.0, 3.9, 3.8, 3.6]} if k == 0 else {})
        (tmp_path / 'runs' / f'{name}.json').write_text(json.dumps(made))
    today = reproduce.stored_probes(tmp_path)
    states = [reproduce.summary_state(tmp_path / 'runs' / f'{name}.json', s, today) for _, name, s in runs]
    assert states == ['stale'] + ['done'] * 5
    reproduce.main(['kv', f'--results_dir={tmp_path}', '--report_only'])
    report = (tmp_path / 'kv' / 'README.md').read_text()
    assert '5 of 30 runs are in the tables' in report and '**1 more were made by code that trains' in report


def test_a_summary_records_dense_resformers_learned_weights():
    """Dense-ResFormer's weights live only in its checkpoint: the summary keeps them, layer by layer (layer 2
    weighs V1 and V2, layer 3 V1..V3, ...); other variants record None."""
    shape = dict(n_layer=4, n_head=2, n_embd=32, vocab_size=128, block_size=32)
    dense = build_model(AblationConfig(**shape, variant='resformer_identity', residual_from='dense'))
    with torch.no_grad():
        dense.blocks[3].attn.dense.copy_(torch.tensor([0.7, 0.05, -0.02, 0.6]))
    weights = reproduce.dense_weights(dense.state_dict())
    assert [len(w) for w in weights] == [2, 3, 4] and weights[0] == [0.5, 0.5]
    assert weights[2] == pytest.approx([0.7, 0.05, -0.02, 0.6])
    assert reproduce.dense_weights(build_model(AblationConfig(**shape)).state_dict()) is None
