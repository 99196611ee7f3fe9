"""The fused decode step (``sparserl.rollout.fused``) against the eager one on the same engine,
alternating in one process (batch 16, the bench's prompt, EOS ignored), 2 rounds per weight
quantization; prints tokens/s and the per-round ratio. Results: docs/results/engine_profile.md
(seventh session).

    python3 experiments/rollout/fused_step.py 256 none,int8          # new tokens, quantizations [, compressor]
"""
import sys

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

L, quants = int(sys.argv[1]), sys.argv[2].split(",")
comp = sys.argv[3] if len(sys.argv) > 3 else "none"
lm = load_model("smollm2-135m", dtype="float32")
for quant in quants:
    eng = RolloutEngine(lm, build_compressor(comp, kv_budget=256, step_length=32), dtype="float32", quant=quant)
    eng.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))  # warm-up
    res = {True: [], False: []}
    for _ in range(2):
        for fused in (True, False):
            eng.fused = fused
            out = eng.generate([BENCH_PROMPT], SamplingParams(n=16, max_new_tokens=L, ignore_eos=True, seed=0))
            res[fused].append(out.tokens_per_s)
            print(quant, comp, "fused" if fused else "eager", f"{out.tokens_per_s:.1f} tok/s", flush=True)
    print(quant, comp, "fused / eager per round:", [round(a / b, 3) for a, b in zip(res[True], res[False])],
          flush=True)
