"""ScaleRL: reinforcement learning of an LLM on verifiable rewards, top to bottom (arXiv 2510.13786).

    python train.py                                   # the toy on a laptop CPU: a tiny model, no download
    python train.py --help                            # every flag, with its default and what it does
    python train.py --mode ppo --loss dapo            # leave-one-out rows of the paper (README has the table)
    torchrun --standalone --nproc_per_node 8 train.py --model Qwen/Qwen3-0.6B --dataset gsm8k --batch 768

The loop (paper §2-4): draw prompts -> G completions each from vLLM in this process -> grade -> advantages and
zero-variance filtering -> loss over micro-batches -> AdamW -> load the new weights into vLLM -> log; evaluate
on held-out prompts every eval_every steps and checkpoint every save_every. Deliberate simplifications: no KL
term and no reference model (paper §2), no value model, no top-p/top-k sampling (they would bias pi_gen).
Set-up and bookkeeping come first; the loop is at the bottom.
"""
import datetime
import functools
import json
import os
import signal
import sys
import time

from metrics import Interrupt

interrupt = Interrupt()  # before the slow imports below (vLLM): a Ctrl-C in start-up is clean too

import config  # noqa: E402
import data  # noqa: E402
import devices  # noqa: E402
import rewards  # noqa: E402
from generate import Generator, Stopped  # noqa: E402  sets vLLM's in-process env vars before vllm loads
from rollouts import SCHEDULES, PromptSampler, Rollouts, evaluate, seqs_in_flight  # noqa: E402


cfg = config.main()  # a bad flag exits 2 here, before any model, dataset or engine is loaded
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
try:  # who generates and who trains (--generators); this rank, its device and its engine (torchrun's variables)
    roles = devices.roles_from_env(cfg.tp, cfg.generators, torch.cuda.is_available())
    layout, split = roles.layout(), roles.generators > 0
except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
if cfg.dry_run:
    print(json.dumps(config.to_dict(cfg), indent=1))
    sys.exit(0)

import stream  # noqa: E402  generator ranks and trainer ranks: the line between them first, then a world each
bridge = stream.connect(cfg, roles, interrupt) if split else None  # a generator rank serves in there until told to stop
from transformers import AutoConfig, AutoTokenizer  # noqa: E402

import checkpoint  # noqa: E402
import policy  # noqa: E402
from metrics import (Clock, Log, Timer, peak_rss_gib, release_free_memory, resident_gib, token_lags,  # noqa: E402
                     write_jsonl)
from policy import all_reduce  # noqa: E402

# -----------------------------------------------------------------------------------------------------------
# compute init: torchrun sets RANK/WORLD_SIZE; plain python is a world of one. FSDP2 runs in both, so the
# 1-process and N-process paths are the same code (and the CPU tests exercise the multi-GPU path). Each rank
# trains on its own device (cuda:LOCAL_RANK) and runs vLLM there (devices.py), or, split, only trains.
t_start = time.time()
rank, world = layout.rank, layout.world
device = torch.device(layout.device(torch.cuda.is_available()))
if device.type == "cuda":
    torch.cuda.set_device(device)
# ranks wait in collectives while rank 0 alone hashes and verifies a checkpoint (minutes for a large model):
# a timeout of an hour rather than NCCL's default ten minutes
store = dist.PrefixStore("trainers/", bridge.store) if split else None if "RANK" in os.environ else dist.HashStore()
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=1),
                        **({"store": store, "rank": rank, "world_size": world} if store else {}))
master = rank == 0
compute_dtype = getattr(torch, cfg.dtype)  # resolved by config.py ("auto" is never left)


def print0(*args):
    if master:
        print(*args, flush=True)


def fail(msg: str, status: int = 2):
    """One line on stderr, no traceback, non-zero exit: for problems found before anything has run."""
    if master:
        print(f"error: {msg}", file=sys.stderr, flush=True)
        checkpoint.drop_unstarted_runs()
    sys.stdout.flush()  # then no teardown: gloo's and vLLM's threads can abort it ("terminate called", SIGABRT)
    os._exit(status)


def on_rank0(work):
    """work() on rank 0 only (folders, caches, conversions); every rank gets its result, or exits with its
    one-line error (the other ranks must not wait forever on a rank that failed)."""
    out = [None, None]
    if master:
        try:
            out[0] = work()
        except (ValueError, OSError) as e:  # problems the user can fix, worded for them
            out[1] = str(e)
        except Exception as e:
            out[1] = data.one_line(e, 300)
    dist.broadcast_object_list(out)
    if out[1]:
        fail(out[1])
    return out[0]


if cfg.prompts_per_step % world:
    fail(f"--batch {cfg.batch} / --group {cfg.group} = {cfg.prompts_per_step} prompts per step must be divisible by "
         f"the {world} ranks")
names = [cfg.run_name or f"{cfg.mode}-{cfg.loss}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"]
dist.broadcast_object_list(names)  # every rank uses rank 0's timestamp
run_name = names[0]
run_dir = os.path.join(cfg.out_dir, run_name)
log_path = os.path.join(cfg.log_dir, f"{run_name}.jsonl")
on_rank0(lambda: checkpoint.claim_run(run_dir, log_path, cfg.resume))  # writable, new or resumable, one writer
# a resumed run keeps its training settings; what it may change (how long, what it records) goes in its log
flags_now = config.to_dict(cfg)
resume_changes = on_rank0(lambda: checkpoint.resume_changes(run_dir, log_path, flags_now)) if cfg.resume else {}
if world > 1:  # rank 0 alone writes out_dir (toy, GGUF conversion, checkpoints); every rank must read it
    token, unseen = on_rank0(lambda: checkpoint.write_token(os.path.join(run_dir, "shared"))), [None] * world
    try:
        devices.check_shared_dir(os.path.join(run_dir, "shared"), token, rank, os.uname().nodename)
    except RuntimeError as e:
        unseen[rank] = str(e)
    dist.all_gather_object(unseen, unseen[rank])  # every rank stops if any cannot see it
    if master:
        os.remove(os.path.join(run_dir, "shared"))
    if any(unseen):
        fail(next(e for e in unseen if e))
try:  # the dataset before any model: a bad one is reported at once, not after the toy's warm start
    task_rows = data.read_task(cfg, log=print0)
except data.DataError as e:
    fail(str(e))
torch.manual_seed(cfg.seed + rank)

# -----------------------------------------------------------------------------------------------------------
# model and data: the toy is built once and a GGUF file converted once (rank 0), both cached in out_dir; other
# models come from the Hub or a path
model_path = on_rank0(lambda: policy.resolve_model(cfg.model, cfg.out_dir, log=print0))
try:
    model_config = AutoConfig.from_pretrained(model_path)
    context = model_config.max_position_embeddings
    tokenizer = AutoTokenizer.from_pretrained(model_path)
except (OSError, ValueError) as e:  # not on disk and no network, or not a causal LM folder
    fail(f"--model {cfg.model}: cannot load its config and tokenizer ({data.one_line(e)})")
try:
    train_rows, eval_rows, grade = data.load_task(cfg, tokenizer, task_rows, log=print0)
except data.DataError as e:
    fail(str(e))
# the answer a completion gives in the reward's form, or None: evaluations count format failures apart
reward = rewards.REWARDS[cfg.reward]
extract_answer = reward.extract and functools.partial(reward.extract, thinking=rewards.prompt_opens_thinking(tokenizer))
phrase_tokens = len(tokenizer(rewards.INTERRUPT_PHRASE, add_special_tokens=False)["input_ids"])
if cfg.vllm_max_len(phrase_tokens) > context:
    fail(f"prompt {cfg.prompt_max_tokens} + thinking {cfg.think_max_tokens} + phrase {phrase_tokens} + answer "
         f"{cfg.answer_max_tokens} tokens exceed the model's context of {context}")
if cfg.eval_every != -1 and cfg.eval_prompts > len(eval_rows) and "eval_prompts" in cfg.typed:
    fail(f"--eval_prompts {cfg.eval_prompts} is more than the {len(eval_rows)} validation prompts")
eval_rows = eval_rows[:cfg.eval_prompts][slice(None) if split else slice(layout.engine, None, layout.engines)]
sampler = PromptSampler(train_rows, cfg.seed, cfg.npr, cfg.npr_threshold, cfg.prompts_per_step)  # same on all ranks

# the trainer (policy.py): FSDP2, fp32 master weights, the body in compute_dtype and the LM head in fp32
resume_from = checkpoint.find_latest(run_dir, log=print0) if cfg.resume else None
if cfg.resume and resume_from is None:
    fail(f"--resume: no complete checkpoint in {run_dir}")
mesh = None  # FSDP2 over all ranks; across nodes HSDP: replicate over nodes, shard within each (devices.py)
if layout.nodes > 1:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, layout.mesh_shape(), mesh_dim_names=("replicate", "shard"))
model = policy.build(resume_from or model_path, device, compute_dtype, cfg.fp32_head, mesh,
                     cfg.activation_checkpointing == "on", cfg.logprob_chunk_tokens)
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


state = {"step": 0, "version": 0, "gpu_hours": 0.0, "samples": 0, "tokens": 0, "bad_steps": 0}  # checkpointed
if resume_from:
    try:
        state.update(checkpoint.load_state(resume_from, model, optimizer, sampler, rank))
    except RuntimeError as e:
        fail(str(e))
    print0(f"resumed {run_name} from {resume_from} at step {state['step']}")
# the generator (generate.py) loads the same weights; the schedule says whether updates land mid-request and
# how many sequences an engine holds; on a GPU the memory plan (devices.py) splits the device with the trainer
in_flight = SCHEDULES[cfg.mode].updates_in_flight
engine_seqs = seqs_in_flight(cfg, roles.generators // cfg.tp if split else layout.engines)
plan = None
if device.type == "cuda" and not split:  # FSDP2's DTensors count whole parameters
    shape = devices.ModelShape.of(model_config, sum(p.numel() for p in model.parameters()))
    budget = devices.Budget(cfg.vllm_max_len(phrase_tokens), cfg.micro_batch_tokens, cfg.logprob_chunk_tokens,
                            cfg.activation_checkpointing == "on", engine_seqs, sleeps=not in_flight)
    plan = devices.plan_memory(shape, budget, torch.cuda.get_device_properties(device).total_memory, world,
                               layout.local_world if layout.nodes > 1 else world, cfg.tp, cfg.vllm_memory)
    print0(plan.lines())
    if plan.problem:
        fail(plan.problem)
print0(f"placement: {world} trainer rank(s) on {layout.nodes} node(s), {roles.generators} generator rank(s) "
       f"(stream.py)" if split else f"placement: {world} rank(s) on {layout.nodes} node(s); trainer on {device} per "
       f"rank; {layout.engines} vLLM engine(s) of {cfg.tp} rank(s), {engine_seqs} sequences in flight each")
engine_error = None
if split:  # the generator ranks build their engines from these weights; every trainer waits for them
    gen = stream.Remote(cfg, roles, bridge, sampler, model, interrupt)
    engine_error = gen.start(resume_from or model_path, state["version"], engine_seqs, 0.9 * (device.type == "cuda"))
else:
    try:
        gen = Generator(cfg, resume_from or model_path, tokenizer, str(device), in_flight, layout,
                        plan.vllm_fraction if plan else 0.0, engine_seqs)
    except Exception as e:  # too little memory for the KV cache, an unsupported model...: one line, status 4
        engine_error = f"the vLLM engine failed to start on rank {rank}: {data.one_line(e, 300)}"
engine_errors = [None] * world
dist.all_gather_object(engine_errors, engine_error)  # every rank learns of a failure on any rank
if any(engine_errors):
    fail(next(e for e in engine_errors if e), 4)


# -----------------------------------------------------------------------------------------------------------
# bookkeeping (metrics.py has the log, the device-hour clock and the phase timers): failures, evaluation, the
# step's record, rollout dumps, checkpoints
def guarded(work, what: str, step: int):
    """Run a phase that drives vLLM (or the grader); if it fails (out of memory, a kernel error, a dead grading
    worker) stop with one line and exit status 4, the log and the checkpoints intact."""
    try:
        return work()
    except Stopped:  # a signal during an evaluation: not a failure
        raise
    except Exception as e:
        msg = f"{what} failed at step {step}: {type(e).__name__}: {str(e)[:300]}"
        print(f"error (rank {rank}): {msg}. The log {log_path} and the checkpoints in {run_dir} are intact.",
              file=sys.stderr, flush=True)
        log({"kind": "error", "step": step, "message": msg})
        sys.exit(4)


def sync_weights(new_version: bool = True):
    """The trainer's weights into this rank's engine, cast to its dtype before the gather. A failure on any rank
    stops every rank with one line, exit status 4 (the failing rank still gathers the rest: none waits forever)."""
    error = None
    try:
        gen.update_weights(policy.full_weights(model, compute_dtype), new_version)
    except RuntimeError as e:
        error = str(e)
    if all_reduce({"failed": error is not None}, op=dist.ReduceOp.MAX)["failed"]:
        errors = [None] * world
        dist.all_gather_object(errors, error)
        r = next(i for i, e in enumerate(errors) if e)
        log({"kind": "error", "step": state["step"] + 1, "message": f"weight sync failed on rank {r}: {errors[r]}"})
        fail(f"the weight sync failed at step {state['step'] + 1} on rank {r}: {errors[r]}. The log {log_path} and the "
             f"checkpoints in {run_dir} are intact.", 4)


def run_evaluation(step: int) -> bool:
    """Mean pass rate on the held-out prompts (paper §2.1), logged as an "eval" record. In pipeline mode training
    completions keep decoding meanwhile: that share of the time (by tokens decoded) is credited as training.
    False if a signal stopped it (colocated; nothing logged): a scheduler's grace period is shorter than one."""
    t0, decoded0 = time.time(), list(gen.tokens_decoded)
    with clock.paused():
        try:
            ev = guarded(lambda: (gen.evaluate if split else functools.partial(evaluate, gen))(
                eval_rows, cfg, grade, first_index=layout.engine, stride=layout.engines, extract=extract_answer,
                share=(layout.tp_rank, layout.tp), stop=lambda: interrupt.requested), "evaluation", step)
        except Stopped:
            ev = None
    if all_reduce({"stop": ev is None}, op=dist.ReduceOp.MAX)["stop"]:
        return False
    eval_tokens, train_tokens = (now - before for now, before in zip(gen.tokens_decoded, decoded0))
    clock.credit((time.time() - t0) * train_tokens / max(eval_tokens + train_tokens, 1))
    ev = all_reduce(ev)
    n = ev["samples"]
    log({"kind": "eval", "step": step, "gpu_hours": clock.hours, "samples": state["samples"], "tokens": state["tokens"],
         "pass_rate": ev["correct"] / n, "pass_rate_se": ev["variance_sum"] ** 0.5 / ev["prompts"],
         "eval_truncation_rate": ev["truncated"] / n, "eval_ungraded": int(ev["ungraded"]),
         "eval_answered_rate": ev["answered"] / n if "answered" in ev else None,  # an answer in the reward's form
         "eval_completion_tokens": ev["completion_tokens"] / n, "eval_samples": int(n), "t_eval": time.time() - t0})
    print0(f"eval step {step}: pass rate {ev['correct'] / n:.3f} on {int(n)} samples ({time.time() - t0:.1f}s)")
    return True


def stop_on_signal(status: int):
    """A checkpoint of the current step, one line, exit 128 + the signal (Interrupt)."""
    with clock.paused():
        save_checkpoint()
    how = "Ctrl-C" if status == 128 + signal.SIGINT else signal.Signals(status - 128).name
    print0(f"stopped by {how} at step {state['step']}; continue with --resume --run_name {run_name}")
    sys.exit(status)


def step_record(groups: list, stats: policy.StepStats, trained_version: int, timer: Timer) -> dict:
    """The "train" record of a step: every metric summed (or maxed) over ranks first."""
    samples = [s for g in groups for s in g.samples]
    lags = [trained_version - g.first_version() for g in groups]  # policy versions between sampling and training
    sums = stats.sums
    n = all_reduce({"samples": len(samples), "reward": sum(s.reward for s in samples),
                    "correct": sum(s.correct for s in samples), "truncated": sum(s.truncated for s in samples),
                    "interrupted": sum(s.interrupted for s in samples),
                    "completion_tokens": sum(len(s.token_ids) for s in samples), "lag": sum(lags),
                    "groups": len(groups), "zero_var": int(stats.zero_var.sum()), "ungraded": rollouts.ungraded,
                    **{f"lag_tokens_{i}": c for i, c in enumerate(token_lags(stats.kept, trained_version, cfg.k))},
                    **{k: v for k, v in sums.items() if k not in ("loss", "is_ratio_max")}})
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else peak_rss_gib()
    most = all_reduce({"is_ratio_max": sums["is_ratio_max"], "lag_max": max(lags), "peak_mem_gib": peak_gib,
                       "rss_gib": resident_gib()}, op=dist.ReduceOp.MAX)
    trained = [None] * world  # the prompts trained on this step, every rank's, in draw order
    dist.all_gather_object(trained, [(g.serial, g.prompt_idx) for g in groups])
    tokens = max(n["tokens"], 1.0)
    lag_counts = [n[f"lag_tokens_{i}"] for i in range(cfg.k)]  # trained tokens by lag, all ranks
    return {
        "kind": "train", "step": state["step"], "gpu_hours": state["gpu_hours"], "samples": state["samples"],
        "tokens": state["tokens"], "reward_mean": n["reward"] / n["samples"],
        "pass_rate_train": n["correct"] / n["samples"], "loss": stats.totals["loss"], "lr": stats.lr,
        "grad_norm": stats.grad_norm, "skipped": not stats.finite, "updated": stats.updated,
        "truncation_rate": n["truncated"] / n["samples"], "interruption_rate": n["interrupted"] / n["samples"],
        "completion_tokens_mean": n["completion_tokens"] / n["samples"], "zero_var_frac": n["zero_var"] / n["groups"],
        "is_ratio_mean": n["is_ratio_sum"] / tokens, "is_ratio_max": most["is_ratio_max"],
        "clip_frac": n["clipped_tokens"] / tokens, "mismatch": n["mismatch_sum"] / tokens,
        "entropy": n["entropy_sum"] / tokens, "lag_mean": n["lag"] / n["groups"], "lag_max": most["lag_max"],
        "lag_hist": [c / max(sum(lag_counts), 1) for c in lag_counts],
        "retired_prompts": len(sampler.retired),  # the sampler is the same on every rank
        "padding_frac": stats.padding, "padding_frac_unpacked": stats.padding_unpacked,
        "t_generate": timer["generate"] - rollouts.t_grade, "t_grade": rollouts.t_grade,
        "ungraded": int(n["ungraded"]), "t_train": stats.t_train, "t_optim": stats.t_optim, "t_sync": timer["sync"],
        "peak_mem_gib": most["peak_mem_gib"], "rss_gib": most["rss_gib"], "t_step": time.time() - timer.start,
        "prompts": [p for _, p in sorted(sp for ranked in trained for sp in ranked)],
        "train_busy": (stats.t_train + stats.t_optim) / (time.time() - timer.start), **(gen.stats() if split else {}),
    }


def dump_rollouts(groups, trained_version: int):
    """What the policy wrote, for people to read: prompts, completions, rewards and each token's lag."""
    rows = [{"step": state["step"], "prompt": tokenizer.decode(g.prompt_ids), "answer": g.answer, "completion": s.text,
             "reward": s.reward, "interrupted": s.interrupted, "truncated": s.truncated,
             "token_lag": [trained_version - v if v >= 0 else None for v in s.versions]}
            for g in groups for s in g.samples]
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if master:
        write_jsonl(os.path.join(run_dir, "rollouts", f"step_{state['step']:06d}.jsonl"), sum(gathered, []))


def save_checkpoint():
    """Atomic (a temporary folder renamed into place); the prompts drawn but not yet trained on come first
    after a resume."""
    t0 = time.time()
    pending = [None] * world
    dist.all_gather_object(pending, rollouts.pending())
    sampler_state = sampler.state_dict([p for _, p in sorted({sp for ranked in pending for sp in ranked})])
    try:
        checkpoint.save(run_dir, state, model, optimizer, sampler_state, tokenizer, run_name, cfg.keep_checkpoints,
                        run_config=config.to_dict(cfg))
    except RuntimeError as e:  # rank 0 could not write it (a full disk): every rank stops, nothing else is lost
        log({"kind": "error", "step": state["step"], "message": str(e)})
        fail(str(e), 4)
    print0(f"checkpoint step {state['step']} ({time.time() - t0:.1f}s)")


new_log = master and (not cfg.resume or checkpoint.log_config(log_path) is None)  # a resume into another --log_dir
log = Log(log_path, master, {"name": run_name, "config": config.to_dict(cfg)} if cfg.wandb else None)
if cfg.resume:
    # max_steps may be raised on resume (a run continued past its first end): the log says where it now ends
    log({"kind": "resume", "step": state["step"], "time": time.time(), "max_steps": cfg.max_steps,
         "changed": resume_changes})
if new_log:
    log({"kind": "config", **config.to_dict(cfg), "run_name": run_name, "world_size": roles.job.world,
         "generator_ranks": roles.generators, "device": device.type,  # (resolved --generators)
         "model_path": model_path,  # and the weights' hash, read on rank 0 only (the rank that writes the log)
         "model_sha256": policy.weights_sha256(model_path) if master else None})
preset = config.toy_preset(cfg)
print0(f"run {run_name}: log {log_path}, {world} x {device.type}, {cfg.prompts_per_step} prompts x {cfg.group} = "
       f"{cfg.batch} completions per step, {cfg.mode} k={cfg.k}, loss {cfg.loss}, "
       f"start-up {time.time() - t_start:.0f}s")
if preset:
    print0("toy preset (flags you type win): " + " ".join(f"--{k} {v}" for k, v in preset.items()))
if device.type == "cpu" and cfg.dtype == "bfloat16" and devices.bf16_is_emulated():
    print0("warning: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag), so bf16 matmuls are emulated and "
           "a toy step takes ~4x longer than in float32")
clock = Clock(state["gpu_hours"], roles.job.world)  # every device, idle or not (the paper's GPU-hours)
if resume_from:  # and once more through update_weights, as the running engine got them: on CPUs with AMX, vLLM's
    sync_weights(new_version=False)  # bf16 numerics differ between a fresh load and a reload
gen.set_version(state["version"])
rollouts = gen if split else Rollouts(gen, sampler, grade, cfg, layout)  # the stream, or this rank's engine

# -----------------------------------------------------------------------------------------------------------
# the loop
interrupt.in_loop = True
eval_steps = cfg.eval_steps()
while True:
    step = state["step"]
    # --- evaluate: mean pass rate on held-out prompts (paper §2.1), at step 0, then eval_every (log-spaced with
    # eval_growth) and at the end
    if step in eval_steps and not run_evaluation(step):
        stop_on_signal(int(all_reduce({"stop": interrupt.requested}, op=dist.ReduceOp.MAX)["stop"]))
    if step >= cfg.max_steps:
        break
    timer = Timer()

    # --- draw prompts, generate G completions each, grade them (rollouts.py: the schedule of §3.1, NPR §3.2(d))
    with timer("generate"):
        groups = guarded(rollouts.next_batch, "generation", step + 1)
    if groups is None:  # NPR retired all but < a step's prompts (§3.2(d)): little left to learn from
        print0(f"stopping at step {step}: {rollouts.solved}")
        log({"kind": "stop", "step": step, "reason": rollouts.solved})
        if eval_steps and step not in eval_steps:  # empty with --eval_every -1
            run_evaluation(step)
        with clock.paused():
            save_checkpoint()
        break
    trained_version = gen.version  # the weights this step's gradient is computed with
    gen.sleep()  # sync and PPO on GPU: the engine frees its memory for the trainer (nothing is in flight)

    # --- one optimizer step (policy.train_step): advantages with batch-level normalization (§3.2(b)), zero-variance
    # filtering (§3.2(e)), the loss over micro-batches (§3.2(a), Eq. 4), AdamW after a linear warm-up (A.3); a
    # non-finite loss or gradient skips the step, weights and optimizer state untouched
    stats = policy.train_step(model, optimizer, groups, cfg, step, pad_id)
    state["bad_steps"] = 0 if stats.updated else state["bad_steps"] + (not stats.finite)

    # --- weight sync: the new weights into this rank's vLLM, while requests may be decoding (PipelineRL, §3.1)
    with timer("sync"):
        if stats.updated or gen.asleep:  # a sleeping engine discarded its weights: it gets them back either way
            sync_weights(new_version=stats.updated)
    state["version"] = gen.version

    # --- log
    state["step"] += 1
    state["samples"] += cfg.batch
    state["tokens"] += int(stats.totals["tokens"])
    state["gpu_hours"] = clock.tick()
    record = step_record(groups, stats, trained_version, timer)
    log(record)
    release_free_memory(state["step"])
    print0(f"step {state['step']}/{cfg.max_steps} | reward {record['reward_mean']:+.3f} | "
           f"pass {record['pass_rate_train']:.3f}"
           f" | loss {record['loss']:+.4f} | lag {record['lag_mean']:.2f}/{record['lag_max']:.0f} | mismatch "
           f"{record['mismatch']:.1e} | {record['completion_tokens_mean'] * cfg.batch / record['t_step']:.0f} tok/s | "
           f"{record['t_step']:.2f}s (gen {record['t_generate']:.2f} train {record['t_train'] + record['t_optim']:.2f} "
           f"sync {record['t_sync']:.3f})" + (f" | busy: generators {record['gen_busy']:.2f}, trainers "
                                                f"{record['train_busy']:.2f}" if split else ""))
    if state["bad_steps"] >= cfg.max_bad_steps:
        print0(f"error: {state['bad_steps']} consecutive steps with a non-finite loss or gradient; stopping. The last "
               f"checkpoint in {run_dir} is intact.")
        log({"kind": "error", "step": state["step"], "message": "too many non-finite steps"})
        sys.exit(3)

    # --- rollout dumps and checkpoints: not training compute, so the clock is paused
    if cfg.dump_every != -1 and state["step"] % cfg.dump_every == 0:
        with clock.paused():
            dump_rollouts(groups, trained_version)
    stopping = int(all_reduce({"stop": interrupt.requested}, op=dist.ReduceOp.MAX)["stop"])  # a signal on any rank
    if stopping:
        stop_on_signal(stopping)
    if cfg.save_every != -1 and state["step"] % cfg.save_every == 0:
        with clock.paused():
            save_checkpoint()

print0(f"done: {state['step']} steps, {clock.hours:.4f} device-hours, log {log_path}")
log.close()
if hasattr(grade, "close"):
    grade.close()  # the math-verify workers
gen.close()  # vLLM's shutdown tears down the process group; split: the generators stop, and this process ends
