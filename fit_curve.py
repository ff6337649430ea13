"""Fit ScaleRL's sigmoidal compute-performance curve (paper Eq. 1, §1, A.5) to validation
pass rate vs training compute, extrapolate it beyond the fit window and rank recipes.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

A is the ceiling (asymptotic pass rate); B (steepness) and C_mid (compute at half the gain) are efficiency. Points:
the "eval" records of train.py's logs (x = samples, completions drawn, by default; y = pass_rate); numpy, scipy.

    python fit_curve.py logs/*.jsonl --plot curves.png   # ranked table and a log-x plot (--json: a JSON line per run)
    python fit_curve.py logs/*.jsonl --fit-fraction 0.5  # fit on half, check the other half
    python fit_curve.py logs/*.jsonl --fit-to-cmid 1.5   # fit up to 1.5 C_mid: does the rise predict the plateau?
"""
import argparse
import json
import math
import os
import signal
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

# config keys that change no result (from micro_batch_tokens on: config.py's memory, device-layout, reliability knobs)
IGNORED_CONFIG_KEYS = {"seed", "run_name", "log_dir", "out_dir", "resume", "wandb", "dump_every", "eval_every",
                       "eval_growth", "save_every", "keep_checkpoints", "micro_batch_tokens", "vllm_memory",
                       "vllm_kv_cache_gib", "max_bad_steps", "logprob_chunk_tokens", "activation_checkpointing", "tp"}
A_STEP = 0.005                          # paper A.5 grid step for A
NUM_CMID = 80                           # log-spaced C_mid values from x_min/10 to 100*x_max
CMID_RANGE = (0.1, 100.0)               # C_mid grid span, relative to the window's x range
B_GRID = np.geomspace(0.02, 50.0, 48)   # coarse B values, 18% apart; Table 1 has 1.09-2.44
NUM_GOLDEN_ITERS = 16                   # golden-section steps: B to ~0.02% before refining
B_BOUNDS = (1e-3, 100.0)                # B > 0; above ~100 the curve is a step at C_mid
MAX_POWER_LAW_A = 2.0                   # power-law A is unbounded in principle (paper A.4)
MIN_RISE = 0.005                        # a curve that rises less than this (pass rate) has no ceiling to fit
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")
UNITS = {"gpu_hours": "training compute, device-hours", "step": "optimizer steps", "tokens": "completion tokens "
         "trained on", "samples": "completions sampled for training (batch x steps)"}
# one fitted run. group: the config less IGNORED_CONFIG_KEYS (seeds of a recipe share it); x, y: all valid evals, by x;
# in_fit: the window (x > 0); late: its cut twice as late, A_late its A (or None); ci: {"A": [lo, hi], ...}
Fit = namedtuple("Fit", "file name group x y in_fit late max_compute A B C_mid R0 r0_observed r2 power_law_A ci A_late")


def warn(msg):  # messages go to stderr: stdout carries the tables or the JSON lines
    print(msg, file=sys.stderr)


def read_log(path, x_key):
    """-> (config record or None, x, y, step sorted by x). Bad lines are skipped with a warning; a repeated step (a
    resumed run re-evaluating) keeps its last record. Raises OSError."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    config, evals, axes, lacking = None, [], set(), 0  # axes: the x keys the eval records lacking x_key do have
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line_num, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):  # bad JSON, a 5000-digit number, 100k-deep nesting
                rec = None
            if not isinstance(rec, dict):
                warn(f"{path}:{line_num}: not a JSON object (truncated write?), skipped")
                continue
            config = config or (rec if rec.get("kind") == "config" else None)
            if rec.get("kind") != "eval":
                continue
            x, y = rec.get(x_key), rec.get("pass_rate")
            if x_key not in rec:  # said once below, not per record
                lacking, axes = lacking + 1, axes | ({"gpu_hours", "samples", "tokens", "step"} & rec.keys())
                continue
            if not (number(x) and number(y) and x >= 0 and 0 <= y <= 1):
                warn(f"{path}:{line_num}: eval record needs finite {x_key} >= 0 and pass_rate in [0, 1], "
                     f"got {x!r} and {y!r}, skipped")
                continue
            step = rec.get("step")
            evals.append((step, (x, y, step if isinstance(step, int) else math.inf)))
    has = f"they have --x {' or '.join(sorted(axes))}" if axes else "they have no other axis"
    if lacking and not evals:
        raise ValueError(f"no eval record has {x_key!r}, the x axis (--x {x_key}); {has}")
    by_step = {step: p for step, p in evals if isinstance(step, int)}  # the last record of each step
    for n, why in ((lacking, f"lack {x_key!r}, skipped; {has}"), (sum(isinstance(s, int) for s, _ in evals) -
                   len(by_step), "repeat an earlier step (resumed run?), kept the last of each")):
        if n:
            warn(f"{path}: {n} eval records {why}")
    by_order = [by_step[k] for k in sorted(by_step)]
    drops = [(a, b) for a, b in zip(by_order, by_order[1:]) if b[0] < a[0]]
    if drops:
        warn(f"{path}: {x_key} decreases {len(drops)} time(s) as steps increase (first {drops[0][0][0]:.4g} -> "
             f"{drops[0][1][0]:.4g}): a clock reset or two runs in one log? Points are fitted in {x_key} order")
    points = sorted(list(by_step.values()) + [p for step, p in evals if not isinstance(step, int)])
    x, y, steps = (np.array(v, dtype=float) for v in zip(*points)) if points else (np.zeros(0),) * 3
    return config, x, y, steps


def sigmoid(x, A, B, C_mid, R0):
    """Paper Eq. 1, written as a logistic in log C (stable for any B); gives R0 at x = 0."""
    with np.errstate(divide="ignore"):
        return R0 + (A - R0) * expit(B * (np.log(x) - math.log(C_mid)))


def _pair_sse(s, y, A, r0):
    """-> (SSE of y - (R0 (1 - s) + A s) over the last axis, R0), each (nA, nC), for every A (nA, 1) from moment
    sums, so one s (1, nC, n) serves all A. A free R0 (r0 None) is solved in closed form, clipped to [0, A]."""
    p = 1 - s
    py, sy, pp, ps, ss = ((u * w).sum(-1) for u, w in ((p, y), (s, y), (p, p), (p, s), (s, s)))
    if r0 is None:
        r0 = np.clip((py - A * ps) / np.maximum(pp, 1e-12), 0, A)
    sse = y @ y - 2 * r0 * py - 2 * A * sy + r0**2 * pp + 2 * r0 * A * ps + A**2 * ss
    return sse, np.broadcast_to(r0, sse.shape)


def best_b_per_pair(log_x, y, A, log_cmid, r0):
    """-> (B, sse), each (nA, nC): the least-squares B of every (A (nA, 1), C_mid (nC,)) pair, as the paper's curve_fit
    per pair (A.5; a test checks they agree): best of B_GRID, then golden-section search on log B between neighbours."""
    v = log_x - log_cmid[:, None]                                   # (nC, n) log(C / C_mid)
    coarse = np.stack([_pair_sse(expit(b * v)[None], y, A, r0)[0] for b in B_GRID])
    k = coarse.argmin(0)                                            # (nA, nC)
    lo, hi = np.log(B_GRID[np.maximum(k - 1, 0)]), np.log(B_GRID[np.minimum(k + 1, len(B_GRID) - 1)])  # bracket

    def sse_at(log_b):
        return _pair_sse(expit(np.exp(log_b)[..., None] * v), y, A, r0)[0]
    g = (math.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = sse_at(c), sse_at(d)
    for _ in range(NUM_GOLDEN_ITERS):  # keep the side of the lower value, for all pairs at once
        left = fc < fd
        lo, hi = np.where(left, lo, c), np.where(left, d, hi)
        new = np.where(left, hi - g * (hi - lo), lo + g * (hi - lo))
        f_new = sse_at(new)
        c, d, fc, fd = (np.where(left, new, d), np.where(left, c, new),
                        np.where(left, f_new, fd), np.where(left, fc, f_new))
    log_b, sse = np.where(fc < fd, c, d), np.minimum(fc, fd)
    use_grid = coarse.min(0) < sse  # never worse than the coarse grid
    return np.exp(np.where(use_grid, np.log(B_GRID[k]), log_b)), np.minimum(sse, coarse.min(0))


def grid_fit(x, y, r0):
    """Paper A.5 generalised: A on 0.005 steps over (R0, 1], C_mid log-spaced, B (and a free R0) per pair -> best."""
    A = np.arange(1, round(1 / A_STEP) + 1)[:, None] * A_STEP     # (nA, 1)
    A = A[A[:, 0] > (0 if r0 is None else r0)]
    log_x = np.log(x)
    log_cmid = np.linspace(log_x.min() + math.log(CMID_RANGE[0]), log_x.max() + math.log(CMID_RANGE[1]), NUM_CMID)
    B, sse = best_b_per_pair(log_x, y, A, log_cmid, r0)
    i, j = np.unravel_index(sse.argmin(), sse.shape)
    R0 = r0 if r0 is not None else float(_pair_sse(expit(B[i, j] * (log_x - log_cmid[j])), y, A[i], None)[1][0])
    return float(A[i, 0]), float(B[i, j]), math.exp(log_cmid[j]), R0


def refine(x, y, start, r0, fixed_A=None):
    """Joint least_squares on (A, B, log C_mid[, q]) from start = (A, B, C_mid, R0) -> (A, B, C_mid, R0). A free R0
    is q*A, q in [0, 1), so 0 <= R0 < A is a box bound. fixed_A pins A: the paper's common-A refit for B (A.5)."""
    A0, B0, C0, R00 = start
    t0, lo, hi = [B0, math.log(C0)], [B_BOUNDS[0], -np.inf], [B_BOUNDS[1], np.inf]
    if fixed_A is None:
        t0, lo, hi = [A0] + t0, [(r0 or 0) + 1e-9] + lo, [1.0] + hi
    if r0 is None:
        t0, lo, hi = t0 + [R00 / A0], lo + [0.0], hi + [1 - 1e-9]
    log_x = np.log(x)

    def unpack(t):
        k = int(fixed_A is None)  # index of B
        A = t[0] if k else fixed_A
        return A, t[k], t[k + 1], (t[-1] * A if r0 is None else r0)

    def residuals(t):
        A, B, log_c, R0 = unpack(t)
        return R0 + (A - R0) * expit(B * (log_x - log_c)) - y
    A, B, log_c, R0 = unpack(least_squares(residuals, np.clip(t0, lo, hi), bounds=(lo, hi), x_scale="jac").x)
    return float(A), float(B), math.exp(log_c), float(R0)


def fit_power_law(x, y):
    """A of R = A - D C^-B on the same window (paper A.4: a power law overestimates A at low compute); may exceed 1."""
    log_x = np.log(x)
    A = np.arange(y.max() + A_STEP, MAX_POWER_LAW_A, A_STEP)[:, None]
    z, lx = np.log(A - y), log_x - log_x.mean()
    slope = z @ lx / max(lx @ lx, 1e-12)
    log_d = z.mean(1) - slope * log_x.mean()  # start: on a grid of A, log(A - R) is linear in log C
    i = ((A - np.exp(log_d[:, None] + slope[:, None] * log_x) - y) ** 2).sum(1).argmin()
    lo, hi = [0.0, 1e-4, -np.inf], [MAX_POWER_LAW_A, 10.0, np.inf]
    t0 = np.clip([A[i, 0], -slope[i], log_d[i]], lo, hi)
    return float(least_squares(lambda t: t[0] - np.exp(t[2] - t[1] * log_x) - y, t0, bounds=(lo, hi)).x[0])


def bootstrap_ci(x, y, r0, params, num_resamples, level, seed):
    """Percentile CIs for A, B, C_mid: refit resampled points from the full fit's optimum (explores its basin only)."""
    if num_resamples == 0:
        return {}
    rng = np.random.default_rng(seed)  # per run, so a file's CIs don't depend on the others
    draws = np.array([refine(x[i], y[i], params, r0) for i in
                      (rng.integers(0, len(x), len(x)) for _ in range(num_resamples))])
    lo, hi = np.percentile(draws[:, :3], [50 * (1 - level), 100 - 50 * (1 - level)], axis=0)
    return {k: [float(lo[j]), float(hi[j])] for j, k in enumerate(("A", "B", "C_mid"))}


def recipe_key(config, path):
    if config is None:
        return "file:" + str(path)  # no config record: its own group
    own = {"reward"} if config.get("dataset") in ("toy", "box") else set()  # their own reward; older logs say math
    return json.dumps({k: v for k, v in config.items() if k not in IGNORED_CONFIG_KEYS | own
                       and not k.endswith(("_dir", "_path"))}, sort_keys=True, default=str)


def load_run(path, args, max_compute=None, log=None):
    """Read one log (or take read_log's `log` of it), choose its fit window -> (Fit's data fields, R0 or None if
    fitted). Raises OSError, ValueError."""
    config, x, y, steps = log or read_log(path, args.x)
    if len(x) == 0:
        raise ValueError("no usable eval records")
    if max_compute is None:  # --fit-to-cmid gives its own
        max_compute = args.fit_fraction * x.max() if args.fit_fraction else args.max_compute
    max_compute = math.inf if max_compute is None else max_compute
    # x = 0 only sets R0, the paper's "initial reward at 0 training compute" (§1.1): the model passes through it
    r0 = float(y[x == 0].mean()) if (x == 0).any() else None
    # the early cut, the same for every window of a run (paper: the first 1.5k GPU-h of every fit): by default the
    # learning-rate warm-up, warmup_steps x batch completions drawn; A is also fitted with a cut twice as late
    warm = (config or {}).get("warmup_steps", 0)
    cut, late = ((steps >= warm, steps >= 2 * warm) if args.min_compute is None
                 else (x >= args.min_compute, x >= 2 * args.min_compute))
    in_fit = (x > 0) & (x <= max_compute) & cut
    num_params, num_distinct = (3 if r0 is not None else 4), len(np.unique(x[in_fit]))
    if num_distinct <= num_params:  # one point more than parameters, so the fit is not exact
        raise ValueError(f"only {num_distinct} distinct x > 0 in the fit window, need {num_params + 1} "
                         f"({'R0 observed' if r0 is not None else 'R0 fitted'})")
    if r0 is not None and r0 > 1 - A_STEP:  # leaves A no room above R0
        raise ValueError(f"pass rate is already {r0} at x = 0: nothing to fit")
    # a flat or falling curve fits any A with C_mid beyond the data, an artefact ranked first. Start: R0 or first third
    yf, third = y[in_fit], max(1, int(in_fit.sum()) // 3)
    start, end = (r0 if r0 is not None else float(yf[:third].mean())), float(yf[-third:].mean())
    if end - start < MIN_RISE:
        raise ValueError(f"the curve does not rise (from {start:.3f} to {end:.3f} over the fit window): no ceiling to "
                         f"fit; its level is {end:.3f}")
    return dict(file=str(path), name=str((config or {}).get("run_name") or Path(path).stem),
                group=recipe_key(config, path), x=x, y=y, in_fit=in_fit, max_compute=max_compute, late=late), r0


def fit_run(run, r0, args):
    """Sigmoid (grid, then joint refinement), power law and bootstrap for one loaded run."""
    xf, yf = run["x"][run["in_fit"]], run["y"][run["in_fit"]]
    A, B, C_mid, R0 = params = refine(xf, yf, grid_fit(xf, yf, r0), r0)
    if xf.max() < C_mid:  # the paper's fits reach ~3x C_mid (8k of 16k GPU-h, C_mid 2542)
        warn(f"{run['file']}: fit window ends at {fmt(xf.max())}, before C_mid = {fmt(C_mid)}: A is barely constrained")
    if B > 0.9 * B_BOUNDS[1]:  # a step, not a sigmoid: one jump between two evaluations (a near-flat curve)
        warn(f"{run['file']}: B = {B:.1f} is at its bound ({B_BOUNDS[1]:.0f}): the curve is one step; B unmeasured")
    resid, sst = yf - sigmoid(xf, *params), ((yf - yf.mean()) ** 2).sum()
    r2 = float(1 - resid @ resid / sst) if np.ptp(yf) > 0 else math.nan  # flat y: no R²
    late = run["in_fit"] & run["late"]  # A once more, with the early cut twice as late, where enough points remain
    enough = len(np.unique(run["x"][late])) > (3 if r0 is not None else 4)
    A_late = refine(run["x"][late], run["y"][late], params, r0)[0] if enough else None
    return Fit(**run, A=A, B=B, C_mid=C_mid, R0=R0, r0_observed=r0 is not None, power_law_A=fit_power_law(xf, yf),
               r2=r2, ci=bootstrap_ci(xf, yf, r0, params, args.bootstrap, args.ci, args.seed), A_late=A_late)


def refit_B(fit, A):
    """B with A pinned (paper A.5: within the margin, refit with the average A, compare B)."""
    r0 = fit.R0 if fit.r0_observed else None
    return refine(fit.x[fit.in_fit], fit.y[fit.in_fit], (A, fit.B, fit.C_mid, fit.R0), r0, A)[1]


def compare(fits, margin):
    """Paper §4, A.5: rank by A; a run over `margin` below the best has "lower A", within it both are refit at their
    average A and the higher B is "at least as good in terms of efficient scalability". -> [(fit, verdict, refit)]."""
    ranked = sorted(fits, key=lambda f: -f.A)
    rows = [(f, "best", None) for f in ranked[:1]]
    for f in ranked[1:]:
        best, A_avg = ranked[0], (ranked[0].A + f.A) / 2
        refit = None if best.A - f.A > margin else (A_avg, refit_B(f, A_avg), refit_B(best, A_avg))
        rows.append((f, "lower A", None) if refit is None else
                    (f, f"same A within margin, B {'better' if refit[1] > refit[2] else 'worse'}", refit))
    return rows


def seed_groups(fits):
    """Seeds of one recipe (runs differing only in IGNORED_CONFIG_KEYS), groups of >= 2 -> {key: stats} (A.5)."""
    groups, stats = {}, {}
    for f in fits:
        groups.setdefault(f.group, []).append(f)
    for key, g in ((k, g) for k, g in groups.items() if len(g) >= 2):  # std is the sample std over seeds
        stats[key] = {"runs": [f.name for f in g], "n_runs": len(g), "A_range": float(np.ptp([f.A for f in g]))}
        for p, v in ((p, [getattr(f, p) for f in g]) for p in ("A", "B", "C_mid")):
            stats[key] |= {f"{p}_mean": float(np.mean(v)), f"{p}_std": float(np.std(v, ddof=1))}
    return stats


def extrapolation(f):
    """Past the window: the fit's error, its own rise from the window's last point, and persistence's error."""
    beyond, last = f.x > f.max_compute, np.argmax(np.where(f.in_fit, f.x, -np.inf))
    at_last, pred = (sigmoid(x, f.A, f.B, f.C_mid, f.R0) for x in (f.x[last], f.x[beyond]))
    return [{"x": float(a), "predicted": float(p), "actual": float(b), "error": float(p - b),
             "rise": float(p - at_last), "persistence_error": float(f.y[last] - b)}
            for a, p, b in zip(f.x[beyond], pred, f.y[beyond])]


def print_json(rows, groups, args):
    # B at one common A (the median), as the paper's LOO compares recipes sharing a ceiling (§4, Fig. 7)
    A_common = float(np.median([f.A for f, _, _ in rows]))
    for f, verdict, refit in rows:
        xf = f.x[f.in_fit]
        B_common = f.B if len(rows) == 1 else refit_B(f, A_common) if abs(f.A - A_common) <= args.margin else None
        print(json.dumps({
            "file": f.file, "run": f.name, "A": f.A, "A_late_cut": f.A_late, "B": f.B, "C_mid": f.C_mid, "R0": f.R0,
            "R0_observed": f.r0_observed, "r2": f.r2 if math.isfinite(f.r2) else None, "n_points": len(xf),
            "x_key": args.x, "window": [float(xf.min()), float(xf.max())], "ci_level": args.ci, "A_ci": f.ci.get("A"),
            "B_ci": f.ci.get("B"), "C_mid_ci": f.ci.get("C_mid"), "power_law_A": f.power_law_A, "verdict": verdict,
            "refit": refit and {"A_avg": refit[0], "B": refit[1], "B_best": refit[2]},
            "seed_group": groups.get(f.group), "extrapolation": extrapolation(f), "A_common": A_common,
            "B_at_A_common": B_common}))


def fmt(v):  # compute values: 2542, 10909, 1.2e+11 (no 1.091e+04)
    return f"{v:.0f}" if 1e4 <= v < 1e8 else f"{v:.4g}"


def print_tables(rows, groups, args):
    print(f"{'run':<24} {'A':>6} {'A late':>6} {'B':>6} {'C_mid':>9} {'R0':>7} {'R²':>6} {'n':>4} "
          f"{'A ' + format(args.ci, '.0%') + ' CI':>16} {'pow A':>6}  verdict vs best (refit B vs best's at common A)")
    for f, verdict, refit in rows:
        ci = f"[{f.ci['A'][0]:.3f}, {f.ci['A'][1]:.3f}]" if f.ci else "-"
        late = "-" if f.A_late is None else f"{f.A_late:.3f}"
        print(f"{f.name[:24]:<24} {f.A:6.3f} {late:>6} {f.B:6.2f} {fmt(f.C_mid):>9} {f.R0:6.3f}"
              f"{' ' if f.r0_observed else '*'} {f.r2:6.3f} {int(f.in_fit.sum()):4d} {ci:>16} {f.power_law_A:6.3f}  "
              + verdict + (f" ({refit[1]:.2f} vs {refit[2]:.2f} at A={refit[0]:.3f})" if refit else ""))
    print(f"A late: A with the early cut twice as late. A margin {args.margin} (paper A.5); * R0 fitted (no x = 0 "
          f"point); pow A: power-law fit's A on the same window (paper A.4; {MAX_POWER_LAW_A:.3f} is its bound)")
    if at_top := ", ".join(f.name for f, _, _ in rows if f.A > 0.995):  # a pass rate cannot exceed 1
        print(f"A at the top of its range (1) for {at_top}: no plateau in the data yet, so A is an upper bound, not "
              "a measurement; comparisons with them rest on B and C_mid")
    for g in groups.values():
        print(f"seed group of {g['n_runs']} ({', '.join(g['runs'])}): A mean {g['A_mean']:.3f}, "
              f"std {g['A_std']:.3f}, range {g['A_range']:.3f}; B mean {g['B_mean']:.2f}, std {g['B_std']:.2f}; "
              f"C_mid mean {fmt(g['C_mid_mean'])}, std {fmt(g['C_mid_std'])}")
    for f, _, _ in rows:
        xf = f.x[f.in_fit]
        print(f"\n{f.name} ({f.file}): fit on {args.x} in [{fmt(xf.min())}, {fmt(xf.max())}]"
              + "".join(f", {k} CI [{fmt(lo)}, {fmt(hi)}]" for k, (lo, hi) in f.ci.items() if k != "A"))
        points = extrapolation(f)
        if points:
            mean_abs = [np.mean([abs(p[k]) for p in points]) for k in ("error", "persistence_error")]
            print(f"  extrapolation past {args.x} = {fmt(f.max_compute)}, max |error| "
                  f"{max(abs(p['error']) for p in points):.3f}; mean |error| {mean_abs[0]:.3f} against "
                  f"{mean_abs[1]:.3f} for persistence (the window's last evaluation carried forward):\n"
                  f"    {'x':>10} {'predicted':>9} {'actual':>7} {'error':>7} {'rise':>7} {'persist. error':>14}")
            for p in points:
                print(f"    {fmt(p['x']):>10} {p['predicted']:9.3f} {p['actual']:7.3f} {p['error']:+7.3f} "
                      f"{p['rise']:+7.3f} {p['persistence_error']:+14.3f}")


def plot(fits, path, x_key):
    """Points (o: fitted, x: not; x = 0 is off a log axis), fit solid, dashed to 1.5x the largest x, A dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, f in enumerate(fits):
        color, params = plt.get_cmap("tab10" if len(fits) <= 10 else "tab20")(i % 20), (f.A, f.B, f.C_mid, f.R0)
        for mask, size, marker in ((f.in_fit, 14, "o"), (~f.in_fit & (f.x > 0), 18, "x")):
            ax.scatter(f.x[mask], f.y[mask], s=size, color=color, marker=marker)
        xf = f.x[f.in_fit]
        inside, beyond = np.geomspace(xf.min(), xf.max(), 200), np.geomspace(xf.max(), 1.5 * f.x.max(), 100)
        label = f"{f.name}: A={f.A:.3f} B={f.B:.2f} C_mid={f.C_mid:.4g}"
        ax.plot(inside, sigmoid(inside, *params), "-", color=color, label=label)
        ax.plot(beyond, sigmoid(beyond, *params), "--", color=color)
        ax.axhline(f.A, color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"{UNITS.get(x_key, x_key)} (log scale)")
    ax.set_ylabel("validation pass rate (mean over held-out prompts x samples)")
    keys = [matplotlib.lines.Line2D([], [], color="gray", marker=m, linestyle=ls, label=label) for m, ls, label in
            [("o", "", "evaluation, fitted"), ("x", "", "evaluation, not fitted"), (None, "-", "sigmoid fit (fit "
             "window)"), (None, "--", "extrapolation"), (None, ":", "asymptote A")]]
    ax.legend(handles=ax.get_legend_handles_labels()[0] + keys, fontsize=7, loc="best")  # hides the fewest points
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: p.exit(2, f"error: {message}\n")  # one line, as every error here, not argparse's usage
    p.add_argument("files", nargs="+", help="JSON-lines logs written by train.py, one per run")
    p.add_argument("--x", default="samples", help="compute axis: samples (completions drawn, the default: the same "
                   "on every machine), gpu_hours (the paper's; carries the machine's speed and load), step, tokens")
    p.add_argument("--min-compute", type=float, metavar="X", help="fit only points with x >= X (in --x units). "
                   "Default: the run's warm-up (warmup_steps x batch), as the paper cuts the first 1.5k GPU-h of every "
                   "fit (§2.1, A.6). x = 0 only sets R0. A fit needs 4 distinct points (5 without x = 0)")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--max-compute", type=float, metavar="X", help="fit x <= X; later points check extrapolation")
    window.add_argument("--fit-fraction", type=float, metavar="F", help="set --max-compute to F times each run's "
                        "largest x, e.g. 0.5 (paper §5: fit on half the budget, extrapolate to the full one)")
    window.add_argument("--fit-to-cmid", type=float, metavar="F", help="set --max-compute to F times the C_mid of "
                        "each run's fit on all its points, e.g. 1.5: whether a fit on the rise predicts the plateau")
    p.add_argument("--margin", type=float, default=0.02, help="runs whose A differ by more rank by A; within it, "
                   "refit at their mean A, by B. Default 0.02 (paper A.5: 3 seeds' A within ±0.015)")
    p.add_argument("--bootstrap", type=int, default=200, metavar="N", help="resamples for the CIs (0: none; 200)")
    p.add_argument("--ci", type=float, default=0.95, help="confidence level, default 0.95")
    p.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed, default 0")
    p.add_argument("--json", action="store_true", help="one JSON object per fitted run per line, not tables")
    p.add_argument("--plot", metavar="FILE.png", help="also save a log-x plot of the fitted runs (no x = 0 points)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    fraction, to_cmid = (1 if v is None else v for v in (args.fit_fraction, args.fit_to_cmid))
    if not 0 < fraction <= 1 or not to_cmid > 0 or args.bootstrap < 0 or not 0 < args.ci < 1:
        parser.error("--fit-fraction must be in (0, 1], --fit-to-cmid > 0, --bootstrap >= 0 and --ci in (0, 1)")
    if args.plot:  # checked before any fitting
        import importlib.util
        suffix, folder = Path(args.plot).suffix.lower().lstrip("."), os.path.dirname(os.path.abspath(args.plot))
        if suffix not in PLOT_FORMATS:
            parser.error(f"--plot {args.plot}: {f'cannot draw a .{suffix} file' if suffix else 'no file extension'} "
                         "(give one of .png, .pdf, .svg, ...; the logs come before --plot)")
        if importlib.util.find_spec("matplotlib") is None:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(args.plot):
            parser.error(f"--plot {args.plot}: " + ("a folder, not a file" if os.path.isdir(args.plot) else
                                                    f"{folder} is not a writable folder"))
    if len({os.path.realpath(p) for p in args.files}) < len(args.files):  # else a "seed group" of one run, std 0
        parser.error("a log is given twice: give each once")
    fits, t_last = [], time.monotonic()
    for i, path in enumerate(args.files):
        if time.monotonic() - t_last > 10:  # thousands of logs: say how far it is
            t_last = warn(f"fitted {i} of {len(args.files)} logs") or time.monotonic()
        try:
            log = read_log(path, args.x)  # read once: a live run's log may grow between two reads
            run, r0 = load_run(path, args, log=log)
            if args.fit_to_cmid:  # first the fit on every point, for its C_mid
                whole = fit_run(run, r0, argparse.Namespace(**{**vars(args), "bootstrap": 0}))
                run, r0 = load_run(path, args, max_compute=args.fit_to_cmid * whole.C_mid, log=log)
            fits.append(fit_run(run, r0, args))
        except OSError as e:
            warn(f"{path}: cannot read: {e.strerror or e}")
        except ValueError as e:
            warn(f"{path}: not fitted: {e}")
        except (RuntimeError, FloatingPointError, np.linalg.LinAlgError) as e:  # a degenerate curve
            warn(f"{path}: not fitted: the optimizer failed ({type(e).__name__}: {e})")
    if not fits:
        warn("error: no file could be fitted")
        return 1
    rows, groups = compare(fits, args.margin), seed_groups(fits)
    (print_json if args.json else print_tables)(rows, groups, args)
    if args.plot:
        try:
            plot([f for f, _, _ in rows], args.plot, args.x)
        except OSError as e:
            warn(f"error: --plot {args.plot}: cannot write the plot ({e.strerror or e})")
            return 1
    return 0


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):  # `| head` ends quietly, as with cat
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
