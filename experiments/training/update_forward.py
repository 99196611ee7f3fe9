"""The main job's learner with a scoring forward against ``algorithm.old_logprobs=update``, in one process.

On the default job's first rollout batch (4 prompts x 8 samples; the config given, default ``default``),
in the learner's precision as ``model.mixed_precision: auto`` resolves it on this machine, three arms:

- ``score_micro16``: a scoring forward, then the update, micro-batches of 16;
- ``score_micro32``: the same with one micro-batch of 32 (what the micro-batch size alone changes);
- ``update_micro32``: ``old_logprobs=update`` with one micro-batch of 32: the update's forward, the
  corrections from its detached log-probs, the update on it (no scoring forward).

Each round runs every arm in a rotated order (:func:`sparserl.bench.measure.time_rounds`), the learner's
weights and optimizer state restored after each, untimed;
a ratio is the median of the per-round ratios (``score_micro16`` seconds / the arm's). The peak
of the process's resident memory cannot tell arms in one process apart, so the memory a micro-batch
size costs is read from autograd: the most bytes saved for one backward (:class:`SavedBytes`).

    python3 experiments/training/update_forward.py --rounds 5 --json docs/results/update_forward/default_job.json
    python3 experiments/training/update_forward.py default model.mixed_precision=off --rounds 3 \\
        --json docs/results/update_forward/default_job_float32.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from sparserl.bench.learner import _forward_and_update, _score, _State, _update
from sparserl.bench.measure import time_rounds
from sparserl.config import load_config, validate
from sparserl.models.mixed_precision import choose as choose_mixed_precision
from sparserl.reward import score_responses
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.train.trainer import build_trainer, corrections_and_advantages, rollout, rollout_batch

ARMS = ("score_micro16", "score_micro32", "update_micro32")


class SavedBytes:
    """The most bytes autograd held for one backward while the context is open: the distinct storages
    saved for it (torch.autograd.graph.saved_tensors_hooks), the learner's float32 parameters left out,
    summed from one ``backward()`` to the next (each micro-batch's graph is freed by its backward)."""

    def __init__(self, model: torch.nn.Module):
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}
        self.per_backward: list[int] = []

    def pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        self.backward = torch.Tensor.backward
        counter = self

        def backward(tensor, *args, **kwargs):
            counter.per_backward.append(sum(counter.storages.values()))
            counter.storages.clear()
            return counter.backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward
        return self

    def __exit__(self, *exc):
        torch.Tensor.backward = self.backward
        self.hooks.__exit__(*exc)

    @property
    def peak(self) -> int:
        return max(self.per_backward, default=0)


def first_batch(config: str, overrides: list[str]):
    """(trainer, its learner's precision as ``auto`` resolves it, step 1's rollout batch with rewards)."""
    cfg = validate(
        load_config(
            config,
            [
                "data.eval=null",
                "log.tensorboard=false",
                "checkpoint.every=0",
                "log.out_dir=/tmp/update_forward_runs",
                *overrides,
            ],
        )
    )
    trainer = build_trainer(cfg)
    mode = (
        choose_mixed_precision(trainer.device).mode
        if cfg.model.mixed_precision == "auto"
        else cfg.model.mixed_precision
    )
    examples, ro = rollout(trainer, 1)
    rewards, _ = score_responses(trainer.reward_fn, ro.texts, [examples[i].label for i in ro.prompt_index])
    return trainer, mode, rollout_batch(trainer, ro, rewards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the config (e.g. model.mixed_precision=off)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    trainer, mode, batch = first_batch(args.config, args.overrides)
    state = _State(trainer)

    def run(arm: str) -> None:
        trainer.cfg.train.micro_batch_size = 16 if arm == "score_micro16" else batch.size
        if arm.startswith("update"):
            _forward_and_update(trainer, batch, mode)
        else:
            batch.old_logprobs = _score(trainer, batch, mode)
            _update(trainer, batch, corrections_and_advantages(trainer.cfg, batch), mode)

    saved = {}
    for arm in ARMS:  # the graph's saved bytes (one untimed run each)
        with SavedBytes(trainer.learner) as counter:
            run(arm)
        state.restore()
        saved[arm] = counter.peak
    res = time_rounds(
        {arm: (lambda arm=arm: run(arm)) for arm in ARMS},
        args.rounds,
        reset=state.restore,
        on_run=lambda r, arm, sec, _: print(f"round {r + 1}: {arm} {sec:.2f} s", flush=True),
    )
    seconds = res.seconds
    ratios = {arm: res.ratios("score_micro16", arm) for arm in ARMS[1:]}
    speedup = {arm: statistics.median(v) for arm, v in ratios.items()}
    print(
        "against score_micro16 (median of per-round ratios): "
        + ", ".join(f"{arm} {v:.2f}x" for arm, v in speedup.items())
    )
    print("autograd's saved tensors: " + ", ".join(f"{arm} {saved[arm] / 2**20:.0f} MiB" for arm in ARMS))
    report = {
        "command": "python3 experiments/training/update_forward.py "
        + " ".join([args.config, *args.overrides, "--rounds", str(args.rounds), "--json", args.json]),
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "learner_precision": mode,
        "batch": {
            "sequences": int(batch.size),
            "response_tokens_mean": float(batch.response_mask.sum(-1).float().mean()),
        },
        "seconds": seconds,
        "ratio_rounds": ratios,
        "speedup_vs_score_micro16": speedup,
        "autograd_saved_bytes": saved,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
