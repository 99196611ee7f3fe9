"""Scaling out: rollout workers and data-parallel learners."""

from __future__ import annotations

from ..schema import Config


def cluster_shape(cfg: Config) -> list[str]:
    """cluster.address needs something to run on Ray; every learner gets a micro-batch."""
    c, r, t = cfg.cluster, cfg.rollout, cfg.train
    errors: list[str] = []
    if c.rollout_workers is None and c.learners == 1 and c.address is not None:
        errors.append(
            f"cluster.address={c.address!r} needs cluster.rollout_workers or cluster.learners > 1 "
            "(without them everything runs in the training process)"
        )
    if c.learners > 1:
        samples, mini, micro = cfg.update_shape()
        if c.learners > samples:
            errors.append(
                f"cluster.learners={c.learners} is more than the {samples} samples per step "
                f"(train.prompts_per_step={t.prompts_per_step} x rollout.n={r.n})"
            )
        elif c.learners > micro:
            errors.append(
                f"cluster.learners={c.learners} is more than the {micro} "
                f"micro-batch{'es' if micro != 1 else ''} of an optimizer step ({mini} samples / "
                f"train.micro_batch_size={t.micro_batch_size}): a learner would get none; lower "
                "train.micro_batch_size"
            )
    return errors


def rollout_workers(cfg: Config) -> list[str]:
    """Every rollout worker gets at least one prompt of a step."""
    c, t = cfg.cluster, cfg.train
    if c.rollout_workers is not None and c.rollout_workers > t.prompts_per_step:
        return [
            f"cluster.rollout_workers={c.rollout_workers} is more than train.prompts_per_step="
            f"{t.prompts_per_step}: a worker would get no prompt"
        ]
    return []
