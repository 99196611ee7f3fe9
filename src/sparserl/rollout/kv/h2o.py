"""H2O (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models", arXiv 2306.14048): keep the "heavy hitters", the tokens with the largest attention
accumulated over all decode steps so far, plus the most recent tokens.

    score_j = sum_t sum_{h in group} softmax(q_{t,h} K^T / sqrt(d))_j

``window`` recent tokens are kept (default: half the budget, the paper's equal split between heavy
hitters and recent tokens). The engine accumulates the attention each slot receives at every decode
step (and over the prompt's own attention at prefill when the prompt is compressible); after an
eviction the kept slots keep their sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import KVCompressor, ScoreInputs, register


@register("h2o")
@dataclass
class H2O(KVCompressor):
    window: int = -1  # -1: budget // 2

    needs_attention = True

    def __post_init__(self):
        self._resolve_schedule()
        if self.window == -1:
            self.window = self.smallest_budget // 2
        super().__post_init__()

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        if inp.attn_acc is None:
            raise ValueError("h2o needs the accumulated attention")
        return inp.attn_acc[:, :, inp.region].float()
