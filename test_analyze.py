"""analyze.py: its metrics on hand-built matrices, and a run on two tiny checkpoints."""
import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from analyze import importance_entropy, layer_metrics, mean_cosine_similarity, token_norms
from model import GPT, GPTConfig, load_checkpoint
from test_sample import CHARS, TEXT, TINY, one_thread, train_tiny_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
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
    # under causality, the only matrix whose column sums are equal is the identity: each token attends to itself
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
    assert mean_cosine_similarity(torch.stack([identical, orthogonal])).tolist() == pytest.approx([1, 0], abs=1e-6)
    assert mean_cosine_similarity(opposite).item() == pytest.approx(-1)


def test_token_norms():
    assert token_norms(torch.tensor([[3.0, 4.0], [0.0, 0.0]])).tolist() == [5, 0]


def test_layer_metrics_of_a_forward_pass():
    model = GPT(GPTConfig(**TINY, n_kv_head=1))
    stats = {}
    model(torch.randint(TINY['vocab_size'], (2, 10)), stats=stats)
    metrics = layer_metrics(stats)
    assert all(m.shape == (TINY['n_layer'], 2) for m in metrics.values())
    assert torch.equal(metrics['entropy_rel'], metrics['entropy'] / math.log(10))
    assert torch.allclose(metrics['first_value_norm'][0], stats['values'][0][:, 0, 0].norm(dim=-1))  # one KV head


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """A vanilla and an Identity ResFormer checkpoint whose config points to a data_dir with a val.bin of TEXT."""
    root = tmp_path_factory.mktemp('analyze')
    data_dir = root / 'data'
    data_dir.mkdir()
    np.array([CHARS.index(c) for c in TEXT], dtype=np.uint16).tofile(data_dir / 'val.bin')
    for variant in ('vanilla', 'resformer_identity'):
        train_tiny_checkpoint(str(root / variant / 'ckpt.pt'), variant, data_dir=str(data_dir), steps=30)
    return root


def analyze(runs, *args):
    return subprocess.run([sys.executable, os.path.join(HERE, 'analyze.py'), *args, '--device=cpu'],
                          capture_output=True, text=True, cwd=runs, env=dict(os.environ, OMP_NUM_THREADS='1'))


def test_analysis_of_two_checkpoints(runs):
    result = analyze(runs, 'vanilla', 'resformer_identity/ckpt.pt', '--num_seqs=3', '--seq_len=64', '--out=results')
    assert result.returncode == 0, result.stderr
    assert 'seq_len 64 -> 32' in result.stdout  # capped at block_size
    assert 'plots skipped' in result.stdout or os.path.exists(runs / 'results' / 'entropy.png')

    with open(runs / 'results' / 'metrics.json') as f:
        report = json.load(f)
    names = ['vanilla/ckpt.pt', 'resformer_identity/ckpt.pt']
    assert list(report['checkpoints']) == names and report['seq_len'] == 32
    with open(runs / 'results' / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    assert [(r['checkpoint'], int(r['layer'])) for r in rows] == [(n, layer) for n in names for layer in (1, 2, 3)]
    assert all(math.isfinite(float(value)) for row in rows for key, value in row.items() if key != 'checkpoint')

    # the reported numbers are the metrics of the same windows, computed here directly
    data = np.fromfile(runs / 'data' / 'val.bin', dtype=np.uint16)
    offsets = report['offsets']
    assert len(offsets) == 3 and offsets[0] == 0 and offsets[-1] == len(data) - 32
    model, _ = load_checkpoint(str(runs / 'resformer_identity' / 'ckpt.pt'))
    stats = {}
    with torch.no_grad(), one_thread():
        model(torch.tensor(np.stack([data[o:o + 32] for o in offsets]).astype(np.int64)), stats=stats)
    entropies = [importance_entropy(attn).mean().item() for attn in stats['attn']]
    assert report['checkpoints'][names[1]]['entropy'] == pytest.approx(entropies, rel=1e-5)
    assert 'resformer_identity/ckpt.pt: resformer_identity, 3 layers' in result.stdout


def test_checkpoints_with_different_vocabularies_are_refused(runs):
    checkpoint = torch.load(runs / 'vanilla' / 'ckpt.pt', weights_only=True)
    checkpoint['data_meta'] = dict(checkpoint['data_meta'], chars=list(reversed(CHARS)))
    torch.save(checkpoint, runs / 'reversed.pt')
    result = analyze(runs, 'vanilla', 'reversed.pt')
    assert result.returncode == 1
    assert result.stderr.count('\n') == 1 and 'reversed.pt has another vocabulary' in result.stderr, result.stderr
