"""Options of a feature that is off, refused with the key that turns it on."""

from __future__ import annotations

from ..schema import Config
from .given import given


def kl_kind_unused(cfg: Config) -> list[str]:
    """algorithm.kl_kind picks the estimator of the KL penalty, which algorithm.kl_coef=0 turns off."""
    a = cfg.algorithm
    if a.kl_coef == 0 and given(a, "kl_kind"):
        return [
            f"algorithm.kl_kind={a.kl_kind} does nothing with algorithm.kl_coef=0 (no KL penalty, no reference "
            "model); set algorithm.kl_coef, or leave kl_kind out"
        ]
    return []


def kl_unbiased_unused(cfg: Config) -> list[str]:
    """algorithm.kl_unbiased reweights the KL penalty, which algorithm.kl_coef=0 turns off."""
    a = cfg.algorithm
    if a.kl_coef == 0 and a.kl_unbiased:
        return [
            "algorithm.kl_unbiased=true does nothing with algorithm.kl_coef=0 (no KL penalty); set "
            "algorithm.kl_coef, or leave kl_unbiased out"
        ]
    return []


def alpha_topk_unused(cfg: Config) -> list[str]:
    """mismatch.alpha_topk is the k of mismatch.alpha=topk."""
    m = cfg.mismatch
    if m.alpha != "topk" and given(m, "alpha_topk"):
        return [
            f"mismatch.alpha_topk={m.alpha_topk} does nothing with mismatch.alpha={m.alpha}; set "
            "mismatch.alpha=topk, or leave alpha_topk out"
        ]
    return []
