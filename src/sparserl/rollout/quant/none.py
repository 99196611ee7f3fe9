"""``none``: full-precision weights (the sampler's dtype); the float path of ``linear()``."""

from __future__ import annotations

import torch

from .base import QUANTS, WeightQuantizer


@QUANTS.register("none")
class NoQuant(WeightQuantizer):
    name = "none"
    quantizes = False

    def quantize(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def kernel_on(self, device) -> str:
        return "float"
