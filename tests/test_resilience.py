"""Many ranks, crashes and resumes, corrupt checkpoints, non-finite steps, a failing engine.

    python -m pytest tests/test_resilience.py -q
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import OUT, ROOT, run_train, train_cmd

# twice the toy's thinking budget: the warm start's checked solutions fit, so a 4-prompt batch has groups with
# variance and a real gradient (at the toy's own budget it passes ~5% and a batch this small often has none)
SYNC = ["--mode", "sync", "--batch", "32", "--group", "8", "--eval_every", "-1", "--think_min_tokens", "64",
        "--think_max_tokens", "80"]


def log_records(log_dir, name, kind="train"):
    with open(os.path.join(log_dir, f"{name}.jsonl")) as f:
        return [json.loads(line) for line in f if json.loads(line)["kind"] == kind]


def torchrun(*args, env=None, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *train_cmd(*args, env=env)]
    return subprocess.run(cmd, cwd=ROOT, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **(env or {})})


def _completions(name, step=1):
    with open(os.path.join(OUT, name, "rollouts", f"step_{step:06d}.jsonl")) as f:
        return sorted((r["prompt"], r["completion"]) for r in map(json.loads, f))


def test_two_ranks_train_the_same_global_batch_as_one(tmp_path, toy_path, run_name):
    """torchrun --nproc_per_node 2 on CPU (gloo), each rank with its engine (external_launcher), both ranks on one
    tensor-parallel engine (--tp 2), and both as if on two machines (HSDP, a 2 x 1 mesh): one log each, and the
    same prompts, completions, loss and gradient as one rank. Tensor parallelism sums each matmul in two halves,
    so its log-probs and gradient agree to fp32 rounding (measured: README, GPUs)."""
    common = [*SYNC, "--max_steps", "1", "--save_every", "-1", "--log_dir", str(tmp_path), "--dtype", "float32",
              "--dump_every", "1"]
    names = {v: run_name(v) for v in ("one", "two", "tp2", "hsdp")}
    one = run_train(*common, "--run_name", names["one"], env={"SCALERL_FAULT_GRAD_FILE": str(tmp_path / "one.pt")})
    assert one.returncode == 0, one.stdout[-3000:]
    variants = (("two", [], {}), ("tp2", ["--tp", "2"], {}), ("hsdp", [], {"SCALERL_FAULT_NODES": "2"}))
    for variant, flags, env in variants:
        proc = torchrun(*common, *flags, "--run_name", names[variant],
                        env={"SCALERL_FAULT_GRAD_FILE": str(tmp_path / f"{variant}.pt"), **env})
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert "Traceback" not in proc.stdout
    config = [json.loads(line) for line in open(tmp_path / f"{names['tp2']}.jsonl")][0]
    assert config["world_size"] == 2 and config["tp"] == 2
    a = torch.load(tmp_path / "one.pt")
    assert max(g.abs().max().item() for g in a["grads"].values()) > 1e-3  # a real gradient
    for variant, tol in (("two", 1e-5), ("hsdp", 1e-5), ("tp2", 1e-4)):
        assert log_records(tmp_path, names["one"])[0]["prompts"] == log_records(tmp_path, names[variant])[0]["prompts"]
        assert _completions(names["one"]) == _completions(names[variant]), variant  # each trained once
        b = torch.load(tmp_path / f"{variant}.pt")
        assert abs(a["loss"] - b["loss"]) < tol, (variant, a["loss"], b["loss"])
        assert a["grads"].keys() == b["grads"].keys()
        diff = max((a["grads"][k] - b["grads"][k]).abs().max().item() for k in a["grads"])
        print(f"{variant}: loss {b['loss'] - a['loss']:+.2e}, largest gradient difference {diff:.2e}")
        assert diff < tol, variant


def test_a_weight_sync_that_fails_on_one_rank_stops_both_with_one_line(tmp_path, toy_path, run_name):
    """Rank 1's engine raises in the middle of step 2's weight sync: rank 1 still gathers the remaining tensors
    (rank 0 is gathering them), and both ranks stop with status 4 and one error line, not a hang."""
    name = run_name()
    t0 = time.time()
    proc = torchrun(*SYNC, "--max_steps", "3", "--save_every", "-1", "--run_name", name, "--log_dir", str(tmp_path),
                    env={"SCALERL_FAULT_SYNC": "1:2"}, timeout=400)
    assert proc.returncode != 0 and time.time() - t0 < 400
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "the weight sync failed at step" in errors[0], proc.stdout[-3000:]
    assert "on rank 1: RuntimeError: injected weight-sync failure" in errors[0]
    failed = log_records(tmp_path, name, "error")[0]["step"]  # the second sync (a step with no update has none)
    assert f"at step {failed} " in errors[0] and [r["step"] for r in log_records(tmp_path, name)] == [*range(1, failed)]


def test_gradient_does_not_depend_on_micro_batches(tmp_path, toy_path):
    """The same step split into 1-token-budget micro-batches and into one: the same loss and gradient (fp32)."""
    grads = {}
    for budget in ("64", "8192"):
        proc = run_train(*SYNC, "--max_steps", "1", "--save_every", "-1", "--dtype", "float32", "--micro_batch_tokens",
                         budget, "--run_name", f"mb{budget}", "--log_dir", str(tmp_path),
                         env={"SCALERL_FAULT_GRAD_FILE": str(tmp_path / f"{budget}.pt")})
        assert proc.returncode == 0, proc.stdout[-3000:]
        grads[budget] = torch.load(tmp_path / f"{budget}.pt")
    a, b = grads["64"], grads["8192"]
    assert abs(a["loss"] - b["loss"]) < 1e-6
    assert max((a["grads"][k] - b["grads"][k]).abs().max().item() for k in a["grads"]) < 1e-6


def test_torchrun_pipeline_mode_runs(tmp_path, toy_path, run_name):
    name = run_name()
    proc = torchrun("--batch", "32", "--group", "8", "--eval_prompts", "16", "--eval_samples", "2", "--eval_every", "2",
                    "--max_steps", "3", "--save_every", "2", "--run_name", name, "--log_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    evals = log_records(tmp_path, name, "eval")
    assert [r["step"] for r in evals] == [0, 2, 3] and evals[0]["eval_samples"] == 32
    assert os.path.isdir(os.path.join(OUT, name, "ckpt-000002"))


def _wait_for(predicate, proc, timeout=300):
    start = time.time()
    while not predicate():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - start < timeout
        time.sleep(0.05)


def test_resume_after_sigkill_continues_as_if_never_stopped(tmp_path, toy_path, run_name):
    """Kill a run mid-step after its checkpoint at step 3, resume it to step 6, and compare it with a run that
    was never stopped: same prompts, rewards, losses and counters at every step (sync mode is bit-exact:
    per-request seeds, fp32 checkpoints and restored optimizer state)."""
    args = [*SYNC, "--max_steps", "6", "--save_every", "3", "--log_dir", str(tmp_path)]
    straight, crash = run_name("straight"), run_name("crash")
    proc = run_train(*args, "--run_name", straight)
    assert proc.returncode == 0, proc.stdout[-3000:]

    proc = subprocess.Popen([sys.executable, *train_cmd(*args, "--run_name", crash)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / f"{crash}.jsonl"
    _wait_for(lambda: os.path.isdir(os.path.join(OUT, crash, "ckpt-000003")), proc)
    time.sleep(0.3)  # into step 4
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_before = [r["step"] for r in log_records(tmp_path, crash)]
    assert 3 <= max(steps_before) < 6
    resumed = run_train(*args, "--run_name", crash, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:]

    a = {r["step"]: r for r in log_records(tmp_path, straight)}
    b = {r["step"]: r for r in log_records(tmp_path, crash)}  # a re-done step: the last record wins
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        for key in ("prompts", "samples", "tokens", "reward_mean", "loss", "grad_norm", "lr", "retired_prompts"):
            assert a[step][key] == b[step][key], (step, key, a[step][key], b[step][key])
    assert any(json.loads(line)["kind"] == "resume" for line in open(log))
    assert b[6]["gpu_hours"] > b[3]["gpu_hours"] > 0


def test_a_forks_schedule_that_holds_groups_keeps_their_prompts_across_a_resume(tmp_path, toy_path, run_name):
    """A schedule registered by a fork (tests/faults.py's "hoard": two steps' worth generated at once, the second
    held in Schedule.held) is checkpointed with the prompts it holds: resumed from step 1, step 2 trains on the
    very prompts the uninterrupted run trained on, not on fresh draws."""
    name = run_name("hoard")
    env = {"SCALERL_FAULT_FORK_SCHEDULE": "1"}
    args = [*SYNC, "--mode", "hoard", "--log_dir", str(tmp_path), "--run_name", name, "--save_every", "1",
            "--keep_checkpoints", "5"]
    straight = run_train(*args, "--max_steps", "2", env=env)
    assert straight.returncode == 0, straight.stdout[-3000:]
    first = {r["step"]: r["prompts"] for r in log_records(tmp_path, name)}
    shutil.rmtree(os.path.join(OUT, name, "ckpt-000002"))  # resume from step 1, with step 2's prompts held
    resumed = run_train(*args, "--max_steps", "2", "--resume", env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    again = [r for r in log_records(tmp_path, name) if r["step"] == 2][-1]["prompts"]
    assert len(first[2]) == 4 and again == first[2]
    assert not set(first[1]) & set(first[2])


def test_a_run_whose_training_set_is_solved_stops_cleanly(tmp_path, toy_path, run_name):
    """Once No-Positive-Resampling has retired all but fewer than a step's prompts (here: all counted as solved
    from step 1, on a 35-prompt file), the run evaluates, checkpoints and ends with status 0 and a "stop" record,
    not an error."""
    name = run_name("solved")
    proc = run_train("--dataset", os.path.join(ROOT, "tests", "fixtures", "arithmetic.jsonl"), "--mode", "sync",
                     "--batch", "32", "--group", "8", "--max_steps", "20", "--eval_every", "4", "--eval_prompts", "3",
                     "--eval_samples", "2", "--save_every", "-1", "--log_dir", str(tmp_path), "--run_name", name,
                     env={"SCALERL_FAULT_SOLVED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(line) for line in open(tmp_path / f"{name}.jsonl")]
    stop = [r for r in records if r["kind"] == "stop"]
    trained = [r for r in records if r["kind"] == "train"]
    # 35 prompts, 4 a step: 8 steps of the first epoch, then fewer than 4 are left unretired
    assert len(stop) == 1 and 8 <= stop[0]["step"] == len(trained) < 20
    assert re.search(r"retired 3\d of the 35 training prompts, leaving fewer than the 4 a step", stop[0]["reason"])
    assert f"stopping at step {len(trained)}" in proc.stdout
    assert [r["step"] for r in records if r["kind"] == "eval"][-1] == len(trained)  # a final evaluation
    assert os.path.isdir(os.path.join(OUT, name, f"ckpt-{len(trained):06d}"))


def test_half_written_checkpoint_is_skipped(tmp_path, toy_path, run_name):
    name = run_name()
    args = [*SYNC, "--log_dir", str(tmp_path), "--run_name", name]
    first = run_train(*args, "--max_steps", "4", "--save_every", "2")
    assert first.returncode == 0, first.stdout[-3000:]
    from pathlib import Path
    run_dir = Path(OUT) / name
    weights = run_dir / "ckpt-000004" / "model.safetensors"
    with open(weights, "r+b") as f:  # a copy cut short
        f.truncate(os.path.getsize(weights) // 2)
    shutil.copytree(run_dir / "ckpt-000002", run_dir / "ckpt-000006.tmp")  # an unfinished write: never a candidate
    resumed = run_train(*args, "--max_steps", "5", "--save_every", "-1", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "skipping checkpoint" in resumed.stdout and "ckpt-000004" in resumed.stdout
    assert "ckpt-000002 at step 2" in resumed.stdout
    steps = [r["step"] for r in log_records(tmp_path, name)]
    assert steps == [1, 2, 3, 4, 3, 4, 5]  # steps 3 and 4 redone from the step-2 checkpoint


def test_non_finite_step_is_skipped_then_the_run_stops(tmp_path, toy_path, run_name):
    from pathlib import Path
    from safetensors.torch import load_file
    args = [*SYNC, "--log_dir", str(tmp_path), "--save_every", "1", "--keep_checkpoints", "10"]
    nan1, nan2 = run_name("nan1"), run_name("nan2")
    ok = run_train(*args, "--max_steps", "3", "--run_name", nan1, env={"SCALERL_FAULT_NAN_STEPS": "2"})
    assert ok.returncode == 0, ok.stdout[-3000:]
    train = log_records(tmp_path, nan1)
    assert [r["skipped"] for r in train] == [False, True, False]
    assert train[1]["loss"] is None  # NaN is written as null: the log stays valid JSON
    ckpt = Path(OUT) / nan1
    w1, w2 = load_file(ckpt / "ckpt-000001" / "model.safetensors"), load_file(ckpt / "ckpt-000002" / "model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # the skipped step left the weights alone
    o1 = torch.load(ckpt / "ckpt-000001" / "optimizer.pt", weights_only=True)
    o2 = torch.load(ckpt / "ckpt-000002" / "optimizer.pt", weights_only=True)
    assert all(torch.equal(o1["state"][k]["exp_avg"], o2["state"][k]["exp_avg"]) for k in o1["state"])

    bad = run_train(*args, "--max_steps", "8", "--max_bad_steps", "3", "--run_name", nan2,
                    env={"SCALERL_FAULT_NAN_STEPS": "3,4,5"})
    assert bad.returncode == 3, bad.stdout[-3000:]
    assert "3 consecutive steps with a non-finite" in bad.stdout and "Traceback" not in bad.stdout
    assert [r["step"] for r in log_records(tmp_path, nan2)] == [1, 2, 3, 4, 5]
    from transformers import AutoModelForCausalLM
    last = sorted((Path(OUT) / nan2).glob("ckpt-*"))[-1]
    assert last.name == "ckpt-000004"  # the step before the run gave up
    AutoModelForCausalLM.from_pretrained(last)  # intact and loadable


def test_engine_failure_ends_the_run_cleanly(tmp_path, toy_path, run_name):
    name = run_name()
    proc = run_train(*SYNC, "--max_steps", "4", "--save_every", "1", "--log_dir", str(tmp_path), "--run_name", name,
                     env={"SCALERL_FAULT_ENGINE_STEP": "3"})
    assert proc.returncode == 4, proc.stdout[-3000:]
    assert "generation failed at step 3" in proc.stdout and "Traceback" not in proc.stdout
    records = [json.loads(line) for line in open(tmp_path / f"{name}.jsonl")]
    assert records[-1]["kind"] == "error" and records[-1]["step"] == 3
    assert os.path.isdir(os.path.join(OUT, name, "ckpt-000002"))


# --- checkpoints verified by content, one writer per run, Ctrl-C --------------------------------------------------
def _corrupt(ckpt, name):
    """Damage one file of a checkpoint without changing its size (or, for the manifest, make it a FIFO)."""
    path = ckpt / name
    if name == "manifest.json":
        path.unlink()
        os.mkfifo(path)  # reading it would block forever
    elif name == "state.json":  # valid JSON of the same length, without what a resume reads
        size = path.stat().st_size
        path.write_text(json.dumps({"x": "y" * (size - 11)})[:size].ljust(size))
    else:
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xff" * (size - size // 2))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng.pt", "state.json", "manifest.json"])
def test_checkpoint_corrupted_in_place_is_skipped_and_the_good_one_kept(tmp_path, toy_path, run_name, name):
    """Any file of the newest checkpoint damaged (same size): the resume warns, falls back to the previous
    checkpoint, trains finite weights, and rotation keeps a checkpoint that verifies."""
    from pathlib import Path
    from safetensors.torch import load_file
    run = run_name(name.split(".")[0])
    args = [*SYNC, "--log_dir", str(tmp_path), "--run_name", run, "--save_every", "1", "--keep_checkpoints", "2"]
    first = run_train(*args, "--max_steps", "3")
    assert first.returncode == 0, first.stdout[-3000:]
    run_dir = Path(OUT) / run
    _corrupt(run_dir / "ckpt-000003", name)
    resumed = run_train(*args, "--max_steps", "4", "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "skipping checkpoint" in resumed.stdout and "ckpt-000003" in resumed.stdout and "Traceback" not in resumed.stdout
    assert "ckpt-000002 at step 2" in resumed.stdout
    assert [r["step"] for r in log_records(tmp_path, run)] == [1, 2, 3, 3, 4]
    assert sorted(p.name for p in run_dir.glob("ckpt-*")) == ["ckpt-000003", "ckpt-000004"]  # rewritten, verified
    import checkpoint
    assert all(checkpoint.verify(str(p)) is None for p in run_dir.glob("ckpt-*"))
    weights = load_file(run_dir / "ckpt-000004" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_non_finite_weights_are_refused_even_with_a_matching_manifest(tmp_path, toy_path, run_name):
    from pathlib import Path
    from safetensors.torch import load_file, save_file
    import checkpoint
    run = run_name()
    first = run_train(*SYNC, "--log_dir", str(tmp_path), "--run_name", run, "--save_every", "1", "--max_steps", "1")
    assert first.returncode == 0, first.stdout[-3000:]
    ckpt = Path(OUT) / run / "ckpt-000001"
    assert checkpoint.verify(str(ckpt)) is None
    weights = load_file(ckpt / "model.safetensors")
    key = next(iter(weights))
    weights[key][0] = float("nan")
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["model.safetensors"] = {"bytes": (ckpt / "model.safetensors").stat().st_size,
                                     "sha256": checkpoint.file_sha256(str(ckpt / "model.safetensors"))}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert "not finite" in checkpoint.verify(str(ckpt))
    # content checks behind the hashes: a state.json without what a resume reads, vouched for by its manifest
    (ckpt / "state.json").write_text(json.dumps({"counters": {}, "sampler": {}}))
    manifest["state.json"] = {"bytes": (ckpt / "state.json").stat().st_size,
                              "sha256": checkpoint.file_sha256(str(ckpt / "state.json"))}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert "state.json lacks" in checkpoint.verify(str(ckpt))
    # a manifest of sizes only (written before content hashes) is still read, with a warning
    (ckpt / "manifest.json").write_text(json.dumps({k: v["bytes"] for k, v in manifest.items()}))
    said = []
    assert "state.json lacks" in checkpoint.verify(str(ckpt), log=said.append) and "predates" in said[0]


def test_one_writer_per_run_and_no_silent_reuse_of_a_name(tmp_path, toy_path, run_name):
    """A second process on a live run is refused (naming the holder); a killed holder's lock is taken over;
    a new run on a used name without --resume is refused instead of appending to its log."""
    run = run_name()
    args = [*SYNC, "--log_dir", str(tmp_path), "--run_name", run, "--save_every", "1"]
    holder = subprocess.Popen([sys.executable, *train_cmd(*args, "--max_steps", "200")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: os.path.isdir(os.path.join(OUT, run, "ckpt-000001")), holder)
        second = run_train(*args, "--max_steps", "3", "--resume", timeout=120)
        lines = [ln for ln in second.stdout.splitlines() if ln.strip()]
        assert second.returncode == 2 and lines[-1].startswith("error:") and "Traceback" not in second.stdout
        assert f"pid {holder.pid}" in lines[-1] and "one writer" in lines[-1]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    reused = run_train(*args, "--max_steps", "3", timeout=120)  # same name, no --resume
    lines = [ln for ln in reused.stdout.splitlines() if ln.strip()]
    assert reused.returncode == 2 and "--resume" in lines[-1] and "exists" in lines[-1]
    configs = [json.loads(line) for line in open(tmp_path / f"{run}.jsonl") if '"kind": "config"' in line]
    assert len(configs) == 1  # nothing appended
    resumed = run_train(*args, "--max_steps", "3", "--resume", "--save_every", "-1", timeout=300)  # the stale lock
    assert resumed.returncode == 0, resumed.stdout[-3000:]


def test_ctrl_c_stops_cleanly_after_a_checkpoint(tmp_path, toy_path, run_name):
    run = run_name()
    args = [*SYNC, "--log_dir", str(tmp_path), "--run_name", run, "--save_every", "-1", "--max_steps", "200"]
    proc = subprocess.Popen([sys.executable, *train_cmd(*args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _wait_for(lambda: os.path.exists(tmp_path / f"{run}.jsonl") and len(log_records(tmp_path, run)) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    steps = [r["step"] for r in log_records(tmp_path, run)]
    assert f"stopped by Ctrl-C at step {steps[-1]}" in out
    assert os.path.isdir(os.path.join(OUT, run, f"ckpt-{steps[-1]:06d}"))  # saved although --save_every -1
    for line in open(tmp_path / f"{run}.jsonl"):
        json.loads(line)  # every line whole

    early = subprocess.Popen([sys.executable, *train_cmd(*SYNC, "--log_dir", str(tmp_path), "--run_name", run_name())],
                             cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(4)  # inside start-up (imports, model, engine)
    early.send_signal(signal.SIGINT)
    out, _ = early.communicate(timeout=120)
    assert early.returncode == 130 and "Traceback" not in out and "interrupted" in out, out[-3000:]


def test_sigterm_during_an_evaluation_stops_it_at_once_with_a_checkpoint(tmp_path, toy_path, run_name):
    """A scheduler's SIGTERM in the step-0 evaluation (1,000 prompts x 8, tens of seconds) does not wait for it, a
    step and a checkpoint: the evaluation's requests are aborted, nothing half-measured is logged, the step-0
    checkpoint is written and the run ends with exit 143, naming the signal; --resume evaluates step 0 again."""
    run = run_name()
    args = [*SYNC[:-6], "--eval_every", "100", "--eval_prompts", "1000", "--eval_samples", "8", "--log_dir",
            str(tmp_path), "--run_name", run, "--max_steps", "1"]
    proc = subprocess.Popen([sys.executable, *train_cmd(*args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _wait_for(lambda: os.path.exists(tmp_path / f"{run}.jsonl"), proc)  # the config record: the evaluation is next
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in out, out[-3000:]
    assert "stopped by SIGTERM at step 0" in out and "eval step 0" not in out, out[-3000:]
    assert log_records(tmp_path, run, "eval") == [] and os.path.isdir(os.path.join(OUT, run, "ckpt-000000"))


def test_resume_keeps_the_training_settings_and_refuses_impossible_counters(tmp_path, toy_path, run_name):
    """A resume that changes a training flag is refused in one line naming it; one that changes how long the run
    goes is logged; a checkpoint whose counters cannot be its own (step -5, re-hashed) is refused."""
    name = run_name()
    args = [*SYNC, "--log_dir", str(tmp_path), "--run_name", name, "--save_every", "1"]
    first = run_train(*args, "--max_steps", "2")
    assert first.returncode == 0, first.stdout[-3000:]
    for flag, value in (("--batch", "64"), ("--loss", "dapo"), ("--lr", "1e-3")):
        changed = run_train(*args, "--max_steps", "3", flag, value, "--resume", timeout=120)
        lines = [ln for ln in changed.stdout.splitlines() if ln.strip() and not ln.startswith("note:")]
        assert changed.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: --resume: {flag} was"), \
            changed.stdout[-2000:]
    # the settings are the checkpoint's: a log moved away (another --log_dir) or deleted lets nothing through
    moved = tmp_path / "moved"
    both = run_train(*args, "--max_steps", "3", "--log_dir", str(moved), "--lr", "1e-3", "--loss", "dapo", "--resume",
                     timeout=120)
    lines = [ln for ln in both.stdout.splitlines() if ln.startswith("error")]
    assert both.returncode == 2 and len(lines) == 1 and "--loss was" in lines[0] and "--lr was" in lines[0], \
        both.stdout[-2000:]
    # a symlink loop named as the newest checkpoint is neither resumed nor in the way of later saves
    os.symlink("ckpt-000009", os.path.join(OUT, name, "ckpt-000009"))
    resumed = run_train(*args, "--max_steps", "3", "--log_dir", str(moved), "--resume", timeout=300)
    assert resumed.returncode == 0 and "skipping" in resumed.stdout and "ckpt-000009" in resumed.stdout, \
        resumed.stdout[-3000:]
    assert os.path.isdir(os.path.join(OUT, name, "ckpt-000003"))
    os.remove(os.path.join(OUT, name, "ckpt-000009"))
    kinds = [json.loads(line)["kind"] for line in open(moved / f"{name}.jsonl")]
    assert kinds[:2] == ["resume", "config"] and kinds.count("train") == 1  # the new log says what it continues
    record = [json.loads(line) for line in open(moved / f"{name}.jsonl") if json.loads(line)["kind"] == "resume"]
    assert record[0]["changed"] == {"max_steps": [2, 3], "resume": [False, True], "log_dir": [str(tmp_path),
                                                                                                str(moved)]}
    from pathlib import Path
    ckpt = Path(OUT) / name / "ckpt-000003"
    original = (ckpt / "state.json").read_text()
    for counters, why in (({"step": -5}, "step = -5"), ({"step": 10**12}, "step 1000000000000 in a folder"),
                          ({"version": 7}, "version 7 after 3 steps"), ({"gpu_hours": -1.0}, "gpu_hours = -1.0")):
        state = json.loads(original)
        state["counters"].update(counters)
        (ckpt / "state.json").write_text(json.dumps(state))
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["state.json"] = {"bytes": (ckpt / "state.json").stat().st_size,
                                  "sha256": hashlib.sha256((ckpt / "state.json").read_bytes()).hexdigest()}
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        bad = run_train(*args, "--max_steps", "4", "--resume", timeout=300)
        lines = [ln for ln in bad.stdout.splitlines() if ln.startswith("error")]
        assert bad.returncode == 2 and len(lines) == 1 and "counters are not those of this checkpoint" in lines[0], \
            bad.stdout[-2000:]
        assert why in lines[0]


def test_a_full_disk_while_checkpointing_is_one_line_and_loses_nothing(tmp_path, toy_path, run_name):
    name = run_name()
    proc = run_train(*SYNC, "--log_dir", str(tmp_path), "--run_name", name, "--save_every", "1", "--max_steps", "3",
                     env={"SCALERL_FAULT_DISK_FULL": "2"})
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error")]
    assert proc.returncode == 4 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert len(errors) == 1 and "checkpoint of step 2 could not be written" in errors[0]
    assert "no space left on the device: 0 MiB free" in errors[0]  # not only torch's "file write failed"
    assert sorted(os.listdir(os.path.join(OUT, name))) == ["ckpt-000001", "lock"]  # no .tmp left, step 1 intact
    assert log_records(tmp_path, name, "error")[0]["step"] == 2


def test_a_rank_that_cannot_see_out_dir_stops_every_rank_in_one_line(tmp_path, toy_path, run_name):
    """Several machines without shared storage: rank 1 cannot read what rank 0 wrote to --out_dir. Both ranks stop
    at start-up, before any model loads, with one line naming --out_dir."""
    name = run_name()
    proc = torchrun(*SYNC, "--max_steps", "1", "--run_name", name, "--log_dir", str(tmp_path),
                    env={"SCALERL_FAULT_UNSHARED": "1"}, timeout=300)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stdout[-3000:]
    assert "rank 1 on" in errors[0] and "does not see rank 0's --out_dir" in errors[0]
    assert not os.path.exists(os.path.join(OUT, name))  # refused at start-up: no run folder left behind


def test_a_log_whose_last_line_a_crash_cut_gets_whole_records_after_it(tmp_path):
    """A SIGKILL mid-write leaves a partial last line; the resumed run's first record starts on a line of its own,
    so readers lose only the cut record, never the resume record glued to it."""
    from metrics import Log
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "config"}\n{"kind": "train", "st')
    log = Log(str(path), writer=True)
    log({"kind": "resume", "step": 1})
    lines = path.read_text().splitlines()
    assert lines[1] == '{"kind": "train", "st' and json.loads(lines[2]) == {"kind": "resume", "step": 1}
    Log(str(path), writer=True)({"kind": "train", "step": 2})  # a whole last line: nothing added
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()[2:]] == ["resume", "train"]
