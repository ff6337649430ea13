"""The trainer's model: a Hugging Face causal LM sharded with FSDP2, and the log-probabilities of completions.

    from policy import build, completion_logprobs, buckets     # used by train.py and bench.py

FP32 LM head (paper §3.2(c)): the master weights are fp32; each decoder layer is an FSDP2 unit that computes in
the compute dtype (bf16 on GPU), and the root unit (embedding, final norm, LM head, tied or not) computes in fp32
when fp32_head is set. FSDP2 casts each unit's inputs to its parameter dtype, so the head's matmul and the
log-softmax run in fp32 on a bf16 body. vLLM's head_dtype override does the matmul in fp32 too, from its bf16
copy of the weights: the two sides still differ by the rounding of the head's weights to bf16.
"""
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM


def build(path: str, device: torch.device, compute_dtype: torch.dtype, fp32_head: bool):
    """Load (fp32) and shard over the default process group (a world of one works too)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    for layer in model.base_model.layers:
        fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32 if fp32_head else compute_dtype,
                                                      reduce_dtype=torch.float32))
    return model


def completion_logprobs(model, seqs: list[tuple[list[int], list[int]]], temperature: float, pad_id: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_train and entropy (nats) of every completion token, flat in the order of seqs, (N,) each. The
    sequences (prompt, completion) form one right-padded batch; callers bucket them by length so that little
    is padding, and the head runs only from the first position that predicts a completion token."""
    dev = next(model.parameters()).device
    lengths = [len(p) + len(c) for p, c in seqs]
    width, start = max(lengths), min(len(p) for p, _ in seqs) - 1
    ids = torch.tensor([p + c + [pad_id] * (width - n) for (p, c), n in zip(seqs, lengths)], device=dev)
    mask = torch.arange(width, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]  # (B, L)
    out = model(input_ids=ids, attention_mask=mask.long(), logits_to_keep=torch.arange(start, width - 1, device=dev),
                use_cache=False)
    logprobs = torch.log_softmax(out.logits.float() / temperature, dim=-1)  # (B, L - 1 - start, V) fp32
    # position t predicts token t + 1: pick each row's completion positions, in order
    rows = torch.tensor([i for i, (p, c) in enumerate(seqs) for _ in c], device=dev)
    cols = torch.tensor([len(p) - 1 - start + t for p, c in seqs for t in range(len(c))], device=dev)
    picked = logprobs[rows, cols]  # (N, V)
    targets = torch.tensor([t for _, c in seqs for t in c], device=dev)
    with torch.no_grad():
        entropy = -(picked.exp() * picked).sum(-1)
    return picked.gather(-1, targets[:, None])[:, 0], entropy


def buckets(items: list, budget_tokens: int, length) -> tuple[list[list], float, float]:
    """Micro-batches of items sorted by length(item) (prompt + completion tokens), each at most budget_tokens
    once padded to its longest row (a longer item gets its own). Returns the batches and the padding fraction
    with and without the sorting."""
    def padding(batches):
        padded = sum(len(b) * max(map(length, b)) for b in batches if b)
        real = sum(length(it) for b in batches for it in b)
        return 1 - real / padded if padded else 0.0

    def split(seq):
        batches, widest = [[]], 0
        for it in seq:
            n = length(it)
            if batches[-1] and (len(batches[-1]) + 1) * max(widest, n) > budget_tokens:
                batches, widest = batches + [[]], 0
            batches[-1].append(it)
            widest = max(widest, n)
        return [b for b in batches if b]
    sorted_batches = split(sorted(items, key=length))
    return sorted_batches, padding(sorted_batches), padding(split(items))
