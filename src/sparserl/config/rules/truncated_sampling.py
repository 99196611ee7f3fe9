"""Truncated sampling (top-k / top-p) under a correction that reads the ratio p / q."""

from __future__ import annotations

from ..schema import Config


def truncated_ratio_warning(cfg: Config) -> str | None:
    """A warning when ``rollout.top_k`` / ``top_p`` truncate the sampler's distribution and something reads
    the ratio of the dense policy's log-probs to the sampler's (a correction other than ``none``, or
    ``algorithm.off_policy_mask_threshold``), else None.

    The sampler's ``q`` is the distribution it drew from, renormalised over the kept tokens K_t (verl's and
    NeMo-RL's ``processed_logprobs``); the dense policy's ``p`` is over the whole vocabulary. So
    ``p_t / q_t = S_t · p^K_t / q_t`` with ``S_t = Σ_{x ∈ K_t} p(x) ≤ 1`` and ``p^K = p / S_t`` the policy
    renormalised over the same tokens: the ratio carries the kept mass (TRL issue 6789, where it is open).
    DeepSeek-V3.2's Keep Sampling Mask (DeepSeek-AI, 2025, arXiv 2512.02556, §3.1) renormalises ``p`` and
    ``π_θ`` over K_t too; it is not built here. Not an error: the ratio is still the importance weight of
    the untruncated policy, which TRL and verl also use; a warning, so a user setting top-k / top-p knows
    it."""
    from ...correct.presets import resolve

    r, a = cfg.rollout, cfg.algorithm
    if r.top_k == 0 and r.top_p >= 1.0:
        return None
    try:
        methods = [name for name, _ in resolve(a.correction, dict(a.correction_options))]
    except (ValueError, TypeError):
        return None  # the correction's own rule reports it
    readers = [f"algorithm.correction={a.correction!r}"] if any(m != "none" for m in methods) else []
    if a.off_policy_mask_threshold is not None:
        readers.append(f"algorithm.off_policy_mask_threshold={a.off_policy_mask_threshold}")
    if not readers:
        return None
    truncation = [f"rollout.top_k={r.top_k}"] if r.top_k else []
    truncation += [f"rollout.top_p={r.top_p}"] if r.top_p < 1.0 else []
    return (
        f"{' and '.join(truncation)} with {' and '.join(readers)}: the sampler's log-probs "
        "are its truncated distribution's, renormalised over the kept tokens, the dense policy's are over the "
        "whole vocabulary, so each token's ratio p/q carries the policy's mass on the kept tokens (< 1; the "
        "Keep Sampling Mask that renormalises p too is not built: docs/algorithms.md §5); "
        "rollout.top_k=0 and rollout.top_p=1 sample the whole distribution"
    )
