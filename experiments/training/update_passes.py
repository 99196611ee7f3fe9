"""The update's compute on one job's first rollout, with a switch toggled between passes in one process: the
forwards and backwards of every micro-batch as the update runs them (the step's old-policy log-probs, corrections
and advantages; no optimizer step, so every pass computes the same thing), alternating the switch round by round;
the ratio is the median of the per-round ratios.

    python3 experiments/training/update_passes.py long rollout.kv_controller=null --switch flush_denormal

Switches: ``trim`` (``sparserl.memory.allocator.trim_freed_memory`` after each backward, as the update does),
``flush_denormal`` (``torch.set_flush_denormal``: subnormal floats read as zero) and ``budget`` (the micro-batches
packed under ``--budget`` tokens instead of ``train.max_tokens_per_micro_batch``; both sides trim after each
backward, as the update does). Also prints the seconds per
1,000 response tokens of the passes without the switch, to compare jobs or samplers run in separate processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    from sparserl.config import load_config, validate
    from sparserl.memory.allocator import trim_freed_memory
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
    p.add_argument("--switch", choices=("trim", "flush_denormal", "budget"), required=True)
    p.add_argument("--budget", type=int, help="the token budget the 'budget' switch packs under")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    cfg = validate(load_config(args.job, ["data.eval=null", "checkpoint.every=0", *args.overrides]))
    trainer = build_trainer(cfg)
    _, ro = rollout(trainer, 1)
    batch = rollout_batch(trainer, ro, [float(i % 2) for i in range(len(ro.response_ids))])
    with learner_autocast(cfg.model, trainer.device):
        batch.old_logprobs = trainer.old_policy.logprobs(trainer.learner, batch).logprobs
    corr = corrections_and_advantages(cfg, batch)
    t = cfg.train
    shared = shares_prompt_with_grad(trainer.learner, t.shared_prompt)
    parts = micro_batches(batch, t.micro_batch_size, t.max_tokens_per_micro_batch, shared)
    if args.switch == "budget" and not args.budget:
        p.error("--switch budget needs --budget N")
    parts_on = micro_batches(batch, t.micro_batch_size, args.budget, shared) if args.switch == "budget" else parts
    norms = loss_normalizers(corr.mask, cfg.algorithm.loss_agg, max_len=cfg.rollout.max_new_tokens)
    tokens = float(batch.response_mask.sum())
    trainer.learner.train()

    def one_pass(on: bool) -> float:
        torch.set_flush_denormal(on and args.switch == "flush_denormal")
        trainer.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        for r in parts_on if on else parts:
            loss, _ = micro_batch_loss(trainer, batch, corr, r, norms)
            loss.backward()
            if (on and args.switch == "trim") or args.switch == "budget":
                trim_freed_memory()
        seconds = time.perf_counter() - start
        trainer.optimizer.zero_grad(set_to_none=True)
        torch.set_flush_denormal(False)
        return seconds

    one_pass(False)  # warm: the first pass's pages and kernels
    rounds = []
    for i in range(args.rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        seconds = {on: one_pass(on) for on in order}
        rounds.append({"on_s": seconds[True], "off_s": seconds[False]})
        print(f"round {i + 1}: {args.switch} on {seconds[True]:.1f} s, off {seconds[False]:.1f} s", flush=True)
    ratio = statistics.median(r["on_s"] / r["off_s"] for r in rounds)
    per_1k = statistics.median(r["off_s"] for r in rounds) / tokens * 1000
    sizes = [len(r) for r in parts]
    sizes_on = [len(r) for r in parts_on]
    print(
        f"{len(parts)} micro-batches of {sizes} rows (on: {sizes_on}), {tokens:.0f} response tokens; "
        f"{args.switch} on / off: "
        f"{ratio:.3f} (median of per-round ratios); off: {per_1k:.2f} s per 1,000 response tokens"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "switch": args.switch,
                    "budget": args.budget,
                    "micro_batch_rows": sizes,
                    "micro_batch_rows_on": sizes_on,
                    "response_tokens": tokens,
                    "rounds": rounds,
                    "ratio": ratio,
                    "off_s_per_1k_tokens": per_1k,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
