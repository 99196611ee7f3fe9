"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

from ..schema import FLOAT32_MAX, Config
from .given import given


def adamw_first_step(cfg: Config) -> list[str]:
    """AdamW's bias-corrected first step, lr / (1 - beta1), stays within float32."""
    t = cfg.train
    if (first_step := t.lr / (1 - t.betas[0])) > FLOAT32_MAX:
        return [
            f"train.lr={t.lr!r}: AdamW's first step size, lr / (1 - train.betas[0]) = {first_step:.4g}, "
            f"overflows float32 (at most {FLOAT32_MAX:.8g}); lower train.lr"
        ]
    return []


def lr_schedule_unused(cfg: Config) -> list[str]:
    """train.min_lr_ratio is the end of a linear or cosine decay; under a constant rate it does nothing."""
    t = cfg.train
    if t.lr_scheduler == "constant" and given(t, "min_lr_ratio"):
        return [
            f"train.min_lr_ratio={t.min_lr_ratio} does nothing under train.lr_scheduler=constant; set "
            "train.lr_scheduler=linear or cosine, or leave min_lr_ratio out"
        ]
    return []


def mini_batches(cfg: Config) -> list[str]:
    """A rollout batch splits into whole mini-batches of train.mini_batch_prompts prompts."""
    t = cfg.train
    if t.mini_batch_prompts is not None and t.prompts_per_step % t.mini_batch_prompts:
        return [
            f"train.prompts_per_step={t.prompts_per_step} must be divisible by "
            f"train.mini_batch_prompts={t.mini_batch_prompts}"
        ]
    return []
