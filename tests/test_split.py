"""Generator ranks and trainer ranks (--generators, stream.py) under torchrun on CPU: a bad split, the equivalence
with the colocated run, the lag bound, resume, and ranks that die or hang.

    python -m pytest tests/test_split.py -q
"""
import re
import time

import pytest
import torch

import devices
from conftest import run_train
from test_resilience import SYNC, _completions, log_records, torchrun

SPLIT = ["--generators", "1", "--peer_timeout_s", "8"]


def env(rank, world, local=None):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % (local or world)),
            "LOCAL_WORLD_SIZE": str(local or world), "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}


def test_roles_split_ranks_and_refuse_what_cannot_run():
    """Trainers first, generators after; each role's own world; the 4:1 default on GPUs; one-line refusals."""
    roles = devices.roles_from_env(2, 6, cuda=True, env=env(3, 8))
    assert (roles.trainers, roles.generating) == (2, True)
    assert roles.layout() == devices.Layout(1, 6, 3, 6, 2)  # generator 1 of 6, engine 0 with generator 0
    assert devices.roles_from_env(1, 6, cuda=True, env=env(1, 8)).layout() == devices.Layout(1, 2, 1, 2, 1)
    assert devices.roles_from_env(1, -1, cuda=True, env=env(0, 8)).generators == 6  # 6 + 2
    assert devices.roles_from_env(1, -1, cuda=True, env=env(0, 2)).generators == 1
    assert devices.roles_from_env(1, -1, cuda=False, env=env(0, 2)).generators == 0  # CPUs: colocated
    assert devices.roles_from_env(1, -1, cuda=True, env={}).generators == 0  # one process
    for tp, g, e, words in ((1, 1, {}, "several processes"), (1, 2, env(0, 2), "no trainer"),
                            (2, 3, env(0, 4), "must divide --generators"),
                            (4, 8, env(0, 12, 6), "span two nodes"), (1, 5, env(0, 16, 8), "whole nodes"),
                            (1, 1, {"RANK": "0"}, "WORLD_SIZE is not"),
                            (1, 0, {"RANK": "0", "WORLD_SIZE": "1"}, "MASTER_ADDR is not")):  # a stray variable
        with pytest.raises(ValueError, match=words):
            devices.roles_from_env(tp, g, cuda=True, env=e)


def test_a_split_in_one_process_is_one_line_exit_2(tmp_path):
    proc = run_train("--generators", "1", "--log_dir", str(tmp_path), "--max_steps", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("error: --generators 1 needs several processes")


def test_one_trainer_and_one_generator_learn_what_one_colocated_rank_learns(tmp_path, toy_path, run_name):
    """Sync mode, 1 trainer + 1 generator against one colocated process: the same prompts and completions at both
    steps (the second comes from weights pushed to the generator), the same losses, and the same first gradient
    (fp32). The split changes where the work runs, not what is learned."""
    common = [*SYNC, "--max_steps", "2", "--save_every", "-1", "--log_dir", str(tmp_path), "--dtype", "float32",
              "--dump_every", "1"]
    one, two = run_name("colocated"), run_name("split")
    proc = run_train(*common, "--run_name", one, env={"SCALERL_FAULT_GRAD_FILE": str(tmp_path / "one.pt")})
    assert proc.returncode == 0, proc.stdout[-3000:]
    proc = torchrun(*common, *SPLIT, "--run_name", two, env={"SCALERL_FAULT_GRAD_FILE": str(tmp_path / "two.pt")})
    assert proc.returncode == 0 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    a, b = log_records(tmp_path, one), log_records(tmp_path, two)
    assert [r["prompts"] for r in a] == [r["prompts"] for r in b]
    for step in (1, 2):
        ca, cb = _completions(one, step), _completions(two, step)
        assert ca == cb, (step, [(x, y) for x, y in zip(ca, cb) if x != y][:3])
    for ra, rb in zip(a, b):
        assert abs(ra["loss"] - rb["loss"]) < 1e-6 and ra["reward_mean"] == rb["reward_mean"], (ra, rb)
        assert 0 < rb["gen_busy"] <= 1 and 0 < rb["train_busy"] <= 1, rb
    assert b[0]["push_bytes"] == 0 and b[1]["push_bytes"] >= 4 * 1e6  # step 1's weights pushed before step 2 (fp32)
    assert log_records(tmp_path, two, "config")[0]["world_size"] == 2
    ga, gb = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert max(g.abs().max().item() for g in ga["grads"].values()) > 1e-3  # a real gradient
    assert abs(ga["loss"] - gb["loss"]) < 1e-6
    assert max((ga["grads"][k] - gb["grads"][k]).abs().max().item() for k in ga["grads"]) < 1e-6


def test_pipeline_split_keeps_the_lag_bound_and_resumes_without_losing_a_group(tmp_path, toy_path, run_name):
    """PipelineRL-2 at depth 2, split: lags within k - 1, evaluations from the generator. The generator killed in
    step 3 (a step's prompts in flight, the checkpoint of step 2 written), the run resumed: the same prompts, step
    by step, as the run that never stopped; none lost, none trained twice."""
    common = ["--batch", "32", "--group", "8", "--k", "2", "--pipeline_depth", "2", "--eval_prompts", "16",
              "--eval_samples", "2", "--eval_every", "2", "--log_dir", str(tmp_path), *SPLIT]
    straight, stopped = run_name("straight"), run_name("stopped")
    proc = torchrun(*common, "--max_steps", "4", "--save_every", "-1", "--run_name", straight)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    train = log_records(tmp_path, straight)
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(r["lag_max"] <= 1 and r["samples"] == 32 * r["step"] for r in train)
    assert max(r["lag_max"] for r in train[1:]) == 1  # the pipeline really overlaps: stale groups are trained
    assert [r["step"] for r in log_records(tmp_path, straight, "eval")] == [0, 2, 4]
    proc = torchrun(*common, "--max_steps", "4", "--save_every", "2", "--run_name", stopped,
                    env={"SCALERL_FAULT_KILL": "gen:13"})  # 8 groups at step 1, then 4 a step: step 3 starts
    assert proc.returncode != 0 and "generator rank 1 stopped" in proc.stdout, proc.stdout[-3000:]
    assert [r["step"] for r in log_records(tmp_path, stopped)] == [1, 2]
    proc = torchrun(*common, "--max_steps", "4", "--save_every", "2", "--run_name", stopped, "--resume")
    assert proc.returncode == 0 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert [r["prompts"] for r in log_records(tmp_path, stopped)] == [r["prompts"] for r in train]


@pytest.mark.parametrize("fault,words", [("SCALERL_FAULT_KILL=gen:5", "generator rank 1 stopped: no heartbeat"),
                                         ("SCALERL_FAULT_NO_PUSH=2", "weight push"),
                                         ("SCALERL_FAULT_KILL=leader:2", "the trainer leader stopped")])
def test_a_rank_that_dies_or_a_push_that_never_comes_stops_every_rank(tmp_path, toy_path, run_name, fault, words):
    """A generator SIGKILLed in its second step, a push announced and never sent, the trainer leader SIGKILLed:
    the ranks left stop with one error line each and exit 4 within the peer timeout, never hang."""
    key, value = fault.split("=")
    name = run_name()
    t0 = time.time()
    proc = torchrun(*SYNC, *SPLIT, "--max_steps", "4", "--save_every", "-1", "--run_name", name, "--log_dir",
                    str(tmp_path), env={key: value}, timeout=300)
    assert proc.returncode != 0 and time.time() - t0 < 300
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error")]
    assert errors and any(words in e for e in errors), proc.stdout[-3000:]
    ours = [m.start() for m in re.finditer("Traceback", proc.stdout)  # torchrun prints its own ChildFailedError
            if "torch/distributed/run.py" not in proc.stdout[m.start():m.start() + 400]]
    assert not ours, proc.stdout[ours[0]:ours[0] + 3000]
    assert "exitcode  : 4" in proc.stdout or "exitcode  : -9" in proc.stdout  # torchrun's report of its workers
