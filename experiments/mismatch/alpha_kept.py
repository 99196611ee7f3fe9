"""The exact α from distributions the sampler kept while it sampled, against a replay, in one process.

On the default job's step-1 batch (the config given, default ``default``), the sampler's precision as
``rollout.dtype: auto`` resolves it, two arms, each the rollout and the exact α of its responses:

- ``replay``: the rollout, then α with ``q`` from a replay of the sampler on its tokens;
- ``kept``: the rollout keeping each step's whole distribution (``SamplingParams.keep_distributions``),
  then α reading it (``mismatch.alpha_record_mib``, the default).

``p`` comes from one no-grad forward of the learner made once, outside the timings. Each round runs
both arms in alternating order (:func:`sparserl.bench.measure.time_rounds`);
a ratio is the median of the per-round ratios (replay seconds / kept
seconds, rollout + α). The two arms' α agree (their largest difference is reported), and the kept
distributions' bytes are recorded.

    python3 experiments/mismatch/alpha_kept.py --rounds 5 --json docs/results/alpha_kept/default_job.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.config import load_config, validate
from sparserl.mismatch import exact_alpha as score_alpha
from sparserl.mismatch.measure import dense_hidden
from sparserl.models.mixed_precision import learner_autocast, learner_compute_dtype
from sparserl.reward import score_responses
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.score.shared_prompt import lm_head_weight
from sparserl.train.trainer import build_trainer, rollout_batch, sampling_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    cfg = validate(
        load_config(
            args.config,
            [
                "data.eval=null",
                "log.tensorboard=false",
                "checkpoint.every=0",
                "log.out_dir=/tmp/alpha_kept_runs",
                *args.overrides,
            ],
        )
    )
    trainer = build_trainer(cfg)
    engine = trainer.engine
    examples = trainer.data.next_batch()
    prompts = [e.prompt for e in examples]
    params = sampling_params(cfg, 1)
    kept_params = dataclasses.replace(params, keep_distributions=True)
    ro = engine.generate(prompts, params)
    rewards, _ = score_responses(trainer.reward_fn, ro.texts, [examples[i].label for i in ro.prompt_index])
    batch = rollout_batch(trainer, ro, rewards)
    with learner_autocast(cfg.model, batch.response_ids.device):
        hidden = dense_hidden(trainer.learner, batch, cfg.train.micro_batch_size)
    dtype = learner_compute_dtype(cfg.model, trainer.learner)
    weight, hidden = lm_head_weight(trainer.learner).to(dtype), hidden.to(dtype)
    tau = params.temperature if params.temperature > 0 else 1.0

    def replay_arm():
        out = engine.generate(prompts, params)
        alpha, err = score_alpha.exact_alpha(engine, out.prompt_ids, out.response_ids, params, hidden, weight, tau)
        return out, alpha

    def kept_arm():
        out = engine.generate(prompts, kept_params)
        return out, score_alpha.recorded_alpha(out.distributions, hidden, weight, tau)

    alphas, kept = {}, {"bytes": 0}

    def checked(name, arm):
        def run():  # keeps α and the kept buffers' size, not the output (its distributions are large)
            out, alphas[name] = arm()
            assert out.response_ids == ro.response_ids, "the arms sampled other tokens"
            if out.distributions is not None:
                storages = {d.untyped_storage().data_ptr(): d.untyped_storage().nbytes() for d in out.distributions}
                kept["bytes"] = sum(storages.values())  # the buffers allocated (responses x max_new_tokens x V)

        return run

    res = time_rounds(
        {"replay": checked("replay", replay_arm), "kept": checked("kept", kept_arm)},
        args.rounds,
        on_run=lambda r, name, sec, _: print(f"round {r + 1}: {name} {sec:.2f} s", flush=True),
    )
    seconds, ratios, kept_bytes = res.seconds, res.ratios("replay", "kept"), kept["bytes"]
    mask = batch.response_mask.cpu().bool()
    diff = float((alphas["replay"] - alphas["kept"])[mask].abs().max())
    print(
        f"kept against replay (median of per-round ratios, rollout + α): {statistics.median(ratios):.2f}x; "
        f"largest |Δα| {diff:.2e}; kept distributions {kept_bytes / 2**20:.0f} MiB"
    )
    report = {
        "command": "python3 experiments/mismatch/alpha_kept.py "
        + " ".join([args.config, *args.overrides, "--rounds", str(args.rounds), "--json", args.json]),
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "sampler_dtype": str(engine.dtype).removeprefix("torch."),
        "batch": {
            "sequences": int(batch.size),
            "response_tokens_mean": float(batch.response_mask.sum(-1).float().mean()),
        },
        "seconds": seconds,
        "ratio_rounds": ratios,
        "speedup_kept_vs_replay": statistics.median(ratios),
        "max_abs_alpha_diff": diff,
        "kept_bytes": kept_bytes,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
