"""The trainer: a Hugging Face causal LM sharded with FSDP2, the micro-batches of a step, the policy loss's
backward pass over them, and the optimizer step. train.py and bench.py call the same functions.

    model = build(path, device, torch.bfloat16, fp32_head=True)
    stats = train_step(model, optimizer, groups, cfg, step, pad_id)   # one optimizer step
        # = effective_batch (advantages, zero-variance filter) -> micro_batches (ready tensors)
        #   -> backward (the loss over micro-batches) -> optimizer_step (AdamW)

FP32 LM head (paper §3.2(c)): the master weights are fp32; each decoder layer is an FSDP2 unit that computes in
the compute dtype (bf16 on GPU), and the root unit (embedding, final norm, LM head, tied or not) computes in fp32
when fp32_head is set. FSDP2 casts each unit's inputs to its parameter dtype, so the head's matmul and the
log-softmax run in fp32 on a bf16 body. vLLM's head_dtype override does the matmul in fp32 too, from its bf16
copy of the weights: the two sides still differ by the rounding of the head's weights to bf16.
"""
import dataclasses
import glob
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

import losses


def resolve_model(name: str, out_dir: str, log=print) -> str:
    """--model -> a Hugging Face model folder or Hub name: the toy is built once and a GGUF file converted once,
    both cached in out_dir; any other name is returned as it is."""
    import toy
    if name in toy.MODELS:
        return toy.build_toy_model(out_dir, name, log=log)
    if gguf := gguf_file(name):
        return from_gguf(gguf, out_dir, log=log)
    if os.path.exists(name):
        return name
    import data  # a Hub name, or dir/name that is not there (config.py refuses other paths): offline, transformers
    from huggingface_hub import try_to_load_from_cache  # would retry for ~30 s, then say "couldn't connect"
    if not isinstance(try_to_load_from_cache(name, "config.json"), str) and not data.hub_reachable():
        raise ValueError(f"--model {name}: no such folder, not in the Hugging Face cache, and the Hub is not reachable "
                         f"(a toy is {', '.join(toy.MODELS)}; a GGUF file or a folder holding one also works)")
    return name


def weights_sha256(path: str, max_bytes: int = 4 << 30) -> str | None:
    """The sha256 of a local model folder's weights, logged with every run so that a result names the exact weights
    it started from: the toy's warm start is rebuilt on each machine and can differ between CPUs (toy.py), and RL
    from another start can differ (docs/study.md). One safetensors file: its sha256, as `sha256sum` prints it;
    several: the sha256 of their digests in name order.
    None for a Hub name, a folder without safetensors, or weights over max_bytes (hashing reads ~1 GB/s)."""
    import hashlib

    from checkpoint import file_sha256
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else []
    if not files or sum(map(os.path.getsize, files)) > max_bytes:
        return None
    digests = [file_sha256(file) for file in files]
    return digests[0] if len(digests) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()


def gguf_file(name: str) -> str | None:
    """The GGUF file `--model` names: a .gguf file, or a folder holding exactly one; else None."""
    if name.endswith(".gguf"):
        return name
    hf_folder = os.path.isfile(os.path.join(name, "config.json"))  # a Hugging Face folder is loaded as one
    found = glob.glob(os.path.join(name, "*.gguf")) if os.path.isdir(name) and not hf_folder else []
    return found[0] if len(found) == 1 else None


def from_gguf(path: str, out_dir: str, log=print) -> str:
    """A Hugging Face folder for a GGUF model: dequantized once (fp32) into out_dir/gguf-<sha256 of the file>/, then
    found there by content (a changed file is converted again). Both vLLM and the trainer load that folder, so
    they start from the same weights. Raises ValueError with one line for a missing file or package, a corrupt
    file, or an architecture transformers cannot read from GGUF."""
    import importlib.util
    import shutil
    from transformers import AutoTokenizer

    from checkpoint import file_sha256
    from data import one_line
    if not os.path.isfile(path):
        raise ValueError(f"--model {path}: no such GGUF file")
    final = os.path.join(out_dir, f"gguf-{file_sha256(path)[:16]}")
    if os.path.isfile(os.path.join(final, "config.json")):
        return final
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"--model {path}: reading GGUF files needs the {package} package (pip install {package})")
    log(f"converting {path} to Hugging Face format in {final} (once; cached by its SHA-256)")
    folder, name = os.path.split(os.path.abspath(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # a corrupt file, an architecture transformers cannot dequantize, ...
        raise ValueError(f"--model {path}: cannot be read as a GGUF causal LM ({one_line(e)})") from None
    model.config.quantization_config = None  # dequantized: a plain fp32 checkpoint from here on
    model.hf_quantizer = None
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if os.path.exists(final):  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, final)
    return final


def build(path, device: torch.device, compute_dtype: torch.dtype, fp32_head: bool, mesh=None,
          checkpointing: bool = False, chunk_tokens: int = 1024):
    """Load (fp32) and shard with FSDP2 over `mesh` (None: the default process group; a world of one works too).
    `path` may also be a model already made (bench.py's random-initialized shapes).
    Only rank 0 reads the weights, into host memory; the other ranks build the model on the meta device (no
    memory) and, once sharded, receive their shards from rank 0 (set_model_state_dict, broadcast_from_rank0).
    fully_shard moves one unit at a time to the device and keeps its shard, so no GPU ever holds the whole fp32
    model, and the host holds one copy, not one per rank.
    checkpointing: each decoder layer keeps only its input and recomputes the rest in backward (activations ~2 x
    hidden bytes per position per layer instead of ~34). chunk_tokens: positions per chunk at the LM head
    (LogprobHead)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    broadcast = world > 1 and not isinstance(path, torch.nn.Module)
    if isinstance(path, torch.nn.Module):
        model = path
    elif rank == 0:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    full_state = model.state_dict() if broadcast and rank == 0 else {}
    if model.config._attn_implementation not in ("sdpa", "eager"):  # flash attention: see completion_logprobs
        raise ValueError(f"attention {model.config._attn_implementation!r} cannot mask packed rows; use sdpa or eager")
    attach_head(model, chunk_tokens)
    for layer in model.base_model.layers:
        if checkpointing:
            from torch.distributed._composable import checkpoint
            checkpoint(layer)  # before fully_shard, as FSDP2 expects: backward regathers the layer and recomputes it
        fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=compute_dtype,
                                                                      reduce_dtype=torch.float32))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(
        param_dtype=torch.float32 if fp32_head else compute_dtype, reduce_dtype=torch.float32))
    if broadcast:
        if rank != 0:
            model.to_empty(device=device)
        set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True,
                                                                         broadcast_from_rank0=True))
        for buffer in model.buffers():  # rotary frequencies and the like are not in the state dict: rank 0's
            dist.broadcast(buffer, src=0)
    return model.to(device)


class LogprobHead(torch.nn.Module):
    """The LM head as the trainer uses it: from the final hidden states of every position (B, width, H) to the
    log-prob and entropy of the completion tokens only, (N, 2) fp32, chunk_tokens positions at a time. With
    several chunks each chunk's (chunk, vocab) fp32 logits are recomputed in backward rather than kept, so no
    fp32 tensor larger than chunk x vocab exists, whatever the sequence length. It replaces the model's lm_head
    and keeps its weight (the same Parameter: tied embeddings stay tied, the name stays lm_head.weight), so it
    runs inside the model's forward, where FSDP2 has gathered the root unit's weights; completion_logprobs sets
    what to pick in `request` before each call."""

    def __init__(self, weight: torch.nn.Parameter, chunk_tokens: int):
        super().__init__()
        self.weight, self.chunk_tokens, self.request = weight, chunk_tokens, None

    def forward(self, hidden):  # (B, width, H)
        rows, positions, targets, temperature = self.request
        picked = hidden[rows, positions]  # (N, H): the positions that predict a completion token
        chunk = self.chunk_tokens if self.chunk_tokens > 0 else max(len(targets), 1)
        out = []
        for i in range(0, len(targets), chunk):
            args = (picked[i:i + chunk], self.weight, targets[i:i + chunk], temperature)
            if len(targets) > chunk:  # several chunks: recompute each in backward instead of keeping its logits
                out.append(torch.utils.checkpoint.checkpoint(_head_chunk, *args, use_reentrant=False))
            else:
                out.append(_head_chunk(*args))
        return torch.cat(out)


def _head_chunk(hidden, weight, targets, temperature: float):
    """(n, H) hidden states -> (n, 2): the log-prob of each target (nats, fp32, differentiable) and the entropy
    of its distribution (nats, detached: a metric)."""
    logprobs = torch.log_softmax((hidden.to(weight.dtype) @ weight.T).float() / temperature, dim=-1)  # (n, V)
    picked = logprobs.gather(-1, targets[:, None])[:, 0]
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    return torch.stack([picked, entropy], dim=-1)


def attach_head(model, chunk_tokens: int = 1024):
    """Put a LogprobHead in place of the model's lm_head (once). Models that scale or soft-cap their logits after
    the head are refused: the LogprobHead would skip that step."""
    if isinstance(model.lm_head, LogprobHead):
        return
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(model.config, name, None) not in (None, 1, 1.0):
            raise ValueError(f"{type(model).__name__} transforms its logits after the head ({name}), which the "
                             "trainer's chunked LM head does not do")
    model.lm_head = LogprobHead(model.lm_head.weight, chunk_tokens)


def completion_logprobs(model, rows: list[list[tuple[list[int], list[int]]]], temperature: float, pad_id: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi_train and entropy (nats) of every completion token, flat in the order of the sequences, row by row,
    (N,) each. A row holds one or more (prompt, completion) sequences end to end (packed, see pack), padded at
    its end to the longest row. Each sequence's position ids restart at 0, and with position_ids and no
    attention_mask transformers masks attention block-diagonally (masking_utils.find_packed_sequence_indices: a
    position id other than the previous + 1 starts a sequence; sdpa and eager then get a causal mask within each
    sequence), so every token's result is that of its sequence alone (tested). Flash attention reads packing
    from position ids only in a batch of one row, hence build's check. The LM head runs on the N positions that
    predict a completion token only, in chunks (LogprobHead)."""
    attach_head(model)
    dev = next(model.parameters()).device
    width = max(sum(len(p) + len(c) for p, c in row) for row in rows)
    ids, pos, picks = [], [], []  # picks: (row, position that predicts the token) of each completion token
    for i, row in enumerate(rows):
        ids.append([])
        pos.append([])
        for p, c in row:
            picks += [(i, len(ids[i]) + len(p) - 1 + t) for t in range(len(c))]
            ids[i] += p + c
            pos[i] += range(len(p) + len(c))
        # the padding at the row's end restarts at 0 too: a sequence of its own, after every real token of the
        # row, so causal attention keeps it out of their results
        tail = width - len(ids[i])
        ids[i] += [pad_id] * tail
        pos[i] += range(tail)
    r, t = torch.tensor(picks, device=dev).T
    targets = torch.tensor([tok for row in rows for _, c in row for tok in c], device=dev)
    model.lm_head.request = (r, t, targets, temperature)
    out = model(input_ids=torch.tensor(ids, device=dev), position_ids=torch.tensor(pos, device=dev),  # (B, width)
                logits_to_keep=0, use_cache=False).logits  # (N, 2): the LogprobHead's output
    model.lm_head.request = None
    return out[:, 0], out[:, 1].detach()


def pack(items: list, budget_tokens: int, length, packed: bool = True) -> tuple[list[list[list]], float]:
    """Items -> micro-batches of rows of items, and the share of their positions that is padding (row ends).
    Rows: first-fit decreasing (longest item first, each into the first row with room) into rows as long as the
    longest item, or budget_tokens if less. No row is wider than that item alone, so attention, dense over a row
    under sdpa's block-diagonal mask, costs no more per position than unpacked. Rows only as wide as each
    micro-batch's own longest item would pad about as much as one item per row on the toy's lengths (at most
    ~2.7x apart: long items leave gaps no item fits, and short ones pair only in rows a long one made wide).
    packed=False: one item per row (what padding would be without packing). Micro-batches: the rows longest
    first, cut into the fewest micro-batches of at most budget_tokens positions (rows x longest row; a longer
    row goes alone), and of those cuts the one with the least padding."""
    capacity = min(max(map(length, items), default=0), budget_tokens)
    rows = []  # [tokens, items] per row
    for it in sorted(items, key=length, reverse=True):
        row = next((r for r in rows if r[0] + length(it) <= capacity), None) if packed else None
        if row is None:
            rows.append(row := [0, []])
        row[0] += length(it)
        row[1].append(it)
    rows.sort(key=lambda r: -r[0])
    # best[i]: (micro-batches, padded positions) of the best cut of rows[i:], compared in that order; ends[i]:
    # where its first micro-batch ends
    best, ends = [(0, 0)] * (len(rows) + 1), [0] * len(rows)
    for i in reversed(range(len(rows))):
        width, real, options = rows[i][0], 0, []
        for j in range(i + 1, len(rows) + 1):
            if j > i + 1 and (j - i) * width > budget_tokens:
                break
            real += rows[j - 1][0]
            options.append(((best[j][0] + 1, best[j][1] + (j - i) * width - real), j))
        best[i], ends[i] = min(options)
    batches, i = [], 0
    while i < len(rows):
        batches.append([items for _, items in rows[i:ends[i]]])
        i = ends[i]
    return batches, best[0][1] / (best[0][1] + sum(r[0] for r in rows)) if rows else 0.0


def all_reduce(values: dict, op=None) -> dict:
    """{name: number} summed (or reduced by op, a dist.ReduceOp) over ranks, in one collective; unchanged without
    a process group."""
    if not dist.is_initialized():
        return dict(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces on this rank's current GPU
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return dict(zip(values, t.tolist()))


def effective_batch(groups: list, cfg, reduce=all_reduce) -> tuple[list, torch.Tensor, torch.Tensor, dict]:
    """Advantages (paper §3.2(b)) and zero-variance filtering (§3.2(e)) of one step's groups on this rank.
    reduce({name: number}) sums over ranks. Returns the kept groups (P'), their advantages (P', G), the
    zero-variance mask of all groups (P,) and the step's global counts: the prompts, completions and sampled
    tokens that the loss trains on, the completions scored (kept groups x G) and their sum of squared centered
    rewards (batch-level normalization's numerator and count). With cfg.drop_truncated, truncated completions
    are kept as copies with mask 0: no loss, but their reward counts in their group's mean."""
    rewards = torch.tensor([[s.reward for s in g.samples] for g in groups], dtype=torch.float64)  # (P, G)
    zero_var = losses.zero_variance(rewards)  # (P,) bool
    keep = ~zero_var if cfg.zero_var_filter else torch.ones_like(zero_var)
    kept = [g for g, k in zip(groups, keep.tolist()) if k]
    if cfg.drop_truncated:  # A.15: out of the loss (mask 0), while their -1 still shapes the others' advantages
        kept = [dataclasses.replace(g, samples=[dataclasses.replace(s, mask=[0] * len(s.mask)) if s.truncated else s
                                                for s in g.samples]) for g in kept]
    centered = rewards[keep] - rewards[keep].mean(dim=1, keepdim=True)
    totals = reduce({"prompts": sum(any(any(s.mask) for s in g.samples) for g in kept),
                     "completions": sum(any(s.mask) for g in kept for s in g.samples),
                     "tokens": sum(sum(s.mask) for g in kept for s in g.samples),
                     "scored": len(kept) * cfg.group, "adv_sq_sum": float((centered ** 2).sum())})
    adv = losses.advantages(rewards[keep], cfg.adv_norm, totals["adv_sq_sum"], int(totals["scored"]))
    return kept, adv, zero_var, totals


@dataclass
class MicroBatch:
    """One forward/backward's worth of completions, as ready tensors. Flat tensors are over the completion
    tokens of all sequences, row by row (completion_logprobs' order), shape (N,)."""
    rows: list[list[tuple[list[int], list[int]]]]  # (prompt ids, completion ids) of each sequence, packed in rows
    logp_gen: torch.Tensor  # log pi_gen of each token, nats (0 for injected tokens)
    adv: torch.Tensor  # the completion's advantage, repeated over its tokens
    weight: torch.Tensor  # aggregation weight per token (losses.token_weights), float64
    mask: torch.Tensor  # 1 sampled, 0 injected (the interruption phrase)
    seq_id: torch.Tensor  # the sequence's index in that order, long


def micro_batches(groups: list, adv: torch.Tensor, cfg, totals: dict, device) -> tuple[list[MicroBatch], float, float]:
    """The step's kept groups (P) and their advantages (P, G) -> micro-batches of at most cfg.micro_batch_tokens
    (rows x longest row), sequences packed in rows (pack). Every token's aggregation weight comes from the step's
    global counts in totals (prompts, completions, tokens over all ranks), so the loss summed over micro-batches
    and ranks, and its gradient, do not depend on how the batch is split (paper §3.2(a); tested). Returns the
    micro-batches and the padding fraction packed and with one sequence per row."""
    seqs = [(g.prompt_ids, s, a) for g, group_adv in zip(groups, adv.tolist()) for s, a in zip(g.samples, group_adv)]
    prompt_tokens = [sum(sum(s.mask) for s in g.samples) for g in groups for _ in g.samples]
    trained = [any(s.mask) for _, s, _ in seqs]  # a sequence with no sampled token (dropped as truncated) adds nothing
    seqs, prompt_tokens = [q for q, t in zip(seqs, trained) if t], [n for n, t in zip(prompt_tokens, trained) if t]
    weights = losses.token_weights(cfg.loss_agg, torch.tensor([sum(s.mask) for _, s, _ in seqs], dtype=torch.long),
                                   torch.tensor(prompt_tokens, dtype=torch.long), int(totals["prompts"]),
                                   int(totals["completions"]), int(totals["tokens"])).tolist()
    items, length = [(*q, w) for q, w in zip(seqs, weights)], lambda it: len(it[0]) + len(it[1].token_ids)
    batches, padding = pack(items, cfg.micro_batch_tokens, length)
    return [_micro_batch(b, device) for b in batches], padding, pack(items, cfg.micro_batch_tokens, length, False)[1]


def _micro_batch(rows: list[list], device) -> MicroBatch:
    """Rows of (prompt ids, sample, advantage, weight) -> a MicroBatch; flat tensors over their tokens, row by row."""
    seqs = [it for row in rows for it in row]

    def flat(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)
    return MicroBatch(rows=[[(p, s.token_ids) for p, s, _, _ in row] for row in rows],
                      logp_gen=flat([x for _, s, _, _ in seqs for x in s.logprobs], torch.float32),
                      adv=flat([a for _, s, a, _ in seqs for _ in s.mask], torch.float32),
                      weight=flat([w for _, s, _, w in seqs for _ in s.mask], torch.float64),
                      mask=flat([m for _, s, _, _ in seqs for m in s.mask], torch.long),
                      seq_id=flat([i for i, (_, s, _, _) in enumerate(seqs) for _ in s.mask], torch.long))


def backward(model, micro: list[MicroBatch], cfg, num_micro: int, world: int, pad_id: int) -> dict:
    """Forward and backward of the policy loss (losses.policy_loss) over the micro-batches; gradients
    accumulate in the parameters. num_micro is the most micro-batches any rank has: a rank with fewer runs a
    dummy pass that contributes nothing, to keep FSDP's collectives in step. Returns this rank's metric sums."""
    hyper = losses.hyperparameters(cfg.loss, cfg)
    sums = dict.fromkeys(("loss", "tokens", "is_ratio_sum", "clipped_tokens", "mismatch_sum", "entropy_sum"), 0.0)
    sums["is_ratio_max"] = 0.0
    for j in range(num_micro):
        if j >= len(micro):
            logp, _ = completion_logprobs(model, [[([pad_id], [pad_id])]], cfg.temperature, pad_id)
            (logp.sum() * 0.0).backward()
            continue
        mb = micro[j]
        logp, entropy = completion_logprobs(model, mb.rows, cfg.temperature, pad_id)
        loss, m = losses.policy_loss(cfg.loss, logp, logp_gen=mb.logp_gen, adv=mb.adv, weight=mb.weight,
                                     mask=mb.mask, seq_id=mb.seq_id, **hyper)
        (loss * world).backward()  # FSDP averages gradients over ranks; the loss is a sum over them
        sums["loss"] += loss.item()
        for k in ("tokens", "is_ratio_sum", "clipped_tokens", "mismatch_sum"):
            sums[k] += m[k]
        sums["entropy_sum"] += float((entropy * mb.mask).sum())
        sums["is_ratio_max"] = max(sums["is_ratio_max"], m["is_ratio_max"])
    return sums


def learning_rate(cfg, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warm-up, then constant (paper A.3)."""
    return cfg.lr * min(1.0, (step + 1) / max(cfg.warmup_steps, 1))


def optimizer_step(model, optimizer, lr: float, grad_clip: float, loss: float, has_gradient: bool = True
                   ) -> tuple[float, bool]:
    """AdamW at this lr, unless the (global) loss or gradient norm is not finite: then the step is skipped and
    weights and optimizer state stay untouched; nor is a step taken when no rank had a micro-batch
    (has_gradient False: every group was filtered). Gradients are cleared either way. -> (grad norm, finite)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    finite = math.isfinite(grad_norm) and math.isfinite(loss)
    if finite and has_gradient:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


@dataclass
class StepStats:
    """What one train_step did. sums are this rank's (backward's metric sums); totals are global (all ranks)."""
    kept: list  # the groups in the loss (zero-variance groups filtered out), on this rank
    zero_var: torch.Tensor  # (P,) bool, all of this rank's groups
    totals: dict  # the step's global counts (effective_batch) and "loss", the global loss
    sums: dict  # this rank's metric sums over its micro-batches (backward)
    lr: float
    grad_norm: float
    finite: bool  # loss and gradient norm finite (else the step was skipped)
    updated: bool  # the weights changed: finite, and some rank had a micro-batch
    padding: float  # padding fraction of the packed micro-batches
    padding_unpacked: float  # what one sequence per row would have padded
    t_train: float  # seconds: advantages, micro-batches, forward and backward
    t_optim: float  # seconds: gradient norm and AdamW


def train_step(model, optimizer, groups: list, cfg, step: int, pad_id: int) -> StepStats:
    """One optimizer step (0-based `step`, for the warm-up) on this rank's graded groups; every rank calls it.
    train.py and bench.py both train through it."""
    t0 = time.time()
    # advantages (§3.2(b)) and zero-variance filtering (§3.2(e)): a group whose G rewards are all equal has zero
    # advantages; it leaves the loss and the batch statistics (the "effective batch")
    kept, adv, zero_var, totals = effective_batch(groups, cfg)
    # the loss over micro-batches of packed rows (§3.2(a), Eq. 4), gradients summed over them and over ranks
    device = next(model.parameters()).device
    micro, padding, padding_unpacked = micro_batches(kept, adv, cfg, totals, device)
    num_micro = int(all_reduce({"n": len(micro)}, op=dist.ReduceOp.MAX)["n"])
    world = dist.get_world_size() if dist.is_initialized() else 1
    sums = backward(model, micro, cfg, num_micro, world, pad_id)
    totals["loss"] = all_reduce({"loss": sums["loss"]})["loss"]
    t1 = time.time()
    # AdamW (A.3) after a linear warm-up; a non-finite loss or gradient skips the step, weights and state untouched
    lr = learning_rate(cfg, step)
    grad_norm, finite = optimizer_step(model, optimizer, lr, cfg.grad_clip, totals["loss"], has_gradient=num_micro > 0)
    return StepStats(kept, zero_var, totals, sums, lr, grad_norm, finite, finite and num_micro > 0, padding,
                     padding_unpacked, t1 - t0, time.time() - t1)


def full_weights(model, dtype: torch.dtype = torch.float32):
    """(HF name, full tensor in dtype) of every parameter, gathered from the FSDP2 shards one tensor at a time;
    each shard is cast before the gather, so a bf16 engine receives half the bytes of the fp32 masters."""
    for name, p in model.named_parameters():
        p = p.detach().to(dtype)
        yield name, p.full_tensor() if hasattr(p, "full_tensor") else p
