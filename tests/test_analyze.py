"""analyze.py: its metrics on hand-built matrices,
and runs on tiny checkpoints of data prepared by prepare.py."""
import copy
import csv
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import prepare
from vrl import data
from vrl.tokenizer import load_tokenizer
from lab.analyze import (importance_entropy, layer_metrics, mean_cosine_similarity, mean_domain_losses,
                     sublayer_losses, token_norms)
from model import GPT, AblationGPT, GPTConfig
from vrl.run_folder import load_checkpoint
from test_sample import TINY, one_thread, train_tiny_checkpoint
from testing import run_script

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
T = 6


def entropy(p):
    return -sum(x * math.log(x) for x in p if x > 0)


def test_uniform_causal_attention():
    # token i attends equally to tokens 0..i, so token j receives sum over i >= j of 1/(i+1)
    attn = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    received = [sum(1 / (i + 1) for i in range(j, T)) for j in range(T)]
    expected = entropy([s / T for s in received])  # every row sums to 1, so everything received sums to T
    assert importance_entropy(attn[None, None]).item() == pytest.approx(expected, rel=1e-6)
    assert 0 < expected < math.log(T)


def test_attention_on_the_first_token_is_the_minimum_entropy():
    attn = torch.zeros(T, T)
    attn[:, 0] = 1
    assert importance_entropy(attn[None, None]).item() == 0


def test_equal_importance_is_the_maximum_entropy():
    # under causality, the only matrix whose column sums are
    # equal is the identity: each token attends to itself
    assert importance_entropy(torch.eye(T)[None, None]).item() == pytest.approx(math.log(T))


def test_entropy_averages_heads_then_sums_columns_per_sequence():
    sink = torch.zeros(T, T)
    sink[:, 0] = 1
    attn = torch.stack([torch.stack([torch.eye(T), sink]),  # sequence 0: one head on itself, one on the sink
                        torch.stack([sink, sink])])         # sequence 1: both heads on the sink
    # sequence 0: token 0 receives (1 + T) / 2, every other token 1/2
    expected = entropy([(1 + T) / 2 / T] + [0.5 / T] * (T - 1))
    assert importance_entropy(attn).tolist() == pytest.approx([expected, 0])


def test_cosine_similarity_of_identical_and_orthogonal_rows():
    lengths = torch.arange(1.0, T + 1)[:, None]  # cosine similarity ignores them
    identical = lengths * torch.linspace(-1, 2, T)  # every row points the same way
    orthogonal = lengths * torch.eye(T)
    opposite = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    assert mean_cosine_similarity(torch.stack([identical, orthogonal])).tolist() == \
        pytest.approx([1, 0], abs=1e-6)
    assert mean_cosine_similarity(opposite).item() == pytest.approx(-1)


def test_token_norms():
    assert token_norms(torch.tensor([[3.0, 4.0], [0.0, 0.0]])).tolist() == [5, 0]


def test_layer_metrics_of_a_forward_pass():
    model = AblationGPT(GPTConfig(**TINY, n_kv_head=1))  # the model that records statistics
    stats = {}
    model(torch.randint(TINY['vocab_size'], (2, 10)), stats=stats)
    metrics = layer_metrics(stats)
    assert all(m.shape == (TINY['n_layer'], 2) for m in metrics.values())
    assert torch.equal(metrics['entropy_rel'], metrics['entropy'] / math.log(10))
    assert torch.allclose(metrics['first_value_norm'][0],
                          stats['values'][0][:, 0, 0].norm(dim=-1))  # one KV head


def test_cosine_similarity_with_layer_1_is_per_position():
    v1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # two positions
    values = [v1, torch.tensor([[0.0, 3.0], [1.0, 1.0]]), -2 * v1]  # cos 0 and 1/√2; then -1 at both
    stats = {'attn': [torch.eye(2)[None, None]] * 3, 'keys': [v1[None, None]] * 3,  # B = 1, one head
             'values': [v[None, None] for v in values], 'hidden': [v[None] for v in values]}
    metrics = layer_metrics(stats)
    expected = [1, (0 + 2 ** -0.5) / 2, -1]
    assert metrics['value_cos_v1'][:, 0].tolist() == pytest.approx(expected)
    assert metrics['hidden_cos_h1'][:, 0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize('n_kv_head', [2, 1])
def test_svformer_values_are_v1_in_every_layer(n_kv_head):
    torch.manual_seed(0)
    model, stats = AblationGPT(GPTConfig(**TINY, variant='svformer', n_kv_head=n_kv_head)), {}
    with torch.no_grad():
        model(torch.randint(TINY['vocab_size'], (2, 10)), stats=stats)
    metrics = layer_metrics(stats)
    assert metrics['value_cos_v1'].flatten().tolist() == pytest.approx([1] * 2 * TINY['n_layer'], abs=1e-6)
    assert metrics['hidden_cos_h1'][0].tolist() == pytest.approx([1, 1])
    assert (metrics['hidden_cos_h1'][1:] < 0.999).all()  # hidden states do change with depth


@pytest.fixture(params=['current', 'identity'])  # model.py's paper path, and its general one
def tiny_resformer(request):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, variant='resformer_identity', value_mapping=request.param,
                          n_kv_head=1)).eval()
    idx = torch.randint(TINY['vocab_size'], (2, 12))
    return model, idx[:, :-1], idx[:, 1:]


def loss_of(model, inputs, targets):
    with torch.no_grad():
        return model(inputs, targets)[1].item()


def test_skipping_nothing_is_the_model_loss_and_every_skip_changes_it(tiny_resformer):
    model, inputs, targets = tiny_resformer
    with torch.no_grad():
        loss, skips = sublayer_losses(model, inputs, targets)
    assert loss == loss_of(model, inputs, targets)  # also: no sublayer is left zeroed afterwards
    assert [len(skip) for skip in skips.values()] == [TINY['n_layer']] * 2
    assert all((skip != 0).all() for skip in skips.values())


def test_a_skipped_sublayer_is_its_output_projection_zeroed(tiny_resformer):
    """Skipping layer n's attention is its W_O set to zero, its MLP the MLP's down projection: what else the
    layer computes, V1 in layer 1, still reaches later layers (zeroing layer 1's W_V gives another loss)."""
    model, inputs, targets = tiny_resformer
    with torch.no_grad():
        loss, skips = sublayer_losses(model, inputs, targets)
    for kind, weight in [('attn', 'attn.c_proj'), ('mlp', 'mlp.c_down')]:
        for n in range(TINY['n_layer']):
            zeroed = copy.deepcopy(model)
            zeroed.get_parameter(f'blocks.{n}.{weight}.weight').data.zero_()
            expected = loss_of(zeroed, inputs, targets) - loss
            assert skips[f'skip_{kind}'][n].item() == pytest.approx(expected, abs=1e-5)
    without_v1 = copy.deepcopy(model)
    without_v1.blocks[0].attn.c_v.weight.data.zero_()
    skipped_attention = skips['skip_attn'][0].item()
    assert loss_of(without_v1, inputs, targets) - loss != pytest.approx(skipped_attention, abs=1e-3)


def test_skipping_the_last_mlp_by_hand():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**dict(TINY, n_layer=2))).eval()
    idx = torch.randint(TINY['vocab_size'], (2, 12))
    inputs, targets = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        loss, skips = sublayer_losses(model, inputs, targets)
        rope, lambdas = (model.rope_cos[:11], model.rope_sin[:11]), model.lambdas
        x, _ = model.blocks[0](model.wte(inputs), rope, lambdas[0], None, None)
        last = model.blocks[1]
        x = x + last.attn(last.norm_attn(x), rope, lambdas[1], None, None)[0]  # and no MLP
        by_hand = F.cross_entropy(model.lm_head(model.norm_f(x)).flatten(0, 1), targets.flatten()).item()
    assert skips['skip_mlp'][1].item() == pytest.approx(by_hand - loss, abs=1e-5)


DOCUMENTS = [f"doc {i}: the quick brown fox jumps over the lazy dog {i % 7} times." for i in range(30)]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """data/ prepared by prepare.py from DOCUMENTS, two vanilla runs (seeds), an Identity ResFormer, and a
    vanilla run with another learning rate, all trained briefly on data/'s training text."""
    root = tmp_path_factory.mktemp('analyze')
    (root / 'corpus').mkdir()
    for i, document in enumerate(DOCUMENTS):
        (root / 'corpus' / f'{i:02d}.txt').write_text(document)
    prepare.main([f"--input={root / 'corpus'}", f"--out_dir={root / 'data'}", '--num_proc=1'])
    meta = data.load_meta(str(root / 'data'))
    text = load_tokenizer(meta).decode(
        np.concatenate(data.open_split(str(root / 'data'), 'train')).tolist())
    for name, variant, seed, learning_rate in [('vanilla_1', 'vanilla', 1, 0.001),
                                               ('vanilla_2', 'vanilla', 2, 0.001),
                                               ('resformer', 'resformer_identity', 1, 0.001),
                                               ('vanilla_lr', 'vanilla', 1, 0.01)]:
        train_tiny_checkpoint(str(root / name / 'ckpt.pt'), variant, data_dir=str(root / 'data'), steps=20,
                              text=text, chars=meta['chars'], seed=seed, learning_rate=learning_rate)
    return root


ANALYZE_PY = os.path.join(HERE, 'lab', 'analyze.py')


def analyze_cli(runs, *args):
    return subprocess.run([sys.executable, ANALYZE_PY, '--device=cpu', *args],
                          capture_output=True, text=True, cwd=runs, env=dict(os.environ, OMP_NUM_THREADS='1'))


def analyze(runs, *args):
    """analyze.py run in this process (fast), in folder runs: what analyze_cli would return. A traceback would
    be an exception here, failing the test."""
    with one_thread():
        return run_script(ANALYZE_PY, ['--device=cpu', *args], runs, check=False)


def entropies_of(path, windows):
    model, _ = load_checkpoint(str(path), model_type=AblationGPT)
    stats = {}
    with torch.no_grad(), one_thread():
        model(torch.tensor(windows.astype(np.int64)), stats=stats)
    return np.array([importance_entropy(attn).mean().item() for attn in stats['attn']])


def losses_of(path, windows):
    """The model's loss on each window, predicting its own next tokens."""
    model, _ = load_checkpoint(str(path))
    windows = torch.tensor(windows.astype(np.int64))
    with one_thread():
        return np.array([loss_of(model, w[None, :-1], w[None, 1:]) for w in windows])


def test_document_start_windows_and_seeds_averaged(runs):
    result = analyze_cli(runs, 'vanilla_1', 'vanilla_2/ckpt.pt', 'resformer', '--num_seqs=3', '--seq_len=64',
                         '--out=results')
    assert result.returncode == 0, result.stderr
    assert 'seq_len 64 -> 32' in result.stdout  # capped at block_size
    assert 'plots skipped' in result.stdout or os.path.exists(runs / 'results' / 'entropy.png')
    with open(runs / 'results' / 'metrics.json') as f:
        report = json.load(f)
    assert (report['windows'], report['seq_len']) == ('doc_start', 32)
    assert list(report['groups']) == ['vanilla', 'resformer_identity']
    assert report['groups']['vanilla']['runs'] == ['vanilla_1/ckpt.pt', 'vanilla_2/ckpt.pt']

    # the windows: the validation documents' starts (documents 9, 19 and 29), each led by the separator "\n\n"
    meta = data.load_meta(str(runs / 'data'))
    tokenizer = load_tokenizer(meta)
    val = data.open_split(str(runs / 'data'), 'val')[0]
    assert report['offsets'] == meta['val_doc_starts'] and len(report['offsets']) == 3
    windows = np.stack([np.concatenate([tokenizer.encode('\n\n'), val[s:s + 30]]) for s in report['offsets']])
    assert [tokenizer.decode(w.tolist())[:8] for w in windows] == ['\n\ndoc 9:', '\n\ndoc 19', '\n\ndoc 29']

    # mean and sample std over the two seeds, computed here directly
    seeds = np.stack([entropies_of(runs / name / 'ckpt.pt', windows) for name in ('vanilla_1', 'vanilla_2')])
    vanilla = report['groups']['vanilla']
    assert vanilla['mean']['entropy'] == pytest.approx(seeds.mean(axis=0), rel=1e-5)
    assert vanilla['std']['entropy'] == pytest.approx(seeds.std(axis=0, ddof=1), rel=1e-4)
    assert report['groups']['resformer_identity']['std'] is None  # one run
    # Sec. 4.5's post-analyses: the loss on the windows; per layer, the cosines with layer 1 and the skips
    seed_losses = [losses_of(runs / name / 'ckpt.pt', windows).mean() for name in ('vanilla_1', 'vanilla_2')]
    assert vanilla['mean']['loss'] == pytest.approx(np.mean(seed_losses), rel=1e-5)
    assert vanilla['std']['loss'] == pytest.approx(np.std(seed_losses, ddof=1), rel=1e-4)
    assert vanilla['per_run']['vanilla_1/ckpt.pt']['loss'] == pytest.approx(seed_losses[0], rel=1e-5)
    for name in ('value_cos_v1', 'hidden_cos_h1', 'skip_attn', 'skip_mlp'):
        assert len(vanilla['mean'][name]) == 3 and len(vanilla['std'][name]) == 3
    assert vanilla['mean']['value_cos_v1'][0] == pytest.approx(1)
    assert vanilla['mean']['hidden_cos_h1'][0] == pytest.approx(1)
    assert 'Sec. 4.5, our reading: loss' in result.stdout and 'Δloss -MLP' in result.stdout
    assert 'vanilla: 3 layers, iter 20, 2 run(s): vanilla_1/ckpt.pt, vanilla_2/ckpt.pt ' \
        '(mean ± std over runs)' in result.stdout

    with open(runs / 'results' / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    assert [(r['group'], r['runs'], r['layer']) for r in rows] == \
        [(g, n, str(layer)) for g, n in (('vanilla', '2'), ('resformer_identity', '1'))
         for layer in (1, 2, 3)]
    assert float(rows[0]['entropy_std']) == pytest.approx(seeds.std(axis=0, ddof=1)[0], rel=1e-4)
    assert rows[3]['entropy_std'] == ''


def test_mid_text_windows(runs):
    result = analyze(runs, 'vanilla_1', '--windows=mid_text', '--num_seqs=3', '--out=mid')
    assert result.returncode == 0, result.stderr
    with open(runs / 'mid' / 'metrics.json') as f:
        report = json.load(f)
    val = data.open_split(str(runs / 'data'), 'val')[0]
    assert report['offsets'] == [0, (len(val) - 32) // 2, len(val) - 32]
    windows = np.stack([val[o:o + 32] for o in report['offsets']])
    assert report['groups']['vanilla']['mean']['entropy'] == \
        pytest.approx(entropies_of(runs / 'vanilla_1' / 'ckpt.pt', windows), rel=1e-5)


def test_groups_of_one_variant_are_named_by_what_differs(runs):
    result = analyze(runs, 'vanilla_1', 'vanilla_lr', '--num_seqs=1', '--out=lr')
    assert result.returncode == 0, result.stderr
    with open(runs / 'lr' / 'metrics.json') as f:
        assert list(json.load(f)['groups']) == ['vanilla (learning_rate=0.001)',
                                                'vanilla (learning_rate=0.01)']


def test_a_setting_added_by_a_later_train_py_does_not_split_a_group(runs):
    """Seeds of one run trained by train.py versions with and without a newer setting (its config and
    model_args have keys the older lack) still form one group: a missing setting tells no run apart."""
    checkpoint = torch.load(runs / 'vanilla_2' / 'ckpt.pt', weights_only=True)
    checkpoint['config'] = dict(checkpoint['config'], micro_batch_size=None)
    checkpoint['model_args'] = dict(checkpoint['model_args'], value_embeds=False)
    (runs / 'vanilla_newer').mkdir(exist_ok=True)
    torch.save(checkpoint, runs / 'vanilla_newer' / 'ckpt.pt')
    result = analyze(runs, 'vanilla_1', 'vanilla_newer', '--num_seqs=1', '--out=newer')
    assert result.returncode == 0, result.stderr
    with open(runs / 'newer' / 'metrics.json') as f:
        groups = json.load(f)['groups']
    assert list(groups) == ['vanilla'] and len(groups['vanilla']['runs']) == 2


def one_line_error(result, *words):
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    message = result.stderr.splitlines()[-1]
    assert message.startswith('analyze.py: ') and result.stderr.count('\n') == 1, result.stderr
    assert all(word in message for word in words), message


def test_checkpoints_with_different_vocabularies_are_refused(runs):
    checkpoint = torch.load(runs / 'vanilla_1' / 'ckpt.pt', weights_only=True)
    checkpoint['data_meta'] = dict(checkpoint['data_meta'],
                                   chars=list(reversed(checkpoint['data_meta']['chars'])))
    torch.save(checkpoint, runs / 'reversed.pt')
    one_line_error(analyze(runs, 'vanilla_1', 'reversed.pt'), 'reversed.pt has another vocabulary')
    one_line_error(analyze(runs, 'reversed.pt'), 'is not tokenized as the runs')


@pytest.mark.parametrize('args, words', [
    ([], ['no runs given', 'python lab/analyze.py out/ablation_vanilla']),
    (['out/nowhere'], ['out/nowhere not found', "training runs' folders"]),
    (['data'], ['data has no ckpt.pt']),
    (['vanilla_1', '--ckpt=best.pt'], ['vanilla_1 has no best.pt']),
    (['vanilla_1', '--windows=random'], ["windows='random'", 'doc_start', 'mid_text']),
    (['vanilla_1', '--num_seqs=1.5'], ['--num_seqs expects int']),
])
def test_bad_arguments_exit_with_one_line(runs, args, words):
    result = analyze(runs, *args)
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    message = result.stderr.splitlines()[-1]
    assert result.stderr.count('\n') == 1 and all(word in message for word in words), message


def test_data_prepared_by_an_older_prepare_py(runs, tmp_path):
    shutil.copytree(runs / 'data', tmp_path / 'data')
    meta = json.loads((tmp_path / 'data' / 'meta.json').read_text())
    del meta['val_doc_starts']
    (tmp_path / 'data' / 'meta.json').write_text(json.dumps(meta))
    checkpoint = torch.load(runs / 'vanilla_1' / 'ckpt.pt', weights_only=True)
    checkpoint['config']['data_dir'] = str(tmp_path / 'data')
    torch.save(checkpoint, tmp_path / 'old.pt')
    one_line_error(analyze(tmp_path, 'old.pt'), 'has no val_doc_starts', '--windows=mid_text')


# vrl/hardware.py's pick_device turns an unusable device into one line
@pytest.mark.parametrize('device', ['nosuch', 'cuda:0'])
def test_unusable_device_exits_with_one_line(runs, device):
    if device.startswith('cuda') and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    result = analyze(runs, 'vanilla_1', f'--device={device}')
    assert result.returncode == 1 and result.stderr.count('\n') == 1 and device in result.stderr, \
        result.stderr


@pytest.mark.parametrize('out', ['taken', 'taken/metrics'])
def test_an_out_that_cannot_be_a_folder_is_refused_before_any_computing(runs, out):
    (runs / 'taken').write_text('keep me')
    result = analyze(runs, 'vanilla_1', f'--out={out}')
    one_line_error(result, f"out='{out}' cannot be a folder", 'taken is a file')
    assert 'windows of' not in result.stdout  # refused before the checkpoints were read and the windows cut
    assert (runs / 'taken').read_text() == 'keep me'


def test_a_relative_data_dir_is_found_from_another_folder(runs, tmp_path):
    checkpoint = torch.load(runs / 'vanilla_1' / 'ckpt.pt', weights_only=True)
    # as train.py run from the repository
    checkpoint['config']['data_dir'] = os.path.relpath(runs / 'data', HERE)
    torch.save(checkpoint, tmp_path / 'relative.pt')
    result = analyze(tmp_path, 'relative.pt', '--num_seqs=1', '--out=out')
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / 'out' / 'metrics.json').read_text())['data_dir'] == os.path.join(
        HERE, checkpoint['config']['data_dir'])


def test_domain_losses_are_the_mean_over_checkpoints_or_none():
    """SlimPajama checkpoints carry train.py's last per-domain validation: analyze.py reports its mean over a
    group's runs; a group with any single-corpus checkpoint gets none."""
    scored = [{'last_eval': {'val_loss_domains': {'C4': 3.0, 'Github': 1.0}}},
              {'last_eval': {'val_loss_domains': {'C4': 2.0, 'Github': 2.0}}}]
    assert mean_domain_losses(scored) == {'C4': 2.5, 'Github': 1.5}
    assert mean_domain_losses(scored + [{'iter_num': 3}]) is None
