"""``sparserl calibrate``'s measurement with ``q`` kept while each sampler samples, against a replay, in one
process.

The default job's calibration (the command of ``docs/results/sparrow_schedule/``: ``arith`` with the
default job's system prompt, R-KV over the whole cache, window 8, compression every 2 steps, ``--n 8``,
48 new tokens) on ``--limit`` prompts and ``--budgets``, through :func:`sparserl.calibrate.measure.measure`
(what the command times and writes) twice a round, in alternating order
(:func:`sparserl.bench.measure.time_rounds`):

- ``replay``: ``record_mib=0``, each sampler replayed on its own tokens (``--alpha-record-mib 0``);
- ``kept``: ``record_mib=2048``, ``q`` kept while sampling;
- ``kept_shared``: ``q`` kept, and ``p``'s forward takes each distinct prompt once (the command's default);

with ``p`` from a forward over every row whole in the first two (``shared_prompt=False``).
``--arms A B`` picks two (default ``replay kept``); a ratio is the median of the per-round
ratios (A's seconds / B's). The two arms sample the same
tokens from the same ``q``; their rows' α differ only by the rounding of ``p``'s head product (per response
when ``q`` is kept, per step in the replay): the largest difference is recorded.

    python3 experiments/mismatch/calibrate_kept.py --rounds 3 --json docs/results/calibrate_kept/default_job.json
    python3 experiments/mismatch/calibrate_kept.py --arms kept kept_shared --rounds 3 \
        --json docs/results/calibrate_kept/shared_prompt_p.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.calibrate.measure import measure
from sparserl.config import load_config
from sparserl.data import load_dataset
from sparserl.mismatch.exact_alpha import distributions_mib
from sparserl.models.loading import load_model
from sparserl.rollout.dtype_auto import cpu_name, resolve_dtype
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.sampling import SamplingParams

#: arm -> (record_mib, shared_prompt)
ARMS = {"replay": (0, False), "kept": (2048, False), "kept_shared": (2048, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--budgets", default="24,40,64")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="float32", help="the sampler's (calibrate's default: float32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", nargs=2, default=["replay", "kept"], choices=list(ARMS))
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    system_prompt = load_config("default").data.system_prompt
    data = load_dataset("arith", limit=args.limit, system_prompt=system_prompt)
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    lm = load_model("smollm2-135m", dtype="float32")
    dense = RolloutEngine(lm, build_compressor("none"), dtype=dtype)
    prompt_ids = [dense.encode(e.prompt) for e in data]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, min_new_tokens=0, seed=0)
    budgets = [int(b) for b in args.budgets.split(",")]
    samplers = [
        ("rkv", b, build_compressor("rkv", kv_budget=b, step_length=2, window=8, compress_prompt=True)) for b in budgets
    ]
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    q_mib = distributions_mib(len(prompt_ids) * args.n, args.max_new_tokens, vocab)
    print(
        f"{len(prompt_ids)} prompts x {args.n}, budgets {budgets}, sampler {dtype}, q {q_mib:.0f} MiB per sampler; "
        f"CPU {cpu_name()}, {torch.get_num_threads()} threads"
    )

    arms = {arm: ARMS[arm] for arm in args.arms}
    first, second = args.arms
    rows = {}

    def arm_run(arm):
        def run():
            record_mib, shared = arms[arm]
            result = measure(
                dense,
                lm.model,
                samplers,
                prompt_ids,
                params,
                32,
                tokens="sampler",
                record_mib=record_mib,
                shared_prompt=shared,
                log=lambda _: None,
            )
            rows.setdefault(arm, result.rows)
            assert result.rows == rows[arm], f"{arm}: a round's rows differ from round 1's (not deterministic)"
            if record_mib == 0:
                assert result.replay_err_max is not None and result.replay_err_max <= 1e-5, result.replay_err_max

        return run

    res = time_rounds(
        {arm: arm_run(arm) for arm in arms},
        args.rounds,
        on_run=lambda r, arm, sec, _: print(f"round {r + 1}: {arm} {sec:.1f} s", flush=True),
    )
    seconds = res.seconds
    keys = [{k: v for k, v in row.items() if not k.startswith("alpha")} for row in rows[first]]
    assert keys == [{k: v for k, v in row.items() if not k.startswith("alpha")} for row in rows[second]]
    diff = max(abs(a[k] - b[k]) for a, b in zip(rows[first], rows[second]) for k in ("alpha_mean", "alpha_p5"))
    ratios = res.ratios(first, second)
    doc = {
        "command": "python3 experiments/mismatch/calibrate_kept.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sampler_dtype": str(dtype).removeprefix("torch."),
        "prompts": len(prompt_ids),
        "n": args.n,
        "budgets": budgets,
        "max_new_tokens": args.max_new_tokens,
        "q_mib_per_sampler": q_mib,
        "seconds": seconds,
        "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios),
        "arms": {arm: {"record_mib": arms[arm][0], "shared_prompt": arms[arm][1]} for arm in arms},
        "alpha_max_abs_diff": diff,
        "rows": rows[second],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{first} / {second}: {statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"largest α difference between the arms' rows {diff:.1e}; wrote {args.json}"
    )


if __name__ == "__main__":
    main()
