"""What a step trains on: which prompts (the curriculum, with No-Positive-Resampling), their graded groups,
and when they were generated relative to the weights (the off-policy schedules, paper §3.1).

    rollouts = Rollouts(gen, sampler, grade, cfg, layout)
    groups = rollouts.next_batch()        # this rank's graded groups for one step, per cfg.mode

Three ideas of the paper live here, each in one place:
  * No-Positive-Resampling (§3.2(d)): PromptSampler records every graded group's pass rate (gathered from
    every rank) and retires prompts that pass at >= npr_threshold from later epochs.
  * The schedules (§3.1), one class each in SCHEDULES, the table a fork adds to. Off-policyness is
    bounded by k, defined exactly as
        lag(group) = (policy version being trained) - (oldest version that sampled any of its first tokens)
        every trained group has lag <= k - 1
    so a trained completion's tokens come from at most k consecutive policy versions, and k = 1 is on-policy
    in every schedule (version v = the weights after v optimizer steps).
  * Rewards (A.3) and the DAPO length penalty (Eq. 9): grade_groups.

With tensor parallelism (--tp N) the N ranks of an engine submit the same requests (the engine's share of every
draw) and see the same finished groups; each then grades and trains on every N-th of them (Rollouts.share), so
no completion is trained twice and the global batch is the one N times as many engines would make.
"""
import random
import time

import torch.distributed as dist

from devices import Layout
from generate import Generator, Group, Progress


class TrainingSetSolved(RuntimeError):
    """No-Positive-Resampling has retired all but fewer than a step's prompts: the policy solves the rest, and a
    step would train on a handful of prompts repeated (train.py then evaluates, checkpoints and stops; --no_npr
    keeps sampling them)."""


class PromptSampler:
    """Epochs over the training prompts, each in a fresh seeded order, with No-Positive-Resampling (paper
    §3.2(d), Polaris): a prompt whose most recent group reached a pass rate >= npr_threshold is retired and
    left out of every later epoch (not the current one, which has already drawn it).

    "History" here is the pass rate of the prompt's most recent group of G completions: the policy keeps
    changing, so an old average says less than the latest measurement, and once easy a prompt tends to stay
    easy (paper §3.2). Prompts at pass rate 0 are never retired: zero-variance filtering only drops them from
    the loss.

    Every rank holds an identical copy: draws are global (rank r keeps every world-th prompt) and every
    rank records every group's pass rate, so the global batch, its seeds and the curriculum do not depend on
    the number of ranks. All state is plain data: checkpoints restore the exact data order and curriculum.

    min_pool (the prompts a step draws): an epoch of fewer prompts ends the run. Measured on the toy, a run that
    went on trained on the last prompt alone, 16 copies a step, and its pass rate fell from 0.94 to 0.56 in 20
    steps (docs/study.md)."""

    def __init__(self, rows: list[dict], seed: int, npr: bool, npr_threshold: float, min_pool: int = 1):
        self.rows, self.seed, self.npr, self.npr_threshold = rows, seed, npr, npr_threshold
        self.min_pool = min_pool
        self.epoch, self.pos, self.serial = 0, 0, 0
        self.requeued: list[int] = []  # prompts drawn but never trained on (see Rollouts.pending): served first
        self.retired: set[int] = set()
        self.order = self._order()

    def _order(self) -> list[int]:
        order = [i for i in range(len(self.rows)) if i not in self.retired]
        if len(order) < self.min_pool:
            raise TrainingSetSolved(f"No-Positive-Resampling retired {len(self.rows) - len(order)} of the "
                                    f"{len(self.rows)} training prompts, leaving fewer than the {self.min_pool} a "
                                    "step draws: the policy solves the training set (--no_npr keeps sampling them)")
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def draw(self, n: int, rank: int = 0, world: int = 1) -> list[tuple[int, int]]:
        """n global draws; this rank's share as (prompt index, serial). The serial numbers every draw of the
        run and seeds that group's sampling."""
        out = []
        for _ in range(n):
            if self.requeued:
                idx = self.requeued.pop(0)
            else:
                if self.pos == len(self.order):
                    self.epoch, self.pos = self.epoch + 1, 0
                    self.order = self._order()
                idx = self.order[self.pos]
                self.pos += 1
            if self.serial % world == rank:
                out.append((idx, self.serial))
            self.serial += 1
        return out

    def record(self, prompt_idx: int, pass_rate: float):
        """NPR's decision: retire a prompt whose latest group passed at >= npr_threshold."""
        if self.npr and pass_rate >= self.npr_threshold:
            self.retired.add(prompt_idx)

    def observe(self, groups: list) -> None:
        """Record the pass rate of every group graded on any rank since the last call (a collective when
        distributed: every rank calls it once per step), so that every rank's sampler stays identical."""
        mine = [(g.prompt_idx, sum(s.correct for s in g.samples) / len(g.samples)) for g in groups]
        everyone = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        for ranked in everyone:
            for prompt_idx, pass_rate in ranked:
                self.record(prompt_idx, pass_rate)

    def fingerprint(self) -> str:
        """What the saved indices point into: the training prompts, in order (a resume on another list is refused)."""
        import hashlib
        return hashlib.sha256("\0".join(r["prompt"] for r in self.rows).encode()).hexdigest()[:16]

    def state_dict(self, pending: list[int] = ()) -> dict:
        """pending: prompts drawn but not trained on yet; they come first after a resume."""
        return {"epoch": self.epoch, "pos": self.pos, "serial": self.serial, "order": self.order,
                "requeued": list(pending) + self.requeued, "retired": sorted(self.retired),
                "prompts": self.fingerprint()}

    def load_state_dict(self, state: dict):
        if state.get("prompts", self.fingerprint()) != self.fingerprint():
            raise ValueError("the training prompts differ from the ones this checkpoint's data order indexes "
                             "(another --dataset, or a dataset file that changed)")
        self.epoch, self.pos, self.serial = state["epoch"], state["pos"], state["serial"]
        self.order, self.requeued = list(state["order"]), list(state["requeued"])
        self.retired = set(state["retired"])


# --- rewards -----------------------------------------------------------------------------------------------------
def grade_groups(groups: list[Group], grade, cfg) -> list[Group]:
    """Rewards: +1 correct, -1 otherwise (paper A.3), from grade(texts, answers). With --length_penalty, the
    DAPO overlong penalty (Eq. 9) lowers correct completions longer than L_max - L_cache, down to -1."""
    samples = [(s, g.answer) for g in groups for s in g.samples]
    rewards = grade([s.text for s, _ in samples], [a for _, a in samples]) if samples else []
    for (s, _), reward in zip(samples, rewards):
        s.correct, s.reward = reward > 0, reward
        if cfg.length_penalty and s.correct:  # L_max - L_cache = think_max; L_cache = answer_max
            s.reward += min(0.0, max(-1.0, (cfg.think_max_tokens - len(s.token_ids)) / cfg.answer_max_tokens))
    return groups


# --- the schedules (paper §3.1): rollouts -> this rank's groups for one step --------------------------------------
class Schedule:
    """Which finished groups a step trains on. A schedule is a subclass with next_batch and an entry in SCHEDULES.
    Groups it keeps from one step to the next go in self.held: Rollouts.pending() counts them, so a checkpoint
    saves their prompts and a resume serves those prompts first. Kept anywhere else, they would be lost."""
    updates_in_flight = False  # requests are running when weights change (else the engine may sleep meanwhile)

    def __init__(self):
        self.held: list[Group] = []

    @staticmethod
    def steps_in_flight(cfg) -> int:
        """Steps' worth of prompts one engine holds at once (sizes vLLM's batch and the memory plan)."""
        return 1

    def next_batch(self, r: "Rollouts") -> list[Group]:
        raise NotImplementedError


class Sync(Schedule):
    """On-policy: generate one step's groups with the current weights, wait for all of them, train."""

    def next_batch(self, r):
        r.submit(r.cfg.prompts_per_step)
        return r.generate_all()


class PPO(Schedule):
    """PPO-off-policy-k: generate k steps' worth with the current weights, then take k optimizer steps on them
    one mini-batch at a time (the i-th is i versions stale)."""

    @staticmethod
    def steps_in_flight(cfg):
        return cfg.k

    def next_batch(self, r):
        if not self.held:
            r.submit(r.cfg.prompts_per_step * r.cfg.k)
            self.held = r.generate_all()  # this rank's share of the k steps, in draw order
        per_rank = r.cfg.prompts_per_step // r.layout.world
        batch, self.held = self.held[:per_rank], self.held[per_rank:]
        return batch


class Pipeline(Schedule):
    """PipelineRL-k: the engine always has requests in flight. Train on the oldest finished groups as soon as
    a step's worth is ready; the rest keep decoding across the weight update on their stale KV cache (in-flight
    update). The lag bound is kept by waiting, as the paper's trainers wait when k steps ahead: a group whose
    first token is k - 1 versions old must be in this step's batch, so the step waits for it.
    cfg.pipeline_depth steps' worth of prompts are drawn at the start, then as many as the last step trained on
    all ranks, so about that many decode at once: the deeper, the staler the groups trained (with lengths as
    even as the toy's, lags reach k - 1 only at depth >= k; a long straggler can age to k - 1 at any depth).
    Every rank draws the same number of prompts, whatever its own engine holds: the sampler is global."""
    updates_in_flight = True

    def __init__(self):
        super().__init__()
        self.refill: int | None = None  # prompts to draw next (None: fill the pipeline, as after a resume)

    @staticmethod
    def steps_in_flight(cfg):
        return pipeline_steps(cfg)

    def next_batch(self, r):
        cfg, gen = r.cfg, r.gen
        need = cfg.prompts_per_step // r.layout.engines  # this engine's share of a step
        r.submit(self.refill if self.refill is not None else cfg.prompts_per_step * pipeline_steps(cfg))
        oldest = gen.version - (cfg.k - 1)  # the oldest version a group trained now may start at

        def due(g):
            return g.first_version() is not None and g.first_version() <= oldest
        bar = Progress(need, "generate")
        while len(gen.finished) < need or any(due(g) for g in gen.inflight()):
            gen.step()
            bar.update(min(len(gen.finished), need))
        bar.close()
        ready = sorted(gen.finished, key=lambda g: (g.first_version(), g.serial))
        batch = ready[:max(need, sum(map(due, ready)))]  # (more than a batch only if more than one is due)
        self.refill = len(batch)
        if dist.is_initialized() and dist.get_world_size() > 1:  # what all engines took, drawn again by every rank
            taken = [None] * dist.get_world_size()
            dist.all_gather_object(taken, len(batch))
            self.refill = sum(taken) // r.layout.tp  # each engine's ranks all report its batch
        return r.grade(r.share(gen.take({g.uid for g in batch})))


def pipeline_steps(cfg) -> int:
    """Steps' worth of prompts PipelineRL keeps in flight: the depth, or 1 on-policy (k = 1)."""
    return cfg.pipeline_depth if cfg.k > 1 else 1


SCHEDULES = {"pipeline": Pipeline, "ppo": PPO, "sync": Sync}


def seqs_in_flight(cfg, engines: int) -> int:
    """Completions one engine holds at once under cfg.mode (vLLM's max_num_seqs; the memory plan's KV demand)."""
    return SCHEDULES[cfg.mode].steps_in_flight(cfg) * cfg.batch // engines


class Rollouts:
    """One batch of finished, graded groups per optimizer step, by the schedule cfg.mode. With several ranks
    each rank generates its share of every global draw (PromptSampler.draw) and calls next_batch once per
    step like every other rank, so the global batch is the same for any world size and tensor-parallel size."""

    def __init__(self, gen: Generator, sampler: PromptSampler, grade, cfg, layout: Layout = Layout()):
        self.gen, self.sampler, self.grade_fn, self.cfg, self.layout = gen, sampler, grade, cfg, layout
        self.schedule = SCHEDULES[cfg.mode]()
        self.graded: list[Group] = []  # graded since the last step: their pass rates go to NPR
        self.t_grade = 0.0  # seconds spent grading in the last next_batch
        self.ungraded = 0  # completions marked wrong in the last next_batch for lack of grading time
        self.solved = ""  # why next_batch returned None: NPR left fewer unretired prompts than a step draws

    def next_batch(self) -> list[Group] | None:
        """This rank's graded groups for one step; None once NPR has left fewer prompts than a step draws (the
        same step on every rank: their samplers are identical)."""
        self.t_grade = 0.0
        before = ungraded(self.grade_fn)
        if hasattr(self.grade_fn, "new_budget"):  # a grader with a time bound per step (rewards.MathGrader)
            self.grade_fn.new_budget()
        try:
            groups = self.schedule.next_batch(self)
        except TrainingSetSolved as e:
            self.solved = str(e)
            return None
        self.ungraded = ungraded(self.grade_fn) - before
        self.sampler.observe(self.graded)  # NPR sees every rank's graded groups (a collective)
        self.graded = []
        return groups

    def submit(self, n_global: int):
        """Draw n_global prompts (this engine's share) and start cfg.group completions of each."""
        for prompt_idx, serial in self.sampler.draw(n_global, self.layout.engine, self.layout.engines):
            row = self.sampler.rows[prompt_idx]
            self.gen.submit(str(serial), prompt_idx, row["prompt_ids"], row["answer"], self.cfg.group, serial)

    def generate_all(self) -> list[Group]:
        """Every group in flight, finished and graded, in draw order (whatever order they finished in)."""
        groups = self.gen.run_until_done({g.uid for g in self.gen.inflight()}, "generate")
        return self.grade(self.share(sorted(groups, key=lambda g: g.serial)))

    def share(self, groups: list[Group]) -> list[Group]:
        """This rank's part of its engine's groups: every tp-th, from its place in the engine's ranks."""
        return groups[self.layout.tp_rank::self.layout.tp]

    def grade(self, groups: list[Group]) -> list[Group]:
        t0 = time.time()
        grade_groups(groups, self.grade_fn, self.cfg)
        self.graded += groups
        self.t_grade += time.time() - t0
        return groups

    def pending(self) -> list[tuple[int, int]]:
        """(serial, prompt) of this engine's draws not trained on yet: in flight, finished, or held by the schedule
        (the ranks of an engine report the same draws; the checkpoint keeps each once)."""
        groups = self.gen.inflight() + self.gen.finished + self.schedule.held
        return [(g.serial, g.prompt_idx) for g in groups if g.serial >= 0]


def ungraded(grade) -> int:
    """Completions a grader has marked wrong for lack of time so far (0 for graders that always finish)."""
    return getattr(grade, "ungraded", 0)


# --- evaluation (paper §2.1) ---------------------------------------------------------------------------------------
def evaluate(gen: Generator, rows: list[dict], cfg, grade, first_index: int = 0, stride: int = 1,
             share: tuple[int, int] = (0, 1), extract=None, stop=None, keep: list | None = None) -> dict:
    """Sums over these held-out prompts, eval_samples completions each (the paper's mean@16 is correct /
    samples; its standard error is sqrt(variance_sum) / prompts). Seeds come from each prompt's index in the whole
    validation set (rows[j] is number first_index + j * stride), so every evaluation, on any number of ranks,
    samples alike: successive pass rates differ by the policy only. share (i, n): the ranks of a tensor-parallel
    engine generate the same groups and each grades and counts every n-th, from the i-th. extract(text) -> the
    answer a completion gives or None (the reward's parse): "answered" counts the completions that give one, so
    format failures are told from wrong answers. stop() true: generate.Stopped (a signal; nothing graded). keep: a
    list that gets (group, its rewards) per prompt (evaluate.py writes the completions)."""
    uids = set()
    for j, row in enumerate(rows):
        uid = f"eval-{first_index + j * stride}"
        gen.submit(uid, j, row["prompt_ids"], row["answer"], cfg.eval_samples)
        uids.add(uid)
    groups = gen.run_until_done(uids, "evaluate", stop) if uids else []
    if share[1] > 1:  # in the order of the prompts, the same on every rank of the engine
        groups = sorted(groups, key=lambda g: int(g.uid.split("-")[1]))[share[0]::share[1]]
    samples = [s for g in groups for s in g.samples]
    before = ungraded(grade)
    if hasattr(grade, "new_budget"):  # the step's grading budget for every --batch completions graded (all ranks)
        grade.new_budget(cfg.grade_step_budget_s * max(1.0, len(samples) * stride * share[1] / cfg.batch))
    rewards = grade([s.text for s in samples], [g.answer for g in groups for _ in g.samples]) if samples else []
    # the pass rate's sampling variance for these fixed prompts: sum over prompts of p(1-p)/n, unbiased per prompt
    n = cfg.eval_samples
    correct = [sum(r > 0 for r in rewards[j * n:(j + 1) * n]) for j in range(len(groups))]
    if keep is not None:
        keep.extend((g, rewards[j * n:(j + 1) * n]) for j, g in enumerate(groups))
    variance = sum(c * (n - c) / (n * n * (n - 1)) for c in correct) if n > 1 else float("nan")  # needs n >= 2
    return {"correct": sum(correct), "samples": len(samples), "prompts": len(groups), "variance_sum": variance,
            "ungraded": ungraded(grade) - before,
            **({"answered": sum(extract(s.text) is not None for s in samples)} if extract else {}),
            "truncated": sum(s.truncated for s in samples), "completion_tokens": sum(len(s.token_ids) for s in samples)}
