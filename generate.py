"""The generator: vLLM inside the training process, driven request by request, with forced interruptions
and in-memory weight updates. It knows nothing of schedules or losses (rollouts.py decides what to generate).

  * Forced interruptions (paper §4, A.10): each completion first thinks until </think>, EOS, or a budget
    drawn uniformly in [think_min, think_max] tokens; at the budget the phrase "Okay, time is up. ...
    </think>" is appended, and either way the answer gets at most answer_max more tokens. A completion that
    hits that final limit is "truncated". The phrase's tokens are injected, not sampled: mask 0.
  * pi_gen: the logprob vLLM returned for every sampled token, with the policy version that sampled it
    (vLLM's own weight-version spans), so ratios are right for completions spanning several versions.
  * update_weights: the trainer's tensors loaded in place while requests may still be running (PipelineRL's
    in-flight update, §3.1); their KV cache stays as it was computed.
  * engine_args: where and how the engine runs (executor, tensor parallelism, memory, sleep mode, prefix cache,
    chunked prefill), a pure function of the config, the device and the layout of ranks (devices.py).

vLLM's own thinking budget (reasoning_config) can force a phrase too, but in 0.32 its CPU path does not see a
natural </think> when the forced string is longer than </think>, so we run the answer as a second request. With
the prefix cache (always on a GPU) it reuses its prompt's and thinking's KV instead of prefilling them again.
"""
import hashlib
import logging
import os
import random
import time
from dataclasses import dataclass, field

from data import one_line
from devices import Layout, check_engine_device
from rewards import INTERRUPT_PHRASE, THINK_END, think_end_id

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the engine in this process: weights in place
# vLLM's start-up chatter is hidden, but its warnings about weights not reloaded are shown (Generator opens its
# handler to them once the engine is up): otherwise a weight that failed to reload would only show as a growing
# mismatch. Setting VLLM_LOGGING_LEVEL yourself (INFO, WARNING) shows everything at that level.
_VLLM_LEVEL_SET = "VLLM_LOGGING_LEVEL" in os.environ
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


class Progress:
    """A tqdm bar (rate, ETA) on a terminal; under nohup or a job scheduler, where stdout is a file and a bar
    would be one endless line of carriage returns, one plain line at most every interval_s seconds and one
    at the end. Only rank 0 prints; short phases (under interval_s) print nothing."""

    def __init__(self, total: int, desc: str, interval_s: float = float(os.environ.get("SCALERL_PROGRESS_S", 30))):
        import sys
        self.total, self.desc, self.interval_s, self.n = total, desc, interval_s, 0
        self.start = self.last = time.time()
        quiet = os.environ.get("RANK", "0") != "0" or os.environ.get("SCALERL_ROLE") == "generator" or total == 0
        self.bar = None
        if not quiet and sys.stdout.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="group", leave=False, mininterval=1.0)
        self.plain = not quiet and self.bar is None

    def update(self, n: int):
        if self.bar is not None:
            self.bar.update(n - self.bar.n)
        elif self.plain and time.time() - self.last >= self.interval_s:
            self._line(n)
        self.n = n

    def _line(self, n: int):
        elapsed = time.time() - self.start
        rate = n / elapsed if elapsed > 0 else 0.0
        eta = (self.total - n) / rate if rate > 0 else float("inf")
        print(f"{self.desc}: {n}/{self.total} groups, {rate:.2f} groups/s, elapsed {elapsed:.0f}s, eta {eta:.0f}s",
              flush=True)
        self.last = time.time()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.plain and time.time() - self.start >= self.interval_s:
            self._line(self.total)


@dataclass
class Sample:
    """One completion. Lists are per completion token, in order; injected phrase tokens have mask 0."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # log pi_gen(token), nats; 0.0 for injected tokens
    versions: list[int] = field(default_factory=list)  # policy version that sampled each token (-1: injected)
    mask: list[int] = field(default_factory=list)  # 1 sampled, 0 injected
    text: str = ""
    interrupted: bool = False  # hit the thinking budget, phrase appended
    truncated: bool = False  # hit the final token limit without EOS
    reward: float = 0.0
    correct: bool = False
    started: int | None = None  # version that sampled the first token, seen while the request still runs

    def first_version(self) -> int | None:
        """Version of the first sampled token; None while nothing is sampled yet (it will be >= the current)."""
        return next((v for v in self.versions if v >= 0), self.started)


@dataclass
class Group:
    """G completions of one prompt: the unit of advantages, zero-variance filtering and NPR."""
    uid: str  # unique per submission: seeds the sampling
    serial: int  # the sampler's draw number (-1 for evaluation): orders groups
    prompt_idx: int  # row of the dataset
    prompt_ids: list[int]
    answer: str
    samples: list[Sample]
    salt: int = 0  # the weight version when submitted: its requests share prefix-cache blocks with no other version

    def first_version(self) -> int | None:
        """The oldest first token among the samples, None if none has started: what the lag is measured from."""
        started = [v for v in (s.first_version() for s in self.samples) if v is not None]
        return min(started) if started else None


class Stopped(Exception):
    """run_until_done was told to stop (a signal): its groups are aborted, nothing else changed."""


def seed_of(*key) -> int:
    """A stable 63-bit seed from a key: sampling depends on what is sampled, not on engine history."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1


class Generator:
    """The in-process vLLM engine, driven request by request through llm_engine.add_request / step."""

    def __init__(self, cfg, model_path: str, tokenizer, device: str, updates_in_flight: bool,
                 layout: Layout = Layout(), gpu_memory: float = 0.0, seqs_in_flight: int = 0,
                 prefix_caching: bool | None = None):
        """cfg: sampling (seed, temperature, budgets, interruptions) and engine settings; device: this rank's
        ("cpu" or "cuda:N"); layout: the ranks and their tensor-parallel groups; gpu_memory: vLLM's share of the
        GPU (the memory plan's); seqs_in_flight: sequences the schedule keeps in this engine at once.
        updates_in_flight: weights change while requests run (PipelineRL). Requests whose lag the schedule
        tracks then report every step (vLLM's cumulative outputs); otherwise (sync, PPO-off-policy, evaluation)
        the engine reports each completion once, finished (FINAL_ONLY, as LLM.generate). The engine's arguments
        are engine_args' (a pure function, tested for GPUs on a CPU); prefix_caching overrides its choice."""
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import RequestOutputKind
        self.SamplingParams, self.OutputKind = SamplingParams, RequestOutputKind
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.phrase_ids = tokenizer(INTERRUPT_PHRASE, add_special_tokens=False)["input_ids"]
        # the thinking phase ends where the model writes </think>: one stop token where the tokenizer has it,
        # else the stop string (vLLM matches it in the detokenized text, so those requests detokenize)
        self.think_end_id = think_end_id(tokenizer)
        self.updates_in_flight = updates_in_flight
        args = engine_args(cfg, model_path, device.split(":")[0], layout, cfg.vllm_max_len(len(self.phrase_ids)),
                           updates_in_flight, gpu_memory, seqs_in_flight)
        if prefix_caching is not None:
            args["enable_prefix_caching"] = prefix_caching
        self.prefix_caching = args["enable_prefix_caching"]
        self.sleeps, self.asleep = args["enable_sleep_mode"], False  # see sleep()
        self.llm = LLM(**args)
        if not _VLLM_LEVEL_SET:  # vLLM configured its logging while starting: its handler now takes warnings, and
            for handler in logging.getLogger("vllm").handlers:  # the weight reloader's alone reach it
                handler.setLevel(logging.WARNING)
            logging.getLogger("vllm.model_executor.model_loader.reload").setLevel(logging.WARNING)
        check_engine_device(device, self.llm.collective_rpc(_worker_device)[0], layout.rank)
        if device.startswith("cuda"):  # and the rank's current device, which vLLM's worker set
            import torch
            check_engine_device(device, f"cuda:{torch.cuda.current_device()}", layout.rank)
        self.engine = self.llm.llm_engine
        self.tied_embeddings = bool(getattr(self.engine.model_config.hf_config, "tie_word_embeddings", False))
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            _ExpectedReloadWarnings(self.tied_embeddings))
        self.set_version(0)
        self._live: dict[str, tuple[Group, int, int]] = {}  # request id -> (group, sample index, phase)
        self._groups: dict[str, Group] = {}  # uid -> group still generating
        self._pending: dict[str, int] = {}  # uid -> samples not finished yet
        self.finished: list[Group] = []  # done groups not yet taken by anyone
        self._seen: dict[str, int] = {}  # request id -> tokens it had at the last step
        self.tokens_decoded = [0, 0]  # tokens sampled so far for [evaluation, training] requests
        self.cached_tokens = {0: 0, 1: 0}  # prompt tokens taken from the prefix cache, by phase (thinking, answer)
        self.min_tokens = 0  # bench.py and tests force long completions with this (each request at most its budget)

    # --- requests ---
    def submit(self, uid: str, prompt_idx: int, prompt_ids: list[int], answer: str, n: int, serial: int = -1):
        group = Group(uid, serial, prompt_idx, prompt_ids, answer, [Sample() for _ in range(n)], salt=self.version)
        self._groups[uid] = group
        self._pending[uid] = n
        for i in range(n):
            self._add(group, i, phase=0)

    def _add(self, group: Group, i: int, phase: int):
        cfg, s = self.cfg, group.samples[i]
        seed = seed_of(self.cfg.seed, group.uid, i, phase)
        watch = self.updates_in_flight and group.serial >= 0  # a training group whose lag the schedule tracks
        kind = self.OutputKind.CUMULATIVE if watch else self.OutputKind.FINAL_ONLY
        common = dict(temperature=cfg.temperature, logprobs=0, flat_logprobs=True, detokenize=False, output_kind=kind,
                      seed=seed if cfg.exact_sampling else None)  # None: the engine's one generator
        if not cfg.interruptions:  # one request with the whole budget (L_max of Eq. 9)
            max_tokens, stop = cfg.think_max_tokens + cfg.answer_max_tokens, None
        elif phase == 0:  # think until </think>, EOS, or this completion's budget
            max_tokens = random.Random(seed).randint(cfg.think_min_tokens, cfg.think_max_tokens)
            stop = [self.think_end_id]
            if self.think_end_id is None:  # several tokens: a stop string, kept in the output
                stop = None
                common.update(detokenize=True, stop=[THINK_END], include_stop_str_in_output=True)
        else:
            max_tokens, stop = cfg.answer_max_tokens, None
        # skip_clone: these params are built for this one request, so vLLM need not deep-copy them (a third of
        # add_request's time on the toy)
        params = self.SamplingParams(max_tokens=max_tokens, stop_token_ids=stop, skip_clone=True,
                                     min_tokens=min(self.min_tokens, max_tokens), **common)
        rid = f"{group.uid}/{i}/{phase}"
        # the prefix cache shares KV only among requests of one salt: the weight version at the group's
        # submission. The answer phase reuses its thinking's KV, as computed (stale across an in-flight update,
        # as PipelineRL keeps it); no request reuses KV computed before its group was submitted.
        self.engine.add_request(rid, {"prompt_token_ids": group.prompt_ids + s.token_ids,
                                      "cache_salt": f"v{group.salt}"}, params)
        self._live[rid] = (group, i, phase)

    def step(self) -> int:
        """One engine step; finished completions move to the answer phase or into their group. Returns the
        number of groups that completed. Watched requests report their tokens so far (vLLM labels versions
        only when a request finishes): the first time one has a token, this version sampled it. The others
        report once, finished; no update ran while they did, so this version sampled all their tokens."""
        done = 0
        for out in self.engine.step():
            group, i, phase = self._live[out.request_id]
            s, o = group.samples[i], out.outputs[0]
            new_tokens = len(o.token_ids) - self._seen.get(out.request_id, 0)
            self.tokens_decoded[group.serial >= 0] += new_tokens
            self._seen[out.request_id] = len(o.token_ids)
            if s.started is None and (o.token_ids or s.token_ids):
                s.started = self.version
            if not out.finished:
                continue
            del self._live[out.request_id], self._seen[out.request_id]
            self.cached_tokens[phase] += out.num_cached_tokens or 0
            versions = [-1] * len(o.token_ids)
            for span in o.weight_versions or []:
                versions[span.start:span.end] = [int(span.version)] * (span.end - span.start)
            s.token_ids += o.token_ids
            s.logprobs += list(o.logprobs.logprobs) if len(o.token_ids) else []
            s.versions += versions
            s.mask += [1] * len(o.token_ids)
            # wrote </think> itself (an EOS also finishes with "stop", with stop_reason None: not a close)
            stopped_on = o.stop_reason if o.finish_reason == "stop" else None
            closed = stopped_on is not None and stopped_on in (self.think_end_id, THINK_END)
            if self.cfg.interruptions and phase == 0 and (closed or o.finish_reason == "length"):
                if o.finish_reason == "length":  # thinking budget reached: inject the phrase
                    s.interrupted = True
                    s.token_ids += self.phrase_ids
                    s.logprobs += [0.0] * len(self.phrase_ids)
                    s.versions += [-1] * len(self.phrase_ids)
                    s.mask += [0] * len(self.phrase_ids)
                self._add(group, i, phase=1)
                continue
            s.truncated = o.finish_reason == "length"
            s.text = self.tokenizer.decode(s.token_ids, skip_special_tokens=True)
            self._pending[group.uid] -= 1
            if self._pending[group.uid] == 0:
                del self._pending[group.uid]
                self.finished.append(self._groups.pop(group.uid))
                done += 1
        return done

    def inflight(self) -> list[Group]:
        return list(self._groups.values())

    def take(self, uids: set[str] | None = None) -> list[Group]:
        """Remove and return finished groups (all, or those in uids)."""
        took = [g for g in self.finished if uids is None or g.uid in uids]
        self.finished = [g for g in self.finished if not (uids is None or g.uid in uids)]
        return took

    def abort(self, uids: set[str]):
        """Drop these groups: their requests leave the engine, their finished ones are discarded."""
        rids = [rid for rid, (g, _, _) in self._live.items() if g.uid in uids]
        self.engine.abort_request(rids)
        for rid in rids:
            del self._live[rid]
            self._seen.pop(rid, None)
        for uid in uids:
            self._groups.pop(uid, None)
            self._pending.pop(uid, None)
        self.take(uids)

    def run_until_done(self, uids: set[str], desc: str = "generate", stop=None) -> list[Group]:
        """Step until every group in uids has finished; other finished groups stay in self.finished. stop() true
        (a SIGTERM during an evaluation): those groups' requests are aborted and Stopped is raised."""
        bar = Progress(len(uids), desc)
        while (done := len(uids & {g.uid for g in self.finished})) < len(uids):
            if not self.engine.has_unfinished_requests():
                raise RuntimeError("vLLM engine has no requests left but groups are unfinished")
            if stop is not None and stop():
                self.abort(uids)
                bar.close()
                raise Stopped(desc)
            self.step()
            bar.update(done)
        bar.close()
        return self.take(uids)

    # --- weights ---
    def set_version(self, version: int):
        """Label the tokens sampled from now on (vLLM reports the label spans per completion)."""
        self.version = version
        self.engine.set_weight_version(str(version))

    def sleep(self):
        """Free the engine's GPU memory while the trainer runs (sync and PPO on GPUs, see engine_args): level 2
        discards weights and KV cache. Level 1 would copy the bf16 weights to host memory and back each step, and
        the weight sync overwrites them anyway. Nothing may be in flight. A no-op where sleep mode is off."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def update_weights(self, named_tensors, new_version: bool = True):
        """Load the trainer's weights (HF names, any dtype) into the engine, in memory, one tensor at a time (the
        engine in this process consumes the iterator: a sharded model is gathered tensor by tensor); the engine's
        own loaders cast, fuse (qkv, gate_up) and tie them. Unfinished requests keep their KV cache (PipelineRL).
        A sleeping engine is woken: weights first, then the KV cache. new_version False: the same weights again
        (after a sleep with no optimizer step). If the engine fails, the tensors it did not take are still drawn
        from the iterator (every other rank is gathering them) before the error is raised, in one line, so the
        caller can stop every rank together instead of leaving them waiting in a collective."""
        tensors = iter(named_tensors)
        try:
            if self.asleep:
                import torch
                torch.cuda.empty_cache()  # what the trainer freed, back to the device for vLLM
                self.llm.wake_up(tags=["weights"])
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors,
                                                               "is_checkpoint_format": True})
            if self.tied_embeddings:
                self.llm.apply_model(_retie_lm_head)
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False
        except Exception as e:
            for _ in tensors:  # the other ranks are gathering these
                pass
            raise RuntimeError(one_line(e, 300)) from None
        if new_version:
            self.set_version(self.version + 1)

    def close(self):
        """Shut the engine down (vLLM also destroys the torch process group it shares with the trainer)."""
        self.engine.engine_core.shutdown()


def prefix_caching(device_type: str, updates_in_flight: bool) -> bool:
    """Whether the engine keeps a prefix cache. Requests are salted with their submission's weight version
    (Generator._add), so no request reuses KV from weights older than its own start, and the cache needs no reset
    after an update. On GPU it is always on: a group's G completions share one prompt prefill, and the answer
    phase (a second request, see the module's docstring) reuses prompt and thinking instead of re-prefilling up to
    ~14k tokens. On CPU, with updates in flight, it stays off: re-prefilling the toy's ~90-token sequences costs
    little, and the toy's measured runs were made so."""
    return device_type == "cuda" or not updates_in_flight


def engine_args(cfg, model_path: str, device_type: str, layout: Layout, max_len: int, updates_in_flight: bool,
                gpu_memory: float = 0.0, seqs_in_flight: int = 0) -> dict:
    """vllm.LLM's arguments for this rank: a pure function of the config, device type ("cuda" or "cpu"), layout,
    the longest sequence (tokens) and the memory plan's share (gpu_memory), tested for every combination on a CPU.
    * Placement: under torchrun the external_launcher executor, whose worker takes torchrun's RANK and
      LOCAL_RANK (cuda:LOCAL_RANK, a compile cache per rank) and joins the trainer's process group; ranks
      engine*tp .. engine*tp + tp - 1 share one engine with tensor parallelism. vLLM's default (uniprocess)
      executor would put every rank's engine on cuda:0.
    * Memory: on GPU a share of the device (gpu_memory; --vllm_memory wins), and sleep mode where nothing is in
      flight while the trainer runs (sync, PPO); on CPU a fixed KV cache in host memory.
    * max_num_seqs: the sequences the schedule keeps in one engine (at least vLLM's default 256): no more can be
      in flight, and vLLM sizes its sampler buffers and profiling by it.
    * Chunked prefill: on GPU, with a bounded batch of 8,192 tokens. On CPU it is off: vLLM 0.32 rewinds a seeded
      request's generator after a chunked prefill, which CPU generators cannot do ("CPU Generator does not use
      offset"); the GPU sampler hashes (seed, position) and needs no rewind."""
    cuda = device_type == "cuda"
    max_seqs = max(256, seqs_in_flight)
    args = dict(
        model=model_path, tokenizer=model_path, seed=cfg.seed, dtype=cfg.dtype, max_model_len=max_len,
        tensor_parallel_size=layout.tp,
        # (a lone generator rank of a split run is a world of one on cuda:LOCAL_RANK: external_launcher too)
        distributed_executor_backend="external_launcher" if layout.world > 1 or cuda and layout.local_rank else None,
        enable_prefix_caching=prefix_caching(device_type, updates_in_flight),
        max_num_seqs=max_seqs,
        gpu_memory_utilization=cfg.vllm_memory or gpu_memory or 0.5,
        kv_cache_memory_bytes=None if cuda else cfg.vllm_kv_cache_gib << 30,
        enable_sleep_mode=cuda and not updates_in_flight,
        # fp32 LM head on the generator (paper §3.2(c)); vLLM 0.32 documents this override for RL
        hf_overrides={"head_dtype": "float32"} if cfg.fp32_head else None,
        logprobs_mode="processed_logprobs",  # pi_gen is the distribution actually sampled from (after temperature)
        enforce_eager=not cuda,  # on CPU torch.compile costs ~30 s at start-up and gains nothing here
        async_scheduling=False,  # a step's tokens must come from the weights loaded before it
        enable_chunked_prefill=cuda,
        disable_log_stats=True,
    )
    if cuda:
        args["max_num_batched_tokens"] = max(8192, max_seqs)
    return args


class _ExpectedReloadWarnings(logging.Filter):
    """vLLM warns "<layer>: Failed to load weights" at every update for layers that hold no checkpoint weights:
    rotary embeddings (computed tables) and, in a model with tied embeddings, the LM head (re-tied by
    update_weights). Those lines are dropped; any other layer that fails to reload is shown."""

    def __init__(self, tied: bool):
        super().__init__()
        self.expected = ("Rotary", "ParallelLMHead") if tied else ("Rotary",)

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not ("Failed to load weights" in message and any(e in message.split(":")[0] for e in self.expected))


def _worker_device(worker) -> str:
    """Where the engine's worker put the model (run inside the worker by collective_rpc)."""
    return str(worker.device)


def _retie_lm_head(model):
    """vLLM 0.32's reload_weights skips lm_head.weight for tied models and puts the *old* head tensor back, so
    the head silently keeps the step-0 weights (measured on the toy: logprob error 1.6 nats after one update).
    Re-point the head at the freshly loaded embedding, as vLLM's own tie_weights does at load time, and redo
    the head's post-load processing (on CPU it packs a private copy of the weight for its GEMM)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
    embeds = [m for m in model.modules() if type(m) is VocabParallelEmbedding]
    if len(heads) != 1 or len(embeds) != 1:
        raise RuntimeError(f"cannot re-tie the LM head: found {len(heads)} heads and {len(embeds)} embeddings")
    heads[0].weight = embeds[0].weight
    heads[0].quant_method.process_weights_after_loading(heads[0])

