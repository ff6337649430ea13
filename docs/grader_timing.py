"""The grader's time per adversarial item (tests/test_grader.py's corpus), with the machine's other core saturated
by a busy loop, as a run beside the suite would: the times the tests only bound (their hang detector).

    .venv/bin/python docs/grader_timing.py --rounds 5

Prints, per item, the median and the worst wall-clock seconds of one grader call over the rounds, warm workers,
timeout_s 1.0, 2 workers; then the worst of all. Run on a machine otherwise quiet.
"""
import argparse
import multiprocessing
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
import rewards  # noqa: E402
from test_grader import CONTROLS, CORPUS, TIMEOUT_S, _fill  # noqa: E402


def burn():
    while True:
        pass


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    busy = multiprocessing.Process(target=burn, daemon=True)
    busy.start()
    grader = rewards.MathGrader(timeout_s=TIMEOUT_S, num_workers=2)
    times = {name: [] for name, _, _ in CORPUS}
    try:
        for _ in range(args.rounds):
            for name, completion, answer in CORPUS:
                tmp = pathlib.Path(tempfile.mkdtemp())
                _, ok, gold = CONTROLS[1]
                grader([ok, ok], [gold, gold])  # both workers started and answering before the clock
                t0 = time.monotonic()
                assert grader([_fill(completion, tmp)], [_fill(answer, tmp)]) == [-1.0], name
                times[name].append(time.monotonic() - t0)
    finally:
        grader.close()
        busy.terminate()
    print(f"{'item':<32} {'median s':>9} {'worst s':>8}   ({args.rounds} rounds, timeout_s {TIMEOUT_S})")
    for name, ts in times.items():
        print(f"{name:<32} {statistics.median(ts):9.2f} {max(ts):8.2f}")
    print(f"worst of all: {max(max(ts) for ts in times.values()):.2f} s; {grader.killed} workers killed")
