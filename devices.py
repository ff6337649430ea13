"""Where each part of a run lives: ranks and their devices, the tensor-parallel groups that share a vLLM engine,
the FSDP2 mesh, and the GPU memory plan that splits each device between the trainer and vLLM. Pure functions of
the config, the model's shape and what torchrun sets, so every decision made for GPUs is tested on a CPU.

    python devices.py          # the memory plan's table for Qwen3-0.6B and Qwen3-8B at the paper's settings

Layout of 8 ranks with --tp 2: engines (tensor-parallel groups) {0,1} {2,3} {4,5} {6,7}; each group's ranks
submit the same requests to one engine sharded over their GPUs, then split its finished groups for training.
"""
import os
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """This process's place in the run: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and --tp."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    tp: int = 1  # ranks per vLLM engine (tensor-parallel size)

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def engines(self) -> int:
        """Data-parallel vLLM engines: each generates its share of every step's prompts."""
        return self.world // self.tp

    @property
    def engine(self) -> int:
        """This rank's engine (tensor-parallel group): ranks engine*tp .. engine*tp + tp - 1."""
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        """This rank's place in its engine's group: it trains on every tp-th of the engine's finished groups."""
        return self.rank % self.tp

    def device(self, cuda: bool) -> str:
        return f"cuda:{self.local_rank}" if cuda else "cpu"

    def mesh_shape(self) -> tuple[int, ...]:
        """FSDP2's mesh: one flat dimension on one node; across nodes (replicate, shard) = (nodes, ranks per
        node), HSDP, so each layer's all-gather and reduce-scatter stay on the node's own links and only the
        gradient all-reduce crosses nodes."""
        return (self.nodes, self.local_world) if self.nodes > 1 else (self.world,)


def layout_from_env(tp: int = 1, env=os.environ) -> Layout:
    """The layout torchrun describes in env (plain python: a world of one). Raises ValueError (one line) when
    --tp does not divide the ranks of a node: an engine's ranks must share a node's links."""
    if "RANK" not in env:
        layout = Layout(tp=tp)
    else:
        if "WORLD_SIZE" not in env:
            raise ValueError("RANK is set but WORLD_SIZE is not: start several processes with torchrun, or unset RANK")
        world = int(env["WORLD_SIZE"])
        layout = Layout(int(env["RANK"]), world, int(env.get("LOCAL_RANK", 0)),
                        int(env.get("LOCAL_WORLD_SIZE", world)), tp)
    if layout.local_world % tp or layout.world % layout.local_world:
        raise ValueError(f"--tp {tp} must divide the {layout.local_world} ranks of each node (torchrun "
                         f"--nproc_per_node), and every node must run as many ranks")
    return layout


@dataclass(frozen=True)
class Roles:
    """Who generates and who trains (--generators G, paper A.3: 64 generator GPUs and 16 trainer GPUs). Ranks
    0 .. T-1 train (FSDP2, or HSDP across nodes, over the trainers alone; rank 0 leads them and drives the
    generators), ranks T .. world-1 generate (vLLM alone on the device, --tp ranks per engine). G = 0: every rank
    does both in turn (colocated). Each role gets a world of its own: vLLM's external_launcher runs collectives
    over the whole default world while it builds, so a trainer in the generators' world would hang it."""
    job: Layout  # torchrun's whole job
    generators: int = 0

    @property
    def trainers(self) -> int:
        return self.job.world - self.generators

    @property
    def generating(self) -> bool:
        return self.job.rank >= self.trainers

    def layout(self) -> Layout:
        """This rank's place in its own role's world (the colocated layout when G = 0)."""
        j = self.job
        if not self.generators:
            return j
        if self.generating:  # on a CPU every generator's engine is a world of its own device
            return Layout(j.rank - self.trainers, self.generators, j.local_rank,
                          min(self.generators, j.local_world), j.tp)
        return Layout(j.rank, self.trainers, j.local_rank, min(self.trainers, j.local_world), 1)


def default_generators(world: int, tp: int, cuda: bool) -> int:
    """--generators -1: the paper's 4 generators to 1 trainer (A.3) on several GPUs, rounded down to whole engines
    (8 GPUs: 6 + 2; 2 GPUs: 1 + 1); colocated (0) on one device and on CPUs, where the toy's generator and
    trainer share the cores anyway and colocation is the tested default."""
    if not cuda or world < 2:
        return 0
    return max(tp, world * 4 // 5 // tp * tp) if world - tp >= 1 else 0


def roles_from_env(tp: int, generators: int, cuda: bool, env=os.environ) -> Roles:
    """Roles from torchrun's variables and --generators (-1: default_generators). Raises ValueError (one line)
    for a split that cannot run."""
    job = layout_from_env(1 if generators else tp, env)
    for name in ("MASTER_ADDR", "MASTER_PORT") if "RANK" in env else ():  # what torchrun sets beside RANK
        if name not in env:
            raise ValueError(f"RANK is set but {name} is not: start several processes with torchrun, or unset RANK")
    if generators == -1:
        generators = default_generators(job.world, tp, cuda)
    if not generators:
        return Roles(layout_from_env(tp, env), 0)
    if job.world == 1:
        raise ValueError(f"--generators {generators} needs several processes (torchrun --nproc_per_node N): a single "
                         "process generates and trains in turn (--generators 0)")
    if generators >= job.world:
        raise ValueError(f"--generators {generators} leaves no trainer among the {job.world} ranks: use at most "
                         f"{job.world - 1}")
    if generators % tp:
        raise ValueError(f"--tp {tp} must divide --generators {generators}: each engine takes --tp generator ranks")
    first = job.world - generators  # an engine's ranks must share a node; so must the trainers' shards (HSDP)
    if any((first + e * tp) // job.local_world != (first + e * tp + tp - 1) // job.local_world
           for e in range(generators // tp)):
        raise ValueError(f"--tp {tp}: an engine's generator ranks would span two nodes; choose --generators so "
                         f"that the {first} trainers fill whole groups of --tp ranks")
    if first > job.local_world and first % job.local_world:
        raise ValueError(f"{first} trainer ranks over several nodes must fill whole nodes of {job.local_world}")
    return Roles(Layout(job.rank, job.world, job.local_rank, job.local_world, tp), generators)


def check_engine_device(expected: str, actual: str, rank: int) -> None:
    """After vLLM starts: its worker must sit on this rank's device (a mismatch means every engine went to one
    GPU). Raises RuntimeError with one line."""
    if expected != actual:
        raise RuntimeError(f"rank {rank}'s vLLM engine is on {actual}, not on its own device {expected}: "
                           "the engine must run under the external_launcher executor with torchrun's LOCAL_RANK")


def check_shared_dir(path: str, token: str, rank: int, host: str) -> None:
    """Every rank reads what rank 0 wrote to out_dir (the toy, the GGUF conversion, checkpoints): rank 0 wrote
    token to path; any other rank must read it back. Raises RuntimeError with one line if not."""
    try:
        with open(path) as f:
            seen = f.read()
    except OSError:
        seen = None
    if seen != token:
        raise RuntimeError(f"rank {rank} on {host} does not see rank 0's --out_dir ({os.path.dirname(path)}): "
                           "with several machines, --out_dir must be on storage every machine shares")


# --- the memory plan ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a causal LM (a Hugging Face config and its parameter count)."""
    params: int
    hidden: int
    layers: int
    vocab: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def of(cls, config, params: int) -> "ModelShape":
        heads = config.num_attention_heads
        return cls(params, config.hidden_size, config.num_hidden_layers, config.vocab_size,
                   getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads,
                   bool(getattr(config, "tie_word_embeddings", False)))


@dataclass(frozen=True)
class Budget:
    """The run's settings the plan depends on (from the config), in tokens and sequences."""
    longest: int  # prompt + thinking + phrase + answer: the longest sequence the trainer and vLLM see
    micro_batch_tokens: int
    chunk_tokens: int  # positions per log-prob/entropy chunk
    checkpointing: bool
    seqs_in_flight: int  # sequences one engine holds at once (vLLM's max_num_seqs)
    sleeps: bool  # the engine frees its memory while the trainer runs (sync and PPO on GPU)
    batched_tokens: int = 8192  # vLLM's max_num_batched_tokens (chunked prefill)


@dataclass
class MemoryPlan:
    """Bytes per GPU. The trainer's peak: its resident states, plus one micro-batch's activations and head
    chunks. vLLM's share: bf16 weights, sampler and graph overheads, and the KV cache in the rest."""
    total: int
    trainer: dict  # item -> bytes at the trainer's peak
    resident: int  # what the trainer keeps while vLLM generates (states, root unit, margin)
    vllm_fraction: float  # vLLM's gpu_memory_utilization
    vllm_weights: int
    vllm_overhead: int
    kv_bytes_per_token: int
    seqs_in_flight: int
    longest: int
    problem: str = ""  # why it cannot fit, naming the flag to change ("" if it fits)

    @property
    def trainer_peak(self) -> int:
        return sum(self.trainer.values())

    @property
    def kv_bytes(self) -> int:
        return max(0, int(self.vllm_fraction * self.total) - self.vllm_weights - self.vllm_overhead)

    @property
    def kv_tokens(self) -> int:
        return self.kv_bytes // self.kv_bytes_per_token

    @property
    def decoding_at_once(self) -> int:
        """Longest sequences whose KV fits at once (at most the engine's max_num_seqs)."""
        return min(self.seqs_in_flight, self.kv_tokens // self.longest)

    def lines(self) -> str:
        g = {k: f"{v / GIB:.1f}" for k, v in self.trainer.items()}
        return (f"GPU memory per device {self.total / GIB:.0f} GiB. Trainer peak {self.trainer_peak / GIB:.1f} GiB ("
                + ", ".join(f"{k} {v}" for k, v in g.items()) + f"); resident while generating "
                f"{self.resident / GIB:.1f}. vLLM {self.vllm_fraction:.2f} = "
                f"{self.vllm_fraction * self.total / GIB:.1f} "
                f"GiB: weights {self.vllm_weights / GIB:.1f}, overhead {self.vllm_overhead / GIB:.1f}, KV cache "
                f"{self.kv_bytes / GIB:.1f} = {self.kv_tokens:,} tokens = {self.decoding_at_once} of the "
                f"{self.seqs_in_flight} sequences in flight at their longest ({self.longest:,} tokens)")


def plan_memory(shape: ModelShape, budget: Budget, total: int, world: int, shard: int, tp: int,
                vllm_fraction: float = 0.0, margin: int = 2 * GIB, role: str = "both") -> MemoryPlan:
    """Split one GPU of `total` bytes. world: trainer ranks; shard: ranks FSDP2 shards over (the node's with
    HSDP); tp: GPUs per engine. vllm_fraction 0: derive vLLM's share (at most 0.9), else check the one given.
    role: "both" (colocated), "trainer" (a trainer rank of a split run: no vLLM) or "generator" (vLLM alone).

    Trainer, per GPU (bytes):
      * states: fp32 weights, gradients and two AdamW moments, 16 per parameter, sharded over `shard` ranks;
      * root unit: embedding and LM head stay unsharded in fp32 through forward and backward (the FP32 head,
        paper §3.2(c)), with their gradients: 8 bytes per root parameter (one matrix if tied);
      * layers: one decoder layer gathered in the compute dtype and the next prefetched, 2 x 2 bytes per param;
      * activations of one micro-batch of P = max(micro_batch_tokens, longest) positions (a longer sequence
        goes alone): without checkpointing ~34 x hidden bytes per position per layer (Korthikanti et al.
        2022); with per-layer checkpointing each layer's bf16 input (2 x hidden) plus one layer recomputed;
      * head chunks: fp32 logits, log-softmax, probabilities and gradient of chunk_tokens positions, 4 x 4 x
        vocab bytes each, and the fp32 hidden states of all P positions at the head;
      * margin: CUDA context and collective buffers.
    vLLM: bf16 weights / tp; sampler buffers for max_num_seqs = max(256, seqs in flight) rows (two fp32 rows of
    vocab each) and ~1 GiB of CUDA graphs and prefill activations; the KV cache (2 x layers x kv_heads x head_dim
    x 2 bytes per token, split over tp) in what remains. When the engine sleeps (sync, PPO) the trainer's peak and
    vLLM never coexist: vLLM gets the device less what the trainer keeps resident."""
    positions = max(budget.micro_batch_tokens, budget.longest)
    root_params = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    layer_params = (shape.params - root_params) / shape.layers
    if budget.checkpointing:
        activations = 2 * shape.hidden * shape.layers * positions + 34 * shape.hidden * positions
    else:
        activations = 34 * shape.hidden * shape.layers * positions
    trainer = {"states": 16 * shape.params / shard, "root unit": 8 * root_params, "layers": 4 * layer_params,
               "activations": activations,
               "head chunks": 16 * min(budget.chunk_tokens, positions) * shape.vocab + 4 * positions * shape.hidden,
               "margin": margin}
    trainer = {k: int(v) * (role != "generator") for k, v in trainer.items()}
    resident = trainer["states"] + trainer["margin"]
    vllm_weights = 2 * shape.params // tp
    overhead = 8 * max(256, budget.seqs_in_flight) * shape.vocab + GIB  # vLLM's max_num_seqs (engine_args)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2 // min(tp, shape.kv_heads)
    peak = sum(trainer.values())
    room = total - (resident if budget.sleeps else peak)
    fraction = 0.0 if role == "trainer" else vllm_fraction or max(0.0, min(0.9, room / total))
    plan = MemoryPlan(total, trainer, resident, fraction, vllm_weights, overhead, kv_per_token,
                      budget.seqs_in_flight, budget.longest)
    biggest = max(("activations", "head chunks", "states"), key=trainer.get)
    fix = {"activations": "--activation_checkpointing" if not budget.checkpointing else "--micro_batch_tokens",
           "head chunks": "--logprob_chunk_tokens",
           "states": "fewer --generators" if role == "trainer" else "more GPUs"}[biggest]
    if peak > total or (vllm_fraction and peak + (0 if budget.sleeps else vllm_fraction * total) > total):
        plan.problem = (f"the trainer needs ~{peak / GIB:.1f} GiB at its peak (most of it {biggest}, "
                        f"{trainer[biggest] / GIB:.1f}) of the GPU's {total / GIB:.1f}"
                        + (f" beside vLLM's {vllm_fraction:.2f}" if vllm_fraction and not budget.sleeps else "")
                        + f": change {fix}")
    elif plan.kv_tokens < budget.longest and role != "trainer":
        plan.problem = (f"vLLM's {fraction:.2f} of the GPU ({fraction * total / GIB:.1f} GiB) holds its "
                        f"{vllm_weights / GIB:.1f} GiB of weights but not the KV cache of one "
                        f"{budget.longest:,}-token sequence ({budget.longest * kv_per_token / GIB:.2f} GiB): "
                        + ("raise --vllm_memory" if vllm_fraction else f"change {fix}")
                        + ", use --tp, or shorten --think_max_tokens")
    return plan


# --- the documented table ----------------------------------------------------------------------------------------
# Shapes from the models' config.json on the Hub (Qwen3-0.6B ties its embeddings; 8B does not).
QWEN3 = {"Qwen3-0.6B": ModelShape(596_049_920, 1024, 28, 151_936, 8, 128, True),
         "Qwen3-8B": ModelShape(8_190_735_360, 4096, 36, 151_936, 8, 128, False)}


def paper_table() -> str:
    """The plan at the paper's settings (768 completions, 12,288 thinking + ~16 phrase + 2,048 answer + 2,048
    prompt tokens, PipelineRL depth 2, micro-batches of 16,384 positions, chunks of 1,024, checkpointing on)."""
    rows = ["| model | GPUs | mode | trainer peak GiB | vLLM share | KV GiB | KV tokens | longest seqs decoding "
            "at once / in flight per engine | fits |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for name, gpus, gib, mode, gen in (("Qwen3-0.6B", 1, 80, "pipeline", 0), ("Qwen3-8B", 8, 80, "pipeline", 0),
                                       ("Qwen3-8B", 8, 80, "sync", 0), ("Qwen3-8B", 8, 141, "pipeline", 0),
                                       ("Qwen3-8B", 8, 141, "sync", 0), ("Qwen3-8B", 8, 80, "pipeline", 6),
                                       ("Qwen3-8B", 8, 80, "pipeline", 4)):
        depth = 2 if mode == "pipeline" else 1

        def plan(ranks, role):
            budget = Budget(2048 + 12288 + 16 + 2048, 16384, 1024, True, depth * 768 // ranks, sleeps=mode == "sync")
            return plan_memory(QWEN3[name], budget, gib * 10**9, ranks, ranks, 1, role=role)
        trainer = plan(gpus - gen, "trainer") if gen else plan(gpus, "both")  # split: G generators + T trainers
        vllm = plan(gen, "generator") if gen else trainer
        problem = trainer.problem or vllm.problem
        rows.append(f"| {name} | {gpus} x {gib} GB{f', {gen} + {gpus - gen} split' if gen else ''} | {mode} | "
                    f"{trainer.trainer_peak / GIB:.1f} | {vllm.vllm_fraction:.2f} | {vllm.kv_bytes / GIB:.1f} | "
                    f"{vllm.kv_tokens:,} | {vllm.decoding_at_once} / {vllm.seqs_in_flight} | "
                    f"{'yes' if not problem else 'no: ' + problem} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import argparse  # no options: --help says what it prints, anything else is an error (exit 2)
    ap = argparse.ArgumentParser(description="Print the GPU memory plan for Qwen3-0.6B and Qwen3-8B at the paper's "
                                 "settings (a markdown table; docs/gpu.md).")
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")
    ap.parse_args()
    print(paper_table())


def bf16_is_emulated(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True on a CPU without native bf16 matmuls (neither the avx512_bf16 nor the amx_bf16 flag): oneDNN emulates
    them there, about 50x slower than fp32 (docs/measurements.md). False where the flags cannot be read (not
    Linux): no claim then."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in open(cpuinfo) if line.startswith("flags")), None)
    except OSError:
        return False
    return flags is not None and not {"avx512_bf16", "amx_bf16"} & set(flags)
