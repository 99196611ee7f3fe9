"""The one builder of a sampler from a config's ``rollout`` section: the trainer's engine and every
rollout worker's (:mod:`sparserl.cluster.worker`) come from here, so they cannot differ."""

from __future__ import annotations

from typing import Any

from .engine import RolloutEngine
from .kv import compressor_from_fields


def sampler_section(cfg: Any) -> Any:
    """``cfg.rollout`` with the dtype this run's sampler takes: ``auto`` means float32 under
    ``algorithm.distill_sparse``, whose float32 replay reproduces which tokens the sampler read, not a
    bf16 step's rounding (an explicit half-precision dtype with it is a config error). The trainer and
    every rollout worker build from this section."""
    r = cfg.rollout
    if cfg.algorithm.distill_sparse is not None and r.dtype == "auto":
        return r.model_copy(update={"dtype": "float32"})
    return r


def engine_from_fields(lm, r: Any, weights: dict | None = None) -> RolloutEngine:
    """A :class:`RolloutEngine` over the loaded model ``lm`` with the compressor, dtype, quantization and
    KV storage of ``r`` (a ``rollout`` section, or anything with its fields); ``weights``: the state dict it
    starts from (None: ``lm.model``'s)."""
    return RolloutEngine(
        lm,
        compressor_from_fields(r),
        dtype=r.dtype,
        compile=r.compile,
        quant=r.quant,
        kv_quant=r.kv_quant,
        quant_smooth=r.quant_smooth,
        quant_group=r.quant_group,
        quant_outliers=r.quant_outliers,
        quant_head=r.quant_head,
        weights=weights,
        static=r.static_step,
        static_check_every=r.static_check_every,
        fp32_head=r.fp32_head,
    )
