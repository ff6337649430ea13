"""What a toy-carry policy does at each carry (docs/study.md, "Version 5"): on every validation sum's right
scratchpad, teacher-forced up to a step that enters a new decade, the probability of the right tens digit and of
the forgotten carry's (one less), averaged by the decade entered.

    python docs/carry_prob.py out/toy-carry-<hash> out/carry-s0/ckpt-001000 ...   # warm start, checkpoints

A decade whose right digit has probability ~10^-4 is one RL will not find by sampling: the run's ceiling.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def carry_probabilities(path: str) -> dict:
    """{decade entered: (mean p(right digit), mean p(forgotten digit), carries)} over the validation sums."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import toy
    from rewards import format_prompt
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    by = {}
    for row in toy.toy_rows("val"):
        addends = toy.terms(row["prompt"])
        prompt, text, running = format_prompt(tok, row["prompt"]), "", addends[0]
        for t in addends[1:]:
            result, text = running + t, text + f"{running}+{t}="
            if result // 10 > running // 10 and result >= 20:  # a carry toy-carry's teacher may forget
                ids = prompt + tok(text, add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
                right, forgot = (tok.convert_tokens_to_ids(str(d)) for d in (result // 10, result // 10 - 1))
                by.setdefault(result // 10, []).append((p[right].item(), p[forgot].item()))
            text, running = text + f"{result} ", result
    return {d: (sum(r for r, _ in v) / len(v), sum(f for _, f in v) / len(v), len(v)) for d, v in sorted(by.items())}


if __name__ == "__main__":
    for folder in sys.argv[1:] or sys.exit(__doc__):
        if not os.path.exists(os.path.join(folder, "config.json")):
            sys.exit(f"error: {folder} is not a model folder (no config.json)")
        print(folder + ": " + "; ".join(f"into the {10 * d}s p(right) {r:.1e} p(forgot) {f:.3f} ({n})"
                                        for d, (r, f, n) in carry_probabilities(folder).items()), flush=True)
