"""The paper in miniature (paper §4, §6, §11): the ScaleRL recipe with 3 seeds and every leave-one-out row on
the CPU toy, then sigmoid fits, the A/B comparison and the fit-on-half extrapolation check.

    python study.py                      # runs what is missing (about 2 hours on 2 cores), then fits
    python study.py --fit_only           # just the fits and the figure from logs/study/*.jsonl
    python study.py --runs default-s0,loo-dapo

Each run is `python train.py <flags> --run_name <name> --log_dir logs/study` with the toy's defaults; a run
whose log already holds its final evaluation is not run again (kill the script at any time and start it again;
an interrupted run resumes from its last checkpoint). Results: logs/study/fits.json (fit_curve --json),
logs/study/table.md, and study.png.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.abspath(__file__))
LOG_DIR = os.path.join(ROOT, "logs", "study")
OUT_DIR = os.path.join(ROOT, "out")
# name -> flags: the ScaleRL default (3 seeds) and one run per reverted choice (paper §6 LOO, Fig. 7), plus NPR
RUNS = {
    "default-s0": ["--seed", "0"],
    "default-s1": ["--seed", "1"],
    "default-s2": ["--seed", "2"],
    "loo-8op": ["--mode", "ppo", "--k", "8"],  # PPO-off-policy-8 instead of PipelineRL-8
    "loo-dapo": ["--loss", "dapo"],  # DAPO's clipped surrogate instead of CISPO
    "loo-fp32": ["--no_fp32_head"],  # LM head in the body's dtype (the toy's bf16) on both sides
    "loo-savg": ["--loss_agg", "sample"],  # sample-average loss aggregation instead of prompt-average
    "loo-plan": ["--adv_norm", "prompt"],  # prompt-level advantage normalization instead of batch-level
    "loo-batch": ["--no_zero_var_filter"],  # zero-variance groups kept in the batch
    "loo-lp": ["--length_penalty"],  # DAPO length penalty instead of forced interruptions
    "loo-npr": ["--no_npr"],  # no No-Positive-Resampling (not a LOO row in the paper)
}


def finished(name: str) -> bool:
    path = os.path.join(LOG_DIR, f"{name}.jsonl")
    if not os.path.exists(path):
        return False
    records = [json.loads(line) for line in open(path) if line.strip().startswith("{") and line.strip().endswith("}")]
    config = next((r for r in records if r["kind"] == "config"), {})
    return any(r["kind"] == "eval" and r["step"] == config.get("max_steps") for r in records)


def run(name: str, core: int | None = None) -> bool:
    """Run (or resume) one training run; True when it finished. With `core`, the run is pinned to that CPU core
    (torch and vLLM's OpenMP threads), so that two runs share a 2-core machine without fighting."""
    path = os.path.join(LOG_DIR, f"{name}.jsonl")
    cmd = [sys.executable, "train.py", *RUNS[name], "--run_name", name, "--log_dir", LOG_DIR]
    if glob.glob(os.path.join(OUT_DIR, name, "ckpt-[0-9]*[0-9]")):
        cmd.append("--resume")
    else:  # killed before its first checkpoint: start over rather than append a second run to the log
        shutil.rmtree(os.path.join(OUT_DIR, name), ignore_errors=True)
        if os.path.exists(path):
            os.remove(path)
    env = dict(os.environ)
    if core is not None:
        env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND=str(core))
    print(f"study: {' '.join(cmd[1:])}" + (f" (core {core})" if core is not None else ""), flush=True)
    with open(os.path.join(LOG_DIR, f"{name}.out"), "a") as out:
        status = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:
        print(f"study: {name} failed with exit status {status}; see {LOG_DIR}/{name}.out", file=sys.stderr)
    return status == 0


def fit(margin: float = 0.02):
    """fit_curve over every log: the full fit (A, B, C_mid with bootstrap CIs, seed spread) and the fit on the
    first half of each run's compute checked against the second half (the figure, like the paper's Fig. 2).
    Each leave-one-out row is then classified against the default's 3 seeds as the paper does (§4): A above or
    below their mean by more than the margin, else the same A and the slope B at a common A decides."""
    logs = [os.path.join(LOG_DIR, f"{n}.jsonl") for n in RUNS if os.path.exists(os.path.join(LOG_DIR, f"{n}.jsonl"))]
    fc = [sys.executable, "fit_curve.py", *logs, "--margin", str(margin)]
    show = lambda extra: print((lambda p: p.stdout + p.stderr)(  # noqa: E731
        subprocess.run(fc + extra, cwd=ROOT, capture_output=True, text=True)))
    show([])
    show(["--fit-fraction", "0.5", "--bootstrap", "0", "--plot", os.path.join(ROOT, "study.png")])
    as_json = lambda extra: [json.loads(line) for line in subprocess.run(  # noqa: E731
        fc + ["--json", *extra], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()]
    rows = sorted(as_json([]), key=lambda r: list(RUNS).index(r["run"]) if r["run"] in RUNS else len(RUNS))
    halves = {r["run"]: r for r in as_json(["--fit-fraction", "0.5", "--bootstrap", "0"])}
    with open(os.path.join(LOG_DIR, "fits.json"), "w") as f:  # not .jsonl: `fit_curve.py logs/study/*.jsonl`
        json.dump(rows, f, indent=1)
    default = [r for r in rows if r["run"].startswith("default-")]
    A_def = sum(r["A"] for r in default) / max(len(default), 1)
    B_seeds, C_seeds = [r["B_at_A_common"] for r in default], [r["C_mid"] for r in default]

    def verdict(r):
        if r["run"].startswith("default-") or not default:
            return "ScaleRL (default)"
        if r["A"] > A_def + margin:
            return "higher A"
        if r["A"] < A_def - margin:
            return "lower A"
        return "same A; " + against("B", r["B_at_A_common"], B_seeds, +1) + "; " + \
            against("C_mid", r["C_mid"], C_seeds, -1)

    def against(name, value, seeds, sign):  # sign +1: higher is better (B); -1: lower is better (C_mid)
        if min(seeds) <= value <= max(seeds):
            return f"{name} within the seeds' range"
        return f"{name} " + ("better" if sign * (value - sum(seeds) / len(seeds)) > 0 else "worse")

    lines = ["| run | flags | A | A 95% CI | B at common A | C_mid (device-h) | R² | verdict vs ScaleRL | final pass "
             "rate | predicted from first half | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        last = (halves.get(r["run"], {}).get("extrapolation") or [{}])[-1]
        ci = r.get("A_ci") or [float("nan")] * 2
        lines.append(f"| {r['run']} | `{' '.join(RUNS.get(r['run'], []))}` | {r['A']:.3f} | [{ci[0]:.3f}, {ci[1]:.3f}] | "
                     f"{r['B_at_A_common']:.2f} | {r['C_mid']:.3g} | {r['r2']:.3f} | {verdict(r)} | "
                     f"{last.get('actual', float('nan')):.3f} | {last.get('predicted', float('nan')):.3f} | "
                     f"{last.get('error', float('nan')):+.3f} |")
    lines.append(f"\nCommon A (mean over all runs) {rows[0]['A_common']:.3f}; default seeds: A mean {A_def:.3f}, "
                 f"B at common A {', '.join(f'{b:.2f}' for b in B_seeds)}, C_mid "
                 f"{', '.join(f'{c:.3g}' for c in C_seeds)}; margin {margin}. Verdicts: A beyond the margin first, "
                 f"then B (higher is better) and C_mid (lower is better) against the range of the default's seeds.")
    with open(os.path.join(LOG_DIR, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated names from RUNS (default: all)")
    ap.add_argument("--fit_only", action="store_true", help="skip training; fit the logs that exist")
    ap.add_argument("--jobs", type=int, default=1, choices=[1, 2],
                    help="runs at a time; 2 pins each run to its own core (on 2 cores: more runs per hour, and "
                         "every run sees the same 1-core machine, so their device-hours stay comparable)")
    args = ap.parse_args()
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        print(f"error: unknown runs {unknown}; choose from {', '.join(RUNS)}", file=sys.stderr)
        sys.exit(2)
    ok = True
    if not args.fit_only:
        os.makedirs(LOG_DIR, exist_ok=True)
        todo = [n for n in names if not finished(n)]
        if args.jobs == 1:
            ok = all([run(n) for n in todo])
        else:  # worker j always uses core j
            with ThreadPoolExecutor(args.jobs) as pool:
                lanes = [todo[j::args.jobs] for j in range(args.jobs)]
                ok = all(pool.map(lambda j: all([run(n, core=j) for n in lanes[j]]), range(args.jobs)))
    fit()
    sys.exit(0 if ok else 1)
