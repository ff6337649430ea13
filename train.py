"""ScaleRL: reinforcement learning of an LLM on verifiable rewards, top to bottom (arXiv 2510.13786).

    python train.py                                   # the toy on a laptop CPU: builds a tiny model, no download
    python train.py --mode ppo --loss dapo            # leave-one-out rows of the paper (README has the table)
    torchrun --standalone --nproc_per_node 8 train.py --model Qwen/Qwen3-0.6B --dataset gsm8k --batch 768

The loop (paper §2-4): draw prompts -> G completions each from vLLM in this process -> grade -> advantages
-> loss -> AdamW step -> load the new weights into vLLM -> log; evaluate on held-out prompts every
eval_every steps. Deliberate simplifications: no KL term and no reference model (paper §2), no value model,
no top-p/top-k sampling (they would bias pi_gen).
"""
import json
import math
import os
import resource
import sys
import time

import config
import data
import losses
from generate import Generator, Rollouts, evaluate  # sets vLLM's in-process env vars before vllm loads

cfg = config.main()  # a bad flag exits 2 here, before anything heavy is imported
if cfg.dry_run:
    print(json.dumps(config.to_dict(cfg), indent=1))
    sys.exit(0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoConfig, AutoTokenizer  # noqa: E402

import checkpoint  # noqa: E402
import policy  # noqa: E402

# -----------------------------------------------------------------------------------------------------------
# compute init: torchrun sets RANK/WORLD_SIZE; plain python is a world of one. FSDP2 runs in both, so the
# 1-process and N-process paths are the same code (and the CPU tests exercise the multi-GPU path).
t_start = time.time()
distributed = "RANK" in os.environ
rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if distributed else (0, 1)
device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
backend = "nccl" if device.type == "cuda" else "gloo"
dist.init_process_group(backend, **({} if distributed else {"store": dist.HashStore(), "rank": 0, "world_size": 1}))
master = rank == 0
compute_dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
                 "float32": torch.float32}[cfg.dtype]
cfg.dtype = str(compute_dtype).removeprefix("torch.")


def print0(*args):
    if master:
        print(*args, flush=True)


def fail(msg: str, status: int = 2):
    """One line on stderr, no traceback, non-zero exit: for problems found before anything has run."""
    if master:
        print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(status)


if cfg.wandb:
    import importlib.util
    if importlib.util.find_spec("wandb") is None:
        fail("--wandb: the wandb package is not installed (pip install wandb)")
if cfg.prompts_per_step % world:
    fail(f"--batch {cfg.batch} / --group {cfg.group} = {cfg.prompts_per_step} prompts per step must be divisible by "
         f"the {world} ranks")
run_name = cfg.run_name or f"{cfg.mode}-{cfg.loss}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
names = [run_name]
dist.broadcast_object_list(names)  # every rank uses rank 0's timestamp
cfg.run_name = run_name = names[0]
run_dir = os.path.join(cfg.out_dir, run_name)
log_path = os.path.join(cfg.log_dir, f"{run_name}.jsonl")
if cfg.resume and not os.path.isdir(run_dir):
    fail(f"--resume: no run folder {run_dir}")
torch.manual_seed(cfg.seed + rank)

# -----------------------------------------------------------------------------------------------------------
# model and data: the toy is built once (rank 0) and cached in out_dir; real models come from the Hub
if cfg.model == "toy":
    if master:
        data.build_toy_model(cfg.out_dir, log=print0)
    dist.barrier()
    model_path = data.toy_model_path(cfg.out_dir)
else:
    model_path = cfg.model
try:
    context = AutoConfig.from_pretrained(model_path).max_position_embeddings
    tokenizer = AutoTokenizer.from_pretrained(model_path)
except (OSError, ValueError) as e:  # not on disk and no network, or not a causal LM folder
    fail(f"--model {cfg.model}: cannot load its config and tokenizer ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
try:
    train_rows, eval_rows, grade = data.load_task(cfg, tokenizer)
except data.DataError as e:
    fail(str(e))
if cfg.interruptions and not cfg.length_penalty and len(tokenizer(data.THINK_END, add_special_tokens=False)["input_ids"]) != 1:
    fail(f"forced interruptions need a single {data.THINK_END} token, which {model_path}'s tokenizer lacks: pass "
         "--no_interruptions (or --length_penalty)")
phrase_tokens = len(tokenizer(data.INTERRUPT_PHRASE, add_special_tokens=False)["input_ids"])
if cfg.vllm_max_len(phrase_tokens) > context:
    fail(f"prompt {cfg.prompt_max_tokens} + thinking {cfg.think_max_tokens} + phrase {phrase_tokens} + answer "
         f"{cfg.answer_max_tokens} tokens exceed the model's context of {context}")
if cfg.eval_every != -1 and cfg.eval_prompts > len(eval_rows):
    if "eval_prompts" in cfg.typed:
        fail(f"--eval_prompts {cfg.eval_prompts} is more than the {len(eval_rows)} validation prompts")
    cfg.eval_prompts = len(eval_rows)  # the default asks for "up to 1,000"
eval_rows = eval_rows[:cfg.eval_prompts][rank::world]  # each rank grades its share
sampler = data.PromptSampler(train_rows, cfg.seed, cfg.npr, cfg.npr_threshold)  # identical on every rank

# the trainer (policy.py): FSDP2, fp32 master weights, the body in compute_dtype and the LM head in fp32
resume_from = checkpoint.find_latest(run_dir, log=print0) if cfg.resume else None
if cfg.resume and resume_from is None:
    fail(f"--resume: no complete checkpoint in {run_dir}")
model = policy.build(resume_from or model_path, device, compute_dtype, cfg.fp32_head)
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


def lr_at(step: int) -> float:
    return cfg.lr * min(1.0, (step + 1) / max(cfg.warmup_steps, 1))  # linear warm-up, then constant (paper A.3)


state = {"step": 0, "version": 0, "gpu_hours": 0.0, "samples": 0, "tokens": 0, "bad_steps": 0}  # checkpointed
if resume_from:
    try:
        state.update(checkpoint.load_state(resume_from, model, optimizer, sampler, rank))
    except RuntimeError as e:
        fail(str(e))
    print0(f"resumed {run_name} from {resume_from} at step {state['step']}")
gen = Generator(cfg, resume_from or model_path, tokenizer, device.type)  # vLLM loads the same weights
gen.set_version(state["version"])
rollouts = Rollouts(gen, sampler, grade, cfg, rank, world)

if master:
    os.makedirs(cfg.log_dir, exist_ok=True)
    log_file = open(log_path, "a")


wandb_run = None
if cfg.wandb and master:  # optional mirror; the jsonl log stays the source of truth
    import wandb
    wandb_run = wandb.init(project="scalerl", name=run_name, id=run_name, resume="allow", config=config.to_dict(cfg))


def log(record: dict):
    """Append one JSON line and flush it: a crash loses at most the line being written. NaN and infinity are
    written as null (they are not JSON)."""
    if master:
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        log_file.write(json.dumps(clean) + "\n")
        log_file.flush()
        if wandb_run is not None and "step" in record:
            wandb_run.log({f"{record['kind']}/{k}": v for k, v in clean.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"},
                          step=record["step"])


def all_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


if cfg.resume:
    log({"kind": "resume", "step": state["step"], "time": time.time()})
else:
    log({"kind": "config", **config.to_dict(cfg), "world_size": world, "device": device.type, "model_path": model_path})
print0(f"run {run_name}: log {log_path}, {world} x {device.type}, {cfg.prompts_per_step} prompts x {cfg.group} = "
       f"{cfg.batch} completions per step, {cfg.mode} k={cfg.k}, loss {cfg.loss}, start-up {time.time() - t_start:.0f}s")


def guarded(work, what: str, step: int):
    """Run a phase that drives vLLM (or the grader); if it fails (out of memory, a kernel error, a dead grading
    worker) stop with one line and exit status 4, the log and the checkpoints intact."""
    try:
        return work()
    except Exception as e:
        msg = f"{what} failed at step {step}: {type(e).__name__}: {str(e)[:300]}"
        print(f"error (rank {rank}): {msg}. The log {log_path} and the checkpoints in {run_dir} are intact.",
              file=sys.stderr, flush=True)
        log({"kind": "error", "step": step, "message": msg})
        sys.exit(4)


loss_eps = {k: getattr(cfg, k) for k in ("eps_max", "eps_low", "eps_high", "eps_clip", "gspo_eps_low", "gspo_eps_high")}
pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
dummy = [([pad_id], [pad_id])]  # a rank with fewer micro-batches runs this, to keep FSDP's collectives in step
t_train_clock = time.time()  # gpu_hours counts training wall time; evaluation and checkpoint writing are excluded
# test hooks: plant non-finite gradients at these steps (SCALERL_TEST_NAN_STEPS=2,3), and save the first step's
# loss and full gradient to a file (SCALERL_TEST_GRAD_FILE=path) to compare runs on different numbers of ranks
inject_nan_steps = {int(x) for x in os.environ.get("SCALERL_TEST_NAN_STEPS", "").split(",") if x.strip()}
grad_file = os.environ.get("SCALERL_TEST_GRAD_FILE")
engine_fail_step = int(os.environ.get("SCALERL_TEST_ENGINE_FAIL_STEP", "0"))  # and make vLLM's step raise here

# -----------------------------------------------------------------------------------------------------------
while True:
    step = state["step"]
    # --- evaluate: mean pass rate on held-out prompts (paper §2.1), at step 0 and every eval_every steps
    if cfg.eval_every != -1 and (step % cfg.eval_every == 0 or step == cfg.max_steps):
        t0, decoded0 = time.time(), list(gen.tokens_decoded)
        ev = guarded(lambda: evaluate(gen, eval_rows, cfg, grade, first_index=rank, stride=world), "evaluation", step)
        # in pipeline mode training completions keep decoding during evaluation: that share of the time is training
        eval_tokens, train_tokens = (now - before for now, before in zip(gen.tokens_decoded, decoded0))
        state["gpu_hours"] += (time.time() - t0) * train_tokens / max(eval_tokens + train_tokens, 1) * world / 3600
        correct, n_eval, trunc, ntok = all_sum(ev["correct"], ev["samples"], ev["truncated"], ev["completion_tokens"])
        log({"kind": "eval", "step": step, "gpu_hours": state["gpu_hours"], "samples": state["samples"],
             "tokens": state["tokens"], "pass_rate": correct / n_eval, "eval_truncation_rate": trunc / n_eval,
             "eval_completion_tokens": ntok / n_eval, "eval_samples": int(n_eval), "t_eval": time.time() - t0})
        print0(f"eval step {step}: pass rate {correct / n_eval:.3f} on {int(n_eval)} samples ({time.time() - t0:.1f}s)")
        t_train_clock = time.time()
    if step >= cfg.max_steps:
        break
    t_step = time.time()

    # --- rollout: one batch of finished, graded groups (PipelineRL-k / PPO-off-policy-k / sync, generate.py)
    t0, t_grade0 = time.time(), rollouts.t_grade
    if step + 1 == engine_fail_step:
        gen.engine.step = lambda: (_ for _ in ()).throw(RuntimeError("injected engine failure (test)"))
    groups = guarded(rollouts.next_batch, "generation", step + 1)
    t_grade = rollouts.t_grade - t_grade0
    t_generate = time.time() - t0 - t_grade
    samples = [s for g in groups for s in g.samples]
    trained_version = gen.version  # the weights this step's gradient is computed with
    lags = [trained_version - g.first_version() for g in groups]  # policy versions between sampling and training

    # --- advantages, zero-variance filtering (paper §3.2(e)): drop groups whose G rewards are all equal
    rewards = torch.tensor([[s.reward for s in g.samples] for g in groups], dtype=torch.float64)  # (P, G)
    zero_var_groups = losses.zero_variance(rewards)  # (P,) bool
    keep = ~zero_var_groups if cfg.zero_var_filter else torch.ones(len(groups), dtype=torch.bool)
    kept = [g for g, k in zip(groups, keep.tolist()) if k]
    centered = rewards[keep] - rewards[keep].mean(dim=1, keepdim=True)
    n_prompts, n_completions, n_tokens, sq_sum = all_sum(
        len(kept), len(kept) * cfg.group, sum(sum(s.mask) for g in kept for s in g.samples), float((centered ** 2).sum()))
    adv = losses.advantages(rewards[keep], cfg.adv_norm, sq_sum, int(n_completions))  # (P_kept, G)

    # --- loss: per-token weights from the whole step's batch, then length-bucketed micro-batches (paper §3.3)
    t0 = time.time()
    items = [(g.prompt_ids, s, a_i) for g, a in zip(kept, adv.tolist()) for s, a_i in zip(g.samples, a)]
    weights = losses.token_weights(  # one per completion, from the global counts
        cfg.loss_agg, torch.tensor([sum(s.mask) for _, s, _ in items], dtype=torch.long),
        torch.tensor([sum(sum(s.mask) for s in g.samples) for g in kept for _ in g.samples], dtype=torch.long),
        int(n_prompts), int(n_completions), int(n_tokens)).tolist()
    micro, padding_frac, padding_frac_unsorted = policy.buckets(
        [(*it, w) for it, w in zip(items, weights)], cfg.micro_batch_tokens, length=lambda it: len(it[0]) + len(it[1].token_ids))
    n_micro = int(all_max(len(micro)))
    sums = dict.fromkeys(("loss", "tokens", "is_ratio_sum", "clipped_tokens", "mismatch_sum", "entropy_sum"), 0.0)
    is_ratio_max = 0.0
    for j in range(n_micro):
        mb = micro[j] if j < len(micro) else None
        logp, entropy = policy.completion_logprobs(model, [(p, s.token_ids) for p, s, _, _ in mb] if mb else dummy,
                                                   cfg.temperature, pad_id)
        if mb is None:  # keeps FSDP's collectives in step across ranks; contributes nothing
            (logp.sum() * 0.0).backward()
            continue
        per_token = lambda f: torch.tensor([x for i, it in enumerate(mb) for x in f(i, *it)], device=device)  # noqa: E731
        mask = per_token(lambda i, p, s, a, w: s.mask)
        loss, m = losses.policy_loss(
            cfg.loss, logp, logp_gen=per_token(lambda i, p, s, a, w: s.logprobs).float(),
            adv=per_token(lambda i, p, s, a, w: [a] * len(s.mask)).float(),
            weight=per_token(lambda i, p, s, a, w: [w] * len(s.mask)), mask=mask,
            seq_id=per_token(lambda i, p, s, a, w: [i] * len(s.mask)), **loss_eps)
        if step + 1 in inject_nan_steps:  # tests only: a planted non-finite gradient
            loss = loss * float("nan")
        (loss * world).backward()  # FSDP averages gradients over ranks; the loss is a sum over them
        sums["loss"] += loss.item()
        for k in ("tokens", "is_ratio_sum", "clipped_tokens", "mismatch_sum"):
            sums[k] += m[k]
        sums["entropy_sum"] += float((entropy * mask).sum())
        is_ratio_max = max(is_ratio_max, m["is_ratio_max"])

    if grad_file and step == 0:
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        loss_total = all_sum(sums["loss"])[0]
        if master:
            torch.save({"loss": loss_total, "grads": grads}, grad_file)

    t_train = time.time() - t0

    # --- optimizer step; a non-finite loss or gradient skips it, weights and optimizer state untouched
    t0 = time.time()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    totals = dict(zip(sums, all_sum(*sums.values())))
    finite = math.isfinite(grad_norm) and math.isfinite(totals["loss"])
    lr = lr_at(step)
    if finite and n_micro:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        state["bad_steps"] = 0
    elif not finite:
        state["bad_steps"] += 1
    optimizer.zero_grad(set_to_none=True)
    t_optim = time.time() - t0

    # --- sync: push the new weights into this rank's vLLM (in flight in pipeline mode, paper §3.1)
    t0 = time.time()
    if finite and n_micro:
        gen.update_weights((name, p.full_tensor() if hasattr(p, "full_tensor") else p.detach())
                           for name, p in model.named_parameters())
    t_sync = time.time() - t0
    state["version"] = gen.version

    # --- log: every metric summed over ranks first
    state["step"] += 1
    state["samples"] += cfg.batch
    state["tokens"] += int(n_tokens)
    state["gpu_hours"] += (time.time() - t_train_clock) * world / 3600
    t_train_clock = time.time()
    (n_samples, reward_sum, correct_sum, trunc_sum, interrupt_sum, completion_tokens, lag_sum, n_groups,
     zero_var) = all_sum(len(samples), sum(s.reward for s in samples), sum(s.correct for s in samples),
                         sum(s.truncated for s in samples), sum(s.interrupted for s in samples),
                         sum(len(s.token_ids) for s in samples), sum(lags), len(groups),
                         int(zero_var_groups.sum()))
    tokens = max(totals["tokens"], 1.0)
    gathered = [None] * world  # the prompts trained on this step and every graded group's pass rate, all ranks
    dist.all_gather_object(gathered, ([(g.serial, g.prompt_idx) for g in groups], rollouts.take_records()))
    prompts = [p for _, p in sorted(sp for trained, _ in gathered for sp in trained)]
    for _, records in gathered:  # No-Positive-Resampling sees every rank's groups: samplers stay identical
        for prompt_idx, pass_rate in records:
            sampler.record(prompt_idx, pass_rate)
    record = {
        "kind": "train", "step": state["step"], "gpu_hours": state["gpu_hours"], "samples": state["samples"],
        "tokens": state["tokens"], "reward_mean": reward_sum / n_samples, "pass_rate_train": correct_sum / n_samples,
        "loss": totals["loss"], "lr": lr, "grad_norm": grad_norm, "skipped": not finite, "updated": finite and n_micro > 0,
        "truncation_rate": trunc_sum / n_samples, "interruption_rate": interrupt_sum / n_samples,
        "completion_tokens_mean": completion_tokens / n_samples, "zero_var_frac": zero_var / n_groups,
        "is_ratio_mean": totals["is_ratio_sum"] / tokens, "is_ratio_max": all_max(is_ratio_max),
        "clip_frac": totals["clipped_tokens"] / tokens, "mismatch": totals["mismatch_sum"] / tokens,
        "entropy": totals["entropy_sum"] / tokens, "lag_mean": lag_sum / n_groups, "lag_max": all_max(max(lags)),
        "retired_prompts": len(sampler.retired),  # the sampler is the same on every rank
        "padding_frac": padding_frac, "padding_frac_unsorted": padding_frac_unsorted,
        "t_generate": t_generate, "t_grade": t_grade, "t_train": t_train, "t_optim": t_optim, "t_sync": t_sync,
        "peak_mem_gib": all_max(torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else
                                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20),
        "t_step": time.time() - t_step, "prompts": prompts,
    }
    log(record)
    print0(f"step {state['step']}/{cfg.max_steps} | reward {record['reward_mean']:+.3f} | pass {record['pass_rate_train']:.3f}"
           f" | loss {record['loss']:+.4f} | lag {record['lag_mean']:.2f}/{record['lag_max']:.0f} | "
           f"{record['t_step']:.2f}s (gen {t_generate:.2f} train {t_train + t_optim:.2f} sync {t_sync:.3f})")
    if state["bad_steps"] >= cfg.max_bad_steps:
        print0(f"error: {state['bad_steps']} consecutive steps with a non-finite loss or gradient; stopping. The last "
               f"checkpoint in {run_dir} is intact.")
        log({"kind": "error", "step": state["step"], "message": "too many non-finite steps"})
        sys.exit(3)

    # --- rollout dump: what the policy writes, for people to read (prompts, completions, rewards, token lags)
    if cfg.dump_every != -1 and state["step"] % cfg.dump_every == 0:
        t0 = time.time()
        rows = [{"step": state["step"], "prompt": tokenizer.decode(g.prompt_ids), "answer": g.answer,
                 "completion": smp.text, "reward": smp.reward, "interrupted": smp.interrupted,
                 "truncated": smp.truncated, "token_lag": [trained_version - v if v >= 0 else None for v in smp.versions]}
                for g in groups for smp in g.samples]
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        if master:
            os.makedirs(os.path.join(run_dir, "rollouts"), exist_ok=True)
            with open(os.path.join(run_dir, "rollouts", f"step_{state['step']:06d}.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for ranked in gathered for r in ranked)
        t_train_clock += time.time() - t0  # writing for people is not training compute

    # --- checkpoint: atomic (temporary folder renamed into place), the newest keep_checkpoints kept
    if cfg.save_every != -1 and state["step"] % cfg.save_every == 0:
        t0 = time.time()
        pending = [None] * world  # drawn but not yet trained on (pipeline, ppo): first in line after a resume
        dist.all_gather_object(pending, rollouts.pending())
        sampler_state = sampler.state_dict([p for _, p in sorted(sp for ranked in pending for sp in ranked)])
        checkpoint.save(run_dir, state, model, optimizer, sampler_state, tokenizer, cfg)
        print0(f"checkpoint step {state['step']} ({time.time() - t0:.1f}s)")
        t_train_clock += time.time() - t0

print0(f"done: {state['step']} steps, {state['gpu_hours']:.4f} device-hours, log {log_path}")
if wandb_run is not None:
    wandb_run.finish()
if hasattr(grade, "close"):
    grade.close()  # the math-verify workers
gen.close()  # vLLM's shutdown also tears down the process group
