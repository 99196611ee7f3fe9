"""What SmoothQuant and outlier channels in float32 cost the int8 sampler: tokens/s of float32
dense, ``int8``, ``int8`` + 16 outlier channels, ``int8`` + SmoothQuant 0.5 and both, alternated
round by round in one process (batch 16, the bench prompt, L new tokens). Results:
docs/results/smoothquant.md (tenth session).

    python3 experiments/rollout/outlier_cost.py 256 2      # L = 256 new tokens, 2 rounds
"""
import sys, time, torch
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.sampling import SamplingParams
from sparserl.bench.rollout import BENCH_PROMPT
L = int(sys.argv[1]); rounds = int(sys.argv[2])
lm = load_model("smollm2-135m", dtype=torch.float32)
specs = {"dense": dict(), "int8": dict(quant="int8"), "int8+o16": dict(quant="int8", quant_outliers=16),
         "int8+s": dict(quant="int8", quant_smooth=0.5), "int8+s+o16": dict(quant="int8", quant_smooth=0.5, quant_outliers=16)}
engines = {k: RolloutEngine(lm, build_compressor("none"), dtype=torch.float32, **v) for k, v in specs.items()}
p = SamplingParams(n=16, max_new_tokens=L, ignore_eos=True, seed=0)
for e in engines.values():
    e.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
res = {k: [] for k in engines}
for r in range(rounds):
    for k, e in engines.items():
        out = e.generate([BENCH_PROMPT], p)
        res[k].append(out.tokens_per_s)
        print(f"round {r+1} {k:12s} {out.tokens_per_s:7.1f} tok/s", flush=True)
import statistics
d = statistics.median(res["dense"])
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v):7.1f} tok/s  {statistics.median(v)/d:.3f}x dense")
