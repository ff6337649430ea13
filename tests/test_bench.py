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
    """Two rounds: two loop runs, each against a replay of its timed steps; one overhead per round and the
    interval of their mean, beside the phase table."""
    proc = bench("--dtype", "float32", "--rounds", "2", "--steps", "3", "--skip", "1", "--out_dir", OUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^step\s+\d+\.\d+$", proc.stdout, re.M), proc.stdout
    line = re.search(r"^overhead on the same steps: (-?[\d.]+)% ± ([\d.]+)% over 2 round\(s\) \(each: (.*)\)$",
                     proc.stdout, re.M)
    assert line, proc.stdout
    each = [float(x.rstrip("%")) for x in line.group(3).split(", ")]
    assert len(each) == 2 and abs(sum(each) / 2 - float(line.group(1))) < 0.06
    assert all(-100 < x < 100 for x in each)  # a replay of the same steps, not a different workload


def test_bad_rounds_or_steps_are_one_line():
    for flags in (["--rounds", "0"], ["--steps", "3", "--skip", "3"], ["--steps", "5", "--skip", "1", "--repeats", "5"]):
        proc = bench(*flags, timeout=120)
        assert proc.returncode == 1 and proc.stderr.strip().startswith("error: need --rounds"), (flags, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
