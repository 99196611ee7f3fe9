"""R-KV (Cai et al., 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models",
arXiv 2505.24133): decode-time compression for long reasoning traces that keeps tokens that are both
important and not redundant.

- importance_j = maxpool_k( mean_{i in window} softmax(q_i K^T / sqrt(d))_j ), window w = 8, kernel
  7; the query heads of one GQA group are reduced by max;
- redundancy: S = cos(K, K) with the diagonal zeroed and entries <= threshold (0.5) dropped; for each
  key i the most recent key similar to it, when newer than i, is "retained" (S_i,last zeroed: the
  newest copy of a repeated thought is not counted redundant); redundancy_j = softmax_j(mean_i S_ij);
- score_j = λ·importance_j − (1 − λ)·redundancy_j, λ = 0.1 (paper; the code uses 0.07);
- keep the top ``budget − w`` by score plus the last ``w`` tokens, in position order.

``per_head=True`` selects per KV head (the original); ``per_head=False`` shares one index set across
the heads of a layer with scores summed over heads (Sparse-RL's variant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import native
from ..gpu import triton_available
from .base import CompressorOptionError, KVCompressor, ScoreInputs, pool1d, register, window_attention


def redundancy(keys: torch.Tensor, valid: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """R-KV redundancy of each key, [n, h, L] → [n, h, L] (softmax over the valid keys).

    Cost: one [L, L] similarity matrix per (sequence, head) and a few passes over it; the passes
    are single fused kernels (``threshold_`` drops the entries at or below the threshold in place,
    ``where`` + ``amax`` finds each row's most recent similar key), ~2x cheaper than the
    compare / masked-fill / multiply chain they replace, with the same values. On CPU (float32 or bf16 keys) the
    C kernel (``native/kv_scores.c``) computes the same means without building the matrix
    (7.6x faster at batch 16, ``docs/results/compression_cost.md``), on CUDA the Triton kernel
    (:mod:`sparserl.rollout.gpu.rkv_redundancy`); this torch code is their reference and the path elsewhere."""
    mean = native.rkv_redundancy(keys, valid, threshold)
    if mean is not None:
        return mean.masked_fill_(~valid[:, None, :], float("-inf")).softmax(dim=-1).nan_to_num(0.0)
    if keys.is_cuda and triton_available():  # the Triton kernel: no [L, L] matrix (sparserl.rollout.gpu)
        from ..gpu.rkv_redundancy import rkv_redundancy

        return rkv_redundancy(keys.contiguous(), valid, threshold)
    k = keys.float()
    k = k / (k.norm(dim=-1, keepdim=True) + 1e-8)
    sim = torch.matmul(k, k.transpose(-1, -2))  # [n, h, L, L]
    L = sim.shape[-1]
    sim.diagonal(dim1=-2, dim2=-1).zero_()
    if not bool(valid.all()):
        pair = valid[:, None, :, None] & valid[:, None, None, :]
        sim.masked_fill_(~pair, 0.0)
    F.threshold_(sim, threshold, 0.0)  # entries at or below the threshold are dropped
    # retain the most recent key of each similar set: in row i, the similarity to the most recent
    # key similar to i is not counted when that key is newer than i (so the newest copy scores 0)
    ar = torch.arange(1, L + 1, device=sim.device, dtype=sim.dtype)
    last = torch.where(sim > 0, ar, 0.0).amax(dim=-1, keepdim=True).long() - 1  # [n, h, L, 1], -1 when none
    row = torch.arange(L, device=sim.device)[:, None]
    sim.scatter_(-1, torch.where(last > row, last, row), 0.0)  # (row i, i) is the zeroed diagonal
    nvalid = valid.sum(-1).clamp(min=1)[:, None, None].float()
    red = sim.sum(dim=-2) / nvalid  # mean over the rows i (valid ones)
    red = red.masked_fill(~valid[:, None, :], float("-inf"))
    return red.softmax(dim=-1).nan_to_num(0.0)


@register("rkv")
@dataclass
class RKV(KVCompressor):
    window: int = 8
    kernel: int = 7
    lam: float = 0.1
    threshold: float = 0.5
    per_head: bool = True

    needs_queries = True

    def validate(self) -> None:
        super().validate()
        if self.window < 1:
            raise CompressorOptionError("rkv: window must be >= 1 (it is the observation window)")
        if not 0.0 <= self.lam <= 1.0:
            raise CompressorOptionError(f"rkv: lam must be in [0, 1], got {self.lam}")

    def score_bytes(self, n: int, n_kv: int, n_heads: int, length: int, head_dim: int) -> int:
        """The base's, plus the [L, L] similarity matrix per head and its two passes."""
        return super().score_bytes(n, n_kv, n_heads, length, head_dim) + n * n_kv * length * length * 9

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        imp = pool1d(window_attention(inp, reduce_group="max")[:, :, inp.region], self.kernel, "max")
        red = redundancy(inp.region_keys, inp.valid[:, inp.region], self.threshold)
        return self.lam * imp - (1.0 - self.lam) * red
