"""When the sampler's log-probs *are* the old policy's, so that the scoring forward can be skipped.

The old policy p of a PPO step is the learner's weights before the step's first update, and the
sampler runs exactly those weights (the trainer pushes them into the sampler after every update and
on resume). The sampler's ``log q`` of each sampled token is ``log softmax(logits / τ)`` after top-k
and top-p filtering (:mod:`sparserl.rollout.sampling`); the scorer's ``log p`` is
``log softmax(logits / τ)`` of the dense learner (:func:`sparserl.score.forward_response`). They are
the same number, up to float32 rounding (~1e-6 in log p), when

1. the sampler keeps a dense KV cache (no compressor evicts anything);
2. it samples from the full tempered distribution: ``temperature > 0`` (greedy reports log q = 0),
   ``top_p = 1`` and ``top_k = 0`` (a filter renormalises q over fewer tokens);
3. neither its weights nor its KV cache are quantized, and it holds the learner's current weights
   (not those of a step before: ``rollout.async``);
4. sampler and learner both compute in float32. In 16-bit the sampler's fused kernels and the
   learner's forward round differently (log p differs by ~1e-2 per token): that difference is the
   training-inference mismatch the corrections of :mod:`sparserl.correct` exist for, so it is scored.

Then ``old_logprobs = sampler_logprobs`` and the correction sees no mismatch, which is the truth.
"""
from __future__ import annotations

import torch

from ..errors import SparserlError

OLD_LOGPROBS_SOURCES = ("auto", "score", "sampler")


class OldLogprobsError(SparserlError, ValueError):
    """``algorithm.old_logprobs=sampler`` on a sampler whose log-probs are not the old policy's."""


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype)


def why_sampler_is_not_old_policy(*, compresses: bool, sampler_dtype, learner_dtype, temperature: float,
                                  top_p: float, top_k: int, quantized: bool = False, lagged: bool = False) -> str | None:
    """The first reason (a phrase naming the option) why the sampler's log-probs are not the old
    policy's, or None when they are (see the module docstring). Dtypes as torch dtypes or names;
    ``lagged``: the sampler holds the weights of a step before (``rollout.async``)."""
    if lagged:
        return "rollout.async samples with the weights of the step before (the learner scores the old policy)"
    if compresses:
        return "the sampler compresses its KV cache (rollout.compressor is not none)"
    if temperature <= 0:
        return "greedy sampling (rollout.temperature=0) reports log q = 0"
    if top_p < 1.0:
        return f"rollout.top_p={top_p} truncates the sampled distribution"
    if top_k:
        return f"rollout.top_k={top_k} truncates the sampled distribution"
    if quantized:
        return "the sampler's weights or KV cache are quantized (rollout.quant / rollout.kv_quant)"
    s, l_ = _dtype_name(sampler_dtype), _dtype_name(learner_dtype)
    if s != "float32" or l_ != "float32":
        return (f"sampler dtype {s} (rollout.dtype) and learner compute dtype {l_} (model.dtype, model.mixed_precision) "
                f"are not both float32: "
                "their log-probs differ by the rounding of 16-bit kernels")
    return None


def sampler_is_old_policy(**facts) -> bool:
    """True when the sampler's per-token log-probs are the old policy's (arguments of
    :func:`why_sampler_is_not_old_policy`)."""
    return why_sampler_is_not_old_policy(**facts) is None


def old_logprobs_source(mode: str, **facts) -> str:
    """Where a step's old-policy log-probs come from: ``"sampler"`` (reuse ``sampler_logprobs``) or
    ``"score"`` (a dense forward of the learner). ``mode`` (``algorithm.old_logprobs``): ``auto`` = the
    sampler when :func:`sampler_is_old_policy` holds, else score; ``score``; ``sampler`` = the sampler,
    an :class:`OldLogprobsError` when the rule does not hold."""
    if mode not in OLD_LOGPROBS_SOURCES:
        raise OldLogprobsError(f"algorithm.old_logprobs={mode!r}: expected one of {', '.join(OLD_LOGPROBS_SOURCES)}")
    if mode == "score":
        return "score"
    why = why_sampler_is_not_old_policy(**facts)
    if why is None:
        return "sampler"
    if mode == "sampler":
        raise OldLogprobsError(f"algorithm.old_logprobs=sampler: the sampler's log-probs are not the old policy's: "
                               f"{why}; use auto or score")
    return "score"
