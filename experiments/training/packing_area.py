"""The update's work per response token under two samplers: the first step's rollout of a job under each
sampler, packed into the update's micro-batches exactly as the step packs them, and the work those micro-batches
do (rows x their padded response length, the real response tokens, and the attention's rows x length x keys).

    python3 experiments/training/packing_area.py long --arm dense rollout.compressor=none rollout.kv_controller=null \
        --arm rkv_fixed256 rollout.kv_controller=null

Each arm builds its trainer (the job's config with its overrides), samples step 1's rollout and lets it go; the
same seed draws what ``sparserl bench step`` drew for that arm. Prints a table and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import gc
import json

import torch


def arm_work(cfg) -> dict:
    from sparserl.packing import RowLengths, micro_batch_tokens
    from sparserl.score.dense import micro_batches
    from sparserl.score.shared_prompt import shares_prompt_with_grad
    from sparserl.train.build import build_trainer
    from sparserl.train.sampler_sync import rollout
    from sparserl.train.step import rollout_batch

    trainer = build_trainer(cfg)
    _, ro = rollout(trainer, 1)
    batch = rollout_batch(trainer, ro, [0.0] * len(ro.response_ids))
    t = cfg.train
    shared = shares_prompt_with_grad(trainer.learner, t.shared_prompt)
    parts = micro_batches(batch, t.micro_batch_size, t.max_tokens_per_micro_batch, shared)
    row_lengths = RowLengths.of_batch(batch)
    lengths = row_lengths.response.long()
    padded = attention = 0
    sizes = []
    for rows in parts:
        rows = rows.cpu()
        longest, prompt = int(lengths[rows].max()), int(row_lengths.prompt[rows].max())
        padded += micro_batch_tokens(row_lengths, rows, shared)  # what the step's forward computes
        attention += len(rows) * longest * (prompt + longest)
        sizes.append((len(rows), longest))
    out = {
        "responses": len(lengths),
        "response_tokens": int(lengths.sum()),
        "length_mean": float(lengths.float().mean()),
        "length_p50": float(lengths.float().median()),
        "at_max": int((lengths == cfg.rollout.max_new_tokens).sum()),
        "micro_batches": sizes,
        "forward_tokens": padded,
        "attention_work": attention,
        "sum_length_squared": int((lengths.double() ** 2).sum()),
    }
    del trainer, ro, batch
    gc.collect()
    return out


def main() -> None:
    from sparserl.config import load_config, validate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job")
    p.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "OVERRIDE"))
    p.add_argument("--json")
    args = p.parse_args()
    torch.manual_seed(0)
    results = {}
    for name, *overrides in args.arm:
        cfg = validate(load_config(args.job, ["data.eval=null", "checkpoint.every=0", *overrides]))
        results[name] = arm_work(cfg)
        r = results[name]
        print(
            f"{name}: {r['response_tokens']} response tokens (mean {r['length_mean']:.1f},"
            f" median {r['length_p50']:.0f},"
            f" {r['at_max']} at the limit), {len(r['micro_batches'])} micro-batches {r['micro_batches']},"
            f" forward tokens {r['forward_tokens']}, attention work {r['attention_work']:.3g},"
            f" sum L^2 {r['sum_length_squared']:.3g}",
            flush=True,
        )
    base = next(iter(results))
    for name, r in results.items():
        b = results[base]
        print(
            f"{name} / {base}: tokens {r['response_tokens'] / b['response_tokens']:.3f}, forward tokens "
            f"{r['forward_tokens'] / b['forward_tokens']:.3f}, attention "
            f"{r['attention_work'] / b['attention_work']:.3f}, "
            f"sum L^2 {r['sum_length_squared'] / b['sum_length_squared']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
