"""Several rewards summed with weights, as TRL's ``reward_funcs`` with ``reward_weights``:

    R = Σ_k w_k · r_k(response, label, prompt)

(``reward.fn: [math, my_rewards:format]``, ``reward.weights: [1.0, 0.1]``; every weight 1 when
``reward.weights`` is left out). Each part is scored as a single reward is (:func:`score_responses`:
checker processes, ``reward.timeout_s``, a failing call or a value not finite in float32 scores 0 and is
counted), and its mean is logged on its own; a sum that overflows float32 scores 0 and is counted too.
The first part is the **verifier**: held-out evaluation's pass@k reads it alone, since a
shaped sum (a format bonus) is not a pass rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .registry import RewardSpecError, finite_in_float32, load_reward, score_responses

__all__ = ["WeightedReward", "RewardScores", "load_rewards", "score_rewards", "spec_problem", "verifier"]


@dataclass
class RewardScores:
    """A batch's rewards: ``total`` per response, each part's values by its spec (empty for one reward), and
    the failed calls over all parts."""

    total: list[float]
    parts: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0

    @property
    def verified(self) -> list[float]:
        """The verifier's values (a weighted reward's first part; else the reward): what pass rates read."""
        return next(iter(self.parts.values())) if self.parts else self.total


class WeightedReward:
    """``parts``: (spec, reward function) pairs, ``weights`` one per part."""

    def __init__(self, parts: list[tuple[str, Callable[..., Any]]], weights: Sequence[float]):
        if len(parts) != len(weights):
            raise ValueError(f"{len(parts)} rewards but {len(weights)} weights")
        self.parts, self.weights = list(parts), [float(w) for w in weights]
        self.__name__ = "+".join(spec for spec, _ in parts)

    def __repr__(self) -> str:
        return "WeightedReward(" + ", ".join(f"{w:g}·{spec}" for (spec, _), w in zip(self.parts, self.weights)) + ")"

    def score(
        self, responses: Sequence[str], labels: Sequence[Any], prompts: Sequence[Any] | None = None
    ) -> RewardScores:
        parts, errors = {}, 0
        for spec, fn in self.parts:
            parts[spec], failed = score_responses(fn, responses, labels, prompts)
            errors += failed
        total = [
            sum(w * parts[spec][i] for (spec, _), w in zip(self.parts, self.weights)) for i in range(len(responses))
        ]
        overflow = [i for i, t in enumerate(total) if not finite_in_float32(t)]  # finite parts, huge weights
        for i in overflow:
            total[i] = 0.0
        return RewardScores(total, parts, errors + len(overflow))

    def __call__(self, response: str, label: Any, prompt: Any = None) -> float:
        return self.score([response], [label], [prompt]).total[0]


def spec_problem(spec: str | list[str], weights: Sequence[float] | None) -> str | None:
    """What is wrong with ``reward.fn`` / ``reward.weights`` as a pair (the config's check and
    :func:`load_rewards`'), or None."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        return "reward.fn=[]: name at least one reward"
    if weights is not None and len(weights) != len(specs):
        return f"reward.weights={list(weights)}: {len(weights)} weights for the {len(specs)} reward(s) of reward.fn"
    repeated = sorted({s for s in specs if specs.count(s) > 1})
    if repeated:
        return f"reward.fn names {', '.join(map(repr, repeated))} twice: give it once, with the summed weight"
    return None


def load_rewards(
    spec: str | list[str], weights: Sequence[float] | None = None, timeout_s: float | None = None
) -> Callable[..., Any]:
    """``reward.fn`` and ``reward.weights``: one reward (:func:`load_reward`) for a name with weight 1, else a
    :class:`WeightedReward`. An error names the spec that failed, or ``reward.weights``."""
    problem = spec_problem(spec, weights)
    if problem:
        raise RewardSpecError(problem)
    if isinstance(spec, str) and (weights is None or weights[0] == 1):
        return load_reward(spec, timeout_s=timeout_s)
    specs = [spec] if isinstance(spec, str) else list(spec)
    return WeightedReward(
        [(s, load_reward(s, timeout_s=timeout_s)) for s in specs], [1.0] * len(specs) if weights is None else weights
    )


def score_rewards(
    reward: Callable[..., Any], responses: Sequence[str], labels: Sequence[Any], prompts: Sequence[Any] | None = None
) -> RewardScores:
    """The batch's :class:`RewardScores` under ``reward`` (one reward or a :class:`WeightedReward`)."""
    if isinstance(reward, WeightedReward):
        return reward.score(responses, labels, prompts)
    total, errors = score_responses(reward, responses, labels, prompts)
    return RewardScores(total, {}, errors)


def verifier(reward: Callable[..., Any]) -> Callable[..., Any]:
    """The reward evaluation's pass@k reads: the first part of a :class:`WeightedReward`, else ``reward``."""
    return reward.parts[0][1] if isinstance(reward, WeightedReward) else reward
