"""The mismatch between the dense old policy ``p`` and the sampler that ran ``q``, split by where it
comes from, each part's k3 averaged over the sampled tokens (Schulman's k3, ``ρ - 1 - log ρ`` with
``ρ = p / q``: non-negative, an estimate of KL(q ‖ p) under ``q``'s samples).

- ``rollout.mismatch_split`` (:func:`mismatch_split`): with ``q_w`` the sampler's quantized weights on a
  dense full-precision cache (:mod:`.teacher_forced`), ``log p/q = log p/q_w`` (the weights) ``+ log
  q_w/q`` (the cache: eviction and KV rounding);
- ``rollout.async`` (:func:`lag_split`): with ``q_w`` the sampler's weights of a step before on a dense
  cache, read on the rollout workers (:class:`.teacher_forced.DenseCacheReading`), ``log p/q_w`` is the
  lag (and the weight rounding when the sampler rounds), ``log q_w/q`` the cache.
"""

from __future__ import annotations

import torch

from .. import runlog as names
from ..batch import RolloutBatch
from ..correct import log_ratio
from .teacher_forced import DenseCacheReading, teacher_forced_logprobs


def k3_mean(log_q: torch.Tensor, log_p: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean k3 = ρ - 1 - log ρ, ρ = p / q, over the tokens where ``mask`` holds (0 when none)."""
    lr = log_ratio(log_q, log_p, mask).double()[mask.bool()]
    return float((lr.exp() - 1 - lr).mean()) if lr.numel() else 0.0


def mismatch_split(
    sampler_model, batch: RolloutBatch, temperature: float, micro_batch_size: int = 16, max_tokens: int | None = None
) -> dict:
    """k3 of the dense learner (``batch.old_logprobs``) against the sampler's quantized weights on a dense
    cache (``sampler_model``, holding the weights that sampled), and of those against the sampler
    (``batch.sampler_logprobs``); micro-batches as :func:`~.teacher_forced.teacher_forced_logsoftmax`'s."""
    q_weights = teacher_forced_logprobs(sampler_model, batch, temperature, micro_batch_size, max_tokens)
    q_weights = q_weights.to(batch.old_logprobs.device)
    return {
        names.MISMATCH_K3_WEIGHTS: k3_mean(q_weights, batch.old_logprobs, batch.response_mask),
        names.MISMATCH_K3_CACHE: k3_mean(batch.sampler_logprobs, q_weights, batch.response_mask),
    }


def lag_split(batch: RolloutBatch, reading: DenseCacheReading) -> dict:
    """k3 of the learner against ``q_w`` (``reading``: the sampler's weights of a step before on a dense
    cache; the lag, and the sampler's weight rounding when it rounds) and of ``q_w`` against the sampler
    that ran (the cache)."""
    q_weights = batch.padded(reading.logprobs)
    return {
        names.MISMATCH_K3_LAG: k3_mean(q_weights, batch.old_logprobs, batch.response_mask),
        names.MISMATCH_K3_CACHE: k3_mean(batch.sampler_logprobs, q_weights, batch.response_mask),
    }
