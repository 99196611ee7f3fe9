"""Sparrow's two ways of spending more rollout on a step: the dense fallback (``rollout.dense_fallback``) and
acceptance-aware oversampling (``rollout.oversample``)."""

from __future__ import annotations

from ..schema import Config


def dense_fallback_needs(cfg: Config) -> list[str]:
    """The fallback re-samples on a dense cache with the learner's current weights, in the training process: a
    compressing sampler to fall back from, a synchronous rollout (weights of the rollout's own push), α not
    replayed (a replay runs the compressed sampler on every response), and not DAPO's dynamic sampling (which
    drops the same groups instead)."""
    r, m, a = cfg.rollout, cfg.mismatch, cfg.algorithm
    if not r.dense_fallback:
        return []
    errors = []
    if r.compressor == "none":
        errors.append("rollout.dense_fallback=true with rollout.compressor=none: the sampler is dense already")
    if r.async_:
        errors.append(
            "rollout.dense_fallback=true with rollout.async=true: the re-sample runs with the learner's current "
            "weights, a push newer than the rollout's; use a synchronous rollout"
        )
    if a.filter_groups:
        errors.append(
            "rollout.dense_fallback=true with algorithm.filter_groups=true: dynamic sampling drops the all-zero "
            "groups the fallback would re-sample; choose one"
        )
    if m.alpha == "exact" and (m.alpha_q == "replay" or a.distill_sparse is not None):
        errors.append(
            "rollout.dense_fallback=true with an exact α that replays the sampler (mismatch.alpha_q=replay or "
            "DistillSparse): the replay would run the compressed sampler on the dense responses; use "
            "mismatch.alpha_q=hidden or kept"
        )
    return errors


def oversample_needs(cfg: Config) -> list[str]:
    """rollout.oversample samples more than rollout.n per prompt and keeps rollout.n; the selection runs on the
    step's own rollout (not one sent ahead, whose dense-cache readings it would misalign) and is not DAPO's."""
    r, a = cfg.rollout, cfg.algorithm
    if r.oversample is None:
        if r.oversample_by != "acceptance":
            return [f"rollout.oversample_by={r.oversample_by} does nothing without rollout.oversample"]
        return []
    errors = []
    if r.oversample <= r.n:
        errors.append(
            f"rollout.oversample={r.oversample} must be more than rollout.n={r.n}: it samples that many responses "
            f"per prompt and keeps rollout.n"
        )
    if r.async_:
        errors.append("rollout.oversample with rollout.async=true is not supported: use a synchronous rollout")
    if a.filter_groups:
        errors.append(
            "rollout.oversample with algorithm.filter_groups=true: two selections of the same step; choose one"
        )
    return errors
