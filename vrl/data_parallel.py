"""
DistributedDataParallel's options for our model, and the end-of-run check that the replicas agree.
"""
import inspect

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_options(model):
    """DDP's keyword arguments for model: gradient_buckets, and buffers that are never synced."""
    return {**buffer_sync_off(inspect.signature(DDP).parameters), **gradient_buckets(model)}


def buffer_sync_off(ddp_parameters):
    """DDP's keyword for not syncing buffers before every forward (ours, the RoPE table and fixed λ,
    never change): recent torch's forward_sync_buffers, which deprecates broadcast_buffers, older
    torch's only one."""
    return {'forward_sync_buffers' if 'forward_sync_buffers' in ddp_parameters
            else 'broadcast_buffers': False}


def gradient_buckets(model):
    """DDP's gradient buckets: each about one block's fp32 gradients (DDP's default 25 MB at the least), and
    the gradients kept as views into them. Compiled, DDPOptimizer cuts the graph at every bucket: at 1.6B,
    25 MB buckets would make ~270 pieces, one block's make ~26, and each block's all-reduce still overlaps the
    backward of the block below. As views, the gradients need no second copy (6.7 GB at 1.6B)."""
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return {'bucket_cap_mb': max(25, 4 * block / 2 ** 20), 'gradient_as_bucket_view': True}


def replicas_agree(model):
    """The line that says how far the ranks' weights are apart (replicas_differ_by)."""
    return (f"weights across {torch.distributed.get_world_size()} ranks differ by at most "
            f"{replicas_differ_by(model):.3g}")


def replicas_differ_by(model):
    """The most any weight differs across the ranks. DDP keeps the replicas identical by construction: checked
    once, cheaply, at the end."""
    weights = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    highest, lowest = weights.clone(), weights.clone()
    torch.distributed.all_reduce(highest, op=torch.distributed.ReduceOp.MAX)
    torch.distributed.all_reduce(lowest, op=torch.distributed.ReduceOp.MIN)
    return (highest - lowest).max().item()
