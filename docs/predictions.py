"""Does a fit on the rise predict the plateau, over every committed run of the toy preset's family, not a chosen few?

For each log, `fit_curve.py --fit-to-cmid F` for F = 1.5, 2 and 3: the fit up to F x C_mid predicts the run's last
evaluation. A run passes at F when the prediction is within 0.02 of it and closer than persistence (the window's
last evaluation carried forward). The paper fits about 3 C_mid (8k of 16k GPU-hours with C_mid near 2.5k).
The family: logs whose run has the preset's learning rate and warm-up (config.TOY), so the fit window starts at the
same point of the schedule; other runs are listed as left out. A run with no fit (no rise, or R² under 0.5 on all
its evaluations) counts as a failure at every F.

    python docs/predictions.py docs/logs/study-v2/*.jsonl docs/logs/shipped-start/*.jsonl
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import config  # noqa: E402
import study  # noqa: E402

CUTS, TOLERANCE, LOOSE, MIN_R2 = (1.5, 2.0, 3.0), 0.02, 0.03, 0.5  # LOOSE: the README's earlier claims' tolerance


def fits(logs: list[str], *extra: str) -> dict:  # fit_curve.py's fits by log path (absolute: it runs in ROOT)
    return {r["file"]: r for r in study.fit_curve([os.path.abspath(p) for p in logs], "--bootstrap", "0", *extra)}


def main(paths: list[str]):
    if not paths:
        sys.exit("error: name the logs (jsonl) to judge, e.g. docs/logs/study-v2/*.jsonl")
    preset = config.parse_args([])
    family, left, trained = [], [], {}  # trained: the losses of a run's steps -> its first log
    name = {p: os.path.relpath(p, ROOT).removesuffix(".jsonl") for p in paths}
    for path in paths:
        records = [json.loads(line) for line in open(path) if line.startswith("{")]
        cfg = next((r for r in records if r["kind"] == "config"), None)
        same = cfg is not None and (cfg.get("lr"), cfg.get("warmup_steps")) == (preset.lr, preset.warmup_steps)
        losses = tuple(r["loss"] for r in records if r["kind"] == "train")
        if same and losses in trained:  # one training logged twice (evaluated another way, or copied): count once
            left.append(f"{name[path]} (the training of {name[trained[losses]]})")
        elif same:
            family.append(path)
            trained[losses] = path
        else:
            left.append(f"{name[path]} (lr {cfg and cfg.get('lr')}, warm-up {cfg and cfg.get('warmup_steps')})")
    print(f"{len(family)} runs at the preset's lr {preset.lr} and warm-up {preset.warmup_steps}, each its own "
          f"training; left out: " + ("; ".join(left) or "none"))
    whole = fits(family)
    passed, loose = ({f: [] for f in CUTS} for _ in range(2))
    print("| run | A | R² | " + " | ".join(f"error at {f} C_mid (persistence)" for f in CUTS) + " |")
    print("|---|---|---|" + "---|" * len(CUTS))
    cut_fits = {f: fits(family, "--fit-to-cmid", str(f)) for f in CUTS}
    for path in family:
        run, cells, r = name[path], [], whole.get(os.path.abspath(path))
        for f in CUTS:
            last = ((cut_fits[f].get(os.path.abspath(path)) or {}).get("extrapolation") or [None])[-1]
            beats = bool(r and r["r2"] >= MIN_R2 and last and abs(last["error"]) < abs(last["persistence_error"]))
            ok = beats and abs(last["error"]) <= TOLERANCE
            passed[f].append(ok)
            loose[f].append(beats and abs(last["error"]) <= LOOSE)
            cells.append("no fit" if not last else f"{last['error']:+.3f} ({last['persistence_error']:+.3f})"
                         + (" pass" if ok else ""))
        head = f"{r['A']:.3f} | {r['r2']:.3f}" if r else "no fit | -"
        print(f"| {run} | {head} | " + " | ".join(cells) + " |")
    for f in CUTS:
        print(f"fit up to {f} C_mid: {sum(passed[f])} of {len(family)} runs predict their last evaluation within "
              f"{TOLERANCE} and better than persistence ({sum(passed[f]) / max(len(family), 1):.0%}); within "
              f"{LOOSE}: {sum(loose[f])}")


if __name__ == "__main__":
    main(sys.argv[1:])
