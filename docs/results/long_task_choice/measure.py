"""Measure a candidate task for the long job: n samples per problem on the dense sampler, at the training
temperature, and per candidate pass@1, pass@n, the fraction of groups whose reward spread is non-zero (a GRPO
group with signal), the mean / p90 response length in tokens and the fraction cut at max_new_tokens.

    python3 docs/results/long_task_choice/measure.py --data arith:difficulty=1,seed=1000 \
        --system-prompt "..." --limit 16 --n 8 --max-new-tokens 1024 --out result.json

It reads the data the way ``sparserl eval`` does (sparserl.data.options) and samples on the same engine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

from sparserl.data.options import add_data_options, load_from_options
from sparserl.models.loading import load_model
from sparserl.reward import load_reward, score_responses
from sparserl.rollout.dtype_auto import resolve_dtype
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.sampling import SamplingParams


def p90(xs: list[int]) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(0.9 * len(s)))])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", required=True)
    ap.add_argument("--limit", type=int, default=16)
    add_data_options(ap)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32, help="responses sampled at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    data = list(load_from_options(args))
    reward_fn = load_reward("math", timeout_s=5.0)
    dtype = resolve_dtype(args.dtype)
    engine = RolloutEngine(load_model(args.model, dtype=dtype), build_compressor("none"), dtype=dtype)
    params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    rewards, lengths, cut, prompt_lengths, texts = [], [], [], [], []
    t0 = time.perf_counter()
    per_call = max(1, args.batch // args.n)
    for s in range(0, len(data), per_call):
        chunk = data[s : s + per_call]
        out = engine.generate([e.prompt for e in chunk], params)
        asked = [chunk[i] for i in out.prompt_index]
        r, _ = score_responses(reward_fn, out.texts, [x.label for x in asked], [x.prompt_text for x in asked])
        rewards += r
        lengths += [len(x) for x in out.response_ids]
        cut += [f == "length" for f in out.finish_reason]
        prompt_lengths += [len(x) for x in out.prompt_ids]
        texts += out.texts
    seconds = time.perf_counter() - t0
    groups = [rewards[i * args.n : (i + 1) * args.n] for i in range(len(data))]
    res = {
        "data": args.data,
        "system_prompt": args.system_prompt,
        "problems": len(data),
        "n": args.n,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "dtype": str(dtype),
        "pass@1": sum(x >= 1.0 for x in rewards) / len(rewards),
        f"pass@{args.n}": sum(any(x >= 1.0 for x in g) for g in groups) / len(groups),
        "groups_with_spread": sum(max(g) > min(g) for g in groups) / len(groups),
        "length_mean": statistics.fmean(lengths),
        "length_p50": float(statistics.median(lengths)),
        "length_p90": p90(lengths),
        "length_max": max(lengths),
        "cut_fraction": sum(cut) / len(cut),
        "correct_length_mean": statistics.fmean([n for n, r in zip(lengths, rewards) if r >= 1.0] or [0]),
        "prompt_length_mean": statistics.fmean(prompt_lengths),
        "seconds": seconds,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "samples": [
            {"reward": r, "length": n, "text": t} for r, n, t in list(zip(rewards, lengths, texts))[: 2 * args.n]
        ],
    }
    summary = {k: v for k, v in res.items() if k != "samples"}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
