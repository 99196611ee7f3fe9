"""The fused decode step (``sparserl.rollout.fused``) against the eager one on the same engine,
in rotating rounds in one process (:func:`sparserl.bench.measure.time_rounds`; batch 16, the bench's
prompt, EOS ignored), 2 rounds per weight quantization by default; prints tokens/s, the per-round
ratios and their median. Results: docs/results/engine_profile.md.

    python3 experiments/rollout/fused_step.py 256 none,int8  # new tokens, quantizations [, compressor [, rounds]]
"""

import sys

from sparserl.bench.measure import time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

L, quants = int(sys.argv[1]), sys.argv[2].split(",")
comp = sys.argv[3] if len(sys.argv) > 3 else "none"
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
lm = load_model("smollm2-135m", dtype="float32")
for quant in quants:
    eng = RolloutEngine(lm, build_compressor(comp, kv_budget=256, step_length=32), dtype="float32", quant=quant)
    eng.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))  # warm-up

    def arm(fused: bool):
        def run():
            eng.fused = fused
            return eng.generate([BENCH_PROMPT], SamplingParams(n=16, max_new_tokens=L, ignore_eos=True, seed=0))

        return run

    res = time_rounds(
        {"fused": arm(True), "eager": arm(False)},
        rounds,
        on_run=lambda r, name, s, out: print(quant, comp, name, f"{out.tokens_per_s:.1f} tok/s", flush=True),
    )
    speed = lambda out: out.tokens_per_s  # noqa: E731  (the figure the rounds are compared on)
    print(
        quant,
        comp,
        "fused / eager per round:",
        [round(x, 3) for x in res.ratios("fused", "eager", speed)],
        "median",
        round(res.median_ratio("fused", "eager", speed), 3),
        flush=True,
    )
