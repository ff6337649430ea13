"""Evaluate a checkpoint, a run or any model on held-out prompts in one command, with the run's own settings.

    python evaluate.py out/<run>                        # its newest checkpoint that verifies, its held-out prompts
    python evaluate.py out/<run>/ckpt-000250 --samples 16
    python evaluate.py toy                              # the warm start; any --model value (GGUF, folder, Hub name)
    python evaluate.py out/<run> --dataset math500 --samples 16 --prompts 500

A checkpoint is verified by content first (checkpoint.verify). Its settings (budgets, interruptions, dtype, reward,
dataset) are the run's, as the checkpoint saved them (its log's config record for older checkpoints); a train.py
flag typed here wins, and another --dataset brings its own reward. Prints the mean pass rate ± its standard error
(the paper's mean@n, §2.1), pass@k for k up to n (the unbiased estimator of Chen et al. 2021: 1 - C(n-c, k) / C(n, k)
per prompt), the share of completions that give an answer in the reward's form, completion tokens and truncations;
writes every completion to a JSON-lines file (--out). Creates no run folder, lock or training log.

The evaluation is train.py's (rollouts.evaluate) with the same seeds, so on the same machine the checkpoint of step
N scores what its run's eval record of step N says (tested).
"""
import argparse
import json
import math
import os
import sys

from metrics import Interrupt

interrupt = Interrupt()  # Ctrl-C: one line, exit 130

import checkpoint  # noqa: E402
import config  # noqa: E402
import data  # noqa: E402
import rewards  # noqa: E402
from metrics import write_jsonl  # noqa: E402


def fail(msg: str, status: int = 2):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)  # no teardown: vLLM's and torch's threads can abort it (SIGABRT)


def resolve(target: str) -> tuple[str | None, dict | None, str]:
    """-> (checkpoint folder or None, the run's saved settings or None, a name for the output). A run folder gives
    its newest checkpoint that verifies; anything else is a --model value."""
    ckpt = target
    if os.path.isdir(target) and not os.path.exists(os.path.join(target, "manifest.json")):
        found = checkpoint.all_checkpoints(target)
        if not found and os.path.exists(os.path.join(target, "lock")):  # a run folder with no checkpoint yet
            fail(f"{target}: a run with no complete checkpoint (train.py --save_every writes them)")
        if not found:  # a model folder (Hugging Face or GGUF), not a run
            return None, None, os.path.basename(os.path.normpath(target))
        ckpt = checkpoint.newest_verified(target, log=lambda m: print(m, file=sys.stderr))
        if ckpt is None:
            fail(f"{target}: none of its {len(found)} checkpoints verifies (the warnings above say why)")
    elif not os.path.isdir(target):
        return None, None, os.path.basename(os.path.normpath(target)).removesuffix(".gguf")
    elif why := checkpoint.verify(ckpt, log=lambda m: print(m, file=sys.stderr)):
        fail(f"{ckpt} is not a checkpoint that verifies: {why}")
    with open(os.path.join(ckpt, "state.json")) as f:
        state = json.load(f)
    saved = state.get("config")
    if not isinstance(saved, dict):  # a checkpoint from before settings were saved in it: the run's log
        saved = checkpoint.log_config(os.path.join("logs", f"{state.get('run_name')}.jsonl"))
    if saved is None:
        print(f"note: {ckpt} holds no settings and logs/{state.get('run_name')}.jsonl is not here: train.py's "
              "defaults apply (type the run's flags)", file=sys.stderr)
    run = os.path.basename(os.path.dirname(os.path.abspath(ckpt)))
    return ckpt, saved, f"{run}-{os.path.basename(os.path.normpath(ckpt))}"


def pass_at_k(n: int, correct: list[int]) -> dict:
    """{k: mean over prompts of the unbiased pass@k} for k = 1, 2, 4, ... and n (Chen et al. 2021, Eq. 1)."""
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    return {k: sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in correct) / max(len(correct), 1) for k in ks}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Any other flag is train.py's "
                                 "(--dataset, --eval_dataset, --think_max_tokens, --temperature, --seed, ...).")
    ap.add_argument("target", help="a checkpoint (out/<run>/ckpt-N), a run folder (out/<run>) or a --model value")
    ap.add_argument("--samples", type=int, help="completions per prompt (default: the run's --eval_samples)")
    ap.add_argument("--prompts", type=int, help="held-out prompts, at most (default: the run's --eval_prompts)")
    ap.add_argument("--out", help="the completions' JSON-lines file (default: <out_dir>/evals/<name>-<dataset>-n<n>"
                    ".jsonl)")
    ap.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    ap.error = lambda message: fail(message)  # one line, not argparse's usage block
    args, flags = ap.parse_known_args()
    flags += [*(["--eval_samples", str(args.samples)] if args.samples is not None else []),
              *(["--eval_prompts", str(args.prompts)] if args.prompts is not None else [])]
    ckpt, saved, name = resolve(args.target)
    try:
        cfg = config.parse_args(["--model", ckpt or args.target, *flags], saved=saved)
    except config.ConfigError as e:
        fail(str(e))
    if cfg.eval_samples < 1 or cfg.eval_prompts < 1:
        fail("--samples and --prompts must be at least 1")

    import torch
    from transformers import AutoConfig, AutoTokenizer

    import policy
    from generate import Generator
    from rollouts import evaluate
    try:
        model_path = ckpt or policy.resolve_model(cfg.model, cfg.out_dir)
        context = AutoConfig.from_pretrained(model_path).max_position_embeddings
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        _, rows, grade = data.load_task(cfg, tokenizer, log=lambda m: print(m, file=sys.stderr))
    except (ValueError, OSError, RuntimeError) as e:  # data.DataError is a ValueError
        fail(f"--model {cfg.model}: {data.one_line(e)}" if not isinstance(e, data.DataError) else str(e))
    phrase = len(tokenizer(rewards.INTERRUPT_PHRASE, add_special_tokens=False)["input_ids"])
    if cfg.vllm_max_len(phrase) > context:
        fail(f"prompt {cfg.prompt_max_tokens} + thinking {cfg.think_max_tokens} + phrase {phrase} + answer "
             f"{cfg.answer_max_tokens} tokens exceed the model's context of {context} (type the run's budgets)")
    if cfg.eval_prompts > len(rows) and "eval_prompts" in cfg.typed:
        fail(f"--prompts {cfg.eval_prompts} is more than the {len(rows)} held-out prompts")
    rows = rows[:cfg.eval_prompts]
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    try:
        gen = Generator(cfg, model_path, tokenizer, device, updates_in_flight=False)
    except Exception as e:  # too little memory, an unsupported model: one line
        fail(f"the vLLM engine could not start: {data.one_line(e, 300)}", 4)
    extract = rewards.REWARDS[cfg.reward].extract
    thinking = rewards.prompt_opens_thinking(tokenizer)
    kept = []
    ev = evaluate(gen, rows, cfg, grade, extract=extract and (lambda t: extract(t, thinking=thinking)), keep=kept)
    n, total = cfg.eval_samples, ev["samples"]
    correct = [sum(r > 0 for r in rs) for _, rs in kept]
    summary = {"target": args.target, "checkpoint": ckpt, "model_path": model_path, "dataset": cfg.eval_dataset
               or cfg.dataset, "prompts": ev["prompts"], "samples_per_prompt": n,
               "pass_rate": ev["correct"] / total, "pass_rate_se": math.sqrt(ev["variance_sum"]) / ev["prompts"]
               if n > 1 else None, **{f"pass@{k}": v for k, v in pass_at_k(n, correct).items()},
               "answered_rate": ev["answered"] / total if "answered" in ev else None,
               "completion_tokens_mean": ev["completion_tokens"] / total, "truncation_rate": ev["truncated"] / total,
               "ungraded": ev["ungraded"]}
    out = args.out or os.path.join(cfg.out_dir, "evals", f"{name}-{os.path.basename(summary['dataset'])}-n{n}.jsonl")
    write_jsonl(out, [{"prompt": rows[g.prompt_idx]["prompt"], "answer": g.answer, "completion": s.text,
                       "reward": r, "completion_tokens": len(s.token_ids), "interrupted": s.interrupted,
                       "truncated": s.truncated} for g, rs in kept for s, r in zip(g.samples, rs)])
    se = f" ± {summary['pass_rate_se']:.3f}" if n > 1 else ""
    print(f"{name} on {summary['dataset']} ({ev['prompts']} held-out prompts x {n}): pass rate "
          f"{summary['pass_rate']:.3f}{se} (mean@{n}); "
          + ", ".join(f"pass@{k} {v:.3f}" for k, v in pass_at_k(n, correct).items() if k > 1)
          + (f"; answered {summary['answered_rate']:.3f}" if summary["answered_rate"] is not None else "")
          + f"; {summary['completion_tokens_mean']:.1f} completion tokens, truncated {summary['truncation_rate']:.3f}"
          + (f"; {ev['ungraded']} ungraded (grading time)" if ev["ungraded"] else ""))
    print(f"completions: {out}")
    if args.json:
        print(json.dumps(summary))
    if hasattr(grade, "close"):
        grade.close()
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine teardown at interpreter exit can print or hang; nothing is left to write


if __name__ == "__main__":
    main()
