"""
The node check's probe of each GPU and of the links between them (lab/bench.py --node_check runs it under
torchrun, one rank a GPU, before any training run): each rank times a matmul on its own GPU, alone, then
all ranks time an all-reduce together, and rank 0 writes every rank's numbers as JSON. On CPU ranks (gloo)
it runs the same in float32 at a small size: that checks the plumbing, not the machine.

    torchrun --standalone --nproc_per_node=8 lab/node_probe.py out/node_check/probe.json cuda

Numbers, as NCCL's own tests define them: a matmul of two n x n matrices is 2 n^3 FLOPs; an all-reduce of
B bytes over N ranks moves 2 (N - 1) / N x B through each rank's slowest link, so its bus bandwidth is that
over the time (the figure comparable across rank counts; nccl-tests' "busbw").
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def matmul_tflops(device, n, dtype, repeats):
    """This rank's matmul speed: repeats products of two n x n matrices, after 3 untimed ones."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    began = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * n ** 3 * repeats / (time.perf_counter() - began) / 1e12


def all_reduce_gbps(device, nbytes, repeats):
    """The all-reduce's bus bandwidth in GB/s over every rank: repeats of an nbytes float32 tensor, timed
    from a barrier to the last one's end, after 2 untimed ones."""
    x = torch.ones(nbytes // 4, device=device)
    for _ in range(2):
        dist.all_reduce(x)
    synchronize(device)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(x)
    synchronize(device)
    seconds = (time.perf_counter() - began) / repeats
    ranks = dist.get_world_size()
    return 2 * (ranks - 1) / ranks * x.numel() * 4 / seconds / 1e9


def main(out, kind):
    rank, local_rank = int(os.environ['RANK']), int(os.environ['LOCAL_RANK'])
    gpu = kind == 'cuda'
    device = torch.device('cuda', local_rank) if gpu else torch.device('cpu')
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group('nccl' if gpu else 'gloo', device_id=device if gpu else None)
    # 8192 x 8192 in bf16: about 1.1 TFLOP a product, big enough for a GPU's peak; a CPU gets a token size
    n, dtype, repeats, nbytes = (8192, torch.bfloat16, 50, 256 << 20) if gpu else (256, torch.float32, 5,
                                                                                   1 << 20)
    mine = {'rank': rank, 'local_rank': local_rank, 'host': os.uname().nodename,
            'device': torch.cuda.get_device_name(device) if gpu else 'cpu',
            'matmul_tflops': matmul_tflops(device, n, dtype, repeats), 'matmul_n': n,
            'matmul_dtype': str(dtype).removeprefix('torch.')}
    if gpu:  # memory another process holds on this GPU shows as used before we allocate any
        free, total = torch.cuda.mem_get_info(device)
        mine |= {'memory_used_gb': (total - free) / 1e9, 'memory_total_gb': total / 1e9}
    bandwidth = all_reduce_gbps(device, nbytes, repeats) if dist.get_world_size() > 1 else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        report = {'ranks': everyone, 'all_reduce_busbw_gbps': bandwidth, 'all_reduce_bytes': nbytes,
                  'backend': dist.get_backend()}
        with open(out + '.tmp', 'w') as f:
            json.dump(report, f, indent=1)
        os.replace(out + '.tmp', out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[2] not in ('cuda', 'cpu') or 'RANK' not in os.environ:
        raise SystemExit("node_probe.py: run it under torchrun with the JSON file to write and the device "
                         "kind: torchrun --standalone --nproc_per_node=8 lab/node_probe.py out/probe.json cuda")
    main(*sys.argv[1:])
