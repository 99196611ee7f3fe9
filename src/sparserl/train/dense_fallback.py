"""Sparrow's dense fallback (``rollout.dense_fallback``; Sparrow's ``dense_filtering_overload``, Zhou et al., 2026,
arXiv 2606.08446, ``verl/trainer/ppo/ray_trainer.py``).

A compressed sampler can lose the thread of a hard prompt: every one of its ``n`` responses scores 0, the group's
advantages are all 0, and the step learns nothing from the prompt. With the fallback, each group of a step whose
rewards are all 0 is sampled again, once, by the same weights on a **dense** KV cache (the sampler's weights and
quantization, no compression: :meth:`~sparserl.rollout.engine.RolloutEngine.from_engine` with ``none``), scored,
and put in the place of the sparse group, whatever the dense responses score. Their tokens carry the dense
sampler's log-probs, so the corrections and α read them as what drew them (a dense sampler's ratio to the old
policy is ~1). Counted in ``sampling/dense_fallback_frac`` (groups re-sampled) with their reward
(``sampling/dense_fallback_reward_mean``); ``reward/mean`` stays the compressed sampler's, comparable with a run
without the fallback.

The re-sample runs in the training process on its sampler with the learner's current weights: those of the
rollout when it is synchronous (``rollout.async`` is refused with it), on rollout workers too. Its responses draw
from random streams of their own (the rows after the step's batch: a fresh draw, not the sparse responses'
uniforms again), so a seed gives the same run.
"""

from __future__ import annotations

import dataclasses

from .. import runlog as names
from ..reward.weighted import RewardScores
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..rollout.kv import get_compressor

__all__ = ["all_zero_groups", "dense_fallback", "dense_sampler", "replace_groups"]


def all_zero_groups(rewards: list[float], prompt_index: list[int], n_prompts: int) -> list[int]:
    """The prompts (indices) whose responses all got a reward of exactly 0 (Sparrow: every response's summed
    reward 0)."""
    zero = [True] * n_prompts
    seen = [False] * n_prompts
    for value, p in zip(rewards, prompt_index):
        seen[p] = True
        zero[p] = zero[p] and float(value) == 0.0
    return [p for p in range(n_prompts) if zero[p] and seen[p]]


def replace_groups(
    ro: RolloutOutput, scores: RewardScores, groups: list[int], new: RolloutOutput, new_scores: RewardScores
) -> tuple[RolloutOutput, RewardScores]:
    """``ro`` and ``scores`` with the responses of each prompt in ``groups`` replaced, in order, by ``new``'s
    responses to the same prompt (``new.prompt_index`` numbers ``groups``: 0 is ``groups[0]``). The tokens generated
    and the sampling time are both rollouts' (what the step sampled, as oversampling counts its dropped responses);
    the KV figures stay the compressed rollout's."""
    queue: dict[int, list[int]] = {}
    for j, p in enumerate(new.prompt_index):
        queue.setdefault(groups[p], []).append(j)
    source = []  # per row of the result: (from new?, row)
    for i, p in enumerate(ro.prompt_index):
        source.append((True, queue[p].pop(0)) if p in queue else (False, i))
    if any(queue.values()):
        raise ValueError("replace_groups: the new rollout has more responses per prompt than the old one")

    def merged(old_values, new_values):
        if old_values is None:
            return None
        if new_values is None:
            raise ValueError("replace_groups: the new rollout lacks a field the old one has")
        return [new_values[j] if fresh else old_values[j] for fresh, j in source]

    out = dataclasses.replace(
        ro,
        response_ids=merged(ro.response_ids, new.response_ids),
        sampler_logprobs=merged(ro.sampler_logprobs, new.sampler_logprobs),
        finish_reason=merged(ro.finish_reason, new.finish_reason),
        kv_tokens_kept=merged(ro.kv_tokens_kept, new.kv_tokens_kept),
        top_logprobs=merged(ro.top_logprobs, new.top_logprobs),
        top_indices=merged(ro.top_indices, new.top_indices),
        distributions=merged(ro.distributions, new.distributions),
        hidden=merged(ro.hidden, new.hidden),
        token_versions=merged(ro.token_versions, new.token_versions),
        texts=merged(ro.texts, new.texts),
        tokens_generated=ro.tokens_generated + new.tokens_generated,
        seconds=ro.seconds + new.seconds,
        prefill_seconds=ro.prefill_seconds + new.prefill_seconds,
    )
    parts = {k: merged(v, new_scores.parts[k]) for k, v in scores.parts.items()}
    return out, RewardScores(merged(scores.total, new_scores.total), parts, scores.errors + new_scores.errors)


def dense_fallback(examples: list, ro: RolloutOutput, scores: RewardScores, resample, score):
    """The step's ``ro`` / ``scores`` with its all-zero groups re-sampled densely (the module docstring), and the
    metrics. ``resample(chosen)``: the dense rollout of the examples ``chosen`` (:func:`dense_sampler`);
    ``score(examples, ro)`` scores a rollout."""
    groups = all_zero_groups(scores.total, ro.prompt_index, len(examples))
    metrics = {names.DENSE_FALLBACK_FRAC: len(groups) / max(len(examples), 1)}
    if not groups:
        return ro, scores, metrics
    chosen = [examples[p] for p in groups]
    new = resample(chosen)
    new_scores = score(chosen, new)
    metrics[names.DENSE_FALLBACK_REWARD] = sum(new_scores.total) / max(len(new_scores.total), 1)
    ro, scores = replace_groups(ro, scores, groups, new, new_scores)
    return ro, scores, metrics


def dense_sampler(engine: RolloutEngine) -> RolloutEngine:
    """``engine``'s weights (no copy) on a dense KV cache."""
    return RolloutEngine.from_engine(engine, get_compressor("none"))
