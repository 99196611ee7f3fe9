"""``double_min``: Sparrow's double-min acceptance, a rejection of the sampler's tokens with the accepted ones
reweighted to the dense policy (Sparrow, Zhou et al., 2026, arXiv 2606.08446, ``use_double_min_sample`` in
``verl/trainer/ppo/core_algos.py``)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Correction, build_correction, log_ratio, register_correction


@register_correction("double_min")
def double_min(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    upclip: float = 3.0,
    overlap: Tensor | None = None,
    seed: int = 0,
) -> Correction:
    """Each sampled token ``y_t ~ q`` is accepted with probability ``min(1, p_t / q_t)`` (a seeded Bernoulli: the
    same ``seed`` draws the same; rejected tokens leave the loss, its normaliser too), and the accepted ones take

        ``w_t = Z_t · clip(p_t / q_t, 1, upclip)``,    ``Z_t = Σ_v min(q_t(v), p_t(v))``

    The accepted tokens follow ``min(q, p) / Z``; ``p / (min(q, p) / Z) = Z · max(p / q, 1)``, so the weight
    makes them an estimate under ``p`` (the two mins), its upper side clipped at ``upclip`` (Sparrow's
    ``double_min_upclip_ratio``, 3.0). ``Z_t`` is the exact acceptance α of the token's position
    (``overlap`` [B, T], ``mismatch.alpha=exact``, handed over by the step): Sparrow's is a top-20 lower bound
    renormalised so that its batch mean equals the share of tokens accepted, which ``overlap=None`` stands in for
    with that share itself (one number for every token). Sparrow's threshold C is 1 here (its default).
    Rejections are counted in ``rs/token_masked_frac``; ``is/clipped_frac``: tokens whose ``p/q`` exceeded
    ``upclip``."""
    if upclip < 1:
        raise ValueError(f"double_min: upclip must be >= 1, got {upclip}")
    lr = log_ratio(sampler_logprobs, old_logprobs, mask)
    valid = mask != 0
    accept = lr.clamp(max=0.0).exp()  # min(1, p/q)
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    u = torch.rand(lr.shape, generator=g).to(lr.device)
    kept = (u < accept) & valid
    if overlap is None:  # Sparrow's calibration with a flat overlap: the share of tokens accepted
        z = kept.sum() / valid.sum().clamp(min=1)
        overlap = torch.full_like(lr, float(z))
    rho = lr.exp()
    w = overlap.to(lr.dtype) * rho.clamp(min=1.0, max=upclip)
    return build_correction(
        sampler_logprobs, old_logprobs, mask, weights=w, keep=kept, token_rejected=valid & ~kept, clipped=rho > upclip
    )
