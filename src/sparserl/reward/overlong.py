"""DAPO's soft overlong punishment (Yu et al., 2025, arXiv 2503.14476, "Overlong reward shaping"; verl's
``reward_model.overlong_buffer``, TRL's ``get_soft_overlong_punishment``).

A response of |y| tokens, sampled under the limit L_max = ``rollout.max_new_tokens`` with a buffer of
L_cache = ``reward.overlong_buffer.len`` tokens, gets a length penalty added to its reward:

    R_length(y) = factor · min(0, ((L_max − L_cache) − |y|) / L_cache)

0 up to L_max − L_cache tokens, then falling linearly to −factor at L_max, where a response is cut
(DAPO: L_max 20,480, L_cache 4,096, factor 1). The penalty is the reward's own part
``overlong`` (logged as ``reward/part/overlong``); the verifier's part is what pass rates and
``reward/accuracy`` read, so shaping never counts as a pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from .weighted import RewardScores

__all__ = ["OVERLONG_PART", "overlong_penalty", "with_overlong_penalty"]

#: the part of :class:`RewardScores` that holds the length penalty
OVERLONG_PART = "overlong"


def overlong_penalty(lengths: Sequence[int], max_new_tokens: int, buffer_len: int, factor: float = 1.0) -> list[float]:
    """R_length (module docstring) of responses of ``lengths`` tokens."""
    if not 1 <= buffer_len <= max_new_tokens:
        raise ValueError(f"the overlong buffer ({buffer_len} tokens) must be 1 to max_new_tokens={max_new_tokens}")
    expected = max_new_tokens - buffer_len
    return [factor * min(0.0, (expected - n) / buffer_len) for n in lengths]


def with_overlong_penalty(scores: RewardScores, reward_spec: str, penalties: Sequence[float]) -> RewardScores:
    """``scores`` with ``penalties`` added to each total and kept as the part :data:`OVERLONG_PART`; a single
    reward's values become the part ``reward_spec`` first, so that the verifier stays the first part."""
    if len(penalties) != len(scores.total):
        raise ValueError(f"{len(penalties)} penalties for {len(scores.total)} responses")
    if OVERLONG_PART in scores.parts:
        raise ValueError(f"the reward already has a part named {OVERLONG_PART!r}")
    parts = dict(scores.parts) if scores.parts else {reward_spec: list(scores.total)}
    parts[OVERLONG_PART] = list(penalties)
    return RewardScores([t + p for t, p in zip(scores.total, penalties)], parts, scores.errors)
