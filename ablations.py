"""
The rest of the model: the paper's baselines and ablations, and values from outside the paper, each an
extension of model.py's classes (its CausalSelfAttention, Block and GPT do the paper's part). A config
that sets any field of AblationConfig beyond GPTConfig's builds an AblationGPT (build_model); with none
set, AblationGPT computes what GPT does, bit for bit (test_model.py checks). Sources: ICLR (the ICLR
2025 text), v5 (arXiv v5, second-hand), code (the official repository), ours (our reading).

An ablation is one field of AblationConfig (with its docstring and its checks in check()) and code in
the one step it changes: a layer's own projections (AblationAttention.__init__), its queries, keys or
values, the attention and what is added to its output (attend), the block (AblationBlock) or the
stream between blocks (AblationGPT.between_blocks). What a layer may read of the layers below it is in
Carry: each earlier layer's Heads (its queries, keys, values, attention and output).
"""
import math
from collections import namedtuple
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import (GPT, VARIANTS, Block, CausalSelfAttention, GPTConfig, KVCache, attention, need,
                   newest, normal_init, variant_lambdas)

# The baselines' named variants: NeuTRENO (ICLR Eqn. 8; code: λ = 0.4, and 0.2 with ResFormer),
# DenseFormer, cross-layer sharing of K and V in pairs (CLA) or of one of them (ICLR Sec. 3.5), and
# layer 1's queries or keys shared with every layer, as SVFormer shares its values (ICLR Sec. 4.8).
BASELINES = {
    'neutreno': dict(neutreno_lambda=0.4),
    'neutreno_resformer': dict(value_residual=True, neutreno_lambda=0.2),
    'denseformer': dict(denseformer=True), 'cla': dict(share_kv='kv'),
    'share_k': dict(share_kv='k'), 'share_v': dict(share_kv='v'),
    'shared_query': dict(value_residual=True, residual_type='query'),
    'shared_key': dict(value_residual=True, residual_type='key'),
}
# The value residual's successors, from outside the paper (their code at the end of this file):
# SATFormer and our static-gate control of it, Attention Residuals and Block AttnRes, and
# Depth-Attention; those that rebuild the residual stream (Hyper-Connections, mHC, MUDDFormer) are
# CONNECTIONS, below them.
SUCCESSORS = {
    'satformer': dict(value_gate='relu'),
    'gated_resformer': dict(value_gate='relu', value_gate_static=True),
    'attn_res': dict(attn_res='full'), 'attn_res_block': dict(attn_res='block'),
    'depth_attention': dict(depth_attention=True),
}
CHOICES = dict(residual_from=('first', 'second', 'adjacent', 'previous', 'dense'),
               residual_type=('value', 'query', 'key', 'attention', 'hidden'),
               value_mapping=('current', 'first', 'identity', 'cross'),
               share_kv=('none', 'kv', 'k', 'v'), backbone=('llama', 'gpt2'),
               value_gate=('none', 'relu', 'sigmoid', 'tanh'), attn_res=('none', 'full', 'block'))


@dataclass
class AblationConfig(GPTConfig):
    residual_from: str = 'first'
    """Whose values layer n mixes in: 'first' (V1, the paper's), 'second' (V2; layers 1-2 then mix
    nothing in; v5), 'adjacent' (V_{n-1}) or 'previous' (the mean of V_1 .. V_{n-1}; ICLR Fig. 11),
    'dense' (Dense-ResFormer, v5: V'_n = Σ_{i<=n} w_{n,i} V_i, w learned from Identity's 0.5/0.5)."""
    residual_type: str = 'value'
    """What λ mixes (v5; ICLR Fig. 9): 'value' (ResFormer), 'query', 'key', 'attention' (A itself)
    or 'hidden' (ours: the attention reads λ1 norm(H_s) + λ2 norm(H_{n-1}), H_s the source's input)."""
    value_mapping: str = 'current'
    """Which attention maps V1 (ICLR Fig. 10): 'current' (A_n, ResFormer), 'first' (λ1 A_1 V1 + λ2
    A_n V_n), 'identity' (ICLR Eqn. 6: A_n V_n + the mean of V_1 .. V_{n-1}, unattended) or 'cross'
    (cross-layer attention, ICLR Eqn. 2: layer n attends over layer 1's keys and values and its own)."""
    value_rescale: bool = False
    """Post-residual rescaling (v5 Table 10, second-hand; its form is ours): V'_n / (λ1 + λ2)."""
    anchors: tuple = ()
    """SVFormer's anchors (ICLR Fig. 17): layers that keep their own values, which the SVFormer
    layers above them read instead of V1 (their λ rows become (0, 1))."""
    h0_residual: bool = True
    """False: block 1 drops its residual connection from H0, so V2 no longer carries H0 (v5)."""
    neutreno_lambda: float = 0.0
    """NeuTRENO (ICLR Eqn. 8): U_n = A_n V'_n + λ(V1 - V'_n) after the source layer; 0: off."""
    denseformer: bool = False
    """DenseFormer: each block's input a learned average of the embedding and all block outputs."""
    share_kv: str = 'none'
    """Layer pairs (1, 2), (3, 4), ... share 'kv' (CLA), 'k' or 'v' (ICLR Sec. 3.5), or 'none'."""
    backbone: str = 'llama'
    """'gpt2': the official GPT-2 78M's blocks (code: LayerNorm, a 4d GELU MLP, biases, learned
    positions instead of RoPE; ICLR Fig. 15c), with ffn_hidden None = 4 * n_embd."""
    value_embeds: bool = False
    """Value embeddings (nanochat, not the paper): every other layer adds a gated token table."""
    value_bank: bool = False
    """Bank of Values (He et al., arXiv 2606.02780; not the paper): the top third of the layers
    look their values up in token tables, V_n = γ_v E_n[token], and cache token ids."""
    # --- the value residual's successors (check_successors, ValueGate, depth_mix, AttnResBlock)
    value_gate: str = 'none'
    """SATFormer (arXiv 2605.03953): V'_n = V_n + gate(W_α h_n) ⊙ V1, a scalar per token and
    KV head; 'relu' (the paper's: variant satformer's), 'sigmoid' or 'tanh'; 'none': off."""
    value_gate_last_k: int = 0
    """SATFormer's value_residual_last_k: the last k layers alone gate V1 in; 0: all but layer 1."""
    value_gate_static: bool = False
    """gated_resformer (ours): the gate reads a learned β per layer and KV head, not W_α h_n."""
    attn_res: str = 'none'
    """Attention Residuals (arXiv 2603.15031): each sublayer reads a softmax over depth of the
    embedding and the sublayers' outputs ('full') or of block sums ('block'); 'none': off."""
    attn_res_block: int = 0
    """Block AttnRes: Transformer layers per block; 0: n_layer // 8 (about 8 blocks), at least 1."""
    depth_attention: bool = False
    """Depth-Attention (arXiv 2606.05014): layer n's values are a softmax over depth, by its query
    against layers 1 .. n's keys at the same position, of their values (depth_mix)."""
    # --- successors that change the residual stream (CONNECTIONS, at the end of this file)
    hyper_connections: str = 'none'
    """'hc': Hyper-Connections (Zhu et al., ICLR 2025), hc_rate residual streams mixed by learned
    width and depth connections; 'mhc': mHC (Xie et al., arXiv 2512.24880), their mixing doubly
    stochastic (Sinkhorn); 'none'."""
    hc_rate: int = 4
    """Hyper-connections' expansion rate n: how many residual streams (both papers' 4)."""
    hc_dynamic: bool = True
    """Hyper-connections: dynamic (DHC: the connections depend on each token's streams), or
    static."""
    muddformer: bool = False
    """MUDDFormer (Xiao et al., ICML 2025): each layer's Q, K, V and residual inputs are per-token
    learned mixes of the embedding and every earlier block's output."""

    def __post_init__(self):
        gpt2_width = self.ffn_hidden is None and self.backbone == 'gpt2'
        self.anchors = tuple(self.anchors) if isinstance(self.anchors, (list, tuple)) else self.anchors
        need(isinstance(self.anchors, tuple) and all(isinstance(n, int) for n in self.anchors),
             f"anchors={self.anchors!r}: a list of layer numbers, e.g. [5, 8]")
        super().__post_init__()
        if gpt2_width:
            self.ffn_hidden = 4 * self.n_embd

    @property
    def source_layer(self):  # layers up to it mix nothing in
        return 2 if self.residual_from == 'second' else 1

    def apply_variant(self):
        """GPTConfig's, with BASELINES and their λ too: neutreno_resformer mixes as Identity,
        shared_query and shared_key weigh layer 1's Q or K alone, (1, 0); SVFormer's anchors keep
        their own values, (0, 1)."""
        if self.variant in VARIANTS and not self.anchors:  # a paper variant: model.py's flags and λ
            return super().apply_variant()
        identity = self.variant == 'neutreno_resformer'
        rows = variant_lambdas('resformer_identity' if identity else self.variant, self.n_layer,
                               self.source_layer)
        if self.variant in ('shared_query', 'shared_key'):
            rows = ((0.0, 1.0),) + ((1.0, 0.0),) * (self.n_layer - 1)
        if rows and self.anchors:
            rows = tuple((0.0, 1.0) if n in self.anchors else row for n, row in enumerate(rows, start=1))
        presets = VARIANTS | BASELINES | SUCCESSORS | CONNECTIONS
        if self.value_gate != 'none' and 'value_gate' in presets[self.variant]:  # another gate
            presets[self.variant] = presets[self.variant] | dict(value_gate=self.value_gate)
        super().apply_variant(presets, rows)

    def check(self):
        check_connections(self)
        for name, choices in CHOICES.items():
            need(getattr(self, name) in choices, f"{name}={getattr(self, name)!r}; use one of "
                                                 f"{', '.join(map(repr, choices))}")
        need(isinstance(self.neutreno_lambda, (int, float)) and math.isfinite(self.neutreno_lambda),
             f"neutreno_lambda={self.neutreno_lambda!r} must be a finite number")
        need(isinstance(self.anchors, tuple) and all(
            isinstance(n, int) and 1 < n <= self.n_layer for n in self.anchors),
             f"anchors={self.anchors!r}: layer numbers from 2 to n_layer={self.n_layer}")
        check_successors(self)
        super().check()
        need(not self.neutreno_lambda or self.n_kv_head == self.n_head,
             "NeuTRENO adds λ(V1 - V_n) to the merged heads and needs n_kv_head = n_head")
        if self.value_embeds:
            lacking = [n for n in layers(self) if has_value_embed(self, n) and not owns(self, n, 'v')]
            need(not lacking, f"value_embeds adds to a layer's own values, but layer(s) {lacking} "
                              "have none (SVFormer or share_kv); drop value_embeds or pick another variant")
        if self.value_bank:
            need(self.n_layer >= 2, "value_bank needs n_layer >= 2: the last third of one layer is "
                                    "layer 1, whose values already depend on the token alone")
            bank = [n for n in layers(self) if in_value_bank(self, n)]
            for clash, why in (
                    (lambda n: has_value_embed(self, n), "value_embeds gives them a token table too"),
                    (lambda n: shares_prev(self, n, 'v'), "share_kv makes them reuse the values below"),
                    (lambda n: self.is_svformer_layer(n), "they are SVFormer layers, with no values")):
                found = [n for n in bank if clash(n)]
                need(not found, f"value_bank replaces the values of layers {bank[0]}-{bank[-1]}, but "
                                f"{why} (layers {found}); drop one of them")
        if not self.value_residual:
            need(self.residual_type == 'value' and self.value_mapping == 'current' and not
                 self.value_rescale and not self.anchors and (self.residual_from == 'first'
                                                              or self.neutreno_lambda),
                 "residual_from, residual_type, value_mapping, value_rescale and anchors choose what "
                 "value_residual mixes; set value_residual=True")
            return
        later = self.lambdas[self.source_layer:]
        plain = self.residual_type == 'value' and self.value_mapping == 'current'
        unweighted = self.lambdas == self.default_lambdas() and self.lambda_mode == 'fixed' \
            and not self.value_rescale
        need(self.value_mapping in ('current', 'first') or (unweighted and self.residual_from == 'first'),
             f"value_mapping={self.value_mapping!r} has no λ: use residual_from='first' and drop "
             "lambdas, lambda_mode and value_rescale")
        need(self.residual_from != 'dense' or unweighted and plain,
             "residual_from='dense' learns its own weights: drop lambdas, lambda_mode, value_rescale, "
             "residual_type and value_mapping")
        need(self.residual_from in ('first', 'second') or self.residual_type == 'value',
             f"residual_from={self.residual_from!r} mixes values: use residual_type='value'")
        need(self.value_mapping == 'current' or self.residual_type == 'value',
             f"value_mapping={self.value_mapping!r} maps values, but residual_type="
             f"{self.residual_type!r}; use residual_type='value'")
        shares = {'value': ('v', 'kv'), 'key': ('k', 'kv')}.get(self.residual_type, ())
        need(self.share_kv not in shares, f"share_kv={self.share_kv!r} and residual_type="
             f"{self.residual_type!r} both redefine the same projection; use another share_kv")
        zero = [n for n, (_, own) in enumerate(self.lambdas, start=1) if own == 0]
        need(not zero or self.lambda_mode != 'fixed' or self.residual_from in ('first', 'second')
             and self.residual_type in ('value', 'query', 'key') and self.value_mapping == 'current',
             f"layers {zero} have a weight 0 on their own term, which only drops the projection "
             "(SVFormer, shared_query, shared_key) with fixed λ from the first or second layer")
        need(not self.anchors or plain and self.residual_from == 'first',
             "anchors are SVFormer's: use residual_type='value' and residual_from='first'")
        need(all(self.lambdas[n - 1] == (0.0, 1.0) for n in self.anchors),
             f"anchors {list(self.anchors)} keep their own values: give their λ rows (0, 1)")
        need(not self.value_rescale or all(a + b != 0 for a, b in later),
             "value_rescale divides by λ1 + λ2, which is 0 in some row of lambdas")

    def default_lambdas(self):
        return variant_lambdas('resformer_identity', self.n_layer, self.source_layer)

    def is_svformer_layer(self, n):
        return super().is_svformer_layer(n) and mixes(self, n) == 'value' \
            and self.value_mapping == 'current'


def build_model(config):
    """The model a config describes: the paper's GPT, or an AblationGPT when the config sets any of
    AblationConfig's own fields (or names one of BASELINES or SUCCESSORS)."""
    return AblationGPT(config) if ablations(config) else GPT(config)


def ablations(config):
    """AblationConfig's own fields that config sets away from their defaults."""
    own = [f for f in fields(config) if f.name not in {g.name for g in fields(GPTConfig)}]
    return [f.name for f in own if getattr(config, f.name) != f.default]


def layers(config):
    return range(1, config.n_layer + 1)


def mixes(config, n):
    """What the λ table mixes into layer n: None (vanilla, or a layer up to the source), 'value'
    (ResFormer), 'query', 'key', 'attention' or 'hidden'."""
    return config.residual_type if config.value_residual and n > config.source_layer else None


def shares_prev(config, n, what):
    """CLA pairs (1, 2), (3, 4), ...: the second layer of a pair reuses the first's K ('k') or V."""
    return n % 2 == 0 and config.share_kv in (what, 'kv')


def owns(config, n, what):
    """Whether layer n projects its own queries, keys or values ('q', 'k', 'v')."""
    zero_own = config.value_residual and n > config.source_layer and config.lambda_mode == 'fixed' \
        and config.lambdas[n - 1][1] == 0 and mixes(config, n) == {'q': 'query', 'k': 'key'}.get(
            what, 'value') and config.value_mapping == 'current'
    return not (zero_own or what != 'q' and shares_prev(config, n, what)
                or what == 'v' and in_value_bank(config, n))


def has_value_embed(config, n):
    """nanochat's placement of value embeddings: alternating layers, counted from the last."""
    return config.value_embeds and n % 2 == config.n_layer % 2


def in_value_bank(config, n):
    """BoV's placement: the last third of the layers, never layer 1."""
    return config.value_bank and n > (2 * config.n_layer) // 3


# What one attention layer hands to later ones: q (B, H, T, hd) after RoPE; k, v (B, H_kv, T_k, hd)
# over every cached position; attn (B, H, T, T_k) when explicit; out, U = attn·v before W_O; fresh,
# the layer's own values V_n (before any mixing) at the new positions.
Heads = namedtuple('Heads', 'q k v attn out fresh')


class Carry:
    """What one forward hands from layer to layer beyond V1: every earlier layer's Heads, the token
    ids, DenseFormer's streams and the hidden residual's H_s (GPT.forward hands V1 alone)."""

    def __init__(self, idx, tokens, x, stats):
        self.idx, self.tokens, self.stats = idx, tokens, stats  # new tokens, every position's
        self.layers = []           # the Heads of layers 1 .. n-1
        self.streams = [x]         # DenseFormer's X_0 (the embedding), X_1, ...: block outputs
        self.h_source = None       # the source layer's input H_s (the hidden residual)
        self.depth = None          # Attention Residuals' sources (DepthSources)


class AblationAttention(CausalSelfAttention):
    """CausalSelfAttention plus the ablations that change a layer's attention; with none of them it
    computes what CausalSelfAttention does."""

    def __init__(self, config, n):
        super().__init__(config, n, own=''.join(p for p in 'qkv' if owns(config, n, p)))
        self.n, self.mixes = n, mixes(config, n)
        self.takes_v1 = self.mixes == 'value' and config.value_mapping == 'current' \
            and n not in config.anchors
        self.svformer = config.is_svformer_layer(n)
        self.mapping = config.value_mapping if self.mixes == 'value' else None
        self.residual_from, self.anchors = config.residual_from, (1, *config.anchors)
        self.shares_k, self.shares_v = shares_prev(config, n, 'k'), shares_prev(config, n, 'v')
        self.explicit = self.mixes == 'attention' or config.value_residual and \
            config.residual_type == 'attention' and n == config.source_layer
        self.neutreno_lambda = config.neutreno_lambda if n > config.source_layer else 0.0
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        if config.backbone == 'gpt2':  # GPT-2's projections have biases
            for name in ('c_q', 'c_k', 'c_v', 'c_proj'):
                if getattr(self, name) is not None:
                    linear = getattr(self, name)
                    setattr(self, name, nn.Linear(linear.in_features, linear.out_features))
        # Dense-ResFormer's weights on V_1 .. V_n, from Identity's 0.5 V1 + 0.5 V_n
        self.dense = nn.Parameter(torch.tensor([0.5] + [0.0] * (n - 2) + [0.5])) \
            if self.takes_v1 and config.residual_from == 'dense' else None
        # value embeddings: a token table, gated by the first 12 channels of the layer's input
        embeds = has_value_embed(config, n)
        self.value_embed = nn.Embedding(config.vocab_size, kv_dim) if embeds else None
        self.ve_gate = nn.Linear(min(12, d), self.n_kv_head, bias=False) if embeds else None
        # the bank of values: the layer's own token table, and BoV's learned scale of it
        in_bank = in_value_bank(config, n)
        self.bank = nn.Embedding(config.vocab_size, kv_dim) if in_bank else None
        self.gamma_v = nn.Parameter(torch.ones(1)) if in_bank else None
        self.value_gate = ValueGate(config) if gates_v1(config, n) else None  # SATFormer
        self.depth_attention = config.depth_attention and n > 1  # layer 1 has no depth to mix

    @torch.no_grad()
    def init_tables(self, wte, eps):
        """After GPT's init: nanochat's value-embedding gate starts a little above 3σ(0) = 1.5;
        BoV's bank row t at RMSNorm(wte[t]) W_V^T, the layer's values from the token alone (W_V
        drawn, then dropped)."""
        if self.ve_gate is not None:
            nn.init.uniform_(self.ve_gate.weight, 0.0, 0.02)
        if self.bank is not None:
            x0 = F.rms_norm(wte, (wte.size(1),), eps=eps)
            w_v = x0.new_empty(self.bank.embedding_dim, wte.size(1)).normal_(mean=0.0, std=0.02)
            self.bank.weight.copy_(x0 @ w_v.T)

    def forward(self, x, rope, lambda_n, carry, kv_cache):
        """CausalSelfAttention.forward's steps, each with the ablations that change it. x: the
        input, or one each for Q, K and V (MUDDFormer). Returns (output (B, T, C), its Heads)."""
        x_q, x_k, x_v = x if isinstance(x, tuple) else (x, x, x)
        source = self.source(carry)
        q = self.queries(x_q, rope, lambda_n, source)
        k = self.keys(x_k, rope, lambda_n, source, carry, kv_cache)
        v, fresh = self.values(x_v, lambda_n, source, carry, kv_cache, q, k)
        y, probs = self.attend(q, k, v, lambda_n, source, carry)
        return self.project_out(y), Heads(q, k, v, probs, y, fresh)

    def source(self, carry):
        """The Heads of the layer this one mixes in: layer 1 (or 2, or the last anchor below it)."""
        if not carry.layers:
            return None
        if self.residual_from == 'second':
            return carry.layers[1] if len(carry.layers) > 1 else None
        return carry.layers[max(a for a in self.anchors if a < self.n) - 1]

    def queries(self, x, rope, lambda_n, source):
        if self.c_q is None:  # shared_query: layer 1's Q1
            return lambda_n[0] * source.q
        q = self.heads(self.c_q, x, rope)
        return lambda_n[0] * source.q + lambda_n[1] * q if self.mixes == 'query' else q  # RoPE: linear

    def keys(self, x, rope, lambda_n, source, carry, kv_cache):
        if self.shares_k:  # CLA / share-K: the previous layer's keys
            return carry.layers[-1].k
        if self.c_k is None:  # shared_key: layer 1's K1, every position's
            return lambda_n[0] * source.k
        k = self.heads(self.c_k, x, rope)
        if self.mixes == 'key':  # the key residual, K'_n = λ1 K1 + λ2 K_n
            k = lambda_n[0] * newest(source.k, k.size(2)) + lambda_n[1] * k
        return k if kv_cache is None else kv_cache.store('k', self.k_slot, k)

    def values(self, x, lambda_n, source, carry, kv_cache, q, k):
        """(what the layer attends over, its own V_n at the new positions). q, k: the layer's
        queries and keys, which Depth-Attention's mixing reads."""
        v1 = self.source_values(source, carry)
        if self.shares_v:  # CLA / share-V: the previous layer's values
            return carry.layers[-1].v, None
        if self.bank is not None:
            # Bank of Values: V_n = γ_v E_n[token], a function of the token ids alone, so the cache
            # keeps those (AblationGPT.forward) and every position's values are looked up again
            B, T = carry.tokens.shape
            table = self.bank(carry.tokens).view(B, T, self.n_kv_head, self.head_dim)
            v = self.gamma_v * table.transpose(1, 2)
            fresh = newest(v, x.size(1))
            return (lambda_n[0] * v1 + lambda_n[1] * v if self.takes_v1 else v), fresh
        if self.svformer:
            return super().values(x, lambda_n, v1, kv_cache), None
        v = self.heads(self.c_v, x)                                       # V_n = x W_V
        if self.value_embed is not None:  # nanochat: V_n += 3σ(W_g x[:12]) E_n[token], per head
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features]))
            table = self.value_embed(carry.idx).view(*x.shape[:2], self.n_kv_head, self.head_dim)
            v = v + gate.transpose(1, 2).unsqueeze(-1) * table.transpose(1, 2)
        if self.dense is not None:  # Dense-ResFormer: V'_n = Σ_{i<n} w_{n,i} V_i + w_{n,n} V_n
            earlier = [heads.fresh for heads in carry.layers] + [v]
            mixed = sum(w * vi for w, vi in zip(self.dense, earlier))
        elif self.depth_attention:  # Depth-Attention: layers 1 .. n's values, by q_n · K_m
            T = v.size(2)
            keys = [newest(heads.k, T) for heads in carry.layers] + [newest(k, T)]
            mixed = depth_mix(q, keys, [heads.fresh for heads in carry.layers] + [v])
        else:
            mixed = self.mix(lambda_n, v1, v)
        if self.value_gate is not None:  # SATFormer: V'_n = V_n + α_n ⊙ V1, at the new positions
            mixed = mixed + self.value_gate(x, carry.layers[0].fresh)
        return (mixed if kv_cache is None else kv_cache.store('v', self.v_slot, mixed)), v

    def source_values(self, source, carry):
        """What λ1 weighs: the source layer's values (every position's), or, at the new positions,
        the previous layer's own V_{n-1} ('adjacent') or the mean of V_1 .. V_{n-1} ('previous')."""
        if self.residual_from == 'adjacent' and carry.layers:
            return carry.layers[-1].fresh
        if self.residual_from == 'previous' and carry.layers:
            return sum(heads.fresh for heads in carry.layers) / len(carry.layers)
        return None if source is None else source.v

    def attend(self, q, k, v, lambda_n, source, carry):
        """(U (B, H, T, hd) before W_O, the attention matrix when it is computed explicitly)."""
        dropout = self.dropout if self.training else 0.0
        probs, repeat = None, self.n_head // self.n_kv_head
        if self.explicit:  # the attention-matrix residual mixes A itself: A'_n = λ1 A1 + λ2 A_n
            probs = attention_probs(q, k)
            if self.mixes == 'attention':
                probs = lambda_n[0] * source.attn + lambda_n[1] * probs
            y = F.dropout(probs, dropout) @ v.repeat_interleave(repeat, dim=1)
        elif self.mapping == 'cross':  # ICLR Eqn. 2: softmax(Q_n [K_n; K_1]^T) [V_n; V_1]
            first = carry.layers[0]
            y = cross_attention(q, k, v, first.k, first.v, dropout)
        else:
            y = attention(q, k, v, dropout)
        if self.mapping == 'first':  # mapped by layer 1's attention: λ1 A1 V1 + λ2 A_n V_n
            y = lambda_n[0] * source.out + lambda_n[1] * y
        if self.mapping == 'identity':  # ICLR Eqn. 6: U_n = A_n V_n + 1/(n-1) Σ_{i<n} V_i
            v_sum = sum(heads.fresh for heads in carry.layers)
            y = y + (v_sum / len(carry.layers)).repeat_interleave(repeat, dim=1)
        if self.neutreno_lambda:  # NeuTRENO: U_n += λ (V1 - V'_n)
            T = q.size(2)
            y = y + self.neutreno_lambda * (newest(source.v, T) - newest(v, T))
        return y, probs


def attention_probs(q, k):
    """The causal attention matrix softmax(QK^T/sqrt(d_h)) as a tensor (B, H, T, T_k): for the
    attention-matrix residual and for analysis, which need A itself rather than A·V."""
    T, T_k = q.size(2), k.size(2)
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    causal = torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return scores.masked_fill(~causal, float('-inf')).softmax(dim=-1)


def cross_attention(q, k, v, k_first, v_first, dropout_p):
    """ICLR Eqn. 2 with m = 1: one softmax over the layer's own keys and layer 1's, each causal (ours:
    the paper gives no mask), concatenated along the positions; the values likewise."""
    T, T_k = q.size(2), k.size(2)
    causal = torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return F.scaled_dot_product_attention(q, torch.cat([k, k_first], 2), torch.cat([v, v_first], 2),
                                          attn_mask=torch.cat([causal, causal], 1),
                                          dropout_p=dropout_p, enable_gqa=k.size(1) != q.size(1))


class GeluMLP(nn.Module):
    """GPT-2's MLP: c_proj(gelu_tanh(c_fc(x))), with biases."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.ffn_hidden)
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x):
        y = self.c_proj(F.gelu(self.c_fc(x), approximate='tanh'))
        return F.dropout(y, self.dropout, self.training)


class AblationBlock(Block):
    """Block with AblationAttention, the hidden residual, h0_residual and GPT-2's block."""

    def __init__(self, config, n):
        super().__init__(config, n, attention=AblationAttention)
        self.adds_input = n > 1 or config.h0_residual
        self.mixes_hidden = mixes(config, n) == 'hidden'
        if config.backbone == 'gpt2':
            self.norm_attn = nn.LayerNorm(config.n_embd, eps=config.norm_eps)
            self.norm_mlp = nn.LayerNorm(config.n_embd, eps=config.norm_eps)
            self.mlp = GeluMLP(config)

    def forward(self, x, rope, lambda_n, carry, kv_cache):
        """Returns (x, Heads)."""
        h = self.norm_attn(x)
        if self.mixes_hidden:  # hidden residual: the attention reads λ1 norm(H_s) + λ2 norm(x_n)
            h = lambda_n[0] * self.norm_attn(carry.h_source) + lambda_n[1] * h
        y, heads = self.attn(h, rope, lambda_n, carry, kv_cache)
        x = x + y if self.adds_input else y
        return x + self.mlp(self.norm_mlp(x)), heads


class TokenKVCache(KVCache):
    """KVCache, and the token ids a bank of values looks its values up from (instead of values)."""

    TOKEN_ID_DTYPE = torch.long  # not int32: the cast makes a compiled decoder specialise on slices

    def __init__(self, n_k_slots, n_v_slots, max_seq_len):
        super().__init__(n_k_slots, n_v_slots, max_seq_len)
        self.tokens = None

    def store_tokens(self, idx):
        """Write token ids (B, T) at self.pos; return every position's so far (B, pos + T)."""
        B, T = idx.shape
        if self.tokens is None:
            self.tokens = idx.new_empty(B, self.max_seq_len, dtype=self.TOKEN_ID_DTYPE)
        self.tokens[:, self.pos:self.pos + T] = idx
        return self.tokens[:, :self.pos + T]


class AblationGPT(GPT):
    """GPT with this file's ablations, baselines and token tables, and the per-layer statistics that
    lab/analyze.py reads. With none of them set it computes what GPT does, bit for bit."""

    def __init__(self, config):
        super().__init__(config, block=block_type(config))
        L = config.n_layer
        # DenseFormer's α: block n's output weights X_0 .. X_n, started at the identity
        self.dwa = nn.ParameterList(nn.Parameter(F.one_hot(torch.tensor(n), n + 1).float())
                                    for n in range(1, L + 1)) if config.denseformer else None
        self.wpe = None
        if config.backbone == 'gpt2':  # learned positions, a final LayerNorm
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)
            self.norm_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps)

    def init_weights(self):
        """GPT's init, the token tables drawn last (where GPT once held them: a seed gives the same
        weights), then each layer's table init; GPT-2's: biases 0, its residual projections (W_O
        and the MLP's c_proj) N(0, (0.02/√(2 n_layer))²), as Hugging Face's GPT-2."""
        tables = self.token_tables()
        normal_init(sorted(self.modules(), key=lambda m: m in tables))
        for block in self.blocks:
            block.attn.init_tables(self.wte.weight, self.config.norm_eps)
        if self.config.backbone == 'gpt2':
            for name, p in self.named_parameters():
                if name.endswith('.bias'):
                    nn.init.zeros_(p)
                elif name.endswith('c_proj.weight'):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def whole_table(self, later):
        """GPT's, rescaled where asked: post-residual rescaling, V'_n / (λ_{n,1} + λ_{n,2})."""
        table = super().whole_table(later)
        return table / table.sum(dim=1, keepdim=True) if self.config.value_rescale else table

    def token_tables(self):
        """The layers' token tables (value embeddings, banks of values), in layer order."""
        return [table for block in self.blocks
                for table in (block.attn.value_embed, block.attn.bank) if table is not None]

    def num_params(self, exclude_embedding=False):
        """GPT's, and without the token tables and learned positions when exclude_embedding."""
        tables = self.token_tables() + ([self.wpe] if self.wpe is not None else [])
        n = super().num_params(exclude_embedding)
        return n - sum(t.weight.numel() for t in tables) if exclude_embedding else n

    def embed(self, idx, kv_cache):
        """GPT's, and GPT-2's learned positions in place of RoPE (added after the embedding's
        dropout, where GPT-2 adds them before: the same at the paper's dropout of 0)."""
        x, rope = super().embed(idx, kv_cache)
        if self.wpe is None:
            return x, rope
        pos = 0 if kv_cache is None else kv_cache.pos
        return x + self.wpe(torch.arange(pos, pos + idx.size(1), device=idx.device)), None

    def new_kv_cache(self, max_seq_len=None):
        """GPT's cache, with room for the token ids a bank of values keeps instead of its values."""
        return TokenKVCache(*self.kv_slots, super().new_kv_cache(max_seq_len).max_seq_len)

    def kv_bytes_per_token(self, element_size=2):
        """GPT's, and the token id that a bank of values caches instead of its values."""
        bank = self.config.value_bank * TokenKVCache.TOKEN_ID_DTYPE.itemsize
        return super().kv_bytes_per_token(element_size) + bank

    def forward(self, idx, targets=None, kv_cache=None, stats=None):
        """GPT.forward, with Carry handed from block to block. stats: a dict to fill with per-layer
        'attn', 'keys', 'values' (what each layer attends over) and 'hidden' (lab/analyze.py)."""
        x, rope = self.embed(idx, kv_cache)
        lambdas = self.lambdas
        # the token ids of every position attended over, cached ones included: a bank's values
        bank = kv_cache is not None and self.config.value_bank
        carry = Carry(idx, kv_cache.store_tokens(idx) if bank else idx, x, stats)
        for n, block in enumerate(self.blocks, start=1):
            x = self.between_blocks(n, x, carry)
            x, heads = block(x, rope, lambdas[n - 1], carry, kv_cache)
            carry.layers.append(heads)
        x = self.between_blocks(len(self.blocks) + 1, x, carry)
        return self.head(x, targets, kv_cache)

    def between_blocks(self, n, x, carry):
        """The residual stream x before block n (n = n_layer + 1: after the last), where DenseFormer,
        the statistics and the hidden residual's H_s act."""
        if n > 1 and self.dwa is not None:  # DenseFormer: X_{n-1} becomes Σ_j α_{n-1,j} X_j
            carry.streams.append(x)
            x = sum(a * h for a, h in zip(self.dwa[n - 2], carry.streams))
        stats = carry.stats
        if stats is not None and n == 1:
            stats.update(attn=[], keys=[], values=[], hidden=[])
        elif stats is not None:  # block n - 1's A (computed here unless it was), K, V', output
            prev = carry.layers[-1]
            stats['attn'].append(attention_probs(prev.q, prev.k) if prev.attn is None else prev.attn)
            stats['keys'].append(prev.k)
            stats['values'].append(prev.v)
            stats['hidden'].append(x)
        if n == self.config.source_layer:
            carry.h_source = x  # H_s, the source block's input (H0 = the embedding)
        return x


# --- The value residual's successors: SATFormer, Depth-Attention and Attention Residuals. Each is
# an AblationConfig field (value_gate, depth_attention, attn_res), checked here, acting through
# ValueGate or depth_mix (in AblationAttention.values) or AttnResBlock (the block AblationGPT builds
# when attn_res is set).

def check_successors(config):
    """The successors' settings that cannot work, each a one-line ValueError."""
    for name in ('value_gate_last_k', 'attn_res_block'):
        value = getattr(config, name)
        need(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
             f"{name}={value!r} must be an int >= 0 (0: the default)")
    gated = config.value_gate != 'none'
    need(gated or not (config.value_gate_last_k or config.value_gate_static),
         "value_gate_last_k and value_gate_static shape SATFormer's gate: set value_gate too")
    need(config.value_gate_last_k <= config.n_layer, f"value_gate_last_k="
         f"{config.value_gate_last_k} counts more layers than n_layer={config.n_layer}")
    need(not gated or config.n_layer >= 2, "value_gate needs n_layer >= 2: layer 1 gates nothing")
    need(not gated or not config.value_residual,
         "value_gate adds V1 itself (V_n + α V1): use variant='satformer' or drop value_residual")
    need(not gated or config.share_kv in ('none', 'k') and not config.value_bank,
         "value_gate adds to a layer's own values: drop share_kv='v'/'kv' and value_bank")
    need(not config.depth_attention or not (config.value_residual or gated or config.value_bank
                                             or config.share_kv != 'none'),
         "depth_attention mixes each layer's own keys and values and caches the result: drop "
         "value_residual, value_gate, value_bank and share_kv")
    need(not config.depth_attention or config.n_layer >= 2,
         "depth_attention needs n_layer >= 2: layer 1 has no earlier layers to mix")
    need(config.attn_res == 'block' or not config.attn_res_block,
         "attn_res_block sizes Block AttnRes's blocks: set attn_res='block' too")
    need(config.attn_res == 'none' or not config.denseformer and config.h0_residual
         and config.residual_type != 'hidden', "attn_res replaces the residual stream: drop "
         "denseformer, h0_residual=False and residual_type='hidden'")


def gates_v1(config, n):
    """SATFormer's layers: after layer 1, the last value_gate_last_k of them when it is set."""
    k = config.value_gate_last_k or config.n_layer
    return config.value_gate != 'none' and n > 1 and n > config.n_layer - k


class ValueGate(nn.Module):
    """SATFormer (Gunasekaran et al., arXiv 2605.03953; code: models/satformer/attn_satformer.py,
    ValueResidualMixing): layer n adds V1 gated per token and KV head, V'_n = V_n + α_n ⊙ V1 with
    α_n = gate(W_α h_n), W_α: (n_embd -> n_kv_head), no bias (the code's default). As in the code:
    h_n is the attention's input after its norm (what W_Q, W_K, W_V read), V1 layer 1's own values,
    not detached, V_n gets no weight, and W_α starts N(0, 0.02²) as every linear (normal_init), so
    with ReLU about half the gates start open, each a little (we read the code; of the paper, its
    abstract alone). The KV cache holds the mixed V'_n, as ResFormer's: SATFormer caches no more
    than the Transformer. Ours: model.py's backbone (the code's configs tie the embeddings and add
    a QK-norm). SATFormer's `resformer` baseline is Learnable-Plus with λ' started at 0
    (resformer_learnable_plus here); its `gatedresformer` is SATFormer's earlier name
    (commit f6f8692 renamed it, the code unchanged), so value_gate_static names our own control
    instead: α_{n,h} = gate(β_{n,h}), one learned scalar per layer and KV head, β started at 0.5 (α
    = 0.5 with ReLU: V_n + 0.5 V1): head-wise like SATFormer but blind to the token."""

    def __init__(self, config):
        super().__init__()
        self.gate = getattr(torch, config.value_gate)  # torch.relu, torch.sigmoid or torch.tanh
        static = config.value_gate_static
        self.c_alpha = None if static else nn.Linear(config.n_embd, config.n_kv_head, bias=False)
        self.beta = nn.Parameter(torch.full((config.n_kv_head,), 0.5)) if static else None

    def forward(self, x, v1):
        """α_n ⊙ V1: x (B, T, C), the layer's normed input; v1 (B, H_kv, T, hd) at x's positions."""
        logits = self.beta.view(-1, 1) if self.c_alpha is None else self.c_alpha(x).transpose(1, 2)
        return self.gate(logits).unsqueeze(-1) * v1  # (B or 1, H_kv, T or 1, 1): one α per head


def depth_mix(q, keys, values):
    """Depth-Attention (arXiv 2606.05014v1; we could read its abstract alone, on arXiv listings and
    its Hugging Face paper page): "before a layer attends over the sequence, its query attends over
    the keys of earlier layers at the same token position and mixes their values into the value
    that self-attention then reads". Layer n >= 2, at each position t and KV head h, attends over
    V'_n(t) = Σ_{m<=n} a_{n,m} V_m(t), a_{n,m} = softmax_m(q_n(t) · K_m(t) / √d_h), then causal
    self-attention over V'_n as usual; layer 1 is unchanged. Where the abstract leaves it open
    (ours): the softmax includes the layer's own key (m = n), so a layer can keep its own value;
    V_m is layer m's own value, before its depth mixing (every layer's own V_m and K_m at the
    current positions come from the same forward); the scale is attention's 1/√d_h; no gate, no
    temperature, no new parameter ("it adds no parameters", the abstract says); under GQA, one
    mixing per KV head with the mean of its group's queries (the mean of their scores), so that
    the cache holds one V'_n per KV head, "the same cache size as a vanilla decoder". RoPE turns
    q_n(t) and K_m(t) by the same angle, which their dot product ignores. The KV cache holds V'_n,
    as ResFormer's holds its V'_n. q: (B, H, T, hd), layer n's queries; keys, values: layers
    1 .. n's keys and own values at q's positions, each (B, H_kv, T, hd); returns V'_n, as each."""
    B, H, T, hd = q.shape
    H_kv = values[0].size(1)
    q = q.view(B, H_kv, H // H_kv, T, hd).mean(dim=2)  # one query per KV head
    scores = torch.stack([(q * k).sum(dim=-1) for k in keys]) / math.sqrt(hd)  # (n, B, H_kv, T)
    weights = scores.softmax(dim=0).unsqueeze(-1)
    # summed one layer at a time, not stacked: autograd then keeps no copy of every layer's V_m
    return sum(w * v for w, v in zip(weights, values))


def attn_res_sublayers(config):
    """Sublayers (attention, MLP) summed into one source of Attention Residuals: 1 for full AttnRes,
    where every sublayer's output is a source; twice attn_res_block layers for Block AttnRes."""
    if config.attn_res == 'full':
        return 1
    return 2 * (config.attn_res_block or max(1, config.n_layer // 8))


class DepthSources:
    """What Attention Residuals attend over in one forward: the completed sources (the embedding,
    then each block's sum of sublayer outputs) with their keys RMSNorm(source), and the sum of the
    current block's outputs so far. Each key is normalised once, and later sublayers share it."""

    def __init__(self, x, per_block, eps):
        self.eps, self.per_block, self.added = eps, per_block, 0
        self.values, self.keys = [x], [self.key(x)]
        self.partial = None

    def key(self, v):
        # no gain: a learned gain g would multiply into the pseudo-query, g ⊙ w (ours)
        return F.rms_norm(v, (v.size(-1),), eps=self.eps)

    def add(self, out):
        """A sublayer's output: into the current block's sum, which completes every per_block."""
        self.partial = out if self.partial is None else self.partial + out
        self.added += 1
        if self.added % self.per_block == 0:
            self.values.append(self.partial)
            self.keys.append(self.key(self.partial))
            self.partial = None

    def sources(self):
        """(values, keys), the current block's partial sum last when it has one."""
        if self.partial is None:
            return self.values, self.keys
        return self.values + [self.partial], self.keys + [self.key(self.partial)]


class DepthAttention(nn.Module):
    """One sublayer's input under Attention Residuals: h = Σ_i softmax_i(w · RMSNorm(v_i)) v_i over
    the sources v_i at the same position, w a learned pseudo-query started at 0, so that the
    sources start uniformly weighted (the paper, as its ports quote it)."""

    def __init__(self, config):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(config.n_embd))

    def forward(self, depth):
        values, keys = depth.sources()
        weights = torch.stack([k @ self.query for k in keys]).softmax(dim=0)  # (sources, B, T)
        return sum(w.unsqueeze(-1) * v for w, v in zip(weights, values))


class AttnResBlock(AblationBlock):
    """AblationBlock under Attention Residuals (Kimi Team, arXiv 2603.15031: its abstract, and its
    Eqs. 2-4 and Fig. 2's block_attn_res pseudo-code as public ports quote them; we could read
    neither its full text nor its official repository): the residual sum is gone; the attention
    and the MLP (each a sublayer with its own pseudo-query) read a softmax over depth
    (DepthAttention) of the token embedding and the earlier sublayers' outputs, and the final norm
    reads one more (the last layer's attn_res_out). Block AttnRes attends over block sums instead:
    the embedding, each completed block's summed outputs and the current block's partial sum.
    Where the paper leaves it open, or we could not read it (ours): the depth attention reads the
    un-normed sources, its keys RMSNorm(v_i) without a gain (which the query would absorb), and its
    result enters the sublayer's pre-norm as x did; layer 1's attention reads the embedding alone
    and has no query; blocks count Transformer layers (attn_res_block; 0: n_layer // 8, the
    paper's about 8 blocks, so one layer a block at 4 and 8 layers: Block AttnRes then sums each
    layer's attention and MLP, full AttnRes keeps them apart). It mixes each position's own
    sources: the KV cache is the Transformer's."""

    def __init__(self, config, n):
        super().__init__(config, n)
        self.n, self.per_block, self.eps = n, attn_res_sublayers(config), config.norm_eps
        self.attn_res_attn = DepthAttention(config) if n > 1 else None
        self.attn_res_mlp = DepthAttention(config)
        self.attn_res_out = DepthAttention(config) if n == config.n_layer else None

    def forward(self, x, rope, lambda_n, carry, kv_cache):
        """Returns (the MLP's input, or the final norm's after the last layer; Heads)."""
        if self.n == 1:  # x: the token embedding, the first source
            carry.depth = DepthSources(x, self.per_block, self.eps)
        depth = carry.depth
        h = x if self.attn_res_attn is None else self.attn_res_attn(depth)
        y, heads = self.attn(self.norm_attn(h), rope, lambda_n, carry, kv_cache)
        depth.add(y)
        h = self.attn_res_mlp(depth)
        depth.add(self.mlp(self.norm_mlp(h)))
        return (h if self.attn_res_out is None else self.attn_res_out(depth)), heads


# --- Successors that change the residual stream: Hyper-Connections, mHC and MUDDFormer. Each
# changes only what a block reads from the stream and how its output is added back, token by token:
# a layer computes and caches its keys and values as before, so the KV cache, kv_bytes_per_token and
# generation are the Transformer's.
CONNECTIONS = {'hyper_connections': dict(hyper_connections='hc'),
               'mhc': dict(hyper_connections='mhc'), 'muddformer': dict(muddformer=True)}


def check_connections(config):
    """CONNECTIONS' settings and what they cannot go with, each a one-line ValueError."""
    kind, rate = config.hyper_connections, config.hc_rate
    need(kind in ('none', 'hc', 'mhc'), f"hyper_connections={kind!r}; use 'none', 'hc' or 'mhc'")
    need(isinstance(rate, int) and not isinstance(rate, bool) and rate >= 1,
         f"hc_rate={rate!r} must be a positive int (the papers use 4)")
    need(kind != 'none' or (rate, config.hc_dynamic) == (4, True),
         "hc_rate and hc_dynamic set the hyper-connections: set hyper_connections='hc' or 'mhc'")
    need(kind != 'mhc' or rate >= 2 and config.hc_dynamic,
         "mHC mixes 2 or more streams with dynamic mappings (its Eqn. 7): use hc_rate >= 2 and "
         "hc_dynamic=True, or hyper_connections='hc'")
    changed = [name for name, on in (('hyper_connections', kind != 'none'),
                                     ('muddformer', config.muddformer),
                                     ('denseformer', config.denseformer)) if on]
    need(len(changed) < 2, f"{' and '.join(changed)} each rebuild the residual stream: pick one")
    need(changed in ([], ['denseformer']) or config.h0_residual and not (
        config.value_residual and config.residual_type == 'hidden'),
         f"{changed[0] if changed else ''} rebuilds the residual stream that h0_residual=False "
         "and residual_type='hidden' change: drop them")


def block_type(config):
    """The class of config's blocks: AblationBlock, or one that also rebuilds the stream."""
    if config.attn_res != 'none':
        return AttnResBlock
    if config.hyper_connections != 'none':
        return HyperBlock
    return MuddBlock if config.muddformer else AblationBlock


class HyperConnection(nn.Module):
    """Hyper-Connections (Zhu et al., ICLR 2025, arXiv 2409.19606: Sec. 2 and the pseudocode of
    Appendix J) around one layer T, an attention or an MLP, on n = hc_rate residual streams H
    (B, T, n, C): T reads h_0 = A_m^T H, and the streams become A_r^T H + B^T T(h_0).

        static (SHC): A_m (n, 1), A_r (n, n), B (1, n) learned, started at A_m = e_{k mod n} for
            the k-th of the 2L layers, A_r = I, B = 1: every stream is the plain residual stream;
        dynamic (DHC): A = A_static + s_α tanh(norm(H) W_α), B = B_static + s_β tanh(norm(H) W_β)
            per token and stream, W_α (C, n + 1) and W_β (C, 1) started at 0, s_α = s_β = 0.01
            (learned): at init the static connections.

    Ours, where the paper leaves it open: norm is RMSNorm with a gain (this backbone's norm); the
    static weights and the scales s are never weight-decayed (1-D, as λ and DenseFormer's α), W_α
    and W_β are, as any matrix. T keeps its own pre-norm, as in the paper. Parameters a layer:
    n² + 2n static, C (n + 3) + 2 more dynamic. Training FLOPs a token a layer (6 a multiply-add):
    6 n C (n + 2) for the mixing, and as much again for DHC's projections."""

    def __init__(self, config, k):
        super().__init__()
        n, C = config.hc_rate, config.n_embd
        # rows: the n streams read; columns: A_m (the layer's input), then A_r (the new streams)
        alpha = torch.cat([F.one_hot(torch.tensor([k % n]), n).float().T, torch.eye(n)], dim=1)
        self.static_alpha = nn.Parameter(alpha.flatten())
        self.static_beta = nn.Parameter(torch.ones(n))
        self.dynamic = config.hc_dynamic
        if self.dynamic:
            self.norm = nn.RMSNorm(C, eps=config.norm_eps)
            self.w_alpha_beta = nn.Parameter(torch.zeros(C, n + 2))  # W_α, then W_β
            self.scales = nn.Parameter(torch.full((2,), 0.01))      # s_α, s_β

    def forward(self, H):
        """(the layer's input h_0 (B, T, C), the streams' skip A_r^T H (B, T, n, C), B: each
        stream's weight on the layer's output, (n,) or per token (B, T, n))."""
        n = H.size(2)
        alpha, beta = self.static_alpha.view(n, n + 1), self.static_beta
        if self.dynamic:
            w = torch.tanh(self.norm(H) @ self.w_alpha_beta)                 # (B, T, n, n + 2)
            alpha = alpha + self.scales[0] * w[..., :n + 1]
            beta = beta + self.scales[1] * w[..., n + 1]
        mixed = alpha.transpose(-2, -1) @ H                                   # (B, T, n + 1, C)
        return mixed[:, :, 0], mixed[:, :, 1:], beta


def sinkhorn(logits, iterations=20):
    """exp(logits) (..., n, n) made doubly stochastic by Sinkhorn-Knopp: rows, then columns, scaled
    to sum to 1, `iterations` times (mHC's t_max = 20). The max is taken out first (it cancels)."""
    m = (logits - logits.amax(dim=(-2, -1), keepdim=True)).exp()
    for _ in range(iterations):
        m = m / m.sum(dim=-1, keepdim=True)
        m = m / m.sum(dim=-2, keepdim=True)
    return m


class ManifoldHyperConnection(nn.Module):
    """mHC (Xie et al., DeepSeek-AI, arXiv 2512.24880, Sec. 4, Eqns. 7-9) around one layer F, on n
    streams x (B, T, n, C): F reads H_pre x, and the streams become H_res x + H_post^T F(H_pre x),

        x' = RMSNorm(vec(x)) (1, nC), without a gain (the paper folds it into φ),
        H_pre = σ(α_pre x' φ_pre + b_pre), H_post = 2 σ(α_post x' φ_post + b_post) (1, n),
        H_res = Sinkhorn-Knopp(α_res mat(x' φ_res) + b_res) (n, n): doubly stochastic, so the
        mixing keeps the streams' mean, and its products over depth stay bounded (the identity).

    From the paper: dynamic mappings, n = 4, t_max = 20, the gates α started at 0.01. Ours, where we
    read no value: φ (nC, n² + 2n) drawn as our other matrices, N(0, 0.02²), and weight-decayed;
    b_pre = -log(n - 1) (H_pre = 1/n: F reads the streams' mean), b_post = 0 (H_post = 1), b_res = 0
    (H_res uniform): at α = 0 every stream is the plain residual stream. α and b are never decayed.
    The random φ is what makes the streams differ: with φ = 0 they would stay identical. Parameters
    a layer: nC (n² + 2n) + n² + 2n + 3. Training FLOPs a token a layer: 6 nC (n² + 2n) for the
    mappings, 6 nC (n + 2) for the mixing, and Sinkhorn's 6·20·2n² (negligible)."""

    def __init__(self, config, k):
        super().__init__()
        n, C = config.hc_rate, config.n_embd
        self.n, self.eps = n, config.norm_eps
        self.phi = nn.Parameter(torch.randn(n * C, n * n + 2 * n) * 0.02)   # φ_pre, φ_post, φ_res
        self.bias = nn.Parameter(torch.cat([torch.full((n,), -math.log(n - 1)),
                                            torch.zeros(n + n * n)]))      # b_pre, b_post, b_res
        self.gates = nn.Parameter(torch.full((3,), 0.01))                  # α_pre, α_post, α_res

    def mappings(self, x):
        """H_pre (B, T, n), H_post (B, T, n), H_res (B, T, n, n) of the streams x (B, T, n, C)."""
        n = self.n
        flat = F.rms_norm(x.flatten(2), (x.size(2) * x.size(3),), eps=self.eps)
        raw = (flat @ self.phi).split([n, n, n * n], dim=-1)
        pre, post, res = (a * r + b for a, r, b in zip(self.gates, raw,
                                                        self.bias.split([n, n, n * n])))
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), sinkhorn(res.unflatten(-1, (n, n)))

    def forward(self, x):
        """HyperConnection.forward's (layer input, skip, output weights): H_pre x, H_res x and
        H_post."""
        pre, post, res = self.mappings(x)
        return (pre.unsqueeze(2) @ x).squeeze(2), res @ x, post


class HyperBlock(AblationBlock):
    """AblationBlock with a hyper-connection (HC's or mHC's) around its attention and one around its
    MLP: the papers' layers are these sublayers, 2L of them. Between blocks the stream is (B, T, n,
    C): block 1 copies the embedding into the n streams (H^0), the last block sums them for the head
    (its norm follows), as HC does; mHC does not say how it reads its streams out: we sum, as HC."""

    def __init__(self, config, n):
        super().__init__(config, n)
        kind = HyperConnection if config.hyper_connections == 'hc' else ManifoldHyperConnection
        self.hc_attn, self.hc_mlp = kind(config, 2 * n - 2), kind(config, 2 * n - 1)
        self.first, self.last, self.rate = n == 1, n == config.n_layer, config.hc_rate

    def forward(self, x, rope, lambda_n, carry, kv_cache):
        if self.first:
            x = x.unsqueeze(2).expand(-1, -1, self.rate, -1)
        h, skip, out_weights = self.hc_attn(x)
        y, heads = self.attn(self.norm_attn(h), rope, lambda_n, carry, kv_cache)
        x = skip + out_weights.unsqueeze(-1) * y.unsqueeze(2)
        h, skip, out_weights = self.hc_mlp(x)
        x = skip + out_weights.unsqueeze(-1) * self.mlp(self.norm_mlp(h)).unsqueeze(2)
        return (x.sum(2) if self.last else x), heads


class MuddBlock(AblationBlock):
    """MUDDFormer (Xiao et al., ICML 2025, arXiv 2502.12170, Sec. 2; official code: pytorch/
    muddformer/modeling_muddformer.py's MultiwayDynamicDenseBlock, jax/MaxText/layers/llama2.py for
    the init): block n's output X_n (X_0: the embedding) decides, per token, how layer n + 1 reads
    X_0 .. X_n, separately for its query, key, value and residual inputs (the four ways):

        A = GELU(RMSNorm(X_n) W_1) W_2 + a   (B, T, 4, n + 1),   X^way = Σ_j A_{way, j} X_j,

    RMSNorm without a gain. The next block normalizes its Q, K and V inputs with norms of their
    own (the code's sepln) and adds its attention and MLP to X^R; the last block mixes X^R alone,
    for the head. As the official code: W_1 (C, h_n) ~ N(0, 1/C), W_2 = 0, a one-hot on X_n (its
    'current_only' init: each way starts as X_n, the Transformer), h_n = 4 (n + 1) (the last
    block's one way by expand_last's 4) rounded up past a multiple of 64 (round64). Ours: a is
    never weight-decayed (1-D), W_1 and W_2 are. Left out: the code's FFN widths growing with depth,
    its QK-norm and the JAX version's norms around the mix, which change the backbone, not the
    connections. Parameters of block n: C h_n + h_n W_n + W_n (W_n = ways (n + 1)), and 2C for the
    K and V norms from block 2 on. Training FLOPs a token: 6 Σ_n (C h_n + h_n W_n + W_n C), the last
    term (the mix) beyond 6 a parameter."""

    def __init__(self, config, n):
        super().__init__(config, n)
        C = config.n_embd
        self.n, self.eps = n, config.norm_eps
        self.ways = 1 if n == config.n_layer else 4                   # Q, K, V, R; the last: R
        if n > 1:
            self.norm_k = type(self.norm_attn)(C, eps=config.norm_eps)
            self.norm_v = type(self.norm_attn)(C, eps=config.norm_eps)
        weights = self.ways * (n + 1)
        hidden = (weights * (4 if self.ways == 1 else 1) // 64 + 1) * 64
        self.dense_in = nn.Parameter(torch.randn(C, hidden) / math.sqrt(C))  # W_1
        self.dense_out = nn.Parameter(torch.zeros(hidden, weights))          # W_2
        self.dense_bias = nn.Parameter(F.one_hot(torch.tensor(n), n + 1).float().repeat(self.ways))

    def forward(self, x, rope, lambda_n, carry, kv_cache):
        if self.n == 1:
            h = self.norm_attn(x)
        else:
            x_q, x_k, x_v, x = x
            h = self.norm_attn(x_q), self.norm_k(x_k), self.norm_v(x_v)
        y, heads = self.attn(h, rope, lambda_n, carry, kv_cache)
        x = x + y
        x = x + self.mlp(self.norm_mlp(x))
        carry.streams.append(x)                                      # X_n beside X_0 .. X_{n-1}
        a = F.gelu(F.rms_norm(x, (x.size(-1),), eps=self.eps) @ self.dense_in) @ self.dense_out
        a = (a + self.dense_bias).unflatten(-1, (self.ways, self.n + 1))
        mixed = a @ torch.stack(carry.streams, dim=2)                # (B, T, ways, C)
        return (mixed[:, :, 0] if self.ways == 1 else tuple(mixed.unbind(2))), heads
