"""
The node check's probe of each GPU and of the links between them (lab/bench.py --node_check runs it under
torchrun, one rank a GPU, before any training run): each rank reads its GPU's memory in use before it
allocates anything, burns matmuls on its own GPU for a given time (long enough for a hot or power-starved
GPU to slow down, while bench.py reads its throttle and ECC fields), then all ranks time an all-reduce
together, and rank 0 writes every rank's numbers as JSON. On CPU ranks (gloo) it runs the same in float32
at a small size: that checks the plumbing, not the machine. Under a torchrun over several nodes (bench.py
--link_check) the all-reduce times the links between them.

    torchrun --standalone --nproc_per_node=8 lab/node_probe.py out/node_check/probe.json cuda 30

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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from vrl.settings import gloo_interface


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def matmul_tflops(device, n, dtype, seconds):
    """This rank's matmul speed, burning for about seconds: (TFLOP/s over the whole burn, over its first
    fifth, over its last fifth), products of two n x n matrices in rounds of 10, after 3 untimed ones."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    rounds, began = [], time.perf_counter()  # (when each round of products ended)
    while not rounds or rounds[-1] - began < seconds:
        for _ in range(10):
            a @ b
        synchronize(device)
        rounds.append(time.perf_counter())
    flop = 2 * n ** 3 * 10

    def speed(ends):  # TFLOP/s over consecutive rounds that ended at ends, the one before ends[0] known
        return flop * (len(ends) - 1) / (ends[-1] - ends[0]) / 1e12
    fifth = max(len(rounds) // 5, 1)
    ends = [began, *rounds]
    return speed(ends), speed(ends[:fifth + 1]), speed(ends[-fifth - 1:])


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


def main(out, kind, seconds):
    rank, local_rank = int(os.environ['RANK']), int(os.environ['LOCAL_RANK'])
    gpu = kind == 'cuda'
    device = torch.device('cuda', local_rank) if gpu else torch.device('cpu')
    mine = {'rank': rank, 'local_rank': local_rank, 'host': os.uname().nodename}
    if gpu:  # before this rank allocates anything: what other processes hold, and this one's CUDA context
        torch.cuda.set_device(device)
        free, total = torch.cuda.mem_get_info(device)
        mine |= {'memory_used_gb': (total - free) / 1e9, 'memory_total_gb': total / 1e9}
    gloo_interface('node_probe.py')  # over several nodes, gloo's network interface
    dist.init_process_group('nccl' if gpu else 'gloo', device_id=device if gpu else None)
    # 8192 x 8192 in bf16: about 1.1 TFLOP a product, big enough for a GPU's peak; a CPU gets a token size
    n, dtype, repeats, nbytes = (8192, torch.bfloat16, 50, 256 << 20) if gpu else (256, torch.float32, 5,
                                                                                   1 << 20)
    speed, first, last = matmul_tflops(device, n, dtype, seconds)
    mine |= {'device': torch.cuda.get_device_name(device) if gpu else 'cpu', 'matmul_tflops': speed,
             'matmul_tflops_first': first, 'matmul_tflops_last': last, 'matmul_seconds': seconds,
             'matmul_n': n, 'matmul_dtype': str(dtype).removeprefix('torch.')}
    bandwidth = all_reduce_gbps(device, nbytes, repeats) if dist.get_world_size() > 1 else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        report = {'ranks': everyone, 'all_reduce_busbw_gbps': bandwidth, 'all_reduce_bytes': nbytes,
                  'backend': dist.get_backend(), 'nodes': len({r['host'] for r in everyone})}
        with open(out + '.tmp', 'w') as f:
            json.dump(report, f, indent=1)
        os.replace(out + '.tmp', out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    try:
        out, kind, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    except (IndexError, ValueError):
        kind = seconds = None
    if (len(sys.argv) != 4 or kind not in ('cuda', 'cpu') or not 0 <= seconds < 3600
            or 'RANK' not in os.environ):
        raise SystemExit("node_probe.py: run it under torchrun with the JSON file to write, the device kind "
                         "and the seconds each GPU burns: torchrun --standalone --nproc_per_node=8 "
                         "lab/node_probe.py out/probe.json cuda 30")
    main(out, kind, seconds)
