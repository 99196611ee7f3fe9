"""LoRA's options."""

from __future__ import annotations

from ..schema import Config
from .given import given


def lora_unused(cfg: Config) -> list[str]:
    """train.lora_target, lora_alpha and lora_dropout shape the adapters; train.lora_rank=0 trains none."""
    t = cfg.train
    if t.lora_rank:
        return []
    keys = [k for k in ("lora_target", "lora_alpha", "lora_dropout") if given(t, k)]
    if keys:
        return [
            f"{', '.join(f'train.{k}={getattr(t, k)!r}' for k in keys)} do{'es' if len(keys) == 1 else ''} "
            "nothing with train.lora_rank=0 (all weights train, no adapters); set train.lora_rank, or leave "
            f"{'it' if len(keys) == 1 else 'them'} out"
        ]
    return []
