"""
Tests for study.py's run table: offline, no training (~5 s).

    python -m pytest tests/test_study.py -q
"""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import config  # noqa: E402
import study  # noqa: E402

RUNS = [name for part in study.PARTS.values() for name in part]


@pytest.mark.parametrize("name", RUNS)
def test_every_run_is_a_valid_command_line(name):
    """A typo in the table would cost an afternoon of study before the run that has it fails."""
    cfg = config.parse_args([*study.flags_of(name), "--run_name", name])
    assert cfg.run_name == name


def test_the_seeds_are_the_plain_toy_command():
    """The study's references are what `python train.py` runs, with another seed: nothing added."""
    plain = config.to_dict(config.parse_args([]))
    for name in study.PARTS["seeds"]:
        assert {k: v for k, v in config.to_dict(config.parse_args(study.flags_of(name))).items()
                if plain[k] != v} == ({"seed": int(name[-1])} if name[-1] != "0" else {})


def test_each_axis_changes_one_thing_against_the_seeds():
    """An axis run differs from the default's seeds in its axis's flags and the seed only (toy-carry's runs: from
    carry-s0)."""
    for name in [*study.runs_of("axes"), *study.PARTS["carry-batch"]]:
        base = config.to_dict(config.parse_args(study.flags_of("carry-s0" if "carry" in name else "default-s0")))
        cfg = config.to_dict(config.parse_args(study.flags_of(name)))
        changed = {k for k in base if base[k] != cfg[k]} - {"seed"}
        typed = {f.removeprefix("--") for f in study.flags_of(name) if f.startswith("--")} - {"seed"}
        typed |= {f.removeprefix("no_") for f in typed if f.startswith("no_")}  # --no_X sets X
        assert changed and changed <= typed | {"model_path"}, (name, changed)


def test_every_run_has_one_part_and_every_part_one_table():
    assert len(RUNS) == len(set(RUNS))
    assert {study.family(p) for p in study.PARTS} == set(study.REFERENCES) == {"seeds", "loo", "npr", "hot", "hot5",
                                                                             "axes", "eval", "carry"}
    assert sorted(n for t in study.REFERENCES for n in study.runs_of(t)) == sorted(RUNS)
    for table, prefix in study.REFERENCES.items():  # every table judges against runs it holds or the seeds
        assert any(n.startswith(prefix) for n in [*study.PARTS["seeds"], *study.runs_of(table)]), table


def test_the_eval_runs_change_the_evaluation_the_warmup_or_the_learning_rate_only():
    """The eval table asks what lets a fit on the rise predict the plateau: its runs are the plain command (eval2-s*)
    with 8 samples a prompt (eval8-s*: training is the seeds'), a 5-step warm-up (warm5-s*: the early cut moves) or
    half the learning rate with the warm-up and the run twice as long (lr25-s*: the cut stays at the same C_mid).
    They ran on the version-2 toy, whose preset is today's with study.VERSION2."""
    plain = config.to_dict(config.parse_args(study.VERSION2))
    changed = {"eval8": {"eval_samples"}, "eval2": set(), "warm5": {"warmup_steps"},
               "lr25": {"lr", "warmup_steps", "max_steps"}}
    assert {study.setting(n) for n in study.runs_of("eval")} == set(changed)
    for name in study.runs_of("eval"):
        cfg = config.to_dict(config.parse_args(study.flags_of(name)))
        assert {k for k in plain if plain[k] != cfg[k]} - {"seed"} == changed[study.setting(name)]
        assert cfg["eval_samples"] == (8 if name.startswith("eval8") else 2)  # as their names say
        assert cfg["warmup_steps"] == {"warm5": 5, "lr25": 2 * plain["warmup_steps"]}.get(study.setting(name),
                                                                                           plain["warmup_steps"])
        if name.startswith("lr25"):  # half the rate for twice the steps: the same sum of step sizes at each end
            assert (cfg["lr"], cfg["max_steps"]) == (plain["lr"] / 2, 2 * plain["max_steps"])


def test_split_recovers_the_evaluation_noise_of_a_pair(tmp_path):
    """docs/identifiability.py --split on a synthetic pair (one run, its 8 samples holding its 2) recovers the
    2-sample evaluation noise and the policy's swing that made it, and refuses a pair that is not one."""
    import numpy as np
    rng, n, swing_sd, eval_sd = np.random.default_rng(0), 400, 0.004, 0.006
    x = np.arange(n) * 128.0
    truth = 0.25 + 0.3 / (1 + (4000 / np.maximum(x, 1)) ** 2.2) + rng.normal(0, swing_sd, n)
    e2, e6 = rng.normal(0, eval_sd, n), rng.normal(0, eval_sd / 3 ** 0.5, n)
    for m, y in ((2, truth + e2), (8, truth + (e2 + 3 * e6) / 4)):
        records = [{"kind": "config", "seed": 0, "eval_samples": m, "warmup_steps": 20, "batch": 128},
                   *({"kind": "eval", "samples": xi, "pass_rate": yi} for xi, yi in zip(x, y))]
        (tmp_path / f"e{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    script = [sys.executable, str(REPO / "docs" / "identifiability.py"), "--split"]
    out = subprocess.run([*script, tmp_path / "e2.jsonl", tmp_path / "e8.jsonl"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    noise = float(re.search(r"2-sample evaluation noise ([0-9.]+)", out.stdout).group(1))
    swing = float(re.search(r"the policy's swing ([0-9.]+)", out.stdout).group(1))
    assert abs(noise - eval_sd) < 0.08 * eval_sd and abs(swing - swing_sd) < 0.25 * swing_sd, out.stdout
    alone = subprocess.run([*script, tmp_path / "e2.jsonl"], capture_output=True, text=True)
    assert alone.returncode != 0 and "two logs a seed" in alone.stderr


def test_the_hot_rows_differ_in_the_loss_only_at_a_raised_learning_rate():
    """hot-dapo-s* differs from its reference hot-cispo-s* in the loss alone; both run off-policy at a learning rate
    above the preset's (where the losses can differ), so neither is a copy of the loo table's runs."""
    preset = config.parse_args(study.flags_of("stale-s0"))
    for s in (0, 1):
        ref, row = (config.to_dict(config.parse_args(study.flags_of(f"{p}-s{s}"))) for p in ("hot-cispo", "hot-dapo"))
        assert {k for k in ref if ref[k] != row[k]} == {"loss"} and (ref["loss"], row["loss"]) == ("cispo", "dapo")
        assert ref["mode"] == "ppo" and ref["k"] == 8 and ref["lr"] > preset.lr


def test_the_npr_row_leaves_out_npr_only_and_trains_over_epochs():
    """nonpr500-s* differs from its reference npr500-s* in NPR alone, and a run of either draws several epochs
    of its pool (NPR retires prompts from later epochs only: within one it cannot act)."""
    for s in (0, 1):
        ref, row = (config.to_dict(config.parse_args(study.flags_of(f"{p}-s{s}"))) for p in ("npr500", "nonpr500"))
        assert {k for k in ref if ref[k] != row[k]} == {"npr"} and ref["npr"] and not row["npr"]
        assert ref["max_steps"] * config.parse_args(study.flags_of(f"npr500-s{s}")).prompts_per_step >= 6 * 500


def test_a_free_lane_takes_the_next_run(monkeypatch):
    """Two lanes, one long run and three short ones: the short ones all go to the other lane, in order, so the
    part ends with the long run (a fixed split of the list would put a short run after the long one)."""
    import threading
    import time
    done = []
    lock = threading.Lock()

    def fake_run(name, core=None):  # the subprocess launcher; scheduling is what is tested here
        time.sleep(0.6 if name == "long" else 0.1)
        with lock:
            done.append((name, core))
        return name != "bad"

    monkeypatch.setattr(study, "run", fake_run)
    assert study.run_all(["long", "a", "b", "c"], jobs=2)
    assert done == [("a", 1), ("b", 1), ("c", 1), ("long", 0)]
    assert not study.run_all(["a", "bad"], jobs=1)


def test_unknown_run_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "study.py", "--runs", "nosuch"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown runs ['nosuch']") and len(proc.stderr.strip().splitlines()) == 1


def test_a_run_is_finished_at_the_presets_max_steps():
    """Raising the toy's max_steps makes a finished run unfinished again, so study.py resumes it to the new end."""
    assert study.target_steps("default-s0") == config.TOY["max_steps"]
    assert study.target_steps("batch256-s0") == 250  # its own flags: as many completions as the default's 500 steps
    assert study.target_steps("budget64-s0") == 250  # version 2's preset (study.VERSION2)
    assert config.parse_args([*study.flags_of("default-s0"), "--max_steps", "7"]).max_steps == 7


def _write_log(path, name, steps, a=0.65, b=2.0, curve=None):
    """A train.py-shaped log, evaluated at the toy's steps, whose pass rate follows the paper's sigmoid in
    completions drawn (C_mid at a sixth of the run), with a little deterministic wiggle so the fit has residuals.
    curve(step) -> pass rate replaces the sigmoid."""
    cfg = config.parse_args(study.flags_of(name))
    c_mid = steps / 6 * cfg.batch
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "config", "run_name": name, **config.to_dict(config.parse_args(
            study.flags_of(name)))}) + "\n")
        for step in sorted(s for s in cfg.eval_steps() if s <= steps):
            c = step * cfg.batch
            y = 0.05 + (a - 0.05) / (1 + (c_mid / c) ** b) if c else 0.05
            y = curve(step) if curve else y
            f.write(json.dumps({"kind": "eval", "step": step, "samples": c, "pass_rate": y + 0.004 * math.sin(step),
                                "pass_rate_se": 0.004}) + "\n")


@pytest.fixture
def batch_axis(monkeypatch):
    """A second axis beside the budget's, as a fork would add one: batch x2, two seeds."""
    monkeypatch.setattr(study, "PARTS", {**study.PARTS, "axes-batch": study.seeded("batch256", ["--batch", "256"],
                                                                                    range(2))})


def test_an_axis_is_judged_against_the_seeds(tmp_path, monkeypatch, batch_axis):
    """An axis run with a higher ceiling than the seeds reads "higher A", and one with the seeds' ceiling does not;
    each axis gets its figure, and the half-compute prediction of a clean sigmoid is close."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps, short = config.TOY["max_steps"], study.target_steps("budget64-s0")  # budget64 ran on version 2's preset
    _write_log(tmp_path / "default-s0.jsonl", "default-s0", steps)
    _write_log(tmp_path / "budget64-s0.jsonl", "budget64-s0", short, a=0.8)
    _write_log(tmp_path / "batch256-s0.jsonl", "batch256-s0", steps)
    # flat at the seeds' level, still creeping at its end: its A cannot be told apart from theirs
    _write_log(tmp_path / "batch256-s1.jsonl", "batch256-s1", steps, curve=lambda step: 0.64 + 0.01 * step / steps)
    # still rising steadily at its end: the fit may pin A at 1
    _write_log(tmp_path / "budget64-s1.jsonl", "budget64-s1", short, curve=lambda step: 0.05 + 0.3 * step / short)
    study.fit("axes")
    rows = {line.split("|")[1].strip(): line for line in (tmp_path / "axes.md").read_text().splitlines()
            if line.startswith("| ")}
    assert "not identified" in rows["budget64-s1"], rows["budget64-s1"]
    last = 0.05 + 0.3 + 0.004 * math.sin(short)  # its last evaluation is still shown, though no fit predicts it
    assert f"| {last:.3f} ± 0.004 |" in rows["budget64-s1"], rows["budget64-s1"]
    assert "higher A" in rows["budget64-s0"] and "same A" in rows["batch256-s0"]
    assert "higher A" not in rows["batch256-s1"] and "lower A" not in rows["batch256-s1"], rows["batch256-s1"]
    error, persistence = (float(v) for v in rows["default-s0"].split("|")[-3:-1])  # of the fit up to 1.5 C_mid
    assert abs(error) < 0.03 and abs(error) < abs(persistence)
    assert (tmp_path / "study-axis-budget64.png").exists() and (tmp_path / "study-axis-batch256.png").exists()
    assert not (tmp_path / "study-axes.png").exists()  # one figure per axis, not all of them in one


def test_loo_rows_are_judged_against_their_own_references(tmp_path, monkeypatch):
    """The DAPO row runs at PPO-off-policy-8 and is judged against the CISPO runs at the same staleness (stale-s*),
    not against the default's seeds; its table has the staleness columns."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps = config.TOY["max_steps"]
    for name, a in [("default-s0", 0.75), ("stale-s0", 0.75), ("loo-dapo-s0", 0.60)]:
        _write_log(tmp_path / f"{name}.jsonl", name, steps, a=a)
    study.fit("loo")
    rows = {line.split("|")[1].strip(): line for line in (tmp_path / "loo.md").read_text().split("pooled")[0]
            .splitlines() if line.startswith("| ")}  # the runs' table, not the pooled one below it
    assert "lower A" in rows["loo-dapo-s0"] and "default-s0" not in rows
    assert "tokens at lag k − 1" in (tmp_path / "loo.md").read_text().splitlines()[0]  # the staleness columns


def test_runs_that_collapse_are_shown_but_neither_judged_nor_pooled(tmp_path, monkeypatch):
    """A run that rises and collapses before the fit window has a row (its peak and last evaluation), though
    fit_curve.py fits no curve to it; one that swings about a level has a fit that explains nothing: "no sigmoid",
    and it stays out of the pooled comparison."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps = config.TOY["max_steps"]
    collapse = lambda step: 0.25 + 0.01 * step if step <= 18 else 0.03  # noqa: E731
    swing = lambda step: 0.25 + 0.01 * step if step <= 18 else 0.35 + 0.05 * (-1) ** (step % 2)  # noqa: E731
    for name in ("hot-cispo-s0", "hot-cispo-s1"):
        _write_log(tmp_path / f"{name}.jsonl", name, steps)
    _write_log(tmp_path / "hot-dapo-s0.jsonl", "hot-dapo-s0", steps, curve=collapse)
    _write_log(tmp_path / "hot-dapo-s1.jsonl", "hot-dapo-s1", steps, curve=swing)
    study.fit("hot")
    text = (tmp_path / "hot.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    peak = f"peak {0.43 + 0.004 * math.sin(18):.3f} at step 18"  # _write_log's wiggle on the highest evaluation
    assert "not fitted" in rows["hot-dapo-s0"] and peak in rows["hot-dapo-s0"], rows["hot-dapo-s0"]
    assert "no sigmoid" in rows["hot-dapo-s1"], rows["hot-dapo-s1"]
    pooled = next(line for line in text.splitlines() if line.startswith("| hot-dapo |"))
    assert "(0 with A identified) | not identified |" in pooled and pooled.endswith("| none | n/a |"), pooled


def test_a_table_where_no_run_fits_still_gets_its_figure(tmp_path, monkeypatch):
    """When every run collapsed, fit_curve.py draws nothing; the figure shows the evaluations alone."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    for name in ("hot-cispo-s0", "hot-dapo-s0"):
        _write_log(tmp_path / f"{name}.jsonl", name, config.TOY["max_steps"],
                   curve=lambda step: 0.25 + 0.01 * step if step <= 18 else 0.03)
    study.fit("hot")
    assert (tmp_path / "study-hot.png").stat().st_size > 10_000


def test_staleness_is_weighted_by_each_steps_trained_tokens(tmp_path, monkeypatch):
    """A log's "tokens" is a running total: the second step trained 300 tokens, the first 100. A plain mean of the
    steps' shares would give lag 3.5 and 50% at the bound (k = 8); weighted by tokens, 5.25 and 75%."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    k = config.parse_args(study.flags_of("loo-dapo-s0")).k
    first, last = [0.0] * k, [0.0] * k
    first[0], last[k - 1] = 1.0, 1.0
    with open(tmp_path / "loo-dapo-s0.jsonl", "w") as f:
        f.write(json.dumps({"kind": "train", "step": 1, "tokens": 100, "lag_hist": first, "clip_frac": 0.0}) + "\n")
        f.write(json.dumps({"kind": "train", "step": 2, "tokens": 400, "lag_hist": last, "clip_frac": 0.02}) + "\n")
    st = study.staleness("loo-dapo-s0")
    assert st["k"] == k == 8
    assert st["lag"] == pytest.approx(0.75 * (k - 1)) and st["at_bound"] == pytest.approx(0.75)
    assert st["clipped"] == pytest.approx(0.015)


def test_a_setting_is_its_run_name_without_the_seed():
    assert [study.setting(n) for n in ("batch64-s1", "model-s-s0", "stale-s12", "loo-savg", "loo-dapo-s1")] == \
        ["batch64", "model-s", "stale", "loo-savg", "loo-dapo"]


def test_settings_pooled_over_seeds_are_separated_by_the_seed_spread(tmp_path, monkeypatch, batch_axis):
    """Two seeds per setting, ceilings 0.02 apart within each: a setting 0.15 above the references is separated
    (the interval from the pooled spread, t with 3 degrees of freedom, is ~±0.05), one 0.01 above is not, and a
    run still training is shown but not compared."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps = config.TOY["max_steps"]
    for name, a in [("default-s0", 0.64), ("default-s1", 0.66), ("budget64-s0", 0.79), ("budget64-s1", 0.81),
                    ("batch256-s0", 0.65), ("batch256-s1", 0.67)]:
        _write_log(tmp_path / f"{name}.jsonl", name, steps, a=a)
    _write_log(tmp_path / "default-s2.jsonl", "default-s2", steps // 2, a=0.9)  # still training: judges nothing
    study.fit("axes")
    text = (tmp_path / "axes.md").read_text()
    assert "| unfinished |" in next(line for line in text.splitlines() if line.startswith("| default-s2 "))
    rows = {line.split("|")[1].strip(): line for line in text.split("pooled over its seeds")[1].splitlines()
            if line.startswith("| ")}
    assert "default" not in rows  # no reference against itself
    assert rows["budget64"].split("|")[2].strip() == "2"
    assert "higher A" in rows["budget64"].split("|")[-3]
    assert "higher A" not in rows["batch256"].split("|")[-3] and "lower A" not in rows["batch256"].split("|")[-3]
    lo, hi = (float(x) for x in rows["batch256"].split("|")[4].split("[")[1].rstrip("] ").split(","))
    assert lo < 0.01 < hi and hi - lo < 0.2


def test_a_setting_judged_on_one_run_is_as_uncertain_as_that_runs_own_fit(tmp_path, monkeypatch, batch_axis):
    """References that agree to 0.002 make the pooled seed spread tiny (an interval of ~±0.005); one slow run (B
    0.8) about 0.01 above them has a 95% interval of A of its own over 0.03 wide, which holds their mean. Its pooled
    difference takes that interval, so it is not called higher A (the pooled spread alone would call it)."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps = config.TOY["max_steps"]
    for name, a in [("default-s0", 0.650), ("default-s1", 0.652), ("default-s2", 0.651), ("batch256-s0", 0.650),
                    ("batch256-s1", 0.652)]:
        _write_log(tmp_path / f"{name}.jsonl", name, steps, a=a)
    _write_log(tmp_path / "budget64-s0.jsonl", "budget64-s0", study.target_steps("budget64-s0"), a=0.675, b=0.8)
    study.fit("axes")
    text = (tmp_path / "axes.md").read_text()
    own = next(line for line in text.splitlines() if line.startswith("| budget64-s0 "))
    own_lo, own_hi = (float(x) for x in own.split("|")[3].split("[")[1].rstrip("] ").split(","))
    pooled = next(line for line in text.split("pooled over its seeds")[1].splitlines()
                  if line.startswith("| budget64 "))
    lo, hi = (float(x) for x in pooled.split("|")[4].split("[")[1].rstrip("] ").split(","))
    ref = sum(float(line.split("|")[3].split("[")[0]) for line in text.splitlines()  # the seeds' fitted A
              if line.startswith("| default-s")) / 3
    assert own_hi - own_lo > 0.03 and own_lo < ref < own_hi, own
    assert lo == pytest.approx(own_lo - ref, abs=0.002) and hi == pytest.approx(own_hi - ref, abs=0.002), pooled
    assert lo < 0 < hi and "A" not in pooled.split("|")[-3], pooled


def test_a_comparisons_interval_comes_from_its_own_runs(tmp_path, monkeypatch, batch_axis):
    """A setting's ΔA interval is the spread of its own seeds and its references': an unrelated setting whose seeds
    disagree by 0.12 joins the table and leaves it as it was (issue 57: pooled over the table, a verdict moved when
    unrelated runs joined); the table-pooled interval, shown beside it, widens."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    steps = config.TOY["max_steps"]
    for name, a in [("default-s0", 0.64), ("default-s1", 0.65), ("budget64-s0", 0.70), ("budget64-s1", 0.71)]:
        _write_log(tmp_path / f"{name}.jsonl", name, steps, a=a)

    def budget_row():
        study.fit("axes")
        text = (tmp_path / "axes.md").read_text().split("pooled over its seeds")[1]
        cells = next(line for line in text.splitlines() if line.startswith("| budget64 ")).split("|")
        return cells[4].strip(), cells[-3].strip(), cells[-2].strip()

    own, separated, table = budget_row()
    assert "higher A" in separated and own.split(" [")[1] in table  # alone, the table's spread is its own
    for name, a in [("batch256-s0", 0.58), ("batch256-s1", 0.70)]:
        _write_log(tmp_path / f"{name}.jsonl", name, steps, a=a)
    own_after, separated_after, table_after = budget_row()
    assert (own_after, separated_after) == (own, separated)
    lo, hi = (float(x) for x in table_after.strip("[]").split(","))
    own_lo, own_hi = (float(x) for x in own.split("[")[1].rstrip("]").split(","))
    assert hi - lo > 2 * (own_hi - own_lo), (own, table_after)


def test_the_committed_study_refits_from_a_fresh_clone(tmp_path, monkeypatch):
    """`study.py --part loo --fit_only --log_dir docs/logs/study-v2` regenerates that table and figure from the
    committed logs (issue 57: it read the git-ignored logs/study/ and found nothing); --part all without --fit_only
    is refused in one line."""
    monkeypatch.setattr(study, "DOCS_DIR", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in study.runs_of("loo"):
        (logs / f"{name}.jsonl").write_bytes((REPO / "docs" / "logs" / "study-v2" / f"{name}.jsonl").read_bytes())
    with pytest.raises(SystemExit) as done:
        study.main(["--part", "loo", "--fit_only", "--log_dir", str(logs)])
    assert done.value.code == 0
    table = (logs / "loo.md").read_text()
    for name in study.runs_of("loo"):
        assert f"| {name} |" in table
    assert "| loo-dapo | 2 |" in table and (tmp_path / "study-loo.png").exists()
    proc = subprocess.run([sys.executable, "study.py", "--part", "all"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --part all") and proc.stderr.count("\n") == 1


def test_runs_naming_no_run_is_one_line_and_exit_2():
    for runs in (",", ""):  # an empty list must not mean the whole part
        proc = subprocess.run([sys.executable, "study.py", "--runs", runs], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and proc.stderr == f"error: --runs {runs!r} names no run\n"


def test_sigterm_stops_the_running_train_py_too(tmp_path):
    """study.py stopped by SIGTERM passes it to its train.py children and waits for them: none is left running, and
    the lane whose run stopped starts no next one (it once did: default-s2 started while the part was stopping).
    (A stand-in train.py in a folder of its own plays the child: it records its pid, then waits for the signal.)"""
    import signal
    import time
    # two lanes: default-s0's stand-in stops at once, default-s1's 2 s later, while its lane-mate is free
    (tmp_path / "train.py").write_text(
        "import os, signal, sys, time\n"
        "name = sys.argv[sys.argv.index('--run_name') + 1]\n"
        f"open({str(tmp_path / 'started')!r}, 'a').write(name + ' ')\n"
        f"open({str(tmp_path / 'pid')!r}, 'a').write(str(os.getpid()) + ' ')\n"
        "def stop(*a):\n"
        f"    open({str(tmp_path / 'stopped')!r}, 'a').write(name + ' ')\n"
        "    time.sleep(2 if name == 'default-s1' else 0)\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(600)\n")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import study; study.ROOT = {str(tmp_path)!r}; "
            f"study.LOG_DIR = {str(tmp_path / 'logs')!r}; study.OUT_DIR = {str(tmp_path / 'out')!r}; "
            "study.main(['--runs', 'default-s0,default-s1,default-s2', '--jobs', '2'])")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    start = time.time()
    while not (tmp_path / "pid").exists() or len((tmp_path / "pid").read_text().split()) < 2:
        assert proc.poll() is None and time.time() - start < 60, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # both stand-ins have set their handlers
    children = [int(p) for p in (tmp_path / "pid").read_text().split()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "stopping" in err
    assert sorted((tmp_path / "stopped").read_text().split()) == ["default-s0", "default-s1"]  # both got it
    assert sorted((tmp_path / "started").read_text().split()) == ["default-s0", "default-s1"]  # and no third
    for child in children:
        try:
            os.kill(child, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive


def test_a_run_finished_while_queued_is_not_run_again(tmp_path, monkeypatch):
    """Two study.py processes may queue the same run; the one that comes to it second finds its final evaluation
    logged and starts nothing (before, it resumed at the end and logged the last evaluation twice)."""
    monkeypatch.setattr(study, "LOG_DIR", str(tmp_path))
    _write_log(tmp_path / "default-s1.jsonl", "default-s1", config.TOY["max_steps"])
    before = (tmp_path / "default-s1.jsonl").read_bytes()
    assert study.run("default-s1") is True
    assert not (tmp_path / "default-s1.out").exists() and (tmp_path / "default-s1.jsonl").read_bytes() == before
