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
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import prepare
from vrl import data
from vrl.tokenizer import load_tokenizer
import lab.analyze as analyze_py
from ablations import AblationConfig, AblationGPT, Heads, build_model
from lab.analyze import (importance_entropy, layer_metrics, mean_cosine_similarity, mean_domain_losses,
                         sublayer_losses, token_norms)
from model import GPT, GPTConfig
from vrl.run_folder import load_checkpoint
from test_sample import TINY, one_thread, train_tiny_checkpoint
from testing import run_script, with_stdout_closed

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
    model = AblationGPT(AblationConfig(**TINY, n_kv_head=1))  # the model that records statistics
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
    model, stats = AblationGPT(AblationConfig(**TINY, variant='svformer', n_kv_head=n_kv_head)), {}
    with torch.no_grad():
        model(torch.randint(TINY['vocab_size'], (2, 10)), stats=stats)
    metrics = layer_metrics(stats)
    assert metrics['value_cos_v1'].flatten().tolist() == pytest.approx([1] * 2 * TINY['n_layer'], abs=1e-6)
    assert metrics['hidden_cos_h1'][0].tolist() == pytest.approx([1, 1])
    assert (metrics['hidden_cos_h1'][1:] < 0.999).all()  # hidden states do change with depth


@pytest.fixture(params=['current', 'identity'])  # model.py's paper model, and ablations.py's extension of it
def tiny_resformer(request):
    torch.manual_seed(0)
    model = build_model(AblationConfig(**TINY, variant='resformer_identity', value_mapping=request.param,
                                       n_kv_head=1)).eval()
    assert type(model) is (GPT if request.param == 'current' else AblationGPT)
    idx = torch.randint(TINY['vocab_size'], (2, 12))
    return model, idx[:, :-1], idx[:, 1:]


def loss_of(model, inputs, targets):
    with torch.no_grad():
        return model(inputs, targets).item()


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


# ----------------------------------------------------------------------------- the paper's other analyses
# (ICLR: the ICLR 2025 text), each against a direct computation on a tiny model: its layers run by hand


def as_ablation_gpt(model):
    """The AblationGPT (which records statistics, as analyze.py loads every checkpoint) with model's weights."""
    twin = AblationGPT(AblationConfig(**asdict(model.config))).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def sharpened(model, factor=8.0):
    """model with its queries and keys scaled up: peaked attention, where random weights give nearly uniform
    attention, under which every mapping of the values looks alike."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.c_q.weight *= factor
            block.attn.c_k.weight *= factor
    return model


def layers_by_hand(model, idx):
    """Each layer of a GPT (model.py) on idx: {'q', 'k' (B, heads, T, hd), 'own' (its values x W_V, None
    without W_V), 'attended' (what it attends over), 'attn' (B, H, T, T)}, the attention matrix computed
    here from q and k: softmax(q k^T / √d_h), causal."""
    T = idx.size(1)
    rope = (model.rope_cos[:T], model.rope_sin[:T])
    x, v1, layers = model.wte(idx), None, []
    with torch.no_grad():
        for n, block in enumerate(model.blocks, start=1):
            attn, h = block.attn, block.norm_attn(x)
            q, k = attn.heads(attn.c_q, h, rope), attn.heads(attn.c_k, h, rope)
            own = attn.heads(attn.c_v, h) if attn.c_v is not None else None
            x, attended = block(x, rope, model.lambdas[n - 1], v1, None)
            v1 = attended if n == 1 else v1
            keys = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
            scores = (q @ keys.transpose(-2, -1)) / math.sqrt(q.size(-1))
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            layers.append({'q': q, 'k': k, 'own': own, 'attended': attended,
                           'attn': scores.masked_fill(future, -math.inf).softmax(dim=-1)})
    return layers


def per_token(t, b):
    """Sequence b of t (B, heads, T, D) as T rows, each its token's heads side by side."""
    return torch.cat(list(t[b]), dim=-1)


def eigenvalues_by_hand(values):
    """Eigenvalues of (1/l) Σ_i v_i v_i^T over the rows v_i of values (l, D), largest first."""
    moment = sum(torch.outer(v, v) for v in values.double()) / len(values)
    return torch.linalg.eigvalsh(moment).flip(0)


@pytest.mark.parametrize('variant', ['vanilla', 'resformer_identity', 'svformer'])
def test_value_eigenvalues_are_those_of_each_layers_own_values_second_moment(monkeypatch, variant):
    """ICLR Fig. 12 / Eqn. 12: per layer, the eigenvalues of (1/l) Σ_i v_i v_i^T over a sequence's tokens,
    every head concatenated, sorted and averaged over the sequences; layer 1's whole spectrum, each layer's
    largest. The values are the layer's own V_n (before ResFormer mixes V1 in); SVFormer's layers n > 1 have
    none: V1, which they attend over."""
    monkeypatch.setattr(analyze_py, 'device', 'cpu')
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, variant=variant)).eval()
    windows = torch.randint(TINY['vocab_size'], (3, 12))
    with one_thread():
        result = analyze_py.analyze(as_ablation_gpt(model), windows, 'test')
        by_hand = [layers_by_hand(model, w[None]) for w in windows]
    D = TINY['n_embd']  # n_kv_head x head_dim
    for n in range(1, TINY['n_layer'] + 1):
        values = [w[n - 1]['own'] if w[n - 1]['own'] is not None else w[n - 1]['attended'] for w in by_hand]
        spectra = torch.stack([eigenvalues_by_hand(per_token(v, 0)) for v in values])  # (windows, D)
        expected = spectra.mean(dim=0)
        assert len(expected) == D and result['value_eig_max'][n - 1] == pytest.approx(expected[0].item(),
                                                                                      rel=1e-6)
        # each window's eigenvalues over their trace, then averaged; the effective rank: exp(their entropy)
        shares = spectra / spectra.sum(dim=-1, keepdim=True)
        erank = [math.exp(entropy(window.tolist())) for window in shares]
        assert result['value_eig_max_rel'][n - 1] == pytest.approx(shares[:, 0].mean().item(), rel=1e-6)
        assert result['value_erank'][n - 1] == pytest.approx(np.mean(erank), rel=1e-6)
        if n == 1:
            assert result['value_spectrum_1'] == pytest.approx(expected.tolist(), rel=1e-6, abs=1e-9)
            assert result['value_spectrum_1_rel'] == pytest.approx(shares.mean(dim=0).tolist(), rel=1e-6,
                                                                   abs=1e-9)
            assert result['value_spectrum_1'][12:] == pytest.approx([0] * (D - 12), abs=1e-9)  # rank <= T
        if n > 1 and variant == 'resformer_identity':  # what it attends over, V'_n, gives another number
            mixed = torch.stack([eigenvalues_by_hand(per_token(w[n - 1]['attended'], 0))
                                 for w in by_hand]).mean(dim=0)
            assert result['value_eig_max'][n - 1] != pytest.approx(mixed[0].item(), rel=1e-3)
    if variant == 'svformer':
        assert result['value_eig_max'][1:] == pytest.approx([result['value_eig_max'][0]] * 2, rel=1e-6)


def value_metrics(values):
    """paper_metrics for one layer whose own values are values (B, n_kv_head, T, head_dim):
    ({metric: (B,)}, {'value_spectrum_1_rel' and the rest: (B, D)})."""
    B, H, T, _ = values.shape
    attn = torch.full((B, H, T, T), 1 / T)  # any attention: the value metrics do not read it
    per_layer, spectra = analyze_py.paper_metrics(
        {'attn': [attn]}, [Heads(None, None, values, attn, None, None)], transformer=False)
    return {name: m[0] for name, m in per_layer.items()}, spectra


def test_normalised_value_spectra_do_not_see_the_value_norm():
    """The raw eigenvalues scale with the squared value norm; their shares of the trace
    (value_eig_max_rel, value_spectrum_1_rel) and the effective rank do not."""
    torch.manual_seed(0)
    values = torch.randn(3, 2, 12, 8, dtype=torch.float64)  # 3 windows, 12 tokens, 2 KV heads x 8
    metrics, spectra = value_metrics(values)
    scaled, scaled_spectra = value_metrics(3.7 * values)
    assert scaled['value_eig_max'] == pytest.approx(3.7 ** 2 * metrics['value_eig_max'], rel=1e-9)
    for name in ('value_eig_max_rel', 'value_erank'):
        assert scaled[name] == pytest.approx(metrics[name], rel=1e-9), name
    assert scaled_spectra['value_spectrum_1_rel'] == pytest.approx(spectra['value_spectrum_1_rel'],
                                                                   rel=1e-9)
    assert spectra['value_spectrum_1_rel'].sum(dim=-1) == pytest.approx(torch.ones(3), rel=1e-12)
    assert spectra['value_spectrum_1_rel'][:, 0] == pytest.approx(metrics['value_eig_max_rel'], rel=1e-12)
    assert ((0 < metrics['value_eig_max_rel']) & (metrics['value_eig_max_rel'] < 1)).all()
    assert ((1 < metrics['value_erank']) & (metrics['value_erank'] < 12)).all()  # at most the rank


def test_normalised_spectra_of_values_along_one_direction_and_of_isotropic_values():
    torch.manual_seed(0)
    # every token's value: its own scale times one direction (both KV heads' halves of it)
    direction, scales = torch.randn(2, 1, 8), torch.randn(3, 1, 12, 1)
    metrics, spectra = value_metrics(scales * direction)
    assert metrics['value_eig_max_rel'] == pytest.approx(torch.ones(3), rel=1e-9)
    assert metrics['value_erank'] == pytest.approx(torch.ones(3), rel=1e-9)
    assert spectra['value_spectrum_1_rel'][:, 1:] == pytest.approx(torch.zeros(3, 15), abs=1e-12)
    # one KV head, token i's value 5 e_i: (1/T) Σ v v^T = (25/16) I, energy equal in all 16 directions
    metrics, spectra = value_metrics(5 * torch.eye(16)[None, None])
    assert metrics['value_eig_max_rel'].item() == pytest.approx(1 / 16, rel=1e-9)
    assert metrics['value_erank'].item() == pytest.approx(16, rel=1e-9)


def cosine(a, b):
    return (a @ b / (a.norm() * b.norm())).item()


@pytest.mark.parametrize('n_kv_head', [2, 1])
def test_cross_layer_attention_against_its_approximation_and_the_identity_mapping(monkeypatch, n_kv_head):
    """ICLR Fig. 4 on a Transformer: for each layer n >= 2 and m = n - 1, cross-layer attention's output
    (ICLR Eqn. 2: softmax over Q_n [K_n; K_m]^T, each half causal, values [V_n; V_m]) against ½ A_n (V_n +
    V_m) (ICLR Eqn. 4) and A_n V_n + V_m (ICLR Eqn. 6), per token, heads concatenated, before W_O."""
    monkeypatch.setattr(analyze_py, 'device', 'cpu')
    torch.manual_seed(0)
    model = sharpened(GPT(GPTConfig(**TINY, variant='vanilla', n_kv_head=n_kv_head)).eval())
    windows = torch.randint(TINY['vocab_size'], (2, 10))
    with one_thread():
        result = analyze_py.analyze(as_ablation_gpt(model), windows, 'test')
        by_hand = [layers_by_hand(model, w[None]) for w in windows]
    T, H, group = 10, TINY['n_head'], TINY['n_head'] // n_kv_head
    assert math.isnan(result['cross_cos_approx'][0]) and math.isnan(result['cross_cos_identity'][0])
    for n in range(2, TINY['n_layer'] + 1):
        approx, identity = [], []
        for layers in by_hand:
            layer, previous = layers[n - 1], layers[n - 2]
            cross_out, approx_out, identity_out = (torch.zeros(H, T, layer['own'].size(-1)) for _ in range(3))
            for h in range(H):
                q, kv = layer['q'][0, h], h // group
                k_n, v_n = layer['k'][0, kv], layer['own'][0, kv]
                k_m, v_m = previous['k'][0, kv], previous['own'][0, kv]
                for i in range(T):  # token i sees tokens 0..i of both layers, in one softmax
                    scores = torch.cat([k_n[:i + 1] @ q[i], k_m[:i + 1] @ q[i]]) / math.sqrt(q.size(-1))
                    weights = scores.softmax(dim=0)
                    cross_out[h, i] = weights @ torch.cat([v_n[:i + 1], v_m[:i + 1]])
                    a_n = (k_n[:i + 1] @ q[i] / math.sqrt(q.size(-1))).softmax(dim=0)  # row i of A_n
                    approx_out[h, i] = 0.5 * a_n @ (v_n[:i + 1] + v_m[:i + 1])
                    identity_out[h, i] = a_n @ v_n[:i + 1] + v_m[i]
            rows = [per_token(t[None], 0) for t in (cross_out, approx_out, identity_out)]
            approx.append(np.mean([cosine(rows[0][i], rows[1][i]) for i in range(T)]))
            identity.append(np.mean([cosine(rows[0][i], rows[2][i]) for i in range(T)]))
        assert result['cross_cos_approx'][n - 1] == pytest.approx(np.mean(approx), abs=1e-5)
        assert result['cross_cos_identity'][n - 1] == pytest.approx(np.mean(identity), abs=1e-5)
        assert np.mean(approx) < 0.999 and abs(np.mean(approx) - np.mean(identity)) > 1e-3  # they tell apart


def test_cross_layer_cosines_are_left_empty_for_a_model_other_than_a_transformer(monkeypatch):
    monkeypatch.setattr(analyze_py, 'device', 'cpu')
    model = AblationGPT(AblationConfig(**TINY, variant='resformer_identity')).eval()
    with one_thread():
        result = analyze_py.analyze(model, torch.randint(TINY['vocab_size'], (1, 8)), 'test')
    assert all(math.isnan(c) for name in ('cross_cos_approx', 'cross_cos_identity') for c in result[name])


@pytest.mark.parametrize('variant', ['vanilla', 'resformer_identity'])
def test_token_importance_by_position_and_top_k(monkeypatch, variant):
    """ICLR A.2, Figs. 19-21: p_j = the column sums of the head-averaged attention matrix, normalised, per
    position averaged over the sequences (the first 64 positions kept), and the k-th largest p_j of a
    sequence for k = 1, 2, 3, 10 and the top 1% rank (here T = 150: k = 2), per layer."""
    monkeypatch.setattr(analyze_py, 'device', 'cpu')
    torch.manual_seed(0)
    model = sharpened(GPT(GPTConfig(**(TINY | dict(block_size=160)), variant=variant)).eval(), 4.0)
    windows = torch.randint(TINY['vocab_size'], (2, 150))
    with one_thread():
        result = analyze_py.analyze(as_ablation_gpt(model), windows, 'test')
        by_hand = [layers_by_hand(model, w[None]) for w in windows]
    assert np.array(result['importance_by_position']).shape == (TINY['n_layer'], 64)
    for n in range(1, TINY['n_layer'] + 1):
        importances = []
        for layers in by_hand:
            received = layers[n - 1]['attn'][0].mean(dim=0).sum(dim=0)  # column sums, heads averaged
            importances.append((received / received.sum()).tolist())
        ranked = [sorted(p, reverse=True) for p in importances]
        for name, k in [('importance_top1', 1), ('importance_top2', 2), ('importance_top3', 3),
                        ('importance_top10', 10), ('importance_top1pct', 2)]:
            assert result[name][n - 1] == pytest.approx(np.mean([r[k - 1] for r in ranked]), rel=1e-5), name
        assert result['importance_by_position'][n - 1] == pytest.approx(
            np.mean([p[:64] for p in importances], axis=0), rel=1e-5, abs=1e-9)
        # the entropy analyze.py already reports is that of the same distribution
        assert result['entropy'][n - 1] == pytest.approx(
            np.mean([-sum(x * math.log(x) for x in p if x > 0) for p in importances]), rel=1e-5)
    assert result['importance_top1'] != pytest.approx(result['importance_top2'], rel=1e-3)


def test_a_top_k_past_the_sequence_length_is_left_empty(monkeypatch):
    monkeypatch.setattr(analyze_py, 'device', 'cpu')
    model = AblationGPT(AblationConfig(**TINY)).eval()
    with one_thread():
        result = analyze_py.analyze(model, torch.randint(TINY['vocab_size'], (1, 6)), 'test')
    assert all(math.isnan(p) for p in result['importance_top10'])  # 6 tokens
    assert result['importance_top1pct'] == result['importance_top1']  # ceil(6 / 100) = 1
    assert np.array(result['importance_by_position']).shape == (TINY['n_layer'], 6)


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
TRAIN_PY = os.path.join(HERE, 'train.py')


@pytest.fixture(scope='module')
def step0(runs):
    """A vanilla run's step-0 checkpoint, written by train.py --max_iters=0 (ICLR Fig. 1 Left's model at
    initialisation) on the runs' data, in runs/vanilla_step0."""
    result = subprocess.run([sys.executable, TRAIN_PY, f"--dataset={runs / 'data'}", '--max_iters=0',
                             '--variant=vanilla', '--n_layer=3', '--n_head=2', '--n_embd=32', '--block_size=32',
                             '--batch_size=4', '--eval_iters=1', '--device=cpu', '--out_dir=vanilla_step0'],
                            capture_output=True, text=True, cwd=runs, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert result.returncode == 0, result.stderr
    return runs / 'vanilla_step0' / 'ckpt.pt'


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
    assert 'plots skipped' in result.stdout or all(
        os.path.exists(runs / 'results' / png)
        for png in ('entropy.png', 'value_eig_max_rel.png', 'value_spectrum_1_rel.png'))
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

    # the paper's other analyses, in the table, metrics.json and metrics.csv; empty cells are null and ''
    for title in ('ICLR A.2: the k-th largest token importance', 'top-10', 'ICLR Fig. 12: the largest',
                  'cos ½A(Vn+Vm)', "ICLR Fig. 12, layer 1's 32 eigenvalues, largest first: ",
                  "ICLR A.2, the first token's importance by layer: "):
        assert title in result.stdout, title
    resformer = report['groups']['resformer_identity']
    for group in (vanilla, resformer):
        assert len(group['mean']['value_spectrum_1']) == TINY['n_embd']  # n_kv_head x head_dim
        assert np.array(group['mean']['importance_by_position']).shape == (3, 32)
        assert all(len(group['mean'][name]) == 3 for name in analyze_py.TOKEN_IMPORTANCE)
        assert group['mean']['value_eig_max'][0] == group['mean']['value_spectrum_1'][0]
        shares = group['mean']['value_spectrum_1_rel']  # each window's spectrum over its trace, averaged
        assert group['mean']['value_eig_max_rel'][0] == pytest.approx(shares[0]) and sum(shares) == \
            pytest.approx(1)
    assert vanilla['mean']['cross_cos_approx'][0] is None and None not in vanilla['mean']['cross_cos_approx'][1:]
    assert vanilla['std']['cross_cos_identity'][0] is None and len(vanilla['std']['value_spectrum_1']) == 32
    assert resformer['mean']['cross_cos_approx'] == [None] * 3  # ICLR Fig. 4 is of a Transformer
    assert rows[0]['cross_cos_approx'] == '' and float(rows[1]['cross_cos_approx']) == pytest.approx(
        vanilla['mean']['cross_cos_approx'][1])


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


def test_a_step_0_checkpoint_of_train_py_is_analyzed_as_any(runs, step0):
    """ICLR Fig. 1 Left: the model at initialisation beside the trained one. train.py --max_iters=0 writes
    the step-0 checkpoint, whose config names its data by dataset (data/<dataset>; older train.py versions
    also wrote data_dir, which the other checkpoints here give)."""
    assert torch.load(step0, weights_only=True)['iter_num'] == 0
    result = analyze(runs, 'vanilla_step0', 'vanilla_1', '--out=step0')
    assert result.returncode == 0, result.stderr
    with open(runs / 'step0' / 'metrics.json') as f:
        report = json.load(f)
    assert report['data_dir'] == str(runs / 'data')
    [(label, group), (_, trained)] = report['groups'].items()
    assert label.startswith('vanilla (') and 'iter_num=0' in label and group['iter_num'] == 0
    assert f"{label}: 3 layers, iter 0, 1 run(s): vanilla_step0/ckpt.pt" in result.stdout
    windows = np.stack([np.concatenate([load_tokenizer(data.load_meta(str(runs / 'data'))).encode('\n\n'),
                                        data.open_split(str(runs / 'data'), 'val')[0][s:s + 30]])
                        for s in report['offsets']])
    assert group['mean']['entropy'] == pytest.approx(entropies_of(step0, windows), rel=1e-5)
    assert group['mean']['loss'] == pytest.approx(losses_of(step0, windows).mean(), rel=1e-5)
    assert trained['iter_num'] == 20


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
    checkpoint['config'] = dict(checkpoint['config'], max_time=0)
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


def test_a_checkpoint_that_is_a_folder_a_pipe_or_a_device_is_named_as_such(runs):
    """A run folder whose ckpt.pt is a folder or a pipe, or a device given as the checkpoint: it is there,
    but is no checkpoint file (not 'has no ckpt.pt', not 'not found'), and nothing waits on the pipe."""
    (runs / 'ckpt_folder' / 'ckpt.pt').mkdir(parents=True)
    (runs / 'ckpt_fifo').mkdir()
    os.mkfifo(runs / 'ckpt_fifo' / 'ckpt.pt')
    for arg, said in [('ckpt_folder', 'ckpt_folder/ckpt.pt is a folder'), (os.devnull, f'{os.devnull} is a device'),
                      ('ckpt_fifo', 'ckpt_fifo/ckpt.pt is a pipe (FIFO)')]:
        one_line_error(analyze(runs, arg), f'analyze.py: {said}, not a checkpoint file; name training runs')


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


def test_an_out_that_cannot_be_written_is_refused_before_any_computing(runs):
    """A folder that takes no new file (/proc's, which refuses root too) is named at once, not in a
    traceback after every model has run."""
    result = analyze(runs, 'vanilla_1', '--out=/proc/1/analysis')
    one_line_error(result, "out='/proc/1/analysis' cannot be written: /proc/1 refuses a new file")
    assert 'windows of' not in result.stdout


def test_num_seqs_is_bounded_in_one_line(runs):
    one_line_error(analyze(runs, 'vanilla_1', '--num_seqs=100000000'),
                   'num_seqs=100000000, seq_len=256; use 1 to 10,000 sequences of 2 tokens or more')


def test_help_into_a_closed_pipe_ends_quietly():
    result = with_stdout_closed([sys.executable, ANALYZE_PY, '--help'])
    assert (result.returncode, result.stderr) == (0, '')


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
