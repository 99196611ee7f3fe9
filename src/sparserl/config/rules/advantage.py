"""The advantage estimator's needs."""

from __future__ import annotations

from ..schema import Config


def group_for_advantage(cfg: Config) -> list[str]:
    """An estimator that compares a prompt's samples with each other needs rollout.n >= 2."""
    from ...advantages import get_adv_est

    a, r = cfg.algorithm, cfg.rollout
    if getattr(get_adv_est(a.adv_estimator), "needs_group", True) and r.n < 2:
        return [
            f"rollout.n={r.n}: algorithm.adv_estimator={a.adv_estimator!r} compares the samples of a prompt "
            "with each other and needs rollout.n >= 2"
        ]
    return []
