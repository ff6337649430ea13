"""Where a step's time goes, and how close the loop is to the limit: vLLM alone and the trainer alone.

    python bench.py                                    # the toy, sync mode: 12 steps of the real loop, then the limits
    python bench.py --mode pipeline                    # any train.py flag passes through
    python bench.py --batch 512 --scale_lengths 32,128 # cost against batch size and completion length
    python bench.py --padding                          # the trainer packed at smaller budgets, and unpacked
    python bench.py --trainer_only --shapes 0.5b,1.5b --micro_batch_tokens_list 8192,16384,32768   # a GPU, no vLLM

1. loop: train.py itself, in this process, without evaluation or checkpoints: per phase (in pipeline mode "generate"
   is the wait for a batch) the median seconds per step after --skip; tokens/s, samples/s, peak memory, padding.
2. limits, in the same process: vLLM alone and the trainer alone, in a replay of the loop; overhead = 1 -
   (generate_alone + train_alone) / step, and again with the grader alone in the limit: what is left is the loop's
   own bookkeeping. --rounds N: N fresh processes (one_round), for the overhead's 95% interval. Pin it on a small
   CPU (README, Speed).
3. --trainer_only (trainer_only): the trainer alone, importing no vLLM (it runs where vLLM is not installed). One
   long sequence's memory, with and without activation checkpointing and chunks:
   python bench.py --trainer_only --shapes smollm2 --sequences 2 --trainer_group 2 --prompt_tokens 64 \
       --completion_tokens 8192 --micro_batch_tokens_list 8192 --trainer_steps 0 --activation_checkpointing on
"""
import argparse
import dataclasses
import json
import math
import os
import pickle
import random
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile
import time

from roofline import PEAK_BF16_TFLOPS, SHAPES, matmul_peak, model_flops

ROOT = os.path.dirname(os.path.abspath(__file__))
PHASES = {"t_generate": "generate", "t_grade": "grade", "t_train": "trainer forward/backward", "t_optim": "optimizer",
          "t_sync": "weight sync"}  # the loop's timed phases, and their names in the table


def loop(flags: list[str], steps: int, skip: int) -> dict:
    """Run train.py, the real loop, as a script in this process (runpy: its own code, unchanged): median per-step
    numbers from its log. In the replay's process: a small CPU's speed differs by process (docs/measurements.md)."""
    with tempfile.TemporaryDirectory() as logs:
        argv = sys.argv
        sys.argv = [os.path.join(ROOT, "train.py"), *flags, "--max_steps", str(steps), "--eval_every", "-1",
                    "--save_every", "-1", "--run_name", "bench", "--log_dir", logs]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code:
                sys.exit(f"error: train.py stopped with exit status {e.code} (its output is above)")
        finally:
            sys.argv = argv
        records = [json.loads(line) for line in open(os.path.join(logs, "bench.jsonl"))]
    train = [r for r in records if r["kind"] == "train"][skip:]
    keys = (*PHASES, "t_step", "padding_frac", "padding_frac_unpacked", "completion_tokens_mean", "peak_mem_gib")
    med = {k: statistics.median(r[k] for r in train) for k in keys}
    med["t_other"] = statistics.median(r["t_step"] - sum(r[k] for k in PHASES) for r in train)
    samples = records[0]["batch"]  # the run's config
    # rates over all the timed steps (a median of per-step rates is ruled by the steps that trained nothing)
    generated = samples * sum(r["completion_tokens_mean"] for r in train)
    med["gen_tokens_per_s"] = generated / sum(r["t_generate"] for r in train)
    trained = sum(b["tokens"] - a["tokens"] for a, b in zip(train, train[1:]))
    med["train_tokens_per_s"] = trained / max(sum(r["t_train"] for r in train[1:]), 1e-9)
    med["samples_per_s"] = samples / med["t_step"]
    med["step_s"] = [r["t_step"] for r in train]  # each timed step, for the limits' replay of it
    med["step_tokens"] = [r["completion_tokens_mean"] for r in train]  # what the replay must sample again
    # each timed step's phases, to set beside the replay's: generate, grade, train (+ optimizer), weight sync
    med["step_phases"] = [(r["t_generate"], r["t_grade"], r["t_train"] + r["t_optim"], r["t_sync"]) for r in train]
    med["config"] = records[0]
    return med


def limits(flags: list[str], repeats: int, lengths: list[int], skip: int = 0, padding: bool = False,
           replays: int = 1) -> dict:
    """vLLM alone and the trainer alone (policy.train_step, as train.py) in this process, replaying the loop's steps
    skip+1..skip+repeats from its start: the same weights, prompts, sampling seeds and learning rates. out["replay"]:
    seconds per step (generate, grade, train), to pair with the loop's; with replays > 1 the last replay counts."""
    import torch
    import torch.distributed as dist
    import config as config_mod
    import data
    import policy
    from generate import Generator
    from rollouts import PromptSampler, grade_groups
    from transformers import AutoTokenizer
    cfg = config_mod.parse_args(flags)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_initialized():  # (train.py's run before this one in the process shuts its group down)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    path = policy.resolve_model(cfg.model, cfg.out_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_rows, _, grade = data.load_task(cfg, tokenizer)
    # room in the engine's context for the longest forced completion
    gen = Generator(dataclasses.replace(cfg, think_max_tokens=max([cfg.think_max_tokens, *lengths])), path, tokenizer,
                    f"cuda:{torch.cuda.current_device()}" if device.type == "cuda" else "cpu", updates_in_flight=False)
    threads = torch.get_num_threads()
    model = policy.build(path, device, getattr(torch, cfg.dtype), cfg.fp32_head)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def fresh_sampler():  # the loop's draws: step 1's prompts first (NPR retires nothing in the first epoch)
        return PromptSampler(train_rows, cfg.seed, npr=False, npr_threshold=1.0)
    sampler = fresh_sampler()

    def generate(length: int | None):
        """One batch of the run's prompts, graded: (seconds generating, seconds grading, groups). With a length, every
        completion is forced to exactly that many tokens (no interruptions)."""
        gen.cfg = dataclasses.replace(cfg, interruptions=False, think_max_tokens=length, answer_max_tokens=0) \
            if length else cfg
        gen.min_tokens = length or 0
        uids = set()
        t0 = time.time()  # from the draw, as the loop's generate phase: vLLM's add_request is vLLM's work too
        for idx, serial in sampler.draw(cfg.prompts_per_step):
            gen.submit(str(serial), idx, train_rows[idx]["prompt_ids"], train_rows[idx]["answer"], cfg.group, serial)
            uids.add(str(serial))
        groups = gen.run_until_done(uids, "bench")
        t1 = time.time()
        grade_groups(groups, grade, cfg)
        return t1 - t0, time.time() - t1, groups

    def train(groups, zero_var_filter: bool, step: int | None = None) -> tuple[float, bool]:
        """The loop's training phase at the loop's learning rate of that step (or the full rate): (seconds, whether
        the weights changed). Forced-length batches keep every group and their "truncated" completions."""
        run_cfg = dataclasses.replace(cfg, zero_var_filter=zero_var_filter,
                                      drop_truncated=cfg.drop_truncated and zero_var_filter)
        step = cfg.warmup_steps if step is None else step
        t0 = time.time()
        updated = policy.train_step(model, optimizer, groups, run_cfg, step, pad_id).updated
        return time.time() - t0, updated

    out = {"torch_threads": threads}
    start = {name: t.detach().clone() for name, t in model.state_dict().items()}  # the loop's initial weights
    _, _, groups = generate(None)  # warm-up, not timed: the engine's first batch compiles its kernels (seconds)
    train(groups, cfg.zero_var_filter)
    for _ in range(replays):  # the loop from its start (the same weights, prompts, seeds and learning rates);
        # the last replay is the one measured, those before it warm this process up on the very same work
        model.load_state_dict(start)
        optimizer.state.clear()
        gen.update_weights(policy.full_weights(model))
        sampler = fresh_sampler()
        out["replay"], out["replay_tokens"], replayed = [], [], []
        for step in range(skip + repeats):
            t_gen, t_grade, groups = generate(None)
            t_train, updated = train(groups, cfg.zero_var_filter, step)
            if updated:  # as the loop does, untimed: the weight sync is the loop's overhead
                gen.update_weights(policy.full_weights(model))
            if step < skip:  # the loop's untimed first steps
                continue
            if padding:
                replayed.append(policy.effective_batch(groups, cfg)[0])
            out["replay"].append((t_gen, t_grade, t_train))
            out["replay_tokens"].append(statistics.mean(len(s.token_ids) for g in groups for s in g.samples))
    for length in lengths:  # forced lengths: every group kept (their rewards say nothing), no weight sync
        timed = []  # (generate s, train s, mean completion tokens) per batch
        for _ in range(repeats):
            t_gen, _, groups = generate(length)
            timed.append((t_gen, train(groups, False)[0], statistics.mean(len(s.token_ids) for g in groups
                                                                          for s in g.samples)))
        out[length] = {"generate": statistics.median(t for t, _, _ in timed),
                       "train": statistics.median(t for _, t, _ in timed), "tokens": timed[-1][2]}
    if padding:
        out["padding"] = padding_alternatives(model, replayed, cfg, pad_id)
    if device.type == "cpu":  # the trainer on one thread, as vLLM's CPU backend can leave it
        torch._C.set_num_threads(1)
        _, _, groups = generate(None)
        out["train_1_thread"] = statistics.median(train(groups, cfg.zero_var_filter)[0] for _ in range(2))
        torch._C.set_num_threads(threads)
    gen.close()  # (vLLM's shutdown also destroys the process group; a train.py run after this one makes its own)
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


def padding_alternatives(model, groups_per_step: list[list], cfg, pad_id: int, repeats: int = 3) -> list[dict]:
    """What padding costs, on the loop's own kept completions: the trainer's forward and backward over each step's
    sequences packed by policy.pack at --micro_batch_tokens (the loop's layout), at 1/2 and 1/4 of it (less padding,
    more calls), and one per row. Per layout: padding fraction, forward calls, median seconds per step."""
    import policy
    steps = [[(g.prompt_ids, s.token_ids) for g in groups for s in g.samples if any(s.mask)]
             for groups in groups_per_step]
    steps = [seqs for seqs in steps if seqs]  # a step whose groups all had equal rewards trains nothing
    if not steps:
        return []
    length = lambda seq: len(seq[0]) + len(seq[1])  # noqa: E731
    budget = cfg.micro_batch_tokens
    layouts = {f"packed at {budget // div} tokens": [policy.pack(seqs, budget // div, length)[0] for seqs in steps]
               for div in (1, 2, 4)}
    layouts[f"one per row at {budget} tokens"] = [policy.pack(seqs, budget, length, packed=False)[0] for seqs in steps]
    times = {name: [] for name in layouts}
    for _ in range(repeats):
        for name, per_step in layouts.items():
            t0 = time.time()
            for micro in per_step:
                for rows in micro:
                    policy.completion_logprobs(model, rows, cfg.temperature, pad_id)[0].sum().backward()
            times[name].append((time.time() - t0) / len(per_step))
    model.zero_grad(set_to_none=True)
    real = sum(length(seq) for seqs in steps for seq in seqs)
    out = []
    for name, per_step in layouts.items():
        padded = sum(len(rows) * max(sum(map(length, row)) for row in rows) for micro in per_step for rows in micro)
        out.append({"layout": name, "padding": 1 - real / padded, "calls": sum(map(len, per_step)) / len(per_step),
                    "seconds": statistics.median(times[name])})
    return out


def trainer_only(args, flags: list[str]) -> list[dict]:
    """The loop's training phase (policy.train_step) on synthetic groups and random-initialized Qwen2.5-shaped models
    built as train.py builds its own (--dtype body, FP32 head, FSDP2), per shape and budget: tokens/s, memory, MFU."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config
    import config as config_mod
    import policy
    from generate import Group, Sample
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    base = config_mod.parse_args(["--model", "bench", *flags])  # dtype (auto: bf16 on GPU), checkpointing, chunks
    # the peak MFU is measured against: the spec sheet's on a GPU; on a CPU this process's own matmul (roofline.py)
    peak = args.peak_tflops or next((t for k, t in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    if not peak and device.type == "cpu":
        peak = matmul_peak(base.dtype) / 1e12
        print(f"peak: a 2048 x 2048 {base.dtype} matmul here, {peak * 1e3:.1f} GFLOP/s", flush=True)
    rng, rows = random.Random(0), []
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, tie_word_embeddings=not shape_name.startswith(
            ("toy", "8b")), max_position_embeddings=32768), dtype=torch.float32)  # the toys' and 8B's heads: own
        params = sum(p.numel() for p in model.parameters())
        model = policy.build(model, device, getattr(torch, base.dtype), True, None,
                             base.activation_checkpointing == "on", base.logprob_chunk_tokens)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, eps=1e-15, weight_decay=0.01)
        v = shape["vocab_size"]

        def groups():  # prompts x G completions of random tokens, rewards +1/-1 so no group is filtered
            out = []
            for p in range(args.sequences // args.trainer_group):
                prompt = [rng.randrange(v) for _ in range(args.prompt_tokens)]
                samples = []
                for i in range(args.trainer_group):
                    n = rng.randint(args.completion_tokens // 2, args.completion_tokens)  # lengths vary, as in RL
                    samples.append(Sample(token_ids=[rng.randrange(v) for _ in range(n)], logprobs=[-1.0] * n,
                                          versions=[0] * n, mask=[1] * n, reward=1.0 if i % 2 else -1.0))
                out.append(Group(f"g{p}", p, p, prompt, "0", samples))
            return out
        for budget in [int(x) for x in args.micro_batch_tokens_list.split(",")]:
            cfg = config_mod.parse_args(["--model", "bench", "--micro_batch_tokens", str(budget), *flags])
            times = []
            for step in range(args.trainer_steps + 1):  # the first is warm-up
                batch = groups()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.time()
                padding = policy.train_step(model, optimizer, batch, cfg, cfg.warmup_steps, 0).padding
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if step:
                    times.append(time.time() - t0)
            completion = sum(len(s.token_ids) for g in batch for s in g.samples)
            positions = completion + len(batch) * args.trainer_group * args.prompt_tokens
            seconds = statistics.median(times) if times else float("nan")  # --trainer_steps 0: memory only
            flops = model_flops(shape, positions, completion, positions / (len(batch) * args.trainer_group))
            peak_gib = (torch.cuda.max_memory_allocated() if device.type == "cuda" else  # CPU: the process's peak RSS
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30
            rows.append({"shape": shape_name, "params": params, "micro_batch_tokens": budget, "device": name,
                         "seconds_per_step": seconds, "tokens_per_s": positions / seconds, "peak_mem_gib": peak_gib,
                         "tflops": flops / seconds / 1e12, "mfu": flops / seconds / (peak * 1e12) if peak else None,
                         "padding_frac": padding, "positions": positions})
            r = rows[-1]
            print(f"{shape_name:>7} ({params / 1e6:.0f}M) micro_batch_tokens {budget:>6}: {seconds:.3f} s/step, "
                  f"{r['tokens_per_s']:.0f} tokens/s, {r['tflops'] * 1e3:.1f} GFLOP/s, MFU "
                  + (f"{r['mfu']:.1%}" if peak else "n/a (no peak known: --peak_tflops)")
                  + f", peak memory {peak_gib:.1f} GiB, padding {padding:.1%}", flush=True)
        del model, optimizer
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def round_overhead(run: dict, replay: list[tuple], parts=(0, 2)) -> float:
    """1 - sum(what runs alone) / sum(the loop's steps) over one round; parts: which of (generate, grade, train)."""
    return 1 - sum(sum(x[i] for i in parts) for x in replay) / sum(run["step_s"][:len(replay)])


def one_round(index: int, flags: list[str], steps: int, skip: int, repeats: int, lengths: list[int],
              padding: bool) -> dict:
    """One round in this process: an untimed replay first (whatever runs first in a process runs slower), then loop
    and replay, in that order in even rounds and reversed in odd ones, so what the order does falls on both alike."""
    if index % 2 == 0:
        limits(flags, repeats, [], skip)  # the warm-up
        run = loop(flags, steps, skip)
        lim = limits(flags, repeats, lengths, skip, padding)
    else:
        lim = limits(flags, repeats, lengths, skip, padding, replays=2)  # the warm-up, then the replay
        run = loop(flags, steps, skip)
    return {"loop": run, "limits": lim}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Other flags go to train.py unchanged.",
                                 allow_abbrev=False)  # a train.py flag must never be taken for an abbreviation of ours
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps of the real loop (default 12)")
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the medians (start-up; default 2)")
    ap.add_argument("--repeats", type=int, default=0, help="batches for each limit measurement: the loop's timed "
                    "steps replayed (default 0: all of them, --steps - --skip)")
    ap.add_argument("--rounds", type=int, default=1, help="loop runs, each paired with its own limit measurement, "
                    "for the overhead's spread (default 1)")
    ap.add_argument("--scale_lengths", default="", help="comma-separated completion lengths in tokens for the limits")
    ap.add_argument("--padding", action="store_true", help="also time the trainer's forward/backward on the replayed "
                    "steps packed at smaller budgets and unpacked (bench.padding_alternatives)")
    ap.add_argument("--trainer_only", action="store_true", help="only the trainer, no vLLM (see 3. above)")
    ap.add_argument("--shapes", default="0.5b,1.5b", help=f"--trainer_only model shapes: {', '.join(SHAPES)}")
    ap.add_argument("--micro_batch_tokens_list", default="8192,16384,32768", help="--trainer_only budgets")
    ap.add_argument("--sequences", type=int, default=64, help="--trainer_only completions per step (default 64)")
    ap.add_argument("--trainer_group", type=int, default=16,
                    help="--trainer_only completions per prompt (default 16; --group goes to train.py)")
    ap.add_argument("--prompt_tokens", type=int, default=256, help="--trainer_only prompt length (default 256)")
    ap.add_argument("--completion_tokens", type=int, default=2048,
                    help="--trainer_only longest completion; lengths are uniform in [half, this] (default 2048)")
    ap.add_argument("--trainer_steps", type=int, default=3, help="--trainer_only timed steps after one warm-up")
    ap.add_argument("--peak_tflops", type=float, default=0.0,
                    help="--trainer_only peak TFLOP/s (default: a GPU's by name, a CPU's measured)")
    ap.add_argument("--out", default="", help="--trainer_only: also write one JSON line per measurement here")
    ap.add_argument("--round_out", default="", help=argparse.SUPPRESS)  # internal: run one round, pickle it there
    ap.add_argument("--round_index", type=int, default=0, help=argparse.SUPPRESS)
    args, flags = ap.parse_known_args()

    def die(msg):  # one line and exit status 2, as train.py's flag errors
        ap.exit(2, f"error: {msg}\n")
    import config
    config.main(["--model", "bench", *flags] if args.trainer_only else flags)  # train.py's flags: checked up front
    try:
        lengths = [int(x) for x in args.scale_lengths.split(",") if x]
    except ValueError:
        die(f"--scale_lengths {args.scale_lengths!r} is not a list of positive integers")
    if any(n < 1 for n in lengths):
        die(f"--scale_lengths {args.scale_lengths!r} must be positive token counts")
    if any(x not in SHAPES for x in args.shapes.split(",")):
        die(f"--shapes {args.shapes!r}: choose from {', '.join(SHAPES)}")
    if not all(x.isdigit() and int(x) > 0 for x in args.micro_batch_tokens_list.split(",")):
        die(f"--micro_batch_tokens_list {args.micro_batch_tokens_list!r} is not a list of positive integers")
    if args.trainer_only:
        if min(args.sequences, args.trainer_group) < 1 or args.sequences % args.trainer_group or args.trainer_steps < 0:
            die("need --sequences a positive multiple of --trainer_group and --trainer_steps >= 0")
        trainer_only(args, flags)
        return
    if not any(f.startswith("--mode") for f in flags):
        flags = ["--mode", "sync", *flags]
    if args.rounds < 1 or not 0 <= args.skip < args.steps or not 0 <= args.repeats <= args.steps - args.skip:
        die("need --rounds >= 1, 0 <= --skip < --steps and 0 <= --repeats <= --steps - --skip")
    repeats = args.repeats or args.steps - args.skip
    if args.round_out:
        result = one_round(args.round_index, flags, args.steps, args.skip, repeats, lengths, args.padding)
        with open(args.round_out, "wb") as f:
            pickle.dump(result, f)
        return
    # a toy warm start to build (minutes) or a GGUF to convert: here, where its progress shows, not in a round
    import policy
    cfg = config.parse_args(flags)
    try:
        policy.resolve_model(cfg.model, cfg.out_dir)
    except (ValueError, RuntimeError, OSError) as e:
        die(str(e))
    # each round a fresh process, the loop and its replay inside it (see 2. above); the extras in the last round only
    results, extras = [], ["--scale_lengths", args.scale_lengths, *(["--padding"] if args.padding else [])]
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "round.pkl")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--round_out", out, "--round_index",
                                   str(i), "--steps", str(args.steps), "--skip", str(args.skip), "--repeats",
                                   str(repeats), *(extras if i == args.rounds - 1 else []), *flags], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if proc.returncode:
                sys.exit(f"error: bench round {i + 1} failed:\n{proc.stdout[-3000:]}")
            with open(out, "rb") as f:
                results.append(pickle.load(f))
        print(f"round {i + 1}/{args.rounds}: overhead "
              f"{round_overhead(results[-1]['loop'], results[-1]['limits']['replay']):.1%}", flush=True)
    runs, replays, lim = [r["loop"] for r in results], [r["limits"]["replay"] for r in results], results[-1]["limits"]
    run = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}
    cfg = runs[0]["config"]  # run: the table's numbers, medians over rounds (per-step lists stay per run)
    print(f"bench: {' '.join(flags)} | {cfg['batch']} = {cfg['batch'] // cfg['group']} x {cfg['group']} completions "
          f"per step, {cfg['device']}, medians over steps {args.skip + 1}-{args.steps}")
    print(f"{'phase':<26}{'s/step':>8}{'share':>8}")
    for key, name in {**PHASES, "t_other": "everything else"}.items():
        print(f"{name:<26}{run[key]:8.3f}{run[key] / run['t_step']:8.1%}")
    print(f"{'step':<26}{run['t_step']:8.3f}")
    print(f"generated tokens/s {run['gen_tokens_per_s']:.0f} | trained tokens/s {run['train_tokens_per_s']:.0f} | "
          f"samples/s {run['samples_per_s']:.1f} | peak memory {run['peak_mem_gib']:.2f} GiB | padding "
          f"{run['padding_frac']:.1%} packed ({run['padding_frac_unpacked']:.1%} one sequence per row) | "
          f"completion tokens {run['completion_tokens_mean']:.1f}")
    median_alone = [statistics.median(x[i] for replay in replays for x in replay) for i in range(3)]
    print(f"alone (medians over the replayed steps): vLLM {median_alone[0]:.3f} s/batch, grader "
          f"{median_alone[1]:.3f} s/batch, trainer {median_alone[2]:.3f} s/batch")

    def overhead(parts):  # parts: which of (generate, grade, train) count as the limit
        each = [round_overhead(r, replay, parts) for r, replay in zip(runs, replays)]
        spread = ""
        if len(each) > 1:  # Student-t 95% interval of the mean over rounds, and the rounds ±2 points would take
            from scipy.stats import t as student_t
            t, sd = student_t.ppf(0.975, len(each) - 1), statistics.stdev(each)
            spread = f" ± {t * sd / len(each) ** 0.5:.1%} (±2 points: ~{math.ceil((t * sd / 0.02) ** 2)} rounds)"
        return f"{statistics.mean(each):.1%}{spread} (rounds: {', '.join(f'{x:.1%}' for x in each)})"
    same = [abs(a - b) < 1e-9 for result in results
            for a, b in zip(result["loop"]["step_tokens"], result["limits"]["replay_tokens"])]
    print(f"the replay sampled the loop's completions (the same mean length) on {sum(same)} of {len(same)} steps")
    print(f"overhead over vLLM + trainer alone: {overhead((0, 2))} over {len(runs)} round(s)")
    print(f"overhead over vLLM + grader + trainer alone, the loop's own bookkeeping: {overhead((0, 1, 2))}")
    # where it goes: loop minus replay, phase by phase, summed over the paired steps, as a share of the loop's time
    pairs = [(phases, step, alone) for r, replay in zip(runs, replays)
             for phases, step, alone in zip(r["step_phases"], r["step_s"], replay)]
    total = sum(step for _, step, _ in pairs)
    parts = {"generate": sum(p[0] - a[0] for p, _, a in pairs), "grade": sum(p[1] - a[1] for p, _, a in pairs),
             "train": sum(p[2] - a[2] for p, _, a in pairs), "weight sync": sum(p[3] for p, _, _ in pairs)}
    parts["the rest of the step"] = sum(step - sum(p) for p, step, _ in pairs)
    print("the overhead by phase (loop - replay, share of the loop's time): "
          + ", ".join(f"{name} {seconds / total:+.1%}" for name, seconds in parts.items()))
    if "train_1_thread" in lim:
        print(f"threads: torch has {lim['torch_threads']} beside vLLM's engine; the trainer alone on 1 thread takes "
              f"{lim['train_1_thread']:.3f} s/batch ({lim['train_1_thread'] / median_alone[2]:.2f}x)")
    for r in lim.get("padding", []):
        print(f"padding: {r['layout']:<32} {r['padding']:6.1%} padded, {r['calls']:4.1f} forward calls, "
              f"{r['seconds']:.3f} s/step forward + backward")
    for length in lengths:
        r = lim[length]
        print(f"length {length:>5} tokens: vLLM alone {r['generate']:.3f} s/batch, trainer alone {r['train']:.3f} "
              f"s/batch (mean completion {r['tokens']:.0f} tokens)")


if __name__ == "__main__":
    main()
