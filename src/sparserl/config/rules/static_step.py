"""The static decode step (rollout.static_step) against what replays the sampler's cache."""

from __future__ import annotations

from ..schema import Config
from .given import given


def static_step_and_replay(cfg: Config) -> list[str]:
    """A compressing cache on the static step is compressed when the host reads its due flags, every
    ``rollout.static_check_every`` steps: up to k − 1 tokens after the eager engine would. A replay of the sampler
    (``mismatch.alpha_q=replay``, ``kept`` beyond its record limit, DistillSparse) runs the eager engine, so it would
    not reproduce that cache: refused, naming the keys that make them agree."""
    r, m = cfg.rollout, cfg.mismatch
    if not r.static_step or r.static_check_every == 1 or r.compressor == "none":
        return []
    replays = (m.alpha == "exact" and m.alpha_q != "hidden") or cfg.algorithm.distill_sparse is not None
    if not replays:
        return []
    distill = cfg.algorithm.distill_sparse is not None
    what = "algorithm.distill_sparse" if distill else f"mismatch.alpha_q={m.alpha_q}"
    fix = "rollout.static_check_every=1" + ("" if distill else ", or mismatch.alpha_q=hidden")
    return [
        f"rollout.static_step with rollout.static_check_every={r.static_check_every} compresses up to "
        f"{r.static_check_every - 1} tokens later than the eager replay that {what} runs: set {fix}"
    ]


def unused_static_check_every(cfg: Config) -> list[str]:
    """``rollout.static_check_every`` does nothing without ``rollout.static_step``."""
    r = cfg.rollout
    if not r.static_step and given(r, "static_check_every"):
        return ["rollout.static_check_every does nothing without rollout.static_step=true; set both, or neither"]
    return []
