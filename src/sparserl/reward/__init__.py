"""Verifiable rewards (Sparse-RL, arXiv 2601.10079; ALGORITHMS.md §1): 1 if the response's last
``\\boxed{}`` equals the label, else 0; plus loading rewards by name and safe batch scoring."""

from .math import (DEFAULT_TIMEOUT_S, answers_equal, extract_answer, extract_boxed,
                   extract_last_number, math_reward, normalize_label)
from .registry import BUILTIN_REWARDS, RewardFn, as_reward_fn, load_reward, score_responses

__all__ = [
    "RewardFn", "BUILTIN_REWARDS", "load_reward", "as_reward_fn", "score_responses",
    "math_reward", "answers_equal", "extract_answer", "extract_boxed", "extract_last_number",
    "normalize_label", "DEFAULT_TIMEOUT_S",
]
