"""The paper in miniature (§4-6) on the CPU toy: runs of the toy preset with one change each, sigmoid fits in
completions drawn, whether a fit on the rise predicts the plateau, and each comparison pooled over its seeds. Each
part takes at most 2 h with --jobs 2 on the 2-core machine (docs/study.md):

    python study.py --part seeds --jobs 2        # `python train.py` with seeds 0-2: the references
    python study.py --part axes-batch --jobs 2   # one part: PARTS["axes-batch"] (each part's comment says what)
    python study.py --part all --fit_only --log_dir docs/logs/study-v4   # every table and figure from those logs

Each run is `python train.py <flags> --run_name <name> --log_dir logs/study`; a finished run is not run again, an
interrupted one resumes from its last checkpoint; a progress line a minute. A family's parts (family()) share
<log_dir>/<family>.md, <family>-fits.json and docs/<log_dir's name>-<family>.png (axes, eval: one a setting)."""
import argparse
import collections
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.abspath(__file__))
LOG_DIR = os.path.join(ROOT, "logs", "study")
OUT_DIR = os.path.join(ROOT, "out")
DOCS_DIR = os.path.join(ROOT, "docs")  # the figures, named FIG_STEM-<table>.png
FIG_STEM = "study"  # --log_dir docs/logs/study-v3 draws docs/study-v3-*.png
_children: list = []  # the train.py processes running now
_stopping = threading.Event()  # set by SIGTERM: a lane whose run stopped takes no next one


def seeded(prefix: str, flags: list[str], seeds) -> dict:  # runs <prefix>-s<seed>: the flags, then --seed
    return {f"{prefix}-s{s}": [*flags, "--seed", str(s)] for s in seeds}


# Every run is the toy preset (config.TOY) plus its own flags. Not CURRENT: the version-2 toy's (git 68153cd; refits
# only, with VERSION2). Version 3 ran on a 3,500-prompt pool (git a9d6986), 4's and 5's on today's (docs/logs/study-v?)
CURRENT = ("seeds", "axes-batch", "hot5", "seeds-pool", "axes-batch-pool", "axes-toys-pool", "carry", "carry-batch")
VERSION2 = ["--max_steps", "250", "--think_min_tokens", "40", "--think_max_tokens", "48"]
PARTS = {  # name -> flags, by part: each under 2 h with --jobs 2 on the 2-core machine (times in docs/study.md)
    "seeds": seeded("default", [], range(3)),
    "seeds-pool": seeded("pool", ["--max_steps", "1000"], range(3)),  # the default run on to 1,000 steps
    # paper §5 (Fig. 9): a longer thinking budget raises A. 56-64 tokens fit sums of up to 8 terms (toy.py)
    "axes-budget": seeded("budget64", ["--think_min_tokens", "56", "--think_max_tokens", "64"], range(2)),
    # paper §5 (Fig. 10): larger batches raise A; small ones look better early and are overtaken. Here 32 x 8
    "axes-batch": seeded("batch256", ["--batch", "256", "--max_steps", "250"], range(3)),  # equal completions
    "axes-batch-pool": seeded("b256pool", ["--batch", "256", "--max_steps", "500"], range(3)),  # as pool-s*
    # paper §5 (Fig. 1): a larger model reaches a higher A. The toy (1.08M parameters) against toy-s (0.29M) and toy-l
    "axes-size": seeded("small", ["--model", "toy-s", "--max_steps", "5000"], range(2)),
    "axes-large": seeded("large", ["--model", "toy-l"], range(2)),
    "axes-toys-pool": seeded("toys", ["--model", "toy-s", "--max_steps", "1000"], range(2)),  # as pool-s*
    # version 5's pilot (toy.TEACHERS: each decade's carry a skill found from rare successes); batch 2x as b256pool
    "carry": seeded("carry", ["--model", "toy-carry", "--max_steps", "1000"], range(4)),
    "carry-batch": seeded("carryb256", ["--model", "toy-carry", "--batch", "256", "--max_steps", "500"], range(4)),
    # paper §5 (A.13, Fig. 17): 8-32 generations a prompt at a fixed batch: curves "essentially unchanged"
    "axes-group": {**seeded("group16", ["--group", "16"], range(2)), **seeded("group4", ["--group", "4"], range(2))},
    # paper §6 (Fig. 7): each leave-one-out row keeps A (within 0.02) and costs B or C_mid; here against the default
    "axes-loo": {**seeded("nozvf", ["--no_zero_var_filter"], range(2)),
                 **seeded("advprompt", ["--adv_norm", "prompt"], range(2))},
    "axes-loo-more": {**seeded("savg", ["--loss_agg", "sample"], range(2)),
                      **seeded("lp", ["--length_penalty", "--no_interruptions"], range(2)),  # Eq. 9's penalty
                      # lp's fair reference: interruptions at exactly 48 thinking tokens, lp's L_max - L_cache
                      **seeded("cut48", ["--think_min_tokens", "48"], range(2))},
    # paper §3.2(c), §6: the FP32 head matters beside a bf16 body only; default-bf16-s* is nofp32-s*'s reference
    "axes-fp32": {**seeded("default-bf16", ["--dtype", "bfloat16"], range(2)),
                  **seeded("nofp32", ["--dtype", "bfloat16", "--no_fp32_head"], range(2))},
    # the fit up to 1.5 C_mid with 4x the evaluation samples (8 a prompt); eval2-s* are eval8-s*'s runs at 2 samples
    "eval": {**seeded("eval8", ["--eval_samples", "8"], range(2)), **seeded("eval2", [], range(2))},
    "eval-warmup": seeded("warm5", ["--warmup_steps", "5"], range(2)),  # the early cut at 0.15 C_mid, not 0.6
    # half the learning rate, so a policy that swings less; the warm-up and the run twice as long, so the same cut
    "eval-lr": seeded("lr25", ["--lr", "2.5e-5", "--warmup_steps", "40", "--max_steps", "500"], range(5)),
    # paper §3.2(a), Fig. 4b: at PPO-off-policy-8 (lags up to 7) CISPO beats DAPO; stale-s* is the reference (CISPO)
    "loo": {**seeded("stale", ["--mode", "ppo", "--k", "8"], range(2)),
            **seeded("loo-dapo", ["--mode", "ppo", "--k", "8", "--loss", "dapo"], range(2))},
    # paper §3.2(d), Fig. 6b: No-Positive-Resampling needs epochs: 500 prompts, 4,000 draws (the paper's ~6.7 epochs)
    "npr": {**seeded("npr500", ["--train_prompts", "500"], range(2)),
            **seeded("nonpr500", ["--train_prompts", "500", "--no_npr"], range(2))},
    # §3.2(a) where DAPO's clip acts: PPO-off-policy-8 at lr 2e-4 (version 2), 5e-4 (version 3: it clips 5-11%)
    "hot": {**seeded("hot-cispo", ["--mode", "ppo", "--k", "8", "--lr", "2e-4"], range(2)),
            **seeded("hot-dapo", ["--mode", "ppo", "--k", "8", "--lr", "2e-4", "--loss", "dapo"], range(2))},
    "hot5": {**seeded("hot5-cispo", HOT5 := ["--mode", "ppo", "--k", "8", "--lr", "5e-4", "--max_steps", "250"],
                      range(3)), **seeded("hot5-dapo", [*HOT5, "--loss", "dapo"], range(3))},
}
MIN_R2 = 0.5  # a fit explaining less of its evaluations' variance than this is no sigmoid: not judged, not pooled
# the runs each table's rows are judged against, by name prefix
REFERENCES = dict(seeds=("default-", "pool-"), axes=("default-", "pool-"), loo=("stale-",), npr=("npr500-",),
                  hot=("hot-cispo-",), hot5=("hot5-cispo-",), eval=("eval2-",), carry=("carry-",))


def family(part: str) -> str:  # the table a part's runs go in: seeds, loo, npr, hot, hot5, eval, axes or carry
    return part.split("-")[0]


def runs_of(table: str) -> list[str]:  # every part of the table's family
    return [n for part, runs in PARTS.items() if family(part) == table for n in runs]


def flags_of(name: str) -> list[str]:
    """A run's flags in PARTS: its command line beyond train.py's toy preset."""
    part, own = next((p, PARTS[p][name]) for p in PARTS if name in PARTS[p])
    pairs = [] if part in CURRENT else zip(VERSION2[::2], VERSION2[1::2])  # those its own flags leave alone
    return [x for flag, value in pairs if flag not in own for x in (flag, value)] + own


def records(name: str) -> list[dict]:
    lines = path.read_text().splitlines() if (path := Path(LOG_DIR, f"{name}.jsonl")).exists() else []
    return [json.loads(line) for line in lines if line.strip().startswith("{") and line.strip().endswith("}")]


def target_steps(name: str) -> int:
    """The step a run ends at with today's flags and toy preset (raise it, and finished runs resume to it)."""
    import config
    return config.parse_args(flags_of(name)).max_steps


def finished(name: str, logged: bool = False) -> bool:
    """Its final evaluation is logged: at today's target step, or (logged) at its own run's (version 2 ran 250)."""
    recs = records(name)
    configs = [r["max_steps"] for r in recs if r["kind"] == "config"]  # a resumed run logs its config again
    end = configs[-1] if logged and configs else target_steps(name)
    return any(r["kind"] == "eval" and r["step"] == end for r in recs)


def run(name: str, core: int | None = None) -> bool:
    """Run (or resume) one run, pinned to `core` if given (so two share 2 cores without fighting); True if it ended."""
    if finished(name):  # since the queue was made (another study.py ran it): a resume would evaluate its end again
        return True
    cmd = [sys.executable, "train.py", *flags_of(name), "--run_name", name, "--log_dir", LOG_DIR]
    if glob.glob(os.path.join(OUT_DIR, name, "ckpt-[0-9]*[0-9]")):
        cmd.append("--resume")
    else:  # killed before its first checkpoint: start over rather than append a second run to the log
        shutil.rmtree(os.path.join(OUT_DIR, name), ignore_errors=True)
        Path(LOG_DIR, f"{name}.jsonl").unlink(missing_ok=True)
    pinned = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": str(core)} if core is not None else {}
    sys.stdout.write(f"study: {' '.join(cmd[1:])}" + (f" (core {core})" if core is not None else "") + "\n")  # 1 write
    sys.stdout.flush()
    with open(os.path.join(LOG_DIR, f"{name}.out"), "a") as out:
        cmd = ["taskset", "-c", str(core), *cmd] if core is not None and shutil.which("taskset") else cmd
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **pinned}, stdout=out, stderr=subprocess.STDOUT)
        _children.append(proc)
        status = proc.wait()
        _children.remove(proc)
    if status != 0:
        print(f"study: {name} failed with exit status {status}; see {LOG_DIR}/{name}.out", file=sys.stderr)
    return status == 0


def _stop(signum, frame):
    """SIGTERM: pass it on to every running train.py, which stops after its current step and a checkpoint (the part
    resumes from there), wait for them (killed after 10 minutes), exit 128 + signum."""
    _stopping.set()
    print("study: stopping; running runs stop after their current step and a checkpoint", file=sys.stderr, flush=True)
    for proc in list(_children):
        proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 600
    for proc in list(_children):
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
    os._exit(128 + signum)


def run_all(names: list[str], jobs: int) -> bool:
    """Run these, `jobs` at a time, each lane taking the next when free (runs differ in length); True if all ended."""
    todo = collections.deque(names)  # its pops are thread-safe: each run goes to one lane

    def lane(core):  # lane j always uses core j (None: one lane, unpinned)
        results = []
        while not _stopping.is_set():
            try:
                name = todo.popleft()
            except IndexError:
                return all(results)
            results.append(run(name, core=core))
        return False

    with ThreadPoolExecutor(jobs) as pool:
        return all(pool.map(lane, [None] if jobs == 1 else range(jobs)))


def progress(names: list[str], stop: threading.Event, every_s: float = 60.0):
    """One line a minute: each unfinished run's last step and last evaluation."""
    t0 = time.time()
    while not stop.wait(every_s):
        parts = []
        for name in names:
            recs = records(name)
            if not recs or finished(name):
                continue
            train, evals = ([r for r in recs if r["kind"] == kind] for kind in ("train", "eval"))
            parts.append(f"{name} step {train[-1]['step'] if train else 0}/{target_steps(name)}"
                         + (f" pass {evals[-1]['pass_rate']:.3f}" if evals else ""))
        print(f"study: {time.time() - t0:.0f}s, {sum(map(finished, names))}/{len(names)} done; " + "; ".join(parts),
              flush=True)


def staleness(name: str) -> dict:
    """Over a run's training steps, weighted by each step's trained tokens: the mean lag in versions, the share at
    the bound k - 1 (the paper's staleness, §3.1), and the share clipped (DAPO) or truncated (CISPO: rho > eps_max)."""
    import config
    k = config.parse_args(flags_of(name)).k
    steps = [r for r in records(name) if r["kind"] == "train"]
    totals = [r["tokens"] for r in steps]  # trained tokens from the start of the run
    weights = [b - a for a, b in zip([0, *totals], totals)]  # each step's own
    tokens = max(sum(weights), 1)

    def mean(value):  # token-weighted mean of value(step record)
        return sum(w * value(r) for w, r in zip(weights, steps)) / tokens

    return {"lag": mean(lambda r: sum(i * share for i, share in enumerate(r["lag_hist"]))),
            "at_bound": mean(lambda r: r["lag_hist"][k - 1]), "clipped": mean(lambda r: r["clip_frac"]), "k": k}


def fit_curve(logs: list[str], *extra: str) -> list[dict]:  # fit_curve.py's fits, one dict a log
    return [json.loads(line) for line in subprocess.run([sys.executable, "fit_curve.py", *logs, "--json", *extra],
                                                        cwd=ROOT, capture_output=True).stdout.splitlines()]


def setting(name: str) -> str:  # a run's name without its seed: "batch64-s1" -> "batch64", "loo-dapo" as is
    return re.sub(r"-s\d+$", "", name)


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:  # over the groups of 2+ values; and its dof
    import numpy as np
    multi = [g for g in groups if len(g) > 1]
    dof = sum(len(g) - 1 for g in multi)
    return (math.sqrt(sum(float(np.var(g, ddof=1)) * (len(g) - 1) for g in multi) / dof) if dof else 0.0), dof


def effects(rows: dict, groups: dict, dtype: dict) -> list[str]:
    """Each setting against its references, pooled over seeds: ΔA, ΔB (at the common A), the ratio of C_mid, with 95%
    Student-t intervals from the seed spread of the comparison's own runs (or the table's where they give none),
    widened to a lone run's own fit interval; beside ΔA, the table-pooled interval. Left out: a run whose A is not
    identified (interval wider than 0.1, C_mid beyond its window) or whose fit explains under MIN_R2 of the variance."""
    import numpy as np
    from scipy import stats
    fitted = {n: r for n, r in rows.items() if r.get("A_ci") and r["A_ci"][1] - r["A_ci"][0] <= 0.1
              and 0 < r["C_mid"] <= r["window"][1]  # a fit whose window ends before C_mid may pin A to its bound
              and r["r2"] >= MIN_R2}
    values = {"A": {n: r["A"] for n, r in fitted.items()},  # B only where A is that of the others (fit_curve.py)
              "B": {n: r["B_at_A_common"] for n, r in fitted.items() if r["B_at_A_common"] is not None},
              "C_mid": {n: math.log(r["C_mid"]) for n, r in fitted.items()}}  # quantity -> run -> value
    ref_names = {d: [r["run"] for r in g] for d, g in groups.items()}
    settings = {}  # setting -> its runs (the references' seeds form one setting per dtype)
    for n in rows:
        settings.setdefault(setting(n), []).append(n)
    spread = {q: pooled_sd([[v[n] for n in runs if n in v] for runs in settings.values()]) for q, v in values.items()}
    lines = ["| setting | runs | A | ΔA vs reference [95% CI] | ΔB [95% CI] | C_mid ratio [95% CI] | separated from "
             "seed spread | ΔA's 95% CI, table-pooled spread |", "|---|---|---|---|---|---|---|---|"]
    for name, runs in settings.items():
        refs = ref_names.get(dtype[runs[0]], [])
        if not refs or set(runs) == set(refs):
            continue
        cells, separated, pooled_a = [], [], "n/a"
        for q, v in values.items():
            x, y = [v[n] for n in runs if n in v], [v[n] for n in refs if n in v]
            sd, dof = own if (own := pooled_sd([x, y]))[1] else spread[q]  # this comparison's spread, or the table's
            if not x or not y or not dof:
                cells.append("n/a")
                continue
            ref_mean = float(np.mean(y))
            d = float(np.mean(x)) - ref_mean
            scale = math.sqrt(1 / len(x) + 1 / len(y))
            half = float(stats.t.ppf(0.975, dof)) * sd * scale
            lo, hi = d - half, d + half
            if q == "A" and spread[q][1]:
                table_half = float(stats.t.ppf(0.975, spread[q][1])) * spread[q][0] * scale
                pooled_a = f"[{d - table_half:+.3f}, {d + table_half:+.3f}]"
            if len(x) == 1 and q != "B":  # a lone run: its own fit's interval where wider (none for B at common A)
                own = [c if q == "A" else math.log(c) for c in rows[next(n for n in runs if n in v)][f"{q}_ci"]]
                lo, hi = min(lo, own[0] - ref_mean), max(hi, own[1] - ref_mean)
            if q == "C_mid":  # a ratio: C_mid below 1x is faster
                cells.append(f"{math.exp(d):.2f}x [{math.exp(lo):.2f}, {math.exp(hi):.2f}]")
            else:
                cells.append(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if q == "A" else f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]")
            if lo > 0 or hi < 0:
                separated.append({"A": "higher A" if d > 0 else "lower A", "B": "higher B" if d > 0 else "lower B",
                                  "C_mid": "lower C_mid" if d < 0 else "higher C_mid"}[q])
        a = [values["A"][n] for n in runs if n in values["A"]]
        used = f" ({len(a)} with A identified)" if len(a) < len(runs) else ""
        lines.append(f"| {name} | {len(runs)}{used} | {f'{np.mean(a):.3f}' if a else 'not identified'} | "
                     f"{' | '.join(cells)} | {', '.join(separated) or 'none'} | {pooled_a} |")
    return lines


def against(name: str, value, values: list, sign: int) -> str:
    """A row's B or C_mid against the references' range; sign +1: higher is better (B), -1: lower is (C_mid)."""
    values = [v for v in values if v is not None]  # no B at the common A for a run with another ceiling
    if value is None:
        return f"{name} not compared (A beyond the margin from the common A)"
    if not values or min(values) <= value <= max(values):
        return f"{name} within the seeds' range"
    return f"{name} " + ("better" if sign * (value - sum(values) / len(values)) > 0 else "worse")


def verdict(r: dict, seeds: list[dict], margin: float) -> str:
    """A finished row against the references of its dtype, as the paper compares recipes (§4): A, then B and C_mid."""
    if r["r2"] < MIN_R2:  # e.g. a run that rose before the window and then swung or collapsed
        return f"no sigmoid in the window (R² {r['r2']:.2f}): compare its evaluations"
    if not seeds:
        return "no reference yet"
    if r["C_mid"] > r["window"][1]:  # still rising where its evaluations end: A may sit at the fit's bound
        return "A not identified (C_mid beyond the last evaluation fitted)"
    A_ref = sum(s["A"] for s in seeds) / len(seeds)
    lo, hi = r.get("A_ci") or (r["A"], r["A"])
    # A beyond the margin counts only when its 95% interval is too (a run that ends before its rise is not)
    if abs(r["A"] - A_ref) > margin and lo - margin <= A_ref <= hi + margin:
        return f"A not separated from the seeds' (95% CI {lo:.3f}-{hi:.3f})"
    if abs(r["A"] - A_ref) > margin:
        return "higher A" if r["A"] > A_ref else "lower A"
    return "same A; " + against("B", r["B_at_A_common"], [s["B_at_A_common"] for s in seeds], +1) + "; " + \
        against("C_mid", r["C_mid"], [s["C_mid"] for s in seeds], -1)


def run_rows(names: list[str], rows: dict, halves: dict, verdicts: dict, unit: str, stale_cols: bool) -> list[str]:
    """The markdown table of the fitted runs, in the order of names; with stale_cols, their staleness too."""
    head, rule = (" mean lag | tokens at lag k − 1 | clipped tokens |", "---|---|---|") if stale_cols else ("", "")
    lines = [f"| run | flags | A [95% CI] | B [95% CI] | C_mid {unit} [95% CI] | R² | verdict | last eval ± s.e. | "
             f"predicted from the rise (<= 1.5 C_mid) | error | persistence error |{head}",
             "|---|---|---|---|---|---|---|---|---|---|---|" + rule]
    nan = float("nan")
    for name in names:
        evals = [e for e in records(name) if e["kind"] == "eval"]
        # the log's own last evaluation: a fit on the rise has no extrapolation when C_mid lies beyond the window
        actual, se = (evals[-1]["pass_rate"], evals[-1].get("pass_rate_se", nan)) if evals else (nan, nan)
        st = staleness(name) if stale_cols else {}
        stale = f" {st['lag']:.2f} | {st['at_bound']:.1%} (k = {st['k']}) | {st['clipped']:.3%} |" if st else ""
        if name not in rows:  # fit_curve.py fits no curve that does not rise (it says why)
            if evals:
                peak = max(evals, key=lambda e: e["pass_rate"])
                lines.append(f"| {name} | `{' '.join(flags_of(name))}` | not fitted: no rise over the fit window "
                             f"(peak {peak['pass_rate']:.3f} at step {peak['step']}) | | | | | {actual:.3f} ± "
                             f"{se:.3f} | | | |{stale}")
            continue
        r = rows[name]
        last = (halves.get(name, {}).get("extrapolation") or [{}])[-1]
        ci = {k: r.get(f"{k}_ci") or [nan] * 2 for k in ("A", "B", "C_mid")}
        lines.append(
            f"| {name} | `{' '.join(flags_of(name))}` | {r['A']:.3f} [{ci['A'][0]:.3f}, {ci['A'][1]:.3f}] | "
            f"{r['B']:.2f} [{ci['B'][0]:.2f}, {ci['B'][1]:.2f}] | {r['C_mid']:.3g} [{ci['C_mid'][0]:.3g}, "
            f"{ci['C_mid'][1]:.3g}] | {r['r2']:.3f} | {verdicts[name]} | {actual:.3f} ± {se:.3f} | "
            f"{last.get('predicted', nan):.3f} | {last.get('error', nan):+.3f} | "
            f"{last.get('persistence_error', nan):+.3f} |{stale}")
    return lines


def plot(table: str, table_runs: list, names: list, logs: list, ref: list, suffix: str, x: str, dtype: dict):
    """One figure for the seeds and the LOO rows; axes and eval: one a setting (its runs, its dtype's references)."""
    plots = {} if table in ("axes", "eval") else {f"{FIG_STEM}-{table}{suffix}.png": logs}
    if table in ("axes", "eval"):
        stem = f"{FIG_STEM}-axis" if table == "axes" else f"{FIG_STEM}-eval"
        for axis in dict.fromkeys(n.split("-")[0] for n in table_runs if n not in ref):
            runs = [n for n in names if n.startswith(axis + "-")]
            if runs:  # an axis with no run yet gets no figure
                plots[f"{stem}-{axis}{suffix}.png"] = [log for n, log in zip(names, logs) if n in runs
                                                       or n in ref and dtype[n] == dtype[runs[0]]]
    for png, files in plots.items():
        done = subprocess.run([sys.executable, "fit_curve.py", *files, "--fit-to-cmid", "1.5", "--bootstrap", "0",
                               "--x", x, "--plot", os.path.join(DOCS_DIR, png)], cwd=ROOT, capture_output=True)
        if done.returncode:  # no run could be fitted (they collapsed): the evaluations alone
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(9, 5))
            for name in (os.path.basename(f).removesuffix(".jsonl") for f in files):
                evals = [r for r in records(name) if r["kind"] == "eval" and r.get(x)]  # x = 0: not on a log axis
                ax.plot([r[x] for r in evals], [r["pass_rate"] for r in evals], "o-", ms=3, label=name)
            ax.set(xscale="log", xlabel=f"{'completions drawn (batch x steps)' if x == 'samples' else x} (log scale)",
                   ylabel="validation pass rate (held-out prompts x samples)", title="no run fitted: the evaluations")
            ax.legend()
            fig.savefig(os.path.join(DOCS_DIR, png), dpi=120)
            plt.close(fig)


def fit(table: str, margin: float = 0.02, x: str = "samples"):
    """Fits of a table's runs (every part of its family) and their references (fit_curve.py): A, B, C_mid with
    intervals, the fit up to 1.5 C_mid against the last evaluation and persistence, verdicts (x: --x in main)."""
    import config
    suffix, unit = ("", "completions") if x == "samples" else (f"-{x}", "device-h")
    table_runs = runs_of(table)  # references by name (v3's default-s*, v4's pool-s*); runs with no log drop out
    ref = [n for n in dict.fromkeys([*runs_of("seeds"), *table_runs]) if n.startswith(REFERENCES[table])]
    dtype = {n: config.parse_args(flags_of(n)).dtype for n in [*ref, *table_runs]}
    names = [n for n in dict.fromkeys([*ref, *table_runs]) if records(n)]
    logs = [os.path.join(LOG_DIR, f"{n}.jsonl") for n in names]
    if not logs:
        return print(f"study: no logs for table {table} in {LOG_DIR}")
    rows = {r["run"]: r for r in fit_curve(logs, "--margin", str(margin), "--x", x)}
    halves = {r["run"]: r for r in fit_curve(logs, "--fit-to-cmid", "1.5", "--bootstrap", "0", "--x", x)}
    # not .jsonl: `fit_curve.py logs/study/*.jsonl` must not read it
    Path(LOG_DIR, f"{table}{suffix}-fits.json").write_text(json.dumps(list(rows.values()), indent=1))
    groups = {}  # dtype -> the reference runs with a fit: a row is judged against those of its own dtype
    done = {n: r for n, r in rows.items() if finished(n, logged=True)}  # one still running is shown, judges none
    for n in [n for n in ref if n in done]:
        groups.setdefault(dtype[n], []).append(rows[n])
    verdicts = {n: "unfinished" if n not in done else "reference" if n in ref
                else verdict(rows[n], groups.get(dtype[n], []), margin) for n in names if n in rows}
    stale_cols = table in ("loo", "hot", "hot5")  # the LOO rows' staleness: lags, and the tokens the loss clips
    lines = run_rows(names, rows, halves, verdicts, unit, stale_cols)
    refs = "; ".join(f"{', '.join(r['run'] for r in g)} ({d}, A mean {sum(r['A'] for r in g) / len(g):.3f})"
                     for d, g in groups.items()) or f"no {'/'.join(REFERENCES[table])}* run has a fit"
    staleness_note = (" Staleness over all training steps, weighted by trained tokens: lags in versions; clipped is "
                      "DAPO's share with its clip active, CISPO's share truncated at eps_max, GRPO/GSPO's clip.")
    lines.append(f"\nReference: {refs}; margin {margin}. Verdicts: A beyond the margin first (its 95% interval "
                 "too), then B at the common A (higher is better) and C_mid (lower is better) against the range of "
                 "the reference runs of the row's dtype." + (staleness_note if stale_cols else ""))
    pooled = effects(done, groups, dtype)
    if len(pooled) > 2:  # a row besides the header: not the seeds' table, whose runs are all references
        lines += ["", "Each setting pooled over its seeds against its references (differences of means, 95% "
                  "intervals from the seed spread of the comparison's own runs, or a lone run's own fit interval "
                  "where wider; C_mid as a ratio; the last column pools the spread over the table):", "", *pooled]
    Path(LOG_DIR, f"{table}{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(table, table_runs, names, logs, ref, suffix, x, dtype)


def main(argv=None):
    global LOG_DIR, FIG_STEM
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=list(dict.fromkeys([*PARTS, *map(family, PARTS), "all"])), default="seeds",
                    help="which runs (default: seeds); axes: every axes-* part (hours); all: every table (--fit_only)")
    ap.add_argument("--log_dir", default=LOG_DIR, help="logs and tables (default logs/study; see docs/logs/study-v4)")
    ap.add_argument("--runs", default=None, help="comma-separated run names from any part, run in this order "
                    "(default: all of --part); the table is still that of --part")
    ap.add_argument("--fit_only", action="store_true", help="skip training; fit the logs that exist")
    ap.add_argument("--x", default="samples", choices=["gpu_hours", "samples"], help="compute axis: samples (drawn; "
                    "blind to cost per completion) or gpu_hours (device-hours: files get a -gpu_hours suffix)")
    ap.add_argument("--jobs", type=int, default=1, choices=[1, 2],
                    help="runs at a time; 2 pins each run to its own core (device-hours stay comparable)")
    args = ap.parse_args(argv)
    LOG_DIR = os.path.abspath(args.log_dir)
    FIG_STEM = base if (base := os.path.basename(LOG_DIR)).startswith("study") else "study"
    if args.part == "all" and (not args.fit_only or args.runs is not None):
        ap.exit(2, "error: --part all fits every table: use it with --fit_only and without --runs\n")
    if os.path.exists(LOG_DIR) and not os.path.isdir(LOG_DIR):
        ap.exit(2, f"error: --log_dir {args.log_dir} is not a folder\n")
    if args.runs is not None and not any(args.runs.split(",")):
        ap.exit(2, f"error: --runs {args.runs!r} names no run\n")
    names = [n for n in (args.runs or "").split(",") if n] or list(PARTS.get(args.part) or runs_of(args.part))
    if unknown := [n for n in names if not any(n in part for part in PARTS.values())]:
        ap.exit(2, f"error: unknown runs {unknown}; choose from {', '.join(n for p in PARTS.values() for n in p)}\n")
    ok = True
    if not args.fit_only:
        os.makedirs(LOG_DIR, exist_ok=True)
        signal.signal(signal.SIGTERM, _stop)
        stop = threading.Event()
        todo = [n for n in names if not finished(n)]  # each check reads the run's log
        threading.Thread(target=progress, args=(todo, stop), daemon=True).start()
        ok = run_all(todo, args.jobs)
        stop.set()
    for table in REFERENCES if args.part == "all" else [family(args.part)]:
        fit(table, x=args.x)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
