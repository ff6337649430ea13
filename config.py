"""Every knob of a run, in one typed dataclass, with the paper's value beside it.

    python train.py --loss cispo --batch 768          # flags as users type them
    python train.py --loss=dapo --no_fp32_head        # --key=value, --flag / --no_flag
    python train.py --dry_run                         # print the resolved config and exit 0

Defaults are the ScaleRL recipe (paper §2, §4, A.3). The toy run (`--model toy`, the default) overrides
only what its scale needs, in TOY below; anything typed on the command line wins over both.
"""
import dataclasses
import json
import math
import os
import sys
import typing
from dataclasses import dataclass
from typing import Literal


@dataclass
class Config:
    # --- run ---
    model: str = "toy"  # "toy" (built and cached by data.py) or any HF causal LM name/path
    dataset: str = "toy"  # toy | polaris | deepscaler | gsm8k | math | path/to/file.jsonl|.parquet
    eval_dataset: str = ""  # "" = 1,000 held out of --dataset (paper §2.1) or its named eval set; math500 | aime24 | gsm8k_test | a file
    reward: Literal["math", "exact"] = "math"  # math-verify on the last \\boxed{}; or the answer's first line verbatim
    run_name: str = ""  # "" = <mode>-<loss>-s<seed>-<time>; names logs/<run_name>.jsonl and out_dir/<run_name>/
    seed: int = 0
    out_dir: str = "out"  # checkpoints, toy model cache, rollout dumps
    log_dir: str = "logs"  # one JSON-lines log per run: the input of fit_curve.py
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # auto = bfloat16 on GPU, float32 on CPU
    dry_run: bool = False  # validate, print the resolved config, exit 0 without loading anything
    resume: bool = False  # continue out_dir/<run_name> from its newest complete checkpoint
    wandb: bool = False  # also log to Weights & Biases (the jsonl log stays the source of truth)

    # --- batch (paper §2: 768 completions = 48 prompts x 16) ---
    batch: int = 768  # completions per optimizer step (before zero-variance filtering)
    group: int = 16  # completions per prompt, G
    micro_batch_tokens: int = 16384  # per forward/backward: rows x longest row, padding included (memory knob)

    # --- off-policy setup (paper §3.1) ---
    mode: Literal["pipeline", "ppo", "sync"] = "pipeline"  # PipelineRL-k | PPO-off-policy-k | on-policy
    k: int = 8  # trained completions come from at most k consecutive policy versions (k=1 is on-policy)
    max_steps: int = 7400  # optimizer steps (the paper's 8B run: 7,400)

    # --- loss (paper §3.2, Eq. 4, A.17) ---
    loss: Literal["cispo", "dapo", "gspo", "grpo"] = "cispo"
    eps_max: float = 4.0  # CISPO truncation of the IS weight. A.17.2: 4, 5 and 8 do equally well; we take the
    #                       smallest, which bounds the weight of the stalest (up to k-1 versions old) tokens most
    eps_low: float = 0.2  # DAPO clip 1 - eps_low
    eps_high: float = 0.28  # DAPO clip 1 + eps_high
    eps_clip: float = 0.2  # GRPO symmetric clip
    gspo_eps_low: float = 3e-3  # GSPO sequence-ratio clip; paper A.17.3 best: 3e-3 low / 5e-3 high
    gspo_eps_high: float = 5e-3
    loss_agg: Literal["prompt", "sample", "token"] = "prompt"  # paper §3.2(a): prompt average
    adv_norm: Literal["batch", "prompt", "none"] = "batch"  # paper §3.2(b): batch-level std
    zero_var_filter: bool = True  # drop groups whose G rewards are equal (paper §3.2(e), effective batch)

    # --- curriculum (paper §3.2(d), Polaris) ---
    npr: bool = True  # No-Positive-Resampling
    npr_threshold: float = 0.9  # retire a prompt from later epochs once its last group's pass rate >= this

    # --- generation and length control (paper §2, §4, A.10) ---
    temperature: float = 1.0  # sampling temperature (no top-p/top-k: they would bias pi_gen)
    prompt_max_tokens: int = 2048  # longer prompts are dropped from the dataset
    think_min_tokens: int = 10240  # interruption point drawn uniformly in [think_min, think_max] per completion
    think_max_tokens: int = 12288
    answer_max_tokens: int = 2048  # budget after </think> (natural or forced)
    interruptions: bool = True  # forced "time is up" phrase at the thinking budget
    length_penalty: bool = False  # DAPO overlong penalty (Eq. 9) instead of interruptions
    fp32_head: bool = True  # LM head and log-softmax in fp32 on generator and trainer (paper §3.2(c))
    vllm_memory: float = 0.85  # vLLM gpu_memory_utilization on GPU (fraction of GPU memory)
    vllm_kv_cache_gib: int = 1  # KV cache size on CPU, GiB (vLLM's kv_cache_memory_bytes)

    # --- optimizer (paper A.3) ---
    lr: float = 5e-7  # AdamW, constant after warm-up
    warmup_steps: int = 100  # linear warm-up
    adam_eps: float = 1e-15  # paper: small eps avoids the epsilon underflow of Wortsman et al. 2023
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global grad norm; the paper does not state one; <= 0 disables

    # --- evaluation (paper §2.1: mean@16 on 1,000 held-out prompts every 100 steps) ---
    eval_every: int = 100  # steps; -1 disables (step 0 is always evaluated unless disabled)
    eval_prompts: int = 1000  # at most this many (all of a smaller validation split unless typed explicitly)
    eval_samples: int = 16

    # --- checkpoints and reliability ---
    save_every: int = 100  # steps; -1 disables
    keep_checkpoints: int = 2
    max_bad_steps: int = 3  # consecutive non-finite steps (skipped) before the run stops
    grade_timeout_s: float = 1.0  # hard bound on grading one completion
    dump_every: int = -1  # steps; write prompts, completions, rewards and lags to out_dir/<run>/rollouts/

    def vllm_max_len(self, phrase_tokens: int) -> int:
        """Context the engine must hold: prompt + thinking + forced phrase + answer (tokens)."""
        return self.prompt_max_tokens + self.think_max_tokens + phrase_tokens + self.answer_max_tokens

    @property
    def prompts_per_step(self) -> int:
        return self.batch // self.group


# The toy run: a ~1M-parameter model on a generated arithmetic task, on a 2-core CPU. Only what the scale
# forces differs from the paper: a smaller batch (16 prompts x 8), budgets of tens of tokens instead of
# thousands, a higher learning rate with a shorter warm-up for a tiny model (lr 1e-4 made it worse, measured),
# frequent small evaluations, and bf16 set explicitly (auto would pick fp32 on a CPU) so that the body runs
# in bf16 and the FP32 LM head means what it does in the paper.
TOY = dict(
    batch=128, group=8, max_steps=600, lr=3e-5, warmup_steps=20, grad_clip=1.0, dtype="bfloat16",
    prompt_max_tokens=48, think_min_tokens=40, think_max_tokens=56, answer_max_tokens=12,
    eval_every=20, eval_prompts=200, eval_samples=4, save_every=50, micro_batch_tokens=2048,
)


class ConfigError(ValueError):
    """A bad flag or value: reported as one line, exit status 2, before anything starts."""


def _choices(tp):
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def _coerce(name: str, tp, text: str):
    choices = _choices(tp)
    if choices:
        if text not in choices:
            raise ConfigError(f"--{name}: invalid choice {text!r} (choose from {', '.join(choices)})")
        return text
    if tp is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--{name}: expected true or false, got {text!r}")
    try:
        value = tp(text)
    except ValueError:
        raise ConfigError(f"--{name}: expected {tp.__name__}, got {text!r}") from None
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"--{name}: expected a finite number, got {text!r}")
    return value


def parse_args(argv: list[str]) -> Config:
    """`--key value`, `--key=value`, `--flag`, `--no_flag`; dashes or underscores. Toy overrides apply
    to every field not typed on the command line when the model is the toy."""
    hints = typing.get_type_hints(Config)
    given: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: flags look like --key value or --key=value")
        key, eq, text = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in hints and key.startswith("no_") and hints.get(key[3:]) is bool and not eq:
            given[key[3:]] = False
            i += 1
            continue
        if key not in hints:
            raise ConfigError(f"unknown flag --{key} (see the fields of Config in config.py)")
        if not eq:
            if hints[key] is bool and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
                given[key] = True
                i += 1
                continue
            if i + 1 == len(argv):
                raise ConfigError(f"--{key}: missing value")
            text = argv[i + 1]
            i += 1
        given[key] = _coerce(key, hints[key], text)
        i += 1
    values = dict(TOY) if given.get("model", Config.model) == "toy" else {}
    values.update(given)
    if values.get("mode") == "sync" and "k" not in given:
        values["k"] = 1  # on-policy by definition
    cfg = Config(**values)
    cfg.typed = set(given)  # the flags the user typed (not a field: the log records values, not their origin)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Checks that need nothing but the config. Checks that need the model's context length or the dataset's
    size live in train.py, still before any model or engine starts."""
    def bad(msg):
        raise ConfigError(msg)
    if cfg.group < 2:
        bad(f"--group must be >= 2 (advantages need a group), got {cfg.group}")
    if cfg.batch < cfg.group or cfg.batch % cfg.group:
        bad(f"--batch {cfg.batch} must be a positive multiple of --group {cfg.group} "
            f"(e.g. {max(1, round(cfg.batch / cfg.group)) * cfg.group})")
    if cfg.k < 1:
        bad(f"--k must be >= 1 (1 is on-policy), got {cfg.k}")
    if cfg.mode == "sync" and cfg.k != 1:
        bad(f"--mode sync is on-policy: --k must be 1, got {cfg.k}")
    for name in ("lr", "temperature", "eps_max", "eps_low", "eps_high", "eps_clip", "gspo_eps_low", "gspo_eps_high",
                 "grade_timeout_s", "vllm_memory"):
        if getattr(cfg, name) <= 0:
            bad(f"--{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.eps_low >= 1 or cfg.eps_clip >= 1 or cfg.gspo_eps_low >= 1:
        bad("--eps_low, --eps_clip and --gspo_eps_low must be < 1 (the lower clip is 1 - eps)")
    if cfg.vllm_memory > 1:
        bad(f"--vllm_memory is a fraction in (0, 1], got {cfg.vllm_memory}")
    for name in ("max_steps", "warmup_steps", "eval_samples", "eval_prompts", "micro_batch_tokens",
                 "prompt_max_tokens", "answer_max_tokens", "keep_checkpoints", "max_bad_steps", "vllm_kv_cache_gib"):
        if getattr(cfg, name) < (0 if name in ("warmup_steps", "max_steps") else 1):
            bad(f"--{name} must be positive, got {getattr(cfg, name)}")
    for name in ("eval_every", "save_every", "dump_every"):
        if getattr(cfg, name) == 0 or getattr(cfg, name) < -1:
            bad(f"--{name} must be a positive number of steps or -1 (disabled), got {getattr(cfg, name)}")
    if not 1 <= cfg.think_min_tokens <= cfg.think_max_tokens:
        bad(f"need 1 <= --think_min_tokens <= --think_max_tokens, got {cfg.think_min_tokens} > {cfg.think_max_tokens}")
    if not 0 < cfg.npr_threshold <= 1:
        bad(f"--npr_threshold is a pass rate in (0, 1], got {cfg.npr_threshold}")
    if cfg.weight_decay < 0 or cfg.adam_eps <= 0:
        bad("--weight_decay must be >= 0 and --adam_eps > 0")
    for name in ("out_dir", "log_dir"):
        path = getattr(cfg, name)
        if not path:
            bad(f"--{name} must not be empty")
        if os.path.exists(path) and not os.path.isdir(path):
            bad(f"--{name} {path!r} exists and is not a directory")
    if cfg.run_name and (os.sep in cfg.run_name or cfg.run_name.startswith(".")):
        bad(f"--run_name {cfg.run_name!r} must be a plain name (no '/', not starting with '.')")
    if cfg.resume and not cfg.run_name:
        bad("--resume needs --run_name (the run to continue)")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def main(argv=None) -> Config:
    """Parse or exit 2 with a one-line message (no traceback)."""
    try:
        return parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    print(json.dumps(to_dict(main()), indent=1))
