"""The eager engine's refill at the length it is for: a long-job rollout (the first 4 prompts of its task, in file
order, x 8 responses of up to 1,024 new tokens, the ``long`` preset's sampler) with at most ``--places`` rows at
once, sampled three ways, alternately in one process, per round (the order rotated each round):

- ``one batch``: every row in one batch (no place limit; what a CPU run does),
- ``refill``: a :class:`~sparserl.rollout.segmented.SegmentedRollout` of ``--places`` places, in two segments
  (``--segment`` decode steps, then to the end); a row that ends gives its place to a waiting one,
- ``sequential``: ``RolloutEngine.generate`` with ``max_batch = --places``: batches one after another, each to its
  longest response.

For each: seconds, decode steps and the rows each ran, the KV cache's peak, tokens sampled; per round the
ratios of the refill's and the sequential batches' time to the one batch's; and how many responses each gives
token for token the same as the one batch (the rows' draws depend on their own stream and index only; a batch
of another size may round a bfloat16 product differently, which can turn a token).

    python3 experiments/rollout/refill_at_length.py --places 16 --rounds 2 --json refill_at_length.json
    python3 experiments/rollout/refill_at_length.py --places 16 --rounds 1 rollout.dtype=float32   # the tokens' check
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="long")
    parser.add_argument("--places", type=int, default=16)
    parser.add_argument("--segment", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.dtype=float32")
    args = parser.parse_args()

    import torch

    from sparserl.bench.measure import time_rounds
    from sparserl.config import load_config, validate
    from sparserl.models.loading import load_model
    from sparserl.rollout.build import engine_from_fields, sampler_section
    from sparserl.rollout.dtype_auto import cpu_name
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.rollout.segmented import SegmentedRollout
    from sparserl.train.sampler_sync import sampling_params
    from sparserl.train.train_set import load_train_set

    cfg = validate(load_config(args.config, tuple(args.overrides)))
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
    engine = engine_from_fields(lm, sampler_section(cfg))
    data = load_train_set(cfg.data, limit=cfg.train.prompts_per_step)  # the trainer's prompts, the first step's
    prompts = [e.prompt for e in data]
    params = sampling_params(cfg, step=1)
    rows = len(prompts) * params.n

    def one_batch():
        engine.max_batch = None
        rollout = SegmentedRollout(engine, prompts, params)
        rollout.advance(None)
        return rollout.output()

    def refill():
        engine.max_batch = args.places
        rollout = SegmentedRollout(engine, prompts, params)
        rollout.advance(args.segment)
        rollout.advance(None)
        return rollout.output()

    def sequential():
        engine.max_batch = args.places
        return engine.generate(prompts, params)

    def measured(way):
        """``way`` with the rows of each of its decode steps counted (the engine's step hook)."""

        def call():
            live: list[int] = []
            engine.step_hook = lambda event, rows, **_: live.append(len(rows)) if event == "before_decode" else None
            try:
                return way(), live
            finally:
                engine.step_hook = None

        return call

    reference: list = []  # the one batch's tokens of round 0 (the first call: rounds rotate from round 1)

    def report(r, name, seconds, result):
        out, live = result
        tokens = [list(x) for x in out.response_ids]
        if not reference:
            reference.extend(tokens)
        runs[name].append(
            {
                "round": r,
                "seconds": seconds,
                "tokens": sum(len(x) for x in tokens),
                "decode_steps": len(live),
                "most_rows": max(live),
                "mean_rows": sum(live) / len(live),
                "longest": max(len(x) for x in tokens),
                "kv_peak_mb": out.kv.bytes_peak / 2**20,
                "kv_dense_mb": out.kv.bytes_dense / 2**20,
                "same_as_one_batch": sum(a == b for a, b in zip(tokens, reference)),
            }
        )
        x = runs[name][-1]
        print(
            f"round {r} {name:>10}: {seconds:7.1f} s, {x['tokens']} tokens (longest {x['longest']}), "
            f"{x['decode_steps']} decode steps of {x['mean_rows']:.1f} rows (most {x['most_rows']}), "
            f"KV peak {x['kv_peak_mb']:.1f} MB, same as one batch {x['same_as_one_batch']}/{rows}",
            flush=True,
        )

    ways = {"one batch": measured(one_batch), "refill": measured(refill), "sequential": measured(sequential)}
    engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=4))  # warm: the kernels' first calls
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    rounds = time_rounds(ways, args.rounds, on_run=report)  # the order rotated each round
    ratio = {name: rounds.ratios(name, "one batch") for name in ("refill", "sequential")}
    result = {
        "what": f"{rows} responses of up to {params.max_new_tokens} new tokens, '{args.config}' preset's sampler, "
        f"at most {args.places} rows at once (refill: segments of {args.segment} decode steps, then to the end)",
        "runs": runs,
        "per_round_ratio_to_one_batch": ratio,
        "median_ratio_to_one_batch": {k: statistics.median(v) for k, v in ratio.items()},
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "overrides": args.overrides,
    }
    print({k: round(v, 3) for k, v in result["median_ratio_to_one_batch"].items()})
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
