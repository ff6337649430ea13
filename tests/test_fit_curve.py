"""
Tests for fit_curve.py: offline, CPU, synthetic logs only (~15 s).

    python -m pytest tests/test_fit_curve.py -q
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import curve_fit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import fit_curve  # noqa: E402
from fit_curve import sigmoid  # noqa: E402

R0 = 0.3
# paper Table 1 extremes (A, B, C_mid in GPU-h): min A / max B, max A, min B and C_mid,
# max C_mid, and the ScaleRL reference run
TABLE1 = {"8gen": (0.585, 2.44, 2542), "scout": (0.710, 1.65, 4242),
          "code": (0.615, 1.09, 1675), "bs2048": (0.645, 1.70, 10909),
          "scalerl": (0.610, 1.92, 2542)}


def write_log(path, A, B, C_mid, budget=6.0, num_evals=75, sigma=0.005, seed=0,
              with_zero=True, **config):
    """A train.py-style log: config line, an eval every 100 steps evenly spaced in compute up to
    budget * C_mid (plus step 0 at R0), with train records in between that must be ignored."""
    rng = np.random.default_rng(seed)
    x = np.linspace(budget * C_mid / num_evals, budget * C_mid, num_evals)
    y = sigmoid(x, A, B, C_mid, R0) + rng.normal(0, sigma, num_evals)
    # warm-up to step 350: the default early cut at step 400 is 0.32 C_mid (the paper cuts 1.5k GPU-h, 0.59 C_mid)
    cfg = {"kind": "config", "run_name": path.stem, "seed": seed, "loss": "cispo", "warmup_steps": 350,
           "mode": "pipeline", "batch": 768, "group": 16, "lr": 5e-7,
           "log_dir": str(path.parent), "out_dir": f"out/{path.stem}"} | config
    lines = [cfg] + ([{"kind": "eval", "step": 0, "gpu_hours": 0.0, "samples": 0,
                       "tokens": 0, "pass_rate": R0}] if with_zero else [])
    for i, (xi, yi) in enumerate(zip(x, y), 1):
        lines.append({"kind": "train", "step": 100 * i - 1, "gpu_hours": xi * 0.99, "loss": 0.1})
        lines.append({"kind": "eval", "step": 100 * i, "gpu_hours": xi, "samples": 768 * 100 * i,
                      "tokens": 10**6 * i, "pass_rate": yi})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def fit_file(path, *flags):
    args = fit_curve.build_parser().parse_args([str(path), "--bootstrap", "0", "--x", "gpu_hours", *flags])
    return fit_curve.fit_run(*fit_curve.load_run(str(path), args), args)


def run_cli(*args):
    proc = subprocess.run([sys.executable, str(REPO / "fit_curve.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.mark.parametrize("name", TABLE1)
def test_recovers_table1_curves_and_extrapolates_from_half(tmp_path, name):
    # 75 evals (the paper's ~75 points, A.4), noise 0.005, budget 6x C_mid with the fit on the
    # first half (~3x C_mid): the paper's LOO protocol, ScaleRL's C_mid 2542, fit on 8k GPU-h,
    # extrapolate to 16k (§4). Over 20 noise seeds per curve the prediction error stayed
    # under 0.011; A missed by > 0.02 once, for the flattest curve (B = 1.09, max 0.022).
    # With 4x budgets that curve missed A for 3 of 20 seeds, so the budget is not cut.
    A, B, C_mid = TABLE1[name]
    log = write_log(tmp_path / f"{name}.jsonl", A, B, C_mid)
    full = fit_file(log)
    assert full.r0_observed and full.R0 == R0
    assert abs(full.A - A) < 0.02
    half = fit_file(log, "--fit-fraction", "0.5")
    window_max = half.x[half.in_fit].max()
    predicted = sigmoid(2 * window_max, half.A, half.B, half.C_mid, half.R0)
    assert abs(predicted - sigmoid(2 * window_max, A, B, C_mid, R0)) < 0.02


def test_fitted_r0_when_log_has_no_zero_point(tmp_path):
    log = write_log(tmp_path / "noinit.jsonl", *TABLE1["scalerl"], with_zero=False)
    fit = fit_file(log)
    assert not fit.r0_observed
    assert abs(fit.A - TABLE1["scalerl"][0]) < 0.02 and 0 <= fit.R0 < fit.A


def test_b_per_pair_is_the_curve_fit_b_of_the_paper():
    # paper A.5 fits B with scipy curve_fit for each (A, C_mid); the vectorised search must
    # find the same B (or a lower SSE where curve_fit from B = 1 stops in a worse spot)
    A_true, B_true, C_true = TABLE1["scalerl"]
    x = np.linspace(500, 8000, 40)
    y = sigmoid(x, A_true, B_true, C_true, R0) + np.random.default_rng(1).normal(0, 0.0075, 40)
    A = np.array([[0.56], [0.60], [0.62], [0.70]])
    log_cmid = np.log([800.0, 2000.0, 2600.0, 6000.0])
    B, sse = fit_curve.best_b_per_pair(np.log(x), y, A, log_cmid, R0)
    for i, j in np.ndindex(B.shape):
        def model(c, b):
            return sigmoid(c, A[i, 0], b, math.exp(log_cmid[j]), R0)
        (b_paper,), _ = curve_fit(model, x, y, bounds=(0, np.inf))
        sse_paper = ((model(x, b_paper) - y) ** 2).sum()
        assert sse[i, j] <= sse_paper * (1 + 1e-7)
        if sse[i, j] > sse_paper * (1 - 1e-6):
            assert B[i, j] == pytest.approx(b_paper, rel=1e-4)


def test_grid_optimum_matches_paper_grid_with_curve_fit():
    # the paper's own procedure on its own grid (A 0.450..0.800, C_mid 100 linear values in
    # [100, 40000]; coarsened here for speed) cannot beat our grid + joint refinement
    A_true, B_true, C_true = TABLE1["scalerl"]
    x = np.linspace(800, 8000, 30)
    y = sigmoid(x, A_true, B_true, C_true, R0) + np.random.default_rng(2).normal(0, 0.0075, 30)
    ours = fit_curve.refine(x, y, fit_curve.grid_fit(x, y, R0), R0)
    sse_ours = ((sigmoid(x, *ours) - y) ** 2).sum()
    best_paper = math.inf
    for a in np.arange(0.45, 0.8001, 0.025):
        for c_mid in np.linspace(100, 40000, 100)[::5]:
            def model(c, b):
                return sigmoid(c, a, b, c_mid, R0)
            (b,), _ = curve_fit(model, x, y, bounds=(0, np.inf))
            best_paper = min(best_paper, ((model(x, b) - y) ** 2).sum())
    assert sse_ours <= best_paper * (1 + 1e-9)


def test_read_log_skips_bad_lines_and_keeps_last_of_repeated_steps(tmp_path, capsys):
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"], num_evals=10)
    lines = log.read_text().splitlines()
    bad = ['{"kind": "eval", "step": 2000, "gpu_hours": NaN, "pass_rate": 0.5}',
           '{"kind": "eval", "step": 2100, "gpu_hours": 900.0, "pass_rate": Infinity}',
           '{"kind": "eval", "step": 2200, "gpu_hours": "1h", "pass_rate": 0.5}',
           '{"kind": "eval", "step": 2300, "gpu_hours": null, "pass_rate": 0.5}',
           '{"kind": "eval", "step": 2400, "gpu_hours": 950.0, "pass_rate": 1.5}',
           'step 2500 crashed', '[1, 2]', '{"kind": "checkpoint", "step": 500}',
           # resume from step 500: step 600's eval is redone and its second value must win
           '{"kind": "resume", "step": 500}',
           '{"kind": "eval", "step": 600, "gpu_hours": 9200.0, "pass_rate": 0.123}',
           '{"kind": "eval", "step": 700, "gpu_h']                # truncated by a crash
    log.write_text("\n".join(lines + bad))
    config, x, y, steps = fit_curve.read_log(str(log), "gpu_hours")
    err = capsys.readouterr().err
    assert config["run_name"] == "run" and len(x) == 11  # x = 0 plus 10 distinct steps
    assert y[x == 9200.0].tolist() == [0.123] and not np.isclose(x, 6 * 1525.2).any()
    first_bad = len(lines) + 1
    for k in list(range(7)) + [10]:
        assert f"{log}:{first_bad + k}:" in err
    assert err.count("repeat an earlier step") == 1


def test_cli_malformed_logs_never_traceback(tmp_path):
    good = write_log(tmp_path / "good.jsonl", *TABLE1["scalerl"], budget=4, num_evals=30)
    truncated = write_log(tmp_path / "trunc.jsonl", *TABLE1["8gen"], budget=4, num_evals=30)
    truncated.write_text(truncated.read_text()[:-25])
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"kind": "eval", "step": s, "gpu_hours": s / 10,
                                       "pass_rate": 0.3 + s / 1e4}) + "\n"
                           for s in (0, 100, 200, 300)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    missing = tmp_path / "missing.jsonl"
    proc = run_cli(good, truncated, few, empty, missing, tmp_path, "--bootstrap", "5")
    assert proc.returncode == 0
    messages = proc.stderr.splitlines()
    for bad in (few, empty, missing, tmp_path):
        assert any(m.startswith(f"{bad}: ") for m in messages), (bad, proc.stderr)
    assert any(m.startswith(f"{truncated}:") and "not a JSON object" in m for m in messages)
    assert "good " in proc.stdout and "trunc " in proc.stdout and "few " not in proc.stdout
    proc = run_cli(few, empty, missing)
    assert proc.returncode == 1 and "no file could be fitted" in proc.stderr
    assert run_cli(good, "--fit-fraction", "2").returncode == 2
    twice = run_cli(good, str(good), "--bootstrap", "0")  # not a seed group of one run with std 0
    assert twice.returncode == 2
    assert twice.stderr.strip().splitlines()[-1].endswith("a log is given twice: give each once")
    assert run_cli(good, "--fit-fraction", "0.5", "--max-compute", "10").returncode == 2


def test_hostile_lines_cost_one_line_not_the_file(tmp_path):
    """A 100k-deep nested line and a 5000-digit number are skipped one line each; the rest of the file fits.
    A clock that goes backwards is fitted with a warning; an unwritable --plot is an error, not exit 0."""
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"], budget=4, num_evals=30)
    lines = log.read_text().splitlines(keepends=True)
    hostile = ["[" * 100_000 + "]" * 100_000 + "\n", '{"kind": "eval", "step": 7, "pass_rate": ' + "9" * 5000 + "}\n"]
    log.write_text("".join(lines[:3] + hostile + lines[3:]))
    proc = run_cli(log, "--bootstrap", "0")
    assert proc.returncode == 0, proc.stderr
    assert "run " in proc.stdout and "Traceback" not in proc.stderr
    assert sum("not a JSON object" in m for m in proc.stderr.splitlines()) == 2

    back = tmp_path / "back.jsonl"
    recs = [json.loads(line) for line in lines]
    evals = [r for r in recs if r["kind"] == "eval"]
    evals[-1]["gpu_hours"] = evals[-2]["gpu_hours"] / 2  # the last evaluation's clock went backwards
    back.write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = run_cli(back, "--bootstrap", "0", "--x", "gpu_hours")
    assert proc.returncode == 0 and "gpu_hours decreases 1 time(s)" in proc.stderr

    proc = run_cli(log, "--bootstrap", "0", "--plot", "/proc/no-such-dir/curve.png")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: --plot")


def _compare_case(tmp_path, specs):
    fits = [fit_file(write_log(tmp_path / f"{name}.jsonl", A, B, 2500, sigma=0.002, seed=i))
            for i, (name, A, B) in enumerate(specs)]
    return {f.name: (verdict, refit) for f, verdict, refit in fit_curve.compare(fits, 0.02)}


def test_compare_applies_the_paper_rule(tmp_path):
    verdicts = _compare_case(tmp_path, [("best", 0.65, 1.8), ("faster", 0.64, 2.4),
                                        ("slower", 0.64, 1.3), ("low", 0.58, 2.5)])
    assert verdicts["best"] == ("best", None)
    assert verdicts["low"] == ("lower A", None)  # much higher B does not matter: A first
    assert verdicts["faster"][0] == "same A within margin, B better"
    assert verdicts["slower"][0] == "same A within margin, B worse"
    A_avg, B_run, B_best = verdicts["faster"][1]
    assert 0.64 < A_avg < 0.65 and B_run > B_best


def test_compare_margin_is_a_parameter(tmp_path):
    fits = [fit_file(write_log(tmp_path / f"r{i}.jsonl", A, 1.8, 2500, sigma=0.002))
            for i, A in enumerate((0.65, 0.62))]
    assert [v for _, v, _ in fit_curve.compare(fits, 0.02)] == ["best", "lower A"]
    assert fit_curve.compare(fits, 0.05)[1][1].startswith("same A within margin")


def test_json_output_extrapolation_and_seed_groups(tmp_path):
    A, B, C_mid = TABLE1["scalerl"]
    logs = [write_log(tmp_path / "s0.jsonl", A, B, C_mid, seed=0),
            write_log(tmp_path / "s1.jsonl", A, B, C_mid, seed=1, run_name="other-name",
                      out_dir="elsewhere", checkpoint_path="x.pt"),
            write_log(tmp_path / "lr.jsonl", A, B, C_mid, seed=2, lr=1e-6)]
    proc = run_cli(*logs, "--json", "--fit-fraction", "0.5", "--bootstrap", "20")
    assert proc.returncode == 0
    records = [json.loads(line) for line in proc.stdout.splitlines()]  # nothing else on stdout
    assert len(records) == 3
    for r in records:
        assert {"file", "A", "B", "C_mid", "R0", "r2", "n_points", "extrapolation", "A_ci",
                "B_ci", "C_mid_ci", "power_law_A", "verdict", "seed_group"} <= r.keys()
        assert r["A_ci"][0] < r["A_ci"][1] and r["R0_observed"] and r["n_points"] > 30
        points = r["extrapolation"]  # evals 38..75 lie past half the budget
        assert len(points) == 38 and all(p["x"] > r["window"][1] for p in points)
        assert max(abs(p["predicted"] - p["actual"]) for p in points) < 0.03
    by_file = {Path(r["file"]).stem: r for r in records}
    group = by_file["s0"]["seed_group"]
    assert group == by_file["s1"]["seed_group"] and by_file["lr"]["seed_group"] is None
    assert group["n_runs"] == 2 and group["A_range"] == pytest.approx(
        abs(by_file["s0"]["A"] - by_file["s1"]["A"]))


def test_table_and_plot(tmp_path):
    logs = [write_log(tmp_path / f"{n}.jsonl", *TABLE1[n], budget=4, num_evals=40)
            for n in ("scout", "scalerl")]
    png = tmp_path / "curves.png"
    proc = run_cli(*logs, "--fit-fraction", "0.5", "--plot", png, "--bootstrap", "10")
    assert proc.returncode == 0
    assert "best" in proc.stdout and "lower A" in proc.stdout and "extrapolation" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_help_documents_every_option():
    proc = run_cli("--help")
    for flag in ("--x", "--min-compute", "--max-compute", "--fit-fraction", "--margin",
                 "--bootstrap", "--ci", "--seed", "--json", "--plot"):
        assert flag in proc.stdout


def test_x_key_step(tmp_path):
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"])
    fit = fit_file(log, "--x", "step", "--min-compute", "1000")
    assert abs(fit.A - TABLE1["scalerl"][0]) < 0.02 and fit.x[fit.in_fit].min() >= 1000


def test_imports_no_torch():
    subprocess.run([sys.executable, "-c", "import sys, fit_curve; "
                    "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules"],
                   cwd=REPO, check=True)


def test_plot_without_matplotlib_is_one_line(tmp_path):
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"])
    code = ("import sys, runpy; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['fit_curve.py', {str(log)!r}, '--plot', {str(tmp_path / 'c.png')!r}]; "
            "runpy.run_path('fit_curve.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --plot needs matplotlib (pip install matplotlib)"
    assert not (tmp_path / "c.png").exists()


def test_b_at_the_common_a_compares_only_runs_that_share_it(tmp_path):
    """The paper compares B at one common A between recipes with the same ceiling (§4, Fig. 7). A recipe with a much
    higher ceiling neither drags that A up (the median) nor gets a B refitted at an A its curve never had."""
    A, B, C_mid = TABLE1["scalerl"]
    logs = [write_log(tmp_path / f"s{i}.jsonl", A, B, C_mid, seed=i) for i in range(3)]
    logs.append(write_log(tmp_path / "high.jsonl", 0.95, B, C_mid, seed=3, lr=1e-6))
    proc = run_cli(*logs, "--json", "--bootstrap", "0")
    assert proc.returncode == 0
    by_file = {Path(r["file"]).stem: r for r in map(json.loads, proc.stdout.splitlines())}
    common = by_file["s0"]["A_common"]
    assert abs(common - A) < 0.02  # the mean of the four would be ~0.69
    assert by_file["high"]["B_at_A_common"] is None
    for i in range(3):
        assert by_file[f"s{i}"]["B_at_A_common"] == pytest.approx(B, rel=0.3)


def test_a_flat_run_is_not_fitted_and_never_ranked(tmp_path):
    """21 evaluations all at 0.17 (a run that never updates) beside a real run: the flat one is reported as not
    fitted, at its level, and the real one is the only one ranked."""
    real = write_log(tmp_path / "real.jsonl", *TABLE1["scalerl"], budget=4, num_evals=30)
    for name, values in (("flat", [0.17] * 21), ("falling", list(np.linspace(0.3, 0.2, 21)))):
        log = tmp_path / f"{name}.jsonl"
        log.write_text("".join(json.dumps({"kind": "eval", "step": 10 * i, "gpu_hours": i / 100, "pass_rate": v}) + "\n"
                               for i, v in enumerate(values)))
        proc = run_cli(log, real, "--bootstrap", "0", "--x", "gpu_hours")
        assert proc.returncode == 0
        assert f"{log}: not fitted: the curve does not rise" in proc.stderr
        assert name == "falling" or "its level is 0.170" in proc.stderr
        assert f"{name} " not in proc.stdout and "real " in proc.stdout
        assert run_cli(log).returncode == 1


def test_plot_and_flag_errors_are_one_line(tmp_path):
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"])
    for plot, why in (("b.jsonl", "cannot draw a .jsonl file"), ("curves", "no file extension")):
        proc = run_cli(log, "--plot", tmp_path / plot)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
        assert why in proc.stderr and not (tmp_path / "curves.png").exists()
    proc = run_cli(log, "--fit-fraction", "2")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --fit-fraction must be in (0, 1]")
    (tmp_path / "plots.png").mkdir()  # a folder named like an image: refused before fitting, exit 2 (was 1)
    proc = run_cli(log, "--plot", tmp_path / "plots.png")
    assert proc.returncode == 2 and proc.stderr == f"error: --plot {tmp_path / 'plots.png'}: a folder, not a file\n"
    proc = run_cli(log, "--no-such-flag")
    assert proc.returncode == 2 and proc.stderr.startswith("error: unrecognized arguments")
    assert proc.stderr.count("\n") == 1


def test_memory_and_device_layout_flags_do_not_split_a_recipe():
    """A run logged before --tp, --logprob_chunk_tokens and --activation_checkpointing existed, and one with them set
    otherwise, are seeds of one recipe; a changed training flag is another recipe."""
    old = {"loss": "cispo", "batch": 768, "seed": 0}
    new = {**old, "seed": 1, "tp": 2, "logprob_chunk_tokens": 256, "activation_checkpointing": "on",
           "micro_batch_tokens": 4096}
    assert fit_curve.recipe_key(old, "a") == fit_curve.recipe_key(new, "b")
    assert fit_curve.recipe_key(old, "a") != fit_curve.recipe_key({**old, "batch": 384}, "a")
    toy_then, toy_now = {**old, "dataset": "toy", "reward": "math"}, {**old, "dataset": "toy", "reward": "boxed_exact"}
    assert fit_curve.recipe_key(toy_then, "a") == fit_curve.recipe_key(toy_now, "b")  # graded by its own reward
    gsm = {**old, "dataset": "gsm8k"}
    assert fit_curve.recipe_key({**gsm, "reward": "math"}, "a") != fit_curve.recipe_key({**gsm, "reward": "exact"}, "a")


def test_an_extrapolation_reports_the_fits_own_rise_and_persistence(tmp_path):
    """Fitted up to C_mid, a curve still has half its gain ahead: the fit must say so (rise) and beat carrying its
    last in-window evaluation forward (persistence); fitted on the plateau, its rise is ~0 and persistence is as good."""
    A, B, C_mid = TABLE1["scalerl"]
    log = write_log(tmp_path / "r.jsonl", A, B, C_mid, budget=6.0, sigma=0.002)
    mid = fit_curve.extrapolation(fit_file(log, "--max-compute", str(1.5 * C_mid)))
    late = fit_curve.extrapolation(fit_file(log, "--fit-fraction", "0.8"))
    assert mid[-1]["rise"] > 0.05 and mid[-1]["persistence_error"] < -0.05  # persistence misses what is still to come
    assert np.mean([abs(p["error"]) for p in mid]) < np.mean([abs(p["persistence_error"]) for p in mid])
    assert abs(late[-1]["rise"]) < 0.01 and abs(late[-1]["persistence_error"]) < 0.02
    for p in mid:
        assert p["error"] == pytest.approx(p["predicted"] - p["actual"])
    proc = run_cli(log, "--max-compute", 1.5 * C_mid, "--bootstrap", "0", "--x", "gpu_hours")
    assert "persist. error" in proc.stdout and "for persistence" in proc.stdout


def test_the_early_cut_is_the_warm_up_for_every_window_and_A_is_refitted_twice_as_late(tmp_path):
    """Paper-style: the same early cut for the full fit and any partial one, fixed in completions drawn (the log's
    warm-up, warmup_steps x batch), not a share of each window; A is fitted once more with the cut twice as late."""
    A, B, C_mid = TABLE1["scalerl"]
    log = write_log(tmp_path / "r.jsonl", A, B, C_mid, sigma=0.002)
    first = {}
    for flags in ([], ["--fit-fraction", "0.5"], ["--max-compute", str(2 * C_mid)]):
        fit = fit_file(log, *flags)
        first[tuple(flags)] = fit.x[fit.in_fit].min()
        assert abs(fit.A_late - A) < 0.02
    x_at_step_400 = 4 * 6 * C_mid / 75  # write_log: evals every 100 steps, evenly spaced up to 6 C_mid
    assert list(first.values()) == pytest.approx([x_at_step_400] * 3)
    samples = fit_curve.build_parser().parse_args([str(log), "--bootstrap", "0"])  # the default axis: completions
    fit = fit_curve.fit_run(*fit_curve.load_run(str(log), samples), samples)
    assert samples.x == "samples" and fit.x[fit.in_fit].min() == 768 * 400


def test_fit_to_cmid_fits_up_to_that_multiple_of_the_full_fits_c_mid(tmp_path):
    A, B, C_mid = TABLE1["scalerl"]
    log = write_log(tmp_path / "r.jsonl", A, B, C_mid, sigma=0.002)
    full = fit_file(log)
    proc = run_cli(log, "--fit-to-cmid", "1.5", "--bootstrap", "0", "--x", "gpu_hours", "--json")
    out = json.loads(proc.stdout)
    assert out["window"][1] <= 1.5 * full.C_mid < min(p["x"] for p in out["extrapolation"])
    assert abs(out["extrapolation"][-1]["error"]) < abs(out["extrapolation"][-1]["persistence_error"])


def test_fit_to_cmid_reads_each_log_once(tmp_path):
    """The full fit and the windowed one share one reading: a bad line is warned about once, and a log that grows
    between the two (a live run) cannot give them different data."""
    A, B, C_mid = TABLE1["scalerl"]
    log = write_log(tmp_path / "r.jsonl", A, B, C_mid, sigma=0.002)
    log.write_text(log.read_text() + "{not json\n")
    proc = run_cli(log, "--fit-to-cmid", "2", "--bootstrap", "0", "--x", "gpu_hours", "--json")
    assert proc.returncode == 0 and proc.stderr.count("r.jsonl:") == 1, proc.stderr


def test_a_log_without_the_default_axis_is_said_once_naming_the_axes_it_has(tmp_path):
    """A log converted from another framework has gpu_hours but no samples: one line naming the axes it has, not a
    warning per record and "no usable eval records"; --x with it fits. A bogus --x is said the same way."""
    log = write_log(tmp_path / "run.jsonl", *TABLE1["scalerl"])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("samples", "tokens")}) + "\n"
                           for r in records))
    for x in ("samples", "bogus"):
        proc = run_cli(log, "--x", x, "--bootstrap", "0")
        assert proc.returncode == 1 and proc.stderr.count("\n") == 2, proc.stderr  # the file's line and "error:"
        assert f"not fitted: no eval record has '{x}', the x axis (--x {x}); they have --x gpu_hours" in proc.stderr
    assert run_cli(log, "--x", "gpu_hours", "--bootstrap", "0").returncode == 0


def test_a_one_step_curve_says_b_is_at_its_bound(tmp_path):
    """Flat, then one jump between two evaluations: B runs to its bound with a zero-width interval; say so."""
    log = tmp_path / "step.jsonl"
    values = [0.20] * 12 + [0.30] * 12
    log.write_text("".join(json.dumps({"kind": "eval", "step": i, "samples": 100 * i, "pass_rate": v}) + "\n"
                           for i, v in enumerate(values)))
    proc = run_cli(log, "--bootstrap", "0")
    assert proc.returncode == 0 and "is at its bound (100): the curve is one step; B unmeasured" in proc.stderr, \
        proc.stderr
