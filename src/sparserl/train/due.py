"""Which steps end with a checkpoint or a held-out evaluation: read by the loop, and by the asynchronous
rollout, which sends no next rollout past a checkpoint's step (a run resumed there samples what it would
have)."""

from __future__ import annotations

from ..config import Config


def checkpoint_due(cfg: Config, step: int) -> bool:
    """Step ``step`` ends with a checkpoint (``checkpoint.every``; 0 = the last step only)."""
    every = cfg.checkpoint.every
    return bool(every and step % every == 0) or step == cfg.train.steps


def eval_due(cfg: Config, step: int) -> bool:
    """Step ``step`` ends with a held-out evaluation (``data.eval`` set; ``eval.every``, 0 = the last step only)."""
    every = cfg.eval.every
    return bool(cfg.data.eval) and (bool(every and step % every == 0) or step == cfg.train.steps)
