"""``none``: the naive baseline: sampler tokens treated as if sampled by the dense policy."""

from __future__ import annotations

from torch import Tensor

from .base import Correction, build_correction, register_correction


@register_correction("none")
def none(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Correction:
    """No correction: ``w_t = 1``, mask unchanged, behaviour policy = dense old policy ``p``.

    The PPO ratio is ``π_t / p_t`` and the rollout's sampler ``q`` is ignored: the objective is
    biased by the sampler/dense mismatch (the "naive" baseline that Sparse-RL, Luo et al. 2026,
    arXiv 2601.10079, show collapses under sparse rollouts). Mismatch metrics are still reported.
    """
    return build_correction(sampler_logprobs, old_logprobs, mask)
