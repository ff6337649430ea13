"""Prompts, answers and graders: named and local datasets, the held-out split, and the reward.

    from data import load_task        # (train rows, eval rows, grade) for --dataset

DATASETS is the one table of named datasets (a fork adds one there); local .jsonl/.parquet files work by
field name. Graders return +1 correct and -1 otherwise (paper A.3) and treat model output as untrusted:
math-verify runs in worker processes killed at a deadline, and nothing is ever evaluated.
"""
import json
import os
import random
import shutil
import signal
import time
from functools import partial

THINK_START, THINK_END = "<think>", "</think>"
EOS = "<|endoftext|>"
# paper §4 (arXiv text); A.10 prints a variant without "now."
INTERRUPT_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception as "Type: first line of its message", for the one-line errors users see."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:limit] if str(e) else ''}"


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


def box_rows() -> list[dict]:
    """A generated task for small real chat models (the README's SmolLM2 recipe): 1,000 prompts, most of which show
    the answer in the required form ("Put the number 38 in a box like this: \\boxed{38}"), the rest (all 81
    one-digit sums, three phrasings) ask for a sum in that form. SmolLM2-135M-Instruct at temperature 1 gets ~9%
    of the first kind and ~0% of the second right (measured): RL has a signal to learn the answer format from,
    and then sums in it. Graded by grade_boxed_exact: the box must hold the number."""
    asks = ("What is {a} + {b}? Answer like this: \\boxed{{number}}", "Add {a} and {b}. Write the result as "
            "\\boxed{{number}}", "Compute {a} + {b} and put it in \\boxed{{}}")
    rows = [{"prompt": ask.format(a=a, b=b), "answer": str(a + b)} for ask in asks for a in range(1, 10)
            for b in range(1, 10)]
    numbers = random.Random(0).sample(range(10, 1000), 1000 - len(rows))
    rows += [{"prompt": f"Put the number {n} in a box like this: \\boxed{{{n}}}", "answer": str(n)} for n in numbers]
    random.Random(1).shuffle(rows)
    return rows


GENERATED = {"box": box_rows}  # named tasks the project writes itself (no download); a fork adds one here
LOCAL_PROMPT_FIELDS, LOCAL_ANSWER_FIELDS = ("prompt", "problem", "question"), ("answer",)
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
NUM_HELD_OUT = 1000  # paper §2.1: 1,000 prompts held out at random for validation
HELD_OUT_SEED = 1234  # fixed, whatever --seed, so runs that differ in seed share one validation set


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers within timeout_s; offline, `datasets` would retry for tens of seconds."""
    import socket
    from urllib.parse import urlparse
    from huggingface_hub import constants
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct connection says nothing: let `datasets` try through it
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)),
                                 timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _read(name: str, flag: str = "--dataset") -> tuple[list[dict], dict]:
    """Rows of a named dataset or a local .jsonl/.parquet file, through `datasets`, and its field spec."""
    import datasets
    datasets.disable_progress_bars()  # its progress and retry chatter would bury the one error line
    datasets.logging.set_verbosity_error()
    if name in DATASETS:
        spec = DATASETS[name]
        if not datasets.config.HF_HUB_OFFLINE and not _hub_reachable():
            datasets.config.HF_HUB_OFFLINE = True  # the local cache or nothing, at once
        try:
            ds = datasets.load_dataset(spec["path"], spec.get("name"), split=spec["split"])
            return ds.to_list(), spec
        except Exception as e:  # offline, not cached, moved: one line, not a traceback
            where = "the local cache (the Hub is not reachable)" if datasets.config.HF_HUB_OFFLINE else "the Hub"
            raise DataError(f"{flag} {name} ({spec['path']}) could not be loaded from {where}: it needs a download "
                            f"or a local cache ({one_line(e)})"
                            ) from None
    if not name.endswith((".jsonl", ".json", ".parquet")):
        raise DataError(f"{flag} {name!r}: not a named dataset ({', '.join([*DATASETS, *GENERATED])}, toy) or a .jsonl/.parquet file")
    if not os.path.isfile(name):
        raise DataError(f"{flag} {name}: no such file" + (" (it is a directory)" if os.path.isdir(name) else ""))
    kind = "parquet" if name.endswith(".parquet") else "JSON lines"
    try:
        ds = datasets.load_dataset("parquet" if kind == "parquet" else "json", data_files=name, split="train")
        rows = ds.to_list()  # text is decoded here: bad UTF-8 fails here
    except Exception as e:
        raise DataError(f"{flag} {name}: cannot be read as {kind} "
                        f"({one_line(e)})") from None
    fields = set(ds.column_names)
    prompt = next((f for f in LOCAL_PROMPT_FIELDS if f in fields), None)
    answer = next((f for f in LOCAL_ANSWER_FIELDS if f in fields), None)
    if prompt is None or answer is None:
        raise DataError(f"{name}: rows need a prompt field ({'/'.join(LOCAL_PROMPT_FIELDS)}) and an 'answer' field; "
                        f"found {sorted(fields)}")
    return rows, {"prompt": prompt, "answer": answer}


def _rows(name: str, flag: str = "--dataset") -> list[dict]:
    """{"prompt", "answer"} rows, checked: every row must have text in both fields."""
    if name in GENERATED:
        return GENERATED[name]()
    raw, spec = _read(name, flag)
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


def read_task(cfg, log=print) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of {"prompt", "answer"} for cfg.dataset, before any model exists (a bad dataset is
    reported at once). A prompt appears once: repeats are dropped before the held-out split, and training
    prompts that are also evaluation prompts leave the training set (both counted in a line to `log`)."""
    if cfg.dataset == "toy":
        import toy
        if cfg.eval_dataset:
            raise DataError("--eval_dataset: the toy task has its own held-out split; it takes no --eval_dataset")
        return toy.toy_rows("train"), toy.toy_rows("val")
    train, seen, repeats = [], set(), 0
    for r in _rows(cfg.dataset):
        repeats += r["prompt"] in seen
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            train.append(r)
    eval_name = cfg.eval_dataset or DATASETS.get(cfg.dataset, {}).get("eval")
    if eval_name:
        val = _rows(eval_name, "--eval_dataset")
        held = {r["prompt"] for r in val}
        overlap = sum(r["prompt"] in held for r in train)
        train = [r for r in train if r["prompt"] not in held]
    else:  # hold out validation prompts at random (paper §2.1)
        order = list(range(len(train)))
        random.Random(HELD_OUT_SEED).shuffle(order)
        held = set(order[:min(NUM_HELD_OUT, len(train) // 10)])
        train, val, overlap = [r for i, r in enumerate(train) if i not in held], [train[i] for i in sorted(held)], 0
    if not val:
        raise DataError(f"--dataset {cfg.dataset}: too few rows to hold out a validation split (use --eval_dataset)")
    if not train:
        raise DataError(f"--dataset {cfg.dataset}: no training prompt is left once the evaluation prompts are removed")
    log(f"dataset {cfg.dataset}: {len(train)} training prompts, {len(val)} held out"
        + (f" ({eval_name})" if eval_name else "") + f"; {repeats} repeated prompts dropped"
        + (f", {overlap} training prompts that are also evaluation prompts dropped" if overlap else ""))
    return train, val


def load_task(cfg, tokenizer, rows: tuple[list[dict], list[dict]] | None = None, log=print
              ) -> tuple[list[dict], list[dict], callable]:
    """(train rows, eval rows, grade) for cfg.dataset (or the rows read_task already read). Rows are {"prompt",
    "answer", "prompt_ids"}; prompts longer than prompt_max_tokens are dropped. grade(completions, answers) ->
    rewards."""
    train, val = rows or read_task(cfg, log)
    if cfg.dataset == "toy":
        import toy
        grade = toy.grade_toy
    else:
        if cfg.dataset in GENERATED:  # integer answers: the box must hold the number itself
            grade = partial(grade_boxed_exact, thinking=prompt_opens_thinking(tokenizer))
        elif cfg.reward == "exact":  # plain tasks: the first line of the final answer must equal the answer
            grade = partial(grade_exact, thinking=prompt_opens_thinking(tokenizer))
        else:
            if cfg.dataset not in GENERATED:  # generated tasks say in their own words how to answer
                train, val = ([{**r, "prompt": f"{r['prompt']}\n{MATH_INSTRUCTION}"} for r in split] for split in (train, val))
            grade = MathGrader(cfg.grade_timeout_s, thinking=prompt_opens_thinking(tokenizer),
                               step_budget_s=cfg.grade_step_budget_s)
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


def grade_exact(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """--reward exact: the first line of the final answer (after the last </think>), stripped, equals the answer."""
    def first_line(c: str) -> str | None:
        if THINK_END in c:
            c = c.rsplit(THINK_END, 1)[1]
        elif thinking or THINK_START in c:
            return None
        return c.strip().split("\n", 1)[0].strip()
    return [1.0 if first_line(c) == a.strip() else -1.0 for c, a in zip(completions, answers)]


def grade_boxed_exact(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """The final \\boxed{} holds exactly the answer's text. For the generated tasks, whose answers are integers:
    math-verify accepts any expression equal to the answer, and SmolLM2-135M learned within 60 RL steps to
    answer "Compute 5 + 9" with \\boxed{5 + 9} (measured: every sum in the last 90 steps) instead of summing."""
    return [1.0 if final_answer(c, thinking) == a.strip() else -1.0 for c, a in zip(completions, answers)]


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
    than MAX_ANSWER_CHARS, unclosed, or more than MAX_BOXES boxes -> incorrect.

    A step's grading is bounded too: new_budget(seconds) at the start of a step gives every call until the next
    new_budget that many seconds in all (the wall clock of grading calls, replacing killed workers included; not
    the decoding between calls); once it is spent, the rest is incorrect without being graded. `ungraded` counts the completions marked incorrect for lack of
    time (over their own deadline or the step's), so the log can say how many there were."""

    def __init__(self, timeout_s: float = 1.0, num_workers: int = 0, thinking: bool = True,
                 step_budget_s: float = float("inf")):
        import tempfile
        self.timeout_s, self.thinking, self.step_budget_s = timeout_s, thinking, step_budget_s
        self.budget_left_s = step_budget_s
        self.workdir = tempfile.mkdtemp(prefix="grader-")  # the workers' cwd: nothing lands in the project
        self.workers = [self._spawn() for _ in range(num_workers or max(1, min(4, os.cpu_count() or 1)))]
        self.killed = 0  # workers replaced after a missed deadline
        self.ungraded = 0  # completions marked incorrect for lack of time, since the grader was made

    def new_budget(self, seconds: float | None = None):
        """Start a step: the calls until the next new_budget share `seconds` (default: step_budget_s)."""
        self.budget_left_s = self.step_budget_s if seconds is None else seconds

    def _spawn(self):
        import subprocess
        import sys
        import resource

        def limit_memory():  # a sympy blow-up must not take the trainer's memory with it
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the trainer, which stops them
        proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=self.workdir, text=True, bufsize=1,
                                preexec_fn=limit_memory)
        return {"proc": proc, "ready": False}

    def _take(self, k: int, wait_s: float = 120.0):
        """Worker k, restarted if it died, once it has imported math-verify (start-up is not an item's graded
        time); None if it is still starting after wait_s (the step's budget ran out first)."""
        import select
        w = self.workers[k]
        if w["proc"].poll() is not None:
            self.workers[k] = w = self._spawn()
        if not w["ready"]:
            ok, _, _ = select.select([w["proc"].stdout], [], [], min(120.0, wait_s))
            if not ok and wait_s < 120.0:
                return None
            if not ok or w["proc"].stdout.readline().strip() != "ready":
                raise RuntimeError("a math-verify grading worker failed to start (is math-verify installed?)")
            w["ready"] = True
        return w["proc"]

    def __call__(self, completions: list[str], answers: list[str], thinking: bool | None = None) -> list[float]:
        import select
        t_start = time.monotonic()
        budget_end = t_start + max(self.budget_left_s, 0.0)  # wall clock: replacing a killed worker counts too
        rewards, todo = [-1.0] * len(completions), []
        for n, (completion, answer) in enumerate(zip(completions, answers)):
            completion = completion.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become "?"
            content = final_answer(completion, self.thinking if thinking is None else thinking)
            if content is not None:
                todo.append((n, json.dumps({"id": n, "content": content, "answer": str(answer)})))
        busy = {}  # worker index -> (item index, deadline)
        while todo or busy:
            if time.monotonic() >= budget_end:  # the step's grading time is spent: the rest is incorrect
                for k in busy:
                    self._replace(k)
                self.ungraded += len(busy) + len(todo)
                break
            for k in range(len(self.workers)):
                if k not in busy and todo:
                    n, request = todo.pop()
                    proc = self._take(k, max(0.0, budget_end - time.monotonic()))
                    if proc is None:  # still starting, and the step's time is spent
                        todo.append((n, request))
                        break
                    try:
                        proc.stdin.write(request + "\n")
                    except BrokenPipeError:  # it died since it was last seen: a fresh one, and this item again
                        self.workers[k] = self._spawn()
                        todo.append((n, request))
                        continue
                    busy[k] = (n, min(time.monotonic() + self.timeout_s, budget_end))
            if not busy:  # nothing sent this round (a worker starting or dead): back to the budget check
                continue
            wait = max(0.0, min(deadline for _, deadline in busy.values()) - time.monotonic())
            readable, _, _ = select.select([self.workers[k]["proc"].stdout for k in busy], [], [], wait)
            for k, (n, deadline) in list(busy.items()):
                proc = self.workers[k]["proc"]
                if proc.stdout in readable:
                    answer_line = proc.stdout.readline().split()
                    rewards[n] = 1.0 if answer_line == [str(n), "1"] else -1.0  # its own answer, or nothing
                    if answer_line[:1] != [str(n)]:  # out of step (or dead): never trust this worker again
                        self._replace(k)
                    del busy[k]
                elif time.monotonic() >= deadline:  # over its time: incorrect, and a fresh worker
                    self._replace(k)
                    self.killed += 1
                    self.ungraded += 1
                    del busy[k]
        self.budget_left_s -= time.monotonic() - t_start
        return rewards

    def _replace(self, k: int):
        proc = self.workers[k]["proc"]
        proc.kill()
        proc.wait()
        self.workers[k] = self._spawn()

    def close(self):
        for w in self.workers:
            w["proc"].kill()
            w["proc"].wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_default_grader = None


def math_reward(completion: str, answer: str, thinking: bool = False) -> float:
    """Grade one completion with math-verify against a trusted answer: +1 or -1, within about a second. The
    answer is the \\boxed{} after the last </think>, or anywhere in a completion that has no thinking part;
    thinking=True says the prompt opened a thinking block, so a completion that never closes it has no answer."""
    global _default_grader
    if _default_grader is None:
        import atexit
        _default_grader = MathGrader()
        atexit.register(_default_grader.close)
    return _default_grader([completion], [answer], thinking=thinking)[0]


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


def think_end_id(tokenizer) -> int | None:
    """The id of </think> if the tokenizer has it as a single token, else None. Forced interruptions stop the
    thinking phase on that token (generate.py), or on the string </think> where it takes several tokens."""
    ids = tokenizer(THINK_END, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None
