"""The static decode step at the length it is for, on this machine: the embedded SmolLM2-135M, 32 responses of up
to 1,024 new tokens (4 GSM8K-style prompts x 8, sampled at temperature 1), dense and R-KV (budget 256, step 32),
the eager engine (plain, unfused decode path) against ``RolloutEngine(static=True)``: greedy answers compared
response by response, then one sampled rollout on the static step. On a CPU the static step computes masked rows
and the whole capacity (it is built for CUDA graphs): the point here is that it runs at the length it is for and
gives the eager engine's answers, not its CPU speed (times are printed, not compared).

    python3 experiments/rollout/static_step_length.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:

    from sparserl.models.loading import load_model
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=1024)
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
    for name, kw in (("rkv", {"budget": 256, "step_length": 32}), ("none", {})):
        comp = get_compressor(name, **kw) if kw else get_compressor(name)
        eager = RolloutEngine(loaded, comp, dtype="bfloat16", fused=False)
        static = RolloutEngine(loaded, comp, dtype="bfloat16", fused=False, static=True, static_check_every=16)
        arm = {}
        for label, engine, params in (
            ("eager_greedy", eager, greedy),
            ("static_greedy", static, greedy),
            ("static_sampled", static, sampled),
        ):
            t0 = time.perf_counter()
            out = engine.generate(prompts, params)
            arm[label] = {
                "s": time.perf_counter() - t0,
                "tokens": out.tokens_generated,
                "mean_len": out.tokens_generated / 32,
                "kv_bytes_peak": out.kv.bytes_peak,
                "compressions": out.kv.compressions,
                "responses": out.response_ids,
            }
            print(name, label, f"{arm[label]['s']:.1f} s, {out.tokens_generated} tokens", flush=True)
        same = sum(a == b for a, b in zip(arm["eager_greedy"]["responses"], arm["static_greedy"]["responses"]))
        arm["greedy_identical_responses"] = same
        for v in arm.values():
            if isinstance(v, dict):
                v.pop("responses")
        result["arms"][name] = arm
        print(name, f"greedy responses identical {same}/32", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
