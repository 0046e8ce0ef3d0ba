"""
Value Residual Learning (Zhou et al., arXiv 2410.17897) in one file: ResFormer and SVFormer. A
Llama-style decoder (pre-norm RMSNorm, RoPE, SwiGLU, no biases) where every layer n > 1 mixes
layer 1's values V1 into its own before attention:

    U_n = softmax(Q_n K_n^T / √d_h) (λ_{n,1} V1 + λ_{n,2} V_n),   d_h: head size, λ: (n_layer, 2)

λ = (0, 1) is the Transformer, (0.5, 0.5) Identity ResFormer, (1, 0) SVFormer, whose layers n > 1
then have no value projection and cache no values. Layers are numbered from 1, as in the paper:
layer n is blocks[n - 1] and has λ row lambdas[n - 1]. ablations.py adds the baselines by subclassing
GPTConfig (its source_layer, apply_variant, check, is_svformer_layer), the attention, Block, GPT and
KVCache, and by the hooks own, attention, block: for a paper variant each gives model.py's (a test
checks train.py's λ). Cited: ICLR (ICLR 2025, OpenReview kn3GT7LbxT) or v5 (arXiv v5, second-hand).
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

# The paper's named variants and the flags each sets; GPTConfig fills in their λ (variant_lambdas).
VARIANTS = {
    'vanilla': {}, 'resformer_identity': dict(value_residual=True),
    'resformer_constant': dict(value_residual=True), 'resformer_sparse': dict(value_residual=True),
    'resformer_learnable': dict(value_residual=True, lambda_mode='learnable'),
    'resformer_learnable_plus': dict(value_residual=True, lambda_mode='plus'),
    'svformer': dict(value_residual=True),  # λ (1, 0): is_svformer_layer then drops W_V
}
# Their λ, model.lambdas (n_layer, 2): row 1 is (0, 1), rows 2..n_layer (on V1, on V_n), kept in the
# buffer fixed_lambdas, or learned in the parameters named (GPT.store_lambdas):
#   vanilla                   (0, 1)
#   resformer_identity        (0.5, 0.5)
#   resformer_constant        (2, 1)
#   resformer_sparse          (5, 1) in the top 3/8 of the layers, else (0, 1)
#   resformer_learnable       (lambda_1, lambda_2), from (0.5, 0.5)
#   resformer_learnable_plus  (λ softmax(λ')_n, lambda_2), λ = lambda_scale, λ' = lambda_prime: from
#                             n_layer, log softmax(linspace(0, 1)) over layers 2 .. n_layer, and 0.5
#   svformer                  (1, 0): layers n > 1 have no W_V


def variant_lambdas(variant, n_layer, source=1):
    """A variant's n_layer λ rows (the table above), (0, 1) up to layer source; vanilla: None."""
    later = range(source + 1, n_layer + 1)
    if variant in ('resformer_identity', 'resformer_learnable'):
        rows = [(0.5, 0.5) for _ in later]                 # official code: 0.5 V1 + 0.5 V_n
    elif variant == 'resformer_constant':
        rows = [(2.0, 1.0) for _ in later]                 # ICLR Fig. 8's best: λ = 2
    elif variant == 'resformer_sparse':
        first = n_layer + 1 - (3 * n_layer) // 8          # of 8: layers 6-8 (the paper's best)
        rows = [(5.0, 1.0) if n >= first else (0.0, 1.0) for n in later]
    elif variant == 'resformer_learnable_plus':
        # ours, λ' = log softmax(linspace(0, 1)): layer L e x layer 2 (paper: "stronger for higher")
        logits = [j / max(len(later) - 1, 1) for j in range(len(later))]
        total = sum(math.exp(z) for z in logits)
        rows = [(n_layer * math.exp(z) / total, 0.5) for z in logits]
    elif variant == 'svformer':
        rows = [(1.0, 0.0) for _ in later]                 # U_n = A_n V1: no W_V in layers n > 1
    else:
        return None
    return ((0.0, 1.0),) * source + tuple(rows)


@dataclass
class GPTConfig:
    # --- the architecture: a Llama-style decoder, as the paper's
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
    """Dropout on the embeddings, attention probabilities and residual branches (the paper uses 0)."""
    # --- the paper's value residual
    variant: str = 'custom'
    """A name in VARIANTS that sets the flags below and λ, or 'custom' to set them yourself."""
    value_residual: bool = False
    """Mix V1 into every later layer's values, weighted by `lambdas` (ResFormer, SVFormer)."""
    lambdas: tuple = None
    """The λ table: n_layer rows (weight on V1, weight on V_n), row 1 (0, 1); None: Identity's
    (0.5, 0.5). A layer with a fixed weight 0 on V_n is an SVFormer layer: it has no W_V."""
    lambda_mode: str = 'fixed'
    """'fixed', 'learnable' (from `lambdas`), 'plus' (Learnable-Plus: λ_{n,1} = λ softmax(λ')_n)"""
    source_layer = 1  # always 1 here (V1's layer); ablations.py's property gives 2 for its V2 mix

    def __post_init__(self):
        """Fill in the defaults, a named variant's flags and λ; a bad setting is a ValueError."""
        for f in fields(GPTConfig):  # the shape's numbers: positive ints or floats (None: default)
            value, kind = getattr(self, f.name), (int,) if f.type is int else (int, float)
            if f.type in (int, float) and f.name != 'dropout' and not (value is None and f.default is None):
                need(isinstance(value, kind) and not isinstance(value, bool) and 0 < value < math.inf,
                     f"{f.name} must be a positive {f.type.__name__}, got {value!r}")
        need(isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1,
             f"dropout={self.dropout!r} must be in [0, 1)")
        self.n_kv_head = self.n_kv_head or self.n_head
        self.ffn_hidden = self.ffn_hidden or round(3.5 * self.n_embd)
        if self.lambdas is not None:
            try:
                self.lambdas = tuple((float(a), float(b)) for a, b in self.lambdas)
            except (TypeError, ValueError):
                raise ValueError(f"lambdas must be {self.n_layer} pairs (weight on V1, weight on "
                                 f"V_n), got {self.lambdas!r}") from None
            need(all(map(math.isfinite, sum(self.lambdas, ()))),
                 f"lambdas must be finite numbers, got {self.lambdas}")
        if self.variant != 'custom':
            self.apply_variant()
        if self.value_residual and self.lambdas is None:
            self.lambdas = variant_lambdas('resformer_identity', self.n_layer, self.source_layer)
        self.check()

    def apply_variant(self, presets=VARIANTS, lambdas=None):
        """Set the named variant's flags and λ; a flag set off its default to another value is an
        error. presets and lambdas: ablations.py's (its baselines' λ, SVFormer's anchors)."""
        need(self.variant in presets, f"unknown variant {self.variant!r}; choose one of: custom, "
                                      f"{', '.join(presets)}")
        defaults = {f.name: f.default for f in fields(self)}
        preset = dict(value_residual=False, lambda_mode='fixed') | presets[self.variant]
        preset['lambdas'] = lambdas or variant_lambdas(self.variant, self.n_layer, self.source_layer)
        for k, value in preset.items():
            need(getattr(self, k) in (defaults[k], value),
                 f"variant={self.variant!r} sets {k}={value!r}, but {k}={getattr(self, k)!r} was "
                 "given; use variant='custom' to set it yourself")
            setattr(self, k, value)

    def check(self):
        """Combinations that cannot work, each a one-line ValueError."""
        need(self.n_embd % self.n_head == 0,
             f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        need((self.n_embd // self.n_head) % 2 == 0,
             f"head_dim={self.n_embd // self.n_head} must be even for RoPE")
        need(self.n_head % self.n_kv_head == 0,
             f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        need(self.lambda_mode in ('fixed', 'learnable', 'plus'),
             f"lambda_mode={self.lambda_mode!r}; use 'fixed', 'learnable' or 'plus'")
        if not self.value_residual:
            for name, unset in (('lambdas', None), ('lambda_mode', 'fixed')):
                need(getattr(self, name) == unset, f"{name}={getattr(self, name)!r} needs "
                                                   f"value_residual=True; set it, or drop {name}")
            return
        need(self.n_layer >= 2, "value_residual needs n_layer >= 2: layer 1 has nothing to mix in")
        need(len(self.lambdas) == self.n_layer,
             f"lambdas must have shape ({self.n_layer}, 2), got {len(self.lambdas)} rows")
        for n, row in enumerate(self.lambdas[:self.source_layer], start=1):
            need(row == (0.0, 1.0), f"layer {n} mixes nothing in: its λ must be (0, 1), not {row}")
        need(self.lambda_mode != 'plus' or all(a > 0 for a, _ in self.lambdas[self.source_layer:]),
             "lambda_mode='plus' needs every later layer's weight on V1 > 0 (it is λ·softmax)")

    def is_svformer_layer(self, n):
        """SVFormer's rule: layer n mixes V1 in with a fixed weight 0 on its own V_n: it has no W_V."""
        return (self.value_residual and n > self.source_layer and self.lambda_mode == 'fixed'
                and self.lambdas[n - 1][1] == 0)


def need(ok, message):
    if not ok:
        raise ValueError(message)


class CausalSelfAttention(nn.Module):
    """Layer n's attention, vanilla, ResFormer or SVFormer, cached or not. own: its projections but
    W_O (None: the paper's; CLA: fewer). k_slot, v_slot: its KVCache places, set by GPT.__init__."""

    def __init__(self, config, n, own=None):
        super().__init__()
        self.n_head, self.n_kv_head, self.dropout = config.n_head, config.n_kv_head, config.dropout
        self.head_dim = config.n_embd // config.n_head
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        self.takes_v1 = config.value_residual and n > 1  # ResFormer: mixes V1 into its values
        self.svformer = config.is_svformer_layer(n)      # SVFormer: attends over V1 alone
        own = ('qk' if self.svformer else 'qkv') if own is None else own
        self.c_q = nn.Linear(d, d, bias=False) if 'q' in own else None            # W_Q
        self.c_k = nn.Linear(d, kv_dim, bias=False) if 'k' in own else None       # W_K
        self.c_v = nn.Linear(d, kv_dim, bias=False) if 'v' in own else None       # W_V
        self.c_proj = nn.Linear(d, d, bias=False)                                  # W_O

    def forward(self, x, rope, lambda_n, v1, kv_cache):
        """x (B, T, C) -> (output (B, T, C), the values attended over (B, H_kv, T_k, hd)). lambda_n:
        (λ_{n,1}, λ_{n,2}); v1: layer 1's values at every position so far; kv_cache: or None."""
        q = self.heads(self.c_q, x, rope)                                 # Q_n = RoPE(x W_Q)
        k = self.heads(self.c_k, x, rope)                                 # K_n = RoPE(x W_K)
        if kv_cache is not None:
            k = kv_cache.store('k', self.k_slot, k)                       # keys of every position
        v = self.values(x, lambda_n, v1, kv_cache)                        # V'_n (below), cached
        y = attention(q, k, v, self.dropout if self.training else 0.0)  # U_n = softmax(QK^T/√d)V'
        return self.project_out(y), v

    def values(self, x, lambda_n, v1, kv_cache):
        """What layer n attends over: V_n or ResFormer's V'_n (cached), or SVFormer's V1."""
        if self.svformer:
            return lambda_n[0] * v1          # SVFormer: U_n = A_n V1 (layer 1's slot caches V1)
        v = self.mix(lambda_n, v1, self.heads(self.c_v, x))              # V_n = x W_V (no RoPE)
        return v if kv_cache is None else kv_cache.store('v', self.v_slot, v)

    def mix(self, lambda_n, v1, v):
        """ResFormer: V'_n = λ_{n,1} V1 + λ_{n,2} V_n, on the value heads (SDPA repeats those, GQA);
        V_n itself in a Transformer layer. V1 is not detached: every later layer trains layer 1's
        W_V. Only V1's newest rows: a cache holds the mixed V'_n of earlier positions already."""
        return lambda_n[0] * newest(v1, v.size(2)) + lambda_n[1] * v if self.takes_v1 else v

    def heads(self, linear, x, rope=None):
        """x (B, T, C) through a projection, split into heads (B, heads, T, head_dim), with RoPE."""
        B, T, _ = x.shape
        h = linear(x).view(B, T, -1, self.head_dim)
        return (h if rope is None else apply_rope(h, *rope)).transpose(1, 2)

    def project_out(self, y):
        """U (B, H, T, hd) -> its heads side by side through W_O, (B, T, C)."""
        B, H, T, hd = y.shape
        y = self.c_proj(y.transpose(1, 2).reshape(B, T, H * hd))
        return F.dropout(y, self.dropout, self.training)


def newest(t, T):
    """The last T positions of t (B, heads, T_k, D): a layer's new rows when t holds cached ones.
    t itself when it has no others (training): a slice would cost a zero-filled copy in backward."""
    return t if t.size(2) == T else t[:, :, -T:]


def attention(q, k, v, dropout_p):
    """softmax(QK^T/sqrt(d_h)) V, causal, through SDPA's fused kernels; q (B, H, T, D), k and v
    (B, H_kv, T_k, D) with T_k >= T, the last T of them at q's positions."""
    T, T_k, gqa = q.size(2), k.size(2), k.size(1) != q.size(1)
    if T == T_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                              enable_gqa=gqa)
    # after a cache SDPA's is_causal would align the mask top-left: build it (one new token: none)
    mask = None if T == 1 else torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          enable_gqa=gqa)


def rope_table(head_dim, max_len, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(max_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate-half RoPE (Llama's convention) on x of shape (B, T, heads, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.c_up = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.c_down = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)
        self.dropout = config.dropout

    def forward(self, x):
        y = self.c_down(F.silu(self.c_gate(x)) * self.c_up(x))
        return F.dropout(y, self.dropout, self.training)


class Block(nn.Module):
    """Layer n: pre-norm attention, then the MLP. attention: its class (ablations.py's own)."""

    def __init__(self, config, n, attention=CausalSelfAttention):
        super().__init__()
        self.norm_attn = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = attention(config, n)
        self.norm_mlp = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, lambda_n, v1, kv_cache):
        y, v = self.attn(self.norm_attn(x), rope, lambda_n, v1, kv_cache)
        x = x + y
        return x + self.mlp(self.norm_mlp(x)), v


class GPT(nn.Module):
    """The paper's model. block: the class of its layers (ablations.py passes its own)."""

    def __init__(self, config, block=Block):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(block(config, n) for n in range(1, config.n_layer + 1))
        self.norm_f = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # untied (the paper)
        self.store_lambdas(config)
        cos, sin = rope_table(config.n_embd // config.n_head, config.block_size, config.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        # KV cache slots: one per K and V a layer computes itself (SVFormer's layers store no V)
        keys, values = ([b.attn for b in self.blocks if getattr(b.attn, c) is not None]
                        for c in ('c_k', 'c_v'))
        for slot, attn in enumerate(keys):
            attn.k_slot = slot
        for slot, attn in enumerate(values):
            attn.v_slot = slot
        self.kv_slots = len(keys), len(values)
        self.init_weights()

    def init_weights(self):
        normal_init(self.modules())

    def store_lambdas(self, config):
        """The whole λ table as a buffer, or layers 2..n_layer's λ as parameters (no decay)."""
        rows = config.lambdas[config.source_layer:] if config.value_residual else \
            [(0.0, 1.0)] * (config.n_layer - config.source_layer)
        later = torch.tensor(rows).view(len(rows), 2)
        if config.lambda_mode == 'fixed':
            self.register_buffer('fixed_lambdas', self.whole_table(later), persistent=False)
        elif config.lambda_mode == 'learnable':
            self.lambda_1 = nn.Parameter(later[:, 0].clone())
            self.lambda_2 = nn.Parameter(later[:, 1].clone())
        else:  # Learnable-Plus: λ = Σ rows (n_layer), λ' = log(rows / λ), so λ softmax(λ') = rows
            self.lambda_scale = nn.Parameter(later[:, 0].sum())
            self.lambda_prime = nn.Parameter((later[:, 0] / later[:, 0].sum()).log())
            self.lambda_2 = nn.Parameter(later[:, 1].clone())

    @property
    def lambdas(self):
        """(n_layer, 2): the weights (on V1, on V_n) each layer applies now."""
        if self.config.lambda_mode == 'fixed':
            return self.fixed_lambdas
        if self.config.lambda_mode == 'learnable':
            return self.whole_table(torch.stack([self.lambda_1, self.lambda_2], dim=1))
        lambda_1 = self.lambda_scale * self.lambda_prime.softmax(0)
        return self.whole_table(torch.stack([lambda_1, self.lambda_2], dim=1))

    def whole_table(self, later):
        """The later layers' λ rows under those of the layers that mix nothing in, (0, 1)."""
        unchanged = later.new_zeros(self.config.source_layer, 2)
        unchanged[:, 1] = 1.0  # filled on the device: new_tensor would copy from the host
        return torch.cat([unchanged, later])

    def forward(self, idx, targets=None, kv_cache=None):
        """Logits (B, T, vocab_size) of the tokens idx (B, T); with targets, the mean cross-entropy
        alone (targets -1 ignored). kv_cache: continue from the positions it holds, adding these."""
        x, rope = self.embed(idx, kv_cache)
        lambdas = self.lambdas  # once per forward: learned λ are a stack or a softmax
        v1 = None
        for n, block in enumerate(self.blocks, start=1):
            x, v = block(x, rope, lambdas[n - 1], v1, kv_cache)
            if n == 1:
                v1 = v  # V1: layer 1's values at every position so far, for every later layer
        return self.head(x, targets, kv_cache)

    def embed(self, idx, kv_cache):
        """(token embeddings (B, T, C), RoPE's angles at the new positions), if the context fits."""
        T, pos = idx.size(1), 0 if kv_cache is None else kv_cache.pos
        limit = self.config.block_size if kv_cache is None else kv_cache.max_seq_len
        if pos + T > limit:
            raise ValueError(f"{pos + T} positions exceed the model's context of {limit}; "
                             f"use at most {limit - pos} tokens")
        rope = (self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T])
        return F.dropout(self.wte(idx), self.config.dropout, self.training), rope

    def head(self, x, targets, kv_cache):
        """The LM head: logits, or the loss alone when training (logits kept beside a loss would be
        saved for the backward: 13 GB at 82M, 64 x 2048). The cache now holds the new positions too."""
        if kv_cache is not None:
            kv_cache.pos += x.size(1)
        logits = self.lm_head(self.norm_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)

    def num_params(self, exclude_embedding=False):
        """Parameters; exclude_embedding: without the token tables (lookups cost no FLOPs)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if exclude_embedding else n

    # --- inference: a KV cache and generation
    def new_kv_cache(self, max_seq_len=None):
        """An empty cache for up to max_seq_len (default block_size) positions."""
        return KVCache(*self.kv_slots, min(max_seq_len or math.inf, self.config.block_size))

    def kv_bytes_per_token(self, element_size=2):
        """Bytes a KV cache holds per position: K and V of every slot, element_size bytes each."""
        head_dim = self.config.n_embd // self.config.n_head
        return sum(self.kv_slots) * self.config.n_kv_head * head_dim * element_size

    @torch.no_grad()
    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True,
                        kv_cache=None, vocab_size=None):
        """Yield the next token (B, 1), max_new_tokens times; temperature=0 is greedy. kv_cache:
        decode into this one. vocab_size: sample ids below it only (no padding). Past block_size
        (or kv_cache.max_seq_len), the context is cropped to its last that many tokens."""
        context = min(self.config.block_size, kv_cache.max_seq_len if kv_cache else math.inf)
        if use_cache and kv_cache is None:
            kv_cache = self.new_kv_cache(idx.size(1) + max_new_tokens)
        if kv_cache is not None:
            kv_cache.pos = 0
        for _ in range(max_new_tokens):
            if kv_cache is not None and kv_cache.pos == kv_cache.max_seq_len:
                kv_cache.pos = 0  # full: start over on the cropped context, as without the cache
            fresh = idx[:, -context:] if kv_cache is None or kv_cache.pos == 0 else idx[:, -1:]
            logits = self(fresh, kv_cache=kv_cache)[:, -1, :vocab_size].float()
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

    def generate(self, idx, max_new_tokens, *args, **kwargs):
        """idx (B, T) extended by max_new_tokens tokens (generate_tokens's other arguments)."""
        return torch.cat([idx, *self.generate_tokens(idx, max_new_tokens, *args, **kwargs)], dim=1)


def normal_init(modules):
    """The paper's init (Hugging Face Llama's): linear and embedding weights N(0, 0.02²)."""
    for module in modules:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)


class KVCache:
    """Keys and values of past positions, preallocated to max_seq_len on first write. Only tensors a
    layer computes itself get a slot: SVFormer keeps values for layer 1 alone."""

    def __init__(self, n_k_slots, n_v_slots, max_seq_len):
        self.k, self.v = [None] * n_k_slots, [None] * n_v_slots
        self.max_seq_len, self.pos = max_seq_len, 0  # pos: positions cached; a forward advances it

    def store(self, kind, slot, new):
        """Write keys (kind 'k') or values (B, heads, T, head_dim) at pos; return the slot's all."""
        B, H, T, D = new.shape
        slots = self.k if kind == 'k' else self.v
        if slots[slot] is None:
            slots[slot] = new.new_empty(B, H, self.max_seq_len, D)
        slots[slot][:, :, self.pos:self.pos + T] = new
        return slots[slot][:, :, :self.pos + T]
