"""PipelineRL with its pipeline (paper §3.1, A.3): generator ranks decode without pause while trainer ranks train,
in one torchrun job; after each optimizer step the trainers' leader (rank 0) pushes the new weights to every
generator, which loads them between two engine steps while its requests keep decoding on their old KV cache.

    torchrun --nproc_per_node 2 train.py --generators 1        # 1 trainer + 1 generator (CPU: a core each)

The line between them (messages, heartbeats, the weight group) is bridge.py; the trainers have a world of their
own (FSDP2 over them alone), the generators another (vLLM's).

The lag bound of rollouts.py holds exactly. Groups are trained in the order drawn, --batch completions a step; the
leader admits prompt n (P a step, counted from 0) at step s only if n < (s + d) P, once the generators hold step
s's weights: d = --pipeline_depth <= k (PipelineRL; k by default here), k steps' worth every k steps (PPO-off-
policy-k), 1 (sync). Prompt n is trained at step n // P: its lag is at most d - 1 <= k - 1. The leader's choices
depend on the step alone, so every trainer rank draws alike; which version sampled a token depends on timing (that
is PipelineRL). Checkpoints save the prompts drawn and not trained; --resume draws them first: none is lost.
"""
import atexit
import contextlib
import dataclasses
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from bridge import Bridge, PeerError, buckets, leave
from generate import Group, Sample
from policy import full_weights
from rollouts import TrainingSetSolved, evaluate, grade_groups, pipeline_steps, ungraded

# --- the trainers' side ------------------------------------------------------------------------------------------
class Remote:
    """What train.py asks of a Generator and of Rollouts, answered by the generator ranks: next_batch (this trainer
    rank's share of a step's groups), update_weights (a push), evaluate, pending. Every trainer rank keeps the same
    sampler and bookkeeping; the leader alone talks to the generators."""

    def __init__(self, cfg, roles, bridge: Bridge, sampler, model, interrupt):
        self.cfg, self.bridge, self.sampler, self.model, self.interrupt = cfg, bridge, sampler, model, interrupt
        self.layout = roles.layout()
        self.leader = self.layout.rank == 0
        self.generators, self.engines = roles.generators, roles.generators // cfg.tp
        self.peers = [roles.trainers + g for g in range(roles.generators)]
        self.depth = cfg.k if cfg.mode == "ppo" else pipeline_steps(cfg) if cfg.mode == "pipeline" else 1
        self.version = self.pushed = self.steps = 0
        self.base = sampler.serial
        self.dispatched: dict[int, int] = {}  # serial -> prompt index: drawn, not trained yet
        self.arrived: dict[int, Group] = {}  # (leader) finished and graded, not trained yet
        self.sent, self.read = [0] * self.engines, [0] * self.generators
        self.tokens_decoded = [0, 0]  # [evaluation, training] tokens sampled by every generator
        self.busy, self.mark = [[0.0] * 3 for _ in range(self.generators)], [0.0] * 3  # busy, idle, wall s
        self.grading = [0.0, 0]  # grading seconds and ungraded completions, every generator, cumulative
        self.t_grade, self.ungraded, self.solved, self.asleep = 0.0, 0, "", False
        self.t_push, self.push_bytes, self.closed = 0.0, 0, False
        if self.leader:
            atexit.register(self._atexit)

    # --- set-up and the end ---
    def start(self, model_path: str, version: int, seqs: int, vllm_fraction: float) -> str | None:
        """Give the generators the model, version, weights' names, shapes and dtype, sequences an engine holds and
        its share of a GPU; wait for every engine. Returns why one could not start, or None."""
        self.set_version(version)
        self.meta = [(n, list(p.shape), self.cfg.dtype) for n, p in self.model.named_parameters()]
        try:
            if self.leader:
                self.bridge.send("setup", {"model_path": model_path, "version": version, "meta": self.meta,
                                           "seqs": seqs, "vllm_fraction": vllm_fraction})
                for g in range(self.generators):
                    self.bridge.wait(f"ready/{g}", self.peers)
        except PeerError as e:
            return str(e)

    def set_version(self, version: int):  # (train.py, after a resume; the generators got it in start)
        self.version = self.pushed = version

    def close(self):
        """The run's end: the generators stop, and so does this process (bridge.leave)."""
        self._tell_stop(0)
        leave(self.bridge, 0)

    def _tell_stop(self, status: int):
        if self.leader and not self.closed:
            for e in range(self.engines):
                self._send(e, {"kind": "stop", "status": status})
        self.closed = True

    def _atexit(self):  # the leader leaves without close(): an error or a signal; the generators stop too
        with contextlib.suppress(Exception):
            self._tell_stop(self.interrupt.requested or 4)

    sleep = staticmethod(lambda: None)  # nothing to make room for: the generators have their own devices

    # --- weights ---
    def update_weights(self, named_tensors, new_version: bool = True):
        """After an optimizer step. PipelineRL pushes at once (generators are decoding); sync and PPO push when the
        generators next need weights (the next draw, or an evaluation), so PPO-off-policy-k pushes once every k."""
        if new_version:
            self.version += 1
            if self.cfg.mode == "pipeline":
                self._push(named_tensors)

    def _push_if_stale(self):
        if self.pushed < self.version:
            self._push(full_weights(self.model, getattr(torch, self.cfg.dtype)))

    def _push(self, named_tensors):
        """Every trainer gathers (FSDP2's collectives); the leader streams buckets as they fill. One failure is a
        RuntimeError in one line (train.py stops every rank)."""
        t0, nbytes = time.time(), 0
        tensors = iter(named_tensors)
        try:
            if self.leader:
                for e in range(self.engines):
                    self._send(e, {"kind": "push", "version": self.version})
            for idx in buckets(self.meta):
                part = [next(tensors)[1].reshape(-1) for _ in idx]
                if self.leader:
                    flat = torch.cat(part) if len(part) > 1 else part[0].contiguous()
                    self.bridge.broadcast(flat)
                    nbytes += flat.numel() * flat.element_size()
        except Exception as e:
            for _ in tensors:  # the other trainers are gathering these
                pass
            raise RuntimeError(f"the weight push of version {self.version} failed: {type(e).__name__}: "
                               f"{str(e)[:300]}") from None
        self.pushed = self.version
        self.t_push += time.time() - t0
        self.push_bytes += nbytes

    # --- rollouts ---
    def next_batch(self) -> list[Group] | None:
        cfg, P = self.cfg, self.cfg.prompts_per_step
        self.t_push, self.push_bytes = 0.0, 0
        grading = list(self.grading)
        if cfg.mode != "ppo" or self.steps % cfg.k == 0:  # admit what the lag bound allows
            want = self.base + (self.steps + self.depth) * P - self.sampler.serial
            if want > 0:
                self._push_if_stale()  # requests admitted now start on this step's weights
                try:
                    draws = self.sampler.draw(want)
                except TrainingSetSolved as e:
                    self.solved = str(e)
                    return None
                self.dispatched.update((serial, idx) for idx, serial in draws)
                if self.leader:
                    self._submit(draws)
        batch = sorted(self.dispatched)[:P]  # the oldest draws, exactly a step's worth
        groups = None
        if self.leader:
            self._until(lambda: all(serial in self.arrived for serial in batch))
            groups = [self.arrived.pop(serial) for serial in batch]
        if self.layout.world > 1:
            box = [groups, self.grading, self.tokens_decoded]
            dist.broadcast_object_list(box)
            groups, self.grading, self.tokens_decoded = box
        for serial in batch:
            del self.dispatched[serial]
        for g in groups:  # No-Positive-Resampling sees every trained group (the same on every trainer rank)
            self.sampler.record(g.prompt_idx, sum(s.correct for s in g.samples) / len(g.samples))
        self.t_grade, self.ungraded = self.grading[0] - grading[0], self.grading[1] - grading[1]
        self.steps += 1
        return groups[self.layout.rank::self.layout.world]

    def _submit(self, draws):
        rows = self.sampler.rows
        for e in range(self.engines):
            mine = [(serial, idx, rows[idx]["prompt_ids"], rows[idx]["answer"]) for idx, serial in draws
                    if serial % self.engines == e]
            if mine:
                self._send(e, {"kind": "generate", "groups": mine})

    def _send(self, engine: int, message: dict):
        self.bridge.send(f"msg/{engine}/{self.sent[engine]}", message)
        self.sent[engine] += 1

    def _until(self, done, evals: list | None = None):
        """Read the generators' messages until done(), checking on them whenever none came."""
        while not done():
            if not self._poll(evals):
                self.bridge.check(self.peers)
                time.sleep(0.002)

    def _poll(self, evals: list | None = None) -> bool:
        """Read every generator's new messages; True if there were any."""
        got = False
        for g in range(self.generators):
            while (m := self.bridge.receive(f"out/{g}/{self.read[g]}")) is not None:
                self.read[g] += 1
                got = True
                self.tokens_decoded = [sum(x) for x in zip(self.tokens_decoded, m.pop("tokens_new"))]
                self.grading = [self.grading[0] + m["t_grade"], self.grading[1] + m["ungraded"]]
                if m["kind"] == "eval":
                    evals.append(m["result"])
                for d in m.get("groups", []):
                    self.arrived[d["serial"]] = Group(**{**d, "samples": [Sample(**s) for s in d["samples"]]})
        return got

    def pending(self) -> list[tuple[int, int]]:
        return sorted(self.dispatched.items())

    def stats(self) -> dict:
        """For the step's record, since the last call: the generators' shares of time decoding or grading (busy)
        and with nothing to decode (idle; the rest: messages, pushes), the pushes' time and bytes."""
        if self.leader:  # each generator posts its clock ten times a second
            self.busy = [json.loads(self.bridge.store.get(f"clock/{g}")) for g in range(self.generators)]
        now = [sum(b[i] for b in self.busy) for i in range(3)]
        busy, idle, wall = (a - b for a, b in zip(now, self.mark))
        self.mark = now
        return {"gen_busy": busy / max(wall, 1e-9), "gen_idle": idle / max(wall, 1e-9), "t_push": self.t_push,
                "push_bytes": self.push_bytes}

    # --- evaluation ---
    def evaluate(self, rows: list[dict], cfg, grade=None, extract=None, **_) -> dict:
        """rollouts.evaluate on the generators, every engine its share (the seeds of a run with as many colocated
        engines); the sums on the leader, zeros elsewhere (train.py sums over the trainers)."""
        self._push_if_stale()
        keys = ("correct", "samples", "prompts", "variance_sum", "ungraded", "truncated", "completion_tokens")
        total = dict.fromkeys(keys + (("answered",) if extract else ()), 0.0)
        if not self.leader:
            return total
        for e in range(self.engines):
            self._send(e, {"kind": "evaluate", "first": e, "stride": self.engines,
                           "rows": [(r["prompt_ids"], r["answer"]) for r in rows[e::self.engines]]})
        results = []
        self._until(lambda: len(results) >= self.generators, results)
        for r in results:
            for k in total:
                total[k] += r.get(k, 0.0)
        return total


# --- the generators' side: one loop, top to bottom ------------------------------------------------------------------
def serve(cfg, roles, bridge: Bridge, interrupt) -> int:
    """A generator rank's whole life: its world, the engine, then messages and engine steps until the leader says
    stop. Returns the exit status. The first Ctrl-C is the leader's to act on (it finishes its step, checkpoints
    and says stop); a second one ends this rank at once."""
    from transformers import AutoTokenizer
    import rewards
    from generate import Generator
    interrupt.in_loop = True  # a first signal is noted and left to the leader; a second ends this rank at once
    layout, cuda = roles.layout(), torch.cuda.is_available()
    g, engine, leader = layout.rank, layout.engine, [0]
    os.environ.update(RANK=str(g), WORLD_SIZE=str(layout.world), LOCAL_WORLD_SIZE=str(layout.local_world),
                      SCALERL_ROLE="generator")  # what vLLM's external_launcher reads; progress bars stay quiet
    if cuda:
        torch.cuda.set_device(layout.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("generators/", bridge.store),
                            rank=g, world_size=layout.world, timeout=datetime.timedelta(hours=1))
    try:
        setup = bridge.wait("setup", leader)
        tokenizer = AutoTokenizer.from_pretrained(setup["model_path"])
        reward, thinking = rewards.REWARDS[cfg.reward], rewards.prompt_opens_thinking(tokenizer)
        grade = reward.make(cfg, tokenizer)
        extract = reward.extract and (lambda text: reward.extract(text, thinking=thinking))
        gen = Generator(cfg, setup["model_path"], tokenizer, layout.device(cuda), cfg.mode == "pipeline", layout,
                        setup["vllm_fraction"], setup["seqs"])
    except PeerError as e:
        return _stop(bridge, g, str(e))
    except Exception as e:
        return _stop(bridge, g, f"the vLLM engine failed to start on generator rank {g}: {type(e).__name__}: "
                                f"{str(e)[:300]}", post=True)
    gen.sleeps = False  # alone on its device: nothing to make room for
    gen.set_version(setup["version"])
    plan, meta = buckets(setup["meta"]), setup["meta"]
    bridge.send(f"ready/{g}", {})
    inbox = outbox = 0
    busy, idle, start, told, clocked = 0.0, 0.0, time.time(), list(gen.tokens_decoded), 0.0

    def post(kind: str, t_grade: float = 0.0, ungraded: int = 0, **body):
        nonlocal outbox, told
        bridge.send(f"out/{g}/{outbox}", {"kind": kind, "t_grade": t_grade,
                                           "ungraded": ungraded,
                                           "tokens_new": [a - b for a, b in zip(gen.tokens_decoded, told)], **body})
        outbox, told = outbox + 1, list(gen.tokens_decoded)

    try:
        while True:
            if time.time() - clocked > 0.1:  # seconds decoding or grading, idle, and in all, for the step records
                clocked = time.time()
                bridge.send(f"clock/{g}", [busy, idle, clocked - start])
            message = bridge.receive(f"msg/{engine}/{inbox}")
            if message is not None:  # in the order sent: a push lands before the prompts admitted after it
                inbox += 1
                if message["kind"] == "stop":
                    gen.close()  # the leader ended the run (and reports how); this rank has nothing to add
                    return 0
                if message["kind"] == "push":
                    named = []
                    for idx in plan:  # every bucket lands before any tensor is loaded
                        dtype = getattr(torch, meta[idx[0]][2])
                        sizes = [torch.Size(meta[i][1]).numel() for i in idx]
                        flat = torch.empty(sum(sizes), dtype=dtype, device=layout.device(cuda))
                        try:
                            bridge.broadcast(flat)
                        except Exception as e:  # (gloo's own timeout is --peer_timeout_s)
                            raise RuntimeError(f"the weight push of version {message['version']} did not arrive "
                                               f"within --peer_timeout_s ({cfg.peer_timeout_s:.0f} s): "
                                               f"{str(e)[-120:]}") from None
                        named += [(meta[i][0], t.view(meta[i][1])) for i, t in zip(idx, flat.split(sizes))]
                    gen.update_weights(named, new_version=False)  # in place, between two engine steps
                    gen.set_version(message["version"])
                elif message["kind"] == "generate":
                    for serial, idx, prompt_ids, answer in message["groups"]:
                        gen.submit(str(serial), idx, prompt_ids, answer, cfg.group, serial)
                elif message["kind"] == "evaluate":
                    rows, t0 = [{"prompt_ids": p, "answer": a} for p, a in message["rows"]], time.time()
                    result = evaluate(gen, rows, cfg, grade, first_index=message["first"], stride=message["stride"],
                                      share=(layout.tp_rank, layout.tp), extract=extract)
                    busy += time.time() - t0
                    post("eval", result=result)
                continue
            if not gen.engine.has_unfinished_requests():
                t0 = time.time()
                bridge.check(leader)
                time.sleep(0.001)
                idle += time.time() - t0
                continue
            t0 = time.time()
            gen.step()
            busy += time.time() - t0
            done = gen.take()
            if done and layout.tp_rank == 0:  # an engine's other ranks decode the same groups
                t0, before = time.time(), ungraded(grade)
                if hasattr(grade, "new_budget"):
                    grade.new_budget()
                grade_groups(done, grade, cfg)
                busy += time.time() - t0  # grading is the generator's work too
                post("groups", time.time() - t0, ungraded(grade) - before,
                     groups=[dataclasses.asdict(x) for x in done])
            bridge.check(leader)
    except PeerError as e:
        return _stop(bridge, g, str(e))
    except Exception as e:
        return _stop(bridge, g, f"generation failed on generator rank {g}: {type(e).__name__}: {str(e)[:300]}",
                     post=True)


def connect(cfg, roles, interrupt) -> Bridge:
    """The bridge, on every rank of a split run; a generator rank then serves until told to stop, and exits. Either
    fails in one line. PipelineRL's depth is k by default here: a generator's device is its own, so the lag bound
    alone limits what it holds (the paper's generators stream; its trainers wait when k steps ahead)."""
    if "pipeline_depth" not in cfg.typed and cfg.mode == "pipeline":
        object.__setattr__(cfg, "pipeline_depth", cfg.k)
    try:
        bridge = Bridge(roles, cfg.peer_timeout_s, torch.cuda.is_available())
    except Exception as e:
        print(f"error: rank {roles.job.rank} could not reach the other ranks: {type(e).__name__}: {str(e)[:300]}",
              file=sys.stderr, flush=True)
        sys.exit(4)
    if roles.generating:
        leave(bridge, serve(cfg, roles, bridge, interrupt))
    return bridge


def _stop(bridge: Bridge, g: int, message: str, post: bool = False) -> int:
    print(f"error (generator rank {g}): {message}", file=sys.stderr, flush=True)
    return post and bridge.post_error(message) or 4

