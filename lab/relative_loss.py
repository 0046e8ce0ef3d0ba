"""
The paper's main metric: the relative training loss (ICLR Sec. 4.1.2; the official
analyze/plot_relative_loss.py), a method's smoothed training-loss curve minus the Transformer's of the same
settings, each smoothed by a moving average of 100 steps. Below zero, the method is ahead. Also the step
where one curve crosses the other: the "critical point" of ICLR Fig. 14 Right, where the Transformer
overtakes SVFormer, and how it grows with the sequence length.

    python lab/relative_loss.py out/vanilla out/resformer             # the second minus the first
    python lab/relative_loss.py out/vanilla out/svformer out/resformer --out=relative.png
    python lab/relative_loss.py results/runs/cpu_variant=vanilla_seed=1337.json results/runs/...json

Each argument is a run folder (its log.jsonl) or a run summary (results/runs/*.json, written by
lab/reproduce.py, whose suites draw these curves for every group, paired by seed). train.py logs the mean
training loss of every log_interval steps, so a moving average over window / log_interval records is the
moving average over window steps. As in the official plot, each average sits at the first step of its
window: the last point of a 600-step run is at step 501, the mean over steps 501-600.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from vrl import cli

WINDOW = 100  # steps (official plot_relative_loss.py: moving_average(x, 100))


def train_curve(path):
    """[[step, training loss], ...] of a run folder (log.jsonl) or a run summary (its train_curve)."""
    if os.path.isdir(path):
        log = os.path.join(path, 'log.jsonl')
        cli.refuse_pipe(log, "relative_loss.py:", "point to a run folder train.py wrote")
        try:
            with open(log, encoding='utf-8') as f:
                lines = [line for line in f if line.strip()]
        except (OSError, ValueError) as e:
            raise SystemExit(f"relative_loss.py: cannot read {log} ({type(e).__name__}); point to a run "
                             "folder train.py wrote") from None
        records = [r for r in map(json_record, lines) if isinstance(r, dict)]
        if len(records) < len(lines):  # a line cut by a crash, say: the rest of the curve still counts
            print(f"relative_loss.py: skipped {len(lines) - len(records)} unreadable line(s) of {log}",
                  file=sys.stderr)
        curve = [[r['step'], r['train_loss']] for r in records if 'train_loss' in r and 'step' in r]
    else:
        cli.refuse_pipe(path, "relative_loss.py:", "point to a run folder or a results/runs/*.json summary")
        try:
            with open(path, encoding='utf-8') as f:
                curve = json.load(f).get('train_curve') or []
        except (OSError, ValueError, AttributeError) as e:
            raise SystemExit(f"relative_loss.py: cannot read {path} ({type(e).__name__}); point to a run "
                             "folder or a results/runs/*.json summary") from None
    if len(curve) < 2:
        raise SystemExit(f"relative_loss.py: {path} has no training curve (runs trained before train.py "
                         "logged the mean loss of each interval have none); retrain it")
    return curve


def json_record(line):
    """A log line's record, or None where the line is not JSON."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def smooth(curve, window=WINDOW):
    """The moving average of a curve of interval means over `window` steps, each at its window's first
    step (the official plot's numpy.convolve(..., 'valid') against steps 1, 2, ...): [[step, mean], ...].
    A record at step s is the mean of steps s - every + 1 ... s; where records are window steps apart or
    more, each is its own window."""
    every = curve[1][0] - curve[0][0]
    k = max(1, round(window / every))
    return [[curve[i - k + 1][0] - every + 1, sum(loss for _, loss in curve[i - k + 1:i + 1]) / k]
            for i in range(k - 1, len(curve))]


def relative(method, baseline, window=WINDOW):
    """The smoothed method curve minus the smoothed baseline, at the steps both have."""
    base = dict(map(tuple, smooth(baseline, window)))
    return [[s, loss - base[s]] for s, loss in smooth(method, window) if s in base]


def crossing(rel, hold=WINDOW):
    """Where the baseline overtakes the method for good (ICLR Sec. 4.6's critical point): the step at which
    a relative curve that was below zero reaches zero from below for the last time (linearly
    interpolated), if it then stays at or above zero for `hold` steps or more, to its end. None otherwise:
    noise that dips across zero and back is no crossing, nor is one too late to tell from noise."""
    for (s0, r0), (s1, r1) in zip(reversed(rel[:-1]), reversed(rel)):
        if r0 < 0 <= r1:  # the last upward crossing; everything after it is >= 0
            step = s0 + (0 - r0) / (r1 - r0) * (s1 - s0)
            return step if rel[-1][0] - step >= hold else None
        if r1 < 0:  # below zero at or after this point: it does not end above
            return None
    return None


def extrapolated_crossing(rel, fraction=0.1):
    """Where a least-squares line through the last `fraction` of a relative curve reaches zero (ICLR Fig. 14
    Right predicts 64,000 tokens' critical point so, from its last 1,000 of 10,000 steps): a step beyond the
    curve, or None if the line does not rise towards zero."""
    tail = rel[-max(2, int(len(rel) * fraction)):]
    xs, ys = [s for s, _ in tail], [r for _, r in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    if my >= 0 or slope <= 0:
        return None
    return mx - my / slope


def growth(points):
    """The critical point's trend against sequence length, [(length, step)]: the least-squares line through
    (length, ln step), as ICLR Fig. 14 Right calls it exponential. (a, b): step = exp(a + b · length)."""
    xs, ys = [n for n, _ in points], [math.log(s) for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def plot(series, out, title, ylabel="training loss − Transformer's (smoothed over 100 steps)"):
    """Draw {label: [(step, mean, std)]} as lines with ± std bands into out (PNG); False without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        steps, means, stds = zip(*points)
        line, = ax.plot(steps, means, label=label, lw=1.2)
        ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                        color=line.get_color(), alpha=0.15)
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xlabel='step', ylabel=ylabel, title=title)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    parser = cli.ArgumentParser(prog='lab/relative_loss.py', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('baseline', help="the Transformer's run folder or summary")
    parser.add_argument('methods', nargs='+', help="the methods' run folders or summaries")
    parser.add_argument('--window', type=int, default=WINDOW,
                        help='moving-average window in steps (default: %(default)s, the official plot\'s)')
    parser.add_argument('--out', default=None, help='draw the curves into this PNG (needs matplotlib)')
    args = parser.parse_args(argv)
    if args.window < 1:
        raise SystemExit(f"relative_loss.py: --window={args.window}; use 1 or more steps")
    baseline = train_curve(args.baseline)
    series = {}
    print(f"relative training loss against {args.baseline}, smoothed over {args.window} steps "
          "(below zero: ahead of it)")
    for path in args.methods:
        rel = relative(train_curve(path), baseline, args.window)
        if not rel:
            raise SystemExit(f"relative_loss.py: {path} and {args.baseline} share no logged steps past the "
                             f"first {args.window}; use runs of the same settings")
        cross = crossing(rel, args.window)
        # no extrapolation: one pair has no spread to give it an interval (reproduce.py's suites do)
        print(f"{path}: {rel[-1][1]:+.4f} at step {rel[-1][0]} (the mean over steps {rel[-1][0]}-"
              f"{rel[-1][0] + args.window - 1}); "
              + (f"the baseline overtakes it at step {cross:.0f} for good" if cross is not None else
                 f"no crossing in {rel[-1][0] + args.window - 1} steps"))
        series[os.path.basename(os.path.normpath(path))] = [(s, r, 0.0) for s, r in rel]
    if args.out:
        try:
            drawn = plot(series, args.out, 'relative training loss')
        except OSError as e:
            raise SystemExit(f"relative_loss.py: cannot write {args.out} ({e.strerror or e}); pick another "
                             "--out") from None
        print(f"wrote {args.out}" if drawn else "matplotlib is not installed: no picture drawn")


if __name__ == '__main__':
    main()
