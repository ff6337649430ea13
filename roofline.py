"""The machine's own limits, and the arithmetic that says how close the trainer and the generator come to them.

    python roofline.py                 # this machine's matmul peak and memory bandwidth, measured here, then the
                                       # decode roofline of the toy, toy-l and SmolLM2-135M at their batch
    python bench.py --trainer_only --shapes toy,toy-l,smollm2   # the trainer's MFU against the same peak

Trainer: model FLOP utilisation = model_flops (about 6 x parameters x trained tokens, plus attention) / seconds /
peak. On a GPU the peak is the spec sheet's (PEAK_BF16_TFLOPS); on a CPU it is measured in this process: a large
square matmul in the training dtype on every thread torch uses, the best of a few tries.
Generator: one decode step of S sequences reads every weight once and each sequence's KV cache, and does about
2 x parameters FLOPs per sequence (plus attention), so it takes at least max(bytes / bandwidth, FLOPs / peak):
whichever is larger binds. tokens/s at the roofline = S / that time.
"""
import argparse
import time

# shapes for bench.py --trainer_only and the roofline: Qwen2.5-0.5B and -1.5B (tied embeddings, 151,936-token
# vocabulary), SmolLM2-135M, the toys (toy.MODELS, untied); "8b-8l" is 8 of Llama-3-8B's 32 layers with its
# (untied) 128,256-token head and embedding, 2.8B parameters: the GPU's MFU on an 8B-shaped layer stack (docs/gpu.md)
# on one device; "tiny" is for CPU tests
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936),
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152),  # SmolLM2-135M's shape
    "8b-8l": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=8, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256),
    "toy": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=384),
    "toy-l": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=384),
}
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}  # dense, per device
# the decode roofline's settings: sequences decoding at once and their mean context (prompt + half the completion)
DECODE = {"toy": (128, 45), "toy-l": (128, 45), "smollm2": (64, 60)}  # the toy preset's batch; README's SmolLM2 run


def body_params(shape: dict) -> int:
    """Weights of the decoder layers' matmuls (q, o; k, v; gate, up, down): what every token passes through."""
    d, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = d * shape["num_key_value_heads"] // shape["num_attention_heads"]
    return layers * (d * d * 2 + d * kv * 2 + 3 * d * f)


def model_flops(shape: dict, positions: int, completion_positions: int, mean_seq: float) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of one step: every position through the body's matmuls (2
    per weight) and causal attention (2 x 2 x d x seq / 2), and only completion positions through the LM head (the
    work the loss needs; the trainer's head also runs on the prompts packed after a row's first)."""
    attention = shape["num_hidden_layers"] * 2 * shape["hidden_size"] * mean_seq
    return 3 * (2 * body_params(shape) * positions + attention * positions
                + 2 * shape["vocab_size"] * shape["hidden_size"] * completion_positions)


def matmul_peak(dtype: str = "float32", n: int = 2048, tries: int = 5) -> float:
    """FLOP/s of an n x n matmul in this process (torch's threads), the best of `tries` timed runs of a few each."""
    import torch
    a, b = (torch.randn(n, n, dtype=getattr(torch, dtype)) for _ in range(2))
    torch.mm(a, b)  # warm-up: allocation, kernel choice
    best = 0.0
    for _ in range(tries):
        t0, reps = time.perf_counter(), 4
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def bandwidth(mib: int = 512, tries: int = 5) -> float:
    """Bytes/s of a copy of `mib` MiB (bytes read + bytes written), the best of `tries`: the bound a decode step
    that reads all weights and KV once faces."""
    import torch
    src = torch.ones(mib << 18, dtype=torch.float32)  # mib MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(tries):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - t0))
    return best


def decode_roofline(shape: dict, seqs: int, context: float, flops_peak: float, bytes_per_s: float,
                    dtype_bytes: int = 4, tied: bool = False) -> dict:
    """The fastest one decode step can be: all weights (body, embedding row reads aside, and the LM head) read once
    for the step, each sequence's KV cache (2 x layers x kv width x context) read once; 2 FLOPs per weight per
    sequence plus attention. -> {"step_s", "tokens_per_s", "binds": "memory" or "compute", bytes, flops}."""
    d, layers = shape["hidden_size"], shape["num_hidden_layers"]
    kv = d * shape["num_key_value_heads"] // shape["num_attention_heads"]
    weights = body_params(shape) + shape["vocab_size"] * d * (1 if tied else 2)  # the head, and the embedding table
    read = dtype_bytes * (weights + seqs * 2 * layers * kv * context)
    flops = seqs * (2 * (body_params(shape) + shape["vocab_size"] * d) + 4 * layers * d * context)
    t_mem, t_flop = read / bytes_per_s, flops / flops_peak
    step = max(t_mem, t_flop)
    return {"step_s": step, "tokens_per_s": seqs / step, "binds": "memory" if t_mem >= t_flop else "compute",
            "bytes": read, "flops": flops}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", help="matmul dtype for the peak (default float32)")
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")
    args = ap.parse_args()
    import torch
    peak, bw = matmul_peak(args.dtype), bandwidth()
    print(f"this machine: {torch.get_num_threads()} threads, {args.dtype} matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"(2048 x 2048), memory bandwidth {bw / 1e9:.1f} GB/s (512 MiB copy, read + write)")
    print(f"{'model':>8} {'seqs':>5} {'context':>8} {'MB read/step':>13} {'MFLOP/step':>11} {'step ms':>8} "
          f"{'tokens/s at the roofline':>25}  binds")
    for name, (seqs, context) in DECODE.items():
        r = decode_roofline(SHAPES[name], seqs, context, peak, bw, tied=name == "smollm2")
        print(f"{name:>8} {seqs:>5} {context:>8} {r['bytes'] / 1e6:13.1f} {r['flops'] / 1e6:11.0f} "
              f"{r['step_s'] * 1e3:8.2f} {r['tokens_per_s']:25.0f}  {r['binds']}")
