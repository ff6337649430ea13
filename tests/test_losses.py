"""losses.py against hand-computed values and gradients; micro-batch invariance of the step's gradient.

    python -m pytest tests/test_losses.py -q
"""
import math

import pytest
import torch

import losses

EPS = dict(eps_max=4.0, eps_low=0.2, eps_high=0.28, eps_clip=0.2, gspo_eps_low=3e-3, gspo_eps_high=5e-3)


def test_advantages_by_hand():
    r = torch.tensor([[1.0, -1, -1, 1], [1, 1, 1, -1]], dtype=torch.float64)
    centered = [[1, -1, -1, 1], [0.5, 0.5, 0.5, -1.5]]
    assert losses.advantages(r, "none").tolist() == centered
    # group std (unbiased): sqrt(4/3) for the first group, 1 for the second
    s = math.sqrt(4 / 3)
    assert torch.allclose(losses.advantages(r, "prompt", eps=0), torch.tensor(
        [[1 / s, -1 / s, -1 / s, 1 / s], [0.5, 0.5, 0.5, -1.5]], dtype=torch.float64))
    # batch std of all centred advantages: sqrt((4 + 3) / (8 - 1)) = 1
    assert torch.allclose(losses.advantages(r, "batch", eps=0), torch.tensor(centered, dtype=torch.float64))
    # the global form (sums from all ranks) gives the same when given this batch's sums
    assert torch.allclose(losses.advantages(r, "batch", 7.0, 8, eps=0), losses.advantages(r, "batch", eps=0))
    # a rank that sees only part of the batch still uses the global std
    assert torch.allclose(losses.advantages(r[1:], "batch", 7.0, 8, eps=0), torch.tensor([[0.5, 0.5, 0.5, -1.5]],
                                                                                             dtype=torch.float64))


def test_token_weights_by_hand():
    lens = torch.tensor([2, 3, 1, 4])  # two prompts of two completions: 5 and 5 tokens
    per_prompt = torch.tensor([5, 5, 5, 5])
    w = lambda agg: losses.token_weights(agg, lens, per_prompt, 2, 4, 10).tolist()  # noqa: E731
    assert w("prompt") == pytest.approx([0.1] * 4)
    assert w("sample") == pytest.approx([1 / 8, 1 / 12, 1 / 4, 1 / 16])
    assert w("token") == pytest.approx([0.1] * 4)
    # every aggregation's weights sum to 1 over the batch's tokens (a mean)
    for agg in ("prompt", "sample", "token"):
        assert sum(wi * n for wi, n in zip(w(agg), lens.tolist())) == pytest.approx(1.0)


# two completions: tokens 0-2 belong to completion 0 (token 2 injected), tokens 3-4 to completion 1
LOGP = [-0.5, -1.0, -2.0, -0.1, -3.0]
LOGP_GEN = [-0.6, -1.0, 0.0, -2.0, -2.5]  # token 3: rho = e^1.9 = 6.7 > eps_max; token 4: rho = e^-0.5 = 0.61
ADV = [1.0, 1.0, 1.0, -0.5, -0.5]
WEIGHT = [0.25, 0.25, 0.25, 0.5, 0.5]
MASK = [1, 1, 0, 1, 1]
SEQ = [0, 0, 0, 1, 1]


def run(loss):
    logp = torch.tensor(LOGP, requires_grad=True)
    total, metrics = losses.policy_loss(loss, logp, torch.tensor(LOGP_GEN), torch.tensor(ADV),
                                        torch.tensor(WEIGHT), torch.tensor(MASK), torch.tensor(SEQ), **EPS)
    total.backward()
    return total.item(), logp.grad.tolist(), metrics


def rho(t):
    return math.exp(LOGP[t] - LOGP_GEN[t])


def test_cispo_by_hand():
    value, grad, m = run("cispo")
    w = [min(rho(t), 4.0) for t in range(5)]  # truncated IS weight, stop-gradient
    expect = sum(-WEIGHT[t] * w[t] * ADV[t] * LOGP[t] * MASK[t] for t in range(5))
    assert value == pytest.approx(expect, rel=1e-6)
    assert grad == pytest.approx([-WEIGHT[t] * w[t] * ADV[t] * MASK[t] for t in range(5)], rel=1e-6)
    assert m["clipped_tokens"] == 1  # token 3 only
    assert m["tokens"] == 4


def test_cispo_keeps_gradient_above_eps_max():
    """Token 3 has rho = 6.7 > eps_max = 4: CISPO truncates its weight to 4 but its gradient still flows;
    PPO-style clipping (DAPO) zeroes the gradient of a clipped token."""
    _, grad_cispo, _ = run("cispo")
    assert grad_cispo[3] == pytest.approx(-0.5 * 4.0 * -0.5)
    # DAPO on a token with A > 0 and rho > 1 + eps_high: clipped, no gradient
    logp = torch.tensor([0.0], requires_grad=True)
    total, _ = losses.policy_loss("dapo", logp, torch.tensor([-1.0]), torch.tensor([1.0]), torch.tensor([1.0]),
                                  torch.tensor([1]), torch.tensor([0]), **EPS)
    total.backward()
    assert logp.grad.item() == 0.0
    logp = torch.tensor([0.0], requires_grad=True)
    total, _ = losses.policy_loss("cispo", logp, torch.tensor([-1.0]), torch.tensor([1.0]), torch.tensor([1.0]),
                                  torch.tensor([1]), torch.tensor([0]), **EPS)
    total.backward()
    assert logp.grad.item() == pytest.approx(-min(math.e, 4.0))


@pytest.mark.parametrize("loss,low,high", [("dapo", 0.8, 1.28), ("grpo", 0.8, 1.2)])
def test_ppo_clip_by_hand(loss, low, high):
    value, grad, m = run(loss)
    expect_value, expect_grad, clipped = 0.0, [], 0
    for t in range(5):
        r, a = rho(t), ADV[t]
        unclipped, clip = r * a, min(max(r, low), high) * a
        expect_value += -WEIGHT[t] * min(unclipped, clip) * MASK[t]
        active = unclipped <= clip  # the unclipped branch carries the gradient d(rho)/d(logp) = rho
        expect_grad.append(-WEIGHT[t] * a * r * MASK[t] if active else 0.0)
        clipped += (not active) and MASK[t]
    assert value == pytest.approx(expect_value, rel=1e-6)
    assert grad == pytest.approx(expect_grad, rel=1e-6, abs=1e-9)
    assert m["clipped_tokens"] == clipped


def test_gspo_by_hand():
    value, grad, m = run("gspo")
    # sequence ratios: geometric mean over the sampled tokens (token 2 is injected, excluded)
    s0 = math.exp(((LOGP[0] - LOGP_GEN[0]) + (LOGP[1] - LOGP_GEN[1])) / 2)  # e^0.05 = 1.051 > 1.005: clipped
    s1 = math.exp(((LOGP[3] - LOGP_GEN[3]) + (LOGP[4] - LOGP_GEN[4])) / 2)  # e^0.7 = 2.01, A < 0: unclipped
    clip = lambda s: min(max(s, 1 - 3e-3), 1 + 5e-3)  # noqa: E731
    per_seq = [-min(s0 * 1.0, clip(s0) * 1.0), -min(s1 * -0.5, clip(s1) * -0.5)]
    expect = (WEIGHT[0] + WEIGHT[1]) * per_seq[0] + (WEIGHT[3] + WEIGHT[4]) * per_seq[1]
    assert value == pytest.approx(expect, rel=1e-6)
    # seq 0 clipped (A > 0, s > 1 + eps): no gradient; seq 1: d/dlogp_t = -(sum of its weights) A s1 / |y|
    g1 = -(WEIGHT[3] + WEIGHT[4]) * -0.5 * s1 / 2
    assert grad == pytest.approx([0.0, 0.0, 0.0, g1, g1], rel=1e-6, abs=1e-9)
    assert m["clipped_tokens"] == 2


def test_gspo_finite_at_extreme_log_ratios():
    for gap in (100.0, -100.0):
        logp = torch.tensor([0.0, 0.0], requires_grad=True)
        total, m = losses.policy_loss("gspo", logp, torch.tensor([-gap, -gap]), torch.tensor([-1.0, -1.0]),
                                      torch.tensor([0.5, 0.5]), torch.tensor([1, 1]), torch.tensor([0, 0]), **EPS)
        total.backward()
        assert math.isfinite(total.item()) and all(map(math.isfinite, logp.grad.tolist()))
        assert math.isfinite(m["is_ratio_sum"]) and math.isfinite(m["is_ratio_max"])


def test_injected_tokens_get_no_gradient_for_every_loss():
    for loss in losses.LOSSES:
        _, grad, _ = run(loss)
        assert grad[2] == 0.0, loss


# --- micro-batch invariance --------------------------------------------------------------------------------
def _batch(seed=0, num_prompts=6, group=4, vocab=11, dim=5):
    """A tiny differentiable 'model' (embedding -> logits) and a batch of variable-length completions."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab, dim, generator=g)
    head = torch.randn(dim, vocab, generator=g, requires_grad=True)
    completions = []
    for p in range(num_prompts):
        for _ in range(group):
            n = int(torch.randint(1, 9, (1,), generator=g))
            tokens = torch.randint(0, vocab, (n + 1,), generator=g)
            mask = (torch.rand(n, generator=g) > 0.15).long()
            mask[0] = 1
            completions.append(dict(prompt=p, inputs=tokens[:-1], targets=tokens[1:], mask=mask,
                                    logp_gen=-torch.rand(n, generator=g) * 3))
    rewards = (torch.rand(num_prompts, group, generator=g) > 0.5).double() * 2 - 1
    return emb, head, completions, rewards


def _step_grad(loss, agg, norm, num_micro):
    emb, head, comps, rewards = _batch()
    group = rewards.shape[1]
    adv = losses.advantages(rewards, norm).flatten().float()
    lens = torch.tensor([int(c["mask"].sum()) for c in comps])
    per_prompt = lens.view(-1, group).sum(1).repeat_interleave(group)
    weights = losses.token_weights(agg, lens, per_prompt, rewards.shape[0], len(comps), int(lens.sum()))
    order = torch.randperm(len(comps), generator=torch.Generator().manual_seed(1)).tolist()  # split in any order
    chunks = [order[i::num_micro] for i in range(num_micro)]
    for chunk in chunks:
        logp = torch.cat([torch.log_softmax(emb[comps[i]["inputs"]] @ head, -1).gather(
            -1, comps[i]["targets"][:, None])[:, 0] for i in chunk])
        cat = lambda f: torch.cat([f(i) for i in chunk])  # noqa: E731
        total, _ = losses.policy_loss(
            loss, logp, cat(lambda i: comps[i]["logp_gen"]), cat(lambda i: adv[i].repeat(len(comps[i]["mask"]))),
            cat(lambda i: weights[i].repeat(len(comps[i]["mask"]))), cat(lambda i: comps[i]["mask"]),
            torch.cat([torch.full((len(comps[i]["mask"]),), j) for j, i in enumerate(chunk)]), **EPS)
        total.backward()
    return head.grad


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("agg", ["prompt", "sample", "token"])
def test_gradient_independent_of_micro_batches(loss, agg):
    whole = _step_grad(loss, agg, "batch", 1)
    split = _step_grad(loss, agg, "batch", 4)
    assert whole.abs().max() > 1e-4  # a real gradient
    assert (whole - split).abs().max() < 1e-6


# --- every loss x aggregation x normalization, composed as train.py composes them, against plain arithmetic ---
# two prompts x three completions of 1-4 tokens; token lists of (log pi_train, log pi_gen, sampled?)
COMBO_REWARDS = [[1.0, -1.0, -1.0], [1.0, 1.0, -1.0]]
COMBO_TOKENS = [
    [(-0.5, -0.7, 1), (-1.0, -1.0, 1), (-2.0, 0.0, 0)],  # last token injected (the interruption phrase)
    [(-0.1, -2.0, 1)],  # rho = e^1.9 = 6.7: above every clip and above eps_max
    [(-3.0, -2.5, 1), (-0.2, -0.25, 1)],
    [(-0.3, -0.3, 1), (-0.4, -0.35, 1), (-0.9, -1.1, 1), (-0.05, -0.04, 1)],
    [(-1.5, -1.2, 1), (-0.6, -0.6, 0)],
    [(-0.7, -0.2, 1), (-0.1, -0.1, 1), (-2.2, -2.0, 1)],
]


def _reference(loss, agg, norm):
    """Value and d/d(log pi_train) of the step's loss from the formulas, one number at a time."""
    group, prompts = 3, len(COMBO_REWARDS)
    adv = []
    for r in COMBO_REWARDS:
        mean = sum(r) / group
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (group - 1))
        adv.append([(x - mean) / (std + 1e-6) if norm == "prompt" else x - mean for x in r])
    if norm == "batch":
        flat = [a for row in adv for a in row]
        std = math.sqrt(sum(a * a for a in flat) / (len(flat) - 1))
        adv = [[a / (std + 1e-6) for a in row] for row in adv]
    n = [sum(m for _, _, m in toks) for toks in COMBO_TOKENS]
    value, grad = 0.0, []
    for i, toks in enumerate(COMBO_TOKENS):
        p, a = divmod(i, group)[0], adv[i // group][i % group]
        w = {"prompt": 1 / (prompts * sum(n[p * group:(p + 1) * group])),
             "sample": 1 / (len(COMBO_TOKENS) * n[i]), "token": 1 / sum(n)}[agg]
        s = math.exp(sum(lp - lg for lp, lg, m in toks if m) / n[i])  # GSPO's sequence ratio
        for lp, lg, m in toks:
            rho = math.exp(lp - lg)
            if not m:
                grad.append(0.0)
            elif loss == "cispo":
                value += -w * min(rho, 4.0) * a * lp
                grad.append(-w * min(rho, 4.0) * a)
            elif loss == "gspo":
                clipped = min(max(s, 1 - 3e-3), 1 + 5e-3) * a
                value += -w * min(s * a, clipped)
                grad.append(-w * n[i] * a * s / n[i] if s * a <= clipped else 0.0)  # n_i tokens share s_i
            else:
                low, high = (0.8, 1.28) if loss == "dapo" else (0.8, 1.2)
                clipped = min(max(rho, low), high) * a
                value += -w * min(rho * a, clipped)
                grad.append(-w * a * rho if rho * a <= clipped else 0.0)
    return value, grad


@pytest.mark.parametrize("norm", ["batch", "prompt", "none"])
@pytest.mark.parametrize("agg", ["prompt", "sample", "token"])
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_every_combination_by_hand(loss, agg, norm):
    group = 3
    rewards = torch.tensor(COMBO_REWARDS, dtype=torch.float64)
    adv = losses.advantages(rewards, norm).flatten()
    lens = torch.tensor([sum(m for _, _, m in toks) for toks in COMBO_TOKENS])
    per_prompt = lens.view(-1, group).sum(1).repeat_interleave(group)
    weight = losses.token_weights(agg, lens, per_prompt, len(COMBO_REWARDS), len(COMBO_TOKENS), int(lens.sum()))
    flat = [(i, *tok) for i, toks in enumerate(COMBO_TOKENS) for tok in toks]
    logp = torch.tensor([lp for _, lp, _, _ in flat], dtype=torch.float64, requires_grad=True)
    seq = torch.tensor([i for i, *_ in flat])
    total, _ = losses.policy_loss(loss, logp, torch.tensor([lg for _, _, lg, _ in flat], dtype=torch.float64),
                                  adv[seq], weight[seq], torch.tensor([m for *_, m in flat]), seq, **EPS)
    total.backward()
    value, grad = _reference(loss, agg, norm)
    assert total.item() == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert logp.grad.tolist() == pytest.approx(grad, rel=1e-9, abs=1e-12)
    assert any(g == 0.0 for g, (_, _, _, m) in zip(grad, flat) if m) == (loss != "cispo")  # something clipped
