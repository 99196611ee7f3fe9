"""Is ``algorithm.old_logprobs=update`` the same step as a scoring forward? The gradients, compared.

On the default job's first rollout batch, in the learner's precision as ``model.mixed_precision: auto``
resolves it: the optimizer's gradient (read as its step begins) and the old policy's log-probs of

- ``score16`` / ``score32``: a scoring forward, then the update, micro-batches of 16 / one of 32;
- ``score32_again``: ``score32`` once more (is the step deterministic?);
- ``update32``: ``old_logprobs=update`` with one micro-batch of 32.

Reports, per pair, the gradients' cosine and the largest difference of the old policy's log-probs.

    python3 experiments/training/update_forward_numerics.py --json docs/results/update_forward/numerics.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from update_forward import first_batch  # experiments/: step 1's batch of the config

from sparserl.bench.learner import _cosine, _score, _State, _update
from sparserl.models.mixed_precision import autocast_for
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.train.trainer import corrections_and_advantages
from sparserl.train.update_forward import run_update_forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    trainer, mode, batch = first_batch(args.config, args.overrides)
    cfg = trainer.cfg
    state = _State(trainer)
    grads, old = {}, {}
    for name, micro in (("score16", 16), ("score32", batch.size), ("score32_again", batch.size)):
        trainer.cfg.train.micro_batch_size = micro
        batch.old_logprobs = old[name] = _score(trainer, batch, mode)
        grads[name] = _update(trainer, batch, corrections_and_advantages(cfg, batch), mode, want_grad=True)
        state.restore()
    with autocast_for(mode, trainer.device):
        forward = run_update_forward(
            trainer.learner,
            batch,
            shared_prompt=cfg.train.shared_prompt,
            temperature=cfg.rollout.temperature,
            entropy_grad=bool(cfg.algorithm.entropy_coef),
            keep_hidden=False,
        )
    batch.old_logprobs = old["update32"] = forward.old_logprobs
    grads["update32"] = _update(
        trainer, batch, corrections_and_advantages(cfg, batch), mode, want_grad=True, update_forward=forward
    )
    state.restore()
    mask = batch.response_mask.bool()
    pairs = {}
    for a, b in (
        ("score32", "score32_again"),
        ("score32", "update32"),
        ("score16", "score32"),
        ("score16", "update32"),
    ):
        pairs[f"{a}/{b}"] = {
            "grad_cosine": _cosine(grads[a], grads[b]),
            "max_abs_old_logprob_diff": float((old[a] - old[b])[mask].abs().max()),
        }
        print(
            f"{a} against {b}: gradient cosine {pairs[f'{a}/{b}']['grad_cosine']:.6f}, largest |Δ log p| "
            f"{pairs[f'{a}/{b}']['max_abs_old_logprob_diff']:.3g}"
        )
    report = {
        "command": "python3 experiments/training/update_forward_numerics.py "
        + " ".join([args.config, *args.overrides, "--json", args.json]),
        "machine": {"cpu": cpu_name(), "isa": native.isa(), "cores": os.cpu_count(), "torch": torch.__version__},
        "learner_precision": mode,
        "sequences": int(batch.size),
        "pairs": pairs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
