"""Verifiable rewards (Sparse-RL, arXiv 2601.10079; docs/algorithms.md §1): 1 if the response's last
``\\boxed{}`` (else its last number) equals the label, else 0, with math-verify deciding
equivalence in time-limited checker processes; plus loading rewards by name and safe batch
scoring."""

from .math import (
    DEFAULT_TIMEOUT_S,
    MathReward,
    answers_equal,
    extract_answer,
    extract_boxed,
    extract_last_number,
    math_reward,
    normalize_label,
    symbolic_equal,
)
from .pool import CheckPool, get_pool, shutdown_pool
from .registry import (
    BUILTIN_REWARDS,
    PooledReward,
    RewardFn,
    RewardSpecError,
    RewardTimeout,
    as_reward_fn,
    finite_in_float32,
    load_reward,
    score_responses,
)

__all__ = [
    "RewardFn",
    "BUILTIN_REWARDS",
    "load_reward",
    "as_reward_fn",
    "score_responses",
    "RewardSpecError",
    "RewardTimeout",
    "PooledReward",
    "MathReward",
    "finite_in_float32",
    "math_reward",
    "answers_equal",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "normalize_label",
    "symbolic_equal",
    "DEFAULT_TIMEOUT_S",
    "CheckPool",
    "get_pool",
    "shutdown_pool",
]
