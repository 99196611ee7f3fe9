"""Does carrying a compressor cost a decode step anything when it never compresses? Batch 16, 160
new tokens on the bench prompt with the prompt kept (R-KV and StreamingLLM at budget 256 never fill
their buffer), dense / R-KV / StreamingLLM alternating for 4 rounds in one process, ms per decode
step (whole generation / 160). Results: docs/results/compression_cost.md (eighth session).

    python3 experiments/rollout/step_overhead.py
"""
import statistics
import time

import torch

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.sampling import SamplingParams
from sparserl.rollout.profile import BENCH_PROMPT
lm = load_model("smollm2", dtype=torch.float32)
engines = {"dense": RolloutEngine(lm, build_compressor("none"), dtype=torch.float32),
           "rkv": RolloutEngine(lm, build_compressor("rkv", kv_budget=256, step_length=32, compress_prompt=False), dtype=torch.float32),
           "streaming": RolloutEngine(lm, build_compressor("streaming", kv_budget=256, step_length=32, compress_prompt=False), dtype=torch.float32)}
p = SamplingParams(n=16, max_new_tokens=160, ignore_eos=True, seed=0)
res = {k: [] for k in engines}
for e in engines.values(): e.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
for rnd in range(4):
    for name, e in engines.items():
        t = time.perf_counter(); out = e.generate([BENCH_PROMPT], p); res[name].append((time.perf_counter() - t) / 160 * 1e3)
        assert out.kv.compressions == 0, "the run compressed: this measures per-step costs only"
for k, v in res.items(): print(k, "ms/step", [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
