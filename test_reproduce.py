"""reproduce.py without training: its statistics and reports on synthetic runs, and the runner's skip/resume logic."""
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

import reproduce
from reproduce import crossing_step, loglinear_fit, mean_std, paired_t, parameters_for_loss


@pytest.fixture(autouse=True)
def probe(monkeypatch):
    """The probe trains a tiny model; here every summary's code counts as today's unless a test says otherwise."""
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
    matched, extrapolated = parameters_for_loss([(1e6, 3.0), (1e7, 2.0)], 1.5)  # past the largest: along its segment
    assert matched == pytest.approx(math.sqrt(1e15)) and extrapolated
    a, b = loglinear_fit([(1.0, 1.0), (math.e, 0.0), (math.e ** 2, 0.5)])  # least squares on ln(params) = 0, 1, 2
    assert (a, b) == (pytest.approx(0.75), pytest.approx(-0.25))


def summary(settings, final, curve, params, kv=2048, lambdas=None, grads=None):
    return {'settings': settings, 'curve': curve, 'final_val_loss': final, 'params': params, 'kv_bytes_per_token': kv,
            'lambdas': lambdas, 'mean_grad_norms': grads, 'seconds': 60.0, 'commit': 'abc', 'probe': [4.0, 3.9, 3.8, 3.7]}


def write_summaries(results_dir, suite, make):
    """A summary for every run of a suite at the cpu scale, seeds 1337 and 1338, from make(label, seed)."""
    for label, name, settings in reproduce.suite_runs(suite, 'cpu', [1337, 1338]):
        path = results_dir / 'runs' / f'{name}.json'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(make(label, settings)))


def test_scaling_report_gives_the_savings_of_synthetic_runs(tmp_path):
    """Transformer loss falls 0.5 per 10x parameters; ResFormer is 0.25 lower at every size (0.23 for seed 1338),
    0.24 on average, which a Transformer reaches at 10^0.48 times the size (saving 1 - 10^-0.48 = 66.9%). ResFormer's
    curve reaches the Transformer's final loss at step 300 of 600 (token saving 50%)."""
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
    assert '| -0.2400 ± 0.0141 | -24.0 | 300 |' in row  # paired Δ, t, crossing step
    savings = [line for line in report.splitlines() if line.startswith('| resformer_identity') and '%' in line]
    assert len(savings) == 4
    for line in savings:  # on an exact line, the piecewise reading and the fit agree
        assert line.count('| 66.9% |') == 2 and line.endswith('| 66.9% | 50.0% |')
    assert '(extrapolated)' in savings[-1] and '(extrapolated)' not in savings[0]
    assert 'a Transformer needs 3.02x the parameters for the same loss, a saving of 66.9%.' in report


def test_lr_and_kv_reports(tmp_path):
    """Gradient-norm ratios (2x on layer 1's W_V) and KV ratios / loss gaps come out of the summaries as written."""
    def make_lr(label, settings):
        factor = 1.0 if label.startswith('vanilla') else 2.0
        grads = {'blocks.0.attn.c_v.weight': 0.1 * factor, 'blocks.0.attn.c_proj.weight': 0.2,
                 'blocks.1.attn.c_proj.weight': 0.4}
        return summary(settings, 2.0, [[0, 4.0], [600, 2.0]], 10 ** 6, grads=grads)
    write_summaries(tmp_path, 'lr', make_lr)
    report = reproduce.write_report('lr', 'cpu', [1337, 1338], tmp_path).read_text()
    assert '| resformer_identity lr=0.004 | 0.200 / 0.100 = 2.00× | 0.200 / 0.200 = 1.00× | 0.300 / 0.300 = 1.00× |' in report

    def make_kv(label, settings):
        kv = 1024 if label.startswith('svformer') else 2048
        return summary(settings, 2.1 if label.startswith('svformer') else 2.0, [[0, 4.0], [600, 2.0]], 10 ** 6, kv=kv)
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


def test_runner_skips_finished_runs_and_resumes_interrupted_ones(tmp_path, monkeypatch):
    """Finished (summary written): not run. Interrupted after a checkpoint: resumed. Killed before one: restarted."""
    commands = []

    def fake_train(command, env, stdout):
        commands.append(command)
        out_dir = Path(next(a for a in command if a.startswith('--out_dir=')).split('=', 1)[1])
        (out_dir / 'log.jsonl').write_text(json.dumps({'step': 600, 'val_loss': 2.0}) + '\n')
        torch.save({'model_args': dict(n_layer=2, n_head=2, n_embd=32, vocab_size=128, block_size=64)}, out_dir / 'ckpt.pt')
        return 0
    monkeypatch.setattr(reproduce, 'train', fake_train)
    runs = reproduce.suite_runs('variants', 'cpu', [1337])[:3]
    results, runs_dir = tmp_path / 'results', tmp_path / 'runs'
    finished, interrupted, killed = (name for _, name, _ in runs)
    (results / 'runs').mkdir(parents=True)
    (results / 'runs' / f'{finished}.json').write_text(json.dumps(summary(runs[0][2], 2.0, [[600, 2.0]], 10 ** 6)))
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
    assert done['final_val_loss'] == 2.0 and done['params'] > 0 and done['kv_bytes_per_token'] == 2 * 2 * 2 * 16 * 2
    commands.clear()
    assert reproduce.run_suite(runs, runs_dir, results, gpus=0, jobs=1) == {} and commands == []  # all done now


def test_run_names_identify_settings():
    """Equal settings share a run across suites; different ones never collide."""
    names = {name for suite in reproduce.SUITES for _, name, _ in reproduce.suite_runs(suite, 'cpu', [1337, 1338, 1339])}
    settings = {json.dumps(s, sort_keys=True) for suite in reproduce.SUITES
                for _, _, s in reproduce.suite_runs(suite, 'cpu', [1337, 1338, 1339])}
    assert len(names) == len(settings) == 87 + 7 * 3 + 2 * 3 * 3  # depth: 7 new groups; value_embed: 2 x 3 new
    kv_vanilla = reproduce.suite_runs('kv', 'cpu', [1337])[0][1]
    assert kv_vanilla == reproduce.suite_runs('variants', 'cpu', [1337])[0][1] == 'cpu_variant=vanilla_seed=1337'
