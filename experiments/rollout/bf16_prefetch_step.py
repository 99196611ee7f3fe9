"""The bf16 decode step with ``linear_bf16.c`` built with prefetch 64 panel rows ahead (the shipped
build) against none (``-DPREFETCH_K2=0``, no prefetch), in one process: SmolLM2-135M, the fused bf16
sampler, batch 16 from the bench's prompt, dense cache (or ``--compressor``); the same engine and packed
weights, the library swapped between runs; rounds alternate the order (:func:`sparserl.bench.measure.time_rounds`),
and the ratio is the median of the per-round ratios. Also checks both sample the same tokens.

    python3 experiments/rollout/bf16_prefetch_step.py --tokens 256 --json docs/results/bf16_linear/step_L256.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
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
    libs = {
        "prefetch_0": native.load(native.build(flags=native.flags_for("-march=native -DPREFETCH_K2=0"))),
        "prefetch_64": native.load(native.build()),
    }
    shipped = native.library
    lm = load_model("smollm2-135m", dtype="float32")
    engine = RolloutEngine(lm, build_compressor(args.compressor, kv_budget=128), dtype="bfloat16")
    params = SamplingParams(n=16, max_new_tokens=args.tokens, ignore_eos=True, seed=0)
    tokens = {}

    def arm(name: str):
        def run():
            native.library = lambda: libs[name]
            try:
                out = engine.generate([BENCH_PROMPT], params)
            finally:
                native.library = shipped
            tokens[name] = out.response_ids
            return out

        return run

    res = time_rounds(
        {name: arm(name) for name in libs},
        args.rounds,
        warmup=1,
        on_run=lambda r, name, sec, out: print(
            f"round {r + 1}: {name} {out.tokens_generated / sec:.0f} tok/s", flush=True
        ),
    )
    rounds = [
        {name: res.results[name][r].tokens_generated / res.seconds[name][r] for name in libs}
        for r in range(args.rounds)
    ]
    per = res.ratios("prefetch_0", "prefetch_64")  # seconds: none over prefetch = prefetch's speed-up
    result = {
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "command": f"python3 experiments/rollout/bf16_prefetch_step.py --tokens {args.tokens} --compressor "
        f"{args.compressor} --rounds {args.rounds} --json {args.json}",
        "tokens_per_s_rounds": rounds,
        "prefetch_64_over_0": {"median": statistics.median(per), "rounds": per},
        "same_tokens": tokens["prefetch_0"] == tokens["prefetch_64"],
    }
    print(
        f"prefetch 64 / none: {statistics.median(per):.3f}x (rounds {', '.join(f'{p:.3f}' for p in per)}); "
        f"same tokens {result['same_tokens']}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
