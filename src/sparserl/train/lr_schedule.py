"""The learning rate over the run's optimizer updates (the Hugging Face Trainer's and TRL's
``lr_scheduler_type``, verl's ``lr_scheduler_type`` with ``min_lr_ratio``).

With u = 0, 1, ... the optimizer update, W = ``train.warmup_steps``, N = the run's updates
(``train.steps`` x ``ppo_epochs`` x mini-batches per step), ρ = ``train.min_lr_ratio`` and
p = (u + 1 − W) / (N − W) the progress after the warm-up (clamped to [0, 1]), lr = ``train.lr`` · f(u):

    f(u) = (u + 1) / W                          for u < W (the warm-up)
    constant:  f = 1
    linear:    f = 1 − (1 − ρ) · p
    cosine:    f = ρ + (1 − ρ) · ½ (1 + cos π p)

so that the last update runs at ρ · lr under linear and cosine.
"""

from __future__ import annotations

import math

import torch

__all__ = ["LR_SCHEDULERS", "lr_factor", "total_updates", "build_scheduler"]

LR_SCHEDULERS = ("constant", "linear", "cosine")


def lr_factor(update: int, warmup: int, total: int, kind: str = "constant", min_ratio: float = 0.0) -> float:
    """f(u) of the module docstring."""
    if update < warmup:
        return (update + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (update + 1 - warmup) / max(1, total - warmup)))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr scheduler {kind!r}; available: {', '.join(LR_SCHEDULERS)}")


def total_updates(cfg) -> int:
    """N: the optimizer updates of a run of ``cfg.train.steps`` steps."""
    batch, mini, _ = cfg.update_shape()
    return cfg.train.steps * cfg.train.ppo_epochs * -(-batch // mini)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """``train.lr_scheduler`` on ``optimizer``; it steps once per optimizer update."""
    t = cfg.train
    total = total_updates(cfg)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: lr_factor(u, t.warmup_steps, total, t.lr_scheduler, t.min_lr_ratio)
    )
