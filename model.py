"""
Value Residual Learning (Zhou et al., arXiv 2410.17897) in one file: ResFormer and SVFormer.

A Llama-style decoder (pre-norm RMSNorm, RoPE, SwiGLU, no biases) with one extra residual path, on
the attention *values*: layer n > 1 mixes layer 1's values V1 into its own before attention,

    U_n = softmax(Q_n K_n^T / sqrt(d)) (λ_{n,1} V1 + λ_{n,2} V_n)

with a per-layer λ of shape (n_layer, 2). λ = (0, 1) is the vanilla Transformer, (0.5, 0.5) Identity
ResFormer, and (1, 0) SVFormer, whose layers n > 1 then have no value projection at all (and so
cache no values).

Reading order: GPTConfig; CausalSelfAttention, the paper's path (vanilla -> ResFormer -> SVFormer -> KV
cache) and nothing else; Block; GPT, whose forward takes V1 at layer 1 and hands it to every later layer.
Off that path: AblationAttention (Sec. 4.4's ablations, the baselines, value embeddings, the bank of values),
the building blocks (MLP, RoPE, attention, KVCache), the named variants and the config checks.
Layers are 1-based in the paper and 0-based in the code: the paper's layer n is `blocks[n - 1]`.
"""

import math
from collections import namedtuple
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    # --- architecture: a Llama-style decoder, the paper's
    block_size: int = 1024
    """Longest sequence the model sees: the size of the RoPE table and of a full KV cache."""
    vocab_size: int = 50304
    """Tokens in the embedding and LM head (GPT-2's 50257 padded to a multiple of 64)."""
    n_layer: int = 8
    """Transformer blocks (82M: 8, 180M: 12, 468M: 24)."""
    n_head: int = 8
    """Query heads; head_dim = n_embd / n_head."""
    n_kv_head: int = None
    """Key/value heads: None = n_head (MHA), fewer = GQA, 1 = MQA."""
    n_embd: int = 512
    """Model width d."""
    ffn_hidden: int = None
    """SwiGLU hidden size: None = 3.5 * n_embd, as in the paper (1792 for d = 512)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    dropout: float = 0.0
    """Dropout on attention probabilities and residual branches (the paper uses 0)."""
    tie_embeddings: bool = False
    """Share the input embedding with the LM head (the paper keeps them untied)."""
    # --- the paper's value residual
    variant: str = 'custom'
    """A name from VARIANTS that sets the flags below, or 'custom' to set them yourself."""
    value_residual: bool = False
    """Mix V1 into every later layer's values with the weights in `lambdas` (ResFormer / SVFormer)."""
    lambdas: tuple = None
    """(n_layer, 2) rows (weight on V1, weight on V_n); rows up to residual_source must be (0, 1).
    None = Identity (0.5, 0.5). A layer whose fixed weight on V_n is 0 is an SVFormer layer: no W_V."""
    lambda_mode: str = 'fixed'
    """'fixed' (λ as given), 'learnable' (λ initialised from `lambdas`), or 'plus' (Learnable-Plus:
    λ_{n,1} = λ · softmax(λ')_n, initialised to equal `lambdas`)."""
    value_rescale: bool = False
    """Post-residual rescaling, our reading of the paper: use V'_n / (λ_{n,1} + λ_{n,2})."""
    # --- the paper's Sec. 4.4 ablations: what is mixed, from where, and through which attention
    residual_source: int = 0
    """The 0-based layer later layers take the residual from: 0 = V1 (the paper), 1 = V2; layers up to it are
    unchanged. With residual_type='hidden', whose *input* is taken: 0 = H0 (the embedding), 1 = H1."""
    residual_type: str = 'value'
    """What the λ table mixes in layers after the source s (Sec. 4.4): 'value' (ResFormer), 'query' (Q'_n =
    λ1 Q_s + λ2 Q_n), 'key' (K'_n likewise), 'attention' (A'_n likewise, an explicit softmax) or 'hidden'
    (block n's attention reads λ1 norm(H_s) + λ2 norm(x_n); x_n and the MLP unchanged: our reading)."""
    value_mapping: str = 'current'
    """Which attention maps earlier values (Sec. 4.4): 'current' (ResFormer: A_n (λ1 V1 + λ2 V_n)), 'first'
    (λ1 A_1 V1 + λ2 A_n V_n) or 'identity' (ICLR Eqn. 6: U_n = A_n V_n + 1/(n-1) Σ_{i<n} V_i, unattended;
    no λ, so it takes residual_source=0 and the default lambdas, unused)."""
    h0_residual: bool = True
    """False drops block 1's residual connection of H0 (the embedding): then V2 no longer carries H0."""
    # --- the paper's baselines
    neutreno_lambda: float = 0.0
    """NeuTRENO baseline: U_n = A_n V'_n + λ(V1 - V'_n) in layers n > 1; 0 = off. Needs n_kv_head=n_head."""
    denseformer: bool = False
    """DenseFormer baseline: after each block, a learned weighted average of the embedding and the outputs."""
    share_kv: str = 'none'
    """Cross-layer sharing in pairs of layers: 'kv' (CLA), 'k' or 'v' (Table 1 ablation), or 'none'."""
    # --- outside the paper: other context-free values (each depends on the token alone, as V1 does)
    value_embeds: bool = False
    """Value embeddings (karpathy/nanochat, gpt.py): every other layer, the last included, adds a token
    table (vocab x kv_dim) to its values, gated per KV head."""
    value_bank: bool = False
    """Bank of Values (He et al., arXiv 2606.02780): each layer of the last third drops W_V and looks its
    values up in its own token table, V_n = γ_v E_n[token] (γ_v learned, from 1), so the KV cache keeps
    token ids for them. BoV trains them at AdamW lr 0.15; here they train and decay as embeddings do."""

    def __post_init__(self):
        # defaults, the named variant's flags, and a one-line ValueError for any bad setting
        resolve_config(self)

    def mixes(self, layer):
        """What the λ table mixes into 0-based layer `layer` from the source layer: None (vanilla, or a
        layer up to the source), 'value' (ResFormer), 'query', 'key', 'attention' or 'hidden' (Sec. 4.4)."""
        return self.residual_type if self.value_residual and layer > self.residual_source else None

    def takes_v1(self, layer):
        """ResFormer's rule (Eq. 2): this layer attends over λ1 V1 + λ2 V_n."""
        return self.mixes(layer) == 'value' and self.value_mapping == 'current'

    def is_svformer_layer(self, layer):
        """SVFormer (Sec. 3): a ResFormer layer with a fixed weight 0 on its own V_n attends over V1 alone,
        so it has no W_V and caches no values."""
        return self.takes_v1(layer) and self.lambda_mode == 'fixed' and self.lambdas[layer][1] == 0.0

    def shares_prev(self, layer, what):
        """CLA pairs (0, 1), (2, 3), ...: the second layer of a pair reuses the first's K ('k') or V ('v')."""
        return layer % 2 == 1 and self.share_kv in (what, 'kv')

    def has_value_embed(self, layer):
        """nanochat's placement of value embeddings: alternating layers, counted from the last."""
        return self.value_embeds and layer % 2 == (self.n_layer - 1) % 2

    def in_value_bank(self, layer):
        """BoV's placement: the last third of the layers, never layer 1."""
        return self.value_bank and layer >= (2 * self.n_layer) // 3

    def explicit_softmax(self, layer):
        """The attention-matrix residual (Sec. 4.4) mixes A itself, so the source layer and every later one
        compute it explicitly instead of through SDPA's fused kernels."""
        return self.value_residual and self.residual_type == 'attention' and layer >= self.residual_source

    def on_paper_path(self, layer):
        """Whether this layer's attention is the paper's (CausalSelfAttention: vanilla, ResFormer, SVFormer)
        or needs AblationAttention (another residual or mapping, CLA / share-K/V, NeuTRENO, a token table)."""
        return (self.mixes(layer) in (None, 'hidden') or self.takes_v1(layer)) and not (
            self.explicit_softmax(layer) or self.shares_prev(layer, 'k') or self.shares_prev(layer, 'v')
            or (self.neutreno_lambda and layer > self.residual_source) or self.has_value_embed(layer)
            or self.in_value_bank(layer))


# What one attention layer hands to later ones: q (B, H, T, hd) after RoPE; k, v (B, H_kv, T_k, hd) over
# every cached position; attn (B, H, T, T_k) when computed explicitly; out, U = attn·v before W_O.
Heads = namedtuple('Heads', 'q k v attn out')


def newest(t, T):
    """The last T positions of t (B, heads, T_k, D): a layer's new rows when t also holds cached ones. In
    training T_k = T, and a slice would still cost a zero-filled copy in the backward pass: none is taken."""
    return t if t.size(2) == T else t[:, :, -T:]


class CausalSelfAttention(nn.Module):
    """The paper's attention for one layer: vanilla, ResFormer or SVFormer, with or without a KV cache."""

    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.k_slot = self.v_slot = None  # KV cache slots, assigned by GPT
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        self.takes_v1 = config.takes_v1(layer)          # ResFormer: mixes V1 into its own values
        self.svformer = config.is_svformer_layer(layer)  # SVFormer: attends over V1 alone
        self.c_q = nn.Linear(d, d, bias=False)                                       # W_Q
        self.c_k = nn.Linear(d, kv_dim, bias=False)                                  # W_K
        self.c_v = None if self.svformer else nn.Linear(d, kv_dim, bias=False)      # W_V (SVFormer: none)
        self.c_proj = nn.Linear(d, d, bias=False)                                    # W_O

    def forward(self, x, rope, lam, v1, kv_cache):
        """x (B, T, C) -> (output (B, T, C), its Heads). lam: the layer's (λ_{n,1}, λ_{n,2}); v1: the source
        layer's values (B, H_kv, T_k, hd) over every cached position: V1 (V2 under residual_source=1; None up
        to the source); kv_cache: a KVCache to continue from and write to, or None."""
        T = x.size(1)
        q = self.heads(self.c_q, x, rope)                                   # Q_n = RoPE(x W_Q)
        k = self.heads(self.c_k, x, rope)                                   # K_n = RoPE(x W_K)
        if kv_cache is not None:
            k = kv_cache.store(kv_cache.k, self.k_slot, k)                 # keys of every position so far
        if self.svformer:
            # SVFormer (Sec. 3): U_n = A_n V1. With no values of its own the layer reads all of V1, cached
            # positions included.
            v = lam[0] * v1
        else:
            v = self.heads(self.c_v, x)                                     # V_n = x W_V (values get no RoPE)
            if self.takes_v1:
                # ResFormer (Eq. 2): V'_n = λ_{n,1} V1 + λ_{n,2} V_n, on the raw value heads (before any GQA
                # repetition); V1 is not detached, so every later layer trains layer 1's W_V. Only V1's newest
                # T rows: the layer's own cache already holds the mixed V'_n of every earlier position.
                v = lam[0] * newest(v1, T) + lam[1] * v
            if kv_cache is not None:
                v = kv_cache.store(kv_cache.v, self.v_slot, v)             # a ResFormer layer caches V'_n
        y = attention(q, k, v, self.dropout if self.training else 0.0)    # U_n = softmax(Q_n K_n^T/√d) V'_n
        return self.project_out(y), Heads(q, k, v, None, y)

    def heads(self, linear, x, rope=None):
        """x (B, T, C) through a projection, split into heads (B, heads, T, head_dim), with RoPE if given."""
        B, T, _ = x.shape
        h = linear(x).view(B, T, -1, self.head_dim)
        return (h if rope is None else apply_rope(h, *rope)).transpose(1, 2)

    def project_out(self, y):
        """U (B, H, T, hd) -> its heads side by side through W_O, (B, T, C)."""
        B, H, T, hd = y.shape
        return F.dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, H * hd)), self.dropout, self.training)


class Block(nn.Module):

    def __init__(self, config, layer):
        super().__init__()
        self.norm_attn = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = (CausalSelfAttention if config.on_paper_path(layer) else AblationAttention)(config, layer)
        self.norm_mlp = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)
        self.adds_input = layer > 0 or config.h0_residual
        self.mixes_hidden = config.mixes(layer) == 'hidden'

    def forward(self, x, rope, lam, v1, kv_cache, ablation_inputs=None, h_source=None):
        """ablation_inputs: what an AblationAttention reads beyond V1 (see GPT.ablation_inputs); h_source: the
        hidden residual's H_s, the source block's input (B, T, C), at the new positions."""
        h = self.norm_attn(x)
        if self.mixes_hidden:  # hidden residual (Sec. 4.4): the attention reads λ1 norm(H_s) + λ2 norm(x_n)
            h = lam[0] * self.norm_attn(h_source) + lam[1] * h
        y, heads = self.attn(h, rope, lam, v1, kv_cache, **(ablation_inputs or {}))
        x = x + y if self.adds_input else y
        return x + self.mlp(self.norm_mlp(x)), heads


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        L = config.n_layer
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(L))
        self.norm_f = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.store_lambdas(config)
        self.dwa = nn.ParameterList(nn.Parameter(F.one_hot(torch.tensor(i + 1), i + 2).float())
                                    for i in range(L)) if config.denseformer else None  # DenseFormer's α
        cos, sin = rope_table(config.n_embd // config.n_head, config.block_size, config.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        # KV cache slots: one per K and V a layer computes itself; shared ones (SVFormer, CLA) are stored
        # once, and a bank's layers store no values, only the token ids they look them up from (one slot)
        attns = [block.attn for block in self.blocks]
        for slot, attn in enumerate(a for a in attns if a.c_k is not None):
            attn.k_slot = slot
        for slot, attn in enumerate(a for a in attns if a.c_v is not None):
            attn.v_slot = slot
        self.kv_slots = (sum(a.c_k is not None for a in attns), sum(a.c_v is not None for a in attns),
                         int(config.value_bank))
        # the paper's (Hugging Face Llama's) init; the token tables last, as drawn when GPT held them
        tables = self.token_tables()
        for module in sorted(self.modules(), key=lambda m: m in tables):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for attn in attns:
            if isinstance(attn, AblationAttention):
                attn.init_tables(self.wte.weight, config.norm_eps)

    def store_lambdas(self, config):
        """λ for the layers after the source (layers up to it are unchanged), stored as lambda_mode needs.
        1-D tensors, so the optimizer never decays them (optim.py)."""
        L, s = config.n_layer, config.residual_source
        later = torch.tensor(config.lambdas[s + 1:] if config.value_residual else [(0.0, 1.0)] * (L - 1 - s))
        later = later.view(L - 1 - s, 2)
        if config.lambda_mode == 'fixed':
            self.register_buffer('lambdas_fixed', later, persistent=False)
        elif config.lambda_mode == 'learnable':
            self.lambda_v1 = nn.Parameter(later[:, 0].clone())
            self.lambda_vn = nn.Parameter(later[:, 1].clone())
        else:  # Learnable-Plus: λ_{n,1} = λ · softmax(λ')_n, started so that it equals `lambdas`
            self.lambda_scale = nn.Parameter(later[:, 0].sum())
            self.lambda_logits = nn.Parameter((later[:, 0] / later[:, 0].sum()).log())
            self.lambda_vn = nn.Parameter(later[:, 1].clone())

    @property
    def lambdas(self):
        """(n_layer, 2) weights (on V1, on V_n) each layer applies, rescaling included; rows up to the source
        are (0, 1)."""
        if self.config.lambda_mode == 'fixed':
            later = self.lambdas_fixed
        elif self.config.lambda_mode == 'learnable':
            later = torch.stack([self.lambda_v1, self.lambda_vn], dim=1)
        else:
            later = torch.stack([self.lambda_scale * self.lambda_logits.softmax(0), self.lambda_vn], dim=1)
        if self.config.value_rescale:
            # post-residual rescaling: V'_n / (λ_{n,1} + λ_{n,2})
            later = later / later.sum(dim=1, keepdim=True)
        unchanged = torch.zeros_like(later[:1])
        unchanged[:, 1] = 1.0  # filled on the device: new_tensor would be a host-to-device copy every forward
        return torch.cat([unchanged.expand(self.config.residual_source + 1, 2), later])

    def forward(self, idx, targets=None, kv_cache=None, stats=None):
        """(logits (B, T, vocab), None), or given targets, (None, the mean cross-entropy, ignoring -1): logits
        beside a loss would be kept for the backward (6.6 GB at 82M). kv_cache: continue from the cached
        positions. stats: a dict to fill with per-layer 'attn', 'keys', 'values' (V'_n) and 'hidden'."""
        B, T = idx.shape
        pos = 0 if kv_cache is None else kv_cache.pos
        limit = self.config.block_size if kv_cache is None else kv_cache.max_seq_len
        if pos + T > limit:
            raise ValueError(f"{pos + T} positions exceed the model's context of {limit}; "
                             f"use at most {limit - pos} tokens")
        rope = (self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T])
        lambdas = self.lambdas  # computed once per forward: learnable λ are a softmax or a stack
        x = F.dropout(self.wte(idx), self.config.dropout, self.training)
        s = self.config.residual_source  # 0: the residual comes from layer 1 (V1); 1: from layer 2 (Sec. 4.4)
        v1 = source = prev = None  # V1; for AblationAttention, the Heads of V1's layer and of the last one
        v_sum = 0  # the identity mapping (Eqn. 6): every earlier layer's values at the new positions, summed
        kept = {'outputs': [x]}  # what between_blocks keeps from block to block
        # the token ids of every position attended over, cached ones included: a bank of values' values
        tokens = idx if kv_cache is None or not self.config.value_bank else kv_cache.store_tokens(idx)
        for i, block in enumerate(self.blocks):
            x = self.between_blocks(i, x, prev, kept, stats)
            inputs = self.ablation_inputs(i, idx, tokens, source, prev, v_sum)
            x, heads = block(x, rope, lambdas[i], v1, kv_cache, inputs, kept.get('h_source'))
            if i == s:  # V1, taken at layer 1 (every cached position included), goes to every later layer
                v1, source = heads.v, heads
            prev = heads
            if self.config.value_mapping == 'identity':
                v_sum = v_sum + newest(heads.v, T)
        x = self.between_blocks(len(self.blocks), x, prev, kept, stats)
        if kv_cache is not None:
            kv_cache.pos += T
        logits = self.lm_head(self.norm_f(x))
        if targets is None:
            return logits, None
        return None, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                     ignore_index=-1)

    def between_blocks(self, i, x, prev, kept, stats):
        """The residual stream x before block i (i = n_layer: after the last), where only what is off the
        paper's path acts: DenseFormer, stats, H_s for the hidden residual. prev: block i - 1's Heads."""
        if i > 0 and self.dwa is not None:  # DenseFormer: X_i becomes Σ_j α_{i-1,j} X_j over X_0 .. X_i
            kept['outputs'].append(x)
            x = sum(a * h for a, h in zip(self.dwa[i - 1], kept['outputs']))
        if stats is not None and i == 0:
            stats.update(attn=[], keys=[], values=[], hidden=[])
        elif stats is not None:  # block i - 1's A (computed here unless the layer had it), K, V' and output
            stats['attn'].append(attention_probs(prev.q, prev.k) if prev.attn is None else prev.attn)
            stats['keys'].append(prev.k)
            stats['values'].append(prev.v)
            stats['hidden'].append(x)
        if i == self.config.residual_source:
            kept['h_source'] = x  # H_s, the source block's input (H0 = the embedding)
        return x

    def ablation_inputs(self, i, idx, tokens, source, prev, v_sum):
        """What layer i's attention reads beyond V1 if it is an AblationAttention (see its forward); None for
        the paper's attention."""
        if isinstance(self.blocks[i].attn, CausalSelfAttention):
            return None
        return dict(source=source, prev=prev, idx=idx, tokens=tokens, v_sum=v_sum)

    def token_tables(self):
        """The layers' token tables (value embeddings, banks of values), in layer order."""
        return [table for block in self.blocks for table in (getattr(block.attn, 'value_embed', None),
                                                             getattr(block.attn, 'bank', None))
                if table is not None]

    def compile_for_decoding(self):
        """torch.compile for generate(): once for a prompt, once for single tokens. On a CPU a small model's
        tokens cost mostly per-call overhead, which inductor's C++ wrapper largely removes."""
        self.compile(options={'cpp_wrapper': self.lm_head.weight.device.type == 'cpu'})

    def new_kv_cache(self, max_seq_len=None):
        """An empty cache for up to max_seq_len (default block_size) positions."""
        return KVCache(*self.kv_slots, min(max_seq_len or self.config.block_size, self.config.block_size))

    def kv_bytes_per_token(self, element_size=2):
        """Bytes a KV cache holds per position of each sequence: K and V of every slot at element_size bytes
        an element, and the token id a bank of values looks its values up from."""
        n_k, n_v, n_tokens = self.kv_slots
        kv_dim = self.config.n_kv_head * (self.config.n_embd // self.config.n_head)
        return (n_k + n_v) * kv_dim * element_size + n_tokens * KVCache.TOKEN_ID_DTYPE.itemsize

    @torch.no_grad()
    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, kv_cache=None,
                        vocab_size=None):
        """Yield the next token (B, 1), max_new_tokens times; temperature=0 is greedy. kv_cache: decode into
        this one. vocab_size: sample only ids below it (not the padding). Past block_size the context is
        cropped to its last block_size tokens, with or without the cache."""
        block_size = self.config.block_size
        if use_cache and kv_cache is None:
            kv_cache = self.new_kv_cache(idx.size(1) + max_new_tokens)
        if kv_cache is not None:
            kv_cache.reset()
        for _ in range(max_new_tokens):
            if kv_cache is not None and kv_cache.pos == kv_cache.max_seq_len:
                # the context is full: start over on the cropped context, as the uncached path does
                kv_cache.reset()
            fresh = idx[:, -block_size:] if kv_cache is None or kv_cache.pos == 0 else idx[:, -1:]
            logits = self(fresh, kv_cache=kv_cache)[0][:, -1, :vocab_size].float()
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float('-inf'))
                next_token = torch.multinomial(logits.softmax(dim=-1), num_samples=1)
            idx = torch.cat([idx, next_token], dim=1)
            yield next_token

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, vocab_size=None):
        """idx (B, T) extended by max_new_tokens (generate_tokens's arguments)."""
        return torch.cat([idx, *self.generate_tokens(idx, max_new_tokens, temperature, top_k, use_cache,
                                                     vocab_size=vocab_size)], dim=1)

    def num_params(self, exclude_embedding=False):
        """Parameters (shared ones once); exclude_embedding: without the token tables, lookups of no FLOPs."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= sum(table.weight.numel() for table in self.token_tables())
            n -= 0 if self.config.tie_embeddings else self.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len, causal=True):
        """Training FLOPs per token: 6 per matmul weight, plus causal attention's QK^T and AV, 6·L·d·T (a
        fused causal kernel skips the masked half). causal=False: nanoGPT's and published MFUs' formula (PaLM,
        appendix B), 12·L·d·T, crediting work no kernel does (at 65,536 tokens, nearly twice the MFU)."""
        cfg = self.config
        attention = (6 if causal else 12) * cfg.n_layer * cfg.n_embd * seq_len
        return 6 * self.num_params(exclude_embedding=True) + attention


# ------------------------------------------------------------------------------------------------------------
# Off the paper's path: the Sec. 4.4 ablations, the baselines and token tables (the hidden residual acts in
# Block, DenseFormer in GPT.between_blocks).

class AblationAttention(nn.Module):
    """CausalSelfAttention plus the query / key / attention residuals and other value mappings (Sec. 4.4),
    CLA and share-K/V, NeuTRENO, value embeddings and the bank of values, for the layers where one applies
    (GPTConfig.on_paper_path); with none, it computes what CausalSelfAttention does (test_model checks)."""

    heads, project_out = CausalSelfAttention.heads, CausalSelfAttention.project_out  # the same, not a copy

    def __init__(self, config, layer):
        # as CausalSelfAttention.__init__, but only the projections it keeps: others change the RNG draws
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.k_slot = self.v_slot = None  # KV cache slots, assigned by GPT
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        self.mixes = config.mixes(layer)  # 'query', 'key', 'attention' or 'value' (then see self.mapping)
        self.mapping = config.value_mapping if self.mixes == 'value' else None
        self.takes_v1, self.svformer = config.takes_v1(layer), config.is_svformer_layer(layer)
        self.shares_v = config.shares_prev(layer, 'v')
        self.explicit_softmax = config.explicit_softmax(layer)
        self.neutreno_lambda = config.neutreno_lambda if layer > config.residual_source else 0.0
        self.layer = layer  # the identity mapping averages the values of the `layer` layers before this one
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = None if config.shares_prev(layer, 'k') else nn.Linear(d, kv_dim, bias=False)
        in_bank = config.in_value_bank(layer)
        self.c_v = None if self.svformer or self.shares_v or in_bank else nn.Linear(d, kv_dim, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        # value embeddings: a token table, gated by the first 12 channels of the layer's input (nanochat's)
        embeds = config.has_value_embed(layer)
        self.value_embed = nn.Embedding(config.vocab_size, kv_dim) if embeds else None
        self.ve_gate = nn.Linear(min(12, d), self.n_kv_head, bias=False) if embeds else None
        # the bank of values: the layer's own token table, and BoV's learned scale of it
        self.bank = nn.Embedding(config.vocab_size, kv_dim) if in_bank else None
        self.gamma_v = nn.Parameter(torch.ones(1)) if in_bank else None

    @torch.no_grad()
    def init_tables(self, wte, eps):
        """After GPT's init: nanochat's value-embedding gate starts a little above 3σ(0) = 1.5; BoV's bank
        row t at RMSNorm(wte[t]) W_V^T, the layer's values from the token alone (W_V drawn, then dropped)."""
        if self.ve_gate is not None:
            nn.init.uniform_(self.ve_gate.weight, 0.0, 0.02)
        if self.bank is not None:
            x0 = F.rms_norm(wte, (wte.size(1),), eps=eps)
            w_v = x0.new_empty(self.bank.embedding_dim, wte.size(1)).normal_(mean=0.0, std=0.02)
            self.bank.weight.copy_(x0 @ w_v.T)

    def forward(self, x, rope, lam, v1, kv_cache, source, prev, idx, tokens, v_sum):
        """As CausalSelfAttention.forward; source, prev: the Heads of the source layer and of the previous
        one; idx: the new tokens (B, T); tokens: every position's (B, T_k); v_sum: the identity mapping's
        Σ_{i<n} V_i at the new positions."""
        B, T, C = x.shape
        q = self.heads(self.c_q, x, rope)
        if self.mixes == 'query':
            q = lam[0] * source.q + lam[1] * q  # query residual, Q'_n = λ1 Q1 + λ2 Q_n (RoPE is linear)
        if self.c_k is None:
            k = prev.k  # CLA / share-K: the previous layer's keys
        else:
            k = self.heads(self.c_k, x, rope)
            if self.mixes == 'key':
                k = lam[0] * newest(source.k, T) + lam[1] * k  # key residual, K'_n = λ1 K1 + λ2 K_n
            if kv_cache is not None:
                k = kv_cache.store(kv_cache.k, self.k_slot, k)
        if self.shares_v:
            v = prev.v  # CLA / share-V: the previous layer's values
        elif self.svformer:
            v = lam[0] * v1
        elif self.bank is not None:
            # Bank of Values: V_n = γ_v E_n[token], a function of the token ids alone, so the cache keeps
            # those (GPT.forward) and every position's values are looked up again rather than cached
            v = self.gamma_v * self.bank(tokens).view(B, -1, self.n_kv_head, self.head_dim).transpose(1, 2)
            if self.takes_v1:  # with ResFormer, V'_n = λ1 V1 + λ2 γ_v E_n[token], V1 over every position
                v = lam[0] * v1 + lam[1] * v
        else:
            v = self.heads(self.c_v, x)
            if self.value_embed is not None:  # nanochat: V_n += 3σ(W_g x[:12]) E_n[token], gated per KV head
                gate = 3 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features])).transpose(1, 2)
                table = self.value_embed(idx).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
                v = v + gate.unsqueeze(-1) * table
            if self.takes_v1:
                v = lam[0] * newest(v1, T) + lam[1] * v
            if kv_cache is not None:
                v = kv_cache.store(kv_cache.v, self.v_slot, v)
        dropout = self.dropout if self.training else 0.0
        probs = None
        if self.explicit_softmax:
            probs = attention_probs(q, k)
            if self.mixes == 'attention':
                probs = lam[0] * source.attn + lam[1] * probs  # attention residual, A'_n = λ1 A1 + λ2 A_n
            y = F.dropout(probs, dropout) @ v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        else:
            y = attention(q, k, v, dropout)
        if self.mapping == 'first':  # mapped by layer 1's attention: λ1 A1 V1 + λ2 A_n V_n
            y = lam[0] * source.out + lam[1] * y
        if self.mapping == 'identity':  # ICLR Eqn. 6: U_n = A_n V_n + 1/(n-1) Σ_{i<n} V_i, unattended
            y = y + (v_sum / self.layer).repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        if self.neutreno_lambda:
            y = y + self.neutreno_lambda * (newest(v1, T) - newest(v, T))  # NeuTRENO: U_n += λ (V1 - V'_n)
        return self.project_out(y), Heads(q, k, v, probs, y)


# ------------------------------------------------------------------------------------------------------------
# Building blocks: the MLP, RoPE and the two ways to compute attention.

class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.c_up = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.c_down = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)
        self.dropout = config.dropout

    def forward(self, x):
        return F.dropout(self.c_down(F.silu(self.c_gate(x)) * self.c_up(x)), self.dropout, self.training)


def rope_table(head_dim, max_len, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(max_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate-half RoPE (Llama convention) on x of shape (B, T, heads, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q, k, v, dropout_p):
    """softmax(QK^T/sqrt(d)) V with a causal mask through SDPA's fused kernels; q (B, H, T, D), k and v
    (B, H_kv, T_k, D) with T_k >= T, the last T of them at q's positions."""
    T, T_k, gqa = q.size(2), k.size(2), k.size(1) != q.size(1)
    if T == T_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)
    # A chunk appended to a cache: SDPA's is_causal aligns the mask top-left, which is wrong here, so build
    # the mask (one new token sees every cached position and needs none).
    mask = None if T == 1 else torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)


def attention_probs(q, k):
    """The causal attention matrix softmax(QK^T/sqrt(d)) as a tensor (B, H, T, T_k): for the attention-matrix
    residual and for analysis, which need A itself rather than A·V."""
    T, T_k = q.size(2), k.size(2)
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    causal = torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return scores.masked_fill(~causal, float('-inf')).softmax(dim=-1)


class KVCache:
    """Keys and values of past positions, preallocated to max_seq_len on first write. Only tensors a layer
    computes itself get a slot: SVFormer keeps values for layer 1 alone, CLA one K/V a pair, a bank of values
    the token ids it looks them up from. Later layers read the source layer's newest rows: nothing else."""

    TOKEN_ID_DTYPE = torch.long  # not int32: the cast makes a compiled decoder specialise on prompt slices

    def __init__(self, n_k_slots, n_v_slots, n_token_slots, max_seq_len):
        self.k = [None] * n_k_slots
        self.v = [None] * n_v_slots
        self.tokens = [None] * n_token_slots
        self.max_seq_len = max_seq_len
        self.pos = 0  # positions already cached; the model advances it after each forward

    def store(self, slots, slot, new):
        """Write new (B, heads, T, head_dim) entries at self.pos; return all this slot has cached so far."""
        B, H, T, D = new.shape
        if slots[slot] is None:
            slots[slot] = new.new_empty(B, H, self.max_seq_len, D)
        slots[slot][:, :, self.pos:self.pos + T] = new
        return slots[slot][:, :, :self.pos + T]

    def store_tokens(self, idx):
        """Write the token ids idx (B, T) at self.pos; return those of every position so far (B, pos + T)."""
        B, T = idx.shape
        if self.tokens[0] is None:
            self.tokens[0] = idx.new_empty(B, self.max_seq_len, dtype=self.TOKEN_ID_DTYPE)
        self.tokens[0][:, self.pos:self.pos + T] = idx
        return self.tokens[0][:, :self.pos + T]

    def reset(self):
        self.pos = 0

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.tokens if t is not None)


# ------------------------------------------------------------------------------------------------------------
# The named variants of the paper's tables, and the checks behind GPTConfig's one-line errors.

# Each named variant sets these flags; its λ rows come from `variant_lambdas`.
VARIANT_FLAGS = ('value_residual', 'lambdas', 'lambda_mode', 'neutreno_lambda', 'denseformer', 'share_kv')
VARIANTS = {
    'vanilla': {}, 'resformer_identity': dict(value_residual=True),
    'resformer_constant': dict(value_residual=True), 'resformer_sparse': dict(value_residual=True),
    'resformer_learnable': dict(value_residual=True, lambda_mode='learnable'),
    'resformer_learnable_plus': dict(value_residual=True, lambda_mode='plus'),
    'svformer': dict(value_residual=True), 'neutreno': dict(neutreno_lambda=0.4),
    'neutreno_resformer': dict(value_residual=True, neutreno_lambda=0.2),
    'denseformer': dict(denseformer=True), 'cla': dict(share_kv='kv'),
    'share_k': dict(share_kv='k'), 'share_v': dict(share_kv='v'),
}


def variant_lambdas(variant, n_layer, source=0):
    """λ table (n_layer rows of (weight on V1, weight on V_n)) of a value-residual variant, rows up to the
    source layer (0, 1). From the official code (Identity, NeuTRENO+ResFormer) and the paper's text."""
    later = range(source + 1, n_layer)
    if variant in ('resformer_identity', 'resformer_learnable', 'neutreno_resformer'):
        rows = [(0.5, 0.5) for _ in later]                 # official code: 0.5 V1 + 0.5 V_n
    elif variant == 'resformer_constant':
        rows = [(2.0, 1.0) for _ in later]                 # the paper: λ = 2
    elif variant == 'resformer_sparse':
        # only the top 3/8 of the stack gets V1 (8 layers: 6-8 with λ1 = 5, the paper's best sparse setting)
        first = n_layer - (3 * n_layer) // 8
        rows = [(5.0, 1.0) if n >= first else (0.0, 1.0) for n in later]
    elif variant == 'resformer_learnable_plus':
        # λ_{n,1} = λ · softmax(λ')_n, λ from n_layer; the paper says of λ' only "stronger for higher
        # layers", so we choose λ' = linspace(0, 1): the top layer starts with e times the bottom's weight
        logits = [j / max(len(later) - 1, 1) for j in range(len(later))]
        total = sum(math.exp(z) for z in logits)
        rows = [(n_layer * math.exp(z) / total, 0.5) for z in logits]
    elif variant == 'svformer':
        rows = [(1.0, 0.0) for _ in later]                 # U_n = A_n V1: no W_V in layers n > 1
    else:
        return None
    return ((0.0, 1.0),) * (source + 1) + tuple(rows)


def need(ok, message):  # GPTConfig's one-line error for an impossible setting
    if not ok:
        raise ValueError(message)


def resolve_config(cfg):
    """Fill in cfg's defaults and apply its named variant, checking every setting (check_flags)."""
    def whole(value):  # a positive integer, and not a bool
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    def finite(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for name in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size'):
        need(whole(getattr(cfg, name)), f"{name} must be a positive integer, got {getattr(cfg, name)!r}")
    for name in ('n_kv_head', 'ffn_hidden'):
        value = getattr(cfg, name)
        need(value is None or whole(value), f"{name} must be a positive integer (or None for the default), "
                                            f"got {value!r}")
    cfg.n_kv_head = cfg.n_kv_head or cfg.n_head
    cfg.ffn_hidden = cfg.ffn_hidden or round(3.5 * cfg.n_embd)
    for name in ('rope_theta', 'norm_eps'):
        value = getattr(cfg, name)
        need(finite(value) and value > 0, f"{name}={value!r} must be a positive finite number")
    need(finite(cfg.dropout) and 0.0 <= cfg.dropout < 1.0, f"dropout={cfg.dropout!r} must be in [0, 1)")
    need(finite(cfg.neutreno_lambda), f"neutreno_lambda={cfg.neutreno_lambda!r} must be a finite number")
    s = cfg.residual_source
    need(isinstance(s, int) and not isinstance(s, bool) and (s == 0 or 0 < s < cfg.n_layer - 1),
         f"residual_source={s!r} must be a layer index from 0 to {cfg.n_layer - 2}: a later layer must "
         "mix it in")
    if cfg.lambdas is not None:
        try:
            cfg.lambdas = tuple((float(a), float(b)) for a, b in cfg.lambdas)
        except (TypeError, ValueError):
            raise ValueError(f"lambdas must be {cfg.n_layer} pairs (weight on V1, weight on V_n), "
                             f"got {cfg.lambdas!r}") from None
        need(all(map(math.isfinite, sum(cfg.lambdas, ()))),
             f"lambdas must be finite numbers, got {cfg.lambdas}")
    if cfg.variant != 'custom':
        apply_variant(cfg)
    if cfg.value_residual and cfg.lambdas is None:
        cfg.lambdas = variant_lambdas('resformer_identity', cfg.n_layer, cfg.residual_source)
    check_flags(cfg)


def apply_variant(cfg):
    """Set the flags of cfg's named variant; a flag given with another value is an error."""
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown variant {cfg.variant!r}; choose one of: custom, {', '.join(VARIANTS)}")
    defaults = {f.name: f.default for f in fields(cfg)}
    preset = {k: defaults[k] for k in VARIANT_FLAGS} | VARIANTS[cfg.variant]
    preset['lambdas'] = variant_lambdas(cfg.variant, cfg.n_layer, cfg.residual_source)
    for k, value in preset.items():
        if getattr(cfg, k) not in (defaults[k], value):
            raise ValueError(f"variant={cfg.variant!r} sets {k}={value!r}, but {k}={getattr(cfg, k)!r} "
                             f"was given; use variant='custom' to set it yourself")
        setattr(cfg, k, value)


# the flags that name one of a few choices, and those choices
CHOICES = dict(lambda_mode=('fixed', 'learnable', 'plus'), share_kv=('none', 'kv', 'k', 'v'),
               residual_type=('value', 'query', 'key', 'attention', 'hidden'),
               value_mapping=('current', 'first', 'identity'))


def check_flags(cfg):
    """Combinations of flags that cannot work, each with a one-line reason."""
    s = cfg.residual_source
    need(cfg.n_embd % cfg.n_head == 0, f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}")
    need((cfg.n_embd // cfg.n_head) % 2 == 0, f"head_dim={cfg.n_embd // cfg.n_head} must be even for RoPE")
    need(cfg.n_head % cfg.n_kv_head == 0,
         f"n_head={cfg.n_head} is not divisible by n_kv_head={cfg.n_kv_head}")
    for name, choices in CHOICES.items():
        value, (*others, last) = getattr(cfg, name), map(repr, choices)
        need(value in choices, f"{name}={value!r}; use {', '.join(others)} or {last}")
    need(cfg.value_mapping == 'current' or cfg.residual_type == 'value',
         f"value_mapping={cfg.value_mapping!r} maps values, but residual_type={cfg.residual_type!r}; "
         "use residual_type='value'")
    need(not cfg.neutreno_lambda or cfg.n_kv_head == cfg.n_head,
         "NeuTRENO adds λ(V1 - V_n) to the merged heads and needs n_kv_head = n_head")
    if cfg.value_embeds:
        lacking = [n + 1 for n in range(cfg.n_layer)
                   if cfg.has_value_embed(n) and (cfg.is_svformer_layer(n) or cfg.shares_prev(n, 'v'))]
        need(not lacking, f"value_embeds adds to a layer's own values, but layer(s) {lacking} have none "
                          f"(SVFormer or share_kv); drop value_embeds or pick another variant")
    bank = [n + 1 for n in range(cfg.n_layer) if cfg.in_value_bank(n)]  # 1-based, as in every message
    if cfg.value_bank:
        need(cfg.n_layer >= 2, "value_bank needs n_layer >= 2: the last third of one layer is layer 1, whose "
                               "values already depend on the token alone")
        both = [n for n in bank if cfg.has_value_embed(n - 1)]
        need(not both, f"value_embeds and value_bank both give layer(s) {both} a token table; "
                       "use one of them")
        shared = [n for n in bank if cfg.shares_prev(n - 1, 'v')]
        need(not shared, f"share_kv={cfg.share_kv!r} makes layer(s) {shared} reuse the values of the layer "
                         f"before, but value_bank gives layers {bank[0]}-{bank[-1]} their own tables; "
                         "use share_kv='k' or 'none'")
    if not cfg.value_residual:
        need(cfg.lambdas is None, "lambdas are only used with value_residual=True; set it or drop lambdas")
        need(cfg.lambda_mode == 'fixed', f"lambda_mode={cfg.lambda_mode!r} needs value_residual=True")
        need(not cfg.value_rescale, "value_rescale needs value_residual=True")
        need(cfg.residual_type == 'value' and cfg.value_mapping == 'current',
             "residual_type and value_mapping choose what value_residual mixes; set value_residual=True")
        need(s == 0 or cfg.neutreno_lambda, "residual_source needs value_residual=True or neutreno_lambda")
        return
    need(cfg.n_layer >= 2, "value_residual needs n_layer >= 2: layer 1 has no earlier value to mix in")
    need(len(cfg.lambdas) == cfg.n_layer,
         f"lambdas must have shape ({cfg.n_layer}, 2), got {len(cfg.lambdas)} rows")
    unweighted = cfg.lambdas == variant_lambdas('resformer_identity', cfg.n_layer)  # the default, unused
    need(cfg.value_mapping != 'identity' or (s == 0 and unweighted and cfg.lambda_mode == 'fixed'
                                             and not cfg.value_rescale),
         "value_mapping='identity' (ICLR Eqn. 6) adds the mean of every earlier layer's values and has no "
         "λ: use residual_source=0 and drop lambdas, lambda_mode and value_rescale")
    for n, row in enumerate(cfg.lambdas[:s + 1]):
        need(row == (0.0, 1.0),
             f"lambdas[{n}] must be (0, 1): layers up to residual_source={s} are unchanged, got {row}")
    svformer = [n for n in bank if cfg.is_svformer_layer(n - 1)]
    if svformer:
        raise ValueError(f"value_bank replaces the values of layers {bank[0]}-{bank[-1]}, but SVFormer "
                         f"layer(s) {svformer} have none of their own (a fixed zero weight on V_n); give "
                         "them a weight on V_n in lambdas or drop value_bank")
    need(cfg.residual_type != 'value' or cfg.share_kv not in ('v', 'kv'),
         f"share_kv={cfg.share_kv!r} shares V across layers, which value_residual also redefines "
         "(SVFormer already shares V1); use share_kv='k' or 'none'")
    need(cfg.residual_type != 'key' or cfg.share_kv not in ('k', 'kv'),
         f"share_kv={cfg.share_kv!r} shares K across layers, which the key residual also redefines; "
         "use share_kv='v' or 'none'")
    if cfg.lambda_mode == 'fixed' and (cfg.residual_type != 'value' or cfg.value_mapping != 'current'):
        need(all(b != 0 for _, b in cfg.lambdas[s + 1:]),
             "a zero weight on the layer's own term leaves its projections untrained with "
             f"residual_type={cfg.residual_type!r}, value_mapping={cfg.value_mapping!r}; only the value "
             "residual (SVFormer) drops them")
    need(cfg.lambda_mode != 'plus' or all(a > 0 for a, _ in cfg.lambdas[s + 1:]),
         "lambda_mode='plus' needs every later lambdas[n][0] > 0 (it is λ·softmax)")
    need(not cfg.value_rescale or all(a + b != 0 for a, b in cfg.lambdas[s + 1:]),
         "value_rescale divides by λ1 + λ2, which is 0 in some row of lambdas")
