"""SnapKV (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before Generation",
arXiv 2404.14469): the importance of a cached token is the attention the observation window pays to
it, smoothed by pooling.

    importance_j = pool_k( mean_{i in window} softmax(q_i K^T / sqrt(d))_j ),   k = kernel

query heads of a GQA group are averaged; keep the top ``budget - window`` plus the window. The
original compresses the prompt once (window 32, avg-pool kernel 5, per head); Sparse-RL applies it
at decode time with R-KV's budget and period, which is what the engine does (``compress_prompt``
adds the prompt to the region).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CompressorOptionError, KVCompressor, ScoreInputs, pool1d, register, window_attention


@register("snapkv")
@dataclass
class SnapKV(KVCompressor):
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"
    per_head: bool = True

    needs_queries = True

    def validate(self) -> None:
        super().validate()
        if self.window < 1:
            raise CompressorOptionError("snapkv: window must be >= 1 (it is the observation window)")
        if self.pooling not in ("avg", "max"):
            raise CompressorOptionError(f"snapkv: pooling must be 'avg' or 'max', got {self.pooling!r}")

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        attn = window_attention(inp, reduce_group="mean")[:, :, inp.region]
        return pool1d(attn, self.kernel, self.pooling)
