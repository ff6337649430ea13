"""The bookkeeping of a run: the JSON-lines log (the input of fit_curve.py), the device-hour clock that is the x
axis of the paper's curves, phase timers, memory readings, and the signal handler that ends a run cleanly.
train.py builds each step's record from these.
"""
import json
import math
import os
import resource
import signal
import sys
import time
from contextlib import contextmanager


class Log:
    """One JSON line per record, appended and flushed: a crash loses at most the line being written. NaN and
    infinity are written as null (they are not JSON). Optionally mirrored to Weights & Biases. Only the rank
    that writes (rank 0) opens anything; the others' calls do nothing."""

    def __init__(self, path: str, writer: bool, wandb_run: dict | None = None):
        self.file = self.wandb = None
        if writer:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.file = open(path, "a")
            with open(path, "rb") as tail:  # a last line cut by a crash is ended, so the next record is whole
                if tail.seek(0, os.SEEK_END) and (tail.seek(-1, os.SEEK_END), tail.read(1))[1] != b"\n":
                    self.file.write("\n")
            if wandb_run is not None:  # {"name": run name, "config": the config as a dict}
                import wandb
                self.wandb = wandb.init(project="scalerl", name=wandb_run["name"], id=wandb_run["name"],
                                        resume="allow", config=wandb_run["config"])

    def __call__(self, record: dict):
        if self.file is None:
            return
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        if self.wandb is not None and "step" in record:
            self.wandb.log({f"{record['kind']}/{k}": v for k, v in clean.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"},
                           step=record["step"])

    def close(self):
        if self.wandb is not None:
            self.wandb.finish()


class Clock:
    """Device-hours of training (`gpu_hours`, the x axis of the paper's curves): wall-clock of the loop times
    the number of devices, banked by tick() at the end of each step. Time inside paused() (evaluation, rollout
    dumps, checkpoints) is not training; credit() adds back a share of it that was (training completions
    decoding during an evaluation)."""

    def __init__(self, hours: float, devices: int):
        self.hours, self.devices, self.since = hours, devices, time.time()

    def tick(self) -> float:
        now = time.time()
        self.hours += (now - self.since) * self.devices / 3600
        self.since = now
        return self.hours

    @contextmanager
    def paused(self):
        t0 = time.time()
        yield
        self.since += time.time() - t0

    def credit(self, seconds: float):
        self.hours += seconds * self.devices / 3600


class Timer(dict):
    """Seconds per phase of one step: `with timer("generate"): ...` adds to timer["generate"]."""

    def __init__(self):
        super().__init__()
        self.start = time.time()

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.time()
        yield
        self[phase] = self.get(phase, 0.0) + time.time() - t0


def resident_gib() -> float:
    """This process's resident memory now (GiB; the most of any rank is logged): what a soak run watches."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:  # not Linux: the peak is the best there is
        return peak_rss_gib()


def peak_rss_gib() -> float:
    """The process's peak resident memory (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 2**30


def release_free_memory(step: int, every: int = 10):
    """Give freed heap pages back to the OS (glibc's malloc_trim; a no-op elsewhere), every `every` steps (a trim
    costs ~12 ms on the toy's heap). Without it the resident memory of a toy run climbs ~0.05 GiB per 100 steps
    long after warm-up while the heap's in-use bytes stay flat (mallinfo2): freed chunks scattered through the
    heap stay resident. Fragmentation, not a leak."""
    if step % every:
        return
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def token_lags(kept: list, trained_version: int, k: int) -> list[int]:
    """Trained (sampled, kept) tokens by their own lag, 0 .. k-1: the policy versions between the one that
    sampled each token and the one trained now (paper §3.1: at most k - 1)."""
    counts = [0] * k
    for s in (s for g in kept for s in g.samples):
        for v, m in zip(s.versions, s.mask):
            if m and v >= 0:
                counts[min(trained_version - v, k - 1)] += 1
    return counts


def write_jsonl(path: str, rows: list[dict]) -> None:
    """rows as JSON lines in a new file, its folder made if needed (the rollout dumps)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


class Interrupt:
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler's stop) ends the run cleanly, with one line, exit status 128 +
    the signal and no traceback: during the loop, after the current step (or at once in an evaluation) and a
    checkpoint; otherwise, or at a second signal, at once (the log stays valid: it is flushed per record; a
    half-written checkpoint is a .tmp folder, ignored). torchrun passes the signal to every rank but kills them
    after its own shutdown timeout."""

    def __init__(self):
        self.in_loop, self.requested = False, 0
        signal.signal(signal.SIGINT, self)
        signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame):
        if self.in_loop and not self.requested:
            self.requested = 128 + signum
            print(f"interrupted ({signal.Signals(signum).name}): stopping after this step or evaluation and a "
                  "checkpoint (interrupt again to stop now)",
                  file=sys.stderr, flush=True)
            return
        print("error: interrupted", file=sys.stderr, flush=True)
        os._exit(128 + signum)  # not an exception: vLLM or gloo code mid-call must not print a traceback on exit
