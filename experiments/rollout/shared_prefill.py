"""A group's prompt prefilled once for its n rows, against a prefill over every row, in one process.

The default training job's rollout shape (``python -m sparserl.rollout.profile --job default``: 4 prompts
x 8 samples, the system prompt and a one-digit sum, 48 new tokens, R-KV holding the KV to 40 tokens,
budget 40, step 2, window 8, the prompt compressible), SmolLM2-135M (embedded), in each sampler dtype.
Arms: ``shared`` (the engine: :meth:`RolloutEngine._prefill_distinct`) and ``every_row`` (the
prefill over all 32 rows). Each round runs both arms of both dtypes in a rotated order
(:func:`sparserl.bench.measure.time_rounds`); a ratio is the median of the per-round ratios
(every_row seconds / shared seconds). Also checks the two
arms sample the same tokens.

    python3 experiments/rollout/shared_prefill.py --json docs/results/shared_prefill/default_job.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import job_prompts
from sparserl.rollout.sampling import SamplingParams


def every_row(engine: RolloutEngine):
    return lambda ids, valid, positions, q, at: engine.model.prefill(ids, valid, positions, q, at)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    lm = load_model("smollm2-135m", dtype="float32")
    prompts, n = job_prompts("default", 32)
    params = SamplingParams(n=n, max_new_tokens=48, seed=0)
    engines = {}
    for dtype in ("bfloat16", "float32"):
        comp = build_compressor("rkv", kv_budget=40, step_length=2, window=8, compress_prompt=True)
        engines[(dtype, "shared")] = RolloutEngine(lm, comp, dtype=dtype)
        plain = RolloutEngine.from_engine(engines[(dtype, "shared")], comp)
        plain._prefill_distinct = every_row(plain)
        engines[(dtype, "every_row")] = plain
    same = {}
    for key, engine in engines.items():  # warm-up, and the tokens each arm samples
        same[key] = engine.generate(prompts, params).response_ids
    res = time_rounds(
        {"/".join(key): (lambda e=engine: e.generate(prompts, params)) for key, engine in engines.items()},
        args.rounds,
        on_run=lambda k, name, sec, out: print(
            f"round {k + 1} {name:>18}: {sec:.3f} s (prefill {out.prefill_seconds:.3f} s)", flush=True
        ),
    )
    rounds = [
        {
            name: {
                "seconds": res.seconds[name][k],
                "prefill_seconds": res.results[name][k].prefill_seconds,
                "tokens": res.results[name][k].tokens_generated,
            }
            for name in res.seconds
        }
        for k in range(args.rounds)
    ]
    ratios = {}
    for dtype in ("bfloat16", "float32"):
        for part, value in (("seconds", None), ("prefill_seconds", lambda out: out.prefill_seconds)):
            per = res.ratios(f"{dtype}/every_row", f"{dtype}/shared", value)
            ratios[f"{dtype}/{part}"] = {"median": statistics.median(per), "rounds": per}
    result = {
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "bf16_kernels": native.bf16_kernels(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
        },
        "command": f"python3 experiments/rollout/shared_prefill.py --rounds {args.rounds} --json {args.json}",
        "shape": {
            "prompts": len(prompts),
            "n": n,
            "max_new_tokens": 48,
            "compressor": "rkv",
            "kv_budget": 40,
            "step_length": 2,
            "window": 8,
            "compress_prompt": True,
        },
        "same_tokens": {d: same[(d, "shared")] == same[(d, "every_row")] for d in ("bfloat16", "float32")},
        "rounds": rounds,
        "ratio_every_row_over_shared": ratios,
    }
    for key, value in ratios.items():
        print(
            f"{key:>24}: every_row / shared {value['median']:.2f}x (rounds "
            f"{', '.join(f'{x:.2f}' for x in value['rounds'])})"
        )
    print("same tokens:", result["same_tokens"])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
