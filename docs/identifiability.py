"""How much can a sigmoid fitted on evaluations up to F x C_mid know about the plateau? A Monte Carlo check of
fit_curve.py's protocol, behind docs/study.md's "prediction windows":

    python docs/identifiability.py docs/logs/study-v2/default-s*.jsonl
    python docs/identifiability.py --noise-scale 0.5 docs/logs/study-v2/default-s*.jsonl  # 4x samples an eval

For each log, the truth is that run's own full fit (fit_curve.py's cut and fit), so the curve is exactly a sigmoid
and any miss is the window's, not the task's. Each replicate draws new evaluations at the run's own evaluation
steps (or twice as many during the rise) with Gaussian noise of the run's own residual RMS about its fit, fits the
full run to find C_mid, fits again up to F x C_mid, and predicts the last evaluation. A replicate passes when its
error is within 0.03 and smaller than persistence's (the last in-window evaluation carried forward): issue 37's
target 3. Prints the pass rate per run and window, and the chance that three seeds all pass.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fit_curve  # noqa: E402  (the fit under test)

WINDOWS = (1.5, 2.0, 3.0)  # F: fit on evaluations up to F x C_mid
REPLICATES = 200
TOLERANCE = 0.03  # pass rate units


def load(path):
    """-> (x completions drawn (n,), pass rate (n,), early cut in completions) from a train.py log."""
    try:
        recs = [json.loads(line) for line in open(path)]
        cfg = recs[0]
        ev = [r for r in recs if r["kind"] == "eval"]
        return (np.array([r["samples"] for r in ev], float), np.array([r["pass_rate"] for r in ev]),
                cfg["warmup_steps"] * cfg["batch"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        sys.exit(f"{path}: not a readable train.py log ({type(e).__name__}: {e})")


def fit(x, y, r0):
    return fit_curve.refine(x, y, fit_curve.grid_fit(x, y, r0), r0)


def densified(x, until):
    """The evaluation points, with a midpoint added between each pair below `until` (twice the evaluations)."""
    mids = [(a + b) / 2 for a, b in zip(x[:-1], x[1:]) if b <= until]
    return np.sort(np.concatenate([x, mids]))


def trial(x, truth, noise, cut, window, rng):
    """One replicate -> (prediction error, persistence error) at the last evaluation, pass-rate units."""
    y = truth + rng.normal(0.0, noise, len(x))
    r0, kept = y[0], x >= cut  # as fit_curve.py: x = 0 sets R0, points before the cut are not fitted
    c_mid = fit(x[kept], y[kept], r0)[2]
    inside = kept & (x <= window * c_mid)
    if len(np.unique(x[inside])) < 4:  # fit_curve.py refuses such a window
        return math.nan, math.nan
    params = fit(x[inside], y[inside], r0)
    return fit_curve.sigmoid(x[-1], *params) - y[-1], y[inside][-1] - y[-1]


def main(paths, noise_scale=1.0):
    rng = np.random.default_rng(0)
    rates = {}  # (schedule, window) -> pass rate per run
    for path in paths:
        x, y, cut = load(path)
        kept = x >= cut
        A, B, C_mid, R0 = params = fit(x[kept], y[kept], y[0])
        noise = noise_scale * float(np.sqrt(np.mean((y[kept] - fit_curve.sigmoid(x[kept], *params)) ** 2)))
        print(f"{os.path.basename(path)}: truth A {A:.3f} B {B:.2f} C_mid {C_mid:.0f} R0 {R0:.3f}, "
              f"noise {noise:.4f} ({noise_scale} x the RMS residual), {len(x)} evaluations")
        for schedule, xs in (("own", x), ("2x during rise", densified(x, 3 * C_mid))):
            truth = fit_curve.sigmoid(np.maximum(xs, 1e-12), *params)
            truth[xs == 0] = R0
            for window in WINDOWS:
                errs = np.array([trial(xs, truth, noise, cut, window, rng) for _ in range(REPLICATES)])
                ok = (np.abs(errs[:, 0]) <= TOLERANCE) & (np.abs(errs[:, 0]) < np.abs(errs[:, 1]))
                rates.setdefault((schedule, window), []).append(float(ok.mean()))
                print(f"  {schedule:>15} evaluations, fit to {window} C_mid: passes {ok.mean():.2f}, "
                      f"median |error| {np.nanmedian(np.abs(errs[:, 0])):.3f}, "
                      f"persistence's {np.nanmedian(np.abs(errs[:, 1])):.3f}")
    print("\nchance that every run passes (the product of the rates):")
    for (schedule, window), r in rates.items():
        print(f"  {schedule:>15} evaluations, fit to {window} C_mid: {math.prod(r):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Monte Carlo check of fitting a sigmoid up to F x C_mid")
    parser.add_argument("logs", nargs="+", help="train.py logs (.jsonl)")
    parser.add_argument("--noise-scale", type=float, default=1.0,
                        help="noise = this x each run's own RMS residual (0.5: 4x the samples an evaluation)")
    args = parser.parse_args()
    if not args.noise_scale > 0:
        parser.error(f"--noise-scale must be positive, got {args.noise_scale}")
    main(args.logs, args.noise_scale)
