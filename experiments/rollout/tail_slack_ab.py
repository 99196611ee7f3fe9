"""R-KV against dense at 256 new tokens, with and without ``tail_slack``, in one process: batch 16,
the bench's prompt, budget 256, step 32, the prompt compressible (the bench's 256-token row: the
buffer fills at token 244 and one compression is due with 11 tokens left). The three engines run in
a rotating order (each first in turn) for ``rounds`` rounds (:func:`sparserl.bench.measure.time_rounds`);
prints tokens/s per round, the median, and each sparse engine's per-round ratio to the dense run of the
same round and their median.

    python3 experiments/rollout/tail_slack_ab.py [rounds] [new_tokens]

Results: docs/results/compression_cost.md.
"""

import sys

import torch

from sparserl.bench.measure import time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 256
lm = load_model("smollm2", dtype=torch.float32)
dense = RolloutEngine(lm, build_compressor("none"), dtype=torch.float32)
engines = {"dense": dense}
for slack in (0, 32):
    comp = build_compressor("rkv", kv_budget=256, step_length=32, compress_prompt=True, tail_slack=slack)
    engines[f"rkv slack {slack}"] = RolloutEngine.from_engine(dense, comp)
params = SamplingParams(n=16, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
for engine in engines.values():  # warm-up: allocator, thread pool, packed weights
    engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
names = list(engines)
compressions = {}


def arm(name):
    def run():
        out = engines[name].generate([BENCH_PROMPT], params)
        compressions[name] = out.kv.compressions
        return out

    return run


speed = lambda out: out.tokens_per_s  # noqa: E731  (the figure the rounds are compared on)
res = time_rounds(
    {name: arm(name) for name in names},
    rounds,
    on_run=lambda r, name, s, out: print(f"round {r + 1}: {name} {out.tokens_per_s:.1f}", flush=True),
)
for name in names:
    ratios = res.ratios(name, "dense", speed)
    print(
        f"{name:12s} median {res.median(name, speed):6.1f} tok/s  compressions {compressions[name]}  "
        f"ratio to dense per round {[round(x, 3) for x in ratios]}  median {res.median_ratio(name, 'dense', speed):.3f}"
    )
