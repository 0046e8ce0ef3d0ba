"""
Where does attention go? The paper's attention-concentration analysis (SPEC.md, "Analysis the paper does")
for one or more checkpoints, side by side on the same validation sequences.

    python analyze.py out_vanilla out_resformer                    # out_dirs (their ckpt.pt) or .pt files
    python analyze.py out_vanilla out_resformer --ckpt=best.pt --num_seqs=16 --seq_len=512 --out=analysis

Arguments that are not --key=value settings or config files (*.py) name the checkpoints. The sequences are
num_seqs windows of seq_len tokens at evenly spaced offsets in the validation split of the first checkpoint's
data_dir, so every checkpoint sees the same tokens. Per layer (1-based, as in the paper), averaged over them:

  entropy           token-importance entropy: average the attention matrix A over heads, s_j = Σ_i A_ij (the
                    attention token j receives), p = s / Σ s, E = -Σ p_j ln p_j. At most ln T; lower means
                    attention concentrated on few tokens (attention sinks).
  entropy_rel       E / ln T, comparable across sequence lengths
  value_norm        mean L2 norm of the value vectors V'_n the layer attends over (tokens and KV heads)
  first_value_norm  the same for the first token, the usual attention sink ("value-state drain": small)
  hidden_norm       mean L2 norm of the block outputs
  hidden_cos        mean cosine similarity between the block outputs of different tokens
  key_cos           the same for keys, per KV head, averaged over heads

Writes <out>/metrics.json, <out>/metrics.csv and, if matplotlib is installed, <out>/<metric>.png.
"""
import csv
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from configurator import configure
from model import load_checkpoint, pick_device
from prepare import open_split

# -----------------------------------------------------------------------------
ckpt = 'ckpt.pt'  # the file read from each out_dir: 'ckpt.pt' (latest) or 'best.pt' (best validation loss)
num_seqs = 8  # validation windows to average over
seq_len = 256  # tokens per window (at most the smallest block_size among the checkpoints)
out = 'analysis'  # folder for metrics.json, metrics.csv and the plots
device = 'auto'  # 'auto' picks cuda, then mps, then cpu; or 'cpu', 'cuda', 'cuda:1', 'mps' (always float32)
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# -----------------------------------------------------------------------------
# (the settings are applied at the bottom, so that `import analyze` gives the metric functions and runs nothing)

METRICS = {  # name: column title
    'entropy': 'entropy', 'entropy_rel': 'entropy/ln T', 'value_norm': 'value norm', 'first_value_norm': 'first value',
    'hidden_norm': 'hidden norm', 'hidden_cos': 'hidden cos', 'key_cos': 'key cos',
}


def importance_entropy(attn):
    """Token-importance entropy of attention probabilities attn (B, H, T, T), one value per batch row: the
    entropy of the column sums of the head-averaged attention matrix, normalised to a distribution."""
    importance = attn.mean(dim=1).sum(dim=1)  # (B, T): attention each token receives, summed over queries
    p = importance / importance.sum(dim=-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(dim=-1)  # xlogy: 0 ln 0 = 0 for tokens nobody attends to


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
    """{metric: (n_layer, B) tensor} from the stats a forward pass filled (see GPT.forward)."""
    rows = []
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
        })
    return {name: torch.stack([row[name] for row in rows]) for name in METRICS}


def load_models(checkpoint_args):
    """{path: (model, checkpoint)}, checked to share one vocabulary."""
    models = {}
    for arg in checkpoint_args:
        path = os.path.join(arg, ckpt) if os.path.isdir(arg) else arg
        model, checkpoint = load_checkpoint(path, device)
        models[path] = model.eval(), checkpoint
    (first_path, (_, first)), *others = models.items()
    for path, (_, checkpoint) in others:
        if vocabulary(checkpoint) != vocabulary(first):
            raise SystemExit(f"analyze.py: {path} has another vocabulary than {first_path}; "
                             "compare checkpoints trained on the same dataset")
    return models


def vocabulary(checkpoint):
    meta = checkpoint['data_meta']
    return meta['tokenizer'], meta['vocab_size'], meta.get('chars')


def validation_windows(data_dir, num_seqs, seq_len):
    """(offsets, (num_seqs, seq_len) tokens): windows at evenly spaced offsets in the first validation shard."""
    tokens = open_split(data_dir, 'val')[0]  # one shard is plenty for a few windows
    if len(tokens) < seq_len:
        raise SystemExit(f"analyze.py: {data_dir} has {len(tokens):,} validation tokens, fewer than seq_len={seq_len}; "
                         "use a smaller --seq_len")
    offsets = np.linspace(0, len(tokens) - seq_len, num_seqs).round().astype(int).tolist()
    return offsets, torch.tensor(np.stack([tokens[o:o + seq_len] for o in offsets]).astype(np.int64))


@torch.no_grad()
def analyze(model, windows, desc):
    """{metric: per-layer mean over the windows}."""
    per_window = []
    # one window at a time: the attention probabilities alone are n_layer * n_head * seq_len^2 floats per window
    for window in tqdm(windows, desc=desc, leave=False):
        stats = {}
        model(window[None].to(device), stats=stats)
        per_window.append(layer_metrics(stats))
    return {name: torch.cat([m[name] for m in per_window], dim=1).mean(dim=1).tolist() for name in METRICS}


def print_table(path, model, checkpoint, metrics):
    print(f"\n{path}: {model.config.variant}, {model.config.n_layer} layers, iter {checkpoint.get('iter_num', '?')}")
    print(f"{'layer':>5} " + " ".join(f"{title:>13}" for title in METRICS.values()))
    for layer in range(model.config.n_layer):
        print(f"{layer + 1:>5} " + " ".join(f"{metrics[name][layer]:>13.4f}" for name in METRICS))


def write_files(results, models, sequences):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'metrics.json'), 'w') as f:
        checkpoints = {path: {'variant': models[path][0].config.variant, 'iter_num': models[path][1].get('iter_num'),
                              **metrics} for path, metrics in results.items()}
        json.dump({**sequences, 'checkpoints': checkpoints}, f, indent=1)
    with open(os.path.join(out, 'metrics.csv'), 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['checkpoint', 'layer', *METRICS])
        for path, metrics in results.items():
            for layer in range(len(metrics['entropy'])):
                writer.writerow([path, layer + 1, *(metrics[name][layer] for name in METRICS)])
    print(f"\nwrote {out}/metrics.json and {out}/metrics.csv")


def plot(results, subtitle):
    try:
        import matplotlib
        matplotlib.use('Agg')  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (`pip install matplotlib` for one PNG per metric)")
        return
    for name in METRICS:
        fig, ax = plt.subplots(figsize=(6, 4))
        for path, metrics in results.items():
            ax.plot(range(1, len(metrics[name]) + 1), metrics[name], marker='o', label=path)
        ax.set(xlabel='layer', ylabel=name, title=f"{name} by depth ({subtitle})")
        ax.legend()
        fig.savefig(os.path.join(out, f'{name}.png'), dpi=120, bbox_inches='tight')
        plt.close(fig)
    print(f"wrote {len(METRICS)} plots to {out}/")


def main(checkpoint_args):
    if not checkpoint_args:
        raise SystemExit("analyze.py: no checkpoints given; name out_dirs or .pt files, e.g. "
                         "`python analyze.py out_vanilla out_resformer`")
    if num_seqs < 1 or seq_len < 2:
        raise SystemExit(f"analyze.py: num_seqs={num_seqs}, seq_len={seq_len}; use at least 1 sequence of 2 tokens")
    # all checkpoints first: they must share a vocabulary, and the smallest block_size caps the window length
    models = load_models(checkpoint_args)
    length = min([seq_len] + [model.config.block_size for model, _ in models.values()])
    if length < seq_len:
        print(f"seq_len {seq_len} -> {length}, the smallest block_size among the checkpoints")
    data_dir = next(iter(models.values()))[1]['config']['data_dir']
    offsets, windows = validation_windows(data_dir, num_seqs, length)
    print(f"{num_seqs} windows of {length} tokens from {data_dir} (val), at offsets {offsets}")

    results = {}
    for path, (model, checkpoint) in models.items():
        results[path] = analyze(model, windows, desc=path)
        print_table(path, model, checkpoint, results[path])
    print(f"(entropy is at most ln {length} = {math.log(length):.4f})")
    write_files(results, models, {'data_dir': data_dir, 'split': 'val', 'seq_len': length, 'offsets': offsets})
    plot(results, f"{num_seqs} x {length} val tokens")


if __name__ == '__main__':
    # positional arguments that are not config files name the checkpoints; the rest are settings
    checkpoint_args = [a for a in sys.argv[1:] if not a.startswith('--') and not a.endswith('.py')]
    globals().update(configure({k: globals()[k] for k in config_keys},
                               [a for a in sys.argv[1:] if a not in checkpoint_args]))
    device = pick_device(device)
    main(checkpoint_args)
