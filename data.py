"""Prompts, answers and graders; and the toy that lets `python train.py` run on a laptop with no download.

    python data.py                 # build the toy model (or find it cached) and print its folder

The toy (paper §2 in miniature): a generated verifiable task, a sum of 2-6 digits answered after a <think>
scratchpad of running sums, e.g.

    prompt      <|user|>Add: 7+5+9<|assistant|><think>
    completion  7+5=12 12+9=21 </think>\\boxed{21}<|endoftext|>

and a ~1M-parameter Qwen2 model with a byte-level BPE tokenizer (digits split one per token), both built
here, saved in Hugging Face format (so transformers and vLLM load them), and given a short supervised warm
start so RL starts from a low but non-zero pass rate, as the paper starts RL from an SFT model.
"""
import hashlib
import json
import os
import random
import shutil
import time
from functools import partial

THINK_START, THINK_END = "<think>", "</think>"
EOS = "<|endoftext|>"
# paper §4 (arXiv text); A.10 prints a variant without "now."
INTERRUPT_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"

# --- the toy task --------------------------------------------------------------------------------------------
# Difficulty knobs. The number of terms sets the scratchpad length (about 10 tokens per running sum), so
# completions vary 3x in length: the stragglers that PipelineRL is for (paper §3.1).
TOY_MIN_TERMS, TOY_MAX_TERMS = 2, 6
TOY_MAX_OPERAND = 9
TOY_NUM_TRAIN, TOY_NUM_VAL = 4000, 1000  # prompts; validation is held out and never trained on
TOY_SFT_STEPS, TOY_SFT_BATCH, TOY_SFT_LR = 300, 64, 2e-3  # supervised warm start (tuned for the base pass rate)
# The warm start imitates sloppy traces: each running sum is off by 1-3 with this probability (and later sums
# build on the slip), so the model learns the procedure but slips often, as an SFT model imitating imperfect
# reasoning does. RL then has something real to fix: the reward is only for the right final answer.
TOY_SFT_SLIP_RATE = 0.3


def toy_problem(rng: random.Random, slip_rate: float = 0.0) -> dict:
    """A sum of 2-6 terms; "solution" is a scratchpad of running sums, each slipping by 1-3 with slip_rate."""
    terms = [rng.randint(1, TOY_MAX_OPERAND) for _ in range(rng.randint(TOY_MIN_TERMS, TOY_MAX_TERMS))]
    steps, running = [], terms[0]
    for t in terms[1:]:
        result = running + t
        if rng.random() < slip_rate:
            result = max(0, result + rng.choice([-3, -2, -1, 1, 2, 3]))
        steps.append(f"{running}+{t}={result}")
        running = result
    return {"prompt": "Add: " + "+".join(map(str, terms)), "answer": str(sum(terms)),
            "solution": " ".join(steps) + f" {THINK_END}\\boxed{{{running}}}"}


def toy_rows(split: str) -> list[dict]:
    """Fixed prompts: the train and validation splits come from different seeds and share no prompt."""
    rng = random.Random({"train": 1, "val": 2}[split])
    n = TOY_NUM_TRAIN if split == "train" else TOY_NUM_VAL
    rows, seen = [], set()
    if split == "train":
        seen = {r["prompt"] for r in toy_rows("val")}
    while len(rows) < n:
        p = toy_problem(rng)
        if p["prompt"] not in seen:
            seen.add(p["prompt"])
            rows.append(p)
    return rows


# --- tasks: rows with prompt token ids, a held-out split, and a grader ------------------------------------------
class DataError(ValueError):
    """A dataset problem the user can fix: reported as one line naming the file and row."""


# Named datasets: where each lives on the Hub and which fields hold the prompt and the answer (one place).
# answer_after: the answer is the text after this marker; answer_boxed: the answer is the last \boxed{} of
# the field (a worked solution). eval: the evaluation set used when --eval_dataset is not given.
DATASETS = {
    "polaris": dict(path="POLARIS-Project/Polaris-Dataset-53K", split="train", prompt="problem", answer="answer"),
    "deepscaler": dict(path="agentica-org/DeepScaleR-Preview-Dataset", split="train", prompt="problem",
                       answer="answer"),
    "gsm8k": dict(path="openai/gsm8k", name="main", split="train", prompt="question", answer="answer",
                  answer_after="####", eval="gsm8k_test"),
    "math": dict(path="DigitalLearningGmbH/MATH-lighteval", split="train", prompt="problem", answer="solution",
                 answer_boxed=True, eval="math500"),
    # evaluation sets for --eval_dataset
    "gsm8k_test": dict(path="openai/gsm8k", name="main", split="test", prompt="question", answer="answer",
                       answer_after="####"),
    "math500": dict(path="HuggingFaceH4/MATH-500", split="test", prompt="problem", answer="answer"),
    "aime24": dict(path="HuggingFaceH4/aime_2024", split="train", prompt="problem", answer="answer"),
}
LOCAL_PROMPT_FIELDS, LOCAL_ANSWER_FIELDS = ("prompt", "problem", "question"), ("answer",)
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
NUM_HELD_OUT = 1000  # paper §2.1: 1,000 prompts held out at random for validation
HELD_OUT_SEED = 1234  # fixed, whatever --seed, so runs that differ in seed share one validation set


def _read(name: str) -> tuple[list[dict], dict]:
    """Rows of a named dataset or a local .jsonl/.parquet file, through `datasets`, and its field spec."""
    import datasets
    if name in DATASETS:
        spec = DATASETS[name]
        try:
            ds = datasets.load_dataset(spec["path"], spec.get("name"), split=spec["split"])
        except Exception as e:  # offline, not cached, moved: one line, not a traceback
            raise DataError(f"dataset {name!r} ({spec['path']}) could not be loaded from the Hugging Face Hub: it "
                            f"needs a download or a local cache ({type(e).__name__}: {str(e)[:200]})") from None
        return ds.to_list(), spec
    if not name.endswith((".jsonl", ".json", ".parquet")):
        raise DataError(f"--dataset {name!r}: not a named dataset ({', '.join(DATASETS)}, toy) or a .jsonl/.parquet file")
    if not os.path.isfile(name):
        raise DataError(f"--dataset {name}: no such file")
    try:
        ds = datasets.load_dataset("parquet" if name.endswith(".parquet") else "json", data_files=name, split="train")
    except Exception as e:
        raise DataError(f"{name}: cannot be read as {'parquet' if name.endswith('.parquet') else 'JSON lines'} "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    rows = ds.to_list()
    fields = set(ds.column_names)
    prompt = next((f for f in LOCAL_PROMPT_FIELDS if f in fields), None)
    answer = next((f for f in LOCAL_ANSWER_FIELDS if f in fields), None)
    if prompt is None or answer is None:
        raise DataError(f"{name}: rows need a prompt field ({'/'.join(LOCAL_PROMPT_FIELDS)}) and an 'answer' field; "
                        f"found {sorted(fields)}")
    return rows, {"prompt": prompt, "answer": answer}


def _rows(name: str) -> list[dict]:
    """{"prompt", "answer"} rows, checked: every row must have text in both fields."""
    raw, spec = _read(name)
    if not raw:
        raise DataError(f"{name}: the dataset is empty")
    rows = []
    for i, row in enumerate(raw):
        prompt, answer = row.get(spec["prompt"]), row.get(spec["answer"])
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        for field_name, value in ((spec["prompt"], prompt), (spec["answer"], answer)):
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{name}: row {i} has no text in field {field_name!r} (got {type(value).__name__})")
        if spec.get("answer_after"):
            answer = answer.rsplit(spec["answer_after"], 1)[-1]
        if spec.get("answer_boxed"):
            boxes = boxed_answers(answer, thinking=False)
            if not boxes:
                raise DataError(f"{name}: row {i} has no \\boxed{{}} answer in field {spec['answer']!r}")
            answer = boxes[-1]
        rows.append({"prompt": prompt, "answer": answer.strip().replace(",", "") if spec.get("answer_after") else answer.strip()})
    return rows


def load_task(cfg, tokenizer) -> tuple[list[dict], list[dict], callable]:
    """(train rows, eval rows, grade) for cfg.dataset. Rows are {"prompt", "answer", "prompt_ids"}; prompts
    longer than prompt_max_tokens are dropped. grade(completions, answers) -> rewards."""
    if cfg.dataset == "toy":
        train, val, grade = toy_rows("train"), toy_rows("val"), grade_toy
    else:
        train = _rows(cfg.dataset)
        eval_name = cfg.eval_dataset or DATASETS.get(cfg.dataset, {}).get("eval")
        if eval_name:
            val = _rows(eval_name)
        else:  # hold out validation prompts at random (paper §2.1)
            order = list(range(len(train)))
            random.Random(HELD_OUT_SEED).shuffle(order)
            held = set(order[:min(NUM_HELD_OUT, len(train) // 10)])
            train, val = [r for i, r in enumerate(train) if i not in held], [train[i] for i in sorted(held)]
        if not val:
            raise DataError(f"{cfg.dataset}: too few rows to hold out a validation split (use --eval_dataset)")
        if cfg.reward == "exact":  # plain tasks: the first line of the final answer must equal the answer
            grade = partial(grade_exact, thinking=prompt_opens_thinking(tokenizer))
        else:
            for r in train + val:
                r["prompt"] = f"{r['prompt']}\n{MATH_INSTRUCTION}"
            grade = MathGrader(cfg.grade_timeout_s, thinking=prompt_opens_thinking(tokenizer))
    for rows in (train, val):
        for r in rows:
            r["prompt_ids"] = format_prompt(tokenizer, r["prompt"])
    keep = lambda rows: [r for r in rows if len(r["prompt_ids"]) <= cfg.prompt_max_tokens]  # noqa: E731
    train, val = keep(train), keep(val)
    if not train:
        raise DataError(f"--dataset {cfg.dataset}: no training prompt fits in --prompt_max_tokens {cfg.prompt_max_tokens}")
    return train, val, grade


# --- graders: grade(completions, answers) -> rewards, +1 correct and -1 otherwise (paper A.3) ----------------------
def final_answer(completion: str, thinking: bool = True) -> str | None:
    """The answer a completion gives: the content of the \\boxed{} after the last </think> (several boxes must
    agree), or None. The thinking part is never graded (paper §2: answers are graded after stripping
    <think>...</think>); see boxed_answers for the rules."""
    boxes = boxed_answers(completion, thinking)
    return boxes[0] if boxes and len(set(boxes)) == 1 else None


def toy_reward(completion: str, answer: str) -> float:
    """Exact match of the final boxed answer (the toy's answers are integers)."""
    return 1.0 if final_answer(completion) == answer else -1.0


def grade_toy(completions: list[str], answers: list[str]) -> list[float]:
    return [toy_reward(c, a) for c, a in zip(completions, answers)]


def grade_exact(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """--reward exact: the first line of the final answer (after the last </think>), stripped, equals the answer."""
    def first_line(c: str) -> str | None:
        if THINK_END in c:
            c = c.rsplit(THINK_END, 1)[1]
        elif thinking or THINK_START in c:
            return None
        return c.strip().split("\n", 1)[0].strip()
    return [1.0 if first_line(c) == a.strip() else -1.0 for c, a in zip(completions, answers)]


MAX_ANSWER_CHARS = 1000  # a boxed answer longer than this is wrong without being parsed
WORKER_MEMORY_BYTES = 4 << 30  # address space of one grading worker
MAX_BOXES = 16  # more \boxed{} than this in one final answer is spam: wrong, and never scanned one by one


def boxed_answers(completion: str, thinking: bool) -> list[str] | None:
    """Every \\boxed{...} of the final answer, or None when there is no usable final answer: no answer part
    (the final answer is what follows the last </think>; a completion that opened thinking, in its prompt
    (`thinking`) or by writing <think>, and never closed it has none), more than MAX_BOXES boxes, or a box that
    does not close within MAX_ANSWER_CHARS. Work is bounded: str.count/find, then at most MAX_BOXES scans."""
    if THINK_END in completion:
        completion = completion.rsplit(THINK_END, 1)[1]
    elif thinking or THINK_START in completion:
        return None  # never stopped thinking: an answer inside the thinking part does not count
    if completion.count("\\boxed{") > MAX_BOXES:
        return None
    found, i = [], 0
    while (i := completion.find("\\boxed{", i)) != -1:
        depth, j = 1, i + len("\\boxed{")
        end = min(len(completion), j + MAX_ANSWER_CHARS + 1)
        while j < end and depth:
            depth += {"{": 1, "}": -1}.get(completion[j], 0)
            j += 1
        if depth:
            return None  # unclosed or too long: no half answers
        found.append(completion[i + len("\\boxed{"):j - 1].strip())
        i += 1
    return found


# The worker: math-verify in a child process that reads one JSON request per line and answers "1" or "0".
# A separate process because math-verify's timeouts are signal based (main thread only) and some sympy work
# (9^9^9^9) sits in C code that no signal interrupts: the parent enforces the deadline by killing the worker.
# Predictions are parsed as LaTeX only: math-verify's plain-expression path calls sympy's parse_expr, which
# uses eval; gold answers come from the dataset and are trusted.
_WORKER = r"""
import json, logging, os, sys
logging.disable(logging.CRITICAL)
from functools import lru_cache
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
latex_only = [LatexExtractionConfig(boxed_match_priority=0)]
# gold answers (trusted) are bare LaTeX or plain numbers: read as if boxed, LaTeX first, then expressions
gold = lru_cache(maxsize=4096)(lambda a: parse("\\boxed{" + a + "}", parsing_timeout=None,
                                               extraction_config=[*latex_only, ExprExtractionConfig()]))
print("ready", flush=True)
for line in sys.stdin:
    ok, rid = False, None
    try:
        req = json.loads(line)
        rid = req["id"]
        pred = parse("\\boxed{" + req["content"] + "}", extraction_config=latex_only, parsing_timeout=None)
        ok = bool(pred) and bool(verify(gold(req["answer"]), pred, timeout_seconds=None))
    except BaseException:
        pass
    print(f"{rid} {int(ok)}", flush=True)
"""


class MathGrader:
    """math-verify on untrusted completions, each bounded by timeout_s seconds of wall clock, in a few
    worker processes (usable from any thread). A worker that misses its deadline is killed and replaced; its
    completion gets the incorrect reward. Workers' stderr goes to /dev/null: math-verify prints the entire
    offending input on a timeout. Rules, in the parent, before any parsing (boxed_answers): no answer part or
    no \\boxed{} -> incorrect; several \\boxed{} with different contents -> incorrect (no hedging); a box longer
    than MAX_ANSWER_CHARS, unclosed, or more than MAX_BOXES boxes -> incorrect."""

    def __init__(self, timeout_s: float = 1.0, num_workers: int = 0, thinking: bool = True):
        import tempfile
        self.timeout_s, self.thinking = timeout_s, thinking
        self.workdir = tempfile.mkdtemp(prefix="grader-")  # the workers' cwd: nothing lands in the project
        self.workers = [self._spawn() for _ in range(num_workers or max(1, min(4, os.cpu_count() or 1)))]
        self.killed = 0  # workers replaced after a missed deadline

    def _spawn(self):
        import subprocess
        import sys
        import resource

        def limit_memory():  # a sympy blow-up must not take the trainer's memory with it
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
        proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=self.workdir, text=True, bufsize=1,
                                preexec_fn=limit_memory)
        return {"proc": proc, "ready": False}

    def _take(self, k: int):
        """Worker k, restarted if it died, once it has imported math-verify (start-up is not graded time)."""
        import select
        w = self.workers[k]
        if w["proc"].poll() is not None:
            self.workers[k] = w = self._spawn()
        if not w["ready"]:
            ok, _, _ = select.select([w["proc"].stdout], [], [], 120)
            if not ok or w["proc"].stdout.readline().strip() != "ready":
                raise RuntimeError("a math-verify grading worker failed to start (is math-verify installed?)")
            w["ready"] = True
        return w["proc"]

    def __call__(self, completions: list[str], answers: list[str]) -> list[float]:
        import select
        rewards, todo = [-1.0] * len(completions), []
        for n, (completion, answer) in enumerate(zip(completions, answers)):
            completion = completion.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become "?"
            content = final_answer(completion, self.thinking)
            if content is not None:
                todo.append((n, json.dumps({"id": n, "content": content, "answer": str(answer)})))
        busy = {}  # worker index -> (item index, deadline)
        while todo or busy:
            for k in range(len(self.workers)):
                if k not in busy and todo:
                    n, request = todo.pop()
                    try:
                        self._take(k).stdin.write(request + "\n")
                    except BrokenPipeError:  # it died since it was last seen: a fresh one, and this item again
                        self.workers[k] = self._spawn()
                        todo.append((n, request))
                        continue
                    busy[k] = (n, time.monotonic() + self.timeout_s)
            wait = max(0.0, min(deadline for _, deadline in busy.values()) - time.monotonic())
            readable, _, _ = select.select([self.workers[k]["proc"].stdout for k in busy], [], [], wait)
            for k, (n, deadline) in list(busy.items()):
                proc = self.workers[k]["proc"]
                if proc.stdout in readable:
                    answer_line = proc.stdout.readline().split()
                    rewards[n] = 1.0 if answer_line == [str(n), "1"] else -1.0  # its own answer, or nothing
                    if answer_line[:1] != [str(n)]:  # out of step (or dead): never trust this worker again
                        proc.kill()
                        proc.wait()
                        self.workers[k] = self._spawn()
                    del busy[k]
                elif time.monotonic() >= deadline:  # over its time: incorrect, and a fresh worker
                    proc.kill()
                    proc.wait()
                    self.workers[k] = self._spawn()
                    self.killed += 1
                    del busy[k]
        return rewards

    def close(self):
        for w in self.workers:
            w["proc"].kill()
            w["proc"].wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_default_grader = None


def math_reward(completion: str, answer: str) -> float:
    """Grade one completion with math-verify against a trusted answer: +1 or -1, within about a second."""
    global _default_grader
    if _default_grader is None:
        import atexit
        _default_grader = MathGrader()
        atexit.register(_default_grader.close)
    return _default_grader([completion], [answer])[0]


# --- which prompt next: epochs, and No-Positive-Resampling ------------------------------------------------------
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
    the number of ranks. All state is plain data: checkpoints restore the exact data order and curriculum."""

    def __init__(self, rows: list[dict], seed: int, npr: bool, npr_threshold: float):
        self.rows, self.seed, self.npr, self.npr_threshold = rows, seed, npr, npr_threshold
        self.epoch, self.pos, self.serial = 0, 0, 0
        self.requeued: list[int] = []  # prompts drawn but never trained on (see Rollouts.pending): served first
        self.last_pass_rate: dict[int, float] = {}
        self.retired: set[int] = set()
        self.order = self._order()

    def _order(self) -> list[int]:
        order = [i for i in range(len(self.rows)) if i not in self.retired]
        if not order:
            raise RuntimeError(f"No-Positive-Resampling retired all {len(self.rows)} training prompts: "
                               "the policy solves the whole training set (use --no_npr to keep sampling them)")
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
        self.last_pass_rate[prompt_idx] = pass_rate
        if self.npr and pass_rate >= self.npr_threshold:
            self.retired.add(prompt_idx)

    def state_dict(self, pending: list[int] = ()) -> dict:
        """pending: prompts drawn but not trained on yet; they come first after a resume."""
        return {"epoch": self.epoch, "pos": self.pos, "serial": self.serial, "order": self.order,
                "requeued": list(pending) + self.requeued, "retired": sorted(self.retired),
                "last_pass_rate": {str(k): v for k, v in self.last_pass_rate.items()}}

    def load_state_dict(self, state: dict):
        self.epoch, self.pos, self.serial = state["epoch"], state["pos"], state["serial"]
        self.order, self.requeued = list(state["order"]), list(state["requeued"])
        self.retired = set(state["retired"])
        self.last_pass_rate = {int(k): v for k, v in state["last_pass_rate"].items()}


# --- the toy tokenizer and model -----------------------------------------------------------------------------
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|><think>{% endif %}")
TOY_TIED = False
TOY_MODEL = dict(vocab_size=384, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def build_toy_tokenizer():
    """Byte-level BPE trained on toy text, the interruption phrase and the chat roles, so any input string
    encodes (bytes never fail) while the phrase costs ~19 tokens instead of 80 characters."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(0)
    corpus = [f"<|user|>{p['prompt']}<|assistant|><think>{p['solution']}" for p in (toy_problem(rng) for _ in range(2000))]
    corpus += [INTERRUPT_PHRASE, "Please reason step by step, and put your final answer within \\boxed{}."] * 100
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOY_MODEL["vocab_size"] - 8, show_progress=False,
                                  special_tokens=[EOS, "<|user|>", "<|assistant|>", "<|system|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    # <think> and </think> are ordinary added tokens (as in Qwen3): kept when decoding, one id each
    tok.add_tokens([AddedToken(THINK_START, normalized=False), AddedToken(THINK_END, normalized=False)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    hf.chat_template = CHAT_TEMPLATE
    assert len(hf) <= TOY_MODEL["vocab_size"], len(hf)
    return hf


def format_prompt(tokenizer, question: str) -> list[int]:
    """Token ids of the prompt: the tokenizer's chat template with its generation prompt, in thinking mode where
    the template has one (Qwen3's enable_thinking); plain text for tokenizers without a template."""
    if not tokenizer.chat_template:
        return tokenizer(question, add_special_tokens=True)["input_ids"]
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_opens_thinking(tokenizer) -> bool:
    """Whether the formatted prompt itself opens the thinking block (the completion then starts inside it)."""
    return tokenizer.decode(format_prompt(tokenizer, "x")).rstrip().endswith(THINK_START)


def _toy_spec_hash() -> str:
    spec = dict(TOY_MODEL, tied=TOY_TIED, terms=(TOY_MIN_TERMS, TOY_MAX_TERMS, TOY_MAX_OPERAND), sft=(TOY_SFT_STEPS, TOY_SFT_BATCH,
                TOY_SFT_LR, TOY_SFT_SLIP_RATE), template=CHAT_TEMPLATE, phrase=INTERRUPT_PHRASE, version=1)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def toy_model_path(out_dir: str) -> str:
    return os.path.join(out_dir, f"toy-{_toy_spec_hash()}")


def build_toy_model(out_dir: str, log=print) -> str:
    """Build, warm-start and save the toy model once; later calls return the cached folder. Written to a
    temporary folder and renamed, so a crash never leaves a half-written model that looks complete."""
    path = toy_model_path(out_dir)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    t0 = time.time()
    tokenizer = build_toy_tokenizer()
    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TOY_MODEL, tie_word_embeddings=TOY_TIED, bos_token_id=eos, eos_token_id=eos,
                                         pad_token_id=eos, rope_theta=10000.0))
    # supervised warm start on fresh draws of the task distribution (never the validation prompts' seed)
    rng = random.Random(3)
    opt = torch.optim.AdamW(model.parameters(), lr=TOY_SFT_LR, weight_decay=0.0)
    model.train()
    for step in range(TOY_SFT_STEPS):
        seqs, masks = [], []
        for _ in range(TOY_SFT_BATCH):
            p = toy_problem(rng, TOY_SFT_SLIP_RATE)
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


if __name__ == "__main__":
    print(build_toy_model("out"))
