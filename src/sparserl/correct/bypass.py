"""``bypass``: verl's bypass mode: the sampler is the PPO old policy (two policies, not three)."""

from __future__ import annotations

from torch import Tensor

from .base import Correction, build_correction, register_correction


@register_correction("bypass")
def bypass(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Correction:
    """Bypass mode (verl ``algorithm.rollout_correction.bypass_mode``): behaviour = sampler.

    ``behaviour_logprobs = log q_t``, ``w_t = 1``, mask unchanged. The PPO ratio becomes
    ``π_t / q_t``, so the clipped objective itself corrects the sampler mismatch (and clips it);
    the dense old-policy pass is not needed for the loss. ``old_logprobs`` is only used for the
    mismatch metrics: pass ``sampler_logprobs`` again when the dense pass was skipped (the metrics
    then read "no mismatch").
    """
    return build_correction(sampler_logprobs, old_logprobs, mask, behaviour_logprobs=sampler_logprobs)
