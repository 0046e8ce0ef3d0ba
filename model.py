"""
Value Residual Learning (Zhou et al., arXiv 2410.17897) in one file: ResFormer and SVFormer.

A Llama-style decoder (pre-norm RMSNorm, RoPE, SwiGLU, no biases) with one more residual path, on
the attention values: every layer n > 1 mixes layer 1's values V1 into its own before attention,

    U_n = softmax(Q_n K_n^T / √d_h) (λ_{n,1} V1 + λ_{n,2} V_n),   d_h = head size, λ: (n_layer, 2)

λ = (0, 1) is the Transformer, (0.5, 0.5) Identity ResFormer, (1, 0) SVFormer, whose layers n > 1
then have no value projection (and cache no values). Part one is the paper, down to a marked line;
part two, the ablations, the baselines and the config checks. The paper's layer n is blocks[n - 1].
Citations name the paper's version: ICLR (the ICLR 2025 text, OpenReview kn3GT7LbxT) or v5 (arXiv
v5, the ACL 2025 version, second-hand). ResFormer is ICLR Eqn. 7; its Eqn. 2, cross-layer attention.
"""

import math
from collections import namedtuple
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    """Dropout on attention probabilities and residual branches (the paper uses 0)."""
    tie_embeddings: bool = False
    """Share the input embedding with the LM head (the paper keeps them untied)."""
    # --- the paper's value residual
    variant: str = 'custom'
    """A preset of VARIANTS that sets the flags below (vanilla, svformer, neutreno(_resformer), cla,
    resformer_identity/constant/sparse/learnable(_plus), denseformer, share_k/v), or 'custom'."""
    value_residual: bool = False
    """Mix V1 into every later layer's values, weighted by `lambdas` (ResFormer, SVFormer)."""
    lambdas: tuple = None
    """n_layer rows (weight on V1, weight on V_n), row 1 (0, 1); None: Identity's (0.5, 0.5). A
    layer with a fixed weight 0 on V_n is an SVFormer layer: it has no W_V."""
    lambda_mode: str = 'fixed'
    """'fixed', 'learnable' (from `lambdas`), 'plus' (Learnable-Plus: λ_{n,1} = λ·softmax(λ')_n)"""
    value_rescale: bool = False
    """Post-residual rescaling, our reading of the paper: V'_n / (λ_{n,1} + λ_{n,2})."""
    # --- part two: the ablations (v5 Sec. 4.4, ICLR 4.3), baselines, values from outside the paper
    residual_source: int = 0
    """The layer later layers mix in (0-based): 0 = V1 (the paper), 1 = V2; H_s under 'hidden'."""
    residual_type: str = 'value'
    """What λ mixes: 'value' (ResFormer), 'query', 'key', 'attention' (A itself) or 'hidden'."""
    value_mapping: str = 'current'
    """How V1 is mapped: 'current' (A_n, ResFormer), 'first' (A_1), 'identity' (ICLR Eqn. 6: none,
    and every earlier layer's values, averaged, instead of V1)."""
    h0_residual: bool = True
    """False drops block 1's residual connection of H0 (the embedding)."""
    neutreno_lambda: float = 0.0
    """NeuTRENO baseline: U_n = A_n V'_n + λ(V1 - V'_n) in layers n > 1; 0 = off."""
    denseformer: bool = False
    """DenseFormer baseline: each block's input a learned average of all earlier outputs."""
    share_kv: str = 'none'
    """Layer pairs share 'kv' (CLA), 'k' or 'v' (ICLR Sec. 3.5), or 'none'."""
    value_embeds: bool = False
    """Value embeddings (nanochat): every other layer adds a gated token table to its values."""
    value_bank: bool = False
    """Bank of Values (arXiv 2606.02780): the top third of the layers look their values up."""

    def __post_init__(self):
        resolve_config(self)  # part two: n_kv_head, ffn_hidden, a variant's flags and λ; errors


# The named variants: each sets these flags (the others keep their defaults), and
# GPTConfig.__post_init__ (resolve_config, part two) fills config.lambdas with variant_lambdas's
# rows, right below. NeuTRENO, DenseFormer and the K/V sharing are the paper's baselines, built by
# part two's AblationGPT.
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
    """The λ table of a value-residual variant: n_layer rows (weight on V1, weight on V_n).
    Rows 0 to source (layer 1, or part two's residual_source) are (0, 1): they mix in nothing."""
    later = range(source + 1, n_layer)
    if variant in ('resformer_identity', 'resformer_learnable', 'neutreno_resformer'):
        rows = [(0.5, 0.5) for _ in later]                 # official code: 0.5 V1 + 0.5 V_n
    elif variant == 'resformer_constant':
        rows = [(2.0, 1.0) for _ in later]                 # the paper: λ = 2
    elif variant == 'resformer_sparse':
        # V1 in the top 3/8 of the layers only (of 8: 6-8, 1-based, λ1 = 5: the paper's best)
        first = n_layer - (3 * n_layer) // 8
        rows = [(5.0, 1.0) if n >= first else (0.0, 1.0) for n in later]
    elif variant == 'resformer_learnable_plus':
        # λ_{n,1} = λ · softmax(λ')_n, λ starts at n_layer. Of λ' the paper says only "stronger for
        # higher layers": we choose linspace(0, 1), so the top layer starts at e x the bottom's
        logits = [j / max(len(later) - 1, 1) for j in range(len(later))]
        total = sum(math.exp(z) for z in logits)
        rows = [(n_layer * math.exp(z) / total, 0.5) for z in logits]
    elif variant == 'svformer':
        rows = [(1.0, 0.0) for _ in later]                 # U_n = A_n V1: no W_V in layers n > 1
    else:
        return None
    return ((0.0, 1.0),) * (source + 1) + tuple(rows)


class CausalSelfAttention(nn.Module):
    """The paper's attention of one layer: vanilla, ResFormer or SVFormer, with or without cache."""

    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.k_slot = self.v_slot = None  # KV cache slots, assigned by GPT
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        self.takes_v1 = config.value_residual and layer > 0  # ResFormer: mixes V1 into its values
        # SVFormer: a fixed weight 0 on its own V_n (lambdas is a full table after __post_init__):
        # the layer attends over V1 alone, and has no W_V
        self.svformer = (self.takes_v1 and config.lambda_mode == 'fixed'
                         and config.lambdas[layer][1] == 0)
        self.c_q = nn.Linear(d, d, bias=False)                                     # W_Q
        self.c_k = nn.Linear(d, kv_dim, bias=False)                                # W_K
        self.c_v = None if self.svformer else nn.Linear(d, kv_dim, bias=False)    # W_V
        self.c_proj = nn.Linear(d, d, bias=False)                                  # W_O

    def forward(self, x, rope, lam, v1, kv_cache):
        """x (B, T, C) -> (output (B, T, C), the values attended over (B, H_kv, T_k, hd)). lam: the
        layer's (λ_{n,1}, λ_{n,2}); v1: layer 1's values at every position so far (None in layer 1);
        kv_cache: a KVCache to continue from and write to, or None."""
        T = x.size(1)
        q = self.heads(self.c_q, x, rope)                                 # Q_n = RoPE(x W_Q)
        k = self.heads(self.c_k, x, rope)                                 # K_n = RoPE(x W_K)
        if kv_cache is not None:
            k = kv_cache.store(kv_cache.k, self.k_slot, k)               # keys of every position
        if self.svformer:
            v = lam[0] * v1                  # SVFormer: U_n = A_n V1, every position's (no cache)
        else:
            v = self.heads(self.c_v, x)                                   # V_n = x W_V (no RoPE)
            if self.takes_v1:
                # ResFormer: V'_n = λ_{n,1} V1 + λ_{n,2} V_n, on the value heads before any GQA
                # repetition. V1 is not detached: every later layer trains layer 1's W_V. Only V1's
                # newest T rows: the cache already holds the mixed V'_n of every earlier position.
                v = lam[0] * newest(v1, T) + lam[1] * v
            if kv_cache is not None:
                v = kv_cache.store(kv_cache.v, self.v_slot, v)           # a ResFormer caches V'_n
        y = attention(q, k, v, self.dropout if self.training else 0.0)  # U_n = softmax(QK^T/√d_h)V'
        return self.project_out(y), v

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
    # a chunk after a cache: SDPA's is_causal aligns the mask top-left, wrong here: build the mask
    # (a single new token sees every cached position: it needs no mask)
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
    attention_type = CausalSelfAttention  # part two's AblationBlock swaps in AblationAttention

    def __init__(self, config, layer):
        super().__init__()
        self.norm_attn = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = self.attention_type(config, layer)
        self.norm_mlp = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, lam, v1, kv_cache):
        y, v = self.attn(self.norm_attn(x), rope, lam, v1, kv_cache)
        x = x + y
        return x + self.mlp(self.norm_mlp(x)), v


class GPT(nn.Module):
    """The paper's model. GPT(config) for a config that sets one of part two's flags returns part
    two's AblationGPT, a subclass (__new__ below), so every variant is built the same way."""
    block_type = Block  # part two's AblationGPT builds AblationBlocks

    def __new__(cls, config=None):
        # a config with a part-two flag set builds part two's AblationGPT, a subclass of GPT
        if cls is GPT and config is not None and ablations(config):
            cls = AblationGPT
        return super().__new__(cls)

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(self.block_type(config, n) for n in range(config.n_layer))
        self.norm_f = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.store_lambdas(config)
        cos, sin = rope_table(config.n_embd // config.n_head, config.block_size, config.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        # KV cache slots: one per K and V a layer computes itself; SVFormer's layers have no W_V, so
        # they store no values and read layer 1's (part two's share_kv also drops c_k)
        attns = [block.attn for block in self.blocks]
        for slot, attn in enumerate(a for a in attns if a.c_k is not None):
            attn.k_slot = slot
        for slot, attn in enumerate(a for a in attns if a.c_v is not None):
            attn.v_slot = slot
        self.kv_slots = sum(a.c_k is not None for a in attns), sum(a.c_v is not None for a in attns)
        self.init_weights()

    def init_weights(self):
        """The paper's (Hugging Face Llama's) init: linear and embedding weights N(0, 0.02²)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def store_lambdas(self, config):
        """λ of the layers after layer 1 (or part two's residual_source), as lambda_mode needs: a
        fixed table, or parameters under 2 dims, which the optimizer never decays."""
        L, s = config.n_layer, config.residual_source
        rows = config.lambdas[s + 1:] if config.value_residual else [(0.0, 1.0)] * (L - 1 - s)
        later = torch.tensor(rows).view(L - 1 - s, 2)
        if config.lambda_mode == 'fixed':
            self.register_buffer('lambdas_fixed', self.whole_table(later), persistent=False)
        elif config.lambda_mode == 'learnable':
            self.lambda_v1 = nn.Parameter(later[:, 0].clone())
            self.lambda_vn = nn.Parameter(later[:, 1].clone())
        else:  # Learnable-Plus: λ_{n,1} = λ · softmax(λ')_n, started equal to `lambdas`
            self.lambda_scale = nn.Parameter(later[:, 0].sum())
            self.lambda_logits = nn.Parameter((later[:, 0] / later[:, 0].sum()).log())
            self.lambda_vn = nn.Parameter(later[:, 1].clone())

    @property
    def lambdas(self):
        """(n_layer, 2): the weights (on V1, on V_n) each layer applies now, rescaling included."""
        if self.config.lambda_mode == 'fixed':
            table = self.lambdas_fixed
        elif self.config.lambda_mode == 'learnable':
            table = self.whole_table(torch.stack([self.lambda_v1, self.lambda_vn], dim=1))
        else:
            v1 = self.lambda_scale * self.lambda_logits.softmax(0)
            table = self.whole_table(torch.stack([v1, self.lambda_vn], dim=1))
        if self.config.value_rescale:  # post-residual rescaling: V'_n / (λ_{n,1} + λ_{n,2})
            table = table / table.sum(dim=1, keepdim=True)
        return table

    def whole_table(self, later):
        """The later layers' λ rows under layer 1's row (0, 1)."""
        unchanged = torch.zeros_like(later[:1])
        unchanged[:, 1] = 1.0  # filled on the device: new_tensor would copy from the host
        return torch.cat([unchanged.expand(self.config.residual_source + 1, 2), later])

    def forward(self, idx, targets=None, kv_cache=None):
        """(logits (B, T, vocab), None), or with targets (None, mean cross-entropy, ignoring -1).
        kv_cache: continue from the positions it holds, and add these."""
        T = idx.size(1)
        pos = self.check_length(T, kv_cache)
        rope = (self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T])
        lambdas = self.lambdas  # once per forward: learned λ are a stack or a softmax
        x = F.dropout(self.wte(idx), self.config.dropout, self.training)
        v1 = None
        for n, block in enumerate(self.blocks):
            x, v = block(x, rope, lambdas[n], v1, kv_cache)
            if n == 0:
                v1 = v  # V1: layer 1's values at every position so far, for every later layer
        if kv_cache is not None:
            kv_cache.pos += T
        return self.logits_or_loss(x, targets)

    def check_length(self, T, kv_cache):
        """The position T new tokens start at, if the model's context holds them."""
        pos = 0 if kv_cache is None else kv_cache.pos
        limit = self.config.block_size if kv_cache is None else kv_cache.max_seq_len
        if pos + T > limit:
            raise ValueError(f"{pos + T} positions exceed the model's context of {limit}; "
                             f"use at most {limit - pos} tokens")
        return pos

    def logits_or_loss(self, x, targets):
        """The LM head: logits, or the loss alone when training (logits kept beside a loss would be
        saved for the backward: 6.6 GB at 82M)."""
        logits = self.lm_head(self.norm_f(x))
        if targets is None:
            return logits, None
        return None, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                     ignore_index=-1)

    def token_tables(self):
        """Part two's token tables (value embeddings, banks of values): the paper has none."""
        return []

    def num_params(self, exclude_embedding=False):
        """Parameters (shared ones once); exclude_embedding: without the token tables (no FLOPs)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= sum(table.weight.numel() for table in self.token_tables())
            n -= 0 if self.config.tie_embeddings else self.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len, causal=True):
        """Training FLOPs a token: 6 per matmul weight, and causal attention's QK^T and AV, 6·L·d·T
        (a fused kernel skips the masked half). causal=False: PaLM's (appendix B) and nanoGPT's
        count, 12·L·d·T, crediting work no kernel does (at 65,536 tokens, nearly twice the MFU)."""
        cfg = self.config
        attention = (6 if causal else 12) * cfg.n_layer * cfg.n_embd * seq_len
        return 6 * self.num_params(exclude_embedding=True) + attention

    # --- inference: a KV cache and generation
    def new_kv_cache(self, max_seq_len=None):
        """An empty cache for up to max_seq_len (default block_size) positions."""
        size = min(max_seq_len or self.config.block_size, self.config.block_size)
        return KVCache(*self.kv_slots, size)

    def kv_bytes_per_token(self, element_size=2):
        """Bytes a KV cache holds per position of a sequence: K and V of every slot, element_size
        bytes an element."""
        n_k, n_v = self.kv_slots
        return (n_k + n_v) * self.config.n_kv_head * (self.config.n_embd // self.config.n_head) \
            * element_size

    def compile_for_decoding(self):
        """torch.compile for generate(): once for a prompt, once for single tokens. On a CPU a small
        model's tokens cost mostly per-call overhead, which inductor's C++ wrapper removes."""
        self.compile(options={'cpp_wrapper': self.lm_head.weight.device.type == 'cpu'})

    @torch.no_grad()
    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True,
                        kv_cache=None, vocab_size=None):
        """Yield the next token (B, 1), max_new_tokens times; temperature=0 is greedy. kv_cache:
        decode into this one. vocab_size: sample only ids below it (not the padding). Past
        block_size (or a smaller kv_cache's max_seq_len), the context is cropped to its last
        that many tokens, cache or not."""
        context = min(self.config.block_size, kv_cache.max_seq_len if kv_cache else math.inf)
        if use_cache and kv_cache is None:
            kv_cache = self.new_kv_cache(idx.size(1) + max_new_tokens)
        if kv_cache is not None:
            kv_cache.reset()
        for _ in range(max_new_tokens):
            if kv_cache is not None and kv_cache.pos == kv_cache.max_seq_len:
                kv_cache.reset()  # full: start over on the cropped context, as without the cache
            fresh = idx[:, -context:] if kv_cache is None or kv_cache.pos == 0 else idx[:, -1:]
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
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True,
                 vocab_size=None):
        """idx (B, T) extended by max_new_tokens (generate_tokens's arguments)."""
        new = self.generate_tokens(idx, max_new_tokens, temperature, top_k, use_cache,
                                   vocab_size=vocab_size)
        return torch.cat([idx, *new], dim=1)


class KVCache:
    """Keys and values of past positions, preallocated to max_seq_len on first write. Only tensors a
    layer computes itself get a slot: SVFormer keeps values for layer 1 alone."""

    def __init__(self, n_k_slots, n_v_slots, max_seq_len):
        self.k, self.v = [None] * n_k_slots, [None] * n_v_slots
        self.max_seq_len = max_seq_len
        self.pos = 0  # positions already cached; the model advances it after each forward

    def store(self, slots, slot, new):
        """Write new (B, heads, T, head_dim) entries at self.pos; return all the slot holds now."""
        B, H, T, D = new.shape
        if slots[slot] is None:
            slots[slot] = new.new_empty(B, H, self.max_seq_len, D)
        slots[slot][:, :, self.pos:self.pos + T] = new
        return slots[slot][:, :, :self.pos + T]

    def reset(self):
        self.pos = 0

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)



# ==================================================================================================
# Part two: the ablations (v5 Sec. 4.4; Sec. 4.3 of the ICLR text), the baselines and
# values from outside the paper, for a config that sets one of GPTConfig's part-two fields; then the
# checks behind GPTConfig's one-line errors. With none set, AblationGPT computes what GPT does.
#   residual_source  the layer s later layers take the residual from: 0 = V1, 1 = V2; the layers up
#                    to it are unchanged. With residual_type='hidden', whose input: 0 = H0, 1 = H1.
#   residual_type    what λ mixes in the layers after s: 'value' (ResFormer), 'query' (Q'_n =
#                    λ1 Q_s + λ2 Q_n), 'key' (K'_n likewise), 'attention' (A'_n likewise, explicit)
#                    or 'hidden' (the attention reads λ1 norm(H_s) + λ2 norm(x_n); our reading).
#   value_mapping    which attention maps V_s: 'current' (A_n (λ1 V1 + λ2 V_n)), 'first' (λ1 A_1 V1
#                    + λ2 A_n V_n) or 'identity' (ICLR Eqn. 6: U_n = A_n V_n + 1/(n-1) Σ_{i<n} V_i,
#                    unattended; no λ, so residual_source=0 and the default lambdas, unused).
#   h0_residual      False: block 1 drops its residual connection of H0, so V2 no longer carries H0.
#   neutreno_lambda  NeuTRENO: U_n = A_n V'_n + λ(V1 - V'_n) after the source; n_kv_head = n_head.
#   share_kv         CLA pairs of layers (0, 1), (2, 3), ...: the second reuses the first's K and V.
#   value_embeds     nanochat's gpt.py: every other layer, the last included, adds a token table
#                    (vocab x kv_dim) to its values, gated per KV head.
#   value_bank       Bank of Values (He et al.): each layer of the last third drops W_V and looks
#                    its values up in its own table, V_n = γ_v E_n[token] (γ_v learned, from 1); the
#                    cache keeps token ids for them. BoV trains them at lr 0.15, here as embeddings.


def ablations(cfg):
    """The part-two fields (residual_source and those after it) set away from their defaults."""
    names = [f.name for f in fields(cfg)]
    return [f.name for f in fields(cfg)[names.index('residual_source'):]
            if getattr(cfg, f.name) != f.default]


# What one attention layer hands to later ones: q (B, H, T, hd) after RoPE; k, v (B, H_kv, T_k, hd)
# over every cached position; attn (B, H, T, T_k) when explicit; out, U = attn·v before W_O.
Heads = namedtuple('Heads', 'q k v attn out')


def mixes(cfg, layer):
    """What the λ table mixes into 0-based layer `layer` from the source layer: None (vanilla, or a
    layer up to the source), 'value' (ResFormer), 'query', 'key', 'attention' or 'hidden'."""
    return cfg.residual_type if cfg.value_residual and layer > cfg.residual_source else None


def mixes_source_values(cfg, layer):
    """ResFormer's rule for any source s and mapping: this layer attends over λ1 V_s + λ2 V_n."""
    return mixes(cfg, layer) == 'value' and cfg.value_mapping == 'current'


def is_svformer_layer(cfg, layer):
    """SVFormer's rule: a ResFormer layer with a fixed weight 0 on its own V_n has no W_V."""
    return (mixes_source_values(cfg, layer) and cfg.lambda_mode == 'fixed'
            and cfg.lambdas[layer][1] == 0.0)


def shares_prev(cfg, layer, what):
    """CLA pairs (0, 1), (2, 3), ...: the second layer of a pair reuses the first's K ('k') or V."""
    return layer % 2 == 1 and cfg.share_kv in (what, 'kv')


def has_value_embed(cfg, layer):
    """nanochat's placement of value embeddings: alternating layers, counted from the last."""
    return cfg.value_embeds and layer % 2 == (cfg.n_layer - 1) % 2


def in_value_bank(cfg, layer):
    """BoV's placement: the last third of the layers, never layer 1."""
    return cfg.value_bank and layer >= (2 * cfg.n_layer) // 3


def explicit_softmax(cfg, layer):
    """The attention-matrix residual mixes A itself, so the source layer and every later one compute
    it explicitly instead of through SDPA's fused kernels."""
    return cfg.value_residual and cfg.residual_type == 'attention' and layer >= cfg.residual_source


class AblationAttention(nn.Module):
    """CausalSelfAttention plus the query / key / attention residuals and other value mappings, CLA
    and share-K/V, NeuTRENO, value embeddings and the bank of values; with none of them it computes
    what CausalSelfAttention does (test_model checks, bit for bit)."""

    heads, project_out = CausalSelfAttention.heads, CausalSelfAttention.project_out  # not copies

    def __init__(self, config, layer):
        # as CausalSelfAttention.__init__, but only the projections it keeps: others change the RNG
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.k_slot = self.v_slot = None  # KV cache slots, assigned by GPT
        d, kv_dim = config.n_embd, config.n_kv_head * self.head_dim
        self.mixes = mixes(config, layer)  # 'query', 'key', 'attention' or 'value' (self.mapping)
        self.mapping = config.value_mapping if self.mixes == 'value' else None
        self.takes_v1 = mixes_source_values(config, layer)
        self.svformer = is_svformer_layer(config, layer)
        self.shares_v = shares_prev(config, layer, 'v')
        self.explicit_softmax = explicit_softmax(config, layer)
        self.neutreno_lambda = config.neutreno_lambda if layer > config.residual_source else 0.0
        self.layer = layer  # the identity mapping averages the values of the `layer` layers below
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = None if shares_prev(config, layer, 'k') else nn.Linear(d, kv_dim, bias=False)
        in_bank = in_value_bank(config, layer)
        own_values = not (self.svformer or self.shares_v or in_bank)
        self.c_v = nn.Linear(d, kv_dim, bias=False) if own_values else None
        self.c_proj = nn.Linear(d, d, bias=False)
        # value embeddings: a token table, gated by the first 12 channels of the layer's input
        embeds = has_value_embed(config, layer)
        self.value_embed = nn.Embedding(config.vocab_size, kv_dim) if embeds else None
        self.ve_gate = nn.Linear(min(12, d), self.n_kv_head, bias=False) if embeds else None
        # the bank of values: the layer's own token table, and BoV's learned scale of it
        self.bank = nn.Embedding(config.vocab_size, kv_dim) if in_bank else None
        self.gamma_v = nn.Parameter(torch.ones(1)) if in_bank else None

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

    def forward(self, x, rope, lam, v1, kv_cache, source, prev, idx, tokens, v_sum):
        """As CausalSelfAttention.forward, returning Heads; source, prev: the Heads of the source
        layer and of the previous one; idx: the new tokens (B, T); tokens: every position's
        (B, T_k); v_sum: the identity mapping's Σ_{i<n} V_i at the new positions."""
        B, T, C = x.shape
        q = self.heads(self.c_q, x, rope)
        if self.mixes == 'query':
            q = lam[0] * source.q + lam[1] * q  # Q'_n = λ1 Q1 + λ2 Q_n (RoPE is linear)
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
            # Bank of Values: V_n = γ_v E_n[token], a function of the token ids alone, so the cache
            # keeps those (AblationGPT.forward) and every position's values are looked up again
            table = self.bank(tokens).view(B, -1, self.n_kv_head, self.head_dim).transpose(1, 2)
            v = self.gamma_v * table
            if self.takes_v1:  # with ResFormer, V'_n = λ1 V1 + λ2 γ_v E_n[token], at every position
                v = lam[0] * v1 + lam[1] * v
        else:
            v = self.heads(self.c_v, x)
            if self.value_embed is not None:  # nanochat: V_n += 3σ(W_g x[:12]) E_n[token], per head
                gate = self.ve_gate(x[..., :self.ve_gate.in_features])
                gate = 3 * torch.sigmoid(gate).transpose(1, 2)
                table = self.value_embed(idx).view(B, T, self.n_kv_head, self.head_dim)
                table = table.transpose(1, 2)
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
                probs = lam[0] * source.attn + lam[1] * probs  # A'_n = λ1 A1 + λ2 A_n
            repeat = self.n_head // self.n_kv_head
            y = F.dropout(probs, dropout) @ v.repeat_interleave(repeat, dim=1)
        else:
            y = attention(q, k, v, dropout)
        if self.mapping == 'first':  # mapped by layer 1's attention: λ1 A1 V1 + λ2 A_n V_n
            y = lam[0] * source.out + lam[1] * y
        if self.mapping == 'identity':  # ICLR Eqn. 6: U_n = A_n V_n + 1/(n-1) Σ_{i<n} V_i
            y = y + (v_sum / self.layer).repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        if self.neutreno_lambda:
            # NeuTRENO: U_n += λ (V1 - V'_n)
            y = y + self.neutreno_lambda * (newest(v1, T) - newest(v, T))
        return self.project_out(y), Heads(q, k, v, probs, y)


class AblationBlock(Block):
    """Block with AblationAttention, and the hidden residual and h0_residual (on its input)."""
    attention_type = AblationAttention

    def __init__(self, config, layer):
        super().__init__(config, layer)
        self.adds_input = layer > 0 or config.h0_residual
        self.mixes_hidden = mixes(config, layer) == 'hidden'

    def forward(self, x, rope, lam, v1, kv_cache, ablation_inputs, h_source):
        """ablation_inputs: what AblationAttention reads beyond V1; h_source: the hidden residual's
        H_s, the source block's input (B, T, C), at the new positions. Returns (x, Heads)."""
        h = self.norm_attn(x)
        if self.mixes_hidden:  # hidden residual: the attention reads λ1 norm(H_s) + λ2 norm(x_n)
            h = lam[0] * self.norm_attn(h_source) + lam[1] * h
        y, heads = self.attn(h, rope, lam, v1, kv_cache, **ablation_inputs)
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

    def nbytes(self):
        tokens = 0 if self.tokens is None else self.tokens.numel() * self.tokens.element_size()
        return super().nbytes() + tokens


class AblationGPT(GPT):
    """GPT with the ablations, baselines and token tables of part two, and the per-layer statistics
    that lab/analyze.py reads. GPT(config) builds one when the config sets an ablation; any config
    may build one directly (with no ablation it computes what GPT does, bit for bit)."""
    block_type = AblationBlock

    def __init__(self, config):
        super().__init__(config)
        L = config.n_layer
        # DenseFormer's α: block i's output weights X_0 .. X_{i+1}, started at the identity
        self.dwa = nn.ParameterList(nn.Parameter(F.one_hot(torch.tensor(i + 1), i + 2).float())
                                    for i in range(L)) if config.denseformer else None

    def init_weights(self):
        """GPT's init, the token tables last (as drawn when GPT held them: the same weights from a
        seed), then each layer's table init (AblationAttention.init_tables)."""
        tables = self.token_tables()
        for module in sorted(self.modules(), key=lambda m: m in tables):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for block in self.blocks:
            block.attn.init_tables(self.wte.weight, self.config.norm_eps)

    def new_kv_cache(self, max_seq_len=None):
        """GPT's cache, with room for the token ids a bank of values keeps instead of its values."""
        return TokenKVCache(*self.kv_slots, super().new_kv_cache(max_seq_len).max_seq_len)

    def kv_bytes_per_token(self, element_size=2):
        """GPT's, and the token id that a bank of values caches instead of its values."""
        bank = self.config.value_bank * TokenKVCache.TOKEN_ID_DTYPE.itemsize
        return super().kv_bytes_per_token(element_size) + bank

    def token_tables(self):
        """The layers' token tables (value embeddings, banks of values), in layer order."""
        return [table for block in self.blocks
                for table in (block.attn.value_embed, block.attn.bank) if table is not None]

    def forward(self, idx, targets=None, kv_cache=None, stats=None):
        """GPT.forward, with what the ablations read carried from block to block. stats: a dict to
        fill with per-layer 'attn', 'keys', 'values' (V'_n) and 'hidden' (lab/analyze.py)."""
        T = idx.size(1)
        pos = self.check_length(T, kv_cache)
        rope = (self.rope_cos[pos:pos + T], self.rope_sin[pos:pos + T])
        lambdas = self.lambdas
        x = F.dropout(self.wte(idx), self.config.dropout, self.training)
        s = self.config.residual_source  # 0: the residual comes from layer 1 (V1); 1: from layer 2
        v1 = source = prev = None  # V_s, the Heads of its layer, and of the last layer
        v_sum = 0  # the identity mapping (Eqn. 6): every earlier layer's values, new positions
        kept = {'outputs': [x]}  # what between_blocks keeps from block to block
        # the token ids of every position attended over, cached ones included: a bank's values
        bank = kv_cache is not None and self.config.value_bank
        tokens = kv_cache.store_tokens(idx) if bank else idx
        for i, block in enumerate(self.blocks):
            x = self.between_blocks(i, x, prev, kept, stats)
            inputs = dict(source=source, prev=prev, idx=idx, tokens=tokens, v_sum=v_sum)
            x, heads = block(x, rope, lambdas[i], v1, kv_cache, inputs, kept.get('h_source'))
            if i == s:  # V_s, taken at every cached position, goes to every later layer
                v1, source = heads.v, heads
            prev = heads
            if self.config.value_mapping == 'identity':
                v_sum = v_sum + newest(heads.v, T)
        x = self.between_blocks(len(self.blocks), x, prev, kept, stats)
        if kv_cache is not None:
            kv_cache.pos += T
        return self.logits_or_loss(x, targets)

    def between_blocks(self, i, x, prev, kept, stats):
        """The residual stream x before block i (i = n_layer: after the last), where DenseFormer,
        the statistics and the hidden residual's H_s act. prev: block i - 1's Heads."""
        if i > 0 and self.dwa is not None:  # DenseFormer: X_i becomes Σ_j α_{i-1,j} X_j, X_0 .. X_i
            kept['outputs'].append(x)
            x = sum(a * h for a, h in zip(self.dwa[i - 1], kept['outputs']))
        if stats is not None and i == 0:
            stats.update(attn=[], keys=[], values=[], hidden=[])
        elif stats is not None:  # block i - 1's A (computed here unless it was), K, V', output
            attn = attention_probs(prev.q, prev.k) if prev.attn is None else prev.attn
            stats['attn'].append(attn)
            stats['keys'].append(prev.k)
            stats['values'].append(prev.v)
            stats['hidden'].append(x)
        if i == self.config.residual_source:
            kept['h_source'] = x  # H_s, the source block's input (H0 = the embedding)
        return x


def attention_probs(q, k):
    """The causal attention matrix softmax(QK^T/sqrt(d)) as a tensor (B, H, T, T_k): for the
    attention-matrix residual and for analysis, which need A itself rather than A·V."""
    T, T_k = q.size(2), k.size(2)
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    causal = torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)
    return scores.masked_fill(~causal, float('-inf')).softmax(dim=-1)


# --------------------------------------------------------------------------------------------------
# GPTConfig's checks: a bad setting or an impossible combination is a one-line ValueError.

VARIANT_FLAGS = ('value_residual', 'lambdas', 'lambda_mode', 'neutreno_lambda', 'denseformer',
                 'share_kv')
# the flags that name one of a few choices, and those choices
CHOICES = dict(lambda_mode=('fixed', 'learnable', 'plus'), share_kv=('none', 'kv', 'k', 'v'),
               residual_type=('value', 'query', 'key', 'attention', 'hidden'),
               value_mapping=('current', 'first', 'identity'))


def need(ok, message):
    if not ok:
        raise ValueError(message)


def resolve_config(cfg):
    """Fill in cfg's defaults and apply its named variant, checking every setting (check_flags)."""
    def whole(value):  # a positive integer, and not a bool
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    def finite(value):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value)

    for name in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size'):
        value = getattr(cfg, name)
        need(whole(value), f"{name} must be a positive integer, got {value!r}")
    for name in ('n_kv_head', 'ffn_hidden'):
        value = getattr(cfg, name)
        need(value is None or whole(value), f"{name} must be a positive integer (or None for the "
                                            f"default), got {value!r}")
    cfg.n_kv_head = cfg.n_kv_head or cfg.n_head
    cfg.ffn_hidden = cfg.ffn_hidden or round(3.5 * cfg.n_embd)
    for name in ('rope_theta', 'norm_eps'):
        value = getattr(cfg, name)
        need(finite(value) and value > 0, f"{name}={value!r} must be a positive finite number")
    need(finite(cfg.dropout) and 0.0 <= cfg.dropout < 1.0,
         f"dropout={cfg.dropout!r} must be in [0, 1)")
    need(finite(cfg.neutreno_lambda),
         f"neutreno_lambda={cfg.neutreno_lambda!r} must be a finite number")
    s = cfg.residual_source
    need(isinstance(s, int) and not isinstance(s, bool) and (s == 0 or 0 < s < cfg.n_layer - 1),
         f"residual_source={s!r} must be a layer index from 0 to {cfg.n_layer - 2}: a later layer "
         "must mix it in")
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
        raise ValueError(f"unknown variant {cfg.variant!r}; choose one of: custom, "
                         f"{', '.join(VARIANTS)}")
    defaults = {f.name: f.default for f in fields(cfg)}
    preset = {k: defaults[k] for k in VARIANT_FLAGS} | VARIANTS[cfg.variant]
    preset['lambdas'] = variant_lambdas(cfg.variant, cfg.n_layer, cfg.residual_source)
    for k, value in preset.items():
        if getattr(cfg, k) not in (defaults[k], value):
            raise ValueError(f"variant={cfg.variant!r} sets {k}={value!r}, but "
                             f"{k}={getattr(cfg, k)!r} was given; use variant='custom' to set it "
                             "yourself")
        setattr(cfg, k, value)


def check_flags(cfg):
    """Combinations of flags that cannot work, each with a one-line reason."""
    s = cfg.residual_source
    need(cfg.n_embd % cfg.n_head == 0,
         f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}")
    need((cfg.n_embd // cfg.n_head) % 2 == 0,
         f"head_dim={cfg.n_embd // cfg.n_head} must be even for RoPE")
    need(cfg.n_head % cfg.n_kv_head == 0,
         f"n_head={cfg.n_head} is not divisible by n_kv_head={cfg.n_kv_head}")
    for name, choices in CHOICES.items():
        value, (*others, last) = getattr(cfg, name), map(repr, choices)
        need(value in choices, f"{name}={value!r}; use {', '.join(others)} or {last}")
    need(cfg.value_mapping == 'current' or cfg.residual_type == 'value',
         f"value_mapping={cfg.value_mapping!r} maps values, but "
         f"residual_type={cfg.residual_type!r}; use residual_type='value'")
    need(not cfg.neutreno_lambda or cfg.n_kv_head == cfg.n_head,
         "NeuTRENO adds λ(V1 - V_n) to the merged heads and needs n_kv_head = n_head")
    if cfg.value_embeds:
        lacking = [n + 1 for n in range(cfg.n_layer) if has_value_embed(cfg, n)
                   and (is_svformer_layer(cfg, n) or shares_prev(cfg, n, 'v'))]
        need(not lacking, f"value_embeds adds to a layer's own values, but layer(s) {lacking} have "
                          f"none (SVFormer or share_kv); drop value_embeds or pick another variant")
    bank = [n + 1 for n in range(cfg.n_layer) if in_value_bank(cfg, n)]  # 1-based, as in messages
    if cfg.value_bank:
        need(cfg.n_layer >= 2, "value_bank needs n_layer >= 2: the last third of one layer is "
                               "layer 1, whose values already depend on the token alone")
        both = [n for n in bank if has_value_embed(cfg, n - 1)]
        need(not both, f"value_embeds and value_bank both give layer(s) {both} a token table; "
                       "use one of them")
        shared = [n for n in bank if shares_prev(cfg, n - 1, 'v')]
        need(not shared, f"share_kv={cfg.share_kv!r} makes layer(s) {shared} reuse the values of "
                         "the layer before, but value_bank gives layers "
                         f"{bank[0]}-{bank[-1]} their own tables; use share_kv='k' or 'none'")
    if not cfg.value_residual:
        need(cfg.lambdas is None,
             "lambdas are only used with value_residual=True; set it or drop lambdas")
        need(cfg.lambda_mode == 'fixed',
             f"lambda_mode={cfg.lambda_mode!r} needs value_residual=True")
        need(not cfg.value_rescale, "value_rescale needs value_residual=True")
        need(cfg.residual_type == 'value' and cfg.value_mapping == 'current',
             "residual_type and value_mapping choose what value_residual mixes; set "
             "value_residual=True")
        need(s == 0 or cfg.neutreno_lambda,
             "residual_source needs value_residual=True or neutreno_lambda")
        return
    need(cfg.n_layer >= 2,
         "value_residual needs n_layer >= 2: layer 1 has no earlier value to mix in")
    need(len(cfg.lambdas) == cfg.n_layer,
         f"lambdas must have shape ({cfg.n_layer}, 2), got {len(cfg.lambdas)} rows")
    # the default lambdas, unused
    unweighted = cfg.lambdas == variant_lambdas('resformer_identity', cfg.n_layer)
    need(cfg.value_mapping != 'identity' or (s == 0 and unweighted and cfg.lambda_mode == 'fixed'
                                             and not cfg.value_rescale),
         "value_mapping='identity' (ICLR Eqn. 6) adds the mean of every earlier layer's values "
         "and has no λ: use residual_source=0 and drop lambdas, lambda_mode and value_rescale")
    for n, row in enumerate(cfg.lambdas[:s + 1]):
        need(row == (0.0, 1.0),
             f"lambdas[{n}] must be (0, 1): layers up to residual_source={s} are unchanged, "
             f"got {row}")
    svformer = [n for n in bank if is_svformer_layer(cfg, n - 1)]
    if svformer:
        raise ValueError(f"value_bank replaces the values of layers {bank[0]}-{bank[-1]}, but "
                         f"SVFormer layer(s) {svformer} have none of their own (a fixed zero "
                         "weight on V_n); give them a weight on V_n in lambdas or drop value_bank")
    need(cfg.residual_type != 'value' or cfg.share_kv not in ('v', 'kv'),
         f"share_kv={cfg.share_kv!r} shares V across layers, which value_residual also redefines "
         "(SVFormer already shares V1); use share_kv='k' or 'none'")
    need(cfg.residual_type != 'key' or cfg.share_kv not in ('k', 'kv'),
         f"share_kv={cfg.share_kv!r} shares K across layers, which the key residual also "
         "redefines; use share_kv='v' or 'none'")
    not_plain = cfg.residual_type != 'value' or cfg.value_mapping != 'current'
    if cfg.lambda_mode == 'fixed' and not_plain:
        need(all(b != 0 for _, b in cfg.lambdas[s + 1:]),
             "a zero weight on the layer's own term leaves its projections untrained with "
             f"residual_type={cfg.residual_type!r}, value_mapping={cfg.value_mapping!r}; only the "
             "value residual (SVFormer) drops them")
    need(cfg.lambda_mode != 'plus' or all(a > 0 for a, _ in cfg.lambdas[s + 1:]),
         "lambda_mode='plus' needs every later lambdas[n][0] > 0 (it is λ·softmax)")
    need(not cfg.value_rescale or all(a + b != 0 for a, b in cfg.lambdas[s + 1:]),
         "value_rescale divides by λ1 + λ2, which is 0 in some row of lambdas")
