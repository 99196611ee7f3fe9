"""The static decode step at the length it is for, on this machine: the embedded SmolLM2-135M, 32 responses of up
to 1,024 new tokens (4 GSM8K-style prompts x 8), dense and R-KV (budget 256, step 32), the eager engine (plain,
unfused decode path) against ``RolloutEngine(static=True)``: greedy answers compared response by response
(``--sampled``: then one sampled rollout on the static step). On a CPU the static step computes masked rows and the
whole capacity (it is built for CUDA graphs): the point here is that it runs at the length it is for and gives the
eager engine's answers, not its CPU speed (times are printed, not compared).

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
    p.add_argument("--sampled", action="store_true", help="also one sampled rollout on the static step per arm")
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
    # R-KV checked every step (compressions at the eager engine's tokens, so its answers can be compared);
    # dense every 16 steps (nothing to compress: the period changes no answer)
    for name, kw, every in (("rkv", {"budget": 256, "step_length": 32}, 1), ("none", {}, 16)):
        comp = get_compressor(name, **kw) if kw else get_compressor(name)
        eager = RolloutEngine(loaded, comp, dtype="bfloat16", fused=False)
        static = RolloutEngine(loaded, comp, dtype="bfloat16", fused=False, static=True, static_check_every=every)
        arm = {"static_check_every": every}
        runs = [("eager_greedy", eager, greedy), ("static_greedy", static, greedy)]
        if args.sampled:
            runs.append(("static_sampled", static, sampled))
        for label, engine, params in runs:
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
        pairs = list(zip(arm["eager_greedy"]["responses"], arm["static_greedy"]["responses"]))
        same = sum(a == b for a, b in pairs)
        arm["greedy_identical_responses"] = same
        # where they differ: the first differing token of each differing response
        arm["first_difference"] = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if a != b and any(
            x != y for x, y in zip(a, b)) else min(len(a), len(b)) for a, b in pairs if a != b]  # fmt: skip
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
