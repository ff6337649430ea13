"""The paper's losses, loss aggregations and advantage normalizations: pure tensor math.

    python -m pytest tests/test_losses.py          # hand-computed values and gradients

Notation (paper §2-3): for completion i of a prompt's G, token t,
    rho_{i,t} = pi_train(y_{i,t}) / pi_gen(y_{i,t})     pi_gen = the logprob vLLM returned when it sampled
    A_i       = r_i - mean_G(r)                          then normalized, see advantages()
Every tensor here is flat over the completion tokens of a micro-batch (no padding): shape (N,).
`mask` is 1 for sampled tokens and 0 for injected ones (the interruption phrase); masked tokens get no loss.

Micro-batch invariance: the aggregation is a per-token weight computed once per optimizer step from the
whole batch (token_weights), so loss = sum_t weight_t * loss_t is a plain sum over micro-batches and ranks,
and its gradient does not depend on how the batch is split.
"""
import inspect

import torch

LOG_RATIO_CLAMP = 20.0  # |log rho| bound before exp: exp(20) ~ 5e8 is finite; larger means a broken sample


def advantages(rewards: torch.Tensor, norm: str, batch_sq_sum: float | None = None,
               batch_count: int | None = None, eps: float = 1e-6) -> torch.Tensor:
    """rewards (P, G) -> advantages (P, G).

    A_i = r_i - mean_G(r)                                  (paper Eq. 2)
    norm="prompt": A_i / (std_G(r) + eps)                  GRPO (Eq. 5)
    norm="batch":  A_i / (std of all A in the batch + eps) ScaleRL (§3.3, Reinforce++); the A of each group
                   sum to 0, so the batch mean is exactly 0 and std = sqrt(sum A^2 / (n - 1)). Pass the
                   global sum of A^2 and count when the batch is spread over ranks.
    norm="none":   A_i                                     Dr. GRPO
    """
    centered = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    if norm == "none":
        return centered
    if norm == "prompt":
        return centered / (rewards.std(dim=1, keepdim=True) + eps)
    if batch_sq_sum is None:
        batch_sq_sum, batch_count = float((centered ** 2).sum()), centered.numel()
    return centered / ((batch_sq_sum / max(batch_count - 1, 1)) ** 0.5 + eps)


def zero_variance(rewards: torch.Tensor) -> torch.Tensor:
    """rewards (P, G) -> (P,) True where a group's G rewards are all equal: every advantage is 0, so the group
    carries no learning signal (zero-variance filtering, paper §3.2(e))."""
    return rewards.std(dim=1) == 0


def token_weights(agg: str, num_tokens: torch.Tensor, prompt_tokens: torch.Tensor, num_prompts: int,
                  num_completions: int, total_tokens: int) -> torch.Tensor:
    """Per-completion weight of each of its tokens; the loss is sum_t weight * loss_t.

    num_tokens (C,): sampled tokens of each completion, |y_i|; prompt_tokens (C,): sampled tokens of all G
    completions of that completion's prompt, sum_g |y_g|. The three global counts are over the whole step's
    batch (all micro-batches, all ranks).
    agg="prompt": 1 / (num_prompts * sum_g |y_g|)   each prompt counts equally (paper §3.3, DAPO Eq. 8)
    agg="sample": 1 / (num_completions * |y_i|)     each completion counts equally (GRPO Eq. 7)
    agg="token":  1 / total_tokens                  each token counts equally
    """
    if agg == "prompt":
        return 1.0 / (num_prompts * prompt_tokens.clamp(min=1).double())
    if agg == "sample":
        return 1.0 / (num_completions * num_tokens.clamp(min=1).double())
    return torch.full_like(num_tokens, 1.0 / max(total_tokens, 1), dtype=torch.float64)


def cispo(logp, log_ratio, adv, seq_id, mask, eps_max, **_):
    """CISPO (paper Eq. 4, MiniMax-M1): J = sum_t sg(min(rho, eps_max)) * A * log pi_train.
    Truncates the IS weight from above only (lower bound 0): the gradient of every token flows, scaled."""
    rho = log_ratio.exp()
    weight = rho.clamp(max=eps_max).detach()
    return -weight * adv * logp, rho > eps_max


def _ppo_clip(rho, adv, low, high):
    """-min(rho A, clip(rho, low, high) A) and where the clip is the active branch (its gradient is zero)."""
    unclipped, clipped = rho * adv, rho.clamp(low, high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def dapo(logp, log_ratio, adv, seq_id, mask, eps_low, eps_high, **_):
    """DAPO (paper Eq. 8): min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), asymmetric "clip-higher"."""
    return _ppo_clip(log_ratio.exp(), adv, 1 - eps_low, 1 + eps_high)


def grpo(logp, log_ratio, adv, seq_id, mask, eps_clip, **_):
    """GRPO (paper Eq. 7, DeepSeek): min(rho A, clip(rho, 1 - eps, 1 + eps) A), symmetric."""
    return _ppo_clip(log_ratio.exp(), adv, 1 - eps_clip, 1 + eps_clip)


def gspo(logp, log_ratio, adv, seq_id, mask, gspo_eps_low, gspo_eps_high, **_):
    """GSPO (paper §3.2, A.17.3): a sequence-level ratio s_i = exp(mean_t log rho_{i,t}) (geometric mean over
    the completion's sampled tokens), min(s_i A, clip(s_i, 1 - eps_low, 1 + eps_high) A), broadcast to the
    completion's tokens; with loss_agg="sample" this is exactly GSPO's (1/G) sum_i. The mean log-ratio is
    clamped before exp: unclamped, a large mean log-ratio overflows exp to inf and the loss to NaN."""
    num_seqs = int(seq_id.max()) + 1 if seq_id.numel() else 0
    sums = torch.zeros(num_seqs, dtype=log_ratio.dtype, device=log_ratio.device).index_add(0, seq_id, log_ratio * mask)
    counts = torch.zeros(num_seqs, dtype=log_ratio.dtype, device=log_ratio.device).index_add(0, seq_id, mask)
    seq_log_ratio = (sums / counts.clamp(min=1)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (S,)
    return _ppo_clip(seq_log_ratio.exp()[seq_id], adv, 1 - gspo_eps_low, 1 + gspo_eps_high)


# The registry: --loss chooses from it (config.py). A new loss is a function with the signature above, its own
# hyperparameters named after Config fields (eps_max, eps_low, ...; add a field for a new one), and an entry here.
LOSSES = {"cispo": cispo, "dapo": dapo, "gspo": gspo, "grpo": grpo}
TENSOR_ARGS = ("logp", "log_ratio", "adv", "seq_id", "mask")


def hyperparameters(loss: str, cfg) -> dict:
    """The loss function's own keyword arguments (e.g. cispo's eps_max), read from cfg by name."""
    params = inspect.signature(LOSSES[loss]).parameters.values()
    return {p.name: getattr(cfg, p.name) for p in params
            if p.name not in TENSOR_ARGS and p.kind is p.POSITIONAL_OR_KEYWORD}


def policy_loss(loss: str, logp: torch.Tensor, logp_gen: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor,
                mask: torch.Tensor, seq_id: torch.Tensor, **eps) -> tuple[torch.Tensor, dict]:
    """Loss to minimize for one micro-batch, and metric sums for the step's record.

    logp (N,) log pi_train with grad; logp_gen (N,) log pi_gen; adv (N,) the completion's advantage per token;
    weight (N,) from token_weights; mask (N,) 1 sampled / 0 injected; seq_id (N,) completion index 0..S-1.
    Sum the returned losses over micro-batches (and ranks) to get the step's loss.
    """
    mask = mask.to(logp.dtype)
    # masked tokens get log_ratio 0 so no inf/NaN can leak in through 0 * inf
    log_ratio = ((logp - logp_gen) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    per_token, clipped = LOSSES[loss](logp=logp, log_ratio=log_ratio, adv=adv, seq_id=seq_id, mask=mask, **eps)
    total = (per_token * weight.to(per_token.dtype) * mask).sum()
    with torch.no_grad():
        rho = log_ratio.exp()
        on = mask > 0
        metrics = {  # sums and counts, so micro-batches and ranks add up exactly
            "tokens": float(mask.sum()),
            "is_ratio_sum": float(rho[on].sum()),
            "is_ratio_max": float(rho[on].max()) if on.any() else 0.0,
            "clipped_tokens": float((clipped & on).sum()),
            "mismatch_sum": float((logp - logp_gen).abs()[on].sum()),
        }
    return total, metrics
