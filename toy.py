"""The toy: a generated verifiable task, its tokenizer, and a tiny warm-started model, so that `python train.py`
runs the whole loop on a laptop CPU with no download.

    python toy.py                  # the toy model's folder (the shipped warm start, verified)
    python toy.py --accuracy       # ... and its accuracy by number of terms, with no thinking budget
    python toy.py --build          # rebuild it from the teacher: is this machine's build the shipped one?

The task (paper §2 in miniature): a sum of 3 to 9 single-digit terms answered after a <think> scratchpad of
running sums, under a thinking budget that fits every sum's scratchpad, e.g.

    prompt      <|user|>Add: 7+5+9<|assistant|><think>
    completion  7+5=12 12+9=21 </think>\\boxed{21}<|endoftext|>

The model is a ~1M-parameter Qwen2 with a byte-level BPE tokenizer (digits split one per token), both built
here, saved in Hugging Face format (so transformers and vLLM load them), and given a short supervised warm
start from a teacher that slips more the larger its running sum, so RL starts from a pass rate that falls with the
number of terms, as the paper starts RL from an SFT model, and learns not to slip: on long sums, from rare successes.
"""
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time

from rewards import EOS, INTERRUPT_PHRASE, MATH_INSTRUCTION, THINK_END, THINK_START, final_answer, format_prompt

# --- the task ---------------------------------------------------------------------------------------------------
# A ladder of difficulty (paper §2: a pass rate that RL raises over a decade of compute). A problem has 3 to 9 terms,
# as many of each; the concise scratchpad costs 7-8 tokens a step ("12+9=21 ", digits one token each), so 3 terms
# need ~15 thinking tokens and 9 terms ~62. The toy's thinking budget (config.TOY: 72-80 tokens, then the forced
# "time is up" phrase and 7 answer tokens, room for \\boxed{NN} and EOS only) fits every scratchpad, so it cuts only
# stragglers and the ceiling A is what RL learns, not what the budget allows (version 2's 40-48 tokens capped A:
# docs/study-v2.md). Completions vary several-fold in length: the stragglers that PipelineRL is for (§3.1).
TOY_TERMS = (3, 9)
TOY_MAX_OPERAND = 9
# prompts of each length; validation (as many of each length) is held out and never trained on. The training pool is
# large enough that No-Positive-Resampling cannot exhaust it in a long run: 2,000 of each length but 3 terms, which
# has only 729 distinct sums (half of them, 364). A default run (500 steps x 16 prompts) draws 8,000 of the 12,364.
# Version 3's 3,500 ran out at step ~615 of a run resumed past 500 (docs/study.md).
TOY_TRAIN_PER_LENGTH, TOY_NUM_VAL = 2000, 1000
TOY_SFT_STEPS, TOY_SFT_BATCH, TOY_SFT_LR = 600, 64, 2e-3  # supervised warm start
# What RL learns, and why A is set by learning (docs/study.md). The warm start imitates a sloppy teacher whose running
# sums slip by 1-3 the more often the larger they are: 5% below 20, 50% from 20 and 80% from 40. Short sums never
# reach 20 and long ones end above 40, so the skill RL must find (adding to a large running sum) shows only in long
# sums, where the warm start rarely succeeds: as its teacher, 0.81 on 3 terms, 0.13 on 9 (`python toy.py
# --accuracy`; some slips cancel). RL learns it from the successes it samples, so how far it gets in a run depends
# on how many it finds and how well it learns from them. TOY_SFT_CHECK_RATE (each step checked by its inverse
# subtraction, 12-16 tokens a step) is a knob for a verbose teacher.
TOY_SFT_SLIP = ((0, 0.05), (20, 0.5), (40, 0.8))
TOY_SFT_CHECK_RATE = 0.0
# Version 5's pilot (`--model toy-carry`, docs/study.md): the toy's architecture warm-started from a teacher that
# never slips at random but forgets the carry, writing result - 10, when a step's result enters a new decade: with
# rate 0.3 into the 20s, 0.8 into the 30s, 0.97 into the 40s, 0.995 from 50. The slip is one-directional, so it
# never cancels, and from 30 the wrong digit is the warm start's mode: each decade's carry is a skill RL must
# discover from rare successes (sums in the 40s: ~3e-3 a sample; from 50: ~2e-5), and a decade never discovered
# caps the run's A (docs/carry_prob.py measures what a policy puts on each carry).
TEACHERS = {"toy-carry": (((0, 0.0),), ((20, 0.3), (30, 0.8), (40, 0.97), (50, 0.995)))}  # (slip, carry)


def toy_problem(rng: random.Random, slip: tuple = ((0, 0.0),), check_rate: float = 0.0, carry: tuple = ()) -> dict:
    """A sum of 3-9 single-digit terms; "solution" is a scratchpad of running sums, each slipping by 1-3 with the
    probability slip gives it, pairs (running sum from, rate), e.g. ((0, 0.05), (20, 0.5)): 0.05 below 20, 0.5
    from 20; a step whose result enters a new decade instead forgets the carry (-10) with the rate carry gives it,
    pairs (result from, rate); and with probability check_rate each step checked by its inverse subtraction."""
    n = rng.randint(*TOY_TERMS)
    terms = [rng.randint(1, TOY_MAX_OPERAND) for _ in range(n)]
    steps, running = [], terms[0]
    check = rng.random() < check_rate  # drawn for every problem, so the splits do not depend on check_rate
    for t in terms[1:]:
        result, u = running + t, rng.random()  # one draw a step, so the splits do not depend on the teacher
        forget = [rate for start, rate in carry if result >= start]
        if forget and result // 10 > running // 10:
            result -= 10 * (u < forget[-1])
        elif u < [rate for start, rate in slip if running >= start][-1]:
            result = max(0, result + rng.choice([-3, -2, -1, 1, 2, 3]))
        steps.append(f"{running}+{t}={result}" + (f" {result}-{t}={running}" if check else ""))
        running = result
    return {"prompt": "Add: " + "+".join(map(str, terms)), "answer": str(sum(terms)),
            "solution": " ".join(steps) + f" {THINK_END}\\boxed{{{running}}}"}


def num_terms(prompt: str) -> int:
    return prompt.count("+") + 1


def toy_quota(split: str) -> dict[int, int]:
    """Prompts of each number of terms in a split: validation TOY_NUM_VAL spread evenly, training
    TOY_TRAIN_PER_LENGTH of each length, at most half the distinct sums of that length."""
    lengths = range(TOY_TERMS[0], TOY_TERMS[1] + 1)
    if split == "val":
        return {k: TOY_NUM_VAL // len(lengths) + (i < TOY_NUM_VAL % len(lengths)) for i, k in enumerate(lengths)}
    return {k: min(TOY_TRAIN_PER_LENGTH, TOY_MAX_OPERAND ** k // 2) for k in lengths}


def toy_rows(split: str) -> list[dict]:
    """Fixed, unique prompts: the train and validation splits come from different seeds and share no prompt, and
    each holds toy_quota's number of each length (a duplicate is redrawn within its length)."""
    rng = random.Random({"train": 1, "val": 2}[split])
    quota = toy_quota(split)
    n = sum(quota.values())
    rows, seen = [], set()
    if split == "train":
        seen = {r["prompt"] for r in toy_rows("val")}
    while len(rows) < n:
        p = toy_problem(rng)
        if p["prompt"] not in seen and quota[num_terms(p["prompt"])] > 0:
            seen.add(p["prompt"])
            quota[num_terms(p["prompt"])] -= 1
            rows.append(p)
    return rows


# --- the toy tokenizer and model -----------------------------------------------------------------------------
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|><think>{% endif %}")
# The toy models by name (`--model toy-s|toy|toy-l`): the model-size axis of the paper (§5) in miniature.
# Same tokenizer, task and warm-start recipe (the TOY_SFT_* above, each model its own build); head size 32
# throughout (vLLM's CPU attention takes 32 and up). toy-s is half the toy's width (0.30M parameters against 1.08M;
# its warm start builds in about 2 minutes on one core), toy-l twice the width and 1.5x the depth (6.1M; its warm
# start takes 16 minutes on 2 threads of a 2-core Zen 4).
MODELS = {
    "toy-s": dict(vocab_size=384, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512),
    "toy": dict(vocab_size=384, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    "toy-l": dict(vocab_size=384, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512),
}
MODELS["toy-carry"] = MODELS["toy"]  # the toy, warm-started from TEACHERS["toy-carry"]
VOCAB_SIZE = 384  # every entry of MODELS has it: the tokenizer is shared


def build_toy_tokenizer():
    """Byte-level BPE trained on toy text, the interruption phrase and the chat roles, so any input string
    encodes (bytes never fail) while the phrase costs ~19 tokens instead of 80 characters."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(0)
    problems = [toy_problem(rng, check_rate=0.5) for _ in range(2000)]
    corpus = [f"<|user|>{p['prompt']}<|assistant|><think>{p['solution']}" for p in problems]
    corpus += [INTERRUPT_PHRASE, MATH_INSTRUCTION] * 100
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 8, show_progress=False,
                                  special_tokens=[EOS, "<|user|>", "<|assistant|>", "<|system|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    # <think> and </think> are ordinary added tokens (as in Qwen3): kept when decoding, one id each
    tok.add_tokens([AddedToken(THINK_START, normalized=False), AddedToken(THINK_END, normalized=False)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    hf.chat_template = CHAT_TEMPLATE
    assert len(hf) <= VOCAB_SIZE, len(hf)
    return hf


def _toy_spec_hash(name: str) -> str:
    spec = dict(MODELS[name], tied=False, terms=(TOY_TERMS, TOY_MAX_OPERAND),
                sft=(TOY_SFT_STEPS, TOY_SFT_BATCH, TOY_SFT_LR, TOY_SFT_SLIP, TOY_SFT_CHECK_RATE),
                template=CHAT_TEMPLATE, phrase=INTERRUPT_PHRASE, version=3)
    if name in TEACHERS:
        spec.update(teacher=TEACHERS[name], version=5)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def toy_model_path(out_dir: str, name: str = "toy") -> str:
    return os.path.join(out_dir, f"{name}-{_toy_spec_hash(name)}")


# One warm start for every x86 machine. Left to choose, PyTorch, MKL and oneDNN run AVX512 kernels where the CPU
# has them, which round differently from AVX2 ones; over hundreds of warm-start steps that grows into another warm
# start, and RL from the two differs (docs/study-v1.md). So the warm start is built in a child process whose kernels are
# held to AVX2, which every x86-64 CPU of the last decade has; the thread count changes nothing (measured: 1 and
# 2 threads, the same weights). MKL_CBWR asks MKL for the same results on Intel and AMD CPUs; even so an Intel Xeon
# and an AMD EPYC built different weights, hence the shipped one below. Only the warm start is held: training and
# generation use the machine's fastest kernels.
REFERENCE_ISA_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_CBWR": "AVX2"}
# The reference warm start ships with the code (warm_start/, 4.3 MB), so every machine trains from the same weights
# and the first run builds nothing. Its sha256 is checked on every load: a damaged or edited file is refused, never
# trained from. It is the build of the 2-core AMD EPYC (Zen 4) this project measures on (torch 2.13.0+cpu,
# transformers 5.19.0, kernels held to AVX2); a 2-core Intel Xeon with AVX512-BF16 built another under the same
# hold (version 2's 1f3a91a9..., the start of docs/study-v2.md's tables). `python toy.py --build` rebuilds it from
# the teacher and says whether this machine's build equals the shipped one. toy-s and toy-l are built on first use.
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_start")
REFERENCE_SHA256 = {"toy": "91fd0515de0ac63f113f36687cbdb2e739384a0867d4057086375773316c5b33"}


def reference_isa_env() -> dict:
    """The environment the warm start is built in: REFERENCE_ISA_ENV on x86-64, nothing added elsewhere."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return dict(os.environ, **REFERENCE_ISA_ENV) if x86 else dict(os.environ)


def shipped_model(name: str = "toy") -> str | None:
    """The shipped warm start of this toy's current spec, verified by its sha256; None when none ships (another
    toy, or a spec changed since the weights were built). ValueError, one line, when the file fails its check."""
    path = toy_model_path(SHIPPED_DIR, name)
    if name not in REFERENCE_SHA256 or not os.path.exists(os.path.join(path, "config.json")):
        return None
    from checkpoint import file_sha256
    try:
        got = file_sha256(os.path.join(path, "model.safetensors"))
    except OSError as e:
        got = f"unreadable ({e.strerror})"
    if got != REFERENCE_SHA256[name]:
        raise ValueError(f"the shipped warm start {path}/model.safetensors fails its sha256 check ({got[:16]}... "
                         f"against {REFERENCE_SHA256[name][:16]}...): restore it with `git checkout -- warm_start` "
                         f"(a Git LFS pointer or an edited file is not the model)")
    return path


def build_toy_model(out_dir: str, name: str = "toy", log=print, shipped: bool = True) -> str:
    """The toy's warm start: the shipped one (verified) if this spec ships one, else built once into out_dir in a
    child process held to AVX2 kernels (above) and cached there; says when the weights are not the reference."""
    if shipped and (path := shipped_model(name)):
        return path
    path = toy_model_path(out_dir, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--build_here", "--model", name,
                               "--out_dir", out_dir], env=reference_isa_env())
        if done.returncode != 0 or not os.path.exists(os.path.join(path, "config.json")):
            raise RuntimeError(f"building the toy model {name} in {out_dir} failed (exit {done.returncode})")
    from checkpoint import file_sha256
    reference, built = REFERENCE_SHA256.get(name), file_sha256(os.path.join(path, "model.safetensors"))
    if reference and built != reference:
        log(f"note: the toy warm start in {path} (sha256 {built[:8]}...) is not the reference build "
            f"({reference[:8]}...): another CPU architecture or torch. It trains, but from another start than the "
            f"README's runs")
    return path


def build_here(out_dir: str, name: str = "toy", log=print) -> str:
    """Build, warm-start and save the toy model with this process's kernels (build_toy_model runs this in a child
    held to AVX2). Written to a temporary folder and renamed, so a crash never leaves a half-written model that
    looks complete."""
    path = toy_model_path(out_dir, name)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    t0 = time.time()
    tokenizer = build_toy_tokenizer()
    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**MODELS[name], tie_word_embeddings=False, bos_token_id=eos, eos_token_id=eos,
                                         pad_token_id=eos, rope_theta=10000.0))
    # supervised warm start on fresh draws of the task distribution (never the validation prompts' seed)
    rng = random.Random(3)
    slip, carry = TEACHERS.get(name, (TOY_SFT_SLIP, ()))
    opt = torch.optim.AdamW(model.parameters(), lr=TOY_SFT_LR, weight_decay=0.0)
    model.train()
    for step in range(TOY_SFT_STEPS):
        seqs, masks = [], []
        for _ in range(TOY_SFT_BATCH):
            p = toy_problem(rng, slip, TOY_SFT_CHECK_RATE, carry)
            prompt = format_prompt(tokenizer, p["prompt"])
            target = tokenizer(p["solution"], add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(prompt + target)
            masks.append([0] * len(prompt) + [1] * len(target))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [eos] * (width - len(s)) for s in seqs])
        labels = torch.tensor([[t if m else -100 for t, m in zip(s, mk)] + [-100] * (width - len(s))
                               for s, mk in zip(seqs, masks)])
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])  # right padding
        for g in opt.param_groups:  # linear warm-up then linear decay
            g["lr"] = TOY_SFT_LR * min(1.0, (step + 1) / 20) * (1 - step / TOY_SFT_STEPS)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == TOY_SFT_STEPS - 1:
            log(f"toy warm start: step {step}/{TOY_SFT_STEPS} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, path)
    except OSError:  # another process finished first: theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"toy model saved to {path} ({sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{time.time() - t0:.0f}s)")
    return path


def warm_start_accuracy(path: str, num_prompts: int = 70, samples: int = 4) -> dict:
    """{number of terms: share of correct answers} of the model at `path` on the first num_prompts validation
    problems of each length, sampled at temperature 1 with no thinking budget: what the policy knows before RL
    (toy.py: about (1 - slip)^(n-1) for the default warm start)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    result, val = {}, toy_rows("val")
    for n in range(TOY_TERMS[0], TOY_TERMS[1] + 1):
        rows = [r for r in val if num_terms(r["prompt"]) == n][:num_prompts]
        prompts = [format_prompt(tokenizer, r["prompt"]) for r in rows]
        width = max(map(len, prompts))  # left padding: every row's next token is at the same position
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():  # room for a 9-term solution (~62 thinking tokens) and its answer
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 max_new_tokens=90, num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, width:])
        answers = [r["answer"] for r in rows for _ in range(samples)]
        result[n] = sum(final_answer(t) == a for t, a in zip(texts, answers)) / len(texts)
    return result


def terms(prompt: str) -> list[int]:
    """The terms of a toy prompt, bare ("Add: 7+5+9") or chat-formatted."""
    return list(map(int, prompt.split("Add: ")[-1].split("<")[0].split("+")))


def decade(prompt: str) -> int:
    """The sum's decade (10-19: 1): the highest a scratchpad enters, as running sums never fall (toy-carry's)."""
    return sum(terms(prompt)) // 10


def by_terms(path: str, key=num_terms) -> dict:
    """{number of terms, or another key of the prompt: (share correct, completions)} of an evaluate.py completions
    file (JSON lines with "prompt" and "reward"): what RL learned, family by family. ValueError, one line, for a file
    that is not one."""
    counts = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                n, right = key(row["prompt"]), row["reward"] > 0
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ValueError(f"{path}:{i} is not a line of evaluate.py's completions") from None
            counts.setdefault(n, []).append(right)
    return {n: (sum(c) / len(c), len(c)) for n, c in sorted(counts.items())}


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Print the toy model's folder: the shipped warm start, verified, or "
                                 "one built and cached.")
    ap.add_argument("--model", default="toy", choices=list(MODELS), help="which toy (default: toy)")
    ap.add_argument("--out_dir", default="out", help="where models are cached (default: out)")
    ap.add_argument("--accuracy", action="store_true", help="also print its accuracy by number of terms, no budget")
    ap.add_argument("--build", action="store_true", help="rebuild the warm start from the teacher into --out_dir "
                    "(held to AVX2, minutes) and say whether it equals the shipped one")
    ap.add_argument("--by_terms", nargs="+", metavar="JSONL", help="print the pass rate by number of terms of "
                    "evaluate.py completion files (e.g. docs/logs/study-v3/evals/*.jsonl) and exit")
    ap.add_argument("--by_decade", action="store_true", help="with --by_terms: by the decade of the sum instead")
    ap.add_argument("--build_here", action="store_true", help="build in this process with its own kernels "
                    "(what build_toy_model runs in a child held to AVX2)")
    args = ap.parse_args()
    if args.by_decade and not args.by_terms:
        ap.error("--by_decade goes with --by_terms FILE ...")
    if args.by_terms:
        for file in args.by_terms:
            try:
                shares = by_terms(file, decade if args.by_decade else num_terms).items()
                label = (lambda n: f"sum {10 * n}-{10 * n + 9}") if args.by_decade else (lambda n: f"{n} terms")
                print(file + ": " + " ".join(f"{label(n)} {acc:.3f} ({k})" for n, (acc, k) in shares))
            except OSError as e:
                sys.exit(f"error: {file}: {e.strerror}")
            except ValueError as e:
                sys.exit(f"error: {e}")
        sys.exit(0)
    if args.build_here:
        build_here(args.out_dir, args.model, log=lambda line: print(line, flush=True))  # a parent may log to a file
        sys.exit(0)
    try:
        if args.build:
            shutil.rmtree(toy_model_path(args.out_dir, args.model), ignore_errors=True)
        path = build_toy_model(args.out_dir, args.model, shipped=not args.build, log=lambda line: None)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    print(path)
    if args.build:
        from checkpoint import file_sha256
        built, ref = file_sha256(os.path.join(path, "model.safetensors")), REFERENCE_SHA256.get(args.model)
        print(f"sha256 {built}: " + ("no reference build of this toy" if not ref else
              "equals the shipped warm start" if built == ref else f"not the shipped warm start ({ref[:16]}...)"))
    if args.accuracy:
        print(" ".join(f"{n} terms {acc:.3f}" for n, acc in warm_start_accuracy(path).items()))
