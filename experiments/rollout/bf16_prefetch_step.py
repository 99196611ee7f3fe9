"""The bf16 decode step with ``linear_bf16.c`` built with prefetch 64 panel rows ahead (the shipped
build) against none (``-DPREFETCH_K2=0``, the build before), in one process: SmolLM2-135M, the fused bf16
sampler, batch 16 from the bench's prompt, dense cache (or ``--compressor``); the same engine and packed
weights, the library swapped between runs; rounds alternate the order, and the ratio is the median of the
per-round ratios. Also checks both sample the same tokens.

    python3 experiments/rollout/bf16_prefetch_step.py --tokens 256 --json docs/results/bf16_linear/step_L256.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from sparserl.models.loading import load_model
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--compressor", default="none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    libs = {"prefetch_0": native.load(native.build(flags=native.flags_for("-march=native -DPREFETCH_K2=0"))),
            "prefetch_64": native.load(native.build())}
    shipped = native.library
    lm = load_model("smollm2-135m", dtype="float32")
    engine = RolloutEngine(lm, build_compressor(args.compressor, kv_budget=128), dtype="bfloat16")
    params = SamplingParams(n=16, max_new_tokens=args.tokens, ignore_eos=True, seed=0)
    tokens = {}

    def run(name: str) -> float:
        native.library = lambda: libs[name]
        try:
            t0 = time.perf_counter()
            out = engine.generate([BENCH_PROMPT], params)
            seconds = time.perf_counter() - t0
        finally:
            native.library = shipped
        tokens[name] = out.response_ids
        return out.tokens_generated / seconds

    for name in libs:  # warm-up
        run(name)
    rounds = []
    for r in range(args.rounds):
        order = list(libs) if r % 2 == 0 else list(libs)[::-1]
        rounds.append({name: run(name) for name in order})
        print(f"round {r + 1}: " + ", ".join(f"{n} {v:.0f} tok/s" for n, v in rounds[-1].items()), flush=True)
    per = [r["prefetch_64"] / r["prefetch_0"] for r in rounds]
    result = {"machine": {"cpu": cpu_name(), "isa": native.isa(), "torch_threads": torch.get_num_threads(),
                          "torch": torch.__version__},
              "command": f"python3 experiments/rollout/bf16_prefetch_step.py --tokens {args.tokens} --compressor "
                         f"{args.compressor} --rounds {args.rounds} --json {args.json}",
              "tokens_per_s_rounds": rounds, "prefetch_64_over_0": {"median": statistics.median(per), "rounds": per},
              "same_tokens": tokens["prefetch_0"] == tokens["prefetch_64"]}
    print(f"prefetch 64 / none: {statistics.median(per):.3f}x (rounds {', '.join(f'{p:.3f}' for p in per)}); "
          f"same tokens {result['same_tokens']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
