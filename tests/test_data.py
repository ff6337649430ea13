"""The toy task, its grader, and the prompt sampler's epochs and No-Positive-Resampling.

    python -m pytest tests/test_data.py -q
"""
import collections
import os
import platform
import random
import re
import subprocess
import sys

import pytest

import checkpoint
import config
import data
import rewards
import rollouts
import toy


def reward(completion: str, answer: str) -> float:
    """The toy's reward: its dataset's default, boxed_exact, with the thinking block opened by the prompt."""
    return rewards.grade_boxed_exact([completion], [answer], thinking=True)[0]


def test_toy_splits_are_fixed_and_disjoint():
    train, val = toy.toy_rows("train"), toy.toy_rows("val")
    assert len(train) == sum(toy.toy_quota("train").values()) and len(val) == toy.TOY_NUM_VAL
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert toy.toy_rows("val") == val  # the same every time
    for r in val[:50]:
        assert str(sum(map(int, r["prompt"].removeprefix("Add: ").split("+")))) == r["answer"]


def test_toy_solution_is_graded_correct_and_slips_are_wrong():
    rng = random.Random(0)
    for check_rate in (0.0, 1.0):  # concise and checked traces alike
        for _ in range(200):
            p = toy.toy_problem(rng, check_rate=check_rate)
            assert reward(p["solution"], p["answer"]) == 1.0
    slipped = [toy.toy_problem(random.Random(i), slip=((0, 1.0),)) for i in range(200)]
    # every running sum slips; slips can cancel over several steps, but rarely
    assert sum(reward(p["solution"], p["answer"]) == -1.0 for p in slipped) > 0.7 * len(slipped)


def test_the_carry_teacher_forgets_only_carries_and_its_slips_never_cancel():
    """toy-carry's teacher (toy.TEACHERS): a step entering a new decade writes result - 10 at the decade's rate and
    every other step is right, so a wrong answer is always short by a multiple of 10 (no slip undoes another), a sum
    that never reaches 20 is always right, and the draws, one a step, are those of every other teacher."""
    slip, carry = toy.TEACHERS["toy-carry"]
    wrong = 0
    for i in range(2000):
        p = toy.toy_problem(random.Random(i), slip, 0.0, carry)
        plain = toy.toy_problem(random.Random(i))
        assert p["prompt"] == plain["prompt"] and p["answer"] == plain["answer"]
        short = int(p["answer"]) - int(rewards.final_answer(p["solution"]))
        assert short >= 0 and short % 10 == 0, p
        assert short == 0 or int(p["answer"]) >= 20, p
        wrong += short > 0
        for step in p["solution"].split(" </think>")[0].split():  # "a+b=c": c is a+b or a+b-10 on a carry
            a, b, c = map(int, step.replace("=", "+").split("+"))
            assert c == a + b or (c == a + b - 10 and (a + b) // 10 > a // 10 and a + b >= 20), step
    assert 0.2 < wrong / 2000 < 0.8, wrong  # forgetting is common, not universal
    assert toy.decade("Add: 9+9+9+9+9+9") == 5 and toy.decade("<|user|>Add: 1+2+3<|assistant|>") == 0


def test_toy_splits_hold_their_quota_of_every_length():
    """Validation: as many of each length. Training: TOY_TRAIN_PER_LENGTH of each, but half of the 729 distinct
    3-term sums, so that No-Positive-Resampling cannot exhaust a long run's pool (toy.py)."""
    lengths = range(toy.TOY_TERMS[0], toy.TOY_TERMS[1] + 1)
    for split in ("train", "val"):
        counts = collections.Counter(toy.num_terms(r["prompt"]) for r in toy.toy_rows(split))
        assert dict(counts) == toy.toy_quota(split), (split, counts)
    val = toy.toy_quota("val")
    assert max(val.values()) - min(val.values()) <= 1 and sum(val.values()) == toy.TOY_NUM_VAL
    assert toy.toy_quota("train") == {3: 364, **{k: toy.TOY_TRAIN_PER_LENGTH for k in lengths if k > 3}}


def test_the_warm_start_slips_as_its_teacher_does_and_long_sums_are_rarely_right(toy_path):
    """What RL has to learn (toy.py): with no budget to interrupt it, the warm start adds and copies, but slips a
    running sum about as often as its teacher does (TOY_SFT_SLIP: more often the larger the sum), so it is right
    about as often as the teacher on each number of terms, most of the time on 3 and rarely on 9. A warm start that
    had not learned to add would score far below the teacher on short sums; one that had learned not to slip, far
    above it on long ones, leaving RL nothing to learn."""
    accuracy = toy.warm_start_accuracy(toy_path, num_prompts=40, samples=2)
    rng, teacher = random.Random(5), {}
    for _ in range(20000):
        p = toy.toy_problem(rng, toy.TOY_SFT_SLIP)
        teacher.setdefault(toy.num_terms(p["prompt"]), []).append(rewards.final_answer(p["solution"]) == p["answer"])
    for n in (3, 9):
        assert abs(accuracy[n] - sum(teacher[n]) / len(teacher[n])) <= 0.15, (n, accuracy)
    assert accuracy[3] > accuracy[6] > accuracy[9] and accuracy[9] <= 0.25, accuracy


def test_the_warm_start_is_built_with_kernels_held_to_avx2():
    """The child that builds the warm start runs PyTorch's AVX2 kernels even on an AVX512 CPU, so that every x86
    machine builds the same weights (toy.py); without the hold, an AVX512 CPU's build is another warm start."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert toy.reference_isa_env() == dict(os.environ)
        return
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    held = subprocess.run([sys.executable, "-c", probe], env=toy.reference_isa_env(), capture_output=True, text=True)
    assert held.stdout.strip() == "AVX2", held.stderr[-2000:]


def test_the_shipped_warm_start_is_verified_by_its_sha256(tmp_path, monkeypatch, toy_path):
    """Every run of the toy starts from the weights in warm_start/, whose sha256 is toy.REFERENCE_SHA256; a damaged
    or edited copy (one byte more, a Git LFS pointer) is refused in one line, never trained from."""
    import shutil
    assert toy_path == toy.shipped_model() == toy.toy_model_path(toy.SHIPPED_DIR)
    assert checkpoint.file_sha256(os.path.join(toy_path, "model.safetensors")) == toy.REFERENCE_SHA256["toy"]
    assert toy.build_toy_model(str(tmp_path)) == toy_path and not os.listdir(tmp_path)  # nothing built
    damaged = tmp_path / "shipped"
    shutil.copytree(toy_path, damaged / os.path.basename(toy_path))
    with open(damaged / os.path.basename(toy_path) / "model.safetensors", "ab") as f:
        f.write(b" ")
    monkeypatch.setattr(toy, "SHIPPED_DIR", str(damaged))
    with pytest.raises(ValueError, match="fails its sha256 check.*git checkout -- warm_start"):
        toy.build_toy_model(str(tmp_path))
    monkeypatch.setattr(toy, "SHIPPED_DIR", str(tmp_path / "none"))  # a spec that ships no weights: built instead
    assert toy.shipped_model() is None


def test_the_warm_start_still_builds_from_the_teacher(tmp_path):
    """`python toy.py --build`'s path, shortened to 5 supervised steps (another spec, so another folder): a child
    held to AVX2 writes a complete model folder that transformers loads, and says it is not the reference."""
    code = ("import sys, toy; toy.TOY_SFT_STEPS = 5; notes = []; "
            "path = toy.build_here(sys.argv[1], log=notes.append); print(path); print(notes[-1])")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=toy.reference_isa_env(),
                          cwd=os.path.dirname(toy.SHIPPED_DIR), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    path, saved = done.stdout.split("\n")[:2]
    assert path.startswith(str(tmp_path)) and "toy model saved" in saved
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(path).num_parameters() > 10**6


def test_a_warm_start_that_is_not_the_reference_build_is_named(tmp_path, toy_path):
    """A cached warm start with other weights (another CPU, another torch) is used when none ships for the spec, and
    the log says it is not the reference build; the reference build is used without a word."""
    import shutil
    path = toy.toy_model_path(str(tmp_path))
    shutil.copytree(toy_path, path)
    notes = []
    assert toy.build_toy_model(str(tmp_path), log=notes.append, shipped=False) == path
    assert notes == []
    with open(os.path.join(path, "model.safetensors"), "ab") as f:
        f.write(b" ")  # other bytes, other weights as far as a hash can tell
    toy.build_toy_model(str(tmp_path), log=notes.append, shipped=False)
    assert len(notes) == 1 and "not the reference build" in notes[0], notes


def test_the_budget_fits_every_scratchpad(tokenizer):
    """What does not set A (toy.py): the toy's thinking budget (drawn from 72-80 per request) fits the teacher's
    scratchpad of every sum, slips included, so only a policy that wanders past it is cut."""
    import config
    least = config.TOY["think_min_tokens"]

    def thinking_tokens(p):  # the scratchpad up to and including </think>
        return len(tokenizer(p["solution"].split(rewards.THINK_END)[0] + rewards.THINK_END,
                             add_special_tokens=False)["input_ids"])
    rng = random.Random(0)
    longest = max(thinking_tokens(toy.toy_problem(rng, toy.TOY_SFT_SLIP)) for _ in range(2000))
    assert 60 <= longest <= least, longest  # a 9-term sum needs ~62


def test_grader_reads_only_the_final_answer_after_thinking():
    assert reward("1+2=3 </think>\\boxed{3}", "3") == 1.0
    assert reward("\\boxed{3} still thinking", "3") == -1.0  # never closed its thinking
    assert reward("\\boxed{3} </think>\\boxed{4}", "3") == -1.0  # the answer inside thinking is ignored
    assert reward("</think>\\boxed{4} \\boxed{3}", "3") == -1.0  # hedging between answers is wrong
    assert reward("</think>\\boxed{3} so \\boxed{3}", "3") == 1.0  # repeating the answer is fine
    assert reward("", "3") == -1.0


def test_tokenizer_and_chat_template(tokenizer):
    ids = rewards.format_prompt(tokenizer, "Add: 12+7")
    assert tokenizer.decode(ids) == "<|user|>Add: 12+7<|assistant|><think>"
    phrase = tokenizer(rewards.INTERRUPT_PHRASE, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("</think>") == phrase[-1]
    assert len(phrase) < 25  # trained into the vocabulary, not 80 single characters
    digits = tokenizer("123", add_special_tokens=False)["input_ids"]
    assert len(digits) == 3  # one token per digit


def _rows(n):
    return [{"prompt": f"p{i}", "answer": "0", "prompt_ids": [i]} for i in range(n)]


def test_sampler_covers_every_prompt_once_per_epoch():
    s = rollouts.PromptSampler(_rows(10), seed=3, npr=True, npr_threshold=0.9)
    first = [i for i, _ in s.draw(10)]
    second = [i for i, _ in s.draw(10)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a fresh order every epoch
    uids = [u for _, u in s.draw(5)]
    assert len(set(uids)) == 5


def test_npr_retires_easy_prompts_from_later_epochs_only():
    s = rollouts.PromptSampler(_rows(10), seed=0, npr=True, npr_threshold=0.9)
    epoch0 = [i for i, _ in s.draw(4)]
    s.record(epoch0[0], 15 / 16)  # >= 0.9: retired
    s.record(epoch0[1], 0.0)      # all wrong: zero-variance filtering drops it from the loss, NPR keeps it
    s.record(epoch0[2], 0.85)
    rest = [i for i, _ in s.draw(6)]
    assert sorted(epoch0 + rest) == list(range(10))  # the current epoch is not changed
    later = [i for i, _ in s.draw(9 * 5)]
    assert epoch0[0] not in later and epoch0[1] in later and epoch0[2] in later
    assert s.retired == {epoch0[0]}


def test_npr_off_keeps_every_prompt():
    s = rollouts.PromptSampler(_rows(4), seed=0, npr=False, npr_threshold=0.9)
    for i, _ in s.draw(4):
        s.record(i, 1.0)
    assert sorted(i for i, _ in s.draw(4)) == [0, 1, 2, 3]


def test_npr_ends_the_run_when_fewer_prompts_than_a_step_draws_are_left():
    """A step must not train on a few prompts repeated (on the toy that collapsed the pass rate): once NPR has
    retired all but fewer than min_pool prompts, the next epoch raises instead of starting."""
    s = rollouts.PromptSampler(_rows(10), seed=0, npr=True, npr_threshold=0.9, min_pool=4)
    for i, _ in s.draw(10):
        s.record(i, 1.0 if i < 6 else 0.5)  # 4 left: exactly a step's draw, the run goes on
    assert sorted(i for i, _ in s.draw(4)) == [6, 7, 8, 9]
    s.record(6, 1.0)  # 3 left
    with pytest.raises(rollouts.TrainingSetSolved, match="retired 7 of the 10 training prompts, leaving fewer than"):
        s.draw(4)


def test_a_training_pool_is_a_fixed_sample_the_same_for_every_seed(tokenizer):
    """--train_prompts N: N training prompts drawn across the whole split (not its first rows), the same N for
    every --seed, so that seeds of a several-epoch run (NPR across epochs) train on one pool."""
    lines = []
    pools = [data.load_task(config.parse_args(["--train_prompts", "500", "--seed", s]), tokenizer,
                            log=lines.append)[0] for s in ("0", "1")]
    full = data.load_task(config.parse_args([]), tokenizer, log=lines.append)[0]
    assert [r["prompt"] for r in pools[0]] == [r["prompt"] for r in pools[1]] and len(pools[0]) == 500
    assert {r["prompt"] for r in pools[0]} <= {r["prompt"] for r in full}
    assert [r["prompt"] for r in pools[0]] != [r["prompt"] for r in full[:500]]
    lengths = collections.Counter(toy.num_terms(r["prompt"]) for r in pools[0])
    longer = [lengths[k] for k in range(4, 10)]  # 3-term sums are 3% of the split (toy.toy_quota)
    assert 0 < lengths[3] < min(longer) and max(longer) < 2 * min(longer), lengths
    n = len(full)
    assert f"training on a pool of 500 of the {n} training prompts (--train_prompts)" in lines
    with pytest.raises(data.DataError, match=f"--train_prompts {n + 1} is more than the {n} training prompts"):
        data.load_task(config.parse_args(["--train_prompts", str(n + 1)]), tokenizer, log=lines.append)
    with pytest.raises(config.ConfigError, match="--train_prompts is a number of prompts"):
        config.parse_args(["--train_prompts", "-1"])


def test_sampler_state_round_trips():
    a = rollouts.PromptSampler(_rows(7), seed=1, npr=True, npr_threshold=0.9)
    a.draw(9)
    a.record(3, 1.0)
    b = rollouts.PromptSampler(_rows(7), seed=1, npr=True, npr_threshold=0.9)
    b.load_state_dict(a.state_dict(pending=[5, 6]))  # drawn but not trained on: served first after a resume
    assert [i for i, _ in b.draw(2)] == [5, 6]
    assert [i for i, _ in a.draw(20)] == [i for i, _ in b.draw(20)]


def test_ranks_share_every_global_draw():
    whole = rollouts.PromptSampler(_rows(10), seed=2, npr=True, npr_threshold=0.9).draw(12)
    ranks = [rollouts.PromptSampler(_rows(10), seed=2, npr=True, npr_threshold=0.9).draw(12, rank, 3) for rank in range(3)]
    assert sorted(d for r in ranks for d in r) == sorted(whole)  # the same global batch, split three ways
    assert all(len(r) == 4 for r in ranks)


def test_generated_box_task_needs_the_number_itself():
    """math-verify would accept \\boxed{5 + 9} for 14 (SmolLM2 learned exactly that); the box task must not."""
    rows = data.box_rows()
    assert len(rows) == len({r["prompt"] for r in rows}) == 1000
    assert sum("Put the number" not in r["prompt"] for r in rows) == 243  # 81 sums x 3 phrasings
    assert rewards.grade_boxed_exact(["\\boxed{14}", "\\boxed{5 + 9}", "so \\boxed{14}.", "\\boxed{014}"], ["14"] * 4,
                                  thinking=False) == [1.0, -1.0, 1.0, -1.0]


def test_sums_task_holds_out_pairs_of_terms_not_wordings():
    train, val = data.sums_rows()
    assert (len(train), len(val)) == (520, 128) and data.sums_rows() == (train, val)  # fixed
    terms = lambda r: frozenset(int(x) for x in re.findall(r"\d+", r["prompt"]))  # noqa: E731
    assert not {terms(r) for r in train} & {terms(r) for r in val}  # no pair trained on in either order
    for r in train + val:
        assert sum(terms(r)) == int(r["answer"]) or len(terms(r)) == 1 and 2 * min(terms(r)) == int(r["answer"])
    one_digit = [r for r in val if max(terms(r)) < 10]
    assert len(one_digit) == 64  # half of the evaluation adds two one-digit numbers


def test_last_number_reads_a_worked_answer_as_a_person_would():
    grade = lambda c, a="12": rewards.grade_last_number([c], [a], thinking=False)[0]  # noqa: E731
    assert grade("7 + 5 = 12") == grade("The answer is 12.") == grade("12.0") == 1.0
    assert grade("7 + 5 = 12, or maybe 13") == -1.0  # hedging: the last number counts
    assert grade("12 apples, 3 left") == -1.0 and grade("no idea") == -1.0 and grade("") == -1.0
    assert grade("7 + 5 = 12-9=3", "3") == 1.0  # "12-9" is 12 minus 9, not 12 and -9
    assert grade("the sum is 1,000", "1000") == grade("-3", "-3") == 1.0
    assert rewards.grade_last_number(["12 </think> 13"], ["13"], thinking=True) == [1.0]  # the answer part only
    assert rewards.grade_last_number(["12 still thinking"], ["12"], thinking=True) == [-1.0]
    assert rewards.last_number("9" * 100_000 + " = 5", False) == "5"  # one linear scan, whatever the text
    assert rewards.last_number("9" * 100_000 + " is 5", False) is None  # leads with another result


def test_last_number_refuses_an_answer_that_leads_with_another_result():
    """Found reading 50 completions of the SmolLM2 sums run's last step (README): "26 inches (23 + 6 = 29 inches)."
    was graded right; a person reads its answer as 26. A completion that leads with a number states it as its
    result, and two results that differ are a hedge, as two different boxes are."""
    grade = lambda c, a="29": rewards.grade_last_number([c], [a], thinking=False)[0]  # noqa: E731
    assert grade("26 inches (23 + 6 = 29 inches).") == -1.0
    assert rewards.last_number("26 inches (23 + 6 = 29 inches).", False) is None  # counted as no answer
    assert grade("29 (23 + 6 = 29).") == grade("29") == grade("29. Because 23 + 6 = 29.") == 1.0
    assert grade("23 + 6 = 29.") == grade("23 plus 6 equals 29.") == grade("23 and 6 make 29.") == 1.0
    assert grade("  23 * 1 + 6 = 29") == grade("-1 + 30 = 29") == grade("29 x 1 = 29") == 1.0
