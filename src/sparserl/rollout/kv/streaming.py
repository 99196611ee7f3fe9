"""StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks",
arXiv 2309.17453): keep the first ``sinks`` tokens (attention sinks) plus the most recent ones.

score_j = position_j (recency); the first ``sinks`` valid slots of the compressible region and the
last ``window`` are protected. With the prompt kept whole (the default), the prompt itself holds the
sequence's first tokens, and the region's first ``sinks`` tokens are kept as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CompressorOptionError, KVCompressor, ScoreInputs, register


@register("streaming")
@dataclass
class StreamingLLM(KVCompressor):
    sinks: int = 4
    window: int = 0

    def validate(self) -> None:
        super().validate()
        if self.sinks < 0 or self.sinks >= self.smallest_budget:
            raise CompressorOptionError(
                f"streaming: sinks ({self.sinks}) must be in [0, budget={self.smallest_budget})"
            )

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        return inp.positions[:, :, inp.region].float()

    def protected(self, inp: ScoreInputs) -> torch.Tensor:
        prot = super().protected(inp)
        valid = inp.valid[:, inp.region]
        rank = valid.long().cumsum(dim=-1)  # 1-based rank among valid slots
        return prot | (valid & (rank <= self.sinks))
