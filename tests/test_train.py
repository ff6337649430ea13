"""train.py as users run it: flags, the log it writes, and short runs of the recipe's variants.

    python -m pytest tests/test_train.py -q
"""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import OUT, ROOT, run_train

SMALL = ["--batch", "32", "--group", "8", "--eval_prompts", "16", "--eval_samples", "2", "--eval_every", "2",
         "--save_every", "-1"]


def one_line_error(proc):
    # a "note:" line (a toy warm start that is not the reference build, on another CPU) may come first
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("note:")]
    return proc.returncode == 2 and "Traceback" not in proc.stdout and len(lines) == 1 and lines[0].startswith("error:")


def test_dry_run_prints_the_resolved_config():
    proc = run_train("--loss", "cispo", "--batch", "768", "--dry_run")
    assert proc.returncode == 0, proc.stdout
    cfg = json.loads(proc.stdout)
    assert cfg["loss"] == "cispo" and cfg["batch"] == 768 and cfg["mode"] == "pipeline"
    assert cfg["group"] == 8  # the toy's scale override; the paper's 16 with --model other than toy
    assert cfg["model"] == "toy" and cfg["lr"] > 0  # the toy's overrides apply where no flag was typed


@pytest.mark.parametrize("flags,needle", [
    (["--loss", "nosuch"], "--loss"),
    (["--batch", "770"], "--batch"),  # not a multiple of --group 16
    (["--not_a_flag", "1"], "--not_a_flag"),
    (["--lr", "fast"], "--lr"),
    (["--lr=-1e-5"], "--lr"),
    (["--k", "0"], "--k"),
    (["--mode", "ppo", "--k", "10000000"], "--k must be in [1, 256]"),  # vLLM refused it, cut off, after start-up
    (["--generators", "1"], "--generators 1 needs several processes"),
    (["--generators", "-2"], "--generators"),
    (["--mode", "async"], "pipeline, ppo, sync"),
    (["--loss_agg", "mean"], "prompt, sample, token"),
    (["--out_dir", "config.py"], "--out_dir"),  # a file, not a folder
    (["--mode", "sync", "--k", "4"], "--k"),
    (["--seed", "99999999999999999999999"], "--seed"),
    (["--grade_timeout_s", "1e-9"], "--grade_timeout_s"),
    (["--grade_timeout_s", "1e9"], "--grade_timeout_s"),
    (["--length_penalty", "--interruptions"], "alternatives"),
    (["--pipeline_depth", "1000000000"], "--pipeline_depth"),  # would grow ~90 MB/s without finishing a step
    (["--run_name", "x" * 260], "at most 200"),
    (["--run_name", "é" * 130], "(260 bytes)"),  # file names hold 255 bytes, not characters
    (["--run_name", "日" * 84], "(252 bytes)"),
    (["--reward", "exact"], "does not apply to --dataset toy"),
    (["--reward", "exact", "--dataset", "box"], "does not apply to --dataset box"),
    (["--model", "/no/such/folder"], "no such file or folder"),  # not tried as a Hub name for 29 s
    (["--lrr", "1e-5"], "did you mean --lr?"),
    (["--tp", "2"], "--tp 2 must divide"),  # one process: no tensor-parallel group to form
    (["--micro_batch_tokens", "1"], "--micro_batch_tokens must be at least 32"),  # was 25-40x slower, silently
])
def test_bad_flags_exit_2_with_one_line(flags, needle):
    proc = run_train(*flags, "--dry_run", timeout=60)
    assert one_line_error(proc), proc.stdout
    assert needle in proc.stdout


@pytest.mark.parametrize("flags,needle", [
    (["--think_max_tokens", "600", "--think_min_tokens", "500"], "context"),  # the toy's context is 512 tokens
    (["--eval_prompts", "5000"], "validation prompts"),
    (["--dataset", "missing.jsonl"], "no such file"),
    (["--eval_dataset", "x.jsonl"], "toy task"),  # the toy has its own held-out split
    (["--log_dir", "/etc/passwd/x"], "--log_dir"),  # found before the engine starts, not at the first record
    (["--out_dir", "/etc/passwd/x"], "--out_dir"),
    (["--model", "nosuch-org/nosuch-model"], "--model nosuch-org/nosuch-model"),  # offline: no 30 s of Hub retries
    (["--model", "nosuch-model"], "--model nosuch-model"),
])
def test_problems_found_before_start_up_exit_2(flags, needle, toy_path, run_name):
    """...and leave no run folder behind (the run was claimed, locked, then refused)."""
    proc = run_train(*flags, "--max_steps", "1", "--run_name", (name := run_name()), timeout=120)
    assert one_line_error(proc), proc.stdout
    assert needle in proc.stdout
    assert not os.path.exists(os.path.join(OUT, name))


def test_a_bad_dataset_is_reported_before_any_model_is_built(tmp_path):
    """A fresh --out_dir has no toy model: the dataset error must come first, not after minutes of warm start."""
    proc = run_train("--dataset", "missing.jsonl", "--out_dir", str(tmp_path / "fresh"), "--log_dir", str(tmp_path),
                     timeout=120)
    assert one_line_error(proc), proc.stdout
    assert not any(n.startswith("toy") for n in os.listdir(tmp_path / "fresh"))


def test_engine_that_cannot_start_is_one_line_exit_4(tmp_path, toy_path, run_name):
    proc = run_train("--vllm_kv_cache_gib", "100000", "--max_steps", "1", "--log_dir", str(tmp_path),
                     "--run_name", run_name(), timeout=300)
    assert proc.returncode == 4 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1]
    assert last.startswith("error: the vLLM engine failed to start") and "kv" in last.lower()


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_toy_run_writes_the_log_fit_curve_reads(tmp_path, toy_path, run_name):
    name = run_name("e2e")
    proc = run_train(*SMALL[:-1], "4", "--max_steps", "4", "--run_name", name, "--log_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = read_log(tmp_path / f"{name}.jsonl")
    assert records[0]["kind"] == "config" and records[0]["run_name"] == name
    # the warm start it came from, by content (the toy is rebuilt per machine): what `sha256sum` prints
    with open(os.path.join(toy_path, "model.safetensors"), "rb") as f:
        assert records[0]["model_sha256"] == hashlib.file_digest(f, "sha256").hexdigest()
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert evals[0]["gpu_hours"] == 0.0 and 0 < evals[1]["gpu_hours"] < evals[2]["gpu_hours"]
    for key in ("gpu_hours", "samples", "tokens", "reward_mean", "loss", "lr", "truncation_rate", "interruption_rate",
                "t_generate", "t_train", "t_sync", "t_step", "is_ratio_mean", "is_ratio_max", "clip_frac", "entropy",
                "mismatch", "zero_var_frac", "lag_max", "lag_mean", "retired_prompts"):
        assert key in train[-1], key
    assert train[-1]["samples"] == 4 * 32
    assert all(0 <= r["pass_rate"] <= 1 for r in evals)
    assert "Traceback" not in proc.stdout
    # the start-up lines say what the toy preset set, and not what was typed (--batch, --group)
    preset = next(ln for ln in proc.stdout.splitlines() if ln.startswith("toy preset (flags you type win): "))
    import config
    assert f"--lr {config.TOY['lr']}" in preset and "--group" not in preset and "--batch" not in preset
    assert "4 prompts x 8 = 32 completions per step" in proc.stdout

    # evaluate.py on the run folder: its newest checkpoint (step 4), with the run's settings as the checkpoint saved
    # them (the toy preset, 16 prompts x 2), scores what the run's eval record of step 4 says; no run folder or log
    out = tmp_path / "evals" / "c.jsonl"
    done = subprocess.run([sys.executable, "evaluate.py", os.path.join(OUT, name), "--out", str(out), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["checkpoint"].endswith("ckpt-000004") and summary["prompts"] == 16
    assert summary["pass_rate"] == evals[-1]["pass_rate"] and summary["pass@1"] == pytest.approx(summary["pass_rate"])
    assert summary["pass_rate_se"] == pytest.approx(evals[-1]["pass_rate_se"])
    completions = [json.loads(line) for line in open(out)]
    assert len(completions) == 32 and sum(c["reward"] > 0 for c in completions) / 32 == summary["pass_rate"]
    assert sorted(os.listdir(tmp_path)) == ["evals", f"{name}.jsonl"]  # no log of its own
    assert sorted(os.listdir(os.path.join(OUT, name))) == ["ckpt-000004", "lock"]  # nothing added to the run


    # a checkpoint whose weights were cut short on disk: one line, before any engine starts
    import shutil
    corrupt = tmp_path / "ckpt-000004"
    shutil.copytree(os.path.join(OUT, name, "ckpt-000004"), corrupt)
    with open(corrupt / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    bad = subprocess.run([sys.executable, "evaluate.py", str(corrupt)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(f"error: {corrupt} is not a "
                                                                                    "checkpoint that verifies"), bad.stderr


@pytest.mark.parametrize("target,needle", [
    ("no/such/run", "--model no/such/run: no such file or folder"),
    ("nosuch-org/nosuch-model", "--model nosuch-org/nosuch-model:"),  # offline: said in seconds
    ("a run without a checkpoint", "a run with no complete checkpoint"),
])
def test_evaluate_refuses_a_bad_target_in_one_line(tmp_path, target, needle):
    if target == "a run without a checkpoint":  # what a run killed before its first save leaves
        (tmp_path / "lock").touch()
        target = str(tmp_path)
    done = subprocess.run([sys.executable, "evaluate.py", target], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], \
        done.stderr[-2000:]


@pytest.mark.parametrize("loss,agg,norm,mode", [
    ("cispo", "prompt", "batch", "pipeline"),
    ("dapo", "sample", "prompt", "ppo"),
    ("gspo", "token", "none", "sync"),
    ("grpo", "sample", "batch", "sync"),
])
def test_recipe_variants_train(tmp_path, toy_path, loss, agg, norm, mode):
    proc = run_train(*SMALL, "--max_steps", "2", "--eval_every", "-1", "--loss", loss, "--loss_agg", agg,
                     "--adv_norm", norm, "--mode", mode, "--k", "1" if mode == "sync" else "2",
                     "--run_name", f"{loss}-{agg}-{norm}", "--log_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    train = [r for r in read_log(tmp_path / f"{loss}-{agg}-{norm}.jsonl") if r["kind"] == "train"]
    assert len(train) == 2 and all(r["loss"] == r["loss"] for r in train)  # finite, not NaN


def test_help_lists_every_flag_with_its_default_and_comment():
    import dataclasses
    import sys
    sys.path.insert(0, ROOT)
    import config
    proc = run_train("--help", timeout=60)
    assert proc.returncode == 0, proc.stdout
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    for f in dataclasses.fields(config.Config):
        assert f"--{f.name} " in text, f.name
    assert "CISPO truncation of the IS weight" in text and "(default: 4.0)" in text  # the comment beside eps_max
    assert "(default: 768; toy: 128)" in text  # --batch: the paper's value and the toy preset's


def test_registries_are_the_only_place_to_add_a_choice():
    """A loss, a schedule or a reward added to its registry is a valid --loss, --mode or --reward (listed by
    --help) with no other edit."""
    code = ("import losses, rewards, rollouts; losses.LOSSES['mine'] = losses.cispo; "
            "rollouts.SCHEDULES['mysched'] = rollouts.SCHEDULES['sync']; "
            "rewards.REWARDS['myreward'] = rewards.Reward(lambda cfg, tokenizer: None); import config; "
            "c = config.parse_args(['--loss', 'mine', '--mode', 'mysched', '--k', '1', '--reward', 'myreward', "
            "'--model', 'org/model', '--dataset', 'gsm8k']); "
            "print(c.loss, c.mode, c.reward, sorted(losses.hyperparameters('mine', c))); "
            "print('{math,exact,boxed_exact,last_number,myreward}' in config.parser().format_help())")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mine", "mysched", "myreward", "['eps_max']", "True"]


@pytest.mark.parametrize("flags,expect", [
    (["--no-fp32-head"], {"fp32_head": False}),
    (["--fp32_head", "false"], {"fp32_head": False}),
    (["--loss-agg=sample"], {"loss_agg": "sample"}),
    (["--length_penalty"], {"length_penalty": True, "interruptions": False}),  # the penalty replaces them
    (["--mode", "sync"], {"k": 1}),
    (["--model", "other", "--dry_run"], {"group": 16, "batch": 768}),  # no toy preset for other models
])
def test_flag_spellings_and_derived_defaults(flags, expect):
    proc = run_train(*flags, "--dry_run", timeout=60)
    assert proc.returncode == 0, proc.stdout
    cfg = json.loads(proc.stdout)
    assert {k: cfg[k] for k in expect} == expect


@pytest.mark.parametrize("flags,emulated", [
    ("fpu sse2 avx2 fma", True),  # AVX2 only: bf16 matmuls are emulated
    ("fpu avx2 avx512f avx512_bf16", False),
    ("fpu avx2 amx_tile amx_bf16", False),
])
def test_bf16_emulation_is_read_off_the_cpu_flags(tmp_path, flags, emulated):
    import devices
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert devices.bf16_is_emulated(str(cpuinfo)) is emulated
    assert devices.bf16_is_emulated(str(tmp_path / "missing")) is False  # unreadable: no claim


def test_evaluations_are_log_spaced_where_asked():
    """The toy's evaluations (config.TOY): every 2 steps at first, then at least 20% further each time, so the
    rise near the start is sampled about as densely per decade of compute as the plateau; step 0 and the last
    step always. eval_growth 1 is the paper's even spacing."""
    import config
    toy = sorted(config.parse_args([]).eval_steps())
    assert toy[:12] == [0, 2, 4, 6, 8, 10, 12, 15, 18, 22, 27, 33] and toy[-1] == 500 and len(toy) == 27
    assert all(b >= max(a + 2, 1.2 * a) or b == 500 for a, b in zip(toy, toy[1:]))
    even = config.parse_args(["--eval_growth", "1", "--eval_every", "30", "--max_steps", "200"]).eval_steps()
    assert sorted(even) == [0, 30, 60, 90, 120, 150, 180, 200]
    assert config.parse_args(["--eval_every", "-1"]).eval_steps() == set()


def test_wandb_without_its_package_is_refused_even_in_a_dry_run():
    import importlib.util
    proc = run_train("--wandb", "--dry_run", timeout=120)
    if importlib.util.find_spec("wandb") is None:  # the CPU requirements do not install it
        assert one_line_error(proc) and "wandb package is not installed" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout
