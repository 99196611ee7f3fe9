"""Reward functions: the protocol, loading one by name, and scoring a batch safely.

A reward is ``fn(response: str, label: str, prompt: str | None = None) -> float``; functions
that take only ``(response, label)`` are accepted too and are wrapped by :func:`as_reward_fn`.
Training, evaluation and the bench hand ``prompt`` the problem as the model was asked it
(:attr:`sparserl.data.Example.prompt_text`: its last user message, after ``data.template``).
The built-in ``"math"`` reward is the Sparse-RL rule (arXiv 2601.10079, docs/algorithms.md §1):
1 if the last ``\\boxed{}`` equals the label, else 0 (:mod:`sparserl.reward.math`).

``reward.timeout_s`` is honoured for every reward loaded by name: the math reward's math-verify
checks, and each call of a ``"module:function"`` reward, run in checker processes
(:mod:`sparserl.reward.pool`) and a call that overruns scores 0 (a custom reward's overrun is
counted as an error, like a custom reward that raises).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import SparserlError
from ..registry import did_you_mean
from . import pool as _pool
from .math import DEFAULT_TIMEOUT_S, MathReward, math_reward

__all__ = [
    "RewardFn",
    "BUILTIN_REWARDS",
    "load_reward",
    "as_reward_fn",
    "score_responses",
    "RewardSpecError",
    "RewardTimeout",
    "PooledReward",
    "FLOAT32_OVERFLOW",
    "finite_in_float32",
]

log = logging.getLogger(__name__)

#: the smallest magnitude that rounds to ±inf in float32 (round to nearest): 2^128 − 2^103, half a unit in
#: the last place above float32's largest value 3.4028235e38
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
#: rewards that have returned a non-finite value in this process (each is warned about once)
_WARNED_NONFINITE: set[str] = set()


def finite_in_float32(value: float) -> bool:
    """Whether ``value`` stays finite as a float32 (the dtype of the trainer's reward and advantage tensors):
    not NaN, not ±inf, and ``|value| < 2^128 − 2^103`` (so 1e300, finite in Python, is not)."""
    return math.isfinite(value) and abs(value) < FLOAT32_OVERFLOW


def _reward_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "ref", None) or getattr(fn, "__name__", None) or fn)


class RewardSpecError(SparserlError, ValueError):
    """A bad ``reward.fn`` or ``reward.timeout_s``: unknown name, module not found, missing
    attribute, not callable, malformed spec."""


class RewardTimeout(RuntimeError):
    """A custom reward call ran past ``reward.timeout_s`` (it scores 0 and counts as an error)."""


@runtime_checkable
class RewardFn(Protocol):
    """A verifiable reward: the score of one response against its label (higher is better)."""

    def __call__(self, response: str, label: str, prompt: str | None = None) -> float: ...


#: built-in rewards by name (``load_reward("math")``).
BUILTIN_REWARDS: dict[str, Callable[..., float]] = {
    "math": math_reward,
    "math_verify": math_reward,
}

_VALID = (
    "valid: a built-in reward ("
    + ", ".join(repr(n) for n in sorted(BUILTIN_REWARDS))
    + ") or 'package.module:function' naming an importable callable taking "
    "(response, label) or (response, label, prompt)"
)


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


class PooledReward:
    """A ``"module:function"`` reward whose calls run in the checker processes, each under
    ``timeout_s`` seconds. Each worker imports the module itself (once, outside the deadline), so
    the function need not be picklable, but its module must be importable from ``sys.path``.
    ``workers=0``: in-process, no time limit."""

    def __init__(self, ref: str, fn: Callable[..., Any], timeout_s: float | None, workers: int | None = None):
        self.ref = ref
        self.fn = as_reward_fn(fn)
        self.takes_prompt = _takes_prompt(fn)
        self.timeout_s = timeout_s
        self.workers = workers
        self.__name__ = getattr(fn, "__name__", ref)

    def __repr__(self) -> str:
        return f"PooledReward({self.ref!r}, timeout_s={self.timeout_s}, workers={self.workers})"

    def __call__(self, response: str, label: Any, prompt: Any = None) -> float:
        value = self.score_batch([response], [label], [prompt])[0]
        if isinstance(value, BaseException):
            raise value
        return value

    def score_batch(
        self, responses: Sequence[str], labels: Sequence[Any], prompts: Sequence[Any] | None = None
    ) -> list[Any]:
        """One value per response, or the exception its call raised (:class:`RewardTimeout` for an
        overrun); never raises itself."""
        prompts = [None] * len(responses) if prompts is None else list(prompts)
        if self.workers == 0 or _pool.in_worker():
            out: list[Any] = []
            for r, lab, p in zip(responses, labels, prompts):
                try:
                    out.append(self.fn(r, lab, p))
                except Exception as e:  # reported to score_responses
                    out.append(e)
            return out
        calls = [
            (self.ref, (r, lab, p) if self.takes_prompt else (r, lab)) for r, lab, p in zip(responses, labels, prompts)
        ]
        out = []
        for status, value in _pool.get_pool(self.workers).run(calls, self.timeout_s):
            if status == "ok":
                out.append(value)
            elif status == "timeout":
                out.append(RewardTimeout(f"reward {self.ref!r} took longer than reward.timeout_s={self.timeout_s} s"))
            else:
                out.append(RuntimeError(value))
        return out


def _spec_error(spec: Any, why: str) -> RewardSpecError:
    return RewardSpecError(f"reward.fn={spec!r}: {why}; {_VALID}")


def _check_timeout(timeout_s: Any) -> float | None:
    if timeout_s is None:
        return None
    try:
        t = float(timeout_s)
    except (TypeError, ValueError):
        t = math.nan
    if not (t > 0 and math.isfinite(t)) or isinstance(timeout_s, bool):
        raise RewardSpecError(f"reward.timeout_s={timeout_s!r}: expected a number of seconds > 0")
    return t


def load_reward(
    spec: str | Callable[..., Any], timeout_s: float | None = None, *, workers: int | None = None
) -> RewardFn:
    """Resolve ``reward.fn``.

    ``"math"`` (alias ``"math_verify"``) → a :class:`~sparserl.reward.math.MathReward` with
    ``timeout_s`` per math-verify check (default 5 s); its checker processes start now, in the
    background. ``"package.module:function"`` → that function, imported; with ``timeout_s`` each
    call runs in a checker process under that limit (:class:`PooledReward`), without it in this
    process without a time limit. A callable is passed through (no time limit). ``workers``: checker
    processes (None: the default; 0: run in-process without a time limit).

    Raises :class:`RewardSpecError` (a :class:`~sparserl.errors.SparserlError` and ``ValueError``)
    naming ``reward.fn``, the spec, the cause (unknown name, module not found, attribute missing,
    not callable, malformed) and what is valid; or naming ``reward.timeout_s`` when that is not a
    positive number.
    """
    timeout_s = _check_timeout(timeout_s)
    if callable(spec):
        return as_reward_fn(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise _spec_error(spec, "expected a reward name or 'module:function'")
    name = spec.strip()
    if name in BUILTIN_REWARDS:
        reward = MathReward(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, workers=workers)
        reward.start()
        return reward
    if ":" not in name:
        raise _spec_error(spec, f"unknown reward name{did_you_mean(name, BUILTIN_REWARDS)}")
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr or any(not part for part in attr.split(".")):
        raise _spec_error(spec, "expected 'module:function' (one colon, both sides non-empty)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise _spec_error(spec, f"module {module_name!r} not found ({e})") from e
    except Exception as e:  # the module exists but failed on import
        raise _spec_error(spec, f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise _spec_error(spec, f"module {module_name!r} has no attribute {attr!r}{did_you_mean(part, names)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _spec_error(spec, f"{attr!r} is not callable (it is a {type(obj).__name__})")
    if timeout_s is None:
        return as_reward_fn(obj)
    if workers != 0:
        _pool.get_pool(workers).start()  # the workers boot while the model loads
    return PooledReward(name, obj, timeout_s, workers)  # type: ignore[return-value]


def score_responses(
    fn: Callable[..., Any], responses: Sequence[str], labels: Sequence[Any], prompts: Sequence[Any] | None = None
) -> tuple[list[float], int]:
    """Score each response against its label with ``fn``.

    Returns ``(rewards, n_errors)``. A call that raises (or overruns ``reward.timeout_s``), or
    returns something that is not a number, scores 0.0 and is counted in ``n_errors`` (the batch's
    first such failure is logged as a warning), so one bad reward never stops a run. So does a value
    that is not finite in float32 (:func:`finite_in_float32`: NaN, ±inf, or a magnitude such as 1e300
    that overflows the trainer's float32 reward tensors, where one such value would make every
    advantage of its group, then every weight, NaN); the first one of each reward is logged as a
    warning naming it. A reward with a ``score_batch`` method (the built-in math reward, a custom
    reward loaded with a timeout) gets the whole batch at once, so its checks run in parallel.
    ``prompts`` (optional) is passed to
    rewards that take a third parameter. Length mismatches raise ``ValueError``.
    """
    if len(responses) != len(labels):
        raise ValueError(f"score_responses: {len(responses)} responses but {len(labels)} labels")
    if prompts is not None and len(prompts) != len(responses):
        raise ValueError(f"score_responses: {len(responses)} responses but {len(prompts)} prompts")
    batch = getattr(fn, "score_batch", None)
    values: list[Any]
    if callable(batch):
        try:
            values = list(batch(list(responses), list(labels), None if prompts is None else list(prompts)))
            if len(values) != len(responses):
                raise ValueError(f"score_batch returned {len(values)} values for {len(responses)} responses")
        except Exception as e:  # a failing batch: every response scores 0
            values = [e] * len(responses)
    else:
        reward = as_reward_fn(fn)
        takes_prompt = _takes_prompt(reward)
        values = []
        for i, (response, label) in enumerate(zip(responses, labels)):
            try:
                if takes_prompt:
                    values.append(reward(response, label, None if prompts is None else prompts[i]))
                else:
                    values.append(reward(response, label))
            except Exception as e:
                values.append(e)
    rewards: list[float] = []
    n_errors = n_failed = 0
    for i, value in enumerate(values):
        try:
            if isinstance(value, BaseException):
                raise value
            value = float(value)
        except Exception as e:  # a failing reward scores 0 and is counted
            if n_failed == 0:
                log.warning("reward %s failed on response %d: %s: %s", _reward_name(fn), i, type(e).__name__, e)
            n_failed += 1
            n_errors += 1
            value = 0.0
        if not finite_in_float32(value):
            name = _reward_name(fn)
            if name not in _WARNED_NONFINITE:
                _WARNED_NONFINITE.add(name)
                log.warning(
                    "reward %s returned %r on response %d, which is not finite in float32 (the trainer's "
                    "reward tensors): it scores 0 and counts in reward/errors (said once per reward)",
                    name,
                    value,
                    i,
                )
            n_errors += 1
            value = 0.0
        rewards.append(value)
    return rewards, n_errors
