"""The answer format and the rewards: how a prompt is laid out, where a completion's answer is, and how it is
graded. REWARDS is the one table of rewards (a fork adds one there: a factory and an entry).

    grade = REWARDS[cfg.reward].make(cfg, tokenizer)   # grade(completions, answers) -> [+1.0 or -1.0, ...]

Rewards are +1 correct and -1 otherwise (paper A.3). Completions are untrusted input: nothing is ever evaluated,
every parse is bounded, and math-verify runs in worker processes killed at a deadline. A grade may also have
new_budget(seconds) (a bound on one step's grading), `ungraded` (completions marked wrong for lack of time) and
close(); rollouts.py and train.py use them where present.
"""
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Callable

THINK_START, THINK_END = "<think>", "</think>"
EOS = "<|endoftext|>"
# paper §4 (arXiv text); A.10 prints a variant without "now."
INTERRUPT_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


# --- the prompt ---------------------------------------------------------------------------------------------------
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


# --- graders: grade(completions, answers) -> rewards, +1 correct and -1 otherwise (paper A.3) ----------------------
def final_answer(completion: str, thinking: bool = True) -> str | None:
    """The answer a completion gives: the content of the \\boxed{} after the last </think> (several boxes must
    agree), or None. The thinking part is never graded (paper §2: answers are graded after stripping
    <think>...</think>); see boxed_answers for the rules."""
    boxes = boxed_answers(completion, thinking)
    return boxes[0] if boxes and len(set(boxes)) == 1 else None


def answer_part(completion: str, thinking: bool) -> str | None:
    """What follows the last </think>; the whole completion when it has no thinking part; None when thinking was
    opened (by the prompt, `thinking`, or by writing <think>) and never closed: an answer inside the thinking part
    does not count."""
    if THINK_END in completion:
        return completion.rsplit(THINK_END, 1)[1]
    return None if thinking or THINK_START in completion else completion


def first_line(completion: str, thinking: bool) -> str | None:
    """The first line of the answer part, stripped (--reward exact)."""
    part = answer_part(completion, thinking)
    return None if part is None else part.strip().split("\n", 1)[0].strip()


NUMBER = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")  # 12, -3, 0.5; in "12-9" the numbers are 12 and 9
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # the comma of 1,000


OPERATORS = tuple("+-*/×÷=^") + ("x ", "plus", "minus", "times", "and", "divided", "multiplied", "over")


def last_number(completion: str, thinking: bool) -> str | None:
    """The last number written in the answer part, or None (--reward last_number): how a person reads a short
    worked answer ("7 + 5 = 12"). An answer that leads with another number ("26 (23 + 6 = 29)") states two
    results: None, as for boxes that disagree. One linear regex scan of text bounded by the token budget."""
    part = answer_part(completion, thinking)
    part = THOUSANDS.sub("", part).lstrip() if part is not None else ""
    numbers = list(NUMBER.finditer(part))
    if not numbers:
        return None
    lead, last = numbers[0], numbers[-1].group()
    leads_with_a_result = lead.start() == 0 and not part[lead.end():].lstrip().lower().startswith(OPERATORS)
    return None if leads_with_a_result and not same_number(lead.group(), last) else last


def same_number(text: str | None, answer: str) -> bool:
    """text and answer are the same number (12.0 is 12); answers that are not numbers must match as text."""
    if text is None:
        return False
    try:
        return Decimal(text) == Decimal(answer.strip().replace(",", ""))
    except InvalidOperation:
        return text == answer.strip()


def grade_exact(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """--reward exact: the first line of the final answer (after the last </think>), stripped, equals the answer."""
    return [1.0 if first_line(c, thinking) == a.strip() else -1.0 for c, a in zip(completions, answers)]


def grade_last_number(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """--reward last_number: the last number of the final answer equals the answer."""
    return [1.0 if same_number(last_number(c, thinking), a) else -1.0 for c, a in zip(completions, answers)]


def grade_boxed_exact(completions: list[str], answers: list[str], thinking: bool) -> list[float]:
    """The final \\boxed{} holds exactly the answer's text. For the generated tasks, whose answers are integers:
    math-verify accepts any expression equal to the answer, and SmolLM2-135M learned within 60 RL steps to
    answer "Compute 5 + 9" with \\boxed{5 + 9} instead of summing (docs/measurements.md)."""
    return [1.0 if final_answer(c, thinking) == a.strip() else -1.0 for c, a in zip(completions, answers)]


MAX_ANSWER_CHARS = 1000  # a boxed answer longer than this is wrong without being parsed
WORKER_MEMORY_BYTES = 4 << 30  # address space of one grading worker
MAX_BOXES = 16  # more \boxed{} than this in one final answer is spam: wrong, and never scanned one by one


def boxed_answers(completion: str, thinking: bool) -> list[str] | None:
    """Every \\boxed{...} of the final answer, or None when there is no usable final answer: no answer part
    (the final answer is what follows the last </think>; a completion that opened thinking, in its prompt
    (`thinking`) or by writing <think>, and never closed it has none), more than MAX_BOXES boxes, or a box that
    does not close within MAX_ANSWER_CHARS. Work is bounded: str.count/find, then at most MAX_BOXES scans."""
    completion = answer_part(completion, thinking)
    if completion is None:
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
import json, logging, os, resource, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the trainer, which stops the workers
memory = int(sys.argv[1])  # a sympy blow-up must not take the trainer's memory with it
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
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
WORKER_START_S = 60.0  # importing math-verify takes 1-2 s; a worker not ready after this is broken


class _Worker:
    """One grading process. Started by Popen without preexec_fn, so CPython vforks and execs at once: the child
    never runs in a copy of the multi-GB, multi-threaded trainer (a fork could deadlock there before exec). Its
    output is read without blocking into a buffer: a worker that stops mid-line (frozen, killed) never stalls a
    read; every wait is a select with a deadline."""

    def __init__(self, workdir: str):
        import subprocess
        import sys
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(WORKER_MEMORY_BYTES)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=workdir, bufsize=0)
        self.fd, self.buf, self.ready = self.proc.stdout.fileno(), b"", False
        self.start_deadline = time.monotonic() + WORKER_START_S
        os.set_blocking(self.fd, False)

    def send(self, line: str) -> bool:
        try:  # one small request at a time: the pipe never fills
            self.proc.stdin.write(line.encode() + b"\n")
            return True
        except OSError:  # it died since it was last seen
            return False

    def lines(self) -> list[str] | None:
        """The whole lines it has written since the last call; None once it has closed its output (dead)."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            return None
        *whole, self.buf = (self.buf + chunk).split(b"\n")
        return [w.decode("utf-8", "replace").strip() for w in whole]

    def kill(self):
        """SIGKILL (it ends a stopped process too), reaped within a second or left to the OS: never a wait
        without a bound."""
        import subprocess
        self.proc.kill()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class MathGrader:
    """math-verify on untrusted completions, each bounded by timeout_s seconds of wall clock, in a few
    worker processes (usable from any thread). A worker that misses its deadline, or stops answering mid-line, is
    killed and replaced; its completion gets the incorrect reward. Workers' stderr goes to /dev/null: math-verify
    prints the entire offending input on a timeout. Rules, in the parent, before any parsing (boxed_answers): no
    answer part or no \\boxed{} -> incorrect; several \\boxed{} with different contents -> incorrect (no hedging); a
    box longer than MAX_ANSWER_CHARS, unclosed, or more than MAX_BOXES boxes -> incorrect.

    A step's grading is bounded too: new_budget(seconds) at the start of a step gives every call until the next
    new_budget that many seconds in all (the wall clock of grading calls, starting replacement workers included;
    not the decoding between calls); once it is spent, the rest is incorrect without being graded. `ungraded`
    counts the completions marked incorrect for lack of time (over their own deadline or the step's), so the log
    can say how many there were."""

    def __init__(self, timeout_s: float = 1.0, num_workers: int = 0, thinking: bool = True,
                 step_budget_s: float = float("inf")):
        import tempfile
        self.timeout_s, self.thinking, self.step_budget_s = timeout_s, thinking, step_budget_s
        self.budget_left_s = step_budget_s
        self.workdir = tempfile.mkdtemp(prefix="grader-")  # the workers' cwd: nothing lands in the project
        self.workers = [_Worker(self.workdir) for _ in range(num_workers or max(1, min(4, os.cpu_count() or 1)))]
        self.killed = 0  # workers replaced after a missed deadline
        self.ungraded = 0  # completions marked incorrect for lack of time, since the grader was made

    def new_budget(self, seconds: float | None = None):
        """Start a step: the calls until the next new_budget share `seconds` (default: step_budget_s)."""
        self.budget_left_s = self.step_budget_s if seconds is None else seconds

    def _replace(self, k: int):
        self.workers[k].kill()
        self.workers[k] = _Worker(self.workdir)

    def __call__(self, completions: list[str], answers: list[str], thinking: bool | None = None) -> list[float]:
        import select
        t_start = time.monotonic()
        budget_end = t_start + max(self.budget_left_s, 0.0)  # wall clock: starting a replacement counts too
        rewards, todo = [-1.0] * len(completions), []
        for n, (completion, answer) in enumerate(zip(completions, answers)):
            completion = completion.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become "?"
            content = final_answer(completion, self.thinking if thinking is None else thinking)
            if content is not None:
                todo.append((n, json.dumps({"id": n, "content": content, "answer": str(answer)})))
        busy = {}  # worker index -> (item index, deadline)
        while todo or busy:
            now = time.monotonic()
            if now >= budget_end:  # the step's grading time is spent: the rest is incorrect
                for k in busy:
                    self._replace(k)
                self.ungraded += len(busy) + len(todo)
                break
            for k, w in enumerate(self.workers):
                if w.ready and k not in busy and todo:
                    n, request = todo.pop()
                    if w.send(request):
                        busy[k] = (n, min(now + self.timeout_s, budget_end))
                    else:  # a fresh one, and this item again
                        todo.append((n, request))
                        self._replace(k)
                elif not w.ready and now >= w.start_deadline:
                    raise RuntimeError("a math-verify grading worker failed to start (is math-verify installed?)")
            waiting = [k for k, w in enumerate(self.workers) if k in busy or not w.ready]
            deadlines = [budget_end, *(d for _, d in busy.values()),
                         *(w.start_deadline for w in self.workers if not w.ready)]
            select.select([self.workers[k].fd for k in waiting], [], [], max(0.0, min(deadlines) - now))
            for k in waiting:
                w, lines = self.workers[k], self.workers[k].lines()
                if lines is None and not w.ready:  # it exited while starting
                    raise RuntimeError("a math-verify grading worker failed to start (is math-verify installed?)")
                for line in lines or []:
                    if not w.ready:
                        w.ready = line == "ready"
                    elif k in busy:
                        n = busy.pop(k)[0]
                        rewards[n] = 1.0 if line.split() == [str(n), "1"] else -1.0  # its own answer, or nothing
                        if line.split()[:1] != [str(n)]:  # out of step: never trust this worker again
                            lines = None
                if lines is None:  # dead (its item, if any, stays incorrect) or out of step: a fresh one
                    busy.pop(k, None)
                    self._replace(k)
                elif k in busy and time.monotonic() >= busy[k][1]:  # over its time: incorrect, and a fresh one
                    busy.pop(k)
                    self._replace(k)
                    self.killed += 1
                    self.ungraded += 1
        self.budget_left_s -= time.monotonic() - t_start
        return rewards

    def close(self):
        for w in self.workers:
            w.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- the registry: --reward NAME -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reward:
    make: Callable  # (cfg, tokenizer) -> grade(completions, answers) -> rewards
    instruction: str = ""  # appended to the prompts of datasets that do not say how to answer (not generated tasks)
    extract: Callable | None = None  # (completion, thinking) -> its answer, or None: evaluations count those apart


def math_grader(cfg, tokenizer):
    return MathGrader(cfg.grade_timeout_s, thinking=prompt_opens_thinking(tokenizer),
                      step_budget_s=cfg.grade_step_budget_s)


def exact_grader(cfg, tokenizer):
    return partial(grade_exact, thinking=prompt_opens_thinking(tokenizer))


def boxed_exact_grader(cfg, tokenizer):
    return partial(grade_boxed_exact, thinking=prompt_opens_thinking(tokenizer))


def last_number_grader(cfg, tokenizer):
    return partial(grade_last_number, thinking=prompt_opens_thinking(tokenizer))


REWARDS = {
    "math": Reward(math_grader, MATH_INSTRUCTION, final_answer),  # math-verify: the last \boxed{} equals the answer
    "exact": Reward(exact_grader, extract=first_line),  # the final answer's first line is the answer's text
    "boxed_exact": Reward(boxed_exact_grader, MATH_INSTRUCTION, final_answer),  # the last \boxed{} holds the answer
    "last_number": Reward(last_number_grader, extract=last_number),  # the last number written is the answer
}
