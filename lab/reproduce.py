"""
Reproduce the paper's experiments at a small scale: named suites of train.py runs (settings x variants x
seeds), run one after another (or one per GPU when several are visible), skipped once finished and resumed
when interrupted, then summarised into results/<suite>/README.md (tables) and PNG plots (when matplotlib is
installed).

    python lab/reproduce.py variants                  # run what is missing, then write results/variants/
    python lab/reproduce.py all                       # every suite, in the order of SUITES below
    python lab/reproduce.py scaling --report_only     # tables from the runs finished so far
    python lab/reproduce.py --check_verdicts          # every claim in the docs against the runs
    python lab/reproduce.py lr --dry_run              # list the runs and whether each is done
    python lab/reproduce.py kv --scale=gpu --seeds=5  # a larger shape, for a GPU
    python lab/reproduce.py value_bank --scale=bpe    # GPT-2 BPE at a CPU shape: token tables cost parameters
    python lab/reproduce.py all --retrain             # also retrain runs made by code that trains differently
    python lab/reproduce.py variants --check=cpu_variant=vanilla_seed=1337   # retrain one run, compare its loss

Each run trains into <runs_dir>/<name>/ (checkpoints; not committed). When it finishes, its log.jsonl is
condensed into results/runs/<name>.json, which marks the run as done and is all the tables need. Runs are
named by their settings, so suites that share a run (the Transformer at the default shape, say) train it
once. Each summary records the commit that trained it and a probe: the first losses of a 3-step run of the
same variant at a tiny shape. A summary whose probe differs from today's code's was made by code that
trains differently ("stale"): the reports say so, and --retrain retrains it. --report_only trains nothing,
not even a probe: there a summary is stale where its probe differs from those most summaries of the same
probe run recorded.
"""
import argparse
import fnmatch
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from ablations import AblationConfig, build_model
from vrl import cli, locks, metrics

from lab import relative_loss  # lab/relative_loss.py, beside this file (lab.reproduce imports too)

REPO = Path(__file__).resolve().parents[1]  # the repository root
SUITES = ('variants', 'depth', 'value_embed', 'value_bank', 'scaling', 'lr', 'kv', 'controls', 'muon_lr',
          'optimizer', 'share_kv', 'residual_type', 'lambdas', 'neutreno', 'svformer', 'lengths', 'mapping',
          'shared_qk', 'backbone', 'anchors', 'source', 'placement', 'tuned', 'successors')

# Shared settings of every run at each scale. 'cpu' is train.py's default model (4 layers, d = 128,
# character-level Shakespeare, 600 steps of 2,048 tokens: ~1.5 min on 2 idle cores), evaluated every 50 steps
# so curves can be read off, with per-matrix gradient norms logged for the learning-rate study.
SCALES = {
    'cpu': dict(dataset='shakespeare_char', n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16,
                gradient_accumulation_steps=1, max_iters=600, lr_decay_iters=600, warmup_iters=50,
                learning_rate=2e-3, min_lr=2e-4, eval_interval=50, eval_iters=10, log_interval=10,
                log_grad_norms=True),
    # Untested here (no GPU was available): the 82M shape on GPT-2 BPE Shakespeare, bf16 and compiled by
    # train.py. eval_iters=8 fits its validation split's 139,125 tokens: 8 x 32 = 256 of its 271 windows of
    # 512, and 8 x 4 = 32 of 33 at 4,096 (the lengths suite's longest, at the same tokens a step).
    'gpu': dict(dataset='shakespeare_gpt2', n_layer=8, n_head=8, n_embd=512, block_size=512, batch_size=32,
                gradient_accumulation_steps=1, max_iters=2000, lr_decay_iters=2000, warmup_iters=100,
                learning_rate=6e-4, min_lr=6e-5, eval_interval=100, eval_iters=8, log_interval=10,
                log_grad_norms=True),
    # GPT-2 BPE Shakespeare at config/small_svformer.py's shape and steps (config/small_value_bank.py has the
    # same settings), a few minutes a run on 2 cores: the cpu scale's model, but a vocabulary of 50,304, where
    # a token table costs real parameters (the value_bank suite's second run set). 300 steps of 1,024 tokens.
    'bpe': dict(dataset='shakespeare_gpt2', n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=8,
                gradient_accumulation_steps=1, max_iters=300, lr_decay_iters=300, warmup_iters=30,
                learning_rate=2e-3, min_lr=2e-4, eval_interval=50, eval_iters=20, log_interval=10,
                log_grad_norms=True),
}
# (n_layer, n_embd) per scaling point; heads of 32 (cpu, bpe) or 64 (gpu) dimensions
SIZES = {'cpu': [(2, 64), (3, 96), (4, 128), (5, 160)], 'gpu': [(4, 256), (6, 384), (8, 512), (12, 768)],
         'bpe': [(2, 64), (3, 96), (4, 128), (5, 160)]}
HEAD_DIM = {'cpu': 32, 'gpu': 64, 'bpe': 32}
LEARNING_RATES = {'cpu': [1e-3, 2e-3, 4e-3, 8e-3], 'gpu': [3e-4, 6e-4, 1.2e-3, 2.4e-3],
                  'bpe': [1e-3, 2e-3, 4e-3, 8e-3]}
# at a fixed number of tokens per step, as in the paper's Sec. 4.6
SEQ_LENS = {'cpu': [128, 512], 'gpu': [512, 2048], 'bpe': [128, 512]}
VARIANTS = ['vanilla', 'resformer_identity', 'resformer_constant', 'resformer_sparse', 'resformer_learnable',
            'resformer_learnable_plus', 'svformer', 'neutreno', 'denseformer']
BASELINE = 'vanilla'
# The paper's depth (its 82M model has 8 layers): at the cpu scale the default width with 8 layers, trained
# twice as long; Sparse then puts λ = (5, 1) on layers 6-8 exactly as the paper's best setting. The gpu scale
# has 8 already. At the bpe scale the LM head over 50,304 tokens costs most of a step, so 8 layers cost about
# what 4 do a step: the same steps keep a run to minutes.
DEPTH = {'cpu': dict(n_layer=8, max_iters=1200, lr_decay_iters=1200, warmup_iters=100), 'gpu': {},
         'bpe': dict(n_layer=8)}
DEPTH_VARIANTS = ['vanilla', 'resformer_identity', 'resformer_sparse', 'resformer_learnable',
                  'resformer_learnable_plus', 'svformer', 'neutreno']
# Is ResFormer's gain only a faster-learning layer 1, or V1 itself without attention? At the paper's depth:
# a Transformer whose layer-1 W_V and W_O train faster (v5 Sec. 4.3's control): at 2x and 1.5x, the
# gradient-norm ratios v5 Sec. 4.3 reports for ResFormer's layer-1 W_V and W_O, and at 2x/2x and 4x/4x; and
# the earlier layers' values added unattended (value_mapping='identity', ICLR Eqn. 6's identity mapping), paired
# with the depth suite's Transformer.
LAYER1 = ('blocks.0.attn.c_v.weight', 'blocks.0.attn.c_proj.weight')
CONTROL_LR_SCALES = ((2.0, 2.0), (4.0, 4.0), (2.0, 1.5))  # (W_V's multiplier, W_O's)
# Beyond the paper: does the value residual survive Muon? Muon's peak rate is tuned on the Transformer first,
# at each depth (suite muon_lr, one seed: `python lab/reproduce.py muon_lr --seeds=1`), around Keller Jordan's
# default of 0.02; suite optimizer then trains every context-free value with AdamW (the paper's settings,
# runs shared with the value_bank suite) and with Muon at the sweep's best rate, each paired with the
# Transformer of its optimizer.
MUON_LRS = (0.005, 0.01, 0.02, 0.04, 0.08)  # 0.005 added when 8 layers did best at 0.01, the lowest then
MUON_SWEPT = (BASELINE, 'resformer_identity')  # the variants whose Muon rate the muon_lr sweep tunes
# (scale, n_layer): the muon_lr sweep's best rate (seed 1337's final loss; results/muon_lr). Suite optimizer
# trains Muon at the depths listed here, and leaves out the others until their sweep has run.
MUON_LR = {('cpu', 4): 0.02,  # 1.7136, 1.6711, 1.6699, 1.7123, 1.8209 at 0.005-0.08 (seed 1337)
           ('cpu', 8): 0.01,  # 1.5509, 1.5332, 1.5476, 1.6003, 1.7044
           ('bpe', 4): 0.01,  # 5.4758, 5.4286, 5.4406, 5.4745, 5.6333
           ('bpe', 8): 0.02}  # 5.4844, 5.4494, 5.4434, 5.4797, 5.6362
OPTIMIZER_VARIANTS = [('vanilla', dict(variant='vanilla')),
                      ('resformer_identity', dict(variant='resformer_identity')),
                      ('svformer', dict(variant='svformer')),
                      ('value_bank', dict(variant=BASELINE, value_bank=True))]
LAMBDA_SWEEP = (0.2, 0.5, 0.8, 1, 2, 5)  # ICLR Fig. 8's legend: the weight on V1, V_n's kept at 1
NEUTRENO_LAMBDAS = (0.2, 0.4, 0.6, 0.8)  # ICLR A.3 Fig. 22's legend (0.4: the paper's and the variant's)
# Is the gain the variants coping with an untuned schedule? Each model's own sweep of the peak rate x the warm-up
# (one seed, seed 1337, as muon_lr), at the scale's depth and at 8; then 6 seeds of each model at its own best
# recipe and at the Transformer's best (TUNED_BEST, filled in from the sweep's results, as MUON_LR). The
# warm-ups are 1, 4 and 10 times the scale's (8%, 33% and 83% of the run); min_lr stays a tenth of the rate.
TUNED_MODELS = (BASELINE, 'resformer_identity', 'svformer')
TUNED_RATES = {'cpu': (1e-3, 2e-3, 4e-3), 'gpu': (3e-4, 6e-4, 1.2e-3), 'bpe': (1e-3, 2e-3, 4e-3)}
TUNED_WARMUPS = (1, 4, 10)
TUNED_SEEDS = 6
# (scale, n_layer, model): its best (learning_rate, warmup_iters) in the sweep (seed 1337's final loss)
TUNED_BEST = {('cpu', 4, BASELINE): (2e-3, 500),  # 1.7902 (1.8345 at the scale's recipe, 2e-3 and 50)
              ('cpu', 4, 'resformer_identity'): (2e-3, 200),  # 1.7606 (1.8011)
              ('cpu', 4, 'svformer'): (4e-3, 200)}  # 1.7627 (1.7875)
# Fig. 7 Left and Fig. 14's lengths at 2,048 tokens a step (the paper's 512 to 64,000 at 2M)
LENGTHS = {'cpu': [64, 128, 256, 512], 'gpu': [512, 1024, 2048, 4096], 'bpe': [64, 128, 256, 512]}
# Beyond the paper: the value residual's successors (ablations.py's SUCCESSORS), each beside the
# Transformer and Identity ResFormer at both depths and paired with the Transformer of its depth; a
# Transformer widened to its parameters where one adds more than 1% (SUCCESSOR_MATCHED).
SUCCESSORS = ['satformer', 'gated_resformer', 'attn_res', 'attn_res_block', 'depth_attention',
              'hyper_connections', 'mhc', 'muddformer']
SUCCESSOR_MATCHED = 0.01
# the datasets' vocabularies as train.py pads them (84 characters; GPT-2)
PADDED_VOCAB = {'cpu': 128, 'gpu': 50304, 'bpe': 50304}


def suite_groups(suite, scale):
    """[(group label, settings that differ from the scale's, label of the Transformer group
    it is paired with)]."""
    base = SCALES[scale]
    if suite == 'variants':
        return [(v, dict(variant=v), BASELINE) for v in VARIANTS]
    if suite == 'depth':
        return [(f'{v} L8', dict(variant=v, **DEPTH[scale]), f'{BASELINE} L8') for v in DEPTH_VARIANTS]
    if suite == 'value_embed':
        return at_two_depths(scale, lambda n_layer: [
            (BASELINE, dict(variant=BASELINE)),
            ('resformer_identity', dict(variant='resformer_identity')),
            ('value_embeds', dict(variant=BASELINE, value_embeds=True)),
            ('value_embeds+resformer', dict(variant='resformer_identity', value_embeds=True)),
            *widened(scale, n_layer, dict(value_embeds=True))])
    if suite == 'value_bank':
        # every context-free value: V1 mixed in (ResFormer) or alone (SVFormer), a gated table added to the
        # values (value embeddings) or tables that replace them (the bank), and the bank with ResFormer
        return at_two_depths(scale, lambda n_layer: [
            (BASELINE, dict(variant=BASELINE)),
            ('resformer_identity', dict(variant='resformer_identity')),
            ('svformer', dict(variant='svformer')),
            ('value_embeds', dict(variant=BASELINE, value_embeds=True)),
            ('value_bank', dict(variant=BASELINE, value_bank=True)),
            ('value_bank+resformer', dict(variant='resformer_identity', value_bank=True)),
            *widened(scale, n_layer, dict(value_bank=True))])
    if suite == 'scaling':
        return [(f'{v} L{L} d{d}', dict(variant=v, n_layer=L, n_embd=d, n_head=d // HEAD_DIM[scale]),
                 f'{BASELINE} L{L} d{d}')
                for L, d in SIZES[scale] for v in (BASELINE, 'resformer_identity')]
    if suite == 'lr':
        return [(f'{v} lr={lr:g}', dict(variant=v, learning_rate=lr, min_lr=lr / 10), f'{BASELINE} lr={lr:g}')
                for lr in LEARNING_RATES[scale] for v in (BASELINE, 'resformer_identity')]
    if suite == 'kv':
        tokens = base['batch_size'] * base['block_size']
        kv_variants = [(BASELINE, dict(variant=BASELINE)), ('svformer', dict(variant='svformer')),
                       ('gqa', dict(variant=BASELINE, n_kv_head=base['n_head'] // 2)),
                       ('svformer+gqa', dict(variant='svformer', n_kv_head=base['n_head'] // 2)),
                       ('cla', dict(variant='cla'))]
        return [(f'{label} T={T}', dict(settings, block_size=T, batch_size=tokens // T), f'{BASELINE} T={T}')
                for T in SEQ_LENS[scale] for label, settings in kv_variants]
    if suite == 'controls':
        return ([(f'{BASELINE} L8', dict(variant=BASELINE, **DEPTH[scale]), f'{BASELINE} L8'),
                 ('resformer_identity L8', dict(variant='resformer_identity', **DEPTH[scale]),
                  f'{BASELINE} L8')]
                + [(f'{BASELINE} layer-1 lr x{v:g}' + (f' (W_O x{o:g})' if o != v else '') + ' L8',
                    dict(variant=BASELINE, lr_scales=[[name, m] for name, m in zip(LAYER1, (v, o))],
                         **DEPTH[scale]),
                    f'{BASELINE} L8') for v, o in CONTROL_LR_SCALES]
                + [('identity mapping L8', dict(variant='resformer_identity', value_mapping='identity',
                                                **DEPTH[scale]), f'{BASELINE} L8')])
    if suite == 'muon_lr':  # each variant's own sweep: tuning on the Transformer alone would favour it
        return at_two_depths(scale, lambda n_layer: [
            group for v in MUON_SWEPT for group in [(v, dict(variant=v))] + [
                (f'{v} muon lr={lr:g}', dict(variant=v, muon=True, muon_lr=lr)) for lr in MUON_LRS]])
    if suite == 'optimizer':
        groups = []
        for depth, shape in two_depths(scale):  # at 8 layers, the Transformer and Identity ResFormer
            if (scale, depth) not in MUON_LR:
                continue
            muon = dict(muon=True, muon_lr=MUON_LR[scale, depth])
            variants = OPTIMIZER_VARIANTS[:None if depth == base['n_layer'] else 2]
            for opt, settings in (('', {}), (' muon', muon)):
                groups += [(f'{label}{opt} L{depth}', dict(flags, **settings, **shape),
                            f'{BASELINE}{opt} L{depth}') for label, flags in variants]
        return groups
    if suite == 'share_kv':  # ICLR Sec. 3.5, Fig. 5: what layer pairs may share (CLA), beside SVFormer
        return [(v, dict(variant=v), BASELINE) for v in (BASELINE, 'share_k', 'share_v', 'cla', 'svformer')]
    if suite == 'residual_type':  # ICLR Sec. 4.3, Fig. 9 (v5's four numbers): what the λ table mixes
        return [(BASELINE, dict(variant=BASELINE), BASELINE),
                ('value', dict(variant='resformer_identity'), BASELINE)] + [
                (kind, dict(variant='resformer_identity', residual_type=kind), BASELINE)
                for kind in ('query', 'key', 'attention', 'hidden')]
    if suite == 'lambdas':  # ICLR Fig. 8: U_n = A_n (λ V1 + V_n) in every layer n >= 2
        L = base['n_layer']
        return [(BASELINE, dict(variant=BASELINE), BASELINE)] + [
            (f'λ={lam:g}', dict(variant='resformer_constant') if lam == 2 else
             dict(variant='custom', value_residual=True,
                  lambdas=[[0.0, 1.0]] + [[float(lam), 1.0]] * (L - 1)), BASELINE)
            for lam in LAMBDA_SWEEP]
    if suite == 'neutreno':  # ICLR Fig. 7 Right and A.3 Fig. 22: NeuTRENO's λ, and the other baselines
        return [(BASELINE, dict(variant=BASELINE), BASELINE)] + [
            (f'neutreno λ={lam:g}', dict(variant='neutreno') if lam == 0.4 else dict(variant='custom', neutreno_lambda=lam),
             BASELINE) for lam in NEUTRENO_LAMBDAS] + [
            (v, dict(variant=v), BASELINE) for v in ('neutreno_resformer', 'resformer_identity', 'denseformer')]
    if suite == 'svformer':  # ICLR Sec. 4.7: SVFormer's rate (Fig. 15a), warm-up (15b) and size (15d)
        groups = []
        for lr in LEARNING_RATES[scale]:
            groups += [(f'{v} lr={lr:g}', dict(variant=v, learning_rate=lr, min_lr=lr / 10),
                        f'{BASELINE} lr={lr:g}') for v in (BASELINE, 'svformer')]
        warmup = 10 * base['warmup_iters']  # the paper's 120 and 1,200
        groups += [(f'{v} warmup={warmup}', dict(variant=v, warmup_iters=warmup), f'{BASELINE} warmup={warmup}')
                   for v in (BASELINE, 'svformer')]
        return groups + [(f'{v} L{L} d{d}', dict(variant=v, n_layer=L, n_embd=d, n_head=d // HEAD_DIM[scale]),
                          f'{BASELINE} L{L} d{d}') for L, d in SIZES[scale] for v in (BASELINE, 'svformer')]
    if suite == 'lengths':  # ICLR Fig. 7 Left (ResFormer) and Fig. 14 (SVFormer): the same tokens a step
        tokens = base['batch_size'] * base['block_size']
        return [(f'{v} T={T}', dict(variant=v, block_size=T, batch_size=tokens // T), f'{BASELINE} T={T}')
                for T in LENGTHS[scale] for v in (BASELINE, 'resformer_identity', 'svformer')]
    if suite == 'mapping':  # ICLR Sec. 4.3, Fig. 10: which attention maps V1, at the paper's 8 layers
        return [(f'{label} L8', dict(variant=v, **flags, **DEPTH[scale]), f'{BASELINE} L8') for label, v, flags in (
            (BASELINE, BASELINE, {}), ('current (ResFormer)', 'resformer_identity', {}),
            ('first (A_1)', 'resformer_identity', dict(value_mapping='first')),
            ('identity', 'resformer_identity', dict(value_mapping='identity')),
            ('cross-layer attention', 'resformer_identity', dict(value_mapping='cross')))]
    if suite == 'shared_qk':  # ICLR Sec. 4.8, Fig. 16: layer 1's Q, K or V (SVFormer) in every layer
        return [(v, dict(variant=v), BASELINE) for v in (BASELINE, 'svformer', 'shared_query', 'shared_key')]
    if suite == 'backbone':  # ICLR Fig. 15c: SVFormer's gap on Llama's blocks and on GPT-2's
        return [(f'{v} {b}', dict(variant=v) | ({} if b == 'llama' else dict(backbone=b)), f'{BASELINE} {b}')
                for b in ('llama', 'gpt2') for v in (BASELINE, 'svformer')]
    if suite == 'anchors':  # ICLR Fig. 17: SVFormer's shared values from more layers, at 8 layers
        return [(f'{label} L8', dict(variant=v, **flags, **DEPTH[scale]), f'{BASELINE} L8') for label, v, flags in (
            (BASELINE, BASELINE, {}), ('first (SVFormer)', 'svformer', {}),
            ('first + last', 'svformer', dict(anchors=[8])),
            ('first + middle + last', 'svformer', dict(anchors=[5, 8])),
            ('first + two middle + last', 'svformer', dict(anchors=[4, 6, 8])))]
    if suite == 'source':  # ICLR Fig. 11, v5 Sec. 4.4 and Dense-ResFormer: whose values a layer mixes in
        no_h0 = dict(h0_residual=False)
        return [(f'{label} L8', dict(variant=v, **flags, **DEPTH[scale]), f'{base} L8')
                for label, v, flags, base in (
            (BASELINE, BASELINE, {}, BASELINE), ('first (V1)', 'resformer_identity', {}, BASELINE),
            ('adjacent (V_n-1)', 'resformer_identity', dict(residual_from='adjacent'), BASELINE),
            ('previous (mean of V_1..V_n-1)', 'resformer_identity', dict(residual_from='previous'), BASELINE),
            ('second (V2)', 'resformer_identity', dict(residual_from='second'), BASELINE),
            ('dense (Dense-ResFormer)', 'resformer_identity', dict(residual_from='dense'), BASELINE),
            (f'{BASELINE} no H0', BASELINE, no_h0, f'{BASELINE} no H0'),
            ('second (V2) no H0', 'resformer_identity', dict(residual_from='second', **no_h0), f'{BASELINE} no H0'))]
    if suite == 'placement':  # v5's placement and Table 10 (second-hand): where V1 goes, and rescaling
        return [(f'{label} L8', dict(flags, **DEPTH[scale]), f'{BASELINE} L8') for label, flags in (
            (BASELINE, dict(variant=BASELINE)),
            ('layer 7', sparse([7])), ('layers 7-8', sparse([7, 8])),
            ('layers 6-8 (Sparse)', dict(variant='resformer_sparse')),
            ('layers 5-8', sparse([5, 6, 7, 8])), ('layers 4-8', sparse([4, 5, 6, 7, 8])),
            ('layers 2-4', sparse([2, 3, 4])), ('layers 2-4 rescaled', sparse([2, 3, 4], rescale=True)),
            ('layers 6-8 rescaled', sparse([6, 7, 8], rescale=True)))]
    if suite == 'tuned':
        groups = []
        for depth, shape in two_depths(scale):
            warmup = shape.get('warmup_iters', base['warmup_iters'])
            recipes = [(lr, k * warmup) for lr in TUNED_RATES[scale] for k in TUNED_WARMUPS]
            groups += [(f'{v} sweep lr={lr:g} warmup={w} L{depth}', dict(shape, **recipe(v, lr, w)),
                        f'{BASELINE} sweep lr={lr:g} warmup={w} L{depth}')
                       for lr, w in recipes for v in TUNED_MODELS]
            if (scale, depth, BASELINE) in TUNED_BEST:  # once the sweep has run at this depth
                best = TUNED_BEST[scale, depth, BASELINE]
                groups += [(f'{v} at its best L{depth}', dict(shape, **recipe(v, *TUNED_BEST[scale, depth, v])),
                            f'{BASELINE} at its best L{depth}') for v in TUNED_MODELS]
                groups += [(f"{v} at the Transformer's best L{depth}", dict(shape, **recipe(v, *best)),
                            f'{BASELINE} at its best L{depth}') for v in TUNED_MODELS[1:]]
        return groups
    if suite == 'successors':
        return at_two_depths(scale, lambda n_layer: [
            *[(v, dict(variant=v)) for v in (BASELINE, 'resformer_identity', *SUCCESSORS)],
            *[group for v in SUCCESSORS
              if added_params(scale, n_layer, dict(variant=v)) > SUCCESSOR_MATCHED
              for group in widened(scale, n_layer, dict(variant=v))]])
    raise ValueError(f"unknown suite {suite!r}")


def recipe(variant, learning_rate, warmup_iters):
    """A model's settings at a peak rate and warm-up, min_lr a tenth of the rate (every suite's rule)."""
    return dict(variant=variant, learning_rate=learning_rate, min_lr=learning_rate / 10,
                warmup_iters=warmup_iters)


def sparse(layers, weight=5.0, rescale=False, n_layer=8):
    """Sparse ResFormer's settings with V1 mixed into the given layers (1-based) at (weight, 1), the others
    (0, 1); rescale: post-residual rescaling (v5 Table 10, second-hand; our form, V'_n / (λ1 + λ2))."""
    rows = [[weight if n in layers else 0.0, 1.0] for n in range(1, n_layer + 1)]
    return dict(variant='custom', value_residual=True, lambdas=rows) | (dict(value_rescale=True) if rescale else {})


def two_depths(scale):
    """[(n_layer, the settings for it)]: the scale's depth and the paper's 8 layers (DEPTH's shape; once where
    the scale has 8)."""
    base = SCALES[scale]
    return [(base['n_layer'], {})] + ([(8, DEPTH[scale])] if base['n_layer'] != 8 else [])


def at_two_depths(scale, groups):
    """The groups at two_depths, each paired with the Transformer of its depth: groups(n_layer) gives
    [(label, settings)]."""
    return [(f'{label} L{depth}', dict(settings, **shape), f'{BASELINE} L{depth}')
            for depth, shape in two_depths(scale) for label, settings in groups(depth)]


def widened(scale, n_layer, flags):
    """[(label, settings)] of a Transformer whose wider SwiGLU gives it the parameters of the Transformer with
    flags; none where they cost too few to widen it (a bank of values at the cpu scale: vocab = d = 128, so
    its tables cost what the W_V they replace did, plus one γ_v a layer), as it would be the Transformer
    itself."""
    ffn, plain = matched_ffn(scale, n_layer, flags), matched_ffn(scale, n_layer, {})
    return [(f'{BASELINE} ffn={ffn}', dict(variant=BASELINE, ffn_hidden=ffn))] if ffn != plain else []


def extra_params(scale, n_layer, flags):
    """(The parameters a model with flags adds to the Transformer of the scale and depth, the
    Transformer's.)"""
    shape = dict(n_layer=n_layer, n_head=SCALES[scale]['n_head'], n_embd=SCALES[scale]['n_embd'],
                 vocab_size=PADDED_VOCAB[scale])
    with torch.device('meta'):
        plain = build_model(AblationConfig(**shape)).num_params()
        return build_model(AblationConfig(**shape, **flags)).num_params() - plain, plain


def added_params(scale, n_layer, flags):
    """The parameters a model with flags adds to the Transformer, a fraction of its."""
    extra, plain = extra_params(scale, n_layer, flags)
    return extra / plain


def matched_ffn(scale, n_layer, flags):
    """The SwiGLU width at which a Transformer has the parameters of the same Transformer with flags (value
    embeddings, a bank of values)."""
    n_embd = SCALES[scale]['n_embd']
    # 3 SwiGLU matrices a layer
    extra = extra_params(scale, n_layer, flags)[0]
    return round(3.5 * n_embd) + round(extra / (3 * n_embd * n_layer))


def run_name(scale, settings):
    """A file name from the settings that differ from the scale's, so equal runs get equal names."""
    base = SCALES[scale]
    changed = {k: v for k, v in settings.items() if base.get(k) != v}
    keys = sorted(changed, key=lambda k: (k != 'variant', k == 'seed', k))  # variant first, seed last
    return '_'.join([scale] + [f'{k}={name_part(changed[k])}' for k in keys])


def name_part(value):
    """A setting's value as it appears in a run name: lr_scales' [[name, x], ...] as name@x+name@x, a λ
    table's rows [[a, b], ...] as a,b+a,b+..."""
    if isinstance(value, float):
        return f'{value:g}'
    if isinstance(value, list) and value and isinstance(value[0], (int, float)):  # anchors: 5+8
        return '+'.join(f'{x:g}' for x in value)
    if isinstance(value, list) and value and isinstance(value[0][0], str):
        return '+'.join(f'{name}@{scale:g}' for name, scale in value)
    if isinstance(value, list):
        return '+'.join(f'{a:g},{b:g}' for a, b in value)
    return str(value)


# Groups that train more seeds than --seeds asks for, {(suite, scale, label or its last word): how many
# more}: where a verdict hinged on a pair that 3 seeds left unresolved. At 8 layers the optimizer suite's
# change under Muon (characters: t = 1.2; GPT-2 BPE, where one AdamW seed puts Identity ResFormer 0.09
# behind: t = -0.1); λ = 1 against λ = 2 (t -0.2); NeuTRENO against ResFormer, NeuTRENO-ResFormer and
# DenseFormer (t 2.6, -0.7, -4.07); sharing Q against the Transformer (t 2.0). Queued, not yet trained:
# lengths (ResFormer at 64 and 512 tokens: t -2.9, -2.5; SVFormer's growth: -2.4), the bank at 8 layers
# (t 3.1), placement's last widening (t -2.2) and Table 10's cells (t 3.0, -1.0, 2.0), and the
# successors Depth-Attention and Hyper-Connections at 4 layers (t -3.9, -3.0).
EXTRA_SEEDS = {('optimizer', 'cpu', 'L8'): 3, ('optimizer', 'bpe', 'L8'): 3,
               **{('lambdas', 'cpu', label): 3 for label in ('vanilla', 'λ=1', 'λ=2')},
               **{('neutreno', 'cpu', label): 3 for label in ('vanilla', 'neutreno λ=0.4', 'neutreno_resformer',
                                                             'resformer_identity', 'denseformer')},
               **{('shared_qk', 'cpu', label): 3 for label in ('vanilla', 'shared_query')},
               **{('lengths', 'cpu', f'{v} T={T}'): 3 for T in (64, 512)
                  for v in ('vanilla', 'resformer_identity', 'svformer')},
               **{('value_bank', 'cpu', f'{v} L8'): 3 for v in ('vanilla', 'resformer_identity', 'value_bank')},
               **{('placement', 'cpu', f'{label} L8'): 3 for label in (
                   'vanilla', 'layers 4-8', 'layers 5-8', 'layers 2-4', 'layers 2-4 rescaled',
                   'layers 6-8 (Sparse)', 'layers 6-8 rescaled')},
               **{('successors', 'cpu', f'{v} L4'): 3 for v in (
                   'vanilla', 'resformer_identity', 'depth_attention', 'hyper_connections')}}


def group_seeds(suite, scale, label, seeds):
    """The seeds of one group: seeds, continued by the group's EXTRA_SEEDS."""
    if suite == 'tuned':  # a sweep's one seed; the tuned groups' TUNED_SEEDS
        return list(seeds[:1]) if ' sweep ' in label else [seeds[0] + k for k in range(TUNED_SEEDS)]
    extra = EXTRA_SEEDS.get((suite, scale, label), EXTRA_SEEDS.get((suite, scale, label.rsplit(' ', 1)[-1]), 0))
    return list(seeds) + [seeds[-1] + 1 + k for k in range(extra)]


def suite_runs(suite, scale, seeds):
    """[(group label, run name, full settings)] for every group and seed."""
    runs = []
    for label, settings, _ in suite_groups(suite, scale):
        for seed in group_seeds(suite, scale, label, seeds):
            full = SCALES[scale] | settings | {'seed': seed}
            runs.append((label, run_name(scale, settings | {'seed': seed}), full))
    return runs


# -----------------------------------------------------------------------------
# running

# The probe: 3 steps of a run's variant at a tiny shape, one thread, float32 on the CPU: the losses of code
# that trains the same agree to far better than PROBE_TOLERANCE, and a change to the model, the batches or the
# update moves them.
PROBE = dict(n_layer=4, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
             max_iters=3, lr_decay_iters=3, warmup_iters=1, learning_rate=2e-3, min_lr=2e-4, eval_interval=3,
             eval_iters=1, log_interval=1, log_grad_norms=False, seed=1337, device='cpu', dtype='float32',
             compile=False)
PROBE_TOLERANCE = 1e-3
# the settings a probe takes from its run: those that change what the variant computes
PROBED = ('dataset', 'variant', 'value_embeds', 'value_bank', 'value_mapping', 'residual_type', 'h0_residual',
          'muon', 'muon_adjust_lr', 'value_residual', 'lambdas', 'lambda_mode', 'value_rescale',
          'neutreno_lambda', 'residual_from', 'anchors', 'backbone',
          'value_gate', 'value_gate_last_k', 'value_gate_static', 'attn_res', 'attn_res_block',
          'depth_attention', 'hyper_connections', 'hc_rate', 'hc_dynamic', 'muddformer')
# --check: a retrained run's final loss against its summary's. On our machine 1 and 2 threads gave the same
# loss to the last bit (cpu_variant=vanilla_seed=1337); another CPU or BLAS sums in another order, and 600
# steps amplify last-bit differences, so the check allows 0.01, about a quarter of Identity ResFormer's gain
# at this shape.
CHECK_TOLERANCE = 0.01
children = set()  # the train.py processes running now, ended with reproduce.py
SKIPPED = 'skipped:'  # how a run that another reproduce.py is training is reported
stopping = threading.Event()


def train_command(settings, out_dir, resume):
    args = [f'--{k}={v}' if isinstance(v, str) else f'--{k}={v!r}' for k, v in settings.items()]
    return [sys.executable, str(REPO / 'train.py'), *args, f'--out_dir={out_dir}'] \
        + (['--init_from=resume'] if resume else [])


def end_with_parent():
    """In the child, before exec: Linux sends it SIGTERM (train.py saves and stops) if reproduce.py dies,
    even by SIGKILL."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: children end with reproduce.py's own SIGTERM/Ctrl-C handling only


def stop(signum, frame):
    """reproduce.py's SIGTERM handler (a scheduler's preemption): pass it on to the runs, which save a
    checkpoint and stop, and start no other run."""
    stopping.set()
    for child in list(children):
        child.send_signal(signal.SIGTERM)
    print(f"reproduce.py: stopping on signal {signum}; the runs save a checkpoint and resume on the "
          f"next call", file=sys.stderr, flush=True)


def train(command, env, stdout):
    """Run train.py to its end; reproduce.py's SIGTERM or Ctrl-C reaches it (it saves),
    and so does its death."""
    # Windows' subprocess takes no preexec_fn: there a run outlives a reproduce.py that is killed
    child = subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout, stderr=subprocess.STDOUT,
                             preexec_fn=end_with_parent if os.name == 'posix' else None)
    children.add(child)
    if stopping.is_set():  # the stop came while this run was set up (its probe): stop it too
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait()
    finally:
        children.discard(child)


_probes = {}


def probe_settings(settings):
    """The probe run of settings: PROBE's tiny shape with the flags that change what the variant computes
    (shapes and schedules aside): a change to one of them must show in the probe of every run that sets it."""
    tiny = PROBE | {k: settings[k] for k in PROBED if k in settings}
    if 'lambdas' in settings or 'anchors' in settings:  # a λ table has a row per layer
        tiny['n_layer'] = settings['n_layer']
    if settings.get('n_kv_head') and settings['n_kv_head'] < settings['n_head']:
        tiny['n_kv_head'] = 1
    return tiny


def stored_probes(results_dir):
    """A stand-in for probe that trains nothing (--report_only, --check_verdicts): the probe that most
    summaries in results_dir/runs of the same probe run recorded. A summary whose probe differs from its
    fellows' still reads as stale; a set retrained by other code all at once does not (--dry_run probes
    today's code)."""
    tallies = {}
    for path in sorted((results_dir / 'runs').glob('*.json')):
        try:
            summary = json.loads(path.read_text())
            key = json.dumps(probe_settings(summary['settings']), sort_keys=True)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # unreadable: summary_state says so
        if summary.get('probe'):
            tally = tallies.setdefault(key, {})
            tally[json.dumps(summary['probe'])] = tally.get(json.dumps(summary['probe']), 0) + 1

    def today(settings):
        tally = tallies.get(json.dumps(probe_settings(settings), sort_keys=True))
        return json.loads(max(tally, key=tally.get)) if tally else None
    return today


def probe(settings):
    """The first losses (validation at step 0, training at steps 1-3) of a 3-step run of settings' variant."""
    tiny = probe_settings(settings)
    key = json.dumps(tiny, sort_keys=True)
    if key not in _probes:
        with tempfile.TemporaryDirectory() as out_dir:
            command = train_command(tiny, Path(out_dir) / 'probe', resume=False)
            result = subprocess.run(command, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS='1'),
                                    capture_output=True, text=True)
            stopped_by = stop_signal(result.returncode)
            if stopped_by:  # a Ctrl-C or a scheduler's SIGTERM reached it: nothing is wrong with the data
                raise SystemExit(f"reproduce.py: stopped by {stopped_by} during a probe run (3 steps that "
                                 f"check today's code); the same command goes on where the runs stand")
            if result.returncode != 0:
                raise SystemExit(f"reproduce.py: the probe run failed: "
                                 f"{result.stderr.strip().splitlines()[-1:]}; "
                                 f"is the data prepared (python prepare.py)?")
            records = [json.loads(line) for line in open(Path(out_dir) / 'probe' / 'log.jsonl')]
        _probes[key] = [round(r.get('val_loss', r.get('train_loss')), 4)
                        for r in records if r['step'] <= 3][:4]
    return _probes[key]


def stop_signal(returncode):
    """The name of the signal that stopped a train.py that exited with returncode (128 + its number, as
    train.py's stops exit, or minus it, killed by it), or None."""
    number = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(number).name if number > 0 else None
    except ValueError:
        return None


def commit():
    """HEAD's commit, marked -dirty when tracked code differs from it (not results/, which suites write to);
    'unknown' outside a git checkout."""
    try:
        head = subprocess.run(['git', 'rev-parse', '--short=12', 'HEAD'], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no',
                                '--', '.', ':!results'],
                               cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'
    return head + ('-dirty' if dirty else '')


def summary_state(path, settings, today=None):
    """'todo' (no summary), 'unreadable' (cut short or not ours), 'stale' (made by code that trains
    differently: its probe differs from today's, or it has none) or 'done'. today: the probe of today's
    code (default: probe, which trains it; stored_probes reads it off the summaries)."""
    if not path.exists():
        return 'todo'
    try:
        summary = json.loads(path.read_text())
        summary['final_val_loss'], summary['curve']
    except (OSError, ValueError, TypeError, KeyError):
        return 'unreadable'
    old, new = summary.get('probe'), (today or probe)(settings)
    if not old or not new or len(old) != len(new) or max(abs(a - b) for a, b in zip(old, new)) > PROBE_TOLERANCE:
        return 'stale'
    return 'done'


def has_train_curve(path):
    """Whether a finished run's summary holds its training curve (runs trained before train.py logged the
    mean training loss of each log interval have none)."""
    return bool(json.loads(path.read_text()).get('train_curve'))


def write_whole(path, text):
    """Write text to path through a temporary file, so a kill leaves the old file or the new, never half."""
    Path(f'{path}.tmp').write_text(text)
    os.replace(f'{path}.tmp', path)


def started_by_today(started_by, today):
    """Whether probe.json says today's code started the run folder (an unreadable one says it did not)."""
    try:
        return json.loads(started_by.read_text()) == today
    except (OSError, ValueError):
        return False


def run_one(settings, run_dir, summary_path, env):
    """Train one run to its end (resuming from run_dir/ckpt.pt when today's code started it),
    then write its summary."""
    today = probe(settings)
    started_by = run_dir / 'probe.json'  # the probe of the code that started the checkpoint
    resume = (run_dir / 'ckpt.pt').exists() and started_by_today(started_by, today)
    if run_dir.exists() and not resume:
        # killed before its first checkpoint, or trained by other code: nothing to keep
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_whole(started_by, json.dumps(today))
    seconds_path = run_dir / 'seconds'  # wall time over every attempt, resumed ones included
    t0 = time.time()
    with open(run_dir / 'train.out', 'a') as out:
        returncode = train(train_command(settings, run_dir, resume), env, out)
    seconds = time.time() - t0 + (float(seconds_path.read_text()) if seconds_path.exists() else 0.0)
    write_whole(seconds_path, f'{seconds:.1f}')
    if returncode != 0:
        last = (run_dir / 'train.out').read_text().strip().splitlines()[-1:] or ['(no output)']
        return f"exit {returncode}: {last[0][-300:]}"
    summary = summarize(run_dir, settings, seconds) | {'commit': commit(), 'probe': today,
                                                       'threads': env.get('OMP_NUM_THREADS', 'default')}
    if summary_path.exists():  # retrained (stale, or for its training curve): say whether it ends the same
        try:
            before = json.loads(summary_path.read_text())
            summary['replaces'] = {k: before.get(k) for k in ('final_val_loss', 'commit')}
        except (OSError, ValueError, AttributeError):  # unreadable (cut short): nothing to compare
            pass
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(summary_path, json.dumps(summary, indent=1))
    return None


def summarize(run_dir, settings, seconds):
    """The parts of a finished run the tables need: settings, the validation curve,
    sizes, λ and gradient norms."""
    records = []
    for line in open(run_dir / 'log.jsonl'):
        record = json.loads(line)
        if isinstance(record, dict):
            records.append(record)
    curve = [[r['step'], r['val_loss']] for r in records if 'val_loss' in r]
    # the mean training loss over each log interval (older train.py: the logged step's own)
    train_curve = [[r['step'], r['train_loss']] for r in records if 'train_loss' in r]
    grads = [r['grad_norms'] for r in records if 'grad_norms' in r]
    lambdas = [r['lambdas'] for r in records if 'lambdas' in r]
    checkpoint = torch.load(run_dir / 'ckpt.pt', map_location='cpu', weights_only=True)
    with torch.device('meta'):
        model = build_model(AblationConfig(**checkpoint['model_args']))
    return {'settings': settings, 'curve': curve, 'final_val_loss': curve[-1][1], 'train_curve': train_curve,
            'params': model.num_params(),
            # bytes of K and V cached per token of context, in 16-bit precision (and a bank's token ids)
            'kv_bytes_per_token': model.kv_bytes_per_token(element_size=2),
            'lambdas': lambdas[-1] if lambdas else None,
            # Dense-ResFormer's learned weights, layer by layer (on V_1 .. V_n), which no log line records
            'dense_weights': dense_weights(checkpoint.get('model', {})),
            # SlimPajama's 7 domains scored one by one (val_loss is their unweighted mean); None: one corpus
            'final_val_loss_domains': next((r['val_loss_domains'] for r in reversed(records)
                                            if 'val_loss_domains' in r), None),
            'mean_grad_norms': {k: sum(g[k] for g in grads) / len(grads) for k in grads[0]}
                               if grads else None,
            # layer 1's W_V and W_O at every logged step, for the ratios early and late in training
            'layer1_grad_norms': [[r['step'], r['grad_norms'].get('blocks.0.attn.c_v.weight'),
                                   r['grad_norms'].get('blocks.0.attn.c_proj.weight')]
                                  for r in records if 'grad_norms' in r],
            'seconds': seconds}


def dense_weights(state_dict):
    """[weights per layer that has them] of a Dense-ResFormer's state dict (blocks.{i}.attn.dense), in layer
    order; None for every other variant."""
    found = {int(k.split('.')[1]): v.tolist() for k, v in state_dict.items() if k.endswith('.attn.dense')}
    return [found[i] for i in sorted(found)] or None


def run_suite(runs, runs_dir, results_dir, gpus, jobs, retrain=False, train_curves=False):
    """Train every run that has no summary yet (and, with retrain, every stale one; with train_curves, every
    finished one whose summary has no training curve): one per GPU when there are several, else `jobs` at a
    time on the CPU, splitting its cores between them. Returns {run name: error}."""
    settings_of = {name: settings for _, name, settings in runs}
    states = {name: summary_state(results_dir / 'runs' / f'{name}.json', s)
              for name, s in settings_of.items()}
    todo = [name for name, state in states.items()
            if state in ('todo', 'unreadable') or (retrain and state == 'stale')
            or (train_curves and state == 'done' and not has_train_curve(results_dir / 'runs' / f'{name}.json'))]
    stale = sum(state == 'stale' for state in states.values()) if not retrain else 0
    print(f"{len(states) - len(todo)} of {len(states)} runs done; {len(todo)} to go"
          + (f"; {stale} done by code that trains differently (--retrain retrains them)" if stale else ''),
          flush=True)
    workers = gpus if gpus > 1 else jobs
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    envs = [dict(os.environ, CUDA_VISIBLE_DEVICES=str(w)) if gpus > 1
            else dict(os.environ, OMP_NUM_THREADS=threads)
            for w in range(workers)]
    if gpus <= 1 and 'OMP_NUM_THREADS' in os.environ:  # the user's choice wins
        envs = [dict(os.environ) for _ in range(workers)]
    free_envs = queue.Queue()
    for env in envs:
        free_envs.put(env)
    runs_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    def work(name):
        if stopping.is_set():
            return name, 'not started: reproduce.py was stopped'
        # one trainer per run, across reproduce.py processes
        held, holder = locks.try_lock(str(runs_dir / f'{name}.lock'), 'reproduce.py')
        if held is None:
            return name, f'{SKIPPED} another reproduce.py ({holder}) is training it'
        env = free_envs.get()
        try:
            return name, run_one(settings_of[name], runs_dir / name, results_dir / 'runs' / f'{name}.json',
                                 env)
        finally:
            free_envs.put(env)
            held.release()
    failures = {}
    with ThreadPoolExecutor(workers) as pool:
        try:
            for k, (name, error) in enumerate(pool.map(work, todo)):
                print(f"[{k + 1}/{len(todo)}, {(time.time() - t_start) / 60:.0f} min] "
                      f"{name}: {error or 'done'}", flush=True)
                if error and not error.startswith(SKIPPED):  # a run another process trains is no failure
                    failures[name] = error
        except KeyboardInterrupt:  # Ctrl-C reached the children too (they save); start no further run
            stopping.set()
            raise
    return failures


def check(name, runs, runs_dir, results_dir, env):
    """Retrain one finished run from scratch and compare its final validation loss with its committed
    summary."""
    settings = {run: s for _, run, s in runs}.get(name)
    path = results_dir / 'runs' / f'{name}.json'
    if settings is None:
        raise SystemExit(f"reproduce.py: no run {name!r} in this suite; --dry_run lists the names")
    if summary_state(path, settings) in ('todo', 'unreadable'):
        raise SystemExit(f"reproduce.py: {path} is missing or unreadable; train the suite first")
    committed = json.loads(path.read_text())
    print(f"retraining {name} into {runs_dir / 'check' / name} (the committed one was trained by "
          f"{committed.get('commit', 'an older commit')})", flush=True)
    fresh = runs_dir / 'check' / f'{name}.json'
    error = run_one(settings, runs_dir / 'check' / name, fresh, env)
    if error:
        raise SystemExit(f"reproduce.py: the check run failed: {error}")
    ours, theirs = json.loads(fresh.read_text())['final_val_loss'], committed['final_val_loss']
    verdict = 'agrees' if abs(ours - theirs) <= CHECK_TOLERANCE else 'DIFFERS'
    print(f"final validation loss: retrained {ours:.4f}, committed {theirs:.4f}, "
          f"difference {ours - theirs:+.4f}: {verdict} (tolerance {CHECK_TOLERANCE})")
    return verdict == 'agrees'


# -----------------------------------------------------------------------------
# statistics (tested on synthetic logs in tests/test_reproduce.py)

def mean_std(xs):
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def paired_t(xs, baselines):
    """Mean and std of the paired differences xs[i] - baselines[i], and the paired t-statistic
    (nan for n < 2)."""
    diffs = [x - b for x, b in zip(xs, baselines)]
    mean, std = mean_std(diffs)
    t = mean / (std / math.sqrt(len(diffs))) if len(diffs) > 1 and std > 0 else float('nan')
    return mean, std, t


def t_within(t, df):
    """P(|T| <= t) for Student's t with df degrees of freedom (an integer): the finite series of
    Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df), exact and without scipy."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:  # 2/π (θ + sin θ (cos θ + 2/3 cos³ θ + ... + (2·4···(df−3))/(1·3···(df−2)) cos^(df−2) θ))
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total, term = total + term, term * 2 * k / (2 * k + 1) * cos2
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term, total = 1.0, 0.0  # sin θ (1 + 1/2 cos² θ + ... + (1·3···(df−3))/(2·4···(df−2)) cos^(df−2) θ)
    for k in range(1, df // 2 + 1):
        total, term = total + term, term * (2 * k - 1) / (2 * k) * cos2
    return math.sin(theta) * total


def t_critical(df, level=0.05):
    """The two-sided critical value of Student's t: |t| above it is significant at `level` (4.303 for
    df = 2, three paired seeds; 2.571 for df = 5, six)."""
    low, high = 0.0, 1e4
    for _ in range(100):  # bisection: t_within rises with t
        mid = (low + high) / 2
        low, high = (mid, high) if t_within(mid, df) < 1 - level else (low, mid)
    return (low + high) / 2


# verdict's answers as the reports' verdict column words them
VERDICT_WORDS = {'<': 'ahead', '>': 'behind', 'unresolved': 'unresolved'}


def verdict(t, n):
    """'<' (A's loss resolved below B's), '>' or 'unresolved': the paired t of A − B over n seeds against
    the two-sided 5% critical value for n − 1 degrees of freedom."""
    if n < 2 or math.isnan(t) or abs(t) <= t_critical(n - 1):
        return 'unresolved'
    return '<' if t < 0 else '>'


def fmt_t(t, n):
    """A t-statistic to one decimal, or two where one would round onto the critical value (−4.26 for
    three seeds prints −4.26, not −4.3, which would read as 4.303)."""
    if n < 2 or math.isnan(t):
        return '–'
    critical = t_critical(n - 1)
    digits = 1 if round(abs(t), 1) != round(critical, 1) else 2
    return f'{t:.{digits}f}'


def mean_curve(curves):
    """Pointwise mean of validation curves [[step, loss], ...] over the steps all of them share."""
    steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
    return [[s, sum(dict(map(tuple, c))[s] for c in curves) / len(curves)] for s in steps]


def crossing_step(curve, target):
    """First step at which a curve reaches loss <= target, linearly interpolated between evaluations;
    None if never."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if l0 <= target:
            return s0
        if l1 <= target:
            return s0 + (l0 - target) / (l0 - l1) * (s1 - s0)
    return curve[-1][0] if curve and curve[-1][1] <= target else None


def parameters_for_loss(points, loss):
    """Parameters a model family needs to reach `loss`: piecewise-linear interpolation of its final loss
    against log(parameters) through points [(params, loss)], extrapolated along the nearest segment.
    (params, extrapolated)."""
    points = sorted(points)
    for (n0, l0), (n1, l1) in zip(points, points[1:]):
        if min(l0, l1) <= loss <= max(l0, l1) and l0 != l1:
            return math.exp(math.log(n0) + (loss - l0) / (l1 - l0) * (math.log(n1) - math.log(n0))), False
    (n0, l0), (n1, l1) = points[-2:] if loss < points[-1][1] else points[:2]
    return math.exp(math.log(n0) + (loss - l0) / (l1 - l0) * (math.log(n1) - math.log(n0))), True


def loglinear_fit(points):
    """Least-squares line loss = a + b·ln(params) through points [(params, loss)]: (a, b). Unlike the
    piecewise reading above, it uses every size at once and needs no extrapolation along one segment."""
    xs, ys = [math.log(n) for n, _ in points], [loss for _, loss in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


# -----------------------------------------------------------------------------
# reporting

def load_groups(suite, scale, seeds, results_dir, today=None):
    """{label: {'runs': [summary per finished seed], 'seeds': [...], 'baseline': label}} in suite order. Only
    runs made by code that trains as today's does count: a stale summary is not mixed into today's numbers
    (today: as summary_state's)."""
    groups = {}
    for label, settings, baseline in suite_groups(suite, scale):
        group = groups.setdefault(label, {'runs': [], 'seeds': [], 'baseline': baseline})
        for seed in group_seeds(suite, scale, label, seeds):
            path = results_dir / 'runs' / f"{run_name(scale, settings | {'seed': seed})}.json"
            if summary_state(path, SCALES[scale] | settings | {'seed': seed}, today) == 'done':
                group['runs'].append(json.loads(path.read_text()))
                group['seeds'].append(seed)
    return groups


def fmt(x, digits=4):
    return '–' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:.{digits}f}'


def group_rows(groups):
    """One row per group: the common table of every suite."""
    rows = []
    for label, group in groups.items():
        if not group['runs']:
            rows.append(f"| {label} | 0 | – | – | – | – | – | – | – | – |")
            continue
        losses = [r['final_val_loss'] for r in group['runs']]
        mean, std = mean_std(losses)
        base = groups[group['baseline']]
        paired = [(x, base['runs'][base['seeds'].index(s)]['final_val_loss'])
                  for x, s in zip(losses, group['seeds']) if s in base['seeds']]
        diff = paired_t(*zip(*paired)) if paired and label != group['baseline'] else None
        cross = None
        if base['runs']:
            target = mean_std([r['final_val_loss'] for r in base['runs']])[0]
            cross = crossing_step(mean_curve([r['curve'] for r in group['runs']]), target)
        first = group['runs'][0]
        minutes = sum(r['seconds'] for r in group['runs']) / 60
        rows.append(f"| {label} | {len(losses)} | {mean:.4f} ± {std:.4f} | "
                    f"{'–' if diff is None else f'{diff[0]:+.4f} ± {diff[1]:.4f}'} | "
                    f"{'–' if diff is None else fmt_t(diff[2], len(paired))} | "
                    f"{'–' if diff is None or len(paired) < 2 else VERDICT_WORDS[verdict(diff[2], len(paired))]} | "
                    f"{'never' if cross is None else f'{cross:.0f}'} | "
                    f"{first['params']:,} | {first['kv_bytes_per_token']:,} | {minutes:.1f} |")
    return ["| group | seeds | final val loss (mean ± std) | Δ vs Transformer (paired mean ± std) | t | "
            "verdict (two-sided 5%) | step reaching the Transformer's final loss | parameters | "
            "KV bytes/token (16-bit) | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|"] + rows


def optimizer_rows(groups):
    """Each variant's gain over the Transformer under AdamW and under Muon (per seed, each against the
    Transformer of its optimizer), and the paired difference of the two gains: resolved where |t| is large."""
    rows = []
    for label, muon in groups.items():
        adamw = groups.get(label.replace(' muon ', ' '))
        if ' muon ' not in label or label == muon['baseline'] or not adamw:
            continue
        gains = []
        for group in (adamw, muon):
            base = groups[group['baseline']]
            base_loss = {s: r['final_val_loss'] for r, s in zip(base['runs'], base['seeds'])}
            gains.append({s: r['final_val_loss'] - base_loss[s]
                          for r, s in zip(group['runs'], group['seeds']) if s in base_loss})
        seeds = sorted(gains[0].keys() & gains[1].keys())
        if not seeds:
            continue
        cells = [paired_t([g[s] for s in seeds], [0.0] * len(seeds)) for g in gains]
        cells.append(paired_t([gains[1][s] for s in seeds], [gains[0][s] for s in seeds]))
        rows.append(f"| {label.replace(' muon', '')} | {len(seeds)} | "
                    + ' | '.join(f"{m:+.4f} ± {sd:.4f} ({fmt(t, 1)})" for m, sd, t in cells) + ' |')
    if not rows:
        return []
    return ['', "Each variant's Δ against the Transformer of its own optimizer (paired by seed, t in "
            "brackets), and how much Muon changes it (Muon's Δ minus AdamW's, paired by seed):", '',
            "| variant | seeds | Δ under AdamW | Δ under Muon | Muon's Δ − AdamW's |",
            '|---|---|---|---|---|'] + rows


def muon_lr_rows(groups):
    """Each swept variant against the Transformer at the Transformer's best Muon rate and with each at its
    own best rate, per depth: tuning on the Transformer alone would favour it. A best rate is the one with
    the lowest loss on the sweep's seed (the first); each Δ pairs every seed both groups have, so training
    more seeds at the best rates (`--seeds=3 --only=...`) turns a one-seed Δ into a mean ± std (t)."""
    swept = {}  # (variant, depth) -> {rate: {seed: final loss}}
    for label, group in groups.items():
        parts = label.split()
        if len(parts) == 4 and parts[1] == 'muon' and group['runs']:
            swept.setdefault((parts[0], parts[3]), {})[parts[2].removeprefix('lr=')] = {
                seed: run['final_val_loss'] for seed, run in zip(group['seeds'], group['runs'])}
    if not swept:
        return []
    sweep_seed = min(seed for rates in swept.values() for losses in rates.values() for seed in losses)

    def best(rates):
        tried = {rate: losses[sweep_seed] for rate, losses in rates.items() if sweep_seed in losses}
        rate = min(tried, key=tried.get)
        return rate, f"{rate} ({tried[rate]:.4f})"

    def delta(losses, base_losses):
        seeds = sorted(losses.keys() & base_losses.keys())
        mean, std, t = paired_t([losses[s] for s in seeds], [base_losses[s] for s in seeds])
        if len(seeds) == 1:
            return f"{mean:+.4f}"
        return f"{mean:+.4f} ± {std:.4f} ({fmt(t, 1)}, {len(seeds)} seeds)"

    rows = []
    for (variant, depth), rates in swept.items():
        base = swept.get((BASELINE, depth))
        if variant == BASELINE or not base:
            continue
        (base_rate, base_cell), (own_rate, own_cell) = best(base), best(rates)
        at_base = delta(rates[base_rate], base[base_rate]) if base_rate in rates else '–'
        rows.append(f"| {variant} {depth} | {len(rates)} of {len(MUON_LRS)} | {own_cell} | {base_cell} | "
                    f"{at_base} | {delta(rates[own_rate], base[base_rate])} |")
    if not rows:
        return []
    return ['', f"Each variant's best rate against the Transformer's (of the rates swept so far, on seed "
            f"{sweep_seed}), and its Δ both at the Transformer's rate and with each model at its own best "
            "rate (paired by seed, t in brackets where there are several):", '',
            "| variant | rates swept | its best rate (loss) | Transformer's best rate (loss) | "
            "Δ at the Transformer's rate | Δ, each at its own best rate |", '|---|---|---|---|---|---|'] + rows


def lambda_rows(groups):
    rows = []
    for label, group in groups.items():
        learned = [r['lambdas'] for r in group['runs'] if r['lambdas']]
        if learned:
            layers = range(len(learned[0]))
            mean = [[sum(l[n][i] for l in learned) / len(learned) for i in (0, 1)] for n in layers]
            rows.append(f"| {label} | " + ' | '.join(f'{a:.2f}, {b:.2f}' for a, b in mean) + ' |')
    if not rows:
        return []
    n = rows[0].count('|') - 2
    return ['', "Final λ per layer (weight on V1, weight on V_n), mean over seeds:", '',
            '| group | ' + ' | '.join(f'layer {i + 1}' for i in range(n)) + ' |',
            '|---' * (n + 1) + '|'] + rows


def domain_rows(groups):
    """Each group's final validation loss per domain (SlimPajama: the paper reports their unweighted mean,
    val_loss), mean over seeds; no row for a group unless each of its runs has them (one-corpus runs do not)."""
    rows, domains = [], None
    for label, group in groups.items():
        means = metrics.mean_domain_losses([r.get('final_val_loss_domains') for r in group['runs']])
        if means:
            domains = domains or list(means)
            rows.append(f"| {label} | " + ' | '.join(f"{means[d]:.4f}" for d in domains) + ' |')
    if not rows:
        return []
    return ['', "Final validation loss per domain, mean over seeds (the table's loss is their unweighted "
            "mean):",
            '', '| group | ' + ' | '.join(domains) + ' |', '|---' * (len(domains) + 1) + '|'] + rows


def scaling_rows(groups):
    """The paper's two headline numbers at our scale: parameters and training tokens ResFormer saves."""
    finals = {label: mean_std([r['final_val_loss'] for r in g['runs']])[0]
              for label, g in groups.items() if g['runs']}
    transformer = [(groups[l]['runs'][0]['params'], finals[l]) for l in finals if l.startswith(BASELINE)]
    fit = loglinear_fit(transformer) if len(transformer) >= 2 else None
    rows, gaps = [], []
    for label, group in groups.items():
        if label.startswith(BASELINE) or label not in finals or group['baseline'] not in finals:
            continue
        params = group['runs'][0]['params']
        matched, extrapolated = parameters_for_loss(transformer, finals[label]) if fit else (None, False)
        fitted = math.exp((finals[label] - fit[0]) / fit[1]) if fit else None
        if fit:
            gaps.append(finals[label] - (fit[0] + fit[1] * math.log(params)))
        steps = crossing_step(mean_curve([r['curve'] for r in group['runs']]), finals[group['baseline']])
        total = group['runs'][0]['settings']['max_iters']
        rows.append(f"| {label} | {params:,} | {finals[label]:.4f} | "
                    f"{'–' if matched is None else f'{matched:,.0f}'}"
                    f"{' (extrapolated)' if extrapolated else ''} | "
                    f"{'–' if matched is None else f'{100 * (1 - params / matched):.1f}%'} | "
                    f"{'–' if fitted is None else f'{fitted:,.0f}'} | "
                    f"{'–' if fitted is None else f'{100 * (1 - params / fitted):.1f}%'} | "
                    f"{'–' if steps is None else f'{100 * (1 - steps / total):.1f}%'} |")
    pooled = []
    if gaps:  # one number for the suite: ResFormer's mean distance below the fitted line, in parameters
        factor = math.exp(sum(gaps) / len(gaps) / fit[1])
        pooled = ['', f"Over all {len(gaps)} sizes, ResFormer's loss lies on average "
                      f"{-sum(gaps) / len(gaps):.4f} below the Transformer's fitted line (slope {fit[1]:.4f} "
                      f"per e-fold of parameters): a Transformer needs {factor:.2f}x the parameters for the "
                      f"same loss, a saving of {100 * (1 - 1 / factor):.1f}%."]
    return ['', "Savings at equal validation loss. *Parameters*, two readings of the Transformer's final "
            "loss against log(parameters) across our sizes, each giving the size a Transformer would need to "
            "match ResFormer's loss (saving = 1 − ResFormer's size / that size): *piecewise*, linear "
            "between neighbouring sizes (extrapolated along the end segment outside them); *fit*, one "
            "least-squares line through every size. *Tokens*: the step at which ResFormer's mean validation "
            "curve first reaches the same-size Transformer's final loss (linear between evaluations, inside "
            "one cosine schedule, so this understates what a shorter schedule would need); saving = 1 − "
            "that step / total steps. The paper: 16.1% parameters, 20.3% tokens (v3: 10.4%, 13.6%).", '',
            '| ResFormer group | parameters | final loss | '
            'Transformer parameters for that loss (piecewise) | parameter saving (piecewise) | '
            'Transformer parameters (fit) | parameter saving (fit) | token saving |',
            '|---|---|---|---|---|---|---|---|'] + rows + pooled


def grad_rows(groups):
    """v5 Sec. 4.3: mean gradient norms of layer 1's W_V and of W_O, each group against its Transformer."""
    def norms(group, key):
        values = [sum(v for k, v in r['mean_grad_norms'].items() if key(k))
                  / sum(1 for k in r['mean_grad_norms'] if key(k))
                  for r in group['runs'] if r['mean_grad_norms']]
        return sum(values) / len(values) if values else None
    rows = []
    for label, group in groups.items():
        base = groups[group['baseline']]
        if label == group['baseline'] or not group['runs'] or not base['runs']:
            continue
        ratios = []
        for key in (lambda k: k == 'blocks.0.attn.c_v.weight', lambda k: k == 'blocks.0.attn.c_proj.weight',
                    lambda k: k.endswith('attn.c_proj.weight')):
            ours, theirs = norms(group, key), norms(base, key)
            ratios.append(f'{ours:.3f} / {theirs:.3f} = {ours / theirs:.2f}×' if ours and theirs else '–')
        for column, quarter in ((1, 'first'), (1, 'last'), (2, 'first'), (2, 'last')):
            ours, theirs = quarter_norm(group, column, quarter), quarter_norm(base, column, quarter)
            ratios.append(f'{ours / theirs:.2f}×' if ours and theirs else '–')
        rows.append(f"| {label} | " + ' | '.join(ratios) + ' |')
    return ['', "Gradient norms before clipping: this group's / the Transformer's, averaged over seeds and "
            "over every logged step (every log_interval steps), then over the first and the last quarter of "
            "those steps alone (v5 Sec. 4.3: about 2× for layer 1's W_V and 1.5× for W_O).", '',
            "| group | layer 1 W_V | layer 1 W_O | W_O, mean over layers | W_V, first quarter | "
            "W_V, last quarter | W_O, first quarter | W_O, last quarter |",
            '|---|---|---|---|---|---|---|---|'] + rows


def quarter_norm(group, column, quarter):
    """Mean gradient norm of layer 1's W_V (column 1) or W_O (column 2) over the first or last quarter of the
    logged steps, over the group's runs; None for summaries that did not record them."""
    values = []
    for run in group['runs']:
        series = run.get('layer1_grad_norms') or []
        part = series[:len(series) // 4] if quarter == 'first' \
            else series[-(len(series) // 4):] if series else []
        values += [row[column] for row in part if row[column] is not None]
    return sum(values) / len(values) if values else None


def kv_rows(groups):
    """Sec. 4.6: the loss against KV-cache size, and how SVFormer's gap to the Transformer changes with
    length; for the value_bank suite, what each context-free value costs and gains at each depth."""
    rows = []
    for label, group in groups.items():
        if group['runs'] and label != group['baseline'] and groups[group['baseline']]['runs']:
            base = groups[group['baseline']]
            gap = (mean_std([r['final_val_loss'] for r in group['runs']])[0]
                   - mean_std([r['final_val_loss'] for r in base['runs']])[0])
            ratio = group['runs'][0]['kv_bytes_per_token'] / base['runs'][0]['kv_bytes_per_token']
            params = group['runs'][0]['params'] / base['runs'][0]['params']
            rows.append(f"| {label} | {ratio:.3f} | {gap:+.4f} | {params:.3f} |")
    return ['', "KV cache and parameters against the Transformer each group is paired with (same length or "
            "depth), and the loss gap (mean final loss − Transformer's):", '',
            '| group | KV bytes ratio | loss gap | parameters ratio |', '|---|---|---|---|'] + rows


def successor_rows(groups):
    """Each successor against Identity ResFormer of its depth, and against the Transformer widened to its
    parameters where there is one (the widened group of its depth whose parameters are nearest its own,
    within 1%), paired seed by seed; its parameters and KV cache against the Transformer's."""
    def against(label, other):
        if other is None or not groups[other]['runs']:
            return '– | – | –'
        mean, t, n = paired_difference(groups, [(1, label)], [(1, other)])
        if n == 0:
            return '– | – | –'
        return f"{mean:+.4f} | {fmt_t(t, n)} | {VERDICT_WORDS[verdict(t, n)] if n > 1 else '–'}"

    rows = []
    for label, group in groups.items():
        depth = label.rsplit(' ', 1)[-1]
        if not group['runs'] or label.startswith((BASELINE, 'resformer_identity')):
            continue
        base, params = groups[group['baseline']], group['runs'][0]['params']
        wide = [other for other, g in groups.items() if other.startswith(f'{BASELINE} ffn=')
                and other.endswith(f' {depth}') and g['runs']
                and abs(g['runs'][0]['params'] / params - 1) < SUCCESSOR_MATCHED]
        matched = min(wide, key=lambda other: abs(groups[other]['runs'][0]['params'] - params), default=None)
        ratios = ('–', '–') if not base['runs'] else (
            f"{params / base['runs'][0]['params']:.4f}",
            f"{group['runs'][0]['kv_bytes_per_token'] / base['runs'][0]['kv_bytes_per_token']:.2f}")
        rows.append(f"| {label} | {ratios[0]} | {ratios[1]} | "
                    f"{against(label, f'resformer_identity {depth}')} | {against(label, matched)} | "
                    f"{matched or 'none (adds ≤ 1%)'} |")
    return ['', "Each successor against Identity ResFormer of its depth and against a Transformer of its "
            "parameters (Δ: mean final loss difference, paired by seed; the verdict as above); parameters "
            "and KV bytes a token as ratios to the Transformer's:", '',
            '| group | parameters ×T | KV ×T | Δ vs Identity ResFormer | t | verdict | Δ vs a Transformer '
            'of its parameters | t | verdict | that Transformer |',
            '|---|---|---|---|---|---|---|---|---|---|'] + rows


def plot(suite, groups, out_dir):
    """PNG plots, when matplotlib is installed: validation curves, and each suite's own view."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    done = {label: g for label, g in groups.items() if g['runs']}
    if not done:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, group in done.items():
        curve = mean_curve([r['curve'] for r in group['runs']])
        ax.plot([s for s, _ in curve[1:]], [l for _, l in curve[1:]], label=label, lw=1)
    ax.set(xlabel='step', ylabel='validation loss (mean over seeds)', title=f'{suite}: validation curves')
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / 'curves.png', dpi=120)
    plt.close(fig)
    names = ['curves.png']
    if suite in ('variants', 'depth', 'value_embed', 'value_bank', 'controls'):
        names.append(plot_deltas(suite, groups, out_dir, plt))
    series = relative_series(groups)
    if series and relative_loss.plot(series, out_dir / 'relative.png',
                                     f"{suite}: relative training loss (mean ± std over seeds)"):
        names.append('relative.png')
    if suite in ('scaling', 'lr', 'kv', 'value_bank'):
        fig, ax = plt.subplots(figsize=(6, 4))
        series = {}
        for label, group in done.items():
            family = label.split(' ')[0]
            x = {'scaling': group['runs'][0]['params'], 'lr': group['runs'][0]['settings']['learning_rate'],
                 'kv': group['runs'][0]['kv_bytes_per_token'],
                 'value_bank': group['runs'][0]['kv_bytes_per_token']}[suite]
            if suite == 'kv':
                family = label  # one point per variant and length
            if suite == 'value_bank':
                family = label.rsplit(' ', 1)[0]  # a line per variant, from its 4-layer to its 8-layer point
            mean, std = mean_std([r['final_val_loss'] for r in group['runs']])
            series.setdefault(family, []).append((x, mean, std))
        for family, points in series.items():
            points.sort()
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                        marker='o', label=family, capsize=3)
        ax.set_xscale('log')
        ax.set(xlabel={'scaling': 'parameters', 'lr': 'peak learning rate', 'kv': 'KV bytes per token',
                       'value_bank': 'KV-cache bytes per token (16-bit)'}[suite],
               ylabel='final validation loss',
               title=f'{suite}: one line per variant, across depths' if suite == 'value_bank' else suite)
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out_dir / f'{suite}.png', dpi=120)
        plt.close(fig)
        names.append(f'{suite}.png')
    return names


def relative_curves(groups):
    """{label: [relative curve per seed]}: each group's relative training loss (lab/relative_loss.py)
    against the Transformer of the same seed and settings, over the seeds whose two runs both have a
    training curve."""
    curves = {}
    for label, group in groups.items():
        base = groups[group['baseline']]
        trained = {seed: run['train_curve'] for run, seed in zip(base['runs'], base['seeds'])
                   if run.get('train_curve')}
        rels = [relative_loss.relative(run['train_curve'], trained[seed])
                for run, seed in zip(group['runs'], group['seeds']) if run.get('train_curve') and seed in trained]
        if label != group['baseline'] and rels:
            curves[label] = rels
    return curves


def relative_series(groups):
    """{label: [(step, mean, std)]}: relative_curves' mean ± std over the seeds, at the steps all have."""
    series = {}
    for label, rels in relative_curves(groups).items():
        steps = sorted(set.intersection(*({s for s, _ in rel} for rel in rels)))
        at = [dict(map(tuple, rel)) for rel in rels]
        series[label] = [(s, *mean_std([a[s] for a in at])) for s in steps]
    return series


def critical_point(rels):
    """ICLR Sec. 4.6's critical point, the step where the Transformer overtakes the method, from the
    seeds' relative curves: (the mean curve's crossing, each seed's), each relative_loss.crossing's (for
    good, not a dip). A crossing is called only where the mean and every seed cross: else (None, ...)."""
    steps = sorted(set.intersection(*({s for s, _ in rel} for rel in rels)))
    at = [dict(map(tuple, rel)) for rel in rels]
    mean = relative_loss.crossing([[s, sum(a[s] for a in at) / len(at)] for s in steps])
    seeds = [relative_loss.crossing(rel) for rel in rels]
    return (mean if mean is not None and None not in seeds else None), seeds


def no_crossing(groups, label, seeds):
    """'no crossing in N steps', N the run's length, naming the seeds that do cross on their own."""
    steps = groups[label]['runs'][0]['train_curve'][-1][0]
    crossed = [f'{s:,.0f}' for s in seeds if s is not None]
    return f"no crossing in {steps:,} steps" + (
        f" ({len(crossed)} of {len(seeds)} seeds cross: {', '.join(crossed)})" if crossed else '')


def crossing_cell(groups, label, rels):
    """A table cell: the critical point with its seeds' range, or no_crossing."""
    mean, seeds = critical_point(rels)
    if mean is None:
        return no_crossing(groups, label, seeds)
    return f"{mean:,.0f}" + (f" (seeds {min(seeds):,.0f}–{max(seeds):,.0f})" if len(seeds) > 1 else '')


def relative_rows(groups):
    """The paper's metric at the end: each group's relative training loss over the last window (mean ±
    std over seeds), and the step where the Transformer overtakes it for good (critical_point)."""
    rows, series = [], relative_series(groups)
    for label, rels in relative_curves(groups).items():
        points = series[label]
        rows.append(f"| {label} | {len(rels)} | {points[-1][1]:+.4f} ± {points[-1][2]:.4f} at {points[-1][0]} | "
                    f"{crossing_cell(groups, label, rels)} |")
    if not rows:
        return []
    return ['', "The paper's metric: each group's training loss minus the same-seed Transformer's, each "
            f"smoothed over {relative_loss.WINDOW} steps and placed at its window's first step, as the "
            "official plot_relative_loss.py does ([lab/relative_loss.py](../../lab/relative_loss.py); below "
            "zero is ahead): its last point (the mean over the last window), and the step where the "
            "Transformer overtakes the group for good, called only where the mean curve and every seed's "
            f"rise through zero and stay above it for {relative_loss.WINDOW} steps or more, with the seeds' "
            "range:", '', "| group | seeds | relative training loss (mean ± std) | "
            "Transformer overtakes at step |", '|---|---|---|---|'] + rows


def critical_point_rows(groups):
    """ICLR Fig. 14 Right at the lengths suite's lengths: the step where the Transformer overtakes SVFormer
    at each length (critical_point), a line through each seed's last tenth where none crosses
    (relative_loss.extrapolated_crossing; printed only with the seeds' range, and only where every seed's
    line rises), and relative_loss.growth's exponential fit through the observed crossings, as the paper
    draws it (never through extrapolated ones)."""
    rows, observed = [], []
    for label, rels in relative_curves(groups).items():
        if not label.startswith('svformer T='):
            continue
        length = int(label.split('=')[1])
        mean, seeds = critical_point(rels)
        if mean is not None:
            observed.append((length, mean))
            rows.append(f"| {length} | {crossing_cell(groups, label, rels)} | – |")
            continue
        ahead = [relative_loss.extrapolated_crossing(rel) for rel in rels]
        line = (f"{sum(ahead) / len(ahead):,.0f} (seeds {min(ahead):,.0f}–{max(ahead):,.0f})"
                if len(ahead) > 1 and None not in ahead else
                "none: " + ("one seed, no range" if len(ahead) == 1 else
                            f"{ahead.count(None)} of {len(ahead)} seeds' lines do not rise"))
        rows.append(f"| {length} | {no_crossing(groups, label, seeds)} | {line} |")
    if not rows:
        return []
    fit = []
    if len(observed) >= 2:
        a, b = relative_loss.growth(observed)
        fit = ['', f"The least-squares fit through the observed crossings: step = exp({a:.3f} + {b:.6f} · T)."]
    return ['', "ICLR Fig. 14 Right at these lengths: the step where the Transformer overtakes SVFormer for "
            "good (as in the table above), against the length T; where it does not within the run, where a "
            "least-squares line through each seed's last tenth of its relative curve would reach zero (the "
            "mean of the seeds' steps and their range; a line through the cosine schedule's tail, so a "
            "guess, not a measurement):", '',
            '| T | critical point | each seed\'s line reaches zero at |', '|---|---|---|'] + rows + (
            fit or ['', f"No exponential fit: {len(observed)} of {len(rows)} lengths cross within the run "
                        "(the paper's fit needs two or more)."])


def configs_naming(suite, scale):
    """The config files whose header gives `lab/reproduce.py <suite>` (at the default scale, or with
    --scale=<scale>) as the CPU counterpart of their runs: the same experiment at full scale (or, for a
    --scale, at its shape), for the suite's README."""
    command = re.compile(rf"lab/reproduce\.py {suite}(?!\w)(.*)")
    return sorted(path.name for path in (REPO / 'config').glob('*.py')
                  if any((re.search(r'--scale=(\w+)', m[1]) or [None, 'cpu'])[1] in ('cpu', scale)
                         for m in command.finditer(path.read_text())))


def provenance(suite, scale, seeds, results_dir, today=None):
    """One line: how many runs the tables hold and which commits trained them, and how many summaries were
    made by code that trains differently (left out of the tables)."""
    commits, stale, total = {}, 0, 0
    for _, name, settings in suite_runs(suite, scale, seeds):
        path = results_dir / 'runs' / f'{name}.json'
        state, total = summary_state(path, settings, today), total + 1
        if state == 'done':
            made_by = json.loads(path.read_text()).get('commit', 'unknown')
            commits[made_by] = commits.get(made_by, 0) + 1
        stale += state == 'stale'
    line = (f"{sum(commits.values())} of {total} runs are in the tables, trained by commit "
            + (', '.join(f'{c} ({n})' for c, n in commits.items()) or '–') + '.')
    if stale:
        line += (f" **{stale} more were made by code that trains differently from this commit's** "
                 f"(their probe losses differ) and are left out: "
                 f"`python lab/reproduce.py {suite} --retrain` retrains them.")
    return line


def plot_deltas(suite, groups, out_dir, plt):
    """deltas.png: each group's validation loss minus the same-seed Transformer's over training, mean and the
    band of ± one standard deviation over seeds. Below zero, the variant is ahead at that step."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, group in groups.items():
        base = groups[group['baseline']]
        pairs = [(run, base['runs'][base['seeds'].index(seed)])
                 for run, seed in zip(group['runs'], group['seeds']) if seed in base['seeds']]
        if label == group['baseline'] or not pairs:
            continue
        curves = [[[s, loss - dict(map(tuple, b['curve']))[s]] for s, loss in r['curve']
                   if s in dict(map(tuple, b['curve']))] for r, b in pairs]
        steps = [s for s, _ in mean_curve(curves)][1:]  # from the first evaluation after step 0
        stats = [mean_std([dict(map(tuple, c))[s] for c in curves]) for s in steps]
        line, = ax.plot(steps, [m for m, _ in stats], label=label, lw=1.2)
        ax.fill_between(steps, [m - sd for m, sd in stats], [m + sd for m, sd in stats],
                        color=line.get_color(), alpha=0.15)
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xlabel='step', ylabel="validation loss − Transformer's (same seed)",
           title=f'{suite}: each variant against the Transformer (mean ± std over seeds)')
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / 'deltas.png', dpi=120)
    plt.close(fig)
    return 'deltas.png'


ANALYSED = ('variants', 'depth')  # suites whose checkpoints get the attention analysis once all are trained


def analyse(suite, scale, seeds, runs_dir, out_dir):
    """analyze.py on every checkpoint of the suite (seeds averaged), at the validation documents' starts, into
    <out_dir>/analysis/; only once every run of the suite has its checkpoint here, and never twice."""
    dirs = [runs_dir / name for _, name, _ in suite_runs(suite, scale, seeds)]
    if (out_dir / 'analysis' / 'metrics.json').exists() or not all((d / 'ckpt.pt').exists() for d in dirs):
        return
    command = [sys.executable, str(REPO / 'lab' / 'analyze.py'), *map(str, dict.fromkeys(dirs)),
               f"--seq_len={SCALES[scale]['block_size']}", '--num_seqs=4', f"--out={out_dir / 'analysis'}"]
    print(f"attention analysis of {len(dirs)} checkpoints into {out_dir / 'analysis'}", flush=True)
    if subprocess.run(command, cwd=REPO).returncode != 0:
        print("reproduce.py: the attention analysis failed (see above); the tables are written",
              file=sys.stderr)


def write_report(suite, scale, seeds, results_dir, today=None):
    groups = load_groups(suite, scale, seeds, results_dir, today)
    out_dir = results_dir / (suite if scale == 'cpu' else f'{suite}_{scale}')
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [SCALES[scale] | settings for _, settings, _ in suite_groups(suite, scale)]
    shared = {k: v for k, v in runs[0].items() if k != 'variant' and all(r.get(k) == v for r in runs)}
    configs = ', '.join(f'[`config/{c}`](../../config/{c})' for c in configs_naming(suite, scale))
    lines = [f"# Suite `{suite}` (scale `{scale}`)", '',
             f"Written by `python lab/reproduce.py {suite}{'' if scale == 'cpu' else f' --scale={scale}'}` "
             f"from the run summaries in `results/runs/`. Settings every group shares: "
             + ', '.join(f'{k}={v}' for k, v in shared.items())
             + f" (the rest as each label says). Seeds {', '.join(map(str, seeds))}; Δ and t pair each run "
             "with the Transformer of the same seed and settings; the verdict is 'ahead' or 'behind' where "
             "|t| is above the two-sided 5% critical value of Student's t for seeds − 1 degrees of freedom "
             "(4.303 for 3 seeds, 2.571 for 6), else 'unresolved'; 'minutes' is wall time summed over the "
             "group's runs. What they show "
             "against the paper: [results/README.md](../README.md). "
             + (f"Configs whose header names this suite as their CPU counterpart: {configs}."
                if configs else "No config in `config/` names this suite."), '',
             provenance(suite, scale, seeds, results_dir, today),
             ''] + group_rows(groups)
    lines += relative_rows(groups)
    lines += lambda_rows(groups)
    lines += domain_rows(groups)
    extra = {'variants': grad_rows, 'depth': grad_rows, 'lr': grad_rows, 'scaling': scaling_rows,
             'kv': kv_rows, 'value_bank': kv_rows, 'controls': grad_rows, 'optimizer': optimizer_rows,
             'muon_lr': muon_lr_rows, 'lengths': critical_point_rows, 'successors': successor_rows}
    lines += extra.get(suite, lambda g: [])(groups)
    lines += ['', *(f'![{name}]({name})' for name in plot(suite, groups, out_dir))]
    (out_dir / 'README.md').write_text('\n'.join(lines) + '\n')
    return out_dir / 'README.md'


# -----------------------------------------------------------------------------
# verdicts: every claim the documents make about the runs, checked against them

CLAIMED_IN = ('docs/experiments.md', 'results/README.md', 'README.md')
# A claim is a code span naming a suite's results folder (results/<suite> or results/<suite>_<scale>),
# groups of that suite (a label, or the start of exactly one label, up to a space) and the paired t of each
# comparison: `lambdas: λ=2 < vanilla (t -7.7)` (λ = 2's loss resolved below the Transformer's),
# `placement: layers 2-4 L8 < layers 4-8 L8 < layers 6-8 (Sparse) L8 (t -7.7, -4.5)` (a ranking: every
# neighbouring pair resolved), `lambdas: λ=1 vs λ=2 unresolved (t 0.2)`. A side may be a difference of
# groups, seed by seed, for an interaction: `lengths: svformer T=512 − vanilla T=512 vs svformer T=64 −
# vanilla T=64 unresolved (t -2.4)`. verdict decides.
CLAIM = re.compile(r'`(\w+): ([^`]+) \(t ([-−0-9., ]+)\)`')


def claim_problem(folder, body, printed, seeds, results_dir, today, loaded):
    """What is wrong with one claim against the run files, or None. loaded caches load_groups per suite."""
    suites = {suite if scale == 'cpu' else f'{suite}_{scale}': (suite, scale)
              for suite in SUITES for scale in SCALES}
    if folder not in suites:
        return f"{folder!r} is no suite's results folder (one of: {', '.join(SUITES)}, or <suite>_bpe)"
    if folder not in loaded:
        suite, scale = suites[folder]
        loaded[folder] = load_groups(suite, scale, seeds, results_dir, today)
    groups = loaded[folder]
    if body.endswith(' unresolved') and ' vs ' in body:
        names, relations = body.removesuffix(' unresolved').split(' vs '), ['unresolved']
    else:
        parts = re.split(r' ([<>]) ', body)
        names, relations = parts[::2], parts[1::2]
    if len(names) < 2 or len(relations) != len(names) - 1:
        return "write `suite: A < B (t ...)`, `A > B`, `A < B < C (t ..., ...)` or `A vs B unresolved`"
    sides = []  # per side: [(sign, label)]
    for side in names:
        terms = []
        for k, name in enumerate(side.split(' − ')):
            matches = [label for label in groups if label == name] or \
                      [label for label in groups if label.startswith(name + ' ')]
            if len(matches) != 1:
                return (f"{name!r} names {len(matches)} groups of {folder}"
                        + (f": {', '.join(matches)}" if matches else f" (its groups: {', '.join(groups)})"))
            terms.append((1 if k == 0 else -1, matches[0]))
        sides.append(terms)
    values = printed.replace('−', '-').split(', ')
    if len(values) != len(relations):
        return f"{len(relations)} comparison(s) but {len(values)} t value(s)"
    for a, b, relation, value in zip(sides, sides[1:], relations, values):
        mean, t, n = paired_difference(groups, a, b)
        a, b = (' − '.join(label for _, label in side).join('()' if len(side) > 1 else ('', ''))
                for side in (a, b))
        decided = verdict(t, n)
        if decided != relation:
            return (f"{a} − {b}: {mean:+.4f}, t {fmt_t(t, n)} over {n} seeds is '{decided}', not "
                    f"'{relation}' (two-sided 5%: |t| above {t_critical(max(n - 1, 1)):.3f})")
        # t rounded to the printed digits, and to no fewer than fmt_t's (−4.26, never −4.3)
        digits = len(value.partition('.')[2])
        if value != f'{t:.{digits}f}' or digits < len(fmt_t(t, n).partition('.')[2]):
            return f"{a} − {b}: t is {fmt_t(t, n)}, printed {value}"
    return None


def paired_difference(groups, a, b):
    """(mean of A − B, paired t, seeds) over the seeds every group named has, where a side is
    [(sign, label)]: a group's final loss, or a signed sum of them seed by seed."""
    losses = {label: {s: r['final_val_loss'] for r, s in zip(groups[label]['runs'], groups[label]['seeds'])}
              for _, label in a + b}
    seeds = sorted(set.intersection(*(set(loss) for loss in losses.values())))
    if not seeds:
        return float('nan'), float('nan'), 0
    a_loss, b_loss = ([sum(sign * losses[label][s] for sign, label in side) for s in seeds] for side in (a, b))
    mean, _, t = paired_t(a_loss, b_loss)
    return mean, t, len(seeds)


def check_verdicts(paths, seeds, results_dir):
    """Every claim in the files at paths against the run files (seeds as --seeds gives them):
    (['file:line: claim: problem'], the number of claims read)."""
    today, loaded, problems, count = stored_probes(results_dir), {}, [], 0
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            for match in CLAIM.finditer(line):
                count += 1
                problem = claim_problem(*match.groups(), seeds, results_dir, today, loaded)
                if problem:
                    where = path.relative_to(REPO) if Path(path).is_relative_to(REPO) else path
                    problems.append(f"{where}:{number}: `{match[0][1:-1]}`: {problem}")
    return problems, count


# -----------------------------------------------------------------------------

def main(argv=None):
    parser = cli.ArgumentParser(prog='lab/reproduce.py', description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('suite', nargs='?', help=f"all (in this order), or one of: {', '.join(SUITES)}")
    parser.add_argument('--scale', default='cpu', choices=list(SCALES),
                        help="cpu: train.py's default shape, minutes a run on a laptop; gpu: near the "
                             "paper's 82M shape; bpe: the cpu shape on GPT-2 BPE Shakespeare "
                             "(default: %(default)s)")
    parser.add_argument('--seeds', type=int, default=3,
                        help='seeds per group: 1337, 1338, ... (default: %(default)s)')
    parser.add_argument('--runs_dir', default='out/reproduce',
                        help='where runs train: checkpoints and logs, not committed (default: %(default)s)')
    parser.add_argument('--results_dir', default='results',
                        help='run summaries and suite reports, committed (default: %(default)s)')
    parser.add_argument('--gpus', type=int, default=torch.cuda.device_count(),
                        help='runs in parallel, one per GPU (default: the GPUs visible, %(default)s)')
    parser.add_argument('--jobs', type=int, default=1,
                        help="runs in parallel on a CPU, sharing its cores; OMP_NUM_THREADS, if set, is each "
                             "run's thread count (default: %(default)s)")
    parser.add_argument('--only', metavar='PATTERN', default='*',
                        help="train only the groups whose label matches PATTERN (fnmatch: 'vanilla*'); the "
                             "tables still show every finished group (default: %(default)s)")
    parser.add_argument('--report_only', action='store_true',
                        help="write the tables from finished runs only, training nothing (not even the "
                             "probes: a summary is stale where its probe differs from those of the other "
                             "summaries of its probe run)")
    parser.add_argument('--check_verdicts', action='store_true',
                        help=f"check every claim of {', '.join(CLAIMED_IN)} (`suite: A < B (t ...)`) "
                             "against the run files; exit 1 naming file:line where one says otherwise")
    parser.add_argument('--dry_run', action='store_true',
                        help='list the runs and the state of each: todo, done, stale or unreadable')
    parser.add_argument('--retrain', action='store_true',
                        help='also retrain runs whose summary was made by code that trains differently '
                             '(stale)')
    parser.add_argument('--train_curves', action='store_true',
                        help='also retrain finished runs whose summary has no training curve (trained before '
                             'train.py logged each interval\'s mean training loss); the summary keeps the '
                             'final loss it replaces, to compare')
    parser.add_argument('--check', metavar='NAME', default=None,
                        help=f'retrain the finished run NAME into <runs_dir>/check/ and compare its final '
                             f'loss with the committed one (tolerance {CHECK_TOLERANCE})')
    args = parser.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"reproduce.py: --jobs={args.jobs}; use at least 1")
    if args.seeds < 1:
        raise SystemExit(f"reproduce.py: --seeds={args.seeds}; use at least 1 (3 or more for a t-statistic)")
    if args.gpus < 0:
        raise SystemExit(f"reproduce.py: --gpus={args.gpus}; use 0 or more (0 or 1: --jobs runs at a time)")
    seeds = [1337 + k for k in range(args.seeds)]
    results_dir, runs_dir = REPO / args.results_dir, REPO / args.runs_dir  # relative to the repository
    if args.check_verdicts:
        problems, count = check_verdicts([REPO / f for f in CLAIMED_IN], seeds, results_dir)
        print('\n'.join(problems) if problems else
              f"{count} claims in {', '.join(CLAIMED_IN)}: each agrees with the run files")
        raise SystemExit(1 if problems else 0)
    if args.suite is None:
        raise SystemExit("reproduce.py: name a suite (or all), or give --check_verdicts")
    if args.suite != 'all' and args.suite not in SUITES:
        raise SystemExit(f"reproduce.py: unknown suite {args.suite!r}; "
                         f"choose one of: all, {', '.join(SUITES)}")
    suites = SUITES if args.suite == 'all' else [args.suite]
    labels = [label for suite in suites for label, _, _ in suite_groups(suite, args.scale)]
    if not any(fnmatch.fnmatchcase(label, args.only) for label in labels):
        raise SystemExit(f"reproduce.py: --only={args.only!r} matches no group of {args.suite} (its groups: "
                         + ', '.join(map(repr, labels[:8])) + (', ...' if len(labels) > 8 else '')
                         + "); --dry_run lists them all")
    for name, path in (('results_dir', results_dir), ('runs_dir', runs_dir)):
        if path.exists() and not path.is_dir():
            raise SystemExit(f"reproduce.py: --{name}={path} is a file, not a folder; pick another --{name}")

    signal.signal(signal.SIGTERM, stop)
    if args.check:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', str(os.cpu_count() or 1)))
        runs = [run for suite in suites for run in suite_runs(suite, args.scale, seeds)]
        raise SystemExit(0 if check(args.check, runs, runs_dir, results_dir, env) else 1)
    failures = {}
    today = stored_probes(results_dir) if args.report_only else None  # else probe, training today's
    for suite in suites:
        runs = [run for run in suite_runs(suite, args.scale, seeds) if fnmatch.fnmatchcase(run[0], args.only)]
        if args.dry_run:
            for label, name, settings in runs:
                state = summary_state(results_dir / 'runs' / f'{name}.json', settings)
                print(f"{state:10s} {suite}: {label}  ({name})")
            continue
        if not args.report_only:
            print(f"suite {suite} ({args.scale}):")
            failures |= run_suite(runs, runs_dir, results_dir, args.gpus, args.jobs, args.retrain,
                                  args.train_curves)
        if stopping.is_set():
            raise SystemExit(143)
        report = write_report(suite, args.scale, seeds, results_dir, today)
        print(f"wrote {report.relative_to(REPO) if report.is_relative_to(REPO) else report}")
        paths = {name: results_dir / 'runs' / f'{name}.json' for _, name, _ in suite_runs(suite, args.scale, seeds)}
        broken = [paths[name] for _, name, settings in suite_runs(suite, args.scale, seeds)
                  if summary_state(paths[name], settings, today) == 'unreadable']
        if broken:  # one line: the report leaves them out
            print(f"reproduce.py: {broken[0]}" + (f" and {len(broken) - 1} more" if broken[1:] else '')
                  + " unreadable (cut short, or not a run summary), left out of the tables; `python "
                  f"lab/reproduce.py {suite}{'' if args.scale == 'cpu' else f' --scale={args.scale}'}` "
                  "retrains them", file=sys.stderr)
        if suite in ANALYSED and not args.report_only:
            analyse(suite, args.scale, seeds, runs_dir, report.parent)
    if failures:
        raise SystemExit(f"reproduce.py: {len(failures)} run(s) failed, see <runs_dir>/<name>/train.out: "
                         + '; '.join(f'{n}: {e}' for n, e in failures.items()))


if __name__ == '__main__':
    main()
