"""Asynchronous rollouts on the rollout workers: one-step-off (verl's) or k steps ahead (``rollout.max_staleness``)."""

from __future__ import annotations

from ..schema import Config


def async_rollouts(cfg: Config) -> list[str]:
    """rollout.async needs rollout workers, the q they keep for the exact α and its own mismatch split;
    rollout.max_staleness needs rollout.async."""
    r, c = cfg.rollout, cfg.cluster
    if not r.async_:
        if r.max_staleness != 1:
            return [
                f"rollout.max_staleness={r.max_staleness} needs rollout.async=true (and cluster.rollout_workers): "
                "without it every step samples with the latest weights"
            ]
        return []
    errors: list[str] = []
    if c.rollout_workers is None:
        errors.append(
            "rollout.async=true needs cluster.rollout_workers (the workers sample the next step while "
            "the training process updates on this one)"
        )
    if cfg.mismatch.alpha == "exact" and cfg.mismatch.alpha_q == "kept" and cfg.mismatch.alpha_record_mib == 0:
        errors.append(
            "rollout.async=true with mismatch.alpha=exact, mismatch.alpha_q=kept and "
            "mismatch.alpha_record_mib=0: under rollout.async the kept route reads the q the workers keep "
            "while they sample; leave mismatch.alpha_record_mib at its default, or use mismatch.alpha_q=hidden "
            "or mismatch.alpha=topk (α with its lag and cache parts) or off"
        )
    if r.mismatch_split:
        errors.append(
            "rollout.async=true with rollout.mismatch_split=true: the asynchronous split "
            "(mismatch/k3_kl_lag, mismatch/k3_kl_cache, read on the workers) replaces it; leave "
            "mismatch_split out"
        )
    return errors
