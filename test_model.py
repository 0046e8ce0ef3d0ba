"""
Tests for model.py (the paper: ResFormer / SVFormer) and ablations.py (its baselines and ablations), CPU only,
a few minutes on one core.

Most checks compare two computations that must agree: a variant against vanilla where the paper says they
coincide, the model against a deliberately naive reference written here from the state_dict alone, and
incremental decoding against the full forward. Tiny models everywhere; float64 where exactness matters.
Layers are numbered from 1 as in the paper (layer n is blocks[n - 1], whose weights are named blocks.{n-1}.*).
"""

import ast
import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ablations as ablations_module
from ablations import (BASELINES, AblationAttention, AblationConfig, AblationGPT, TokenKVCache, ablations,
                       build_model)
from configurator import configure
from model import GPT, VARIANTS, CausalSelfAttention, GPTConfig, KVCache
from vrl import metrics, settings as train_settings
from vrl.optim import configure_optimizers
from vrl.run_folder import load_checkpoint

# tiny tensors: extra threads only add synchronisation (100x slower on a busy machine)
torch.set_num_threads(1)

# ----------------------------------------------------------------------------------------------- helpers

# Named configurations beyond the presets: (variant, extra flags). Every test that loops over "all
# variants" uses this list, so a new preset in VARIANTS is picked up automatically.
EXTRA_CASES = {
    'gqa': dict(n_kv_head=2),
    'mqa': dict(n_kv_head=1),
    'svformer_gqa': dict(variant='svformer', n_head=8, n_kv_head=2),  # n_kv_head = n_head / 4
    'constant_rescaled': dict(variant='resformer_constant', value_rescale=True),
    # hand-picked λ: an SVFormer-style layer with λ1 != 1, mixed rows, a negative weight, with GQA
    'custom_lambdas_gqa': dict(value_residual=True, n_kv_head=2,
                               lambdas=[(0, 1), (0.7, 0), (0.3, 0.9), (-0.4, 1.5)]),
    # value embeddings (nanochat): layers 2 and 4 of 4; with 3 layers also layer 1, whose V1 then carries them
    'value_embeds': dict(value_embeds=True),
    'value_embeds_resformer_gqa': dict(variant='resformer_identity', value_embeds=True, n_kv_head=2),
    'value_embeds_3_layers': dict(variant='resformer_identity', value_embeds=True, n_layer=3),
    # the bank of values (BoV): layers 3 and 4 of 4 look their values up; with ResFormer, with an SVFormer
    # layer below the bank and hand-picked λ, with shared keys, and with the residual's source inside the
    # bank (layer 3, an anchor: layer 4 mixes in layer 3's looked-up values)
    'value_bank': dict(value_bank=True),
    'value_bank_resformer_gqa': dict(variant='resformer_identity', value_bank=True, n_kv_head=2),
    'value_bank_after_svformer_gqa': dict(value_residual=True, value_bank=True, n_kv_head=2,
                                          lambdas=[(0, 1), (1, 0), (0.7, 0.6), (-0.4, 1.5)]),
    'value_bank_share_k': dict(variant='share_k', value_bank=True),
    'value_bank_source_in_bank': dict(value_residual=True, anchors=(3,), value_bank=True,
                                      lambdas=[(0, 1), (0.5, 0.5), (0, 1), (0.5, 0.5)]),
}
# The Sec. 4.4 ablations, with hand-picked λ rows (so a swapped
# λ1/λ2 or a wrong source shows) and GQA where it applies.
MIXED = [(0, 1), (0.7, 0.6), (0.3, 0.9), (-0.4, 1.5)]
ABLATION_CASES = {
    'source_v2': dict(variant='resformer_identity', residual_from='second'),
    'source_v2_svformer': dict(variant='svformer', residual_from='second', n_kv_head=2),
    'source_v2_learnable_plus': dict(variant='resformer_learnable_plus', residual_from='second'),
    'query_residual': dict(value_residual=True, residual_type='query', lambdas=MIXED, n_kv_head=2),
    'key_residual': dict(value_residual=True, residual_type='key', lambdas=MIXED, n_kv_head=2),
    'attention_residual': dict(value_residual=True, residual_type='attention', lambdas=MIXED, n_kv_head=2),
    'attention_residual_v2': dict(variant='resformer_identity', residual_type='attention',
                                  residual_from='second'),
    'mapping_first': dict(value_residual=True, value_mapping='first', lambdas=MIXED, n_kv_head=2),
    'mapping_first_rescaled': dict(variant='resformer_constant', value_mapping='first', value_rescale=True),
    'mapping_identity': dict(value_residual=True, value_mapping='identity', n_kv_head=2),  # Eqn. 6: no λ
    'mapping_identity_bank': dict(variant='resformer_identity', value_mapping='identity', value_bank=True),
    'v2_source_no_h0_residual': dict(variant='resformer_identity', residual_from='second', h0_residual=False),
    'hidden_h0': dict(value_residual=True, residual_type='hidden', lambdas=MIXED),
    'hidden_h1': dict(variant='resformer_identity', residual_type='hidden', residual_from='second'),
    'learnable_key_residual': dict(variant='resformer_learnable', residual_type='key'),
    'neutreno_v2': dict(variant='neutreno', residual_from='second'),
    # cross-layer attention (ICLR Eqn. 2): one softmax over [K_n; K_1], values [V_n; V_1]; no λ
    'mapping_cross': dict(variant='resformer_identity', value_mapping='cross'),
    'mapping_cross_gqa': dict(value_residual=True, value_mapping='cross', n_kv_head=2),
    # whose values λ1 weighs: V_{n-1}, the mean of V_1 .. V_{n-1}, or Dense-ResFormer's learned Σ w_i V_i
    'source_adjacent': dict(value_residual=True, residual_from='adjacent', lambdas=MIXED, n_kv_head=2),
    'source_previous': dict(value_residual=True, residual_from='previous', lambdas=MIXED),
    'source_dense': dict(value_residual=True, residual_from='dense'),
    'source_dense_gqa': dict(variant='resformer_identity', residual_from='dense', n_kv_head=2),
    # SVFormer's anchors (ICLR Fig. 17): layers 4 and 6 of 6 keep their values, layer 5 reads layer 4's
    'svformer_anchors': dict(variant='svformer', anchors=(4, 6), n_layer=6),
    'resformer_anchor_gqa': dict(value_residual=True, lambdas=[(0, 1), (0.7, 0.6), (0, 1), (-0.4, 1.5)],
                                 anchors=(3,), n_kv_head=2),
    # layer 1's queries or keys in every layer (ICLR Sec. 4.8), as SVFormer's values
    'shared_query': dict(variant='shared_query'),
    'shared_key_gqa': dict(variant='shared_key', n_kv_head=2),
    # GPT-2's blocks (ICLR Fig. 15c)
    'gpt2': dict(backbone='gpt2'),
    'gpt2_svformer_gqa': dict(variant='svformer', backbone='gpt2', n_kv_head=2),
    'gpt2_resformer_mapping_first': dict(value_residual=True, backbone='gpt2', value_mapping='first',
                                         lambdas=MIXED),
}
ALL_CASES = {name: dict(variant=name) for name in VARIANTS | BASELINES} | EXTRA_CASES | ABLATION_CASES
def round_trip_params(cases):
    """The cases, every one of which survives asdict -> AblationConfig (how a checkpoint is read back):
    the baselines that set their own λ and SVFormer's anchors included."""
    return list(cases)


def tiny_config(**kw):
    """A 4-layer, 32-wide, 4-head model over a 64-token vocabulary; keyword arguments override."""
    args = dict(n_layer=4, n_head=4, n_embd=32, vocab_size=64, block_size=16)
    return AblationConfig(**(args | kw))


def tiny_model(seed=0, dtype=torch.float64, **kw):
    """A tiny model (build_model: GPT, or AblationGPT for an ablation) with sharpened random weights (see
    `sharpen`), in eval mode."""
    torch.manual_seed(seed)
    model = build_model(tiny_config(**kw)).to(dtype)
    sharpen(model, seed)
    return model.eval()


@torch.no_grad()
def sharpen(model, seed=0):
    """Replace the 0.02-std init by larger random weights, random norm gains and perturbed λ / DenseFormer
    α / Dense-ResFormer weights / biases. At the paper's init attention is nearly uniform and a masking or
    mixing bug barely moves the logits; with these weights the same bug moves them by O(1)."""
    g = torch.Generator().manual_seed(seed + 1000)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if name.endswith('wte.weight') or name.endswith('lm_head.weight'):
            p.copy_(noise)
        elif p.dim() == 2:
            p.copy_(noise / math.sqrt(p.size(1)) * 1.5)
        elif 'norm' in name:
            p.copy_(1 + 0.2 * noise)
        else:  # λ parameters, DenseFormer α, Dense-ResFormer w, biases: keep their init, nudge them
            p.add_(0.1 * noise)


def random_tokens(model, B=2, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(model.config.vocab_size, (B, T), generator=g)


def logits_of(model, idx, **kw):
    with torch.no_grad():
        return model(idx, **kw)


def trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def cache_nbytes(cache):
    """Bytes a KV cache holds: its K and V tensors, and the token ids a TokenKVCache keeps for a bank."""
    tensors = [t for t in cache.k + cache.v if t is not None]
    if getattr(cache, 'tokens', None) is not None:
        tensors.append(cache.tokens)
    return sum(t.numel() * t.element_size() for t in tensors)


# ------------------------------------------------------------------------- naive reference forward pass

def naive_forward(state, cfg, idx):
    """Logits of `cfg`'s model with weights `state`, written from the paper's formulas with explicit loops
    over layers and heads and nothing from model.py or ablations.py. Supports fixed λ (value residual,
    SVFormer and its anchors, rescaling), the Sec. 4.4 ablations (source layer: first, second, adjacent,
    previous, dense; query/key/attention-matrix/hidden residual; mapping by the source's attention, by none,
    or cross-layer attention), layer 1's shared queries or keys, NeuTRENO, GQA/MQA, cross-layer K/V sharing,
    value embeddings, the bank of values and GPT-2's blocks; not DenseFormer or learnable λ."""
    assert not cfg.denseformer and cfg.lambda_mode == 'fixed'
    W = {k: v.to(torch.float64) for k, v in state.items()}
    B, T = idx.shape
    d, H, H_kv, L = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.n_layer
    hd = d // H
    group = H // H_kv
    s = 2 if cfg.residual_from == 'second' else 1   # layers up to s mix nothing in
    kind = cfg.residual_type if cfg.value_residual else None
    gpt2 = cfg.backbone == 'gpt2'

    def norm(x, p):  # RMSNorm (Llama), or LayerNorm with a bias (GPT-2)
        if gpt2:
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(var + cfg.norm_eps) * W[p + '.weight'] + W[p + '.bias']
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * W[p + '.weight']

    def linear(x, p):  # x W^T (+ b: GPT-2's projections have biases)
        y = x @ W[p + '.weight'].T
        return y + W[p + '.bias'] if p + '.bias' in W else y

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    # rotate-half RoPE: pair dimension i with i + hd/2, rotate by angle t * theta^(-2i/hd); GPT-2: none
    inv_freq = torch.tensor([cfg.rope_theta ** (-2 * i / hd) for i in range(hd // 2)], dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, hd/2)
    cos, sin = torch.cos(angle), torch.sin(angle)

    def rope(x):  # x: (B, T, hd)
        if gpt2:
            return x
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def heads(x, n):  # (B, T, n*hd) -> list of n tensors (B, T, hd)
        return [x[..., j * hd:(j + 1) * hd] for j in range(n)]

    def mix(lam, first, own):  # λ1·first + λ2·own, per head
        return [lam[0] * f + lam[1] * o for f, o in zip(first, own)]

    def softmax(scores):
        probs = torch.exp(scores - scores.max(-1, keepdim=True).values)
        return probs / probs.sum(-1, keepdim=True)

    def masked_scores(q, k):
        return (q @ k.transpose(1, 2) / math.sqrt(hd)).masked_fill(~causal, float('-inf'))

    x = W['wte.weight'][idx]
    if gpt2:                                               # learned positions
        x = x + W['wpe.weight'][:T]
    done = {}          # layer n -> its raw Q, K (before RoPE), K (after), attended V, probabilities, outputs
    own = []           # V_1 .. V_{n-1}: every earlier layer's own values (before any mixing), per KV head
    H_s = None
    for n in range(1, L + 1):
        p = f'blocks.{n - 1}.'
        lam = cfg.lambdas[n - 1] if cfg.value_residual else (0.0, 1.0)
        if cfg.value_rescale:
            lam = (lam[0] / (lam[0] + lam[1]), lam[1] / (lam[0] + lam[1]))
        mixing = kind is not None and n > s
        # the source layer: layer 2 ('second'), else layer 1 or the last anchor below n
        source = s if cfg.residual_from == 'second' else max([1] + [a for a in cfg.anchors if a < n])
        src = done.get(source)
        if n == s:
            H_s = x                                        # H_s: block s's input (H0 = the embedding)
        h = norm(x, p + 'norm_attn')
        if mixing and kind == 'hidden':                    # attention input λ1 norm(H_s) + λ2 norm(x_n)
            h = lam[0] * norm(H_s, p + 'norm_attn') + lam[1] * h
        # queries: own projection (maybe mixed with the source's), or the source's alone (shared_query)
        if p + 'attn.c_q.weight' in W:
            Q = heads(linear(h, p + 'attn.c_q'), H)
            if mixing and kind == 'query':
                Q = mix(lam, src['Q'], Q)
        else:
            assert mixing and kind == 'query' and lam[1] == 0
            Q = [lam[0] * q for q in src['Q']]
        # keys: own projection, the previous layer's (CLA / share-K pairs (1, 2), (3, 4), ...), or the source's
        if p + 'attn.c_k.weight' in W:
            K_raw = heads(linear(h, p + 'attn.c_k'), H_kv)
            if mixing and kind == 'key':
                K_raw = mix(lam, src['K'], K_raw)
        elif cfg.share_kv in ('k', 'kv') and n % 2 == 0:
            K_raw = done[n - 1]['K']
        else:
            assert mixing and kind == 'key' and lam[1] == 0
            K_raw = [lam[0] * k for k in src['K']]
        K = [rope(k) for k in K_raw]
        # values: the layer's own V_n, then V'_n = λ1·(what it mixes in) + λ2·V_n per KV head
        if p + 'attn.bank.weight' in W:                    # a bank of values: V_n = γ_v E_n[token], no W_V
            assert p + 'attn.c_v.weight' not in W
            Vn = heads(W[p + 'attn.gamma_v'] * W[p + 'attn.bank.weight'][idx], H_kv)
        elif p + 'attn.c_v.weight' in W:
            Vn = heads(linear(h, p + 'attn.c_v'), H_kv)
            if p + 'attn.value_embed.weight' in W:         # V_n += 3σ(x[:12] W_g) E_n[token], a gate per KV head
                gate = 3 * torch.sigmoid(h[..., :12] @ W[p + 'attn.ve_gate.weight'].T)
                table = heads(W[p + 'attn.value_embed.weight'][idx], H_kv)
                Vn = [v + gate[..., j:j + 1] * e for j, (v, e) in enumerate(zip(Vn, table))]
        else:
            Vn = None
        if cfg.residual_from == 'adjacent' and n > 1:
            mixed_in = own[-1]                             # V_{n-1}
        elif cfg.residual_from == 'previous' and n > 1:
            mixed_in = [sum(v[j] for v in own) / len(own) for j in range(H_kv)]  # mean of V_1 .. V_{n-1}
        else:
            mixed_in = src and src['V']                    # the source's values
        mixes_values = mixing and kind == 'value' and cfg.value_mapping == 'current' and n not in cfg.anchors
        if Vn is None and cfg.share_kv in ('v', 'kv') and n % 2 == 0:
            V = done[n - 1]['V']
        elif Vn is None:                                   # SVFormer: the source's values, weighted by λ1
            assert mixes_values and lam[1] == 0
            V = [lam[0] * v for v in src['V']]
        elif cfg.residual_from == 'dense' and mixes_values:  # Dense-ResFormer: Σ_{i<=n} w_{n,i} V_i
            w = W[p + 'attn.dense']
            assert w.shape == (n,)
            V = [sum(w[i] * vi[j] for i, vi in enumerate(own + [Vn])) for j in range(H_kv)]
        elif mixes_values:
            V = mix(lam, mixed_in, Vn)
        else:
            V = Vn
        cross = mixing and kind == 'value' and cfg.value_mapping == 'cross'
        outs, probs_all = [], []
        for i in range(H):
            j = i // group                                   # query head i reads KV head j
            q = rope(Q[i])
            scores = masked_scores(q, K[j])                  # (B, T, T)
            if cross:  # ICLR Eqn. 2: one softmax over [K_n; K_1], each half causal, values [V_n; V_1]
                probs = softmax(torch.cat([scores, masked_scores(q, done[1]['K_rope'][j])], dim=-1))
                u = probs[..., :T] @ V[j] + probs[..., T:] @ done[1]['V'][j]
            else:
                probs = softmax(scores)
                if mixing and kind == 'attention':
                    probs = lam[0] * src['A'][i] + lam[1] * probs
                u = probs @ V[j]
            if mixing and kind == 'value' and cfg.value_mapping == 'first':
                u = lam[0] * src['U'][i] + lam[1] * u          # λ1 A_s V_s + λ2 A_n V_n
            if mixing and kind == 'value' and cfg.value_mapping == 'identity':
                u = u + sum(v[j] for v in own) / (n - 1)       # Eqn. 6: A_n V_n + 1/(n-1) Σ_{i<n} V_i
            if cfg.neutreno_lambda and n > s:                  # NeuTRENO: U_n += λ (V_s - V'_n)
                u = u + cfg.neutreno_lambda * (src['V'][j] - V[j])
            probs_all.append(probs)
            outs.append(u)
        done[n] = dict(Q=Q, K=K_raw, K_rope=K, V=V, A=probs_all, U=outs)
        own.append(Vn)
        x = (x if n > 1 or cfg.h0_residual else 0) + linear(torch.cat(outs, dim=-1), p + 'attn.c_proj')
        h = norm(x, p + 'norm_mlp')
        if gpt2:                                           # GELU MLP with biases
            x = x + linear(gelu_tanh(linear(h, p + 'mlp.c_fc')), p + 'mlp.c_proj')
        else:                                              # SwiGLU
            gate, up = linear(h, p + 'mlp.c_gate'), linear(h, p + 'mlp.c_up')
            x = x + linear(gate * torch.sigmoid(gate) * up, p + 'mlp.c_down')
    return norm(x, 'norm_f') @ W['lm_head.weight'].T


# ---------------------------------------------------------------------------------- build, loss, grads

@pytest.mark.parametrize('case', ALL_CASES)
def test_every_variant_trains_and_every_parameter_gets_a_gradient(case):
    """Each preset, baseline and ablation builds, gives a finite loss, and backward reaches every trainable
    parameter with a finite gradient (DDP fails on unused parameters)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(**ALL_CASES[case]))
    idx = random_tokens(model, T=16)
    assert model(idx).shape == (2, 16, model.config.vocab_size)
    loss = model(idx, targets=idx.roll(-1, dims=1))
    assert loss.dim() == 0  # given targets, the loss alone
    assert torch.isfinite(loss) and abs(loss.item() - math.log(64)) < 1.0  # near-uniform at init
    loss.backward()
    for name, p in trainable(model):
        assert p.grad is not None, f'{name} gets no gradient'
        assert torch.isfinite(p.grad).all(), f'{name} has a non-finite gradient'


@pytest.mark.parametrize('case', round_trip_params(ALL_CASES))
def test_config_round_trips_through_asdict(case):
    """Checkpoints store dataclasses.asdict(config) and rebuild with AblationConfig(**args): that must be
    exact. A paper-only config also round-trips through model.py's GPTConfig."""
    cfg = tiny_config(**ALL_CASES[case])
    assert AblationConfig(**dataclasses.asdict(cfg)) == cfg
    if not ablations(cfg):
        paper = GPTConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(GPTConfig)})
        assert GPTConfig(**dataclasses.asdict(paper)) == paper and paper.lambdas == cfg.lambdas


def test_model_py_holds_the_paper_fields_and_ablations_py_the_rest():
    """GPTConfig has the paper's fields only (no tie_embeddings, no value_rescale); AblationConfig adds the
    ablations' fields, and ablations(config) lists those set away from their defaults."""
    paper = {f.name for f in dataclasses.fields(GPTConfig)}
    assert paper == {'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'ffn_hidden',
                     'rope_theta', 'norm_eps', 'dropout', 'variant', 'value_residual', 'lambdas',
                     'lambda_mode'}
    extra = {f.name for f in dataclasses.fields(AblationConfig)} - paper
    assert extra == {'residual_from', 'residual_type', 'value_mapping', 'value_rescale', 'anchors',
                     'h0_residual', 'neutreno_lambda', 'denseformer', 'share_kv', 'backbone', 'value_embeds',
                     'value_bank',
                     # the value residual's successors (tests/test_successors.py)
                     'value_gate', 'value_gate_last_k', 'value_gate_static', 'attn_res',
                     'attn_res_block', 'depth_attention', 'hyper_connections', 'hc_rate', 'hc_dynamic',
                     'muddformer'}
    assert ablations(tiny_config(variant='svformer')) == []
    assert ablations(tiny_config(variant='cla')) == ['share_kv']
    assert set(ablations(tiny_config(variant='shared_key', backbone='gpt2'))) == {'residual_type', 'backbone'}


# ------------------------------------------------------------------ exact equivalences with vanilla

def test_value_residual_with_lambda_0_1_is_exactly_vanilla():
    """ResFormer with λ = (0, 1) in every layer is the vanilla Transformer: same parameters, same logits."""
    vanilla = tiny_model(variant='vanilla')
    resformer = build_model(tiny_config(value_residual=True, lambdas=[(0, 1)] * 4)).double().eval()
    resformer.load_state_dict(vanilla.state_dict())  # strict: no extra parameters
    idx = random_tokens(vanilla)
    assert torch.equal(logits_of(resformer, idx), logits_of(vanilla, idx))
    # ...and the value residual is not a no-op: Identity ResFormer on the same weights differs
    identity = build_model(tiny_config(variant='resformer_identity')).double().eval()
    identity.load_state_dict(vanilla.state_dict())
    assert (logits_of(identity, idx) - logits_of(vanilla, idx)).abs().max() > 1e-2


def test_ablation_flags_default_to_the_paper():
    """residual_from='first', residual_type='value', value_mapping='current', no anchors, the Llama backbone
    are the paper's ResFormer: the defaults, and they build the paper's GPT."""
    cfg = tiny_config(variant='resformer_identity', residual_from='first', residual_type='value',
                      value_mapping='current', anchors=(), backbone='llama', value_rescale=False)
    assert cfg == tiny_config(variant='resformer_identity') and ablations(cfg) == []
    assert type(build_model(cfg)) is GPT


@pytest.mark.parametrize('flags', [
    dict(residual_type='query'), dict(residual_type='key'), dict(residual_type='attention'),
    dict(residual_type='hidden'), dict(value_mapping='first'), dict(residual_from='second', residual_type='key'),
    dict(residual_from='second', residual_type='hidden'), dict(residual_from='adjacent'),
    dict(residual_from='previous'), dict(value_rescale=True),
], ids=str)
def test_every_residual_with_lambda_0_1_is_vanilla(flags):
    """Each Sec. 4.4 residual with λ = (0, 1) everywhere adds no parameters and is the vanilla Transformer:
    exactly, or to float64 rounding for the attention matrix (an explicit softmax instead of SDPA)."""
    vanilla = tiny_model(variant='vanilla')
    model = build_model(tiny_config(value_residual=True, lambdas=[(0, 1)] * 4, **flags)).double().eval()
    assert type(model) is AblationGPT
    model.load_state_dict(vanilla.state_dict())  # strict: no extra parameters
    idx = random_tokens(vanilla)
    if flags.get('residual_type') == 'attention':
        torch.testing.assert_close(logits_of(model, idx), logits_of(vanilla, idx), rtol=0, atol=1e-12)
    else:
        assert torch.equal(logits_of(model, idx), logits_of(vanilla, idx))


def test_neutreno_with_lambda_0_is_exactly_vanilla():
    """NeuTRENO adds no parameters, and with λ = 0 its term vanishes: logits equal vanilla's exactly."""
    vanilla = tiny_model(variant='vanilla')
    neutreno = build_model(tiny_config(variant='neutreno')).double().eval()
    neutreno.load_state_dict(vanilla.state_dict())  # strict
    idx = random_tokens(vanilla)
    assert (logits_of(neutreno, idx) - logits_of(vanilla, idx)).abs().max() > 1e-2  # λ = 0.4 does something
    for block in neutreno.blocks:
        block.attn.neutreno_lambda = 0.0
    assert torch.equal(logits_of(neutreno, idx), logits_of(vanilla, idx))


def test_denseformer_at_init_is_exactly_vanilla():
    """DenseFormer's α starts at the identity (weight 1 on the current block): the same model as vanilla,
    plus only the dwa parameters."""
    vanilla = tiny_model(variant='vanilla')
    torch.manual_seed(0)
    dense = build_model(tiny_config(variant='denseformer')).double().eval()
    result = dense.load_state_dict(vanilla.state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(k.startswith('dwa.') for k in result.missing_keys)
    assert len(result.missing_keys) == 4
    idx = random_tokens(vanilla)
    assert torch.equal(logits_of(dense, idx), logits_of(vanilla, idx))
    with torch.no_grad():
        dense.dwa[2][0] += 0.5  # mixing in the embedding changes the output
    assert (logits_of(dense, idx) - logits_of(vanilla, idx)).abs().max() > 1e-2


def test_dense_resformer_at_init_is_identity_resformer():
    """Dense-ResFormer's weights on V_1 .. V_n start at Identity's 0.5 V1 + 0.5 V_n (zero on V_2 .. V_{n-1}),
    so at init, on the same other weights, it computes what resformer_identity does; its only extra
    parameters are those weights, n of them in layer n > 1. Moving a weight on a middle layer's V_i changes it."""
    identity = tiny_model(variant='resformer_identity')
    dense = build_model(tiny_config(value_residual=True, residual_from='dense')).double().eval()
    result = dense.load_state_dict(identity.state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert sorted(result.missing_keys) == [f'blocks.{n - 1}.attn.dense' for n in (2, 3, 4)]
    assert dense.blocks[0].attn.dense is None
    for n in (2, 3, 4):
        assert dense.blocks[n - 1].attn.dense.tolist() == [0.5] + [0.0] * (n - 2) + [0.5]
    idx = random_tokens(identity)
    torch.testing.assert_close(logits_of(dense, idx), logits_of(identity, idx), rtol=0, atol=1e-6)
    with torch.no_grad():
        dense.blocks[3].attn.dense[1] += 0.5  # layer 4 mixes in V_2 too
    assert (logits_of(dense, idx) - logits_of(identity, idx)).abs().max() > 1e-2


def test_gqa_with_n_kv_head_equal_n_head_is_mha():
    """n_kv_head = n_head is plain multi-head attention: same config, same parameters, same logits."""
    assert tiny_config(n_kv_head=4) == tiny_config()
    mha = tiny_model()
    gqa = build_model(tiny_config(n_kv_head=4)).double().eval()
    gqa.load_state_dict(mha.state_dict())
    idx = random_tokens(mha)
    assert torch.equal(logits_of(gqa, idx), logits_of(mha, idx))


def repeat_kv_heads(weight, n_kv_head, group):
    """(n_kv_head*hd, d) K or V projection -> (n_kv_head*group*hd, d),
    each KV head's rows repeated group times."""
    hd = weight.size(0) // n_kv_head
    return weight.view(n_kv_head, hd, -1).repeat_interleave(group, dim=0).reshape(n_kv_head * group * hd, -1)


@pytest.mark.parametrize('variant', ['custom', 'svformer', 'resformer_identity'])
def test_gqa_equals_mha_with_repeated_kv_heads(variant):
    """GQA (2 KV heads for 4 query heads) is MHA whose K/V heads are copies, query head h reading KV head
    h // 2. With the value residual too: V1 is mixed per KV head, which commutes with the repetition."""
    gqa = tiny_model(variant=variant, n_kv_head=2)
    mha = build_model(tiny_config(variant=variant)).double().eval()
    state = {k: (repeat_kv_heads(v, 2, 2) if ('c_k' in k or 'c_v' in k) else v)
             for k, v in gqa.state_dict().items()}
    mha.load_state_dict(state)
    idx = random_tokens(gqa)
    torch.testing.assert_close(logits_of(mha, idx), logits_of(gqa, idx), rtol=0, atol=1e-10)
    # a wrong grouping (head h reading KV head h % 2) must not match
    wrong = {k: (v.view(2, 8, -1).repeat(2, 1, 1).reshape(32, -1) if ('c_k' in k or 'c_v' in k) else v)
             for k, v in gqa.state_dict().items()}
    mha.load_state_dict(wrong)
    assert (logits_of(mha, idx) - logits_of(gqa, idx)).abs().max() > 1e-2


# -------------------------------------------------------------------------- naive reference comparison

REFERENCE_CASES = {
    'vanilla': dict(variant='vanilla'),
    'resformer_identity': dict(variant='resformer_identity'),
    'resformer_constant_rescaled': dict(variant='resformer_constant', value_rescale=True),
    'resformer_sparse_8': dict(variant='resformer_sparse', n_layer=8),
    'svformer': dict(variant='svformer'),
    'svformer_gqa': dict(variant='svformer', n_head=8, n_kv_head=2),
    'resformer_mqa': dict(variant='resformer_identity', n_kv_head=1),
    'neutreno': dict(variant='neutreno'),
    'neutreno_resformer': dict(variant='neutreno_resformer'),
    'cla': dict(variant='cla'),
    'share_k': dict(variant='share_k'),
    'share_v': dict(variant='share_v'),
    'svformer_share_k': dict(variant='svformer', share_kv='k'),
    'custom_lambdas_gqa': EXTRA_CASES['custom_lambdas_gqa'],
    'value_embeds_resformer_gqa': EXTRA_CASES['value_embeds_resformer_gqa'],
    'value_embeds_3_layers': EXTRA_CASES['value_embeds_3_layers'],
    'shared_key_custom_lambda': dict(value_residual=True, residual_type='key',
                                     lambdas=[(0, 1), (0.7, 0), (1.3, 0), (-0.4, 0)]),
} | {name: kw for name, kw in EXTRA_CASES.items() if name.startswith('value_bank')} | {
    name: kw for name, kw in ABLATION_CASES.items() if kw.get('variant') not in VARIANTS or
    VARIANTS[kw['variant']].get('lambda_mode', 'fixed') == 'fixed'}


@pytest.mark.parametrize('case', REFERENCE_CASES)
def test_matches_naive_reference(case):
    """The model equals a loop-over-layers-and-heads implementation of the paper's equations (float64)."""
    model = tiny_model(**REFERENCE_CASES[case])
    idx = random_tokens(model, T=16)
    expected = naive_forward(model.state_dict(), model.config, idx)
    torch.testing.assert_close(logits_of(model, idx), expected, rtol=0, atol=1e-5)


def test_naive_reference_is_sensitive_to_the_value_residual():
    """Guard for the test above: the reference does tell Identity ResFormer, SVFormer and vanilla apart."""
    model = tiny_model(variant='resformer_identity')
    idx = random_tokens(model)
    as_identity = naive_forward(model.state_dict(), model.config, idx)
    as_vanilla = naive_forward(model.state_dict(), tiny_config(variant='vanilla'), idx)
    assert (as_identity - as_vanilla).abs().max() > 1e-2


def paper_of(cfg):
    """cfg with its ablation of what the value residual mixes undone: the paper's ResFormer from layer 1 on
    the same λ table (anchors: their rows stay (0, 1), but they no longer feed the layers above them)."""
    return dataclasses.replace(cfg, variant='custom', residual_from='first', residual_type='value',
                               value_mapping='current', anchors=())


@pytest.mark.parametrize('case', [c for c in ABLATION_CASES if c in REFERENCE_CASES
                                  and not c.startswith(('gpt2', 'shared_'))])
def test_each_ablation_flag_changes_the_model(case):
    """Guard for the reference comparison: on the same weights and λ, the ablation (other source layer, other
    residual type, other mapping, anchors) gives different logits from the paper's value residual from
    layer 1. (shared_* and GPT-2 have other weights than the paper's: see their own tests.)"""
    model = tiny_model(**ABLATION_CASES[case])
    cfg = model.config
    idx = random_tokens(model)
    ablation, as_paper = (naive_forward(model.state_dict(), cfg, idx),
                          naive_forward(model.state_dict(), paper_of(cfg), idx))
    assert (ablation - as_paper).abs().max() > 1e-2


def test_fast_attention_kernel_for_every_preset(monkeypatch):
    """Only the attention-matrix residual (and analysis) computes A explicitly; every named variant and every
    other residual (cross-layer attention included) keeps SDPA's fused path."""
    def explicit(*args):
        raise AssertionError('explicit softmax on the training path')
    monkeypatch.setattr(ablations_module, 'attention_probs', explicit)
    for name, kw in ALL_CASES.items():
        if kw.get('residual_type') != 'attention':
            model = build_model(tiny_config(**kw))
            model(random_tokens(model))


# ------------------------------------------------------------------------ V1 gradient and SVFormer layout

@pytest.mark.parametrize('variant', ['resformer_identity', 'svformer', 'neutreno'])
def test_later_layers_train_layer_1_value_projection(variant):
    """V1 is not detached. With layer 1's output projection zeroed, layer 1's own attention cannot reach the
    loss, so any gradient on its W_V must come from later layers reading V1. Vanilla gets exactly zero."""
    def w_v_grad(variant):
        model = tiny_model(variant=variant)
        with torch.no_grad():
            model.blocks[0].attn.c_proj.weight.zero_()
        idx = random_tokens(model)
        model(idx, targets=idx.roll(-1, dims=1)).backward()
        return model.blocks[0].attn.c_v.weight.grad

    assert w_v_grad('vanilla').abs().max() == 0
    assert w_v_grad(variant).abs().max() > 1e-4


def test_svformer_has_value_projection_in_layer_1_only():
    """SVFormer: layers n > 1 have no W_V at all (U_n = A_n V1); layer 1 keeps its own."""
    model = build_model(tiny_config(variant='svformer'))
    assert type(model) is GPT
    keys = model.state_dict().keys()
    assert model.blocks[0].attn.c_v is not None and 'blocks.0.attn.c_v.weight' in keys
    for n in range(2, 5):
        assert model.blocks[n - 1].attn.c_v is None
        assert not any(k.startswith(f'blocks.{n - 1}.') and 'c_v' in k for k in keys)
    d = 32
    assert model.num_params() == build_model(tiny_config(variant='vanilla')).num_params() - 3 * d * d


def test_learnable_svformer_init_keeps_value_projections():
    """Only a *fixed* zero weight on V_n removes W_V; a learnable λ may move away from zero and needs it."""
    model = build_model(tiny_config(value_residual=True, lambda_mode='learnable',
                                    lambdas=[(0, 1)] + [(1, 0)] * 3))
    assert all(block.attn.c_v is not None for block in model.blocks)


def test_svformer_anchors_keep_their_values_and_feed_the_layers_above():
    """SVFormer with anchors (4, 6) at 6 layers (ICLR Fig. 17): layers 4 and 6 have their own W_V and λ row
    (0, 1); layers 2, 3 and 5 have no W_V; the KV cache holds values for layers 1, 4 and 6 only; layers 2-3
    attend over V1 and layer 5 over layer 4's values."""
    model = tiny_model(variant='svformer', anchors=(4, 6), n_layer=6)
    assert type(model) is AblationGPT and model.config.anchors == (4, 6)
    assert [block.attn.c_v is not None for block in model.blocks] == [True, False, False, True, False, True]
    rows = [(0.0, 1.0), (1.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 0.0), (0.0, 1.0)]
    assert model.config.lambdas == tuple(rows) and model.lambdas.tolist() == [list(r) for r in rows]
    assert model.kv_slots == (6, 3)
    assert [getattr(block.attn, 'v_slot', None) for block in model.blocks] == [0, None, None, 1, None, 2]
    idx = random_tokens(model, T=8)
    cache = model.new_kv_cache(16)
    logits_of(model, idx, kv_cache=cache)
    assert len(cache.v) == 3 and all(v is not None for v in cache.v) and len(cache.k) == 6
    stats = {}
    logits_of(model, idx, stats=stats)
    values = stats['values']  # what each layer attends over
    assert torch.equal(values[1], values[0]) and torch.equal(values[2], values[0])
    assert torch.equal(values[4], values[3])                   # layer 5 reads layer 4's values
    assert (values[4] - values[0]).abs().max() > 1e-2           # ...not V1's
    assert (values[3] - values[0]).abs().max() > 1e-2 and (values[5] - values[3]).abs().max() > 1e-2
    # with the cache, layer 5 reads every cached position of layer 4's values (cache slot 1)
    torch.testing.assert_close(cache.v[1][:, :, :8], values[3], rtol=0, atol=1e-12)
    # an anchor's values are its own: one fewer W_V per anchor than SVFormer
    plain = build_model(tiny_config(variant='svformer', n_layer=6))
    assert model.num_params() == plain.num_params() + 2 * 32 * 32


@pytest.mark.parametrize('variant, shared', [('shared_query', 'c_q'), ('shared_key', 'c_k')])
def test_shared_query_and_key_drop_the_projection_after_layer_1(variant, shared):
    """shared_query / shared_key (ICLR Sec. 4.8): λ rows (1, 0) after layer 1, no W_Q (W_K) after layer 1,
    the other projections everywhere; shared_key's cache holds keys for layer 1 only (all values), and the
    model uses layer 1's Q (K) in every layer: rebuilding every layer's Q (K) from layer 1's projection of
    layer 1's input, in a reference that uses no shared projection, gives the same logits."""
    model = tiny_model(variant=variant)
    cfg = model.config
    assert cfg.lambdas == ((0.0, 1.0),) + ((1.0, 0.0),) * 3
    assert [getattr(block.attn, shared) is not None for block in model.blocks] == [True, False, False, False]
    for other in {'c_q', 'c_k', 'c_v'} - {shared}:
        assert all(getattr(block.attn, other) is not None for block in model.blocks)
    cache = model.new_kv_cache(16)
    logits_of(model, random_tokens(model, T=5), kv_cache=cache)
    if variant == 'shared_key':
        assert model.kv_slots == (1, 4) and len(cache.k) == 1 and len(cache.v) == 4
    else:
        assert model.kv_slots == (4, 4)
    # the naive reference, and a hand-made one: record layer 1's projection of its input with a hook and
    # feed it to every later layer through a vanilla GPT whose own projection returns it
    idx = random_tokens(model)
    torch.testing.assert_close(logits_of(model, idx), naive_forward(model.state_dict(), cfg, idx),
                               rtol=0, atol=1e-5)
    vanilla = build_model(tiny_config()).double().eval()
    state = model.state_dict()
    for n in range(2, 5):  # any weights: the hook below replaces what they compute
        state[f'blocks.{n - 1}.attn.{shared}.weight'] = state[f'blocks.0.attn.{shared}.weight']
    vanilla.load_state_dict(state)
    first = {}
    getattr(vanilla.blocks[0].attn, shared).register_forward_hook(
        lambda module, args, out: first.__setitem__('out', out))
    for block in vanilla.blocks[1:]:
        getattr(block.attn, shared).register_forward_hook(lambda module, args, out: first['out'])
    torch.testing.assert_close(logits_of(vanilla, idx), logits_of(model, idx), rtol=0, atol=1e-12)
    # ...and the sharing matters: the vanilla model with its own (copied) projections differs
    plain = build_model(tiny_config()).double().eval()
    plain.load_state_dict(state)
    assert (logits_of(plain, idx) - logits_of(model, idx)).abs().max() > 1e-2


def test_cross_layer_attention_is_one_softmax_over_both_layers():
    """value_mapping='cross' (ICLR Eqn. 2): layer n > 1 attends with one softmax over its own keys and layer
    1's, each half causal, over [V_n; V_1]; it adds no parameters (λ unused) and caches like vanilla. Checked
    against the naive reference in test_matches_naive_reference; here: against an explicit softmax, and it
    is neither ResFormer nor vanilla on the same weights."""
    model = tiny_model(variant='resformer_identity', value_mapping='cross', n_kv_head=2)
    assert type(model) is AblationGPT
    vanilla = build_model(tiny_config(n_kv_head=2)).double().eval()
    vanilla.load_state_dict(model.state_dict())  # strict: the same parameters
    idx = random_tokens(model, T=10)
    assert (logits_of(vanilla, idx) - logits_of(model, idx)).abs().max() > 1e-2
    stats = {}
    logits_of(model, idx, stats=stats)
    keys, values = stats['keys'], stats['values']
    # layer 2's output before W_O, recomputed from its own and layer 1's keys and values
    attn = model.blocks[1].attn
    captured = {}
    attn.c_proj.register_forward_hook(lambda module, args, out: captured.__setitem__('u', args[0]))
    logits_of(model, idx)
    h = stats['hidden'][0]  # layer 2's input
    q = attn.heads(attn.c_q, model.blocks[1].norm_attn(h),
                   (model.rope_cos[:10].double(), model.rope_sin[:10].double()))
    k = torch.cat([keys[1], keys[0]], dim=2).repeat_interleave(2, dim=1)
    v = torch.cat([values[1], values[0]], dim=2).repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    scores = scores.masked_fill(~torch.cat([causal, causal], dim=1), float('-inf'))
    u = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 10, 32)
    torch.testing.assert_close(captured['u'], u, rtol=0, atol=1e-12)
    assert cache_bytes(variant='resformer_identity', value_mapping='cross') == cache_bytes(variant='vanilla')


@pytest.mark.parametrize('residual_from, expected', [
    ('adjacent', lambda own, n: own[n - 2]),
    ('previous', lambda own, n: sum(own[:n - 1]) / (n - 1)),
])
def test_adjacent_and_previous_mix_in_the_layers_below(residual_from, expected):
    """residual_from='adjacent' mixes V_{n-1} into layer n, 'previous' the mean of V_1 .. V_{n-1} (ICLR
    Fig. 11): each layer's V'_n is λ1 times that plus λ2 V_n, with every layer's own V_n recomputed here."""
    model = tiny_model(value_residual=True, residual_from=residual_from, lambdas=MIXED, n_kv_head=2)
    idx = random_tokens(model, T=10)
    own = []
    for block in model.blocks:
        block.attn.c_v.register_forward_hook(lambda module, args, out: own.append(
            out.view(2, 10, 2, 8).transpose(1, 2)))
    stats = {}
    logits_of(model, idx, stats=stats)
    assert torch.equal(stats['values'][0], own[0])
    for n in range(2, 5):
        lam = model.lambdas[n - 1]  # MIXED's row, as the model holds it
        torch.testing.assert_close(lam, torch.tensor(MIXED[n - 1], dtype=lam.dtype), rtol=0, atol=1e-7)
        torch.testing.assert_close(stats['values'][n - 1], lam[0] * expected(own, n) + lam[1] * own[n - 1],
                                   rtol=0, atol=1e-12)


def test_residual_from_second_leaves_layers_1_and_2_unmixed():
    """residual_from='second' (v5): λ rows of layers 1-2 are (0, 1) and layers 3.. mix in V2; every preset
    fills only the layers after layer 2."""
    for variant in ('resformer_identity', 'resformer_constant', 'svformer'):
        cfg = tiny_config(variant=variant, residual_from='second', n_layer=6)
        assert cfg.lambdas[:2] == ((0.0, 1.0),) * 2
        assert cfg.lambdas[2:] == tiny_config(variant=variant, n_layer=6).lambdas[2:]
    model = tiny_model(variant='svformer', residual_from='second')
    stats = {}
    logits_of(model, random_tokens(model), stats=stats)
    assert (stats['values'][1] - stats['values'][0]).abs().max() > 1e-2
    assert torch.equal(stats['values'][2], stats['values'][1]) and torch.equal(stats['values'][3],
                                                                                stats['values'][1])


# ----------------------------------------------------------------------------------------- GPT-2 backbone

def test_gpt2_backbone_has_gpt2s_blocks():
    """backbone='gpt2': LayerNorm (with biases), a GELU MLP of 4 n_embd with biases, biased attention
    projections, learned positions and no RoPE, an untied LM head without bias; the parameter count is GPT-2's."""
    model = build_model(tiny_config(backbone='gpt2'))
    cfg, d, L, V = model.config, 32, 4, 64
    assert type(model) is AblationGPT and cfg.ffn_hidden == 4 * d
    assert tiny_config(backbone='gpt2', ffn_hidden=96).ffn_hidden == 96
    assert isinstance(model.norm_f, nn.LayerNorm) and model.wpe.weight.shape == (16, d)
    assert model.lm_head.bias is None and model.lm_head.weight is not model.wte.weight
    for block in model.blocks:
        assert isinstance(block.norm_attn, nn.LayerNorm) and isinstance(block.norm_mlp, nn.LayerNorm)
        assert not hasattr(block.mlp, 'c_gate') and block.mlp.c_fc.out_features == 4 * d
        assert block.mlp.c_fc.bias is not None and block.mlp.c_proj.bias is not None
        for name in ('c_q', 'c_k', 'c_v', 'c_proj'):
            assert getattr(block.attn, name).bias is not None, name
    per_layer = 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
    assert model.num_params() == 2 * V * d + 16 * d + L * per_layer + 2 * d
    assert model.num_params(exclude_embedding=True) == model.num_params() - V * d - 16 * d
    # the Llama backbone has none of it
    llama = build_model(tiny_config())
    assert isinstance(llama.norm_f, nn.RMSNorm) and all(b.attn.c_q.bias is None for b in llama.blocks)


def test_gpt2_backbone_positions_are_learned_not_rotary():
    """Without RoPE, attention itself is blind to order: with the learned positions zeroed, the last position
    of layer 1 attends over the same set of tokens when the first two are swapped, so layer 1's output there
    stays (the Llama backbone's RoPE changes it); with the positions, it changes."""
    def last_output_swapped(model):
        idx = random_tokens(model, T=8)
        swapped = idx.clone()
        swapped[:, [0, 1]] = idx[:, [1, 0]]
        outputs = []
        hook = model.blocks[0].register_forward_hook(lambda module, args, out: outputs.append(out[0][:, -1]))
        logits_of(model, idx), logits_of(model, swapped)
        hook.remove()
        return outputs

    model = tiny_model(backbone='gpt2')
    a, b = last_output_swapped(model)
    assert (a - b).abs().max() > 1e-3
    with torch.no_grad():
        model.wpe.weight.zero_()
    a, b = last_output_swapped(model)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    a, b = last_output_swapped(tiny_model())
    assert (a - b).abs().max() > 1e-3


def test_gpt2_backbone_init():
    """GPT-2's init (Hugging Face's): every weight matrix and table N(0, 0.02²) but the residual projections
    (W_O and the MLP's c_proj), N(0, (0.02/√(2 n_layer))²); biases 0; LayerNorm gains 1, biases 0."""
    torch.manual_seed(0)
    L = 6
    model = build_model(tiny_config(backbone='gpt2', n_layer=L, n_embd=64))
    residual, other = [], []
    for name, p in model.named_parameters():
        if name.endswith('.bias'):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif 'norm' in name:
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith('c_proj.weight'):
            residual.append(p.detach().flatten())
        else:
            other.append(p.detach().flatten())
    names = [name for name, _ in model.named_parameters() if name.endswith('c_proj.weight')]
    assert len(names) == 2 * L and any('mlp.c_proj' in n for n in names)
    residual, other = torch.cat(residual), torch.cat(other)
    assert residual.std().item() == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.03)
    assert other.std().item() == pytest.approx(0.02, rel=0.03)
    assert abs(residual.mean().item()) < 1e-3 and abs(other.mean().item()) < 1e-3
    assert model.wpe.weight.std().item() == pytest.approx(0.02, rel=0.1)


# ------------------------------------------------------------------------------------------- KV cache

@pytest.mark.parametrize('case', ALL_CASES)
def test_incremental_decoding_matches_full_forward(case):
    """Prefill a 5-token chunk, then 3 single tokens, then a 4-token chunk (which needs an explicit causal
    mask offset by the cached length): every position's logits equal the full forward's."""
    model = tiny_model(**ALL_CASES[case])
    idx = random_tokens(model, T=12)
    full = logits_of(model, idx)
    cache = model.new_kv_cache(12)
    pieces = []
    for start, end in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 12)]:
        assert cache.pos == start
        pieces.append(logits_of(model, idx[:, start:end], kv_cache=cache))
    assert cache.pos == 12
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError) as e:
        model(idx[:, :1], kv_cache=cache)  # the cache is full
    assert '\n' not in str(e.value) and 'context of 12' in str(e.value)


@pytest.mark.parametrize('case', ['vanilla', 'resformer_identity', 'svformer', 'cla', 'denseformer',
                                  'svformer_gqa', 'value_embeds_resformer_gqa', 'value_bank_resformer_gqa',
                                  'value_bank_after_svformer_gqa', 'value_bank_source_in_bank',
                                  *ABLATION_CASES])
def test_greedy_generate_same_with_and_without_cache(case):
    """Greedy decoding gives the same tokens with and without the KV cache, also past block_size (16),
    where both crop the context to the last 16 tokens."""
    model = tiny_model(**ALL_CASES[case])
    idx = random_tokens(model, T=6)
    short_cached = model.generate(idx, 8, temperature=0, use_cache=True)
    short_plain = model.generate(idx, 8, temperature=0, use_cache=False)
    assert short_cached.shape == (2, 14) and torch.equal(short_cached, short_plain)
    long_cached = model.generate(idx, 20, temperature=0, use_cache=True)   # 26 tokens > block_size 16
    long_plain = model.generate(idx, 20, temperature=0, use_cache=False)
    assert long_cached.shape == (2, 26) and torch.equal(long_cached, long_plain)
    assert torch.equal(long_cached[:, :14], short_cached)


def test_a_cache_smaller_than_block_size_crops_the_context_to_its_size():
    """A kv_cache of 8 positions (block_size 16) decodes as the model does on the last 8 tokens."""
    model = tiny_model()
    idx = random_tokens(model, T=6)
    tokens = model.generate_tokens(idx, 10, temperature=0, kv_cache=model.new_kv_cache(8))
    want = idx
    for _ in range(10):
        want = torch.cat([want, logits_of(model, want[:, -8:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(torch.cat([idx, *tokens], dim=1), want)


def test_kv_cache_store_writes_at_pos_and_returns_every_position():
    """KVCache.store(kind, slot, new): preallocated to max_seq_len on the first write, writes at pos and
    returns all the slot holds; the model advances pos; setting pos = 0 starts over."""
    cache = KVCache(2, 1, 6)
    a, b = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 4)
    assert torch.equal(cache.store('k', 1, a), a) and cache.k[0] is None and cache.v == [None]
    assert cache.k[1].shape == (1, 2, 6, 4)
    cache.pos = 3
    assert torch.equal(cache.store('k', 1, b), torch.cat([a, b], dim=2))
    assert torch.equal(cache.store('v', 0, b), torch.cat([cache.v[0][:, :, :3], b], dim=2))
    cache.pos = 0
    assert torch.equal(cache.store('k', 1, b), b)
    model = tiny_model()
    cache = model.new_kv_cache(16)
    logits_of(model, random_tokens(model, T=5), kv_cache=cache)
    assert cache.pos == 5 and type(cache) is KVCache and len(cache.k) == len(cache.v) == 4
    assert type(tiny_model(value_bank=True).new_kv_cache()) is TokenKVCache


@pytest.mark.parametrize('case', ['vanilla', 'resformer_learnable_plus', 'svformer_gqa', 'denseformer',
                                  'attention_residual', 'value_bank_resformer_gqa', 'mapping_cross',
                                  'gpt2_svformer_gqa'])
def test_compiled_decoding_compiles_once_not_per_token(case):
    """torch.compile traces the cached forward whole (fullgraph) and reuses it: once prompts of two lengths
    have been seen, longer generations from other prompt lengths compile nothing new, and give the uncompiled
    model's tokens. The 'eager' backend checks the tracing in seconds; sample.py --compile adds inductor.
    torch 2.5's dynamo (the oldest requirements.txt allows) never marks the prompt length dynamic here, so
    each new length compiles its prefill once: still nothing per token. Its dynamo also guards on the cache's
    position in the two ablations that read the cache beside their own attention, so they recompile every
    token there until dynamo's cache limit: a known gap of torch 2.5, not of the paper's variants."""
    newest = tuple(map(int, torch.__version__.split('.')[:2])) >= (2, 13)  # the newest torch we test on
    if not newest and case in ('attention_residual', 'mapping_cross'):
        pytest.skip(f'torch {torch.__version__} recompiles {case} per token (see the docstring)')
    torch._dynamo.reset()
    model, compiled = tiny_model(**ALL_CASES[case]), tiny_model(**ALL_CASES[case])  # the same weights
    graphs = []
    compiled.compile(backend=lambda gm, example_inputs: graphs.append(gm) or gm.forward, fullgraph=True)
    idx = random_tokens(model, T=7)
    compiled_after = []
    for prompt_len, n in [(5, 3), (6, 3), (7, 9), (4, 12)]:
        want = model.generate(idx[:, :prompt_len], n, temperature=0)
        tokens = compiled.generate_tokens(idx[:, :prompt_len], n, temperature=0,
                                          kv_cache=compiled.new_kv_cache(16))
        assert torch.equal(torch.cat([idx[:, :prompt_len], *tokens], dim=1), want)
        compiled_after.append(len(graphs))
    assert 0 < compiled_after[0] <= 2 and all(b - a <= 1 for a, b in zip(compiled_after, compiled_after[1:]))
    if newest:
        assert compiled_after[1] <= 4 and compiled_after[1] == compiled_after[3], compiled_after
    torch._dynamo.reset()


def cache_bytes(**kw):
    """Bytes a KV cache holds after the same 5-token prefill (batch 2, float32)."""
    model = build_model(tiny_config(**kw)).eval()
    cache = model.new_kv_cache(16)
    logits_of(model, random_tokens(model, T=5), kv_cache=cache)
    return cache_nbytes(cache)


def test_kv_cache_sizes():
    """SVFormer caches K for every layer and V for layer 1 only: (L+1)/(2L) of vanilla; with GQA at
    n_kv_head = n_head/4 that is (L+1)/(8L) of vanilla MHA. CLA: 1/2. Sharing only K or only V: 3/4."""
    L = 4
    vanilla = cache_bytes(variant='vanilla', n_head=8)
    assert vanilla == 2 * L * 2 * 32 * 16 * 4  # (K + V) × layers × batch × d × max_seq_len × 4 bytes
    assert Fraction(cache_bytes(variant='svformer', n_head=8), vanilla) == Fraction(L + 1, 2 * L)
    assert Fraction(cache_bytes(variant='svformer', n_head=8, n_kv_head=2), vanilla) == Fraction(L + 1, 8 * L)
    assert Fraction(cache_bytes(variant='resformer_identity', n_head=8), vanilla) == 1  # caches V'_n
    assert Fraction(cache_bytes(variant='cla', n_head=8), vanilla) == Fraction(1, 2)
    assert Fraction(cache_bytes(variant='share_k', n_head=8), vanilla) == Fraction(3, 4)
    assert Fraction(cache_bytes(variant='share_v', n_head=8), vanilla) == Fraction(3, 4)
    # SVFormer from V2: layers 1 and 2 keep their values,
    # so (L+2)/(2L); the other residuals cache like vanilla
    assert (Fraction(cache_bytes(variant='svformer', n_head=8, residual_from='second'), vanilla)
            == Fraction(L + 2, 2 * L))
    for kind in ('query', 'key', 'attention', 'hidden'):
        assert cache_bytes(variant='resformer_identity', n_head=8, residual_type=kind) == vanilla
    for flags in (dict(value_mapping='cross'), dict(residual_from='adjacent'), dict(residual_from='previous'),
                  dict(residual_from='dense'), dict(backbone='gpt2')):
        assert cache_bytes(variant='resformer_identity', n_head=8, **flags) == vanilla, flags
    # SVFormer with anchors (4, 6) of 6 layers: values of layers 1, 4, 6; shared keys: keys of layer 1
    assert (Fraction(cache_bytes(variant='svformer', n_head=8, n_layer=6, anchors=(4, 6)),
                     cache_bytes(variant='vanilla', n_head=8, n_layer=6)) == Fraction(6 + 3, 2 * 6))
    assert Fraction(cache_bytes(variant='shared_key', n_head=8), vanilla) == Fraction(1 + L, 2 * L)
    assert cache_bytes(variant='shared_query', n_head=8) == vanilla
    # value embeddings enter V_n before it is cached: no extra cache
    assert cache_bytes(variant='resformer_identity', n_head=8, value_embeds=True) == vanilla
    # a bank of values (layers 3 and 4 of 4) caches no values there, only each position's token id (8 bytes),
    # with or without ResFormer: V_1 is cached by layer 1 and the bank is looked up again
    token_ids = 2 * 16 * 8  # batch × max_seq_len × int64
    for variant in ('vanilla', 'resformer_identity'):
        assert (cache_bytes(variant=variant, n_head=8, value_bank=True)
                == vanilla * Fraction(L + 2, 2 * L) + token_ids)


@pytest.mark.parametrize('case', ALL_CASES)
def test_kv_bytes_per_token_is_what_a_cache_holds(case):
    """GPT.kv_bytes_per_token (what reproduce.py records for each run) times batch and length is what a filled
    cache holds, at the element size of its keys (float32 here)."""
    model = build_model(tiny_config(**ALL_CASES[case])).eval()
    cache = model.new_kv_cache(16)
    logits_of(model, random_tokens(model, T=5), kv_cache=cache)
    assert cache_nbytes(cache) == model.kv_bytes_per_token(element_size=4) * 2 * 16


def test_value_bank_caches_token_ids_and_looks_every_value_up_again():
    """The bank's layers keep no value slot; the cache keeps the prompt's token ids. Changing γ_v after the
    prefill changes the next token's logits exactly as a full forward with the new γ_v does: the cached
    positions' values were looked up again, not read from a cache (which would still hold the old ones)."""
    model = tiny_model(variant='resformer_identity', value_bank=True)
    assert [getattr(block.attn, 'v_slot', None) for block in model.blocks] == [0, 1, None, None]
    assert model.kv_slots == (4, 2)
    idx = random_tokens(model, T=8)
    cache = model.new_kv_cache(16)
    logits_of(model, idx[:, :7], kv_cache=cache)
    assert torch.equal(cache.tokens[:, :7], idx[:, :7])
    with torch.no_grad():
        model.blocks[3].attn.gamma_v.mul_(-2.0)
    step = logits_of(model, idx[:, 7:], kv_cache=cache)[:, -1]
    torch.testing.assert_close(step, logits_of(model, idx)[:, -1], rtol=0, atol=1e-10)


def test_value_embeds_off_is_exactly_the_model_before_and_on_adds_tables_and_gates():
    """value_embeds=False builds the same parameters from the same seed (so every existing run is unchanged);
    True adds one vocab x kv_dim table and one 12 x n_kv_head gate per layer 2 and 4 of 4 (nanochat's
    alternating placement, from the last layer), and the gates start in (0, 0.02) so 3σ starts just
    above 1.5."""
    before, after = (tiny_model(variant='resformer_identity'),
                     tiny_model(variant='resformer_identity', value_embeds=False))
    assert all(torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    torch.manual_seed(0)
    model = build_model(tiny_config(variant='resformer_identity', n_kv_head=2, value_embeds=True))
    plain, kv_dim = build_model(tiny_config(variant='resformer_identity', n_kv_head=2)), 2 * 8
    tables = [n for n, b in enumerate(model.blocks, start=1) if getattr(b.attn, 'value_embed', None) is not None]
    assert tables == [2, 4]
    assert model.num_params() - plain.num_params() == 2 * (64 * kv_dim + 12 * 2)
    assert model.num_params(exclude_embedding=True) == plain.num_params(exclude_embedding=True) + 2 * 12 * 2
    gates = [b.attn.ve_gate.weight for b in model.blocks if getattr(b.attn, 've_gate', None) is not None]
    assert len(gates) == 2 and all(0 <= g.min() and g.max() <= 0.02 for g in gates)
    # and they act: zeroing a table changes the logits
    idx = random_tokens(model)
    before_zero = logits_of(model, idx)
    with torch.no_grad():
        model.blocks[3].attn.value_embed.weight.zero_()
    assert (logits_of(model, idx) - before_zero).abs().max() > 1e-6


# ----------------------------------------------------------------------------------- parameter counts

@pytest.mark.parametrize('n_layer, bank', [(2, [2]), (3, [3]), (4, [3, 4]), (8, [6, 7, 8]),
                                           (12, [9, 10, 11, 12]), (24, list(range(17, 25)))])
def test_value_bank_is_the_last_third_and_replaces_w_v_there(n_layer, bank):
    """BoV's layers: layer n > 2·n_layer // 3 (with 12 layers its "last 4", with 24 layers 17-24). Each has
    its own vocab x kv_dim table and one γ_v and no W_V; every other layer keeps its W_V."""
    with torch.device('meta'):
        model = build_model(tiny_config(n_layer=n_layer, value_bank=True, n_kv_head=2))
    layers = list(enumerate(model.blocks, start=1))
    assert [n for n, b in layers if getattr(b.attn, 'bank', None) is not None] == bank
    assert [n for n, block in layers if block.attn.c_v is None] == bank
    assert all(model.blocks[n - 1].attn.bank.weight.shape == (64, 16) for n in bank)
    assert [n for n, block in layers if getattr(block.attn, 'gamma_v', None) is not None] == bank


@pytest.mark.parametrize('kw', [dict(), dict(variant='resformer_identity', n_kv_head=2), dict(n_layer=8)])
def test_value_bank_parameter_count_is_the_formula(kw):
    """A bank adds vocab·kv_dim + 1 (its table and γ_v) and removes d·kv_dim (W_V) in each of its layers;
    as lookups, its tables are left out with the embedding."""
    plain, bank = build_model(tiny_config(**kw)), build_model(tiny_config(value_bank=True, **kw))
    cfg = bank.config
    n_bank, d, kv_dim = len(bank.token_tables()), cfg.n_embd, cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    assert n_bank == cfg.n_layer - (2 * cfg.n_layer) // 3
    assert bank.num_params() == plain.num_params() + n_bank * (cfg.vocab_size * kv_dim + 1 - d * kv_dim)
    assert (bank.num_params(exclude_embedding=True)
            == plain.num_params(exclude_embedding=True) + n_bank * (1 - d * kv_dim))


def test_value_bank_off_is_the_model_before_and_on_starts_as_values_of_the_token_embedding():
    """value_bank=False builds the same parameters from the same seed. With it on, each table starts as
    RMSNorm(wte) W_V^T for a W_V of the init's std 0.02 (its own for each layer): a least-squares fit of the
    table on the normed embedding is exact and finds such a W_V, while the un-normed embedding does not fit.
    γ_v starts at 1."""
    before, after = (tiny_model(variant='resformer_identity'),
                     tiny_model(variant='resformer_identity', value_bank=False))
    assert all(torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    torch.manual_seed(0)
    model = build_model(tiny_config(value_bank=True, n_kv_head=2))
    wte = model.wte.weight.detach().double()
    normed = F.rms_norm(wte, (32,), eps=model.config.norm_eps)
    fitted = []
    for block in model.blocks:
        if getattr(block.attn, 'bank', None) is None:
            continue
        table = block.attn.bank.weight.detach().double()
        w_v_t = torch.linalg.lstsq(normed, table).solution  # (d, kv_dim)
        assert (normed @ w_v_t - table).norm() < 1e-5 * table.norm()
        assert abs(w_v_t.std().item() - 0.02) < 0.002
        raw = torch.linalg.lstsq(wte, table).solution
        assert (wte @ raw - table).norm() > 1e-2 * table.norm()
        assert block.attn.gamma_v.item() == 1.0
        fitted.append(w_v_t)
    assert (fitted[0] - fitted[1]).abs().max() > 1e-2


@pytest.mark.parametrize('layers, heads, d, ffn, target', [
    (8, 8, 512, 1792, 82e6), (12, 12, 768, 2688, 180e6), (24, 16, 1024, 3584, 468e6)])
def test_paper_model_sizes(layers, heads, d, ffn, target):
    """The paper's 82M / 180M / 468M shapes (vocab 50277, untied) have the reported sizes, and num_params
    equals the paper's count 2·V·d + L·(4d² + 3·d·FFN) plus the RMSNorm gains (2 per layer + final)."""
    V = 50277
    cfg = GPTConfig(n_layer=layers, n_head=heads, n_embd=d, vocab_size=V, block_size=2048)
    assert cfg.ffn_hidden == ffn  # the default FFN is 3.5 d
    with torch.device('meta'):
        model = GPT(cfg)
    n = model.num_params()
    assert n == 2 * V * d + layers * (4 * d * d + 3 * d * ffn) + (2 * layers + 1) * d
    assert abs(n - target) / target < 0.02
    assert model.num_params(exclude_embedding=True) == n - V * d
    flops = metrics.flops_per_token(model, 2048)
    assert flops == 6 * (n - V * d) + 6 * layers * d * 2048  # causal attention: half the T x T matrices
    # train.py's MFU of one GPU from that count: 2 ranks training 2,000 tokens/s in all, of 1,000 TFLOP/s each
    record, line = metrics.step_record(5, torch.tensor(2.5), torch.tensor(1.0), 1e-3, 2000.0, None, model,
                                       {'peak_tflops': 1000.0, 'block_size': 2048}, 2, 'cpu')
    assert record['mfu'] == pytest.approx(flops * 1000.0 / 1e15)
    assert record['mfu_palm'] == pytest.approx((flops + 6 * layers * d * 2048) * 1000.0 / 1e15)
    assert line.startswith("step 5: loss 2.5000, lr 1.00e-03, 2,000 tok/s, mfu ")
    assert 'peak_memory_gib' not in record  # none given: a CPU
    # on GPUs train.py gives every rank's peak: the highest leads, each kept, so one bad GPU shows
    record, line = metrics.step_record(5, torch.tensor(2.5), torch.tensor(1.0), 1e-3, 2000.0, None, model,
                                       {'peak_tflops': 0, 'block_size': 2048}, 2, 'cpu', [3.25, 5.5])
    assert record['peak_memory_gib'] == 5.5 and record['peak_memory_gib_ranks'] == [3.25, 5.5]
    assert line.endswith('2,000 tok/s, peak GPU memory 5.5 GiB')
    # PaLM's and nanoGPT's count: the full T x T matrices, 12·L·H·Q·T (H·Q = d)
    assert metrics.flops_per_token(model, 2048, causal=False) == flops + 6 * layers * d * 2048


# ------------------------------------------------------------------------------------------- λ values

def test_lambdas_identity():
    model = build_model(tiny_config(variant='resformer_identity'))
    assert model.lambdas.tolist() == [[0.0, 1.0]] + [[0.5, 0.5]] * 3


def test_lambdas_sparse_8_layers():
    """Sparse ResFormer, 8 layers: λ1 = 5 on the paper's layers 6-8 and 0 elsewhere."""
    model = build_model(tiny_config(variant='resformer_sparse', n_layer=8))
    lam = model.lambdas.tolist()
    assert [row[0] for row in lam] == [0, 0, 0, 0, 0, 5, 5, 5]
    assert [row[1] for row in lam] == [1] * 8


def test_lambdas_from_a_later_source_leave_layers_up_to_it_unchanged():
    """residual_from='second': rows of layers 1-2 are (0, 1); the presets fill only the layers after it
    (Learnable-Plus's λ1 still sums to n_layer over them)."""
    cfg = tiny_config(variant='resformer_identity', residual_from='second', n_layer=6)
    assert cfg.lambdas == ((0.0, 1.0),) * 2 + ((0.5, 0.5),) * 4
    plus = build_model(tiny_config(variant='resformer_learnable_plus', residual_from='second')).lambdas.detach()
    assert plus[:2].tolist() == [[0.0, 1.0]] * 2
    assert plus[2:, 0].sum().item() == pytest.approx(4.0) and plus[3, 0] > plus[2, 0]
    svformer = build_model(tiny_config(variant='svformer', residual_from='second'))
    assert [block.attn.c_v is not None for block in svformer.blocks] == [True, True, False, False]


@pytest.mark.parametrize('kw, rows', [
    (dict(variant='resformer_constant'), [(2, 1)] * 3),
    (dict(value_residual=True, lambdas=[(0, 1), (0.7, 0.6), (0.3, 0.9), (-0.4, 1.5)]),
     [(0.7, 0.6), (0.3, 0.9), (-0.4, 1.5)]),
    (dict(variant='resformer_learnable'), [(0.5, 0.5)] * 3),
], ids=['constant', 'mixed', 'learnable'])
def test_lambdas_value_rescale_divides_by_row_sum(kw, rows):
    """Post-residual rescaling (an ablation now: AblationGPT): each row becomes (λ1, λ2) / (λ1 + λ2), so
    Constant ResFormer's (2, 1) becomes (2/3, 1/3); layer 1 stays (0, 1). The config's table is unchanged."""
    model = build_model(tiny_config(value_rescale=True, **kw))
    assert type(model) is AblationGPT and ablations(model.config) == ['value_rescale']
    expected = torch.tensor([[0.0, 1.0]] + [[a / (a + b), b / (a + b)] for a, b in rows])
    torch.testing.assert_close(model.lambdas, expected)
    torch.testing.assert_close(build_model(tiny_config(**kw)).lambdas, torch.tensor([(0.0, 1.0)] + rows))


@pytest.mark.parametrize('variant', ['resformer_learnable', 'resformer_learnable_plus'])
def test_learnable_lambdas_start_at_config_and_train(variant):
    """Learnable and Learnable-Plus λ start equal to the config's table (Plus: λ·softmax(λ') reproduces
    it, λ summing to n_layer with larger weight on higher layers) and move after one optimizer step."""
    torch.manual_seed(0)
    model = build_model(tiny_config(variant=variant))
    names = {name for name, _ in model.named_parameters() if 'lambda' in name}
    assert names == ({'lambda_1', 'lambda_2'} if variant == 'resformer_learnable' else
                     {'lambda_scale', 'lambda_prime', 'lambda_2'})
    start = model.lambdas.detach().clone()
    torch.testing.assert_close(start, torch.tensor(model.config.lambdas, dtype=torch.float32))
    if variant == 'resformer_learnable_plus':
        assert start[1:, 0].sum().item() == pytest.approx(4.0)
        assert (start[2:, 0] > start[1:-1, 0]).all()
    optimizer = configure_optimizers(model, 0.1, 1e-2, (0.9, 0.95), 'cpu')
    idx = random_tokens(model)
    model(idx, targets=idx.roll(-1, dims=1)).backward()
    optimizer.step()
    after = model.lambdas.detach()
    assert torch.equal(after[0], torch.tensor([0.0, 1.0]))  # layer 1 is never mixed
    assert (after[1:] - start[1:]).abs().min() > 1e-3       # every later λ trained, on both V1 and V_n


def train_py_model(variant, n_layer=8):
    """The model train.py builds for --variant=variant, by train.py's own calls: configure's
    settings (every field of AblationConfig, at its default unless set), vrl/settings.py's
    model_config of them, then build_model."""
    settings = configure(dict(variant='resformer_identity', n_layer=4, n_head=4, n_embd=32),
                         [f'--variant={variant}', f'--n_layer={n_layer}'], fields_of=AblationConfig,
                         except_fields=('vocab_size',), verbose=False)
    return build_model(train_settings.model_config(settings, 64))


PLUS_8 = [math.exp(j / 6) for j in range(7)]  # Learnable-Plus at 8 layers: λ' from linspace(0, 1)
PAPER_LAMBDAS_8 = {  # model.py's table under VARIANTS: rows 2 .. 8 (on V1, on V_n), as they start
    'vanilla': [(0, 1)] * 7, 'resformer_identity': [(0.5, 0.5)] * 7,
    'resformer_constant': [(2, 1)] * 7, 'resformer_sparse': [(0, 1)] * 4 + [(5, 1)] * 3,
    'resformer_learnable': [(0.5, 0.5)] * 7, 'svformer': [(1, 0)] * 7,
    'resformer_learnable_plus': [(8 * w / sum(PLUS_8), 0.5) for w in PLUS_8]}


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_train_py_gives_each_paper_variant_model_py_lambdas(variant):
    """train.py builds an AblationConfig (GPTConfig plus the ablations' flags, here at their
    defaults); build_model then builds model.py's GPT itself, with the λ of
    GPT(GPTConfig(variant=...)) and of model.py's table, kept as it says: a buffer, or learned."""
    model = train_py_model(variant)
    paper = GPT(GPTConfig(variant=variant, n_layer=8, n_head=4, n_embd=32, vocab_size=64))
    assert type(model) is GPT
    assert torch.equal(model.lambdas, paper.lambdas)
    table = torch.tensor([(0.0, 1.0)] + PAPER_LAMBDAS_8[variant])
    torch.testing.assert_close(model.lambdas.detach(), table)
    learned = {name: p.detach() for name, p in model.named_parameters() if 'lambda' in name}
    if variant == 'resformer_learnable':
        assert learned.keys() == {'lambda_1', 'lambda_2'}
        assert learned['lambda_1'].tolist() == learned['lambda_2'].tolist() == [0.5] * 7
    elif variant == 'resformer_learnable_plus':  # λ_{n,1} = λ softmax(λ')_n
        assert learned.keys() == {'lambda_scale', 'lambda_prime', 'lambda_2'}
        assert learned['lambda_scale'].shape == () and learned['lambda_scale'] == pytest.approx(8)
        prime = learned['lambda_prime']
        torch.testing.assert_close(prime - prime[0], torch.linspace(0, 1, 7))  # up to a constant
        assert learned['lambda_2'].tolist() == [0.5] * 7
    else:  # a fixed table: a buffer, not saved (the config holds λ)
        assert not learned and model.lambdas is model.fixed_lambdas
        assert 'fixed_lambdas' not in model.state_dict()


def test_model_py_lambda_table_lists_every_variant_and_how_it_is_kept():
    """model.py's table under VARIANTS names each variant once, and the parameters (lambda_*) of
    those whose λ GPT learns, the very ones GPT makes; the others' λ is the buffer fixed_lambdas."""
    source = Path(__file__).with_name('model.py').read_text(encoding='utf-8')
    table = source[source.index('# Their λ'):source.index('def variant_lambdas')]
    rows = re.findall(r"^#   (\w+) +(.*)\n((?:#    +.*\n)*)", table, flags=re.M)
    assert [name for name, _, _ in rows] == list(VARIANTS)
    for name, row, more in rows:
        named = set(re.findall(r'lambda_\w+', row + more))
        learned = {k for k, _ in GPT(GPTConfig(variant=name, n_layer=4)).named_parameters()
                   if k.startswith('lambda_')}
        assert named == learned, name


def test_train_py_quotes_the_helper_lines_it_cites():
    """train.py's comments cite a helper's line with its code (`file.py:N `code``), so a reader need
    not open the file: each cited line holds that code."""
    root = Path(__file__).parent
    comments = ' '.join(line.split('#', 1)[1] for line in (root / 'train.py').read_text(
        encoding='utf-8').splitlines() if '#' in line)
    cited = re.findall(r'([\w/]+\.py):(\d+) `([^`]+)`', comments)
    assert len(cited) >= 3, cited
    for path, number, code in cited:
        line = (root / path).read_text(encoding='utf-8').splitlines()[int(number) - 1]
        assert code in line, (path, number, code, line)


def test_readme_cites_the_model_py_lines_that_define_each_name():
    """The README's reading path gives model.py's line of each name it cites (`VARIANTS` (24), `forward`,
    348, ...): each is that name's class, def or assignment."""
    readme = Path(__file__).with_name('README.md').read_text(encoding='utf-8')
    path = readme[readme.index('1. `model.py` is the paper'):readme.index('2. `train.py`')]
    cited = re.findall(r'`(\w+)`(?:\s*\(|,\s*)(\d+)', path)
    lines = Path(__file__).with_name('model.py').read_text(encoding='utf-8').splitlines()
    assert len(cited) >= 6, cited
    for name, number in cited:
        line = lines[int(number) - 1]
        assert re.match(rf'\s*(class {name}\b|def {name}\b|{name} = )', line), (name, number, line)


# ---------------------------------------------------------------------------------------- optimizer

@pytest.mark.parametrize('kw', [
    dict(value_residual=True, lambda_mode='plus', lambdas=[(0, 1)] + [(1, 0.5)] * 3, denseformer=True),
    dict(value_residual=True, lambda_mode='learnable', lambdas=[(0, 1)] + [(0.5, 0.5)] * 3, n_kv_head=2),
    dict(variant='svformer', backbone='gpt2'),
    dict(variant='resformer_identity', value_bank=True, n_kv_head=2),
    dict(value_residual=True, residual_from='dense'),
])
def test_configure_optimizers_decay_groups(kw):
    """Weight decay on every matrix and embedding (a bank's tables and GPT-2's positions too); none on norm
    gains and biases, λ, DenseFormer α, Dense-ResFormer's weights or a bank's γ_v; each trainable parameter in
    exactly one group."""
    model = build_model(tiny_config(**kw))
    optimizer = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), 'cpu')
    decay, no_decay = optimizer.param_groups
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    grouped = [id(p) for g in optimizer.param_groups for p in g['params']]
    assert sorted(grouped) == sorted(id(p) for _, p in trainable(model))
    assert len(grouped) == len(set(grouped))
    decayed = {id(p) for p in decay['params']}
    for name, p in trainable(model):
        is_matrix = name.endswith(('wte.weight', 'wpe.weight', 'lm_head.weight', 'attn.bank.weight')) or (
            name.endswith('.weight') and 'norm' not in name and any(
                s in name for s in ('.c_q.', '.c_k.', '.c_v.', '.c_proj.', '.c_gate.', '.c_up.', '.c_down.',
                                    '.c_fc.')))
        assert (id(p) in decayed) == is_matrix, name
        if ('norm' in name or 'lambda' in name or name.startswith('dwa.') or name.endswith(('gamma_v', '.bias'))
                or name.endswith('attn.dense')):
            assert id(p) not in decayed, name


# ------------------------------------------------------------------------ build_model and AblationGPT

@pytest.mark.parametrize('case', ALL_CASES)
def test_a_config_with_an_ablation_builds_ablation_gpt_and_the_paper_builds_gpt(case):
    """build_model(config) is the paper's model (GPT, CausalSelfAttention in every layer) unless the config
    sets a field of AblationConfig's own (or names a baseline); then it is an AblationGPT, whose every layer
    is an AblationAttention."""
    config = tiny_config(**ALL_CASES[case])
    model = build_model(config)
    own = {'residual_from', 'residual_type', 'value_mapping', 'value_rescale', 'anchors', 'h0_residual',
           'neutreno_lambda', 'denseformer', 'share_kv', 'backbone', 'value_embeds', 'value_bank'}
    defaults = dataclasses.asdict(AblationConfig())
    set_here = {k for k, v in dataclasses.asdict(config).items() if k in own and v != defaults[k]}
    assert set(ablations(config)) == set_here
    assert set_here or config.variant not in BASELINES
    if set_here:
        assert type(model) is AblationGPT and isinstance(model, GPT)
        assert {type(block.attn) for block in model.blocks} == {AblationAttention}
    else:
        assert type(model) is GPT
        assert {type(block.attn) for block in model.blocks} == {CausalSelfAttention}


def test_gpt_builds_the_paper_model_and_ignores_ablation_fields():
    """There is no dispatch in GPT any more: GPT(AblationConfig(variant='cla')) is the paper's model with every
    layer's own K and V (CLA ignored); build_model builds CLA. model.py's GPTConfig knows no baseline."""
    cfg = tiny_config(variant='cla')
    plain, cla = GPT(cfg), build_model(cfg)
    assert type(plain) is GPT and all(b.attn.c_k is not None and b.attn.c_v is not None for b in plain.blocks)
    assert type(cla) is AblationGPT and [b.attn.c_k is not None for b in cla.blocks] == [True, False] * 2
    for name in BASELINES:
        with pytest.raises(ValueError) as e:
            GPTConfig(variant=name)
        assert 'unknown variant' in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('case', ['vanilla', 'resformer_identity', 'svformer_gqa', 'resformer_learnable',
                                  'resformer_learnable_plus', 'resformer_sparse', 'custom_lambdas_gqa'])
def test_ablation_gpt_computes_the_paper_model_exactly(case):
    """AblationGPT repeats GPT's forward with the ablations added: with none of them set, built directly it
    draws the same weights from the same seed, and given GPT's weights (the same parameters, strictly), it
    gives the same logits and loss, bit for bit, in a full forward and when decoding with the KV cache."""
    model = tiny_model(**ALL_CASES[case])
    assert type(model) is GPT
    torch.manual_seed(0)
    fresh_gpt = GPT(model.config)
    torch.manual_seed(0)
    fresh_lab = AblationGPT(model.config)
    assert fresh_gpt.state_dict().keys() == fresh_lab.state_dict().keys()
    assert all(torch.equal(a, fresh_lab.state_dict()[k]) for k, a in fresh_gpt.state_dict().items())
    lab = AblationGPT(model.config).double().eval()
    lab.load_state_dict(model.state_dict())
    idx = random_tokens(model)

    def full_and_cached(m):
        cache = m.new_kv_cache(16)
        cached = [logits_of(m, idx[:, :5], kv_cache=cache), logits_of(m, idx[:, 5:], kv_cache=cache)]
        return logits_of(m, idx), torch.cat(cached, dim=1), logits_of(m, idx, targets=idx.roll(-1, dims=1))

    paper, ablation = full_and_cached(model), full_and_cached(lab)
    assert all(torch.equal(a, p) for a, p in zip(ablation, paper))


@pytest.mark.parametrize('case', ['vanilla', 'svformer_gqa', 'neutreno_resformer', 'attention_residual_v2',
                                  'hidden_h1', 'mapping_cross', 'gpt2'])
def test_stats_path_same_logits_and_fills_stats(case):
    """AblationGPT's forward(stats={}), which analyze.py runs on every model, computes the same model, bit
    for bit, and records per-layer causal attention probabilities (rows sum to 1), keys, values (V'_n) and
    hidden states."""
    model = tiny_model(**ALL_CASES[case])
    lab = AblationGPT(model.config).double().eval()
    lab.load_state_dict(model.state_dict())
    idx = random_tokens(model, T=10)
    stats = {}
    assert torch.equal(logits_of(lab, idx, stats=stats), logits_of(model, idx))
    cfg = model.config
    for key in ('attn', 'keys', 'values', 'hidden'):
        assert len(stats[key]) == cfg.n_layer, key
    upper = torch.ones(10, 10, dtype=torch.bool).triu(1)
    for attn in stats['attn']:
        assert attn.shape == (2, cfg.n_head, 10, 10)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, cfg.n_head, 10, dtype=attn.dtype))
        assert (attn[..., upper] == 0).all()
        assert (attn >= 0).all()
    assert stats['keys'][0].shape == (2, cfg.n_kv_head, 10, cfg.n_embd // cfg.n_head)
    assert stats['hidden'][-1].shape == (2, 10, cfg.n_embd)
    if cfg.variant == 'svformer':  # U_n = A_n V1: every layer's values are layer 1's
        for v in stats['values'][1:]:
            assert torch.equal(v, stats['values'][0])


# ------------------------------------------------------------------------------------------ generation

def test_generate_greedy_is_deterministic_and_top_k_1_is_greedy():
    model = tiny_model(variant='resformer_identity')
    idx = random_tokens(model, T=4)
    greedy = model.generate(idx, 10, temperature=0)
    assert torch.equal(greedy, model.generate(idx, 10, temperature=0))
    assert torch.equal(greedy[:, :4], idx) and greedy.shape == (2, 14)
    torch.manual_seed(123)
    assert torch.equal(model.generate(idx, 10, temperature=1.0, top_k=1), greedy)
    # sampling without top_k does draw other tokens (so the top_k=1 check means something)
    torch.manual_seed(123)
    sampled = model.generate(idx, 10, temperature=2.0)
    assert not torch.equal(sampled, greedy)
    steps = list(model.generate_tokens(idx, 3, temperature=0))
    assert len(steps) == 3 and all(s.shape == (2, 1) for s in steps)
    assert torch.equal(torch.cat(steps, dim=1), greedy[:, 4:7])
    # generate forwards its other arguments to generate_tokens: vocab_size keeps the padding out
    assert (model.generate(idx, 10, 2.0, None, True, None, 5)[:, 4:] < 5).all()


# ---------------------------------------------------------------------------------------- bad configs

BAD_CONFIGS = {
    'value embeddings on SVFormer layers': dict(variant='svformer', value_embeds=True),
    'value embeddings on CLA layers': dict(variant='cla', value_embeds=True),
    'value bank with one layer': dict(value_bank=True, n_layer=1),
    'value bank on SVFormer layers': dict(variant='svformer', value_bank=True),
    'value bank with value embeddings': dict(value_bank=True, value_embeds=True),
    'value bank with CLA': dict(variant='cla', value_bank=True),
    'value bank with share_v': dict(variant='share_v', value_bank=True, n_layer=6),
    'n_embd not divisible by n_head': dict(n_embd=30, n_head=4),
    'n_head not divisible by n_kv_head': dict(n_kv_head=3),
    'odd head_dim': dict(n_embd=12, n_head=4),
    'lambdas wrong row count': dict(value_residual=True, lambdas=[(0, 1)] + [(0.5, 0.5)] * 2),
    'lambdas rows not pairs': dict(value_residual=True, lambdas=[(0, 1, 0)] + [(0.5, 0.5, 0)] * 3),
    'lambdas rows scalars': dict(value_residual=True, lambdas=[0, 1, 0.5, 0.5]),
    'layer 1 λ row is not (0, 1)': dict(value_residual=True, lambdas=[(0.5, 0.5)] * 4),
    'lambdas without value_residual': dict(lambdas=[(0, 1)] + [(0.5, 0.5)] * 3),
    'learnable without value_residual': dict(lambda_mode='learnable'),
    'value_rescale without value_residual': dict(value_rescale=True),
    'neutreno with GQA': dict(variant='neutreno', n_kv_head=2),
    'svformer with share_kv=v': dict(value_residual=True, lambdas=[(0, 1)] + [(1, 0)] * 3, share_kv='v'),
    'svformer with share_kv=kv': dict(value_residual=True, lambdas=[(0, 1)] + [(1, 0)] * 3, share_kv='kv'),
    'resformer with share_kv=v': dict(value_residual=True, share_kv='v'),
    'unknown variant': dict(variant='resformer_bogus'),
    'variant with conflicting share_kv': dict(variant='cla', share_kv='k'),
    'variant with conflicting neutreno_lambda': dict(variant='neutreno', neutreno_lambda=0.3),
    'variant with conflicting value_residual': dict(variant='vanilla', value_residual=True),
    'variant with conflicting lambdas': dict(variant='resformer_identity', lambdas=[(0, 1)] + [(2, 1)] * 3),
    'variant with conflicting lambda_mode': dict(variant='svformer', lambda_mode='learnable'),
    'plus with a zero lambda1': dict(value_residual=True, lambda_mode='plus',
                                     lambdas=[(0, 1), (0.5, 0.5), (0, 1), (1, 1)]),
    'value_residual with one layer': dict(value_residual=True, n_layer=1),
    'svformer with one layer': dict(variant='svformer', n_layer=1),
    'rescale by zero': dict(value_residual=True, value_rescale=True,
                            lambdas=[(0, 1), (1, -1), (1, 1), (1, 1)]),
    'unknown lambda_mode': dict(value_residual=True, lambda_mode='adaptive'),
    'unknown share_kv': dict(share_kv='q'),
    'zero heads': dict(n_head=0),
    'fractional n_kv_head': dict(n_kv_head=2.5),
    'fractional n_head': dict(n_head=2.5),
    'n_layer as text': dict(n_layer='4'),
    'n_embd as bool': dict(n_embd=True),
    'zero block_size': dict(block_size=0),
    'negative vocab_size': dict(vocab_size=-64),
    'zero ffn_hidden': dict(ffn_hidden=0),
    'negative ffn_hidden': dict(ffn_hidden=-3),
    'zero rope_theta': dict(rope_theta=0.0),
    'negative rope_theta': dict(rope_theta=-10000.0),
    'nan rope_theta': dict(rope_theta=float('nan')),
    'infinite rope_theta': dict(rope_theta=float('inf')),
    'zero norm_eps': dict(norm_eps=0.0),
    'dropout 1': dict(dropout=1.0),
    'negative dropout': dict(dropout=-0.1),
    'nan dropout': dict(dropout=float('nan')),
    'nan lambda': dict(value_residual=True, lambdas=[(0, 1), (0.5, float('nan')), (0.5, 0.5), (0.5, 0.5)]),
    'infinite lambda': dict(value_residual=True, lambdas=[(0, 1), (float('inf'), 1), (0.5, 0.5), (0.5, 0.5)]),
    'nan neutreno_lambda': dict(neutreno_lambda=float('nan')),
    # residual_from replaces the 0-based residual_source: only the named choices
    'unknown residual_from': dict(variant='resformer_identity', residual_from='third'),
    'residual_from as a layer number': dict(variant='resformer_identity', residual_from=1),
    'residual_from without a residual': dict(residual_from='second'),
    'residual_from adjacent without a residual': dict(residual_from='adjacent'),
    'residual_type without value_residual': dict(residual_type='query'),
    'value_mapping without value_residual': dict(value_mapping='first'),
    'unknown residual_type': dict(variant='resformer_identity', residual_type='output'),
    'unknown value_mapping': dict(variant='resformer_identity', value_mapping='last'),
    'value_mapping=first on queries': dict(variant='resformer_identity', residual_type='query',
                                           value_mapping='first'),
    'row up to the source is mixed': dict(value_residual=True, residual_from='second',
                                          lambdas=[(0, 1)] + [(0.5, 0.5)] * 3),
    'attention residual with a zero own weight': dict(variant='svformer', residual_type='attention'),
    'hidden residual with a zero own weight': dict(variant='svformer', residual_type='hidden'),
    'mapping first with a zero own weight': dict(variant='svformer', value_mapping='first'),
    'identity mapping with lambdas': dict(value_residual=True, value_mapping='identity', lambdas=MIXED),
    'identity mapping with learnable λ': dict(variant='resformer_learnable', value_mapping='identity'),
    'identity mapping rescaled': dict(variant='resformer_identity', value_mapping='identity',
                                      value_rescale=True),
    'identity mapping from V2': dict(variant='resformer_identity', value_mapping='identity',
                                     residual_from='second'),
    'key residual with share_kv=k': dict(variant='custom', value_residual=True, residual_type='key',
                                         share_kv='k'),
    # the new experiments
    'unknown backbone': dict(backbone='gpt3'),
    'anchor past the last layer': dict(variant='svformer', anchors=(5,)),
    'anchor at layer 1': dict(variant='svformer', anchors=(1,)),
    'fractional anchor': dict(variant='svformer', anchors=(2.5,)),
    'anchors as a number': dict(value_residual=True, anchors=4),
    'anchors as a number with a variant': dict(variant='svformer', anchors=4),
    'anchors without value_residual': dict(anchors=(2,)),
    'anchors from the second layer': dict(variant='svformer', anchors=(3,), residual_from='second'),
    'anchors with the key residual': dict(variant='resformer_identity', anchors=(3,), residual_type='key'),
    'custom anchor with a mixing λ row': dict(value_residual=True, lambdas=MIXED, anchors=(3,)),
    'dense with lambdas': dict(value_residual=True, residual_from='dense', lambdas=MIXED),
    'dense with learnable λ': dict(variant='resformer_learnable', residual_from='dense'),
    'dense rescaled': dict(variant='resformer_identity', residual_from='dense', value_rescale=True),
    'dense on keys': dict(variant='resformer_identity', residual_from='dense', residual_type='key'),
    'dense with SVFormer': dict(variant='svformer', residual_from='dense'),
    'cross mapping with lambdas': dict(value_residual=True, value_mapping='cross', lambdas=MIXED),
    'cross mapping with learnable λ': dict(variant='resformer_learnable', value_mapping='cross'),
    'cross mapping rescaled': dict(variant='resformer_identity', value_mapping='cross', value_rescale=True),
    'cross mapping from V2': dict(variant='resformer_identity', value_mapping='cross', residual_from='second'),
    'adjacent on queries': dict(variant='resformer_identity', residual_from='adjacent', residual_type='query'),
    'adjacent with SVFormer': dict(variant='svformer', residual_from='adjacent'),
    'shared_key with share_kv=k': dict(variant='shared_key', share_kv='k'),
    'shared_query with learnable λ': dict(variant='shared_query', lambda_mode='learnable'),
}


@pytest.mark.parametrize('case', list(BAD_CONFIGS))
def test_bad_config_raises_one_line_value_error(case):
    with pytest.raises(ValueError) as e:
        tiny_config(**BAD_CONFIGS[case])
    message = str(e.value)
    assert message and '\n' not in message


def test_bad_config_messages_name_the_problem():
    def message(**kw):
        with pytest.raises(ValueError) as e:
            tiny_config(**kw)
        return str(e.value)
    assert 'n_head' in message(n_embd=30) and 'n_kv_head' in message(n_kv_head=3)
    assert 'resformer_bogus' in message(variant='resformer_bogus')
    assert 'share_kv' in message(variant='cla', share_kv='k')
    assert "layer 1 mixes nothing in" in message(value_residual=True, lambdas=[(0.5, 0.5)] * 4)
    assert "layer 2 mixes nothing in" in message(value_residual=True, residual_from='second',
                                                 lambdas=[(0, 1)] + [(0.5, 0.5)] * 3)
    for kw, words in [(dict(n_kv_head=2.5), ('n_kv_head', 'positive int')),
                      (dict(ffn_hidden=-3), ('ffn_hidden', 'positive')),
                      (dict(rope_theta=0.0), ('rope_theta', 'positive')),
                      (dict(dropout=1.0), ('dropout', '[0, 1)')),
                      (dict(value_residual=True, lambdas=[(0, 1)] * 3 + [(float('nan'), 1)]),
                       ('lambdas', 'finite')),
                      (dict(variant='resformer_identity', residual_from='third'),
                       ('residual_from', "'third'", "'first'", "'second'", "'adjacent'", "'previous'", "'dense'")),
                      (dict(backbone='gpt3'), ('backbone', "'gpt3'", "'llama'", "'gpt2'")),
                      (dict(variant='svformer', anchors=(5,)), ('anchors', '2', 'n_layer=4')),
                      (dict(variant='svformer', anchors=(1,)), ('anchors', '2', 'n_layer=4')),
                      (dict(value_residual=True, residual_from='dense', lambdas=MIXED),
                       ("residual_from='dense'", 'lambdas')),
                      (dict(value_residual=True, value_mapping='cross', lambdas=MIXED),
                       ("value_mapping='cross'", 'lambdas')),
                      (dict(residual_from='second'), ('residual_from', 'value_residual=True')),
                      (dict(variant='svformer', anchors=(3,), residual_from='second'),
                       ('anchors', "residual_from='first'"))]:
        assert all(word in message(**kw) for word in words), (kw, message(**kw))
    assert 'divisible' not in message(n_kv_head=2.5)
    assert 'SVFormer' in message(variant='svformer', value_bank=True) and '(layers [3, 4])' in message(
        variant='svformer', value_bank=True)
    assert 'layer(s) [4]' in message(value_bank=True, value_embeds=True)
    assert "(layers [6])" in message(variant='share_v', value_bank=True, n_layer=6)


def test_model_py_refuses_the_ablations():
    """model.py's GPTConfig is the paper's: no baseline variant, no ablation field."""
    with pytest.raises(ValueError) as e:
        GPTConfig(variant='neutreno')
    assert "unknown variant 'neutreno'" in str(e.value) and '\n' not in str(e.value)
    for field in ('residual_from', 'value_rescale', 'tie_embeddings', 'backbone', 'anchors'):
        with pytest.raises(TypeError):
            GPTConfig(**{field: None})


@pytest.mark.parametrize('kw', [
    dict(variant='svformer', n_kv_head=2), dict(variant='resformer_constant', value_rescale=True),
    dict(variant='svformer', value_residual=True), dict(variant='neutreno', neutreno_lambda=0.4),
    dict(variant='resformer_identity', share_kv='none'), dict(variant='denseformer', n_kv_head=2),
    dict(variant='svformer', backbone='gpt2'), dict(variant='cla', backbone='gpt2'),
    dict(variant='svformer', share_kv='k'), dict(variant='resformer_identity', residual_from='dense'),
])
def test_compatible_flags_with_a_variant_are_accepted(kw):
    """Flags a variant does not set (GQA, rescaling, another backbone, a baseline's sharing of keys), or that
    repeat its own value, are fine."""
    cfg = tiny_config(**kw)
    assert AblationConfig(**dataclasses.asdict(cfg)) == cfg


@pytest.mark.parametrize('case', ['vanilla', 'gpt2'])
def test_sequence_longer_than_block_size_raises(case):
    model = build_model(tiny_config(**ALL_CASES[case]))
    with pytest.raises(ValueError) as e:
        model(torch.zeros(1, 17, dtype=torch.long))
    assert '\n' not in str(e.value) and '17 positions' in str(e.value) and 'context of 16' in str(e.value)
    model(torch.zeros(1, 16, dtype=torch.long))  # exactly block_size is fine


# ----------------------------------------------------------------------------------------- checkpoints

def save_checkpoint(model, path):
    torch.save({'model': model.state_dict(), 'model_args': dataclasses.asdict(model.config),
                'data_meta': {}}, path)


@pytest.mark.parametrize('case', round_trip_params(['svformer_gqa', 'gpt2_svformer_gqa', 'source_dense_gqa',
                                                    'mapping_cross_gqa', 'resformer_anchor_gqa', 'cla',
                                                    'shared_key_gqa', 'svformer_anchors', 'neutreno_resformer']))
def test_load_checkpoint_round_trip(tmp_path, case):
    model = tiny_model(dtype=torch.float32, **ALL_CASES[case])
    path = tmp_path / 'ckpt.pt'
    save_checkpoint(model, path)
    loaded, checkpoint = load_checkpoint(str(path))
    assert loaded.config == model.config and type(loaded) is type(model)
    idx = random_tokens(model)
    assert torch.equal(logits_of(loaded.eval(), idx), logits_of(model, idx))


def test_load_checkpoint_strips_compile_and_ddp_prefixes(tmp_path):
    """A state_dict saved from DDP(torch.compile(model)) names its weights module._orig_mod.*;
    it still loads."""
    model = tiny_model(variant='resformer_identity', dtype=torch.float32)
    path = tmp_path / 'wrapped.pt'
    torch.save({'model': {'module._orig_mod.' + k: v for k, v in model.state_dict().items()},
                'model_args': dataclasses.asdict(model.config), 'data_meta': {}}, path)
    loaded, _ = load_checkpoint(str(path))
    idx = random_tokens(model)
    assert torch.equal(logits_of(loaded.eval(), idx), logits_of(model, idx))


@pytest.mark.parametrize('table, old_name', [('value_embeds', 'value_embeds.{i}.weight'),
                                              ('value_bank', 'value_bank.{i}.weight')])
def test_a_checkpoint_from_before_the_token_tables_moved_into_their_layers_loads(tmp_path, table, old_name):
    """Value embeddings' and the bank's tables were GPT's (value_embeds.3.weight); they are their layers' now
    (blocks.3.attn.value_embed.weight, blocks.3.attn.bank.weight), and old checkpoints load under the new
    names."""
    model = tiny_model(variant='resformer_identity', dtype=torch.float32, **{table: True})
    old = {}
    for k, v in model.state_dict().items():
        layer, _, rest = k.removeprefix('blocks.').partition('.attn.')
        old[old_name.format(i=layer) if rest in ('value_embed.weight', 'bank.weight') else k] = v
    assert any(k.startswith(table + '.') for k in old)
    path = tmp_path / 'old.pt'
    torch.save({'model': old, 'model_args': dataclasses.asdict(model.config), 'data_meta': {}}, path)
    loaded, _ = load_checkpoint(str(path))
    idx = random_tokens(model)
    assert torch.equal(logits_of(loaded.eval(), idx), logits_of(model, idx))


@pytest.mark.parametrize('variant, renamed', [
    ('resformer_learnable', {'lambda_1': 'lambda_v1', 'lambda_2': 'lambda_vn'}),
    ('resformer_learnable_plus', {'lambda_prime': 'lambda_logits', 'lambda_2': 'lambda_vn'}),
])
def test_a_checkpoint_with_the_old_names_loads(tmp_path, variant, renamed):
    """A checkpoint of before the split: 0-based residual_source (1: residual_from='second'), tie_embeddings
    False, and λ parameters named lambda_v1 / lambda_vn / lambda_logits, loads into today's model; one
    with tie_embeddings=True (no longer built) is refused in one line."""
    model = tiny_model(variant=variant, residual_from='second', dtype=torch.float32)
    args = dataclasses.asdict(model.config)
    del args['residual_from']
    args |= dict(residual_source=1, tie_embeddings=False)
    state = {renamed.get(k, k): v for k, v in model.state_dict().items()}
    assert set(renamed.values()) <= state.keys()
    path = tmp_path / 'old.pt'
    torch.save({'model': state, 'model_args': args, 'data_meta': {}}, path)
    loaded, _ = load_checkpoint(str(path))
    assert loaded.config == model.config and loaded.config.residual_from == 'second'
    idx = random_tokens(model)
    assert torch.equal(logits_of(loaded.eval(), idx), logits_of(model, idx))
    torch.save({'model': state, 'model_args': args | dict(tie_embeddings=True), 'data_meta': {}}, path)
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(path))
    assert 'tie_embeddings' in e.value.code and '\n' not in e.value.code


def test_load_checkpoint_messages_give_no_unsafe_or_foreign_advice(tmp_path):
    """Random bytes: 'not a checkpoint written by train.py', never torch's weights_only=False advice (which
    would run code from the file). A missing file: how to make one, with no flag another script may not
    take."""
    path = tmp_path / 'noise.pt'
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(path))
    assert 'not a checkpoint written by train.py' in e.value.code and 'weights_only' not in e.value.code
    torch.save({'weights': torch.zeros(2)}, path)  # a real torch file, but not ours
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(path))
    assert 'not a checkpoint written by train.py' in e.value.code
    # weights, but nothing to read text with (sample, eval, analyze need it)
    model = tiny_model(dtype=torch.float32)
    torch.save({'model': model.state_dict(), 'model_args': dataclasses.asdict(model.config)}, path)
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(path))
    assert e.value.code == (f"checkpoint {path} has no data_meta, so the tokenizer its text needs is "
                            "unknown; point to a checkpoint written by train.py")
    with pytest.raises(SystemExit) as e:
        load_checkpoint(str(tmp_path / 'missing.pt'))
    assert 'python train.py' in e.value.code and re.findall(r'--\w+', e.value.code) == ['--out_dir']


def test_load_checkpoint_truncated_or_missing_exits_with_one_line(tmp_path):
    path = tmp_path / 'ckpt.pt'
    save_checkpoint(build_model(tiny_config(variant='resformer_identity')), path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    for target in (path, tmp_path / 'missing.pt'):
        with pytest.raises(SystemExit) as e:
            load_checkpoint(str(target))
        message = str(e.value.code)
        assert isinstance(e.value.code, str) and str(target) in message and '\n' not in message


# ------------------------------------------------------------------------------------------ one file alone

def test_model_py_alone_builds_trains_and_generates(tmp_path):
    """model.py is one self-contained file: copied alone into an empty folder (without ablations.py), with
    that folder the only one added to the import path (none of this project's), it imports nothing but the
    standard library and torch, and for every paper variant builds a model, trains a step (the loss alone
    from forward) and generates, with and without the KV cache."""
    source = Path(__file__).resolve().with_name('model.py')
    imported = {alias.name.split('.')[0] for node in ast.walk(ast.parse(source.read_text()))
                for alias in getattr(node, 'names', []) if isinstance(node, ast.Import)}
    imported |= {node.module.split('.')[0] for node in ast.walk(ast.parse(source.read_text()))
                 if isinstance(node, ast.ImportFrom)}
    assert imported - {'torch'} <= set(sys.stdlib_module_names), imported
    shutil.copy(source, tmp_path / 'model.py')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['model.py']
    (tmp_path / 'use_model.py').write_text(textwrap.dedent("""
        import json, sys
        import torch
        from model import GPT, GPTConfig, VARIANTS
        torch.set_num_threads(1)
        runs = {}
        for variant in VARIANTS:
            torch.manual_seed(0)
            model = GPT(GPTConfig(variant=variant, n_layer=3, n_head=2, n_embd=32, vocab_size=64, block_size=16))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # any optimizer: vrl/optim.py's is train.py's
            idx = torch.randint(64, (2, 16))
            before = [p.detach().clone() for p in model.parameters()]
            loss = model(idx, targets=idx.roll(-1, dims=1))
            loss.backward()
            optimizer.step()
            model.eval()
            cached, plain = (model.generate(idx[:, :4], 6, temperature=0, use_cache=c).tolist() for c in (True, False))
            runs[variant] = dict(loss=loss.item(), scalar=loss.dim() == 0,
                                 all_trained=all(not torch.equal(a, p) for a, p in zip(before, model.parameters())),
                                 cached=cached, plain=plain, prompt=idx[:, :4].tolist())
        print(json.dumps(dict(runs=runs, model_file=sys.modules['model'].__file__, path=sys.path,
                              ablations='ablations' in sys.modules,
                              files=[getattr(m, '__file__', None) or '' for m in list(sys.modules.values())])))
    """))
    result = subprocess.run([sys.executable, '-E', '-s', 'use_model.py'], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert Path(out['model_file']).parent == tmp_path and not out['ablations']
    # the venv may live in the repository (the README puts it there)
    repo, env = str(source.parent), sys.prefix

    def inside(path):
        return path.startswith(repo + '/') and not path.startswith(env + '/')
    assert not any(entry in ('', repo) or inside(entry) for entry in out['path'][1:]), out['path']
    assert not any(inside(f) for f in out['files'])  # nothing of this project was imported
    assert sorted(out['runs']) == sorted(VARIANTS)
    for variant, run in out['runs'].items():
        assert math.isfinite(run['loss']) and run['scalar'] and run['all_trained'], variant
        assert run['cached'] == run['plain'] and len(run['cached'][0]) == 10 and all(
            row[:4] == p for row, p in zip(run['cached'], run['prompt'])), variant


@pytest.mark.parametrize('kw', [dict(n_layer=1), dict(variant='resformer_identity', residual_from='second',
                                                      n_layer=2)], ids=['one layer', 'second of two'])
def test_a_model_whose_layers_mix_nothing_in_builds_and_runs(kw):
    cfg = tiny_config(**kw)
    assert cfg.lambdas is None or cfg.lambdas == ((0.0, 1.0),) * cfg.n_layer
    model = build_model(cfg)
    idx = random_tokens(model)
    assert model.lambdas.tolist() == [[0.0, 1.0]] * cfg.n_layer
    assert model(idx).shape == (2, 12, 64)
