"""Dense scoring of finished rollouts (old-policy and reference log-probs)."""
from .dense import forward_response, score_logprobs, token_logprobs

__all__ = ["forward_response", "score_logprobs", "token_logprobs"]
