"""``none``: the dense cache, as a null compressor.

It never compresses (``compresses`` is False, :meth:`due` is never true) and its buffers hold the
whole sequence, ``capacity = prompt + max_new``, so the engine and the cache run one code path for
dense and sparse sampling. It accepts the common options (``budget``, ``window``...) so that a
config can switch to ``compressor: none`` without clearing them; they are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import KVCompressor, ScoreInputs, register


@register("none")
@dataclass
class Dense(KVCompressor):
    def validate(self) -> None:
        """Nothing to check: a dense cache uses none of the common options."""

    @property
    def compresses(self) -> bool:
        return False

    def capacity(self, prompt_len: int, max_new: int) -> int:
        return prompt_len + max_new

    def due(
        self,
        region_len: torch.Tensor,
        newline: torch.Tensor | None = None,
        remaining: int | None = None,
        seq_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return torch.zeros_like(region_len, dtype=torch.bool)

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        raise RuntimeError("the dense cache ('none') never compresses")
