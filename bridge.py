"""The line between generator ranks and trainer ranks of a split run (--generators, stream.py).

Who talks to whom:
  * torchrun's store (its agent hosts it: it outlives any worker) carries JSON messages: a queue per engine from
    the leader, msg/<engine>/<i> (generate these prompts, evaluate these, load a push, stop), one per generator
    rank back, out/<g>/<j> (graded groups, evaluation sums). Every rank beats (beat/<rank>, from a thread with a
    connection of its own): a peer silent for --peer_timeout_s is dead, and whoever waits on it stops with one
    line, exit 4, as every rank does when one posts its failure (error).
  * A gloo group (NCCL on GPUs) of the leader and the generators carries the weights: names, shapes and dtype
    once, at set-up; per push a message in every engine's queue, then flat buffers of up to BUCKET_BYTES, not
    a message per tensor. No collective of one group ever waits inside a collective of another.
"""
import atexit
import contextlib
import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

BUCKET_BYTES = 256 << 20  # a push's flat buffers: few enough messages, bounded extra memory on both sides


class PeerError(RuntimeError):
    """Another rank died, stopped beating, or posted an error: this rank stops too (one line, exit 4)."""


class Bridge:
    """The store, heartbeats and the weight group. Built first on every rank, before either world: a rank busy
    building a model would leave the others waiting."""

    def __init__(self, roles, timeout_s: float, cuda: bool):
        env, job = os.environ, roles.job
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"  # else rank 0 hosts it
        prefix = f"scalerl/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

        def connect(host_it=False):
            store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=host_it,
                                  timeout=datetime.timedelta(seconds=max(60.0, timeout_s)), wait_for_workers=False)
            return dist.PrefixStore(prefix, store)
        self.store = connect(host_it=not agent and job.rank == 0)
        self.rank, self.trainers, self.timeout_s = job.rank, roles.trainers, timeout_s
        self.seen: dict[int, tuple[int, float]] = {}  # peer rank -> (its beat count, when it last changed)
        self.checked = 0.0
        self.beating = threading.Event()
        self.beats = threading.Thread(target=self._beat, args=(connect(),), daemon=True)
        self.beats.start()
        atexit.register(self.quiet)
        self.group = None  # the weight group: leader = 0, generator g = 1 + g; other trainers are not in it
        if job.rank == 0 or roles.generating:
            members = 1 + roles.generators
            me = 0 if job.rank == 0 else 1 + job.rank - roles.trainers
            store = dist.PrefixStore("weights/", self.store)
            if cuda:  # unverified: no GPU was available to this project (docs/gpu.md)
                self.group = dist.ProcessGroupNCCL(store, me, members, dist.ProcessGroupNCCL.Options())
            else:
                self.group = dist.ProcessGroupGloo(store, me, members, datetime.timedelta(seconds=timeout_s))

    def _beat(self, store):
        while not self.beating.wait(0.5):
            try:
                store.add(f"beat/{self.rank}", 1)
            except Exception:  # the store's host is gone; the main thread finds out when it next looks
                return

    def quiet(self):
        """Stop beating before the interpreter ends: a thread inside the store's C++ client at exit aborts it."""
        self.beating.set()
        self.beats.join(timeout=2)

    def post_error(self, message: str):
        with contextlib.suppress(Exception):  # the first failure is the one every rank reports
            self.store.compare_set("error", "", message)

    def check(self, peers: list[int]):
        """Raise PeerError if any rank posted an error or a peer's beat has stopped (looks twice a second)."""
        now = time.time()
        if now - self.checked < 0.5:
            return
        self.checked = now
        try:
            if self.store.check(["error"]) and (message := self.store.get("error").decode()):
                raise PeerError(message)
            for r in peers:
                count = self.store.add(f"beat/{r}", 0)
                last = self.seen.get(r)
                if last is None or last[0] != count:
                    self.seen[r] = (count, now)
                elif now - last[1] > self.timeout_s:
                    role = "the trainer leader" if r == 0 else f"generator rank {r}"
                    raise PeerError(f"{role} stopped: no heartbeat for {self.timeout_s:.0f} s (it died or hangs)")
        except (RuntimeError, OSError) as e:  # the store itself is gone (its host died)
            if isinstance(e, PeerError):
                raise
            raise PeerError(f"lost the run's store ({type(e).__name__}): a rank or torchrun's agent died") from None

    def send(self, key: str, message: dict):
        self.store.set(key, json.dumps(message))

    def receive(self, key: str) -> dict | None:
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def wait(self, key: str, peers: list[int]) -> dict:
        while (message := self.receive(key)) is None:
            self.check(peers)
            time.sleep(0.005)
        return message

    def broadcast(self, flat: torch.Tensor):  # from the leader, bridge rank 0
        self.group.broadcast(flat, 0).wait()


def buckets(meta: list) -> list[list[int]]:
    """Consecutive tensors (indices into meta: name, shape, dtype) packed into flat buffers of one dtype, each up
    to BUCKET_BYTES (one tensor may exceed it alone). The same on both sides, from the metadata alone."""
    out, size = [], 0
    for i, (_, shape, dtype) in enumerate(meta):
        nbytes = torch.Size(shape).numel() * getattr(torch, dtype).itemsize
        if not out or meta[out[-1][0]][2] != dtype or size + nbytes > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes
    return out


def leave(bridge: Bridge, status: int):
    """End a split run's process: its heartbeat stopped, its output flushed, then at once, without the C++
    teardown of the store's clients and the weight group, which can abort (SIGABRT) once a peer has gone."""
    bridge.quiet()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
