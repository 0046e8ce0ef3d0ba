"""
Where does attention go, and what does each layer add? The paper's attention-concentration analysis and its
Sec. 4.5 post-analyses, per layer, for training runs side by side on the same validation windows, with runs
of the same variant (seeds) averaged.

    python lab/analyze.py out/ablation_vanilla out/ablation_resformer_identity out/ablation_svformer
    python lab/analyze.py results/runs/*/ --num_seqs=16 --seq_len=512 --out=analysis
    python lab/analyze.py out/ablation_vanilla out/ablation_svformer --windows=mid_text --ckpt=best.pt

Arguments that are not --key=value settings or config files (*.py) name the runs: out_dirs (their ckpt.pt)
or .pt files. Runs are grouped: those whose model and settings agree apart from seed, out_dir,
wandb_run_name and init_from (e.g. the seeds of one experiment) form one group, shown as mean ± std over
its runs. A group is named by its variant; when several groups share a variant, the settings that differ
between them are added to the name, e.g. "vanilla (learning_rate=0.001)".

The windows: num_seqs windows of seq_len tokens from the validation split of the first run's data_dir,
the same for every run.
  doc_start  (default) each window is a validation document's start, led by the separator that precedes
             every document in the training data: <|endoftext|> for GPT-2 BPE, the blank line "\\n\\n" for
             characters. It plays the BOS token of the paper's analysis, which feeds whole documents from
             their start; the attention sink forms on that first token. Starts come from meta.json's
             val_doc_starts (the character separator also occurs inside documents, so it cannot be searched
             for); documents are spread evenly over the validation split; a window runs on into the next
             document when its own is shorter than seq_len.
  mid_text   windows at evenly spaced offsets, mostly mid-document (no start token).

Per layer (1-based, as in the paper), averaged over the windows:
  entropy           token-importance entropy: average the attention matrix A over heads, s_j = Σ_i A_ij (the
                    attention token j receives), p = s / Σ s, E = -Σ p_j ln p_j. At most ln T; lower means
                    attention concentrated on few tokens (attention sinks).
  entropy_rel       E / ln T, comparable across sequence lengths
  value_norm        mean L2 norm of the value vectors V'_n the layer attends over (tokens and KV heads)
  first_value_norm  the same for the first token, the usual attention sink ("value-state drain": small)
  hidden_norm       mean L2 norm of the block outputs
  hidden_cos        mean cosine similarity between the block outputs of different tokens
  key_cos           the same for keys, per KV head, averaged over heads
Sec. 4.5's post-analyses, our reading of them (no source we could read gives either procedure exactly):
  value_cos_v1      cosine similarity between layer 1's values V1 and the values layer n attends over (V'_n
                    for ResFormer), per KV head and position, averaged: 1 in layer 1, and in every SVFormer
                    layer, which attends over V1 itself
  hidden_cos_h1     the same between layer 1's block output and layer n's, per position
  skip_attn         the loss increase when layer n's attention sublayer outputs zeros (its W_O output), the
                    rest of the model unchanged: skipping layer 1's attention still hands V1 to later layers
  skip_mlp          the same for layer n's MLP
The losses are on the same windows, each predicting its own next tokens; `loss` (one number per run) is the
model's with nothing skipped.
The paper's other analyses (ICLR: the ICLR 2025 text):
  importance_top1, _top2, _top3, _top10, _top1pct   ICLR A.2, Figs. 19-21: the top-k token importance, the k-th
                    largest of p (the token importance the entropy above is of) in a sequence, for k = 1, 2, 3,
                    10 and at the top 1% rank, k = ceil(T / 100); empty (-) where k > T
  importance_by_position   ICLR A.2, Figs. 19-21 (metrics.json only): p_j per position j, averaged over the
                    windows, for the first 64 positions, per layer
  value_eig_max     ICLR Fig. 12 / Eqn. 12: the largest eigenvalue of the uncentred second moment of the
                    layer's values, (1/T) Σ_i v_i v_i^T over a window's T tokens, v_i the values of token i with
                    every KV head concatenated; each window's eigenvalues sorted, largest first, then averaged
                    over the windows. The values are the layer's own, V_n = x W_V before any mixing with V1
                    (ablations.py's Heads.fresh), not the mixed V'_n the model's stats give as what the layer
                    attends over (value_norm's); a layer with no W_V of its own (SVFormer's layers n > 1, the
                    second layer of a CLA pair) has what it attends over instead (V1, the layer below's)
  value_eig_max_rel the largest eigenvalue over the sum of them all (the trace, the values' mean squared norm),
                    per window, then averaged: the share of the values' energy along their top direction, in
                    (0, 1], 1 for values along one direction. The raw eigenvalues scale with the squared value
                    norm, and V1 can be several times larger than later layers' values (or than another
                    model's V1), so comparing value_eig_max mostly compares norms; this share does not
  value_erank       the effective rank: exp of the entropy of the eigenvalues over their trace, from 1 (one
                    direction) to n_kv_head x head_dim (equal energy in every direction); also norm-free
  value_spectrum_1  (metrics.json only) layer 1's full spectrum of the same matrix, n_kv_head x head_dim
                    eigenvalues, largest first: ICLR Fig. 12's
  value_spectrum_1_rel   (metrics.json only) the same, each window's divided by its trace: it sums to 1
  cross_cos_approx, cross_cos_identity   ICLR Fig. 4, on a Transformer (a checkpoint of another model leaves
                    them empty): for layer n >= 2 and m = n - 1, cross-layer attention's output (ICLR Eqn. 2:
                    one softmax over Q_n [K_n; K_m]^T / √d_h, each half causal, values [V_n; V_m]) against ICLR
                    Eqn. 4's approximation ½ A_n (V_n + V_m), and against the identity mapping A_n V_n + V_m
                    (ICLR Eqn. 6 with one earlier layer): the cosine similarity per token of the outputs before
                    W_O, heads concatenated, averaged over the tokens; empty (-) in layer 1
ICLR Fig. 1 Left compares the entropy of a model at initialisation with the trained one's: train.py
--max_iters=0 writes the step-0 checkpoint (it evaluates, saves, and stops), and analyze.py reads it as any:
    python train.py config/small_ablation.py --variant=vanilla --max_iters=0 --out_dir=out/vanilla_step0
    python lab/analyze.py out/vanilla_step0 out/ablation_vanilla

Writes <out>/metrics.json (every run, and each group's mean and std; an empty cell is null), <out>/metrics.csv
(per group and layer) and, if matplotlib is installed, <out>/<metric>.png: one line per group against depth,
± std shaded, and value_spectrum_1.png, value_spectrum_1_rel.png and importance_by_position.png.
"""
import contextlib
import csv
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from configurator import configure
from ablations import AblationGPT, ablations, attention_probs, cross_attention
from vrl import cli, hardware, run_folder
from vrl.metrics import mean_domain_losses as mean_of_domains
from vrl.data import load_meta, open_split, prepare_command
from vrl.tokenizer import load_tokenizer

# -----------------------------------------------------------------------------
ckpt = 'ckpt.pt'  # the file read from each out_dir: 'ckpt.pt' (latest) or 'best.pt' (best validation loss)
windows = 'doc_start'  # 'doc_start': documents' starts, led by the separator;
#   'mid_text': evenly spaced offsets
num_seqs = 8  # validation windows to average over
seq_len = 256  # tokens per window (at most the smallest block_size among the checkpoints)
out = 'analysis'  # folder for metrics.json, metrics.csv and the plots
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name);
#   or 'cpu', 'cuda', 'cuda:1', 'mps' (always float32)
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# -----------------------------------------------------------------------------
# (the settings are applied at the bottom, so that
# `import analyze` gives the metric functions and runs nothing)

MAX_SEQS = 10_000  # windows at most: each is a forward pass per run, and all are held at once

CONCENTRATION = {  # name: column title
    'entropy': 'entropy', 'entropy_rel': 'entropy/ln T', 'value_norm': 'value norm',
    'first_value_norm': 'first value', 'hidden_norm': 'hidden norm', 'hidden_cos': 'hidden cos',
    'key_cos': 'key cos',
}
POST_ANALYSES = {'value_cos_v1': "cos V1,V'n", 'hidden_cos_h1': 'cos H1,Hn', 'skip_attn': 'Δloss -attn',
                 'skip_mlp': 'Δloss -MLP'}  # Sec. 4.5
TOKEN_IMPORTANCE = {  # ICLR A.2: the k-th largest token importance, k = 1, 2, 3, 10, and the top 1% rank
    'importance_top1': 'top-1', 'importance_top2': 'top-2', 'importance_top3': 'top-3',
    'importance_top10': 'top-10', 'importance_top1pct': 'top-1%'}
VALUES_AND_CROSS = {'value_eig_max': 'eig max', 'value_eig_max_rel': 'eig max/trace',  # ICLR Fig. 12
                    'value_erank': 'eff. rank',
                    'cross_cos_approx': 'cos ½A(Vn+Vm)', 'cross_cos_identity': 'cos AVn+Vm'}  # ICLR Fig. 4
SPECTRA = {'value_spectrum_1': 'eigenvalues', 'value_spectrum_1_rel': 'eigenvalues over their trace'}
METRICS = {**CONCENTRATION, **POST_ANALYSES, **TOKEN_IMPORTANCE, **VALUES_AND_CROSS}
TOP_K = {'importance_top1': 1, 'importance_top2': 2, 'importance_top3': 3, 'importance_top10': 10,
         'importance_top1pct': None}  # None: ceil(T / 100)
POSITIONS = 64  # importance_by_position's first positions
# settings in which runs of one group may differ
RUN_KEYS = ('seed', 'out_dir', 'wandb_run_name', 'init_from')
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def token_importance(attn):
    """Token importance p (B, T) of attention probabilities attn (B, H, T, T): the column sums of the
    head-averaged attention matrix, normalised to a distribution over the tokens."""
    importance = attn.mean(dim=1).sum(dim=1)  # (B, T): attention each token receives, summed over queries
    return importance / importance.sum(dim=-1, keepdim=True)


def importance_entropy(attn):
    """Token-importance entropy of attention probabilities attn (B, H, T, T), one value per batch row: the
    entropy of token_importance's distribution."""
    p = token_importance(attn)
    return -torch.special.xlogy(p, p).sum(dim=-1)  # xlogy: 0 ln 0 = 0 for tokens nobody attends to


def top_k_importance(p, k):
    """The k-th largest token importance of each row of p (B, T): (B,), NaN where k > T."""
    if k > p.size(-1):
        return torch.full(p.shape[:-1], math.nan, dtype=p.dtype, device=p.device)
    return p.topk(k, dim=-1).values[..., -1]


def top_1pct_rank(T):
    """ICLR A.2's top 1% rank in a sequence of T tokens: k = ceil(T / 100), at least 1."""
    return max(1, math.ceil(T / 100))


def heads_side_by_side(t):
    """(B, heads, T, D) -> (B, T, heads * D): each token's vector with every head concatenated."""
    B, H, T, D = t.shape
    return t.transpose(1, 2).reshape(B, T, H * D)


def second_moment_eigenvalues(values):
    """Eigenvalues of the uncentred second moment (1/T) Σ_i v_i v_i^T of each sequence's value vectors,
    values (B, T, D), largest first: (B, D) in float64. They are the squared singular values of V / √T,
    which the SVD gives without forming the D x D matrix (D - T of them are 0 when T < D)."""
    B, T, D = values.shape
    singular = torch.linalg.svdvals(values.double() / math.sqrt(T))  # (B, min(T, D)), descending
    return F.pad(singular.square(), (0, D - singular.size(-1)))


def share_of_trace(eigenvalues):
    """Eigenvalues (..., D) over their sum, the trace, which is the values' mean squared norm: the share of
    their energy along each direction, the same whatever their norm."""
    return eigenvalues / eigenvalues.sum(dim=-1, keepdim=True)


def effective_rank(shares):
    """exp of the entropy of eigenvalue shares (..., D) (share_of_trace): 1 when one direction holds all
    the energy, D when every direction holds as much."""
    return torch.exp(-torch.special.xlogy(shares, shares).sum(dim=-1))  # xlogy: 0 ln 0 = 0


def cross_layer_similarity(layer, previous):
    """ICLR Fig. 4 for layer n's Heads and layer m = n - 1's (ablations.py): (cos with ½ A_n (V_n + V_m),
    cos with A_n V_n + V_m), each (B,), the mean over tokens of the cosine similarity between cross-layer
    attention's output, softmax(Q_n [K_n; K_m]^T / √d_h) [V_n; V_m] (ICLR Eqn. 2, each half causal: ablations.
    cross_attention), and each of them, every output before W_O with its heads concatenated. A Transformer's
    layers attend over their own values, so Heads.v is V_n."""
    q, k, v, k_m, v_m = layer.q, layer.k, layer.v, previous.k, previous.v
    cross = cross_attention(q, k, v, k_m, v_m, 0.0)
    repeat = q.size(1) // k.size(1)  # GQA: every query head reads its KV head's values
    v, v_m = v.repeat_interleave(repeat, dim=1), v_m.repeat_interleave(repeat, dim=1)
    probs = attention_probs(q, k)  # A_n = softmax(Q_n K_n^T / √d_h), causal
    approximation, identity = 0.5 * probs @ (v + v_m), probs @ v + v_m  # ICLR Eqns. 4 and 6
    cross = heads_side_by_side(cross)
    return tuple(F.cosine_similarity(cross, heads_side_by_side(other), dim=-1).mean(dim=-1)
                 for other in (approximation, identity))


def token_norms(states):
    """L2 norm of each token's vector: (..., T, D) -> (..., T)."""
    return states.norm(dim=-1)


def mean_cosine_similarity(states):
    """Mean cosine similarity between different tokens' vectors: (..., T, D) -> (...). The diagonal (each
    token with itself, always 1) is left out."""
    unit = F.normalize(states, dim=-1)
    similarity = unit @ unit.transpose(-2, -1)  # (..., T, T)
    T = similarity.size(-1)
    return (similarity.sum(dim=(-2, -1)) - similarity.diagonal(dim1=-2, dim2=-1).sum(dim=-1)) / (T * (T - 1))


def layer_metrics(stats):
    """{metric: (n_layer, B) tensor} from the stats a forward pass filled (ablations.AblationGPT.forward)."""
    rows = []
    v1, h1 = stats['values'][0], stats['hidden'][0]
    for attn, keys, values, hidden in zip(stats['attn'], stats['keys'], stats['values'], stats['hidden']):
        value_norms = token_norms(values)  # (B, n_kv_head, T)
        entropy = importance_entropy(attn)
        rows.append({
            'entropy': entropy,
            'entropy_rel': entropy / math.log(attn.size(-1)),
            'value_norm': value_norms.mean(dim=(1, 2)),
            'first_value_norm': value_norms[:, :, 0].mean(dim=1),
            'hidden_norm': token_norms(hidden).mean(dim=1),
            'hidden_cos': mean_cosine_similarity(hidden),
            'key_cos': mean_cosine_similarity(keys).mean(dim=1),
            'value_cos_v1': F.cosine_similarity(values, v1, dim=-1).mean(dim=(1, 2)),
            'hidden_cos_h1': F.cosine_similarity(hidden, h1, dim=-1).mean(dim=1),
        })
    return {name: torch.stack([row[name] for row in rows]) for name in rows[0]}


def is_transformer(config):
    """Whether the model is the plain Transformer (vanilla, with GQA or not), which ICLR Fig. 4 analyses."""
    return not config.value_residual and not ablations(config)


def paper_metrics(stats, heads, transformer):
    """({metric: (n_layer, B)} of TOKEN_IMPORTANCE and VALUES_AND_CROSS, {SPECTRA's: (B, D),
    'importance_by_position': (n_layer, B, min(T, POSITIONS))}) from the stats a forward pass filled and its
    layers' Heads (recorded_heads); transformer: compute ICLR Fig. 4's cosines (NaN otherwise, and in
    layer 1)."""
    rows, positions, spectra = [], [], []
    for n, (attn, layer) in enumerate(zip(stats['attn'], heads), start=1):
        p = token_importance(attn)
        T = p.size(-1)
        own = layer.v if layer.fresh is None else layer.fresh  # V_n; with no W_V, what it attends over
        spectrum = second_moment_eigenvalues(heads_side_by_side(own))
        shares = share_of_trace(spectrum)
        spectra.append((spectrum, shares))
        nan = torch.full(p.shape[:-1], math.nan, dtype=torch.float64)
        approx, identity = (cross_layer_similarity(layer, heads[n - 2]) if transformer and n > 1
                            else (nan, nan))
        rows.append({name: top_k_importance(p, k or top_1pct_rank(T)) for name, k in TOP_K.items()}
                    | {'value_eig_max': spectrum[:, 0], 'value_eig_max_rel': shares[:, 0],
                       'value_erank': effective_rank(shares), 'cross_cos_approx': approx,
                       'cross_cos_identity': identity})
        positions.append(p[:, :POSITIONS])
    return ({name: torch.stack([row[name].double() for row in rows]) for name in rows[0]},
            {**dict(zip(SPECTRA, spectra[0])), 'importance_by_position': torch.stack(positions)})


@contextlib.contextmanager
def recorded_heads(model):
    """Within the block, every forward of model appends each layer's Heads (ablations.py: its q, k, v,
    attention, output and own values V_n) to the list it yields, in layer order."""
    heads = []
    handles = [block.attn.register_forward_hook(lambda module, args, output: heads.append(output[1]))
               for block in model.blocks]
    try:
        yield heads
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def zeroed(module):
    """Within the block, module's output is replaced by zeros."""
    handle = module.register_forward_hook(lambda module, args, output: torch.zeros_like(output))
    try:
        yield
    finally:
        handle.remove()


def sublayer_losses(model, inputs, targets):
    """(loss, {'skip_attn': (n_layer,), 'skip_mlp': (n_layer,)}): the model's loss, and how much it rises when
    one layer's attention or MLP sublayer outputs zeros. The attention sublayer's output is its W_O projection
    (c_proj, where both of model.py's attention paths end), so what the layer hands on to later ones (V1, for
    layer 1) is untouched."""
    loss = model(inputs, targets).item()
    skips = {}
    for kind in ('attn', 'mlp'):
        increases = []
        for block in model.blocks:
            with zeroed(block.attn.c_proj if kind == 'attn' else block.mlp):
                increases.append(model(inputs, targets).item() - loss)
        skips[f'skip_{kind}'] = torch.tensor(increases)
    return loss, skips

# -----------------------------------------------------------------------------
# runs and their groups


def checkpoint_path(arg):
    """The checkpoint a run argument names: an out_dir's ckpt, or a .pt file."""
    path = os.path.join(arg, ckpt) if os.path.isdir(arg) else arg
    if os.path.isfile(path):
        return path
    kind = cli.file_kind(path)  # a folder named ckpt.pt, a pipe, /dev/null: there, but no checkpoint
    problem = (f"{path} is {kind}, not a checkpoint file" if kind else
               f"{arg} has no {ckpt}" if os.path.isdir(arg) else f"{arg} not found")
    raise SystemExit(f"analyze.py: {problem}; name training runs' folders (their out_dir) or .pt files")


def load_models(run_args):
    """{path: (model, checkpoint)}, checked to share one vocabulary."""
    models = {}
    for arg in run_args:
        path = checkpoint_path(arg)
        model, checkpoint = run_folder.load_checkpoint(path, device, model_type=AblationGPT)  # its stats
        models[path] = model.eval(), checkpoint
    (first_path, (_, first)), *others = models.items()
    for path, (_, checkpoint) in others:
        if vocabulary(checkpoint['data_meta']) != vocabulary(first['data_meta']):
            raise SystemExit(f"analyze.py: {path} has another vocabulary than {first_path}; "
                             "compare runs trained on the same dataset")
    return models


def mean_domain_losses(checkpoints):
    """vrl.metrics.mean_domain_losses of the checkpoints' last per-domain validation (train.py's)."""
    return mean_of_domains([c.get('last_eval', {}).get('val_loss_domains') for c in checkpoints])


def vocabulary(meta):
    return meta['tokenizer'], meta['vocab_size'], meta.get('chars')


def group_runs(models):
    """{label: [paths]}: runs whose model and settings agree apart from RUN_KEYS form a group, named by its
    variant, plus the settings that tell it apart from other groups of the same variant."""
    setups = {}  # path -> what must agree within a group
    for path, (model, checkpoint) in models.items():
        settings = {k: v for k, v in checkpoint.get('config', {}).items() if k not in RUN_KEYS}
        setups[path] = {**settings, **checkpoint['model_args'], 'iter_num': checkpoint.get('iter_num')}
    # a setting that a later train.py added is missing from older checkpoints: it tells no run apart
    shared = set.intersection(*(set(setup) for setup in setups.values()))
    setups = {path: {k: v for k, v in setup.items() if k in shared} for path, setup in setups.items()}
    groups = {}  # setup as JSON -> paths
    for path, setup in setups.items():
        groups.setdefault(json.dumps(setup, sort_keys=True, default=str), []).append(path)
    labels = {}
    for paths in groups.values():
        setup = setups[paths[0]]
        rivals = [setups[other[0]] for other in groups.values()
                  if other is not paths and setups[other[0]]['variant'] == setup['variant']]
        differing = sorted(k for k in setup if any(rival.get(k) != setup[k] for rival in rivals))
        detail = ", ".join(f"{k}={setup[k]}" for k in differing)
        labels[setup['variant'] + (f" ({detail})" if detail else "")] = paths
    return labels

# -----------------------------------------------------------------------------
# windows


def doc_start_windows(data_dir, meta, tokens, num_seqs, seq_len):
    """(starts, windows): up to num_seqs documents' starts, spread evenly, each led by the separator."""
    if 'val_doc_starts' not in meta:
        raise SystemExit(f"analyze.py: {data_dir}/meta.json has no val_doc_starts (an older prepare.py); run "
                         f"`{prepare_command(data_dir)}` again, or use --windows=mid_text")
    separator = ([meta['eot_token']] if 'eot_token' in meta
                 else load_tokenizer(meta).encode(meta['separator']))
    room = seq_len - len(separator)  # tokens of the document itself
    starts = [s for s in meta['val_doc_starts'] if s + room <= len(tokens)]
    if not starts:
        raise SystemExit(f"analyze.py: no validation document in {data_dir} starts {room} tokens before the "
                         f"end of the split; use a smaller --seq_len or --windows=mid_text")
    picked = sorted({starts[i] for i in np.linspace(0, len(starts) - 1, min(num_seqs, len(starts)))
                     .round().astype(int)})
    if len(picked) < num_seqs:
        print(f"note: {data_dir} has {len(picked)} validation document starts to use, "
              f"fewer than num_seqs={num_seqs}")
    rows = [np.concatenate([separator, tokens[s:s + room]]) for s in picked]
    return picked, torch.tensor(np.stack(rows).astype(np.int64))


def mid_text_windows(tokens, num_seqs, seq_len):
    """(offsets, windows): num_seqs windows at evenly spaced offsets."""
    offsets = np.linspace(0, len(tokens) - seq_len, num_seqs).round().astype(int).tolist()
    return offsets, torch.tensor(np.stack([tokens[o:o + seq_len] for o in offsets]).astype(np.int64))


def validation_windows(data_dir, checkpoint_meta, kind, num_seqs, seq_len):
    meta = load_meta(data_dir)
    if vocabulary(meta) != vocabulary(checkpoint_meta):
        raise SystemExit(f"analyze.py: {data_dir} is not tokenized as the runs' training data was; "
                         f"prepare it again with the settings they were trained on")
    tokens = np.concatenate(open_split(data_dir, 'val'))
    if len(tokens) < seq_len:
        raise SystemExit(f"analyze.py: {data_dir} has {len(tokens):,} validation tokens, "
                         f"fewer than seq_len={seq_len}; "
                         "use a smaller --seq_len")
    if kind == 'doc_start':
        return doc_start_windows(data_dir, meta, tokens, num_seqs, seq_len)
    return mid_text_windows(tokens, num_seqs, seq_len)

# -----------------------------------------------------------------------------
# measuring and reporting


@torch.no_grad()
def analyze(model, windows, desc):
    """{metric: per-layer mean over the windows, SPECTRA's and 'importance_by_position': their means over
    the windows, 'loss': the model's loss on them}."""
    per_window, profiles, losses = [], [], []
    transformer = is_transformer(model.config)
    # one window at a time: the attention probabilities alone
    # are n_layer * n_head * seq_len^2 floats per window
    for window in tqdm(windows, desc=desc, leave=False):
        window, stats = window[None].to(device), {}
        with recorded_heads(model) as heads:
            model(window, stats=stats)
        paper, profile = paper_metrics(stats, heads, transformer)
        loss, skips = sublayer_losses(model, window[:, :-1], window[:, 1:])
        per_window.append({**layer_metrics(stats), **{name: skip[:, None] for name, skip in skips.items()},
                           **paper})
        profiles.append(profile)
        losses.append(loss)
    metrics = {name: torch.cat([m[name] for m in per_window], dim=1).mean(dim=1).tolist() for name in METRICS}
    for name in SPECTRA:
        metrics[name] = torch.cat([p[name] for p in profiles]).mean(dim=0).tolist()
    metrics['importance_by_position'] = torch.cat([p['importance_by_position'] for p in profiles],
                                                  dim=1).mean(dim=1).tolist()
    return {**metrics, 'loss': float(np.mean(losses))}  # windows of equal length: the mean over their tokens


def summarize(per_run):
    """(mean, std) per metric and layer, and of the loss, over a group's runs; std None for a single run."""
    names = per_run[0]
    mean = {name: np.mean([run[name] for run in per_run], axis=0).tolist() for name in names}
    if len(per_run) == 1:
        return mean, None
    with np.errstate(invalid='ignore'):  # an empty cell (NaN) stays empty
        return mean, {name: np.std([run[name] for run in per_run], axis=0, ddof=1).tolist() for name in names}


def no_nan(value):
    """value with every NaN (an empty cell: layer 1's cross-layer cosines, a top-k past T) as None, so
    that metrics.json is strict JSON."""
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [no_nan(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def cell(mean, std):
    if math.isnan(mean):
        return '-'
    return f"{mean:.4f}" + (f"±{std:.4f}" if std is not None else "")


def print_table(label, group):
    mean, std = group['mean'], group['std']
    print(f"\n{label}: {group['n_layer']} layers, iter {group['iter_num']}, {len(group['runs'])} run(s): "
          f"{', '.join(group['runs'])}" + (" (mean ± std over runs)" if std else ""))
    width = 17 if std else 13
    for columns in (CONCENTRATION, POST_ANALYSES, TOKEN_IMPORTANCE, VALUES_AND_CROSS):
        if columns is POST_ANALYSES:
            print(f"Sec. 4.5, our reading: loss {mean['loss']:.4f}" + (f"±{std['loss']:.4f}" if std else "")
                  + "; Δloss: its increase with the layer's attention or MLP output zeroed")
        if columns is TOKEN_IMPORTANCE:
            print("ICLR A.2: the k-th largest token importance in a sequence (top-1%: k = ceil(T / 100))")
        if columns is VALUES_AND_CROSS:
            print("ICLR Fig. 12: the largest eigenvalue of (1/T) Σ v v^T of the layer's own values, its share "
                  "of the trace and the effective rank; ICLR Fig. 4 (a Transformer): cross-layer attention's "
                  "output with m = n - 1 against ½ A_n (V_n + V_m) and A_n V_n + V_m, cosine per token")
        print(f"{'layer':>5} " + " ".join(f"{title:>{width}}" for title in columns.values()))
        for layer in range(group['n_layer']):
            cells = [cell(mean[name][layer], std[name][layer] if std else None) for name in columns]
            print(f"{layer + 1:>5} " + " ".join(f"{text:>{width}}" for text in cells))
    for name, what in SPECTRA.items():
        spectrum = mean[name]
        print(f"ICLR Fig. 12, layer 1's {len(spectrum)} {what}, largest first: "
              + ", ".join(f"{e:.4g}" for e in spectrum[:8]) + (", ..." if len(spectrum) > 8 else "")
              + " (all in metrics.json)")
    first = [row[0] for row in mean['importance_by_position']]
    print("ICLR A.2, the first token's importance by layer: " + ", ".join(f"{p:.4f}" for p in first)
          + f" (the first {len(mean['importance_by_position'][0])} positions in metrics.json)")


def write_files(groups, windows_info):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'metrics.json'), 'w') as f:
        json.dump(no_nan({**windows_info, 'groups': groups}), f, indent=1)
    with open(os.path.join(out, 'metrics.csv'), 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['group', 'runs', 'layer',
                         *(column for name in METRICS for column in (name, f'{name}_std'))])
        for label, group in groups.items():
            for layer in range(group['n_layer']):
                cells = [(group['mean'][name][layer], group['std'][name][layer] if group['std'] else '')
                         for name in METRICS]
                writer.writerow([label, len(group['runs']), layer + 1,
                                 *('' if isinstance(c, float) and math.isnan(c) else c
                                   for pair in cells for c in pair)])
    print(f"\nwrote {out}/metrics.json and {out}/metrics.csv")


def plot(groups, subtitle):
    try:
        import matplotlib
        matplotlib.use('Agg')  # files only, no display needed
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("plots skipped: matplotlib is not installed (`pip install matplotlib` for one PNG per metric)")
        return
    for name in METRICS:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, group in groups.items():
            layers = np.arange(1, group['n_layer'] + 1)
            mean = np.array(group['mean'][name])
            runs = len(group['runs'])
            line, = ax.plot(layers, mean, marker='o', label=label + (f" [{runs} runs]" if runs > 1 else ""))
            if group['std']:
                std = np.array(group['std'][name])
                ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.set(xlabel='layer', ylabel=name, title=f"{name} by depth ({subtitle})")
        ax.legend()
        fig.savefig(os.path.join(out, f'{name}.png'), dpi=120, bbox_inches='tight')
        plt.close(fig)
    # ICLR Fig. 12: layer 1's spectrum, raw and over its trace, one line per group
    for name, what in SPECTRA.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, group in groups.items():
            spectrum = np.array(group['mean'][name])
            ax.plot(np.arange(1, len(spectrum) + 1), spectrum, label=label)
        largest = max(group['mean'][name][0] for group in groups.values())
        ax.set(xlabel='rank', ylabel=what, yscale='log', ylim=(largest * 1e-8, largest * 2),  # 0s: below
               title=f"layer 1's value second moment, {what} ({subtitle})")
        ax.legend()
        fig.savefig(os.path.join(out, f'{name}.png'), dpi=120, bbox_inches='tight')
        plt.close(fig)
    # ICLR A.2: importance by position, a panel per group, a line per layer
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (label, group) in zip(axes[0], groups.items()):
        for layer, row in enumerate(group['mean']['importance_by_position'], start=1):
            ax.plot(np.arange(len(row)), row, label=f"layer {layer}")
        ax.set(xlabel='position', ylabel='token importance', yscale='log', title=label)
        ax.legend(fontsize='small')
    fig.suptitle(f"token importance by position ({subtitle})")
    fig.savefig(os.path.join(out, 'importance_by_position.png'), dpi=120, bbox_inches='tight')
    plt.close(fig)
    print(f"wrote {len(METRICS) + len(SPECTRA) + 1} plots to {out}/")


def main(run_args):
    if not run_args:
        raise SystemExit("analyze.py: no runs given; name training runs' folders or .pt files, e.g. "
                         "`python lab/analyze.py out/ablation_vanilla out/ablation_resformer_identity`")
    if windows not in ('doc_start', 'mid_text'):
        raise SystemExit(f"analyze.py: windows={windows!r}; use 'doc_start' or 'mid_text'")
    if not 1 <= num_seqs <= MAX_SEQS or seq_len < 2:
        raise SystemExit(f"analyze.py: num_seqs={num_seqs}, seq_len={seq_len}; use 1 to {MAX_SEQS:,} "
                         f"sequences of 2 tokens or more")
    # out, or the part of its path that exists: it must be a folder, checked now
    existing = os.path.abspath(out)
    while not os.path.exists(existing):  # rather than after all the computing
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise SystemExit(f"analyze.py: out={out!r} cannot be a folder: {existing} is a file; "
                         f"choose another --out")
    try:  # writable: a file made and gone where out's files, or out itself, will be made
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise SystemExit(f"analyze.py: out={out!r} cannot be written: {existing} refuses a new file "
                         f"({e.strerror}); choose another --out") from None
    # all checkpoints first: they must share a vocabulary, and the smallest block_size caps the window length
    models = load_models(run_args)
    length = min([seq_len] + [model.config.block_size for model, _ in models.values()])
    if length < seq_len:
        print(f"seq_len {seq_len} -> {length}, the smallest block_size among the checkpoints")
    first = next(iter(models.values()))[1]
    # train.py's data folder: data/<dataset>, relative to where it ran (older checkpoints name it data_dir)
    data_dir = first['config'].get('data_dir') or os.path.join('data', first['config']['dataset'])
    if not os.path.isabs(data_dir) and not os.path.exists(data_dir):
        # relative to where train.py ran: usually the repository's root
        data_dir = os.path.join(HERE, data_dir)
    starts, tokens = validation_windows(data_dir, first['data_meta'], windows, num_seqs, length)
    print(f"{len(starts)} {windows} windows of {length} tokens from {data_dir} (val), at offsets {starts}")

    per_run = {path: analyze(model, tokens, desc=path) for path, (model, _) in models.items()}
    groups = {}
    for label, paths in group_runs(models).items():
        model, checkpoint = models[paths[0]]
        mean, std = summarize([per_run[path] for path in paths])
        groups[label] = {'variant': model.config.variant, 'n_layer': model.config.n_layer,
                         'iter_num': checkpoint.get('iter_num'), 'runs': paths, 'mean': mean, 'std': std,
                         'per_run': {path: per_run[path] for path in paths},
                         'val_loss_domains': mean_domain_losses([models[path][1] for path in paths])}
        print_table(label, groups[label])
        if groups[label]['val_loss_domains']:
            print("val loss by domain at the checkpoint (train.py's last evaluation, mean over runs): "
                  + ', '.join(f"{d} {v:.4f}" for d, v in groups[label]['val_loss_domains'].items()))
    print(f"(entropy is at most ln {length} = {math.log(length):.4f})")
    try:  # a disk that fills, or a quota, now
        write_files(groups, {'data_dir': data_dir, 'split': 'val', 'windows': windows, 'seq_len': length,
                             'offsets': starts})
        plot(groups, f"{len(starts)} x {length} val tokens, {windows}")
    except OSError as e:
        raise SystemExit(f"analyze.py: could not write to {out} ({e.strerror}); the tables above are all "
                         f"that was kept: free space, or choose another --out") from None


if __name__ == '__main__':
    # arguments that are not settings (-...) or config files name the runs
    run_args = [a for a in sys.argv[1:] if not a.startswith('-') and not a.endswith('.py')]
    cli.keep_going_without_stdout()  # `--help | head` ends quietly; a closed stdout stops no analysis
    globals().update(configure({k: globals()[k] for k in config_keys},
                               [a for a in sys.argv[1:] if a not in run_args], script=__file__))
    device = hardware.pick_device(device)
    main(run_args)
