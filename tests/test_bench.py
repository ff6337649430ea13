"""
Tests for bench.py's loop-against-limits measurement on the toy: the real loop, the real engine (~2 min).

    python -m pytest tests/test_bench.py -q
"""
import re
import subprocess
import sys

from conftest import OUT, ROOT


def bench(*flags, timeout=900):
    return subprocess.run([sys.executable, "bench.py", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_overhead_pairs_each_loop_run_with_its_own_replay(toy_path):
    """Two rounds, each a process that runs train.py and a replay of its timed steps (after an untimed warm-up
    replay), in the order loop, replay and then replay, loop; one overhead per round and the interval of their
    mean, beside the phase table."""
    proc = bench("--dtype", "float32", "--rounds", "2", "--steps", "3", "--skip", "1", "--padding", "--out_dir", OUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^step\s+\d+\.\d+$", proc.stdout, re.M), proc.stdout
    # a line per round as it ends (loop and replay next to each other in time), then the interval and the rounds
    # that +-2 points would take at this spread
    assert re.findall(r"^round (\d)/2: overhead -?[\d.]+%$", proc.stdout, re.M) == ["1", "2"], proc.stdout
    pattern = r"(-?[\d.]+)% ± ([\d.]+)% \(±2 points: ~(\d+) rounds\) \(rounds: (.*)\)"
    with_grader = re.search(r"^overhead over vLLM \+ trainer alone: " + pattern + r" over 2 round\(s\)$", proc.stdout, re.M)
    bookkeeping = re.search(r"^overhead over vLLM \+ grader \+ trainer alone, the loop's own bookkeeping: " + pattern + "$",
                            proc.stdout, re.M)
    assert with_grader and bookkeeping, proc.stdout
    rounds = []
    for line in (with_grader, bookkeeping):
        each = [float(x.rstrip("%")) for x in line.group(4).split(", ")]
        # the rounds asked of +-2 points follow from the interval: t * sd / sqrt(2) = half-width, so n = 2 (hw / 2)^2
        assert abs(int(line.group(3)) - 2 * (float(line.group(2)) / 2) ** 2) <= 2 + 0.01 * int(line.group(3))
        assert len(each) == 2 and abs(sum(each) / 2 - float(line.group(1))) < 0.06
        assert all(-100 < x < 100 for x in each)  # a replay of the same steps, not a different workload
        rounds.append(each)
    assert all(a >= b for a, b in zip(*rounds))  # the grader alone is part of the second limit, not of the first
    # padding against its alternatives, on the same steps
    layouts = re.findall(r"^padding: (.+?)\s+(-?[\d.]+)% padded,\s+([\d.]+) forward calls, ([\d.]+) s/step", proc.stdout, re.M)
    assert [name for name, *_ in layouts] == ["packed at 2048 tokens", "packed at 1024 tokens", "packed at 512 tokens",
                                              "one per row at 2048 tokens"], proc.stdout
    padded = {name: float(p) for name, p, _, _ in layouts}
    calls = {name: float(c) for name, _, c, _ in layouts}
    assert calls["packed at 512 tokens"] >= calls["packed at 1024 tokens"] >= calls["packed at 2048 tokens"] >= 1
    assert all(0 <= padded[name] < 100 and float(seconds) > 0 for name, _, _, seconds in layouts)


def test_bad_rounds_or_steps_are_one_line():
    for flags in (["--rounds", "0"], ["--steps", "3", "--skip", "3"], ["--steps", "5", "--skip", "1", "--repeats", "5"]):
        proc = bench(*flags, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().startswith("error: need --rounds"), (flags, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_flags_are_one_line_and_exit_2():
    """A mistyped train.py flag, a malformed --scale_lengths, an impossible step range: one line, status 2, before
    any model or engine starts."""
    for flags, needle in ((["--lrr", "1"], "did you mean --lr?"), (["--scale_lengths", "32,abc"], "--scale_lengths"),
                          (["--scale_lengths", "0"], "positive"), (["--steps", "2", "--skip", "5"], "--skip"),
                          (["--trainer_only", "--shapes", "7b"], "--shapes")):
        proc = bench(*flags, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), flags
        assert needle in proc.stderr and "Traceback" not in proc.stderr + proc.stdout



def test_a_first_warm_start_build_shows_its_progress(tmp_path):
    """The model is found (a toy built, a GGUF converted) in bench.py's own process, before the rounds whose output
    it captures: a first toy-l build (14 minutes on 2 cores) showed nothing until it ended. Here toy-s's build in an
    empty --out_dir must print its first progress line; the run is stopped there."""
    import os
    import signal
    import threading
    proc = subprocess.Popen([sys.executable, "bench.py", "--model", "toy-s", "--out_dir", str(tmp_path), "--steps",
                             "3"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timer = threading.Timer(120, os.killpg, (proc.pid, signal.SIGKILL))  # a bound on the wait for the line
    timer.start()
    try:
        seen = next((line for line in proc.stdout if line.startswith(("toy warm start: step 0/", "round"))), "")
    finally:
        timer.cancel()
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        proc.wait()
    assert seen.startswith("toy warm start: step 0/"), seen
