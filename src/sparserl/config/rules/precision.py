"""The learner's precision."""

from __future__ import annotations

from ..schema import Config


def mixed_precision_weights(cfg: Config) -> list[str]:
    """model.mixed_precision=bfloat16 keeps float32 weights: it needs model.dtype=float32."""
    m = cfg.model
    if m.mixed_precision == "bfloat16" and m.dtype != "float32":
        return [
            f"model.mixed_precision={m.mixed_precision} keeps float32 weights and computes in 16 bits; with "
            f"model.dtype={m.dtype} the weights are 16-bit already: set model.dtype=float32, or "
            "model.mixed_precision=off"
        ]
    return []
