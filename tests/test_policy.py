"""The trainer's effective batch (zero-variance filtering, advantages, truncated completions (A.15)) and its
micro-batches of packed rows.

    python -m pytest tests/test_policy.py -q
"""
import dataclasses
import hashlib
import random

import pytest
import torch

import config
import losses
import policy
from generate import Group, Sample


def _group(rewards, truncated=(), lengths=None):
    lengths = lengths or [3] * len(rewards)
    samples = [Sample(token_ids=[1] * n, logprobs=[-1.0] * n, versions=[0] * n, mask=[1] * n, reward=r,
                      correct=r > 0, truncated=i in truncated) for i, (r, n) in enumerate(zip(rewards, lengths))]
    return Group(uid="g", serial=0, prompt_idx=0, prompt_ids=[5, 6], answer="1", samples=samples)


def identity(values):
    return dict(values)


def test_zero_variance_groups_leave_the_batch_and_its_statistics():
    cfg = config.parse_args(["--group", "4", "--batch", "8", "--no_drop_truncated"])
    groups = [_group([1, -1, -1, -1]), _group([-1, -1, -1, -1])]
    kept, adv, zero_var, totals = policy.effective_batch(groups, cfg, identity)
    assert zero_var.tolist() == [False, True] and kept == groups[:1]
    assert totals["prompts"] == 1 and totals["completions"] == 4 and totals["tokens"] == 12
    expected = losses.advantages(torch.tensor([[1.0, -1, -1, -1]], dtype=torch.float64), "batch")
    assert torch.allclose(adv, expected)


def test_truncated_completions_leave_the_loss_but_shape_the_advantages():
    cfg = config.parse_args(["--group", "4", "--batch", "4"])
    assert cfg.drop_truncated  # the default (A.15)
    group = _group([1, -1, -1, 1], truncated={2}, lengths=[3, 4, 5, 6])
    kept, adv, _, totals = policy.effective_batch([group], cfg, identity)
    assert kept[0].samples[2].mask == [0] * 5 and group.samples[2].mask == [1] * 5  # a copy; the original intact
    assert totals["completions"] == 3 and totals["tokens"] == 3 + 4 + 6 and totals["scored"] == 4
    # the -1 of the truncated completion still counts in the group's mean: advantages as graded
    assert torch.allclose(adv, losses.advantages(torch.tensor([[1.0, -1, -1, 1]], dtype=torch.float64), "batch"))
    micro, _, _ = policy.micro_batches(kept, adv, dataclasses.replace(cfg, loss_agg="sample"), totals, "cpu")
    rows = [s for mb in micro for row in mb.rows for s in row]
    weights = torch.cat([mb.weight for mb in micro])[torch.cat([mb.mask for mb in micro]) > 0]
    assert len(rows) == 3 and abs(float(weights.sum()) - 1.0) < 1e-12  # sample average over the 3 trained ones


def test_a_step_whose_completions_are_all_truncated_has_no_gradient_not_a_nan():
    cfg = config.parse_args(["--group", "4", "--batch", "4"])
    kept, adv, _, totals = policy.effective_batch([_group([1, -1, -1, 1], truncated={0, 1, 2, 3})], cfg, identity)
    for agg in ("prompt", "sample", "token"):
        micro, _, _ = policy.micro_batches(kept, adv, dataclasses.replace(cfg, loss_agg=agg), totals, "cpu")
        assert micro == []  # nothing to train on: no micro-batch, so no optimizer step (not a non-finite one)


def test_truncated_completions_train_as_negatives_when_asked():
    cfg = config.parse_args(["--group", "4", "--batch", "4", "--no_drop_truncated"])
    kept, _, _, totals = policy.effective_batch([_group([1, -1, -1, 1], truncated={2})], cfg, identity)
    assert kept[0].samples[2].mask == [1, 1, 1] and totals["completions"] == 4


def test_trainer_only_bench_runs_without_vllm(tmp_path):
    """bench.py --trainer_only is what runs on a GPU machine without vLLM: it must not import it, and its
    FLOP count must match the model it builds (the body's matmul weights, the LM head on completions only)."""
    import json
    import subprocess
    import sys
    from conftest import ROOT
    out = tmp_path / "trainer.jsonl"
    code = ("import runpy, sys; sys.argv = ['bench.py', '--trainer_only', '--shapes', 'tiny', '--micro_batch_tokens_list',"
            f" '256,1024', '--sequences', '8', '--trainer_group', '4', '--prompt_tokens', '8', '--completion_tokens', '32', "
            f"'--trainer_steps', '1', '--peak_tflops', '1', '--out', '{out}']; runpy.run_path('bench.py', run_name='__main__');"
            " assert not any(m.startswith('vllm') for m in sys.modules), 'vllm was imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(out)]
    assert [r["micro_batch_tokens"] for r in rows] == [256, 1024]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["positions"] > 8 * 8 for r in rows)

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    import bench
    shape = bench.SHAPES["tiny"]
    model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, tie_word_embeddings=True))
    body = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    # one position, no completion, attention at seq 0: 3 x 2 x (body weights)
    assert bench.model_flops(shape, 1, 0, 0) == 6 * body
    assert bench.model_flops(shape, 1, 1, 0) == 6 * body + 6 * shape["vocab_size"] * shape["hidden_size"]


def _seqs(rng, n, prompt=(15, 25), completion=(20, 70)):
    """n (prompt ids, completion ids) of the toy's lengths by default, random tokens of its vocabulary."""
    return [([rng.randrange(1, 384) for _ in range(rng.randint(*prompt))],
             [rng.randrange(1, 384) for _ in range(rng.randint(*completion))]) for _ in range(n)]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_give_every_sequence_its_result_alone(toy_path, attention):
    """Several sequences per row, position ids restarting at each and no attention mask: every completion token's
    log-prob and entropy are those of its sequence run alone (fp32), and so are those of one sequence per row.
    Fails if a sequence attends to the one before it in its row (positions not restarting, or any mask)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(toy_path, dtype=torch.float32, attn_implementation=attention)
    rng = random.Random(0)
    seqs = _seqs(rng, 20, completion=(1, 70)) + _seqs(rng, 6, prompt=(1, 4), completion=(1, 8)) + [([5], [7])]
    micro, _ = policy.pack(seqs, 512, lambda s: len(s[0]) + len(s[1]))
    assert max(len(row) for rows in micro for row in rows) >= 3 and sum(map(len, micro)) < len(seqs)  # packed
    with torch.no_grad():
        alone = []
        for p, c in (s for rows in micro for row in rows for s in row):
            logp = torch.log_softmax(model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1], dim=-1)
            alone.append((logp.gather(-1, torch.tensor(c)[:, None])[:, 0], -(logp.exp() * logp).sum(-1)))
        expected = [torch.cat(x) for x in zip(*alone)]
        packed = [torch.cat(x) for x in zip(*(policy.completion_logprobs(model, rows, 1.0, 0) for rows in micro))]
        one_per_row = policy.completion_logprobs(model, [[s] for rows in micro for row in rows for s in row], 1.0, 0)
    # fp32 attention sums in another order in a longer row: a few ulps, which is 2e-6 at a log-prob of -16, so the
    # tolerance is relative; attending to the sequence before moves a log-prob by 4-9 nats on this model
    for got in (packed, one_per_row):
        for value, want in zip(got, expected):
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss", ["cispo", "gspo"])  # gspo: a ratio per sequence, through seq_id
def test_packed_micro_batches_give_the_gradient_of_one_sequence_per_micro_batch(toy_path, loss):
    """The loss's gradient does not depend on how the step is laid out: every sequence packed into one micro-batch
    gives the gradient of one sequence per micro-batch (fp32, the toy model)."""
    from transformers import AutoModelForCausalLM
    rng = random.Random(1)
    cfg = config.parse_args(["--group", "4", "--batch", "16", "--loss", loss])
    groups = []
    for g in range(4):
        lengths = [rng.randint(1, 60) for _ in range(4)]
        samples = [Sample(token_ids=[rng.randrange(1, 384) for _ in range(n)], logprobs=[-6.0] * n, versions=[0] * n,
                          mask=[1] * n, reward=r, correct=r > 0) for n, r in zip(lengths, [1.0, -1.0, 1.0, -1.0])]
        prompt = [rng.randrange(1, 384) for _ in range(rng.randint(2, 20))]
        groups.append(Group(uid=str(g), serial=g, prompt_idx=g, prompt_ids=prompt, answer="1", samples=samples))
    kept, adv, _, totals = policy.effective_batch(groups, cfg, identity)
    grads = []
    for budget in (4096, 1):
        model = AutoModelForCausalLM.from_pretrained(toy_path, dtype=torch.float32)
        micro, _, _ = policy.micro_batches(kept, adv, dataclasses.replace(cfg, micro_batch_tokens=budget), totals, "cpu")
        packed = max(len(row) for mb in micro for row in mb.rows) > 1
        assert len(micro) == (1 if budget > 1 else 16) and packed == (budget > 1)  # packed, or a sequence per call
        policy.backward(model, micro, cfg, len(micro), 1, 0)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max() > 1e-4 and (grads[0] - grads[1]).abs().max() < 1e-5 * grads[0].abs().max()


def test_pack_keeps_every_sequence_once_within_the_budget():
    """The toy's lengths (prompts 15-25 tokens, completions 20-70), 64 and 128 sequences, 2048-token
    micro-batches: each sequence lands exactly once, no micro-batch holds more than the budget (rows x longest row)
    and no row is wider than the longest sequence, the padding reported is the layout's, and packing pads less
    than one sequence per row: <= 5% at 128 sequences, ~7% at 64 (lengths at most ~2.7x apart: few pairs fit in
    a row as wide as the longest)."""
    length = lambda s: len(s[0]) + len(s[1])  # noqa: E731
    rng = random.Random(0)
    for n, most in ((64, 0.08), (128, 0.05)):
        padding = {True: [], False: []}
        for _ in range(20):
            seqs = _seqs(rng, n)
            for packed in (True, False):
                micro, frac = policy.pack(seqs, 2048, length, packed)
                placed = [id(s) for rows in micro for row in rows for s in row]
                assert sorted(placed) == sorted(map(id, seqs))  # every sequence, once
                widths = [max(sum(map(length, row)) for row in rows) for rows in micro]
                assert all(len(rows) * w <= 2048 for rows, w in zip(micro, widths))
                assert max(widths) == max(map(length, seqs)) and (packed or all(len(r) == 1 for m in micro for r in m))
                assert frac == pytest.approx(1 - sum(map(length, seqs)) / sum(len(r) * w for r, w in zip(micro, widths)))
                padding[packed].append(frac)
        mean = {k: sum(v) / len(v) for k, v in padding.items()}
        assert mean[True] <= most and mean[True] < 0.75 * mean[False], (n, mean)
    # a sequence longer than the budget goes alone
    micro, _ = policy.pack([([1] * 100, [2] * 100), ([1] * 20, [2] * 20), ([1] * 20, [2] * 30)], 128, length)
    assert [[len(row) for row in rows] for rows in micro] == [[1], [2]]


def test_weights_sha256_names_the_weights_by_content(tmp_path):
    """train.py logs it so that a result names its warm start (the toy is rebuilt per machine, README)."""
    assert policy.weights_sha256("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a Hub name: nothing local to hash
    assert policy.weights_sha256(str(tmp_path)) is None  # no safetensors
    (tmp_path / "model-00002.safetensors").write_bytes(b"second")
    (tmp_path / "model-00001.safetensors").write_bytes(b"first")
    both = policy.weights_sha256(str(tmp_path))
    per_file = [hashlib.sha256(b"first").hexdigest(), hashlib.sha256(b"second").hexdigest()]  # in name order
    assert both == hashlib.sha256("".join(per_file).encode()).hexdigest()
    (tmp_path / "model-00002.safetensors").write_bytes(b"changed")
    assert policy.weights_sha256(str(tmp_path)) != both
    assert policy.weights_sha256(str(tmp_path), max_bytes=5) is None  # too large to hash at start-up


def test_the_decode_roofline_counts_every_weight_once_and_each_kv_cache():
    """roofline.decode_roofline on a model built from the shape: the bytes a decode step reads are its weights
    (layers' matmuls, embedding, untied head: every parameter but the norms) plus S x 2 x layers x kv width x
    context; it binds on memory when the bandwidth is the scarce one, on compute when the FLOPs are."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    import roofline
    shape = roofline.SHAPES["toy"]
    model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, tie_word_embeddings=False))
    weights = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "bias" not in n)
    kv = shape["hidden_size"] * shape["num_key_value_heads"] // shape["num_attention_heads"]
    r = roofline.decode_roofline(shape, 8, 50, flops_peak=1e15, bytes_per_s=1e9)
    assert r["bytes"] == 4 * (weights + 8 * 2 * shape["num_hidden_layers"] * kv * 50) and r["binds"] == "memory"
    assert r["tokens_per_s"] == pytest.approx(8 / (r["bytes"] / 1e9))
    assert roofline.decode_roofline(shape, 8, 50, flops_peak=1e6, bytes_per_s=1e15)["binds"] == "compute"
    assert roofline.matmul_peak(n=256, tries=2) > 1e8 and roofline.bandwidth(mib=16, tries=2) > 1e8  # measured here
