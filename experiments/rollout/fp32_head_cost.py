"""What ``rollout.fp32_head`` costs a bfloat16 sampler's rollout: the same ``generate`` (32 responses, EOS ignored)
with the head in bfloat16 and in float32, alternately in one process, per round the ratio of their times; the
median of the per-round ratios is the figure.

    python3 experiments/rollout/fp32_head_cost.py --tokens 256 --rounds 5 --json fp32_head_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from sparserl.models.loading import load_model
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.profile import BENCH_PROMPT
    from sparserl.rollout.sampling import SamplingParams

    lm = load_model("smollm2-135m", dtype="float32")
    engines = {
        head: RolloutEngine(lm, build_compressor("rkv", kv_budget=40, step_length=2), dtype="bfloat16", fp32_head=fp32)
        for head, fp32 in (("bf16 head", False), ("fp32 head", True))
    }
    params = SamplingParams(n=args.rows, max_new_tokens=args.tokens, ignore_eos=True, seed=0)
    for engine in engines.values():  # warm: the kernels' first calls
        engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
    times: dict[str, list[float]] = {head: [] for head in engines}
    for r in range(args.rounds):
        for head, engine in engines.items():
            t0 = time.perf_counter()
            engine.generate([BENCH_PROMPT], params)
            times[head].append(time.perf_counter() - t0)
        print(f"round {r}: " + ", ".join(f"{h} {v[-1]:.2f} s" for h, v in times.items()), flush=True)
    ratios = [f / b for f, b in zip(times["fp32 head"], times["bf16 head"])]
    result = {
        "what": f"generate of {args.rows} x {args.tokens} tokens, R-KV 40 + 2, bfloat16 sampler",
        "seconds": times,
        "per_round_ratio_fp32_over_bf16": ratios,
        "median_ratio": statistics.median(ratios),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    rounds = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"fp32 head / bf16 head time: median {result['median_ratio']:.3f} (rounds {rounds})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
