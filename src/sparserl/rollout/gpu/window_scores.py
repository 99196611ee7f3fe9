"""The observation window's attention over the cache (SnapKV's importance, Li et al., 2024, arXiv 2404.14469; R-KV's
importance term, Cai et al., 2025, arXiv 2505.24133) in one Triton kernel, without writing the [w, L] scores.

For one (sequence, query head) with the window's queries q_0..q_{w−1} (query i at slot L − w + i, seeing the valid
keys up to its own slot) and keys k_0..k_{L−1}:

    a_j = (1 / w) Σ_i softmax_j(q_i · k_j / √D),      then over the g query heads of a GQA group: max or mean

(:func:`sparserl.rollout.kv.base.window_attention`, the reference). Each program holds one query head's window as
the rows of a tile and reads the keys twice in blocks: the first pass keeps each query's running max and sum (its
log-sum-exp), the second adds exp(s − lse) / w per key. The group's reduction over [n, Hq, L] is one torch op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["window_scores"]


@triton.jit
def _scores(Q, K, VALID, q_base, k_base, n, rows, w_ok, d, j, L, W, stride_ql, stride_kl, stride_vn,
            D: tl.constexpr, F32: tl.constexpr):  # fmt: skip
    """s [rows, block] of the window's queries against keys ``j``, masked (causal, valid) to −inf."""
    q = tl.load(Q + q_base + rows[:, None] * stride_ql + d[None, :], mask=w_ok[:, None] & (d < D)[None, :], other=0.0)
    j_ok = (j < L) & (tl.load(VALID + n * stride_vn + j, mask=j < L, other=0) != 0)
    k = tl.load(K + k_base + j[:, None] * stride_kl + d[None, :], mask=j_ok[:, None] & (d < D)[None, :], other=0.0)
    s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") if F32 else tl.dot(
        q, tl.trans(k.to(q.dtype)))  # fmt: skip
    seen = j_ok[None, :] & (j[None, :] <= (L - W + rows)[:, None]) & w_ok[:, None]
    return tl.where(seen, s * (D**-0.5), float("-inf"))


@triton.jit
def _window_kernel(
    Q, K, VALID, OUT,
    L, W,
    stride_qn, stride_qh, stride_ql,
    stride_kn, stride_kh, stride_kl,
    stride_vn, stride_on, stride_oh,
    GROUP: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, W_PAD: tl.constexpr, BLOCK: tl.constexpr,
    F32: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.arange(0, W_PAD)
    w_ok = rows < W
    d = tl.arange(0, D_PAD)
    q_base = n * stride_qn + h * stride_qh
    k_base = n * stride_kn + (h // GROUP) * stride_kh
    m = tl.full([W_PAD], -1.0e30, tl.float32)
    total = tl.zeros([W_PAD], tl.float32)
    for j0 in range(0, L, BLOCK):
        s = _scores(Q, K, VALID, q_base, k_base, n, rows, w_ok, d, j0 + tl.arange(0, BLOCK), L, W,
                    stride_ql, stride_kl, stride_vn, D, F32)  # fmt: skip
        m_new = tl.maximum(m, tl.max(s, axis=1))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), axis=1)
        m = m_new
    empty = total == 0.0
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, total)))  # a query that sees nothing adds 0
    for j0 in range(0, L, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        s = _scores(Q, K, VALID, q_base, k_base, n, rows, w_ok, d, j, L, W, stride_ql, stride_kl, stride_vn, D, F32)
        a = tl.sum(tl.exp(s - lse[:, None]), axis=0) / W
        tl.store(OUT + n * stride_on + h * stride_oh + j, a, mask=j < L)


def window_scores(
    queries: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, reduce_group: str = "max", block: int = 32,
    dot_f32: bool = False,
) -> torch.Tensor:  # fmt: skip
    """queries [n, Hq, w, D] (the last w, oldest first), keys [n, Hkv, L, D], valid [n, L] bool → the window's mean
    attention per key [n, Hkv, L] float32, the GQA group reduced by ``reduce_group`` (``max`` | ``mean``), as
    :func:`sparserl.rollout.kv.base.window_attention`. ``dot_f32``: IEEE float32 products (float32 caches, and
    Triton's interpreter, whose 16-bit ``tl.dot`` is wrong)."""
    n, hq, w, D = queries.shape
    hkv, L = keys.shape[1], keys.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    if reduce_group not in ("max", "mean"):
        raise ValueError(f"reduce_group must be 'max' or 'mean', got {reduce_group!r}")
    if queries.stride(-1) != 1 or keys.stride(-1) != 1:
        raise ValueError("window_scores needs queries and keys contiguous in the head dimension")
    valid_u8 = valid.to(torch.uint8).contiguous()
    out = torch.empty(n, hq, L, dtype=torch.float32, device=keys.device)
    if out.numel():
        _window_kernel[(n, hq)](
            queries, keys, valid_u8, out,
            L, w,
            queries.stride(0), queries.stride(1), queries.stride(2),
            keys.stride(0), keys.stride(1), keys.stride(2),
            valid_u8.stride(0), out.stride(0), out.stride(1),
            GROUP=hq // hkv, D=D, D_PAD=max(16, triton.next_power_of_2(D)),
            W_PAD=max(16, triton.next_power_of_2(w)), BLOCK=block, F32=dot_f32,
        )  # fmt: skip
    per_head = out.view(n, hkv, hq // hkv, L)
    return per_head.amax(dim=2) if reduce_group == "max" else per_head.mean(dim=2)
