"""Partial rollouts (``rollout.partial``): responses continued across weight pushes on the rollout workers."""

from __future__ import annotations

from ..schema import Config


def partial_rollouts(cfg: Config) -> list[str]:
    """rollout.partial needs rollout.async and the eager decode step; rollout.partial_max_lag,
    rollout.partial_kv=recompute and rollout.join_rollouts need rollout.partial, and partial_max_lag masks some
    tokens but not all: 1 <= it < rollout.max_staleness (the freshest tokens of an asynchronous rollout are 1 push
    old when their step takes them)."""
    r = cfg.rollout
    if not r.partial:
        errors = []
        if r.partial_max_lag is not None:
            errors.append(f"rollout.partial_max_lag={r.partial_max_lag} needs rollout.partial=true (it masks tokens)")
        if r.partial_kv != "keep":
            errors.append(f"rollout.partial_kv={r.partial_kv} needs rollout.partial=true (a partial rollout's cache)")
        if r.join_rollouts:
            errors.append("rollout.join_rollouts=true needs rollout.partial=true (it joins partial rollouts in flight)")
        return errors
    errors: list[str] = []
    if not r.async_:
        errors.append(
            "rollout.partial=true needs rollout.async=true (and cluster.rollout_workers): responses continue across "
            "the weight pushes of asynchronous rollouts"
        )
    k, lag = r.max_staleness, r.partial_max_lag
    if lag is not None and k >= 1 and not 1 <= lag < k:
        what = (
            "masks every token (each is at least 1 push old when its step takes it)"
            if lag < 1
            else (f"masks no token (none is more than rollout.max_staleness={k} pushes old)")
        )
        errors.append(f"rollout.partial_max_lag={lag} {what}: set it between 1 and {k - 1}, or leave it out")
    if r.static_step:
        errors.append(
            "rollout.partial=true with rollout.static_step=true: the segments of a partial rollout run on the eager "
            "decode step; leave rollout.static_step out"
        )
    return errors
