"""Dense scoring of finished rollouts (old-policy and reference log-probs)."""

from .chunked_head import head_logprobs, token_logprobs
from .dense import forward_response, score_logprobs, score_logprobs_keep_hidden
from .old_policy import (
    OLD_LOGPROBS_SOURCES,
    model_dropout,
    old_logprobs_source,
    sampler_is_old_policy,
    why_update_forward_is_not_old_policy,
)
from .shared_prompt import forward_response_shared

__all__ = [
    "OLD_LOGPROBS_SOURCES",
    "forward_response",
    "forward_response_shared",
    "head_logprobs",
    "model_dropout",
    "old_logprobs_source",
    "sampler_is_old_policy",
    "score_logprobs",
    "score_logprobs_keep_hidden",
    "token_logprobs",
    "why_update_forward_is_not_old_policy",
]
