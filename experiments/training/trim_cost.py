"""What the heap trim after each update micro-batch costs in time: the update's forwards and backwards over one
rollout's micro-batches, with and without ``sparserl.memory.allocator.trim_freed_memory`` after each backward,
alternating in one process; the ratio is the median of the per-round ratios.

    python3 experiments/training/trim_cost.py long rollout.compressor=none rollout.kv_controller=null --rounds 3

The job's first rollout is sampled once; each pass runs every micro-batch's loss and backward as the update
does (``sparserl.train.update.micro_batch_loss``, under the learner's autocast) and zeroes the gradients, without
the optimizer step, so every pass computes the same thing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    from sparserl.config import load_config, validate
    from sparserl.memory.allocator import resident_bytes, trim_freed_memory
    from sparserl.models.mixed_precision import learner_autocast
    from sparserl.score.dense import micro_batches
    from sparserl.score.shared_prompt import shares_prompt_with_grad
    from sparserl.train.build import build_trainer
    from sparserl.train.losses import loss_normalizers
    from sparserl.train.sampler_sync import rollout
    from sparserl.train.step import corrections_and_advantages, rollout_batch
    from sparserl.train.update import micro_batch_loss

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    cfg = validate(load_config(args.job, ["data.eval=null", "checkpoint.every=0", *args.overrides]))
    trainer = build_trainer(cfg)
    _, ro = rollout(trainer, 1)
    batch = rollout_batch(trainer, ro, [float(i % 2) for i in range(len(ro.response_ids))])
    with learner_autocast(cfg.model, trainer.device):
        batch.old_logprobs = (batch.sampler_logprobs * batch.response_mask).detach()
    corr = corrections_and_advantages(cfg, batch)
    t = cfg.train
    shared = shares_prompt_with_grad(trainer.learner, t.shared_prompt)
    parts = micro_batches(batch, t.micro_batch_size, t.max_tokens_per_micro_batch, shared)
    norms = loss_normalizers(corr.mask, cfg.algorithm.loss_agg, max_len=cfg.rollout.max_new_tokens)
    trainer.learner.train()

    def one_pass(trim: bool) -> float:
        trainer.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        for r in parts:
            loss, _ = micro_batch_loss(trainer, batch, corr, r, norms)
            loss.backward()
            if trim:
                trim_freed_memory()
        seconds = time.perf_counter() - start
        trainer.optimizer.zero_grad(set_to_none=True)
        return seconds

    one_pass(False)  # warm: the first pass's pages and kernels
    rounds = []
    for i in range(args.rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        seconds = {trim: one_pass(trim) for trim in order}
        rounds.append({"trim_s": seconds[True], "no_trim_s": seconds[False], "rss": resident_bytes()})
        print(f"round {i + 1}: trim {seconds[True]:.1f} s, no trim {seconds[False]:.1f} s", flush=True)
    ratio = statistics.median(r["trim_s"] / r["no_trim_s"] for r in rounds)
    sizes = [len(r) for r in parts]
    print(f"{len(parts)} micro-batches of {sizes} rows; trim / no trim: {ratio:.3f} (median of per-round ratios)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"micro_batch_rows": sizes, "rounds": rounds, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
