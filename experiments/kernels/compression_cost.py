"""What one R-KV compression's scoring costs, C kernels (native/kv_scores.c) against torch, in one
process: the shapes of a compression at batch 16 on SmolLM2 (30 layers x 16 sequences = 480
(sequence, layer) pairs, 3 KV heads, 9 query heads, head dim 64, window 8; the prompt of the bench
plus budget 256 + step 32 = 360 slots, region 288). Random keys and queries; each part timed as the
median of ``--repeat`` calls, the two paths in rotating rounds (:func:`sparserl.bench.measure.time_rounds`).
Results: docs/results/compression_cost.md.

    python3 experiments/kernels/compression_cost.py [--repeat 5] [--step-length 32]
"""

import argparse
import statistics

import torch

from sparserl.bench.measure import time_rounds
from sparserl.rollout import native
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.kv.base import ScoreInputs, window_attention
from sparserl.rollout.kv.rkv import redundancy

parser = argparse.ArgumentParser()
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--step-length", type=int, default=32)
parser.add_argument("--prompt", type=int, default=72)
args = parser.parse_args()

torch.manual_seed(0)
pairs, region = 480, 256 + args.step_length
length = args.prompt + region
keys = torch.randn(pairs, 3, length, 64)
queries = torch.randn(pairs, 9, 8, 64)
valid = torch.ones(pairs, length, dtype=torch.bool)
inp = ScoreInputs(
    keys=keys,
    region=slice(args.prompt, length),
    valid=valid,
    queries=queries,
    positions=torch.arange(length).expand(pairs, 3, length),
)
rkv = get_compressor("rkv", budget=256, step_length=args.step_length)
parts = {
    "window attention": lambda: window_attention(inp, "max"),
    "redundancy": lambda: redundancy(inp.region_keys, valid[:, args.prompt :]),
    "select (whole score + top-k)": lambda: rkv.select(inp, 256),
}
print(f"{pairs} pairs, L = {length}, region {region}, torch threads {torch.get_num_threads()}")
for name, fn in parts.items():

    def in_torch(fn=fn):
        with native.torch_only():
            fn()

    times = time_rounds({"native": fn, "torch": in_torch}, args.repeat, warmup=1).seconds
    med = {p: statistics.median(v) * 1e3 for p, v in times.items()}
    print(
        f"{name:30s} native {med['native']:8.1f} ms   torch {med['torch']:8.1f} ms   "
        f"{med['torch'] / med['native']:5.1f}x"
    )
