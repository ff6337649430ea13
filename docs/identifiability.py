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

How much of a run's residual is evaluation noise? The study's part `eval` trains each seed twice, evaluated with 2
and with 8 samples a prompt (training does not depend on evaluation, so the two are one run). --split takes such
pairs and splits the residual of the 2-sample fit into evaluation noise and the policy's own swing:

    python docs/identifiability.py --split docs/logs/study-v2/eval2-s*.jsonl docs/logs/study-v2/eval8-s*.jsonl
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
    """-> (x completions drawn (n,), pass rate (n,), early cut in completions, config record) from a train.py log."""
    try:
        recs = [json.loads(line) for line in open(path)]
        cfg = recs[0]
        ev = [r for r in recs if r["kind"] == "eval"]
        return (np.array([r["samples"] for r in ev], float), np.array([r["pass_rate"] for r in ev]),
                cfg["warmup_steps"] * cfg["batch"], cfg)
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


def rms_residual(x, y, cut):
    """-> (the fit on the points from the cut, RMS of their residuals about it), pass-rate units."""
    kept = x >= cut
    params = fit(x[kept], y[kept], y[0])
    return params, float(np.sqrt(np.mean((y[kept] - fit_curve.sigmoid(x[kept], *params)) ** 2)))


def split(paths):
    """Pairs of logs of one run (same seed and training), evaluated with m and 4m samples a prompt, the 4m drawing
    the m's samples and 3m more: d = y_m - y_4m = 3/4 (y_m - y_3m), so the m-sample evaluation noise has variance
    4/3 var(d) over the fitted evaluations (var, not mean square: common random numbers give each sample set a
    lasting offset, which a fit takes as a shifted curve). The rest of the residual is the policy's own swing."""
    runs = {}
    for path in paths:
        x, y, cut, cfg = load(path)
        runs.setdefault(cfg["seed"], {})[cfg["eval_samples"]] = (x, y, cut)
    for seed, pair in sorted(runs.items()):
        if len(pair) != 2:
            sys.exit(f"seed {seed}: --split needs two logs a seed, with m and 4m samples a prompt")
        (m, (x, ym, cut)), (m4, (x4, y4, _)) = sorted(pair.items())
        if m4 != 4 * m or not np.array_equal(x, x4):
            sys.exit(f"seed {seed}: --split needs one log with m and one with 4m samples a prompt, same evaluations")
        kept = x >= cut
        d = ym[kept] - y4[kept]
        d_sd = float(d.std(ddof=1))
        eval_sd = math.sqrt(4 / 3) * d_sd
        (params, res), (params4, res4) = rms_residual(x, ym, cut), rms_residual(x, y4, cut)
        swing = math.sqrt(max(res ** 2 - eval_sd ** 2, 0.0))
        expected = math.sqrt(swing ** 2 + eval_sd ** 2 / 4)
        print(f"seed {seed}: residual RMS {res:.4f} with {m} samples (A {params[0]:.3f}, B {params[1]:.2f}), "
              f"{res4:.4f} with {m4} (A {params4[0]:.3f}, B {params4[1]:.2f}); {m}-sample evaluation noise "
              f"{eval_sd:.4f} (y_{m} - y_{m4}: mean {d.mean():+.4f}, sd {d_sd:.4f}, {kept.sum()} evaluations);"
              f" the policy's swing {swing:.4f}; so {m4} samples should leave {expected:.4f} (--noise-scale "
              f"{expected / res:.2f})")


def main(paths, noise_scale=1.0):
    rng = np.random.default_rng(0)
    rates = {}  # (schedule, window) -> pass rate per run
    for path in paths:
        x, y, cut, _ = load(path)
        params, residual = rms_residual(x, y, cut)
        A, B, C_mid, R0 = params
        noise = noise_scale * residual
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
                        help="noise = this x each run's own RMS residual (0.5 would be 4x the samples an evaluation "
                        "if all of it were evaluation noise: --split measures how much is)")
    parser.add_argument("--split", action="store_true", help="split the residual of pairs of logs (one seed, 2 and "
                        "8 samples a prompt) into evaluation noise and the policy's own swing; no Monte Carlo")
    args = parser.parse_args()
    if not args.noise_scale > 0:
        parser.error(f"--noise-scale must be positive, got {args.noise_scale}")
    if args.split:
        split(args.logs)
    else:
        main(args.logs, args.noise_scale)
