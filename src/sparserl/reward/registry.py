"""Reward functions: the protocol, loading one by name, and scoring a batch safely.

A reward is ``fn(response: str, label: str, prompt: str | None = None) -> float``; functions
that take only ``(response, label)`` are accepted too and are wrapped by :func:`as_reward_fn`.
The built-in ``"math"`` reward is the Sparse-RL rule (arXiv 2601.10079, ALGORITHMS.md §1):
1 if the last ``\\boxed{}`` equals the label, else 0.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from .math import math_reward

__all__ = ["RewardFn", "BUILTIN_REWARDS", "load_reward", "as_reward_fn", "score_responses"]

log = logging.getLogger(__name__)


@runtime_checkable
class RewardFn(Protocol):
    """A verifiable reward: the score of one response against its label (higher is better)."""

    def __call__(self, response: str, label: str, prompt: str | None = None) -> float: ...


#: built-in rewards by name (``load_reward("math")``).
BUILTIN_REWARDS: dict[str, Callable[..., float]] = {
    "math": math_reward,
    "math_verify": math_reward,
}


def _takes_prompt(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called as ``fn(response, label, prompt)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: assume the full protocol
        return True
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3


def as_reward_fn(fn: Callable[..., Any]) -> RewardFn:
    """Adapt a 2-parameter ``fn(response, label)`` or 3-parameter ``fn(response, label, prompt)``
    function to the :class:`RewardFn` protocol (the result always accepts ``prompt``)."""
    if not callable(fn):
        raise TypeError(f"reward {fn!r} is not callable")
    if getattr(fn, "_sparserl_reward_adapted", False) or _takes_prompt(fn):
        return fn  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(response: str, label: str, prompt: str | None = None) -> float:
        return fn(response, label)

    wrapper._sparserl_reward_adapted = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def load_reward(spec: str | Callable[..., Any]) -> RewardFn:
    """Resolve a reward by name.

    ``"math"`` (alias ``"math_verify"``) → :func:`~sparserl.reward.math.math_reward`;
    ``"package.module:function"`` → that function, imported; a callable is passed through.
    Raises ``ValueError`` naming the spec and the cause (unknown name, module not found,
    attribute missing, not callable).
    """
    if callable(spec):
        return as_reward_fn(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward spec {spec!r}: expected a name such as 'math' or 'module:function'")
    name = spec.strip()
    if name in BUILTIN_REWARDS:
        return as_reward_fn(BUILTIN_REWARDS[name])
    if ":" not in name:
        raise ValueError(
            f"reward spec {spec!r}: unknown reward name; built-in rewards are "
            f"{sorted(BUILTIN_REWARDS)}, or give 'module:function'")
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward spec {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"reward spec {spec!r}: module {module_name!r} not found ({e})") from e
    except Exception as e:  # noqa: BLE001 - the module exists but failed on import
        raise ValueError(f"reward spec {spec!r}: importing module {module_name!r} failed: "
                         f"{type(e).__name__}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward spec {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"reward spec {spec!r}: {attr!r} is not callable "
                         f"(it is a {type(obj).__name__})")
    return as_reward_fn(obj)


def score_responses(fn: Callable[..., Any], responses: Sequence[str], labels: Sequence[Any],
                    prompts: Sequence[Any] | None = None) -> tuple[list[float], int]:
    """Score each response against its label with ``fn``.

    Returns ``(rewards, n_errors)``. A call that raises, or returns something that is not a
    finite number, scores 0.0 and is counted in ``n_errors`` (the first such failure is logged
    as a warning), so one bad reward never stops a run. ``prompts`` (optional) is passed to
    rewards that take a third parameter. Length mismatches raise ``ValueError``.
    """
    if len(responses) != len(labels):
        raise ValueError(f"score_responses: {len(responses)} responses but {len(labels)} labels")
    if prompts is not None and len(prompts) != len(responses):
        raise ValueError(f"score_responses: {len(responses)} responses but {len(prompts)} prompts")
    reward = as_reward_fn(fn)
    takes_prompt = _takes_prompt(reward)
    rewards: list[float] = []
    n_errors = 0
    for i, (response, label) in enumerate(zip(responses, labels)):
        try:
            if takes_prompt:
                value = reward(response, label, None if prompts is None else prompts[i])
            else:
                value = reward(response, label)
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"non-finite reward {value}")
        except Exception as e:  # noqa: BLE001 - a failing reward scores 0 and is counted
            if n_errors == 0:
                log.warning("reward %s failed on response %d: %s: %s",
                            getattr(fn, "__name__", fn), i, type(e).__name__, e)
            n_errors += 1
            value = 0.0
        rewards.append(value)
    return rewards, n_errors
