"""What SmoothQuant and outlier channels in float32 cost the int8 sampler: tokens/s of float32
dense, ``int8``, ``int8`` + 16 outlier channels, ``int8`` + SmoothQuant 0.5 and both, in rotating
rounds in one process (:func:`sparserl.bench.measure.time_rounds`; batch 16, the bench prompt, L new
tokens); each arm against dense as the median of the per-round ratios. Results: docs/results/smoothquant.md.

    python3 experiments/rollout/outlier_cost.py 256 2      # L = 256 new tokens, 2 rounds
"""

import sys

import torch

from sparserl.bench.measure import time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

L, rounds = int(sys.argv[1]), int(sys.argv[2])
lm = load_model("smollm2-135m", dtype=torch.float32)
specs = {
    "dense": dict(),
    "int8": dict(quant="int8"),
    "int8+o16": dict(quant="int8", quant_outliers=16),
    "int8+s": dict(quant="int8", quant_smooth=0.5),
    "int8+s+o16": dict(quant="int8", quant_smooth=0.5, quant_outliers=16),
}
engines = {k: RolloutEngine(lm, build_compressor("none"), dtype=torch.float32, **v) for k, v in specs.items()}
p = SamplingParams(n=16, max_new_tokens=L, ignore_eos=True, seed=0)
for e in engines.values():  # warm-up: allocator, thread pool, packed weights
    e.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
res = time_rounds(
    {k: (lambda e=e: e.generate([BENCH_PROMPT], p)) for k, e in engines.items()},
    rounds,
    on_run=lambda r, k, s, out: print(f"round {r + 1} {k:12s} {out.tokens_per_s:7.1f} tok/s", flush=True),
)
speed = lambda out: out.tokens_per_s  # noqa: E731  (the figure the rounds are compared on)
for k in engines:
    print(f"{k:12s} median {res.median(k, speed):7.1f} tok/s  {res.median_ratio(k, 'dense', speed):.3f}x dense")
