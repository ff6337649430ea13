"""vLLM in the training process: logprobs, weight sync, interruptions, PipelineRL's lag bound.

    python -m pytest tests/test_generate.py -q
"""
import dataclasses
import functools

import pytest
import torch

import rewards
import rollouts


def trainer_logprobs(model, prompt_ids, completion_ids):
    """log pi_train of each completion token, fp32 (what train.py computes, without packing)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def engine_logprobs(gen, prompt_ids, completion_ids):
    """The engine's logprobs of a fixed completion (prompt logprobs of prompt + completion)."""
    from vllm import SamplingParams
    out = gen.llm.generate([{"prompt_token_ids": prompt_ids + completion_ids}],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False), use_tqdm=False)[0]
    scored = out.prompt_logprobs[len(prompt_ids):]
    return torch.tensor([d[t].logprob for d, t in zip(scored, completion_ids)])


@pytest.fixture
def restore(toy_path):
    """Give every engine touched back its original weights, whatever the test did to them."""
    touched = []
    yield touched.append
    from transformers import AutoModelForCausalLM
    for gen, path in touched:
        gen.update_weights(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters())


def _sample(gen, row, uid, n=4):
    gen.submit(uid, 0, row["prompt_ids"], row["answer"], n)
    return gen.run_until_done({uid})[0]


@pytest.mark.parametrize("tied", [False, True])
def test_weight_sync_after_an_optimizer_step(make_generator, toy_path, tokenizer, toy_rows, tmp_path, restore, tied):
    from transformers import AutoModelForCausalLM
    path = toy_path
    if tied:  # small Qwen models tie the LM head to the embedding; vLLM's reload mishandles that (generate.py)
        model = AutoModelForCausalLM.from_pretrained(toy_path, dtype=torch.float32, tie_word_embeddings=True)
        model.tie_weights()
        path = str(tmp_path / "tied")
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    gen = make_generator("--mode", "sync", "--dtype", "float32", path=path)
    restore((gen, path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.tie_word_embeddings == tied
    row = toy_rows[1][3]
    group = _sample(gen, row, f"sync-{tied}")
    # pi_gen: the logprob vLLM returned for each sampled token is the trainer's, up to fp32 noise
    for s in group.samples:
        sampled = torch.tensor(s.mask) == 1  # injected phrase tokens carry no pi_gen
        gap = torch.tensor(s.logprobs) - trainer_logprobs(model, row["prompt_ids"], s.token_ids)
        assert gap[sampled].abs().max() < 1e-3

    fixed = group.samples[0].token_ids
    before = engine_logprobs(gen, row["prompt_ids"], fixed)
    # one real optimizer step: CISPO on this group
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss = 0
    for s, a in zip(group.samples, adv):
        logits = model(torch.tensor([row["prompt_ids"] + s.token_ids])).logits[0, len(row["prompt_ids"]) - 1:-1]
        loss = loss - a * torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(s.token_ids)[:, None]).sum()
    loss.backward()
    opt.step()
    version = gen.version
    gen.update_weights(model.named_parameters())
    assert gen.version == version + 1
    after = engine_logprobs(gen, row["prompt_ids"], fixed)
    assert (after - trainer_logprobs(model, row["prompt_ids"], fixed)).abs().max() < 1e-3
    assert (after - before).abs().max() > 1e-2  # the update reached the engine


def test_interruption_injects_masked_phrase_and_grades_the_answer(make_generator, toy_rows):
    gen = make_generator("--mode", "sync")
    cfg = gen.cfg
    gen.cfg = dataclasses.replace(cfg, think_min_tokens=6, think_max_tokens=6)  # far shorter than any scratchpad
    try:
        row = next(r for r in toy_rows[1] if r["prompt"].count("+") >= 3)
        group = _sample(gen, row, "interrupt", n=8)
    finally:
        gen.cfg = cfg
    phrase = gen.phrase_ids
    for s in group.samples:
        if not s.interrupted:  # the model closed its thinking (or ended) within 6 tokens
            assert generate_closed_early(s, gen)
            continue
        start = 6  # exactly the budget of sampled thinking tokens, then the injected phrase
        assert s.token_ids[start:start + len(phrase)] == phrase
        assert s.mask[:start] == [1] * start and s.mask[start:start + len(phrase)] == [0] * len(phrase)
        assert all(m == 1 for m in s.mask[start + len(phrase):])
        assert s.versions[start:start + len(phrase)] == [-1] * len(phrase)
        assert s.logprobs[start:start + len(phrase)] == [0.0] * len(phrase)
        assert rewards.INTERRUPT_PHRASE in s.text
        answer_tokens = len(s.token_ids) - start - len(phrase)
        assert 1 <= answer_tokens <= cfg.answer_max_tokens
        # the answer written after the phrase is what gets graded
        after = s.text.split(rewards.INTERRUPT_PHRASE, 1)[1]
        assert rewards.final_answer(s.text) == rewards.final_answer(rewards.THINK_END + after)
    assert sum(s.interrupted for s in group.samples) >= 6


def generate_closed_early(s, gen):
    return gen.think_end_id in s.token_ids[:7] or s.token_ids[-1] == gen.eos_id


def test_seeded_sampling_is_reproducible(make_generator, toy_rows):
    """The same uid samples the same tokens; another uid samples others (on some of several prompts: the warm
    start answers easy ones almost deterministically)."""
    gen = make_generator("--mode", "sync")
    rows = [r for r in toy_rows[1] if r["prompt"].count("+") >= 4][:4]
    tokens = lambda uid: [[s.token_ids for s in _sample(gen, r, f"{uid}-{j}", n=8).samples]  # noqa: E731
                          for j, r in enumerate(rows)]
    a, b, c = tokens("same-uid"), tokens("same-uid"), tokens("other-uid")
    assert a == b
    assert a != c


def test_whole_batch_and_watched_requests_sample_alike(make_generator, toy_rows):
    """Sync hands the engine the whole batch and reads each completion once, finished; PipelineRL watches its
    training requests every step (for the lag bound). With one seeded generator per completion both sample the
    same tokens, and every sampled token carries the version that sampled it."""
    sync = make_generator("--mode", "sync")
    watched = make_generator("--mode", "pipeline", "--k", "2", "--pipeline_depth", "2", "--batch", "32", "--group", "4")
    rows = [r for r in toy_rows[1] if r["prompt"].count("+") >= 3][:6]

    def run(gen):
        uids = {f"alike-{j}" for j in range(len(rows))}
        for j, r in enumerate(rows):
            gen.submit(f"alike-{j}", j, r["prompt_ids"], r["answer"], 4, serial=j)
        return sorted(gen.run_until_done(uids), key=lambda g: g.serial)
    a, b = run(sync), run(watched)
    for gen, groups in ((sync, a), (watched, b)):
        for g in groups:
            for s in g.samples:
                assert s.started == gen.version and {v for v in s.versions if v >= 0} == {gen.version}
    assert [s.token_ids for g in a for s in g.samples] == [s.token_ids for g in b for s in g.samples]
    la, lb = ([x for g in groups for s in g.samples for x in s.logprobs] for groups in (a, b))
    assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-3)


def test_without_exact_sampling_the_engine_history_decides(make_generator, toy_rows):
    """--no_exact_sampling draws from the engine's one generator: the same uid twice samples other tokens."""
    gen = make_generator("--mode", "sync", "--no_exact_sampling")
    rows = [r for r in toy_rows[1] if r["prompt"].count("+") >= 4][:4]
    tokens = lambda: [[s.token_ids for s in _sample(gen, r, f"same-uid-{j}", n=8).samples]  # noqa: E731
                      for j, r in enumerate(rows)]
    assert tokens() != tokens()


@pytest.mark.parametrize("k,depth", [(2, 2), (3, 3)])
def test_pipeline_lag_is_bounded_and_updates_land_in_flight(make_generator, toy_path, toy_rows, restore, k, depth):
    """Lags stay within k - 1 and reach it when enough batches are in flight (--pipeline_depth >= k)."""
    from transformers import AutoModelForCausalLM
    gen = make_generator("--mode", "pipeline", "--k", str(k), "--pipeline_depth", str(depth), "--batch", "32",
                         "--group", "4")
    restore((gen, toy_path))
    assert not gen.prefix_caching  # in flight across updates: no stale prefix-cache hits possible
    train, _, grade = toy_rows
    sampler = rollouts.PromptSampler(train, seed=0, npr=False, npr_threshold=0.9)
    batches = rollouts.Rollouts(gen, sampler, grade, gen.cfg)
    model = AutoModelForCausalLM.from_pretrained(toy_path, dtype=torch.float32)
    spanning, lags = 0, []
    for step in range(8):
        gen.min_tokens = 40 if step % 3 == 1 else 0  # now and then a batch of long completions: stragglers
        batch = batches.next_batch()
        assert len(batch) == gen.cfg.prompts_per_step
        for g in batch:
            lag = gen.version - g.first_version()
            lags.append(lag)
            assert 0 <= lag <= k - 1, f"group {g.uid} trained {lag} versions after its first token (k={k})"
            for s in g.samples:
                versions = {v for v in s.versions if v >= 0}
                assert max(versions) <= gen.version
                spanning += len(versions) >= 2
        with torch.no_grad():  # stands in for an optimizer step
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        gen.update_weights(model.named_parameters())
    gen.min_tokens = 0
    assert spanning > 0, "no trained completion spans two policy versions: nothing was updated in flight"
    assert max(lags) == k - 1


def test_evaluate_reports_a_pass_rate(make_generator, toy_rows):
    gen = make_generator("--mode", "sync")
    _, val, grade = toy_rows
    cfg = gen.cfg
    result = rollouts.evaluate(gen, val[:20], cfg, grade)
    assert result["samples"] == 20 * cfg.eval_samples and result["prompts"] == 20
    p, n = result["correct"] / result["samples"], cfg.eval_samples
    se = result["variance_sum"] ** 0.5 / result["prompts"]  # for fixed prompts: at most the binomial s.e. x n/(n-1)
    assert 0 < se <= (p * (1 - p) / result["samples"] * n / (n - 1)) ** 0.5 + 1e-12
    assert 0 < result["correct"] < result["samples"]
    assert result == rollouts.evaluate(gen, val[:20], cfg, grade)  # same seeds, same weights, same result
    assert rollouts.evaluate(gen, [], cfg, grade)["samples"] == 0  # a rank with no eval prompts
    extract = functools.partial(rewards.final_answer, thinking=True)  # the toy's reward reads the last box
    answered = rollouts.evaluate(gen, val[:20], cfg, grade, extract=extract)["answered"]
    assert result["correct"] <= answered <= result["samples"]  # a right answer is an answer; not every answer is


def test_tensor_parallel_ranks_split_an_evaluation_and_keep_its_grading_budget(make_generator, toy_rows):
    """The two ranks of a --tp 2 engine generate the same evaluation groups and each grades every other one, in
    prompt order; together they count each completion once, and each gets the grading time of what the whole
    engine generated, as one rank would (a grader records the budget it is given)."""
    import dataclasses
    gen = make_generator("--mode", "sync")
    _, val, grade = toy_rows
    cfg = dataclasses.replace(gen.cfg, batch=16, eval_samples=3)  # 24 completions: 1.5 batches of grading time

    class Recording:
        def __init__(self):
            self.budgets = []

        def new_budget(self, seconds):
            self.budgets.append(seconds)

        def __call__(self, completions, answers):
            return grade(completions, answers)
    whole, halves = Recording(), [Recording(), Recording()]
    alone = rollouts.evaluate(gen, val[:8], cfg, whole)
    parts = [rollouts.evaluate(gen, val[:8], cfg, halves[i], share=(i, 2)) for i in (0, 1)]
    for key in ("correct", "samples", "prompts", "truncated", "completion_tokens"):
        assert parts[0][key] + parts[1][key] == alone[key], key
    assert parts[0]["prompts"] == parts[1]["prompts"] == 4
    assert halves[0].budgets == halves[1].budgets == whole.budgets == [cfg.grade_step_budget_s * 24 / 16]
