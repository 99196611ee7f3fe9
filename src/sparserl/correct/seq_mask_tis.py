"""``seq_mask_tis``: a sequence mask on the geometric-mean ratio with token importance weights (NeMo-RL,
OpenRLHF)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Correction, build_correction, log_ratio, masked_mean, register_correction


@register_correction("seq_mask_tis")
def seq_mask_tis(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    low: float = 0.999,
    high: float = 1.002,
) -> Correction:
    """NeMo-RL's ``truncated_importance_sampling_type: seq-mask-tis`` (OpenRLHF's ``is_correction_type
    seq-mask-tis``): a response whose geometric-mean ratio ``g = exp(mean_t log ρ_t)`` (``ρ_t = p_t / q_t``
    over its tokens) leaves ``[low, high]`` (bounds inclusive) is zeroed whole; the tokens of the others are
    weighted by their own raw ratio:

        ``w_t = ρ_t · 1[low ≤ g ≤ high]``

    Defaults 0.999 and 1.002 (NeMo-RL's ProRL v2 guide: a tight band on the per-token geometric mean). As in
    both, a zeroed response keeps its place in the loss's normalisation (weight 0, mask kept; counted in
    ``rs/seq_vetoed_frac``).
    """
    if not 0 <= low <= high:
        raise ValueError(f"seq_mask_tis: need 0 <= low <= high, got low={low}, high={high}")
    lr = log_ratio(sampler_logprobs, old_logprobs, mask)
    g = masked_mean(lr, mask, dim=-1).exp()
    out = (g < low) | (g > high)
    w = torch.where(out[:, None], torch.zeros_like(lr), lr.exp())
    return build_correction(sampler_logprobs, old_logprobs, mask, weights=w, seq_rejected=out)
