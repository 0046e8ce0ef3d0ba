"""
train.py's settings checked before anything touches out_dir (check), and the model they describe
(model_config).
"""
import math
import os
from dataclasses import fields
from types import SimpleNamespace

import torch

from ablations import AblationConfig


FLOAT32_MAX = torch.finfo(torch.float32).max


MAX_LAYERS = 1024


def check(config, world_size):
    """End train.py with one line at the first setting out of range or combination that cannot run (a
    step's passes that do not split over the ranks, wandb missing, several SLURM tasks without torchrun),
    before anything touches out_dir: a run that cannot start changes nothing on disk."""
    check_settings(config, world_size)
    if config['wandb_log']:
        import_wandb()


def check_settings(config, world_size=1):
    """End train.py with one line at the first setting out of range, before anything touches out_dir: a run
    that cannot start changes nothing on disk."""
    c = SimpleNamespace(**config)
    tasks = int(os.environ.get('SLURM_NTASKS', '1') or 1)
    for ok, problem in [
        (c.init_from in ('scratch', 'resume', 'auto'),
         f"init_from={c.init_from!r}; use 'scratch', 'resume' or 'auto' (resume where out_dir holds a "
         f"checkpoint, else scratch)"),
        (not (c.overwrite and c.init_from != 'scratch'),
         f"overwrite=True starts over and init_from={c.init_from!r} continues; pick one"),
        # a depth no config means: it would pass the size check at a small width and then build modules
        # for minutes in silence
        (not isinstance(c.n_layer, int) or c.n_layer <= MAX_LAYERS,
         f"n_layer={c.n_layer}; the paper's deepest model has 24 layers, and building more than "
         f"{MAX_LAYERS} takes minutes before anything runs: use at most {MAX_LAYERS}"),
        (c.save_checkpoint or c.init_from == 'scratch',
         f"save_checkpoint=False with init_from={c.init_from!r} would continue a run and save none of "
         f"it; drop one"),
        # srun python train.py: every SLURM task would train alone on GPU 0, silently
        (tasks <= 1 or 'RANK' in os.environ,
         f"{tasks} SLURM tasks but no torchrun: each would train alone; start one task per node with "
         f"`srun --ntasks-per-node=1 torchrun --nproc_per_node=8 train.py ...` (docs/training.md)"),
        (c.batch_size >= 1, f"batch_size={c.batch_size}; use 1 or more sequences a pass"),
        (c.block_size >= 1, f"block_size={c.block_size}; use 1 or more tokens"),
        (c.gradient_accumulation_steps >= 1,
         f"gradient_accumulation_steps={c.gradient_accumulation_steps}; use 1 or more"),
        (c.gradient_accumulation_steps % world_size == 0,
         f"gradient_accumulation_steps={c.gradient_accumulation_steps} passes a step do not split over "
         f"{world_size} ranks; use a multiple of {world_size} (nanoGPT's meaning: all ranks together)"),
        (c.ckpt_interval >= 0 and c.max_time >= 0,
         f"ckpt_interval={c.ckpt_interval}, max_time={c.max_time}; use 0 (off) or more"),
        # a depth no config means: an evaluation step list, a progress bar, an estimate are all sized by it
        (c.max_iters <= 10 ** 9, f"max_iters={c.max_iters}; use at most 10**9 steps"),
        (c.max_iters >= 0, f"max_iters={c.max_iters}; use 0 (evaluate only) or more steps"),
        (c.eval_interval >= 1, f"eval_interval={c.eval_interval}; use 1 or more steps"),
        (c.log_interval >= 1, f"log_interval={c.log_interval}; use 1 or more steps"),
        (c.eval_iters >= 1, f"eval_iters={c.eval_iters}; use 1 or more validation batches"),
        (c.data_order in ('auto', 'random', 'epoch', 'epochs'),
         f"data_order={c.data_order!r}; use 'auto', 'random', 'epoch' or 'epochs'"),
        (0 <= c.beta1 < 1 and 0 <= c.beta2 < 1, f"beta1={c.beta1}, beta2={c.beta2}; use values in [0, 1)"),
        # AdamW's first step moves each weight by up to learning_rate/(1-beta1) (its bias correction): beyond
        # float32's range that is inf and the model is lost at once; smaller rates that are still too high
        # stop on a NaN loss.
        (0 < c.learning_rate < FLOAT32_MAX * (1 - c.beta1),
         f"learning_rate={c.learning_rate}; use a rate above 0 with learning_rate/(1-beta1) below float32's "
         f"{FLOAT32_MAX:.3g}"),
        (0 <= c.min_lr <= c.learning_rate,
         f"min_lr={c.min_lr}; use a value from 0 to learning_rate={c.learning_rate}"),
        (0 <= c.warmup_iters <= c.lr_decay_iters,
         f"warmup_iters={c.warmup_iters}, lr_decay_iters={c.lr_decay_iters}; "
         f"use 0 <= warmup_iters <= lr_decay_iters"),
        (0 <= c.weight_decay < math.inf and 0 <= c.grad_clip < math.inf,
         f"weight_decay={c.weight_decay}, grad_clip={c.grad_clip}; use finite values, 0 or more"),
        (not c.muon or hasattr(torch.optim, 'Muon'),
         f"muon=True needs torch.optim.Muon, in torch 2.9 and later (this is torch "
         f"{torch.__version__}); upgrade torch, or train with AdamW alone (muon=False)"),
        (0 < c.muon_lr < math.inf and c.muon_adjust_lr in ('original', 'match_rms_adamw'),
         f"muon_lr={c.muon_lr}, muon_adjust_lr={c.muon_adjust_lr!r}; use a finite rate above 0, and "
         f"'original' or 'match_rms_adamw'"),
        (0 <= c.peak_tflops < math.inf,
         f"peak_tflops={c.peak_tflops}; use 0 (look it up) or the accelerator's peak"),
        (lr_scales_ok(c.lr_scales),
         f"lr_scales={c.lr_scales!r}; use [parameter name, multiplier] pairs, each name once and each "
         f"multiplier a finite number, 0 or more: [['blocks.0.attn.c_v.weight', 2.0], ...]"),
        (0 <= c.seed < 2 ** 64, f"seed={c.seed}; use an integer from 0 to 2**64 - 1"),  # torch.manual_seed's
    ]:
        if not ok:
            raise SystemExit(f"train.py: {problem}")


def lr_scales_ok(lr_scales):
    names = [pair[0] for pair in lr_scales if isinstance(pair, (list, tuple)) and len(pair) == 2]
    return (len(names) == len(lr_scales) == len(set(names)) and all(isinstance(n, str) for n in names)
            and all(isinstance(m, (int, float)) and not isinstance(m, bool) and 0 <= m < math.inf
                    for _, m in lr_scales))


def model_config(config, vocab_size):
    """The AblationConfig of train.py's settings, its vocabulary vocab_size padded to a multiple of 64
    (faster matmuls); a bad setting ends train.py with one line."""
    args = {f.name: config[f.name] for f in fields(AblationConfig) if f.name in config}
    try:
        return AblationConfig(**args | {'vocab_size': -(-vocab_size // 64) * 64})
    except (TypeError, ValueError) as e:
        raise SystemExit(f"train.py: bad model settings: {e}")


def import_wandb():
    """Whether wandb imports (only when wandb_log asks for it): one line if not."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise SystemExit("train.py: wandb_log=True needs wandb; pip install wandb, "
                         "or drop --wandb_log") from None
