"""Partial rollouts on one worker at the length they are for, one batch per rollout against the rollouts in flight
joined in one batch (``rollout.join_rollouts``): the calls a rollout worker gets under ``rollout.max_staleness=2``
with ``rollout.partial`` (each push: the rest of the rollout sent before, then the first ⌈max_new_tokens / 2⌉
decode steps of the one sent now), on the ``long`` preset's sampler and prompts (``--rollouts`` steps' prompts as the
trainer draws them, x 8 responses of up to 1,024 new tokens), with the same weights throughout (the engine's time
only: no learner), alternately in one process, per round (the order rotated each round):

- ``own batches``: a :class:`~sparserl.rollout.segmented.SegmentedRollout` per rollout (today's default),
- ``joined``: one :class:`~sparserl.rollout.stream.RolloutStream` (each start runs until the rollout before has
  ended, for the segment's decode steps at least).

For each: seconds, decode steps and the rows each ran, tokens sampled; per round the joined calls' time over the
own batches' (per token: the two may sample other tokens where a bfloat16 product rounds differently in a batch of
another size); and how many responses are token for token the same in both.

    python3 experiments/rollout/join_at_length.py --rollouts 3 --rounds 3 --json join_at_length.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="long")
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker's cluster.worker_cpus: 1)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.max_new_tokens=2048")
    args = parser.parse_args()

    import torch

    from sparserl.bench.measure import time_rounds
    from sparserl.config import load_config, validate
    from sparserl.data.loaders import PromptSampler
    from sparserl.models.loading import load_model
    from sparserl.rollout.build import engine_from_fields, sampler_section
    from sparserl.rollout.dtype_auto import cpu_name
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.rollout.segmented import SegmentedRollout
    from sparserl.rollout.stream import RolloutStream
    from sparserl.train.sampler_sync import sampling_params
    from sparserl.train.train_set import load_train_set

    torch.set_num_threads(args.threads)
    cfg = validate(load_config(args.config, tuple(args.overrides)))
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
    engine = engine_from_fields(lm, sampler_section(cfg))
    sampler = PromptSampler(list(load_train_set(cfg.data)), cfg.train.prompts_per_step, seed=cfg.train.seed)
    steps = list(range(1, args.rollouts + 1))
    prompts = {s: [e.prompt for e in sampler.next_batch()] for s in steps}
    params = {s: sampling_params(cfg, step=s) for s in steps}
    segment = -(-cfg.rollout.max_new_tokens // 2)

    def own_batches():
        outs, before = {}, None
        for s in steps:  # one push: the rest of the rollout sent before, then the first segment of this one
            if before is not None:
                before[1].advance(None)
                outs[before[0]] = before[1].output()
            rollout = SegmentedRollout(engine, prompts[s], params[s])
            rollout.advance(segment)
            before = s, rollout
        before[1].advance(None)
        outs[before[0]] = before[1].output()
        return outs

    def joined():
        stream, outs = RolloutStream(engine), {}
        for s in steps:
            stream.start(s, prompts[s], params[s], steps=segment)
            for key in [k for k in stream.keys() if stream.done(k)]:
                outs[key] = stream.take(key)
        for key in stream.keys():
            outs[key] = stream.take(key)
        return outs

    def measured(way):
        """``way`` with the rows of each of its decode steps counted (the engine's step hook)."""

        def call():
            live: list[int] = []
            engine.step_hook = lambda event, rows, **_: live.append(len(rows)) if event == "before_decode" else None
            try:
                outs = way()
            finally:
                engine.step_hook = None
            return [list(x) for s in steps for x in outs[s].response_ids], live

        return call

    def report(r, name, seconds, result):
        tokens, live = result
        n_tokens = sum(len(x) for x in tokens)
        runs[name].append(
            {
                "round": r,
                "seconds": seconds,
                "tokens": n_tokens,
                "seconds_per_ktok": seconds / n_tokens * 1000,
                "decode_steps": len(live),
                "mean_rows": sum(live) / len(live),
                "most_rows": max(live),
                "longest": max(len(x) for x in tokens),
            }
        )
        x = runs[name][-1]
        print(
            f"round {r} {name:>11}: {seconds:7.1f} s, {n_tokens} tokens (longest {x['longest']}), "
            f"{x['decode_steps']} decode steps of {x['mean_rows']:.1f} rows (most {x['most_rows']})",
            flush=True,
        )

    ways = {"own batches": measured(own_batches), "joined": measured(joined)}
    engine.generate(prompts[1][:1], SamplingParams(n=2, max_new_tokens=4))  # warm: the kernels' first calls
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    rounds = time_rounds(ways, args.rounds, on_run=report)  # the order rotated each round
    for r, (own, join) in enumerate(zip(rounds.results["own batches"], rounds.results["joined"])):
        runs["joined"][r]["same_as_own_batches"] = sum(a == b for a, b in zip(own[0], join[0]))
        print(f"round {r}: {runs['joined'][r]['same_as_own_batches']}/{len(join[0])} responses the same", flush=True)
    ratio = rounds.ratios("joined", "own batches")
    ratio_tok = [j["seconds_per_ktok"] / o["seconds_per_ktok"] for j, o in zip(runs["joined"], runs["own batches"])]
    result = {
        "what": f"{args.rollouts} rollouts of {len(prompts[1]) * params[1].n} responses of up to "
        f"{params[1].max_new_tokens} new tokens, '{args.config}' preset's sampler, as a worker samples them under "
        f"rollout.max_staleness=2 with rollout.partial (segments of {segment} decode steps), same weights throughout",
        "runs": runs,
        "per_round_ratio_joined_to_own": ratio,
        "median_ratio_joined_to_own": statistics.median(ratio),
        "per_round_ratio_per_token": ratio_tok,
        "median_ratio_per_token": statistics.median(ratio_tok),
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "overrides": args.overrides,
    }
    print(
        f"joined / own batches: {result['median_ratio_joined_to_own']:.3f} (per token "
        f"{result['median_ratio_per_token']:.3f}), rounds {[round(x, 3) for x in ratio]}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
