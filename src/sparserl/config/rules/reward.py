"""The reward: the spec of reward.fn and reward.weights, DAPO's overlong buffer."""

from __future__ import annotations

from ..schema import Config


def overlong_buffer_fits(cfg: Config) -> list[str]:
    """DAPO's buffer is the last len tokens before rollout.max_new_tokens."""
    ob, limit = cfg.reward.overlong_buffer, cfg.rollout.max_new_tokens
    if ob is not None and ob.len > limit:
        return [
            f"reward.overlong_buffer.len={ob.len} is more than rollout.max_new_tokens={limit}: the buffer "
            "is the last len tokens before the limit"
        ]
    return []


def reward_spec(cfg: Config) -> list[str]:
    """reward.fn names built-ins or module:function specs, with one weight each when weights are given
    (the spec's form only; :func:`sparserl.preflight.preflight` imports the modules)."""
    from ...reward.weighted import spec_problem

    problem = spec_problem(cfg.reward.fn, cfg.reward.weights)
    return [] if problem is None else [problem]
