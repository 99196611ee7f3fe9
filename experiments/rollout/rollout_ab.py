"""One timed ``generate`` (batch 16, the bench's prompt, EOS ignored), no profiler: for A/B timings
of two source trees, run alternately with PYTHONPATH=<tree>/src. Prints the tree, the compressor
and tokens/s. Results: docs/results/compression_cost.md.

    PYTHONPATH=<tree>/src python3 experiments/rollout/rollout_ab.py rkv 1024            # compressor, new tokens
    PYTHONPATH=<tree>/src python3 experiments/rollout/rollout_ab.py rkv 512 bfloat16   # the sampler's dtype
"""

import sys

import sparserl
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

comp = sys.argv[1]
lm = load_model("smollm2-135m", dtype="float32")
dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
eng = RolloutEngine(lm, build_compressor(comp, kv_budget=256, step_length=32), dtype=dtype)
P = BENCH_PROMPT
eng.generate([P], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
out = eng.generate([P], SamplingParams(n=16, max_new_tokens=int(sys.argv[2]), ignore_eos=True, seed=0))
print(sparserl.__file__.split("/src")[0], comp, dtype, f"{out.tokens_per_s:.1f} tok/s", flush=True)
