"""The static decode step at the length it is for, on this machine: the embedded SmolLM2-135M, 32 responses of up
to 1,024 new tokens (4 GSM8K-style prompts x 8, sampled at temperature 1), dense and R-KV (budget 256, step 32),
the eager engine against ``RolloutEngine(static=True)`` in the same process, alternating, ``--rounds`` rounds.
Both run the plain (unfused) decode path, so the comparison is the step's shape, not the native kernels; the
eager engine's fused default is timed beside them. On a CPU the static step computes the finished rows and the
whole capacity (it is built for CUDA graphs): the point here is that it runs at length and gives the same
answers (greedy tokens compared once per arm), not its CPU speed.

    python3 experiments/rollout/static_step_length.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import torch

    from sparserl.models.loading import load_model
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    loaded = load_model("default", dtype="float32")
    prompts = [
        [{"role": "user", "content": q + " Think step by step, then give the answer in \\boxed{}."}]
        for q in (
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?",
            "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
            "How much did she earn?",
            "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
            "How much more money does Betty need to buy the wallet?",
            "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
        )
    ]
    sampled = SamplingParams(n=8, max_new_tokens=args.max_new_tokens, seed=0, temperature=1.0)
    greedy = SamplingParams(n=8, max_new_tokens=args.max_new_tokens, seed=0, temperature=0.0)
    result = {"max_new_tokens": args.max_new_tokens, "responses": 32, "arms": {}}
    for name, kw in (("none", {}), ("rkv", {"budget": 256, "step_length": 32})):
        comp = get_compressor(name, **kw) if kw else get_compressor(name)
        engines = {
            "eager_fused": RolloutEngine(loaded, comp, dtype="bfloat16"),
            "eager": RolloutEngine(loaded, comp, dtype="bfloat16", fused=False),
            "static": RolloutEngine(loaded, comp, dtype="bfloat16", fused=False, static=True, static_check_every=16),
        }
        e_out = engines["eager"].generate(prompts, greedy)
        s_out = engines["static"].generate(prompts, greedy)
        same = sum(a == b for a, b in zip(e_out.response_ids, s_out.response_ids))
        rounds = []
        for i in range(args.rounds):
            order = list(engines) if i % 2 == 0 else list(reversed(engines))
            row = {}
            for label in order:
                t0 = time.perf_counter()
                out = engines[label].generate(prompts, sampled)
                row[label] = {
                    "s": time.perf_counter() - t0,
                    "tokens": out.tokens_generated,
                    "kv_bytes_peak": out.kv.bytes_peak,
                }
            rounds.append(row)
            print(name, i + 1, {k: (round(v["s"], 1), v["tokens"]) for k, v in row.items()}, flush=True)
        ratio = statistics.median(r["eager"]["s"] / r["static"]["s"] for r in rounds)
        result["arms"][name] = {
            "greedy_identical_responses": same,
            "greedy_mean_len": sum(map(len, e_out.response_ids)) / 32,
            "rounds": rounds,
            "static_speed_vs_eager_unfused": ratio,
        }
        print(name, f"greedy responses identical {same}/32; static {ratio:.2f}x the unfused eager speed", flush=True)
        del engines
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
