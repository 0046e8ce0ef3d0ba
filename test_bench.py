"""bench.py --smoke: every section runs and the report is well formed. No timing is checked: the numbers of a
smoke run mean nothing, and a loaded machine must not fail the suite."""
import json
import os
import subprocess
import sys

import pytest

from model import VARIANTS

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench') / 'bench.json'
    run = subprocess.run([sys.executable, 'bench.py', '--smoke', f'--out={out}', '--device=cpu'], cwd=HERE,
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


def test_help_lists_every_setting_with_its_default_and_a_comment():
    run = subprocess.run([sys.executable, 'bench.py', '--help'], cwd=HERE, capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (0, '')
    settings = [line.split() for line in run.stdout.splitlines() if line.startswith('  --')]
    assert settings[4][:2] == ['--rounds=10', 'each'] and settings[-1][0] == '--smoke=False'
    assert len(settings) == 20 and all(len(words) > 1 for words in settings)  # a comment beside each


@pytest.mark.parametrize('args, message', [
    (['--rounds=0'], "bench.py: rounds=0; rounds, steps and decode_rounds take at least 1, "
                     "warmup and loop_rounds at least 0"),
    (['--out=taken/x.json'], "bench.py: out='taken/x.json'; name a file in an existing folder"),
    (['--out=.'], "bench.py: out='.'; name a file in an existing folder"),
])
def test_bad_settings_exit_with_one_line_before_any_measuring(tmp_path, args, message):
    (tmp_path / 'taken').write_text('keep me')
    run = subprocess.run([sys.executable, os.path.join(HERE, 'bench.py'), '--device=cpu', *args], cwd=tmp_path,
                         capture_output=True, text=True)
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
    assert set(VARIANTS) <= set(rows)
    assert rows['vanilla'][3] == '1.000'


def test_the_json_holds_every_section(smoke):
    results = smoke[1]
    assert {row['contender'] for row in results['train']} >= set(VARIANTS)
    assert all(len(row['step_s_per_round']) == results['settings']['rounds'] for row in results['train'])
    assert {row['variant'] for row in results['decode']} == set(VARIANTS)
    assert results['matmul']['flops_per_s'] > 0
    assert results['memory'] and results['memory'][0]['variant'] == 'vanilla'


def test_kv_ratios_equal_the_formulas(smoke):
    kv = smoke[1]['kv']
    assert {row['shape'] for row in kv} == {'82m', '468m'}
    assert all(row['matches'] for row in kv), [row for row in kv if not row['matches']]


# Runs bench.py with torch.compile's backend swapped for 'eager': dynamo still traces every contender and keeps
# its cache entries and recompile limit exactly as with inductor, but no kernels are generated, so this takes
# seconds. It prints, after the report, how many frames dynamo tried and how many it compiled.
EAGER_BACKEND_BENCH = """
import runpy, sys, torch
from torch._dynamo.utils import counters
compile = torch.compile
torch.compile = lambda model, **options: compile(model, backend='eager')
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('bench.py', run_name='__main__')
print('frames', counters['frames']['total'], counters['frames']['ok'])
"""


def test_compile_true_compiles_every_contender_even_past_torchs_recompile_limit(tmp_path):
    # 13 variants share GPT.forward, more than the 8 entries torch keeps for one code object by default
    assert len(VARIANTS) > 8
    run = subprocess.run([sys.executable, '-c', EAGER_BACKEND_BENCH, '--smoke', '--compile=True',
                          '--memory=False', '--device=cpu', f'--out={tmp_path / "bench.json"}'], cwd=HERE,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'recompile_limit' not in run.stderr
    total, ok = map(int, run.stdout.splitlines()[-1].split()[1:])
    assert total == ok > len(VARIANTS)  # every frame dynamo met was compiled: none fell back to eager
    results = json.loads((tmp_path / 'bench.json').read_text())
    assert results['settings']['compile'] and {row['variant'] for row in results['decode']} == set(VARIANTS)
