"""``tis``: truncated importance sampling (FlashRL / FP8-RL / verl rollout IS) and
``acr``: QuRL's adaptive clipping range on top of token TIS."""

from __future__ import annotations

from torch import Tensor

from .base import (
    Correction,
    batch_normalize,
    build_correction,
    log_ratio,
    register_correction,
    sequence_log_ratio,
)


@register_correction("tis")
def tis(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    cap: float = 2.0,
    normalize: bool = False,
) -> Correction:
    """Truncated IS: reweight by ``min(ρ, C)``; no token or response is removed.

    - ``level="token"``: ``w_t = min(ρ_t, C)`` (FlashRL's TIS; FP8-RL uses C = 2; verl
      ``rollout_is="token"``);
    - ``level="sequence"``: ``w_t = min(exp(clamp(Σ_s log ρ_s, ±20)), C)`` broadcast to the
      response's tokens (verl ``rollout_is="sequence"``).

    ``ρ_t = exp(clamp(log p_t − log q_t, −20, 20))``; ``C = cap`` (verl default 2.0).
    ``normalize=True`` divides the weights by their batch mean (over tokens for ``token``, over
    responses for ``sequence``, as verl's ``rollout_is_batch_normalize``).
    ``is/clipped_frac`` = fraction of tokens whose (token or response) ratio exceeded ``C``.
    """
    lr = log_ratio(sampler_logprobs, old_logprobs, mask)
    if level == "token":
        rho = lr.exp()
    elif level == "sequence":
        rho = sequence_log_ratio(lr, mask).exp()[:, None].expand_as(lr)
    else:
        raise ValueError(f"tis: level must be 'token' or 'sequence', got {level!r}")
    clipped = rho > cap
    w = rho.clamp(max=cap)
    if normalize:
        w = batch_normalize(w, mask, per_sequence=level == "sequence")
    return build_correction(sampler_logprobs, old_logprobs, mask, weights=w, clipped=clipped)


@register_correction("acr")
def acr(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    cap: float = 2.0,
) -> Correction:
    """QuRL adaptive clipping range (Li et al. 2026, arXiv 2602.13953; docs/algorithms.md §4).

    Token TIS ``w_t = min(ρ_t, C)`` plus ``clip_upper_scale = 1 / r_t`` with
    ``r_t = min(ρ_t, C) / ρ_t ≤ 1``, i.e. ``1/r_t = max(1, ρ_t / C) ≥ 1``. The policy loss then
    clips the learner ratio ``R_t = π_t / p_t`` to ``[1 − ε, (1 + ε) / r_t]``: the upper bound is
    widened exactly where truncation bites, so positive-advantage tokens that were down-weighted
    by the truncation are not clipped a second time. The objective:
    ``E[min(ρ_t, C) · min(R_t A, clip(R_t, 1 − ε, (1 + ε)/r_t) A)]``.
    """
    rho = log_ratio(sampler_logprobs, old_logprobs, mask).exp()
    w = rho.clamp(max=cap)
    scale = (rho / cap).clamp(min=1.0)
    return build_correction(sampler_logprobs, old_logprobs, mask, weights=w, clipped=rho > cap, clip_upper_scale=scale)
