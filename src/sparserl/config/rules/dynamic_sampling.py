"""DAPO's dynamic sampling (algorithm.filter_groups)."""

from __future__ import annotations

from ..schema import Config
from .given import given


def filter_groups(cfg: Config) -> list[str]:
    """Dynamic sampling decides from a step's rewards, in groups of several responses."""
    a, r = cfg.algorithm, cfg.rollout
    errors: list[str] = []
    if a.filter_groups and r.async_:
        errors.append(
            "algorithm.filter_groups=true with rollout.async=true: dynamic sampling decides from a step's "
            "rewards whether to sample more, which the one-step-ahead rollout has already sent"
        )
    if a.filter_groups and r.n < 2:
        errors.append(
            f"algorithm.filter_groups=true with rollout.n={r.n}: a group of one response never has "
            "rewards that differ; set rollout.n >= 2"
        )
    return errors


def max_gen_batches_unused(cfg: Config) -> list[str]:
    """algorithm.max_gen_batches bounds dynamic sampling; without it a step samples one batch."""
    a = cfg.algorithm
    if not a.filter_groups and given(a, "max_gen_batches"):
        return [
            f"algorithm.max_gen_batches={a.max_gen_batches} does nothing without algorithm.filter_groups=true "
            "(a step samples one batch); set algorithm.filter_groups=true, or leave max_gen_batches out"
        ]
    return []
