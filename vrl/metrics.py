"""
The numbers a run reports: each logged step's and each evaluation's record and line, with MFU against
one GPU's peak (PEAK_TFLOPS), and train.py's time to go.
"""
import torch


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


def eval_record(step, losses, full_losses, full_sets, every_window):
    """An evaluation's record for log.jsonl, and its line's words on the whole split: losses are the
    validation sample's (mean over domains, {domain: loss} or None for one split), full_losses every
    window's of full_sets where this evaluation scored them, else None; every_window: eval_full's."""
    record = {'step': step, 'val_loss': losses[0], 'val_loss_domains': losses[1]}
    if not full_losses:
        return record, ""
    windows = sum(len(places) for _, places in full_sets.values())
    record |= {'val_loss_full': full_losses[0], 'val_loss_full_domains': full_losses[1],
               'val_windows_full': windows}
    return record, (f" (all {windows:,} windows)" if every_window else
                    f"; all {windows:,} windows: {full_losses[0]:.4f}")


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


def time_to_go(step_seconds, pass_seconds, eval_passes, step, max_iters, eval_interval):
    """train.py's line on the rest of a run, said at step's log (before its boundary): the steps to go at
    step_seconds each, and the evaluations to go (every eval_interval steps and the last, this step's
    included) at pass_seconds a pass, eval_passes(step) each."""
    evaluations = [s for s in range(step, max_iters + 1) if s % eval_interval == 0 or s == max_iters]
    seconds = step_seconds * (max_iters - step) + pass_seconds * sum(map(eval_passes, evaluations))
    return (f"about {duration(seconds)} to go: {max_iters - step} steps of {duration(step_seconds)} and "
            f"{len(evaluations)} evaluation(s)")


def duration(seconds):
    return (f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min" if seconds >= 90
            else f"{seconds:.3g} s")
