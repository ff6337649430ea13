"""Every knob of a run, in one typed dataclass, with the paper's value beside it.

    python train.py --help                            # every flag, its default and the comment below
    python train.py --loss cispo --batch 768          # flags as users type them
    python train.py --loss=dapo --no_fp32_head        # --key=value, --flag / --no_flag, dashes or underscores
    python train.py --dry_run                         # print the resolved config and exit 0

Defaults are the ScaleRL recipe (paper §2, §4, A.3). The toy run (`--model toy`, the default) overrides
only what its scale needs, in TOY below; anything typed on the command line wins over both. The comment
beside each field is its --help text. The choices of --loss, --mode and --reward are their registries
(losses.LOSSES, rollouts.SCHEDULES, rewards.REWARDS): a fork adds a loss, a schedule or a reward there and
nowhere else.
"""
import argparse
import dataclasses
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import typing
from dataclasses import dataclass
from typing import Literal

import data
import losses
import rewards
import rollouts
import toy


@dataclass(frozen=True)
class Config:
    """The resolved run: built once by parse_args and never changed after validation (frozen)."""
    # --- run ---
    model: str = "toy"  # toy | toy-s | toy-l (built and cached by toy.py) or any HF causal LM name/path
    dataset: str = "toy"  # toy | box (generated, for small chat models) | polaris | deepscaler | gsm8k | math |
    #                       path/to/file.jsonl|.parquet
    eval_dataset: str = ""  # "" = 1,000 held out of --dataset (paper §2.1) or its named eval set; math500 | aime24 |
    #                         gsm8k_test | a file
    reward: str = ""  # rewards.REWARDS: math (math-verify on the last \boxed{}), exact (the final answer's first line
    #                   verbatim), boxed_exact (the last \boxed{} holds the answer's text); "" = the dataset's own
    run_name: str = ""  # "" = <mode>-<loss>-s<seed>-<time>; names logs/<run_name>.jsonl and out_dir/<run_name>/
    seed: int = 0  # sampling, data order and the trainer's RNG
    out_dir: str = "out"  # checkpoints, toy model cache, rollout dumps
    log_dir: str = "logs"  # one JSON-lines log per run: the input of fit_curve.py
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # compute dtype of the body; auto = bfloat16 on GPU,
    #                                                         float32 on CPU
    dry_run: bool = False  # validate, print the resolved config, exit 0 without loading anything
    resume: bool = False  # continue out_dir/<run_name> from its newest complete checkpoint
    wandb: bool = False  # also log to Weights & Biases (the jsonl log stays the source of truth)

    # --- batch (paper §2: 768 completions = 48 prompts x 16) ---
    batch: int = 768  # completions per optimizer step (before zero-variance filtering)
    group: int = 16  # completions per prompt, G
    micro_batch_tokens: int = 16384  # per forward/backward: rows x longest row, padding included (memory knob)
    logprob_chunk_tokens: int = 1024  # positions per chunk at the LM head: bounds its fp32 logits to chunk x vocab
    activation_checkpointing: Literal["auto", "on", "off"] = "auto"  # recompute each decoder layer in backward;
    #                                                                  auto = on on GPU, off on CPU
    tp: int = 1  # GPUs per vLLM engine (tensor parallelism); it must divide the ranks of a node
    generators: int = -1  # ranks that only generate (the rest only train, paper A.3); 0 = every rank does both in
    #                       turn; -1 = 4:1 on several GPUs (8: 6 + 2), 0 on one device or CPUs (devices.py)
    peer_timeout_s: float = 20.0  # with --generators: a rank whose heartbeat stops this long is dead, and a
    #                               weight push not done in this time fails: every rank stops, exit 4

    # --- off-policy setup (paper §3.1) ---
    mode: str = "pipeline"  # rollouts.SCHEDULES: pipeline = PipelineRL-k, ppo = PPO-off-policy-k, sync = on-policy
    k: int = 8  # trained completions come from at most k consecutive policy versions (k=1 is on-policy)
    pipeline_depth: int = 2  # PipelineRL: steps' worth of prompts decoding at once (1 when k=1); with even lengths
    #                          lags reach k-1 only at depth >= k (a long straggler can age to k-1 at any depth);
    #                          2 keeps the engine busy while lags stay <= 1 (docs/measurements.md)
    max_steps: int = 7400  # optimizer steps (the paper's 8B run: 7,400)

    # --- loss (paper §3.2, Eq. 4, A.17) ---
    loss: str = "cispo"  # losses.LOSSES: cispo (Eq. 4), dapo (Eq. 8), gspo, grpo (Eq. 7)
    eps_max: float = 4.0  # CISPO truncation of the IS weight. A.17.2: 4, 5 and 8 do equally well; we take the
    #                       smallest, which bounds the weight of the stalest (up to k-1 versions old) tokens most
    eps_low: float = 0.2  # DAPO clip 1 - eps_low
    eps_high: float = 0.26  # DAPO clip 1 + eps_high (the paper's DAPO recipe, A.16; DAPO's own paper uses 0.28)
    eps_clip: float = 0.2  # GRPO symmetric clip
    gspo_eps_low: float = 3e-3  # GSPO sequence-ratio clip; paper A.17.3 best: 3e-3 low / 5e-3 high
    gspo_eps_high: float = 5e-3  # GSPO upper clip (see gspo_eps_low)
    loss_agg: Literal["prompt", "sample", "token"] = "prompt"  # paper §3.2(a): prompt average
    adv_norm: Literal["batch", "prompt", "none"] = "batch"  # paper §3.2(b): batch-level std
    zero_var_filter: bool = True  # drop groups whose G rewards are equal (paper §3.2(e), effective batch)
    drop_truncated: bool = True  # truncated completions leave the loss, their reward still counts in the group
    #                              mean (A.15: "the effective batch size (after excluding truncated samples)")

    # --- curriculum (paper §3.2(d), Polaris) ---
    train_prompts: int = 0  # > 0: train on a fixed pool of this many of the training prompts (the same pool for
    #                         every --seed), so a short run covers several epochs and NPR acts (paper: ~6.7 epochs)
    npr: bool = True  # No-Positive-Resampling
    npr_threshold: float = 0.9  # retire a prompt from later epochs once its last group's pass rate >= this

    # --- generation and length control (paper §2, §4, A.10) ---
    temperature: float = 1.0  # sampling temperature (no top-p/top-k: they would bias pi_gen)
    exact_sampling: bool = True  # one seeded generator per completion: what is sampled does not depend on the
    #                              batch around it, the number of ranks or a resume. vLLM then draws the noise
    #                              request by request (slower, docs/measurements.md); --no_exact_sampling
    #                              draws it in one call from the engine's seeded generator
    prompt_max_tokens: int = 2048  # longer prompts are dropped from the dataset
    think_min_tokens: int = 10240  # interruption point drawn uniformly in [think_min, think_max] per completion
    think_max_tokens: int = 12288  # upper end of that range; with --no_interruptions, thinking + answer share
    #                                think_max + answer_max
    answer_max_tokens: int = 2048  # budget after </think> (natural or forced)
    interruptions: bool = True  # forced "time is up" phrase at the thinking budget
    length_penalty: bool = False  # DAPO overlong penalty (Eq. 9) instead of interruptions (turns them off)
    fp32_head: bool = True  # LM head and log-softmax in fp32 on generator and trainer (paper §3.2(c))
    vllm_memory: float = 0.0  # vLLM's share of each GPU (bf16 weights + KV cache); 0 = what the trainer leaves it
    #                           (devices.plan_memory, printed at start-up)
    vllm_kv_cache_gib: int = 1  # KV cache size on CPU, GiB (vLLM's kv_cache_memory_bytes)

    # --- optimizer (paper A.3) ---
    lr: float = 5e-7  # AdamW, constant after warm-up
    warmup_steps: int = 100  # linear warm-up
    adam_eps: float = 1e-15  # paper: small eps avoids the epsilon underflow of Wortsman et al. 2023
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 0.0  # max global grad norm; <= 0 disables. The paper states no clipping

    # --- evaluation (paper §2.1: mean@16 on 1,000 held-out prompts every 100 steps) ---
    eval_every: int = 100  # steps; -1 disables (step 0 is always evaluated unless disabled)
    eval_growth: float = 1.0  # > 1: log-spaced, each evaluation at least eval_every steps and this factor (in
    #                           steps) after the last, so a rise early in the run is sampled (1.25: ~10 a decade)
    eval_prompts: int = 1000  # at most this many (all of a smaller validation split unless typed explicitly)
    eval_samples: int = 16  # completions per held-out prompt (mean@16)

    # --- checkpoints and reliability ---
    save_every: int = 100  # steps; -1 disables
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    max_bad_steps: int = 3  # consecutive non-finite steps (skipped) before the run stops
    grade_timeout_s: float = 1.0  # hard bound on grading one completion, seconds (0.5 to 60)
    grade_step_budget_s: float = 60.0  # hard bound on a step's grading, seconds (an evaluation gets this per
    #                                    --batch completions); what is not graded in time is wrong, and counted
    dump_every: int = -1  # steps; write prompts, completions, rewards and lags to out_dir/<run>/rollouts/

    def vllm_max_len(self, phrase_tokens: int) -> int:
        """Context the engine must hold: prompt + thinking + forced phrase + answer (tokens)."""
        return self.prompt_max_tokens + self.think_max_tokens + phrase_tokens + self.answer_max_tokens

    @property
    def prompts_per_step(self) -> int:
        return self.batch // self.group

    def eval_steps(self) -> set:
        """The steps evaluated: 0, then eval_every apart (eval_growth 1) or log-spaced, and max_steps."""
        if self.eval_every == -1:
            return set()
        steps, step = {0, self.max_steps}, 0
        while step < self.max_steps:
            step = max(step + self.eval_every, math.ceil(step * self.eval_growth))
            steps.add(min(step, self.max_steps))
        return steps


# The toy run: a ~1M-parameter model on a generated arithmetic task (toy.py), on a 2-core CPU. Only what the
# scale forces differs from the paper:
#   * a smaller batch (16 prompts x 8) and budgets of tens of tokens: 72-80 thinking tokens fit every sum's
#     scratchpad (9 terms take ~62), so the budget cuts only stragglers and the ceiling is what RL learns (toy.py);
#     7 answer tokens hold \boxed{NN} and EOS, so nothing can be computed after an interruption;
#   * a higher learning rate for a tiny model, clipped at a gradient norm of 1.0 (the paper states no clipping, at
#     lr 5e-7): unclipped, norms of 6-11 came before a dip of 0.13 in pass rate (docs/study-v2.md); the warm-up ends
#     at about half the rise's midpoint C_mid, where the paper's early cut falls (fit_curve.py cuts there);
#   * 500 steps, about 10 x C_mid: the long sums are learned late, from rare successes, and a fit on the rise is
#     checked against the plateau (the paper's protocol);
#   * evaluation of all 1,000 held-out prompts x 2 samples (a standard error of ~0.009 a point), log-spaced: every
#     2 steps at first, then 20% further each time (27 in all), so the rise is sampled as densely as the plateau.
# The dtype is auto: float32 on a CPU, where most chips (AVX2 without AVX512-BF16 or AMX) emulate bf16 matmuls
# at a fraction of fp32's speed; in fp32 the FP32 LM head changes nothing, and `--dtype bfloat16` gives the
# paper's bf16 body. How these values were chosen, with the runs: docs/study.md and docs/study-v2.md.
TOY = dict(
    batch=128, group=8, max_steps=500, lr=5e-5, warmup_steps=20, grad_clip=1.0,
    prompt_max_tokens=48, think_min_tokens=72, think_max_tokens=80, answer_max_tokens=7,
    eval_every=2, eval_growth=1.2, eval_prompts=1000, eval_samples=2, save_every=50, micro_batch_tokens=2048,
)
# Flags whose choices are a registry: an entry added there is a choice here.
REGISTRIES = {"loss": losses.LOSSES, "mode": rollouts.SCHEDULES, "reward": rewards.REWARDS}


class ConfigError(ValueError):
    """A bad flag or value: reported as one line, exit status 2, before anything starts."""


def _field_help() -> dict[str, str]:
    """The comment beside each field of Config, with its indented continuation lines: the --help text is
    written once, in the source above."""
    names, helps, last = {f.name for f in dataclasses.fields(Config)}, {}, None
    for line in inspect.getsource(Config).splitlines():
        field_line = re.match(r"\s+(\w+): [^#]*#\s?(.*)", line)
        continuation = re.match(r"\s+#\s+(.*)", line)
        if field_line and field_line.group(1) in names:
            last = field_line.group(1)
            helps[last] = field_line.group(2).strip()
        elif continuation and last:
            helps[last] += " " + continuation.group(1).strip()
        else:
            last = None
    return helps


def _value(name: str, tp, text: str):
    """Command-line text -> a value of the field's type; argparse turns the error into one line."""
    choices = list(REGISTRIES[name]) if name in REGISTRIES else (
        typing.get_args(tp) if typing.get_origin(tp) is Literal else None)
    if choices:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {', '.join(choices)})")
        return text
    if tp is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    try:
        value = tp(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {tp.__name__}, got {text!r}") from None
    if tp is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print its usage block and exit; we raise one line to main()
        if message.startswith("unrecognized arguments"):
            import difflib
            flags = [a for a in self._option_string_actions if a.startswith("--")]
            typed = [a.split("=")[0] for a in message.split(":", 1)[1].split() if a.startswith("--")]
            close = [m for t in typed for m in difflib.get_close_matches(t, flags, n=1)]
            message += f" (did you mean {', '.join(close)}?)" if close else " (python train.py --help lists every flag)"
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    """argparse built from Config: each flag's type, default, toy override and help come from its field. Only
    typed flags land in the parsed namespace (default SUPPRESS), so the toy preset can fill in the rest."""
    p = _Parser(prog="train.py", usage="python train.py [--flag value ...]   (or torchrun ... train.py ...)",
                description="ScaleRL: RL of an LLM on verifiable rewards (arXiv 2510.13786). Every flag is a field "
                            "of config.Config; defaults are the paper's recipe.", allow_abbrev=False,
                argument_default=argparse.SUPPRESS, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Booleans take --flag, --no_flag or --flag true|false. Where it says 'toy:', that value "
                       "applies when --model is toy and the flag is not typed.")
    hints, helps = typing.get_type_hints(Config), _field_help()
    for f in dataclasses.fields(Config):
        tp = hints[f.name]
        toy = f"; toy: {TOY[f.name]}" if f.name in TOY else ""
        text = f"{helps.get(f.name, '')} (default: {f.default}{toy})".replace("%", "%%")

        def convert(s, name=f.name, tp=tp):
            return _value(name, tp, s)
        if tp is bool:
            p.add_argument(f"--{f.name}", nargs="?", const=True, type=convert, metavar="BOOL", help=text)
            p.add_argument(f"--no_{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            choices = list(REGISTRIES[f.name]) if f.name in REGISTRIES else typing.get_args(tp)
            metavar = "{" + ",".join(choices) + "}" if choices else {int: "INT", float: "FLOAT"}.get(tp, "TEXT")
            p.add_argument(f"--{f.name}", type=convert, metavar=metavar, help=text)
    return p


def parse_args(argv: list[str], saved: dict | None = None) -> Config:
    """`--key value`, `--key=value`, `--flag`, `--no_flag`; dashes or underscores in keys. The toy preset fills
    every field not typed when the model is the toy (or `saved`, a run's settings, does: evaluate.py); then the
    derived defaults below; then validation."""
    argv = [re.sub(r"^--([^=]+)", lambda m: "--" + m.group(1).replace("-", "_"), a) if a.startswith("--") else a
            for a in argv]
    for i in range(len(argv) - 1, 0, -1):  # `--lr -1e-3`: argparse takes -1e-3 for a flag; pass it as --lr=-1e-3
        if re.fullmatch(r"-[0-9.]+(e[-+]?[0-9]+)?|-inf|-nan", argv[i], re.I) and argv[i - 1].startswith("--") \
                and "=" not in argv[i - 1]:
            argv[i - 1:i + 1] = [f"{argv[i - 1]}={argv[i]}"]
    given = vars(parser().parse_args(argv))
    values = dict(TOY) if given.get("model", Config.model) in toy.MODELS else {}
    if saved is not None:  # the flags of a run; another dataset typed brings its own reward
        fields = {f.name for f in dataclasses.fields(Config)}
        values = {k: v for k, v in saved.items() if k in fields and not ("dataset" in given and k == "reward")}
    values.update(given)
    # derived defaults: each decided here, once
    if values.get("mode") == "sync" and "k" not in given:
        values["k"] = 1  # on-policy by definition
    if not values.get("reward"):
        values["reward"] = data.default_reward(values.get("dataset", Config.dataset))
    if values.get("length_penalty") and "interruptions" not in given:
        values["interruptions"] = False  # the penalty replaces the interruptions (paper §4, LOO row "lp")
    if "auto" in (values.get("dtype", Config.dtype), values.get("activation_checkpointing", "auto")):
        import torch
        cuda = torch.cuda.is_available()
        if values.get("dtype", Config.dtype) == "auto":
            values["dtype"] = "bfloat16" if cuda else "float32"
        if values.get("activation_checkpointing", "auto") == "auto":
            values["activation_checkpointing"] = "on" if cuda else "off"
    cfg = Config(**values)
    object.__setattr__(cfg, "typed", frozenset(given))  # the flags typed (not a field: the log records values)
    validate(cfg)
    return cfg


def toy_preset(cfg: Config) -> dict:
    """The values the toy preset set (fields not typed), for the start-up line: `--batch 768` on the toy says
    it trains 96 prompts x 8."""
    return {k: getattr(cfg, k) for k in TOY if k not in cfg.typed} if cfg.model in toy.MODELS else {}


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
    if not 1 <= cfg.k <= 256:  # PPO-off-policy-k holds k x batch completions in flight (the paper: k = 8)
        bad(f"--k must be in [1, 256] (1 is on-policy), got {cfg.k}")
    if cfg.generators < -1 or not 1 <= cfg.peer_timeout_s <= 3600:
        bad("--generators is a number of ranks, 0 or -1 (default split), and --peer_timeout_s is in [1, 3600] s")
    if cfg.mode == "sync" and cfg.k != 1:
        bad(f"--mode sync is on-policy: --k must be 1, got {cfg.k}")
    for name in ("lr", "temperature", "eps_max", "eps_low", "eps_high", "eps_clip", "gspo_eps_low", "gspo_eps_high",
                 "grade_timeout_s", "grade_step_budget_s"):
        if getattr(cfg, name) <= 0:
            bad(f"--{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.eps_low >= 1 or cfg.eps_clip >= 1 or cfg.gspo_eps_low >= 1:
        bad("--eps_low, --eps_clip and --gspo_eps_low must be < 1 (the lower clip is 1 - eps)")
    if not 0.5 <= cfg.grade_timeout_s <= 60:  # below 0.5 s even right answers miss it (0 of 20 at 0.05 s)
        bad(f"--grade_timeout_s must be between 0.5 and 60 seconds, got {cfg.grade_timeout_s}")
    if not cfg.grade_timeout_s <= cfg.grade_step_budget_s <= 3600:
        bad(f"--grade_step_budget_s must be between --grade_timeout_s and 3600 seconds, got {cfg.grade_step_budget_s}")
    if not 0 <= cfg.seed < 2**32 - 2**16:  # torch, numpy and vLLM seeds are 32-64 bit; rank and prompt offsets add
        bad(f"--seed must be in [0, {2**32 - 2**16}), got {cfg.seed}")
    if not 0 <= cfg.vllm_memory <= 1:
        bad(f"--vllm_memory is a fraction in (0, 1], or 0 to derive it, got {cfg.vllm_memory}")
    for name in ("max_steps", "warmup_steps", "eval_samples", "eval_prompts", "micro_batch_tokens", "pipeline_depth",
                 "logprob_chunk_tokens", "tp",
                 "prompt_max_tokens", "answer_max_tokens", "keep_checkpoints", "max_bad_steps", "vllm_kv_cache_gib"):
        if getattr(cfg, name) < (0 if name in ("warmup_steps", "max_steps") else 1):
            bad(f"--{name} must be positive, got {getattr(cfg, name)}")
    if cfg.micro_batch_tokens < 32:  # a micro-batch holds at least one sequence: tinier budgets only slow a step down
        bad(f"--micro_batch_tokens must be at least 32 (it is a memory knob: rows x longest row), got "
            f"{cfg.micro_batch_tokens}")
    if cfg.wandb and importlib.util.find_spec("wandb") is None:  # here, so --dry_run says it too
        bad("--wandb: the wandb package is not installed (pip install wandb)")
    for name in ("eval_every", "save_every", "dump_every"):
        if getattr(cfg, name) == 0 or getattr(cfg, name) < -1:
            bad(f"--{name} must be a positive number of steps or -1 (disabled), got {getattr(cfg, name)}")
    if not 1 <= cfg.think_min_tokens <= cfg.think_max_tokens:
        bad(f"need 1 <= --think_min_tokens <= --think_max_tokens, got {cfg.think_min_tokens} > {cfg.think_max_tokens}")
    if not 1 <= cfg.eval_growth <= 10:
        bad(f"--eval_growth is a factor in [1, 10], got {cfg.eval_growth}")
    if cfg.train_prompts < 0:
        bad(f"--train_prompts is a number of prompts, or 0 for all of them, got {cfg.train_prompts}")
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
    # bytes, not characters: a file name holds 255 bytes, and "é" is 2 of them, "日" 3 (UTF-8)
    name_bytes = len(cfg.run_name.encode("utf-8", "surrogateescape"))
    if cfg.run_name and (os.sep in cfg.run_name or cfg.run_name.startswith(".") or name_bytes > 200
                         or not cfg.run_name.isprintable()):
        bad(f"--run_name must be a plain name of at most 200 bytes of printable characters (no '/', not starting "
            f"with '.'), got {cfg.run_name[:40]!r}{'...' if len(cfg.run_name) > 40 else ''} ({name_bytes} bytes)")
    if cfg.mode == "pipeline" and cfg.k > 1 and cfg.pipeline_depth > cfg.k:
        bad(f"--pipeline_depth {cfg.pipeline_depth} must be at most --k {cfg.k}: lags reach k - 1 at depth k, and a "
            "deeper pipeline only holds more prompts in flight")
    if cfg.dataset in data.GENERATED and cfg.reward != data.default_reward(cfg.dataset):
        bad(f"--reward {cfg.reward} does not apply to --dataset {cfg.dataset}: its prompts say how to answer, and it "
            f"is graded by its own reward, {data.default_reward(cfg.dataset)}")
    if os.path.isabs(cfg.model) or cfg.model.startswith((".", "~")) or cfg.model.count("/") > 1:
        if not os.path.exists(os.path.expanduser(cfg.model)):  # a local path (a Hub name is org/name)
            bad(f"--model {cfg.model}: no such file or folder")
    if cfg.resume and not cfg.run_name:
        bad("--resume needs --run_name (the run to continue)")
    if cfg.interruptions and cfg.length_penalty:
        bad("--interruptions and --length_penalty are alternatives (paper §4): choose one")


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
