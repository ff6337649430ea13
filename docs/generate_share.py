"""The project's own share of the generate phase on the toy: the time outside vLLM's engine.step() within
Generator.run_until_done (request building, seeded sampling parameters, the answer phase, detokenisation, the
bookkeeping of versions and groups), and within it vLLM's own intake of each request (engine.add_request).
Batches of 16 prompts x 8, the toy preset; 2 warm-up batches, then 8 timed.

    .venv/bin/python docs/generate_share.py      (on a quiet machine)
"""
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import config  # noqa: E402
import data  # noqa: E402
import generate  # noqa: E402
import toy  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
cfg = config.parse_args(["--mode", "sync"])
path = toy.build_toy_model("out")
tok = AutoTokenizer.from_pretrained(path)
train, val, grade = data.load_task(cfg, tok, log=lambda m: None)
gen = generate.Generator(cfg, path, tok, "cpu", updates_in_flight=False)
inner = [0.0, 0.0]  # seconds in engine.step, in engine.add_request (vLLM's intake of a request) this batch
step, add = gen.engine.step, gen.engine.add_request
def timed():
    t0 = time.perf_counter(); out = step(); inner[0] += time.perf_counter() - t0; return out
def timed_add(*a, **k):
    t0 = time.perf_counter(); add(*a, **k); inner[1] += time.perf_counter() - t0
gen.engine.step, gen.engine.add_request = timed, timed_add
shares, intake, totals, toks = [], [], [], []
for b in range(10):
    inner[0] = inner[1] = 0.0
    rows = train[b * 16:(b + 1) * 16]
    t0 = time.perf_counter()
    uids = set()
    for j, r in enumerate(rows):
        uid = f"b{b}-{j}"; gen.submit(uid, j, r["prompt_ids"], r["answer"], 8, serial=b * 16 + j); uids.add(uid)
    groups = gen.run_until_done(uids)
    total = time.perf_counter() - t0
    if b >= 2:
        shares.append(1 - inner[0] / total); intake.append(inner[1] / total); totals.append(total); toks.append(sum(len(s.token_ids) for g in groups for s in g.samples))
print(f"generate phase {statistics.median(totals):.3f} s/batch, {statistics.median(toks)/statistics.median(totals):.0f} tokens/s; "
      f"outside vLLM's engine.step: median {statistics.median(shares):.1%} (range {min(shares):.1%}-{max(shares):.1%}) over {len(shares)} batches; "
      f"of which vLLM's add_request {statistics.median(intake):.1%}, the project's own code "
      f"{statistics.median(shares) - statistics.median(intake):.1%}")
os._exit(0)
