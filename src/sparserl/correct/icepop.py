"""``icepop``: IcePop's token mask of the sampler/learner mismatch (Ring-1T; NeMo-RL, OpenRLHF)."""

from __future__ import annotations

from torch import Tensor

from .base import Correction, build_correction, log_ratio, register_correction


@register_correction("icepop")
def icepop(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    low: float = 0.5,
    high: float = 5.0,
) -> Correction:
    """IcePop (Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking
    Model", 2025, arXiv 2510.18855; NeMo-RL's ``truncated_importance_sampling_type: icepop``, OpenRLHF's
    ``is_correction_type icepop``): each token's ratio ``ρ_t = p_t / q_t`` weights its loss inside ``[low,
    high]`` (bounds inclusive) and zeroes it outside:

        ``w_t = ρ_t · 1[low ≤ ρ_t ≤ high]``

    Defaults 0.5 and 5.0 (NeMo-RL's ProRL v2 guide, OpenRLHF's default). As in both, a zeroed token keeps its
    place in the loss's normalisation (weight 0, mask kept; counted in ``rs/token_masked_frac``); the kept
    ones take the raw, untruncated ratio.
    """
    if not 0 <= low <= high:
        raise ValueError(f"icepop: need 0 <= low <= high, got low={low}, high={high}")
    rho = log_ratio(sampler_logprobs, old_logprobs, mask).exp()
    out = (rho < low) | (rho > high)
    return build_correction(sampler_logprobs, old_logprobs, mask, weights=rho.masked_fill(out, 0.0), token_rejected=out)
