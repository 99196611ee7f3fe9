"""Does carrying a compressor cost a decode step anything when it never compresses? Batch 16, 160
new tokens on the bench prompt with the prompt kept (R-KV and StreamingLLM at budget 256 never fill
their buffer), dense / R-KV / StreamingLLM in rotating rounds in one process
(:func:`sparserl.bench.measure.time_rounds`,
4 by default), ms per decode step (whole generation / 160) and each against dense as the median of the
per-round ratios. Results: docs/results/compression_cost.md.

    python3 experiments/rollout/step_overhead.py [rounds] [new_tokens]
"""

import sys

import torch

from sparserl.bench.measure import time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 160
lm = load_model("smollm2", dtype=torch.float32)
engines = {
    "dense": RolloutEngine(lm, build_compressor("none"), dtype=torch.float32),
    "rkv": RolloutEngine(
        lm, build_compressor("rkv", kv_budget=256, step_length=32, compress_prompt=False), dtype=torch.float32
    ),
    "streaming": RolloutEngine(
        lm, build_compressor("streaming", kv_budget=256, step_length=32, compress_prompt=False), dtype=torch.float32
    ),
}
p = SamplingParams(n=16, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
for e in engines.values():  # warm-up: allocator, thread pool, packed weights
    e.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))


def arm(e):
    def run():
        out = e.generate([BENCH_PROMPT], p)
        assert out.kv.compressions == 0, "the run compressed: this measures per-step costs only"
        return out

    return run


res = time_rounds({k: arm(e) for k, e in engines.items()}, rounds)
for k in engines:
    ms = [s / new_tokens * 1e3 for s in res.seconds[k]]
    print(
        k,
        "ms/step",
        [round(x, 2) for x in ms],
        "median",
        round(res.median(k) / new_tokens * 1e3, 2),
        "against dense (median of per-round ratios)",
        round(res.median_ratio(k, "dense"), 3),
    )
