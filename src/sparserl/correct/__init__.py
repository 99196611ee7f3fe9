"""Corrections of the sampler/dense mismatch: one file per published method, a registry, presets.

Usage from the training loop::

    from sparserl.correct import apply_corrections
    corr = apply_corrections("sparse_rl", sampler_logprobs, old_logprobs, mask)
    # corr.weights, corr.mask, corr.behaviour_logprobs, corr.clip_upper_scale, corr.metrics

See ``base.py`` for conventions and the recipe for adding a method.
"""

# importing the method modules registers them
from . import bypass, double_min, icepop, mis, none, rejection, seq_mask_tis, sparse_rl, tis, trl_is  # noqa: F401  (imported to register them)
from .base import (
    CORRECTION_KEYS,
    MISMATCH_KEYS,
    Correction,
    CorrectionFn,
    available_corrections,
    batch_normalize,
    build_correction,
    compose,
    get_correction,
    importance_ratio,
    log_ratio,
    merge_corrections,
    mismatch_metrics,
    register_correction,
    weight_metrics,
)
from .presets import PRESETS, apply_corrections, available_presets, resolve

__all__ = [
    "Correction",
    "CorrectionFn",
    "CORRECTION_KEYS",
    "MISMATCH_KEYS",
    "PRESETS",
    "apply_corrections",
    "available_corrections",
    "available_presets",
    "batch_normalize",
    "build_correction",
    "compose",
    "get_correction",
    "importance_ratio",
    "log_ratio",
    "merge_corrections",
    "mismatch_metrics",
    "register_correction",
    "resolve",
    "weight_metrics",
]
