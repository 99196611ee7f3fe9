"""R-KV's redundancy score (Cai et al., 2025, arXiv 2505.24133) in one Triton kernel that never writes the
[L, L] similarity matrix: each program streams one block of keys' rows against every key, in tiles.

For one (sequence, KV head) with keys k_0..k_{L-1}, validity v and threshold θ (0.5), the reference
(:func:`sparserl.rollout.kv.rkv.redundancy`) builds

    S_ij = cos(k_i, k_j)  if i ≠ j, v_i, v_j and cos(k_i, k_j) > θ,  else 0;
    last(i) = max{j : S_ij > 0};   S_i,last(i) := 0 when last(i) > i   (the newest copy is not redundant);
    red_j = softmax_j over the valid keys of (1 / #valid) Σ_i S_ij.

S is symmetric before the retain rule, so a column's sum is its row's: the kernel computes, for each row i,
``Σ_j S_ij`` and (last(i), S_i,last(i)), and the retained entries are then taken off their columns with one
``scatter_add`` on the device: red_j·#valid = Σ_j S_ij − Σ_{i: last(i) = j > i} S_ij. The tiles' products run
in IEEE float32 (not TF32: the threshold decides on them) on normalised keys, k / (‖k‖ + 1e-8), as the reference's do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rkv_block", "rkv_redundancy"]


@triton.jit
def _normalised(K, base, idx, valid, d, D: tl.constexpr, stride_n):
    """Rows ``idx`` of one (sequence, head)'s keys, float32, divided by their norm + 1e-8; 0 where invalid."""
    k = tl.load(K + base + idx[:, None] * stride_n + d[None, :], mask=valid[:, None] & (d < D)[None, :], other=0.0)
    k = k.to(tl.float32)
    return k / (tl.sqrt(tl.sum(k * k, axis=1)) + 1e-8)[:, None]


@triton.jit
def _rkv_rows_kernel(
    K, VALID, ROWSUM, LAST, LAST_VAL,
    L, threshold,
    stride_kn_, stride_kh, stride_kl,
    stride_vn,
    H: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)  # n * H + h
    n = pair // H
    h = pair % H
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D_PAD)
    base = n * stride_kn_ + h * stride_kh
    i_ok = (i < L) & (tl.load(VALID + n * stride_vn + i, mask=i < L, other=0) != 0)
    ki = _normalised(K, base, i, i_ok, d, D, stride_kl)
    rowsum = tl.zeros([BLOCK], tl.float32)
    last = tl.full([BLOCK], -1, tl.int32)
    last_val = tl.zeros([BLOCK], tl.float32)
    for j0 in range(0, L, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        j_ok = (j < L) & (tl.load(VALID + n * stride_vn + j, mask=j < L, other=0) != 0)
        kj = _normalised(K, base, j, j_ok, d, D, stride_kl)
        s = tl.dot(ki, tl.trans(kj), input_precision="tf32x3")  # ~float32: the threshold reads it
        keep = (s > threshold) & i_ok[:, None] & j_ok[None, :] & (i[:, None] != j[None, :])
        s = tl.where(keep, s, 0.0)
        rowsum += tl.sum(s, axis=1)
        j_max = tl.max(tl.where(keep, j[None, :], -1), axis=1)
        newer = j_max > last
        val = tl.sum(tl.where(j[None, :] == j_max[:, None], s, 0.0), axis=1)
        last = tl.where(newer, j_max, last)
        last_val = tl.where(newer, val, last_val)
    out = pair * L + i
    tl.store(ROWSUM + out, rowsum, mask=i < L)
    tl.store(LAST + out, last, mask=i < L)
    tl.store(LAST_VAL + out, last_val, mask=i < L)


def rkv_block(head_dim: int) -> int:
    """Keys per tile: 32 up to head dim 64, 16 above (at 32 x 128 the float32-accurate product spills on sm_90,
    :mod:`.resources`)."""
    return 32 if head_dim <= 64 else 16


def rkv_redundancy(
    keys: torch.Tensor, valid: torch.Tensor, threshold: float = 0.5, block: int | None = None
) -> torch.Tensor:
    """keys [n, H, L, D] (any float dtype, unit stride in D), valid [n, L] bool → R-KV's redundancy [n, H, L]
    float32, softmax over the valid keys (0 on the invalid ones), as :func:`sparserl.rollout.kv.rkv.redundancy`
    gives it; no [L, L] matrix, no host sync."""
    n, H, L, D = keys.shape
    if keys.stride(-1) != 1:
        raise ValueError("rkv_redundancy needs keys contiguous in the head dimension")
    if valid.shape != (n, L):
        raise ValueError(f"valid must be [{n}, {L}], got {list(valid.shape)}")
    block = block or rkv_block(D)
    valid_u8 = valid.to(torch.uint8).contiguous()
    rowsum = torch.empty(n, H, L, dtype=torch.float32, device=keys.device)
    last = torch.empty(n, H, L, dtype=torch.int32, device=keys.device)
    last_val = torch.empty_like(rowsum)
    if rowsum.numel():
        _rkv_rows_kernel[(n * H, triton.cdiv(L, block))](
            keys, valid_u8, rowsum, last, last_val,
            L, float(threshold),
            keys.stride(0), keys.stride(1), keys.stride(2),
            valid_u8.stride(0),
            H=H, D=D, D_PAD=max(16, triton.next_power_of_2(D)), BLOCK=block,
        )  # fmt: skip
    row = torch.arange(L, device=keys.device, dtype=torch.int32)
    retained = last > row  # the newest similar key of row i, newer than i: its entry is not counted
    rowsum.scatter_add_(-1, last.clamp(min=0).long(), -(last_val * retained))
    mean = rowsum / valid.sum(-1).clamp(min=1)[:, None, None].float()
    return mean.masked_fill_(~valid[:, None, :], float("-inf")).softmax(dim=-1).nan_to_num(0.0)
