"""Prompts and answers: named and local datasets, generated tasks, and the held-out split.

    from data import load_task        # (train rows, eval rows, grade) for --dataset

DATASETS (downloaded) and GENERATED (written here, no download) are the tables of named datasets a fork adds
to; local .jsonl/.parquet files work by field name. Each dataset names its default reward (rewards.REWARDS),
which --reward overrides where the dataset leaves the answer's form open.
"""
import json
import os
import random

import toy
from rewards import REWARDS, boxed_answers, format_prompt


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception as "Type: first line of its message", for the one-line errors users see."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:limit] if str(e) else ''}"


# --- tasks: rows with prompt token ids, a held-out split, and a grader ------------------------------------------
class DataError(ValueError):
    """A dataset problem the user can fix: reported as one line naming the file and row."""


# Named datasets: where each lives on the Hub and which fields hold the prompt and the answer (one place).
# answer_after: the answer is the text after this marker; answer_boxed: the answer is the last \boxed{} of
# the field (a worked solution). eval: the evaluation set used when --eval_dataset is not given. Their reward
# is DEFAULT_REWARD unless an entry says reward=...
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


def sums_rows() -> tuple[list[dict], list[dict]]:
    """A generated task for small real chat models (the README's SmolLM2 recipe): sums asked in plain words and
    answered in the model's own words, graded by the last number written (rewards.last_number). Half the
    prompts add two one-digit numbers (SmolLM2-135M-Instruct at temperature 1 gets about a quarter right: its
    groups carry signal), half a two-digit and a one-digit number (a few percent: rare successes). Held out by
    the numbers, not the wording: no pair of terms evaluated appears in training in either order or in any
    phrasing, so the held-out pass rate measures adding, not recalling the training prompts.
    Returns (train, eval): 520 and 128 prompts, half of each kind."""
    asks = ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "How much is {a} and {b} together?")
    rng = random.Random(0)
    one = sorted({tuple(sorted((a, b))) for a in range(1, 10) for b in range(1, 10)})  # 45 unordered pairs
    two = [(a, b) for a in range(10, 100) for b in range(1, 10)]
    rng.shuffle(one)
    rng.shuffle(two)

    def rows(pairs, per_pair):  # both orders of a one-digit pair; every phrasing, then a sample of them
        out = [{"prompt": ask.format(a=x, b=y), "answer": str(a + b)} for a, b in pairs
               for x, y in ({(a, b), (b, a)} if b < 10 and a < 10 else {(a, b)}) for ask in asks]
        return rng.sample(out, per_pair) if per_pair < len(out) else out
    train = rows(one[9:], 260) + rows(two[64:], 260)
    val = rows(one[:9], 64) + rows(two[:64], 64)
    rng.shuffle(train)
    return train, val


# Tasks the project writes itself (no download): rows() gives the rows, or (train, eval) rows where the task has
# its own held-out split; their prompts say how to answer, so they are graded by their own reward only.
GENERATED = {
    "toy": dict(rows=lambda: (toy.toy_rows("train"), toy.toy_rows("val")), reward="boxed_exact"),
    "box": dict(rows=box_rows, reward="boxed_exact"),
    "sums": dict(rows=sums_rows, reward="last_number"),
}
DEFAULT_REWARD = "math"
LOCAL_PROMPT_FIELDS, LOCAL_ANSWER_FIELDS = ("prompt", "problem", "question"), ("answer",)
NUM_HELD_OUT = 1000  # paper §2.1: 1,000 prompts held out at random for validation
HELD_OUT_SEED = 1234  # fixed, whatever --seed, so runs that differ in seed share one validation set
POOL_SEED = 4321  # fixed, whatever --seed, so runs that differ in seed share one --train_prompts pool


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers within timeout_s; offline, `datasets` would retry for tens of seconds."""
    import socket
    from urllib.parse import urlparse
    from huggingface_hub import constants
    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(v) for v in proxies):
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
        if not datasets.config.HF_HUB_OFFLINE and not hub_reachable():
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
        raise DataError(f"{flag} {name!r}: not a named dataset ({', '.join([*DATASETS, *GENERATED])}) or a "
                        ".jsonl/.parquet file")
    if not os.path.isfile(name):
        raise DataError(f"{flag} {name}: no such file" + (" (it is a directory)" if os.path.isdir(name) else ""))
    kind = "parquet" if name.endswith(".parquet") else "JSON lines"
    try:
        if kind == "parquet":
            rows = datasets.load_dataset("parquet", data_files=name, split="train").to_list()
        else:
            rows = _read_json(name)
    except Exception as e:
        raise DataError(f"{flag} {name}: cannot be read as {kind} "
                        f"({one_line(e)})") from None
    if not rows:
        raise DataError(f"{flag} {name}: the dataset is empty")
    fields = set().union(*(r.keys() for r in rows))
    prompt = next((f for f in LOCAL_PROMPT_FIELDS if f in fields), None)
    answer = next((f for f in LOCAL_ANSWER_FIELDS if f in fields), None)
    if prompt is None or answer is None:
        raise DataError(f"{name}: rows need a prompt field ({'/'.join(LOCAL_PROMPT_FIELDS)}) and an 'answer' field; "
                        f"found {sorted(fields)}")
    return rows, {"prompt": prompt, "answer": answer}


class Number(str):
    """A number in a JSON file, as its text: exact, whatever its size (see _read_json)."""


def _read_json(path: str) -> list[dict]:
    """Rows of a JSON-lines file (or one JSON array), numbers kept as written: `datasets` would type a column, so
    2**63 + 1 became 9.223372036854776e+18 and 1 in a column with 1.5 became "1.0", which `--reward exact` never
    matches. Bad UTF-8, a line that is not JSON, or a row that is not an object: ValueError naming the line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        rows = json.loads(text, parse_int=Number, parse_float=Number)
        lines = range(1, len(rows) + 1)
    else:
        numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        lines, rows = [i for i, _ in numbered], []
        for i, line in numbered:
            try:
                rows.append(json.loads(line, parse_int=Number, parse_float=Number))
            except ValueError as e:
                raise ValueError(f"line {i}: {e}") from None
    for i, row in zip(lines, rows):
        if not isinstance(row, dict):
            raise ValueError(f"line {i} is a {type(row).__name__}, not an object")
    return rows


def _rows(name: str, flag: str = "--dataset") -> list[dict]:
    """{"prompt", "answer"} rows, checked: every row must have text in both fields."""
    if name in GENERATED:
        return GENERATED[name]["rows"]()
    raw, spec = _read(name, flag)
    if not raw:
        raise DataError(f"{name}: the dataset is empty")
    rows = []
    for i, row in enumerate(raw):
        prompt, answer = row.get(spec["prompt"]), row.get(spec["answer"])
        prompt = 0 if isinstance(prompt, Number) else prompt  # a number is an answer, not a question
        if isinstance(answer, float) and answer.is_integer() and abs(answer) < 2**53:  # a parquet float column
            answer = str(int(answer))
        elif isinstance(answer, (int, float, Number)) and not isinstance(answer, bool):
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
        answer = answer.strip().replace(",", "") if spec.get("answer_after") else answer.strip()  # GSM8K's "1,000"
        rows.append({"prompt": prompt, "answer": answer})
    return rows


def read_task(cfg, log=print) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of {"prompt", "answer"} for cfg.dataset, before any model exists (a bad dataset is
    reported at once). A prompt appears once: repeats are dropped before the held-out split, and training
    prompts that are also evaluation prompts leave the training set (both counted in a line to `log`)."""
    rows = _rows(cfg.dataset)
    if isinstance(rows, tuple):  # a generated task with its own held-out split
        if cfg.eval_dataset:
            raise DataError(f"--eval_dataset: the {cfg.dataset} task has its own held-out split; it takes no "
                            "--eval_dataset")
        return rows
    train, seen, repeats = [], set(), 0
    for r in rows:
        repeats += r["prompt"] in seen
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            train.append(r)
    eval_name = cfg.eval_dataset or DATASETS.get(cfg.dataset, {}).get("eval")
    if eval_name:
        val = _rows(eval_name, "--eval_dataset")
        if isinstance(val, tuple):  # its reward and held-out split belong to it alone
            raise DataError(f"--eval_dataset {eval_name}: a generated task is evaluated only as its own --dataset "
                            f"(train on it with --dataset {eval_name})")
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
    reward = REWARDS[cfg.reward or default_reward(cfg.dataset)]
    grade = reward.make(cfg, tokenizer)
    if reward.instruction and cfg.dataset not in GENERATED:  # generated tasks say in their own words how to answer
        train, val = ([{**r, "prompt": f"{r['prompt']}\n{reward.instruction}"} for r in split]
                      for split in (train, val))
    for rows in (train, val):
        for r in rows:
            r["prompt_ids"] = format_prompt(tokenizer, r["prompt"])
    keep = lambda rows: [r for r in rows if len(r["prompt_ids"]) <= cfg.prompt_max_tokens]  # noqa: E731
    train, val = keep(train), keep(val)
    if not train:
        raise DataError(f"--dataset {cfg.dataset}: no training prompt fits in --prompt_max_tokens "
                        f"{cfg.prompt_max_tokens}")
    if cfg.train_prompts:  # a sample, not the first rows: a dataset may be sorted by source or difficulty
        if cfg.train_prompts > len(train):
            raise DataError(f"--train_prompts {cfg.train_prompts} is more than the {len(train)} training prompts")
        pool = sorted(random.Random(POOL_SEED).sample(range(len(train)), cfg.train_prompts))
        log(f"training on a pool of {len(pool)} of the {len(train)} training prompts (--train_prompts)")
        train = [train[i] for i in pool]
    return train, val, grade


def default_reward(dataset: str) -> str:
    """The reward a dataset is graded by when --reward is not typed (rewards.REWARDS)."""
    return (GENERATED.get(dataset) or DATASETS.get(dataset) or {}).get("reward", DEFAULT_REWARD)
