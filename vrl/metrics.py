"""
The numbers a run reports: each logged step's record and line, with MFU against one GPU's peak
(PEAK_TFLOPS), and, before any long work, what the run will cost (estimate_time).
"""
import statistics
import time

import torch

from vrl import optim


# One GPU's dense bf16 tensor-core peak in TFLOP/s, for train.py's MFU and beside bench.py's measured matmul
# peak, by the exact name torch.cuda.get_device_name gives: the vendor's datasheet figure, which NVIDIA states
# with 2:4 sparsity, halved. The exact name matters: an H100 PCIe or NVL has 76% or 84% of an SXM's peak, yet
# all three names contain 'H100'. Not listed: no MFU unless train.py's --peak_tflops gives it. (Should an H200
# NVL ever call itself plain 'NVIDIA H200', pass 835.5.)
PEAK_TFLOPS = {
    'NVIDIA H100 80GB HBM3': 1979 / 2,  # H100 SXM5 (H100 datasheet)
    'NVIDIA H100 PCIe': 1513 / 2,
    'NVIDIA H100 NVL': 1671 / 2,
    'NVIDIA H200': 1979 / 2,  # H200 SXM (H200 datasheet)
    'NVIDIA H200 NVL': 1671 / 2,
    'NVIDIA GH200 480GB': 1979 / 2,  # GH200 datasheet
    'NVIDIA A100-SXM4-40GB': 624 / 2, 'NVIDIA A100-SXM4-80GB': 624 / 2,  # A100 datasheet, every form factor
    'NVIDIA A100-PCIE-40GB': 624 / 2, 'NVIDIA A100 80GB PCIe': 624 / 2,
    'NVIDIA B200': 4500 / 2,  # HGX B200 datasheet, per GPU
    'NVIDIA L40S': 362.05,  # L40S datasheet's dense figure (its sparse one, 733, is not quite twice it)
    'NVIDIA L4': 242 / 2,  # L4 datasheet
    'NVIDIA A10': 250 / 2,  # A10 datasheet
    'NVIDIA GeForce RTX 4090': 330.4 / 2,  # Ada architecture whitepaper, bf16 with fp32 accumulation
}


def flops_per_token(model, seq_len, causal=True):
    """Training FLOPs a token: 6 per matmul weight, and causal attention's QK^T and AV, 6·L·d·T (a fused
    kernel skips the masked half). causal=False: PaLM's (appendix B) and nanoGPT's count, 12·L·d·T,
    crediting work no kernel does (at 65,536 tokens, nearly twice the MFU)."""
    cfg = model.config
    attention = (6 if causal else 12) * cfg.n_layer * cfg.n_embd * seq_len
    return 6 * model.num_params(exclude_embedding=True) + attention


def peak_of(peak_tflops, device):
    """One accelerator's peak TFLOP/s that MFU compares against: peak_tflops if given, else the GPU's in
    PEAK_TFLOPS, else 0 (no MFU; always so on a CPU)."""
    if peak_tflops or torch.device(device).type != 'cuda':
        return peak_tflops
    return PEAK_TFLOPS.get(torch.cuda.get_device_name(device), 0.0)


def step_record(step, loss, grad_norm, lr, tokens_per_sec, grad_norms, model, config, ranks, device,
                peak_memory=None):
    """A logged step's record for log.jsonl, and its line: the loss (the mean over the log interval and the
    ranks), the gradient norm and rate, the job's tokens/s, and MFU (per GPU, against peak_of's peak; 'mfu'
    counts causal attention as a fused kernel does, 'mfu_palm' the full T x T as PaLM and nanoGPT do), peak
    memory (peak_memory: each rank's GiB; the highest, and each where there are several), learned λ and
    per-parameter gradient norms ({name: norm tensor}) where they apply."""
    record = {'step': step, 'train_loss': loss.item(), 'grad_norm': grad_norm.item(), 'lr': lr,
              'tokens_per_sec': tokens_per_sec}  # the job's, all ranks together
    peak = peak_of(config['peak_tflops'], device)
    for key, causal in (('mfu', True), ('mfu_palm', False)) if peak else ():
        flops = flops_per_token(model, config['block_size'], causal)
        record[key] = flops * (tokens_per_sec / ranks) / (peak * 1e12)
    if peak_memory:
        record['peak_memory_gib'] = max(peak_memory)
        if len(peak_memory) > 1:  # one GPU above the others shows (lab/bench.py --node_check)
            record['peak_memory_gib_ranks'] = peak_memory
    if model.config.lambda_mode != 'fixed':
        record['lambdas'] = model.lambdas.tolist()
    if grad_norms is not None:  # one copy to the host, not a wait per parameter
        record['grad_norms'] = dict(zip(grad_norms, torch.stack(list(grad_norms.values())).tolist()))
    mfu = (f", mfu {100 * record['mfu']:.1f}% (PaLM's count {100 * record['mfu_palm']:.1f}%) of "
           f"{peak:g} TFLOP/s per GPU" if peak else "")
    memory = (f", peak GPU memory {record['peak_memory_gib']:.1f} GiB" if 'peak_memory_gib' in record
              else "")
    return record, (f"step {step}: loss {record['train_loss']:.4f}, lr {lr:.2e}, {tokens_per_sec:,.0f} "
                    f"tok/s{mfu}{memory}")


def grad_norms(model):
    """{name: norm} of every parameter's gradient (lab/bench.py's, tests'): one fused kernel per dtype."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    norms = torch.stack(torch._foreach_norm([grad for _, grad in named])).tolist()
    return {name: norm for (name, _), norm in zip(named, norms)}


def mean_domain_losses(scored):
    """{domain: mean loss} over runs' per-domain validation losses (SlimPajama's 7 domains, whose unweighted
    mean is val_loss), one {domain: loss} or None per run; None unless every run has them, so that the means
    cover the same runs as the mean val_loss beside them."""
    if not scored or not all(scored):
        return None
    return {d: sum(s[d] for s in scored) / len(scored) for d in sorted(scored[0])}


TIMED_PASSES = 5  # the training steps the estimate times, after two untimed ones (three if compiled)


def estimate_time(train_step, eval_batch, counts, amp, model, optimizer, compiled, cuda, schedule,
                  tokens_per_step, say, every_window=False):
    """Say what the run will cost before any long work, from train_step() (the step's forward and backward
    passes as training runs them: under DDP one all-reduce, in the last micro-batch's backward) followed by
    an update at rate 0 on zeroed gradients (optim.zero_rate_step: the update's kernels and memory, the
    weights unchanged; its optimizer state is then cleared, so a fresh run's first update is still its
    first), and from eval_batch(), timed on every rank. A resumed run's update, whose optimizer state must
    stay as it was saved, is not timed (the line says so). The gradients are then dropped, and every step
    seeds its own randomness: the run is unchanged. The first calls pay for allocation, kernel selection
    and any compiling, and come out up to 1.6x slower than the steps that follow (the second still up to
    1.3x): they are not timed; the estimate is the median of TIMED_PASSES timed steps, their range said.
    counts: this rank's (evaluation batches, more on every validation window); schedule: (this run's first
    step, max_iters, eval_interval); say: rank 0's print; every_window: each evaluation scores every
    validation window (eval_full), not only the last."""
    eval_batches, full_eval_batches = counts
    first_step, max_iters, eval_interval = schedule
    fresh = not optim.has_state(optimizer)
    say(f"timing {2 + compiled + TIMED_PASSES} steps for an estimate of the run's cost")

    def step():
        train_step()
        if fresh:
            optim.zero_rate_step(optimizer)
    with amp:
        warming, steps = seconds_of(step, 2 + compiled, TIMED_PASSES, cuda)
    if fresh:
        optim.clear_state(optimizer)
    optimizer.zero_grad(set_to_none=False)  # as train.py's loop: DDP's gradients stay views of its buckets
    model.eval()
    with amp:  # (no evaluation batches: a rank with no share of the validation windows)
        eval_warming, eval_times = seconds_of(torch.no_grad()(eval_batch), compiled, 1, cuda) \
            if eval_batches else (0, [0])
    model.train()
    step, batch = statistics.median(steps), eval_times[0]
    compiling = warming + eval_warming - (2 + compiled) * steps[0] - compiled * eval_times[0]
    compiling = f"; compiling took {duration(compiling)}" if compiled else ""
    first_eval = -(-first_step // eval_interval) * eval_interval  # every multiple, and the last step
    evaluations = max(0, (max_iters - first_eval) // eval_interval + 1) + (max_iters % eval_interval > 0)
    full = evaluations if every_window else 1
    to_go = max_iters - first_step
    say(f"about {duration(step)} a step ({duration(min(steps))} to {duration(max(steps))} over "
        f"{len(steps)} timed ones, {'the update included' if fresh else 'the update not timed (resumed)'}; "
        f"{tokens_per_step / step:,.0f} tokens/s): {duration(step * to_go)} for the {to_go} steps to go, "
        f"plus {duration(batch * (eval_batches * evaluations + full_eval_batches * full))} for "
        f"{evaluations} evaluations"
        + (" (every validation window each time)" if every_window and full_eval_batches
           else " (the last also of every validation window)" if full_eval_batches else "") + compiling)


def seconds_of(work, untimed, timed, cuda):
    """(seconds of untimed calls of work(), [seconds of each of the timed calls that follow]), waiting for
    the device after each."""
    seconds = []
    for _ in range(untimed + timed):
        start = time.time()
        work()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.time() - start)
    return sum(seconds[:untimed]), seconds[untimed:]


def duration(seconds):
    return (f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min" if seconds >= 90
            else f"{seconds:.3g} s")
