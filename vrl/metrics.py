"""
The numbers a run reports: each logged step's record and line, with MFU against one GPU's peak
(PEAK_TFLOPS); the last evaluation's fields; and, before any long work, what the run will cost
(estimate_time).
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


def mfu_peak(peak_tflops, device, say):
    """One accelerator's peak TFLOP/s that MFU compares against: peak_tflops if given, else the GPU's in
    PEAK_TFLOPS, else 0 (no MFU; always so on a CPU). On a GPU, say() which, or that there is none."""
    gpu_name = torch.cuda.get_device_name(device) if torch.device(device).type == 'cuda' else None
    peak = peak_tflops or PEAK_TFLOPS.get(gpu_name, 0.0)
    if gpu_name:
        source = 'peak_tflops' if peak_tflops else 'PEAK_TFLOPS'
        say(f"MFU per GPU, of {peak:g} TFLOP/s ({source}: {gpu_name})" if peak
            else f"no MFU: {gpu_name} is not in PEAK_TFLOPS (vrl/metrics.py); give one GPU's dense bf16 TFLOP/s "
                 f"with --peak_tflops")
    return peak


def step_record(step, train_loss, grad_norm, lr, tokens_per_sec, grad_norms, model, block_size, peak, ranks,
                device):
    """A training step's record for log.jsonl, and its line: the loss (the mean over ranks), the gradient norm
    and rate, the job's tokens/s, and MFU, peak memory, learned λ and per-matrix gradient norms where they
    apply."""
    record = {'step': step, 'train_loss': train_loss, 'grad_norm': grad_norm, 'lr': lr,
              'tokens_per_sec': tokens_per_sec}  # the job's, all ranks together
    if peak:  # of one GPU: what each rank trains on, against its peak; 'mfu_palm' counts the full T x T
        # attention, as PaLM's and nanoGPT's MFU do
        for key, causal in (('mfu', True), ('mfu_palm', False)):
            record[key] = flops_per_token(model, block_size, causal) * (tokens_per_sec / ranks) / (peak * 1e12)
    if torch.device(device).type == 'cuda':  # rank 0's; a host-side counter, so no wait for the GPU
        record['peak_memory_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    if model.config.lambda_mode != 'fixed':
        record['lambdas'] = model.lambdas.tolist()
    if grad_norms is not None:
        record['grad_norms'] = grad_norms
    mfu = (f", mfu {100 * record['mfu']:.1f}% (PaLM's count {100 * record['mfu_palm']:.1f}%) of "
           f"{peak:g} TFLOP/s per GPU" if peak else "")
    memory = (f", peak GPU memory {record['peak_memory_gib']:.1f} GiB" if 'peak_memory_gib' in record
              else "")
    return record, (f"step {step}: loss {train_loss:.4f}, lr {lr:.2e}, {tokens_per_sec:,.0f} tok/s"
                    f"{mfu}{memory}")


def log_step(run, progress, say, step, train_loss, grad_norm, lr, tokens_per_sec, grad_norms, model,
             block_size, peak, ranks, device):
    """A logged step's record in log.jsonl (and wandb), its line, and the progress bar's loss: train_loss
    (this rank's, on the device) is first averaged over the ranks."""
    if ranks > 1:  # the mean over ranks (gloo has no ReduceOp.AVG in older torch, 2.5.1 say)
        torch.distributed.all_reduce(train_loss)
        train_loss /= ranks
    record, line = step_record(step, train_loss.item(), grad_norm.item(), lr, tokens_per_sec, grad_norms,
                               model, block_size, peak, ranks, device)
    run.log(record)
    progress.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
    say(line)


class Throughput:
    """Tokens a second over the training steps since the last reset (an evaluation's time not counted)."""

    def __init__(self, tokens_per_step):
        self.tokens_per_step = tokens_per_step
        self.reset()

    def reset(self):
        self.start, self.steps = time.time(), 0

    def step(self):
        self.steps += 1

    def tokens_per_sec(self):
        """The rate since the last reset, and a reset."""
        rate = self.tokens_per_step * self.steps / (time.time() - self.start)
        self.reset()
        return rate


def grad_norms(model):
    """{name: norm} of every parameter's gradient, e.g. layer 1's W_V against W_O (v5 Sec. 4.3):
    one fused kernel per dtype and one copy to the host, not a wait for the device per parameter."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    norms = torch.stack(torch._foreach_norm([grad for _, grad in named])).tolist()
    return {name: norm for (name, _), norm in zip(named, norms)}


def full_evaluation(losses, full_val_sets):
    """The log record's fields and the line's words of an evaluation on every validation window: losses is
    train.py's evaluate(full_val_sets, ...)."""
    loss, domain_losses = losses
    full = {'val_loss_full': loss, 'val_loss_full_domains': domain_losses,
            'val_windows_full': sum(len(places) for _, places in full_val_sets.values())}
    return full, f"; all {full['val_windows_full']:,} windows: {loss:.4f}{by_domain(domain_losses)}"


def by_domain(losses):
    """' (domain loss, ...)' to follow a printed val loss, or nothing for one validation split."""
    return '' if losses is None else f" ({', '.join(f'{name} {loss:.4f}' for name, loss in losses.items())})"


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
    first_eval = -(-first_step // eval_interval) * eval_interval
    evaluations = len(set(range(first_eval, max_iters + 1, eval_interval)) | {max_iters})
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
