"""Real datasets offline: local .jsonl/.parquet files end to end, the named datasets' field mappings against rows
shaped like theirs, bad data reported by file and row, Hub datasets without a network, progress under nohup.

    python -m pytest tests/test_datasets.py -q
"""
import json
import os

import pytest

import config
import data
import rewards
from conftest import OUT, ROOT, run_train

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.parametrize("name", ["arithmetic.jsonl", "arithmetic.parquet"])
def test_local_file_trains_end_to_end(tmp_path, toy_path, run_name, name):
    """Prompt formatting with the tiny tokenizer's chat template, vLLM generation, math-verify grading, and an
    optimizer step, on a local file."""
    proc = run_train("--dataset", os.path.join(FIXTURES, name), "--eval_prompts", "3", "--eval_samples", "2",
                     "--eval_every", "1", "--max_steps", "1", "--mode", "sync", "--batch", "64",
                     "--save_every", "-1", "--dump_every", "1", "--run_name", (run := run_name()),
                     "--log_dir", str(tmp_path), env=OFFLINE)
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = [json.loads(line) for line in open(tmp_path / f"{run}.jsonl")]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 1 and train[0]["grad_norm"] > 0  # graded rewards differed: a real optimizer step
    assert 0 < train[0]["pass_rate_train"] < 1
    dump = os.path.join(OUT, run, "rollouts", "step_000001.jsonl")
    rows = [json.loads(line) for line in open(dump)]
    assert len(rows) == 64
    assert rows[0]["prompt"].startswith("<|user|>Add: ") and rewards.MATH_INSTRUCTION in rows[0]["prompt"]
    assert all(lag is None or lag == 0 for r in rows for lag in r["token_lag"])  # sync mode: on-policy
    assert {r["reward"] for r in rows} == {1.0, -1.0}


def _fake_hub(monkeypatch, fixture):
    import datasets
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_json(os.path.join(FIXTURES, fixture)))


@pytest.mark.parametrize("name,fixture,expect", [
    ("polaris", "polaris_rows.jsonl", [("Find the remainder when $2^{10}$ is divided by 7.", "2"),
                                       ("What is $\\frac{1}{2}+\\frac{1}{3}$?", "\\frac{5}{6}")]),
    ("gsm8k", "gsm8k_rows.jsonl", [("Tom has 3 apples and buys 4 more. How many apples does he have?", "7"),
                                   ("A shop sells 1,200 pens a day. How many in 2 days?", "2400")]),
    ("math", "math_rows.jsonl", [("Compute $\\frac{2}{4}$.", "\\frac{1}{2}"), ("What is $\\sqrt{16}$?", "4")]),
])
def test_named_dataset_field_mapping(monkeypatch, name, fixture, expect):
    _fake_hub(monkeypatch, fixture)
    rows = data._rows(name)
    assert [(r["prompt"], r["answer"]) for r in rows[:len(expect)]] == expect


def test_named_dataset_graded_with_math_verify(monkeypatch, tokenizer):
    _fake_hub(monkeypatch, "math_rows.jsonl")
    cfg = config.parse_args(["--dataset", "math", "--prompt_max_tokens", "512"])
    rows = data._rows("math")  # (the fake Hub serves the same rows as training and evaluation set)
    train, val, grade = data.load_task(cfg, tokenizer, (rows, rows))
    assert train[0]["prompt"].endswith(rewards.MATH_INSTRUCTION)
    assert tokenizer.decode(train[0]["prompt_ids"]).endswith("<|assistant|><think>")  # the chat template's prompt
    assert grade(["so </think> \\boxed{0.5}", "\\boxed{1/2}", "</think> \\boxed{4}"], ["\\frac{1}{2}"] * 2 + ["4"]) == \
        [1.0, -1.0, 1.0]  # the middle one never closed its thinking


def test_named_hub_dataset_offline_is_one_line(tmp_path, toy_path):
    proc = run_train("--dataset", "gsm8k", "--max_steps", "1", "--log_dir", str(tmp_path), env=OFFLINE, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert lines[-1].startswith("error:") and "gsm8k" in lines[-1] and "download" in lines[-1]


def test_unreachable_hub_fails_fast_without_offline_flags(tmp_path):
    """No HF_*_OFFLINE set and a Hub that does not answer: the cache is used at once (no retries for tens of
    seconds), and the error line says why, with no `datasets` chatter after it."""
    env = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on the discard port: refused at once
    proc = run_train("--dataset", "gsm8k", "--max_steps", "1", "--log_dir", str(tmp_path), "--out_dir", str(tmp_path),
                     env={**env, "HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": ""}, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert lines[-1].startswith("error: --dataset gsm8k") and "not reachable" in lines[-1]


def _write(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("content,needle", [
    (['{"prompt": "Add: 1+1", "answer": "2"}', '{"prompt": "Add: 2+2"}'], "row 1"),  # no answer
    (['{"prompt": "Add: 1+1", "answer": "2"}', '{"answer": "3"}'], "row 1"),  # no prompt
    (['{"question": "Add: 1+1", "answer": "2"}', '{"question": ["a", "list"], "answer": "2"}'], "row 1"),  # not text
    (['{"prompt": "Add: 1+1", "answer": "2"}', '{"prompt": "", "answer": "2"}'], "row 1"),  # empty text
    (['{"text": "no prompt field"}'], "prompt field"),
    (['{"prompt": "Add: 1+1", "answer": "2"', 'not json'], "cannot be read"),
])
def test_bad_dataset_rows_are_named(tmp_path, content, needle):
    path = _write(tmp_path / "bad.jsonl", content)
    with pytest.raises(data.DataError) as e:
        data._rows(path)
    assert needle in str(e.value) and path in str(e.value)


def test_empty_dataset_file(tmp_path):
    path = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(data.DataError) as e:
        data._rows(path)
    assert path in str(e.value) and "the dataset is empty" in str(e.value)


def test_bad_dataset_stops_train_py_with_one_line(tmp_path, toy_path):
    path = _write(tmp_path / "bad.jsonl", ['{"prompt": "Add: 1+1", "answer": "2"}', '{"prompt": 7, "answer": "2"}'])
    proc = run_train("--dataset", path, "--max_steps", "1", "--log_dir", str(tmp_path), timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout
    assert lines[-1].startswith("error:") and "row 1" in lines[-1] and path in lines[-1]


def test_progress_is_plain_lines_when_stdout_is_not_a_terminal(tmp_path, toy_path):
    proc = run_train("--max_steps", "1", "--mode", "sync", "--batch", "32", "--eval_prompts", "16", "--eval_samples", "2",
                     "--eval_every", "1", "--save_every", "-1", "--run_name", "progress", "--log_dir", str(tmp_path),
                     env={"SCALERL_PROGRESS_S": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "\r" not in proc.stdout  # no carriage-return bars in a log file
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("evaluate: 16/16 groups") and "eta" in ln for ln in lines)
    assert any(ln.startswith("generate: ") and "groups/s" in ln for ln in lines)


def test_exact_reward_reads_the_first_line_of_the_final_answer():
    grade = lambda cs, a: rewards.grade_exact(cs, [a] * len(cs), thinking=False)  # noqa: E731
    assert grade(["81", "81\nmore text", " 81 ", "<think>hmm</think>81", "8 1", "<think>81"], "81") == \
        [1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
    assert rewards.grade_exact(["81", "x</think>81"], ["81", "81"], thinking=True) == [-1.0, 1.0]


def test_repeated_prompts_are_dropped_before_the_held_out_split(tmp_path):
    rows = [json.dumps({"prompt": f"Add: {i}+1", "answer": str(i + 1)}) for i in range(40)]
    path = _write(tmp_path / "dups.jsonl", rows + rows[:15])  # 15 prompts twice
    lines = []
    train, val = data.read_task(config.parse_args(["--dataset", path]), log=lines.append)
    assert len(train) + len(val) == 40 and len(val) == 4
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert "15 repeated prompts dropped" in lines[0]
    # a separate evaluation set: training prompts that are also evaluation prompts leave the training set
    path_eval = _write(tmp_path / "eval.jsonl", rows[:5])
    train, val = data.read_task(config.parse_args(["--dataset", path, "--eval_dataset", path_eval]), log=lines.append)
    assert len(train) == 35 and len(val) == 5 and "5 training prompts that are also evaluation prompts" in lines[1]


def test_eval_dataset_errors_name_the_eval_flag(tmp_path):
    path = _write(tmp_path / "ok.jsonl", [json.dumps({"prompt": f"Add: {i}+1", "answer": "1"}) for i in range(20)])
    os.makedirs(tmp_path / "d.jsonl")
    with pytest.raises(data.DataError, match="--eval_dataset .*d.jsonl: no such file \\(it is a directory\\)"):
        data.read_task(config.parse_args(["--dataset", path, "--eval_dataset", str(tmp_path / "d.jsonl")]))


def test_numeric_answers_in_a_local_file_stay_as_written(tmp_path):
    """`datasets` types a JSON column: 2**63 + 1 became 9.223372036854776e+18, 10**30 1e+30, and 1 beside 1.5 "1.0"
    (which `--reward exact` never matches against "1"). Read by the json module, every number is its own text."""
    answers = ["9223372036854775809", "1000000000000000000000000000000", "1", "1.5", "-0.25", "1e3"]
    path = _write(tmp_path / "nums.jsonl", [f'{{"prompt": "Q{i}", "answer": {a}}}' for i, a in enumerate(answers)])
    assert [r["answer"] for r in data._rows(path)] == answers
    path = tmp_path / "array.json"  # one JSON array works the same
    path.write_text(json.dumps([{"prompt": "Q", "answer": 2**64}]))
    assert data._rows(str(path))[0]["answer"] == str(2**64)


def test_a_generated_task_as_eval_dataset_is_one_line(tmp_path):
    path = _write(tmp_path / "ok.jsonl", [json.dumps({"prompt": f"Add: {i}+1", "answer": "1"}) for i in range(20)])
    for task in ("sums", "toy"):
        with pytest.raises(data.DataError, match=f"--eval_dataset {task}: a generated task is evaluated only as its"):
            data.read_task(config.parse_args(["--dataset", path, "--eval_dataset", task]))


def test_non_utf8_dataset_is_one_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9 1+1", "answer": "2"}\n')
    with pytest.raises(data.DataError, match="UnicodeDecodeError"):
        data._rows(str(path))


def test_a_reward_registered_by_a_fork_grades_a_dataset(monkeypatch, tokenizer):
    """A new reward is a factory and a REWARDS entry: --reward takes it, and load_task grades with it and adds its
    instruction to the prompts; each dataset's default is its own, and a generated task refuses any other."""
    def shout(cfg, tokenizer):
        return lambda completions, answers: [1.0 if c.isupper() else -1.0 for c in completions]
    monkeypatch.setitem(rewards.REWARDS, "shout", rewards.Reward(shout, "Answer in capitals."))
    local = os.path.join(FIXTURES, "arithmetic.jsonl")
    cfg = config.parse_args(["--dataset", local, "--reward", "shout"])
    train, val, grade = data.load_task(cfg, tokenizer, log=lambda *_: None)
    assert train[0]["prompt"].endswith("\nAnswer in capitals.") and val[0]["prompt"].endswith("capitals.")
    assert grade(["YES", "no"], ["7", "7"]) == [1.0, -1.0]
    assert config.parse_args(["--dataset", local]).reward == data.default_reward(local) == "math"
    assert config.parse_args([]).reward == data.default_reward("toy") == data.default_reward("box") == "boxed_exact"
    with pytest.raises(config.ConfigError, match="does not apply to --dataset box"):
        config.parse_args(["--dataset", "box", "--reward", "shout"])
