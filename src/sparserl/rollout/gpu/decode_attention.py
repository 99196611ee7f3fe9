"""Decode attention over the bounded KV cache in one Triton kernel, every slot of a row or only block top-k's
chosen pages, read in place (no gathered copy), with the rows' lengths and pages read on the device.

For one decode step, sequence b and KV head h with the query heads of its GQA group g = Hq / Hkv as the rows
of one tile (``q`` [g, D]), and the cache's slots S_b:

    s_j = (q · k_j) · c_j / √D,      out = Σ_j softmax(s)_j · c'_j v_j,      lse = log Σ_j exp(s_j)

- S_b = [start_b, len_b), the row's valid slots (``CompressedKVCache``'s layout: left padding below
  ``start``); with ``pages`` [B, Hkv, k] (block top-k, Sparrow's Vortex engine, Zhou et al., 2026, arXiv
  2606.08446): S_b,h = the slots start_b + p·P + [0, P) of each chosen page p ≥ 0, below len_b;
- c_j, c'_j: the per-token scales of a quantized cache (int8 / fp8 codes, :mod:`sparserl.rollout.kv_quant`,
  applied after the products as :func:`sparserl.rollout.cache.attention` does), 1 otherwise.

The softmax is the online one of FlashAttention / flash-decoding (Dao et al., 2022; running max ``m``, sum
``l``): the cache is read once, in blocks of ``BLOCK_N`` slots (or one page at a time), and no [g, L] score
matrix is written. ``lse`` comes back with ``out`` so that a compressor that needs this step's probabilities
(H2O's accumulation, the attended slots) recomputes exp(s_j − lse) for the slots it reads.

The loop runs over ``[start_b, len_b)`` read from device tensors: a step whose lengths change keeps every
tensor shape and launches the same grid, and nothing is read back to the host. Rows with no valid slot give
``out`` = 0 and ``lse`` = −inf.

``dot_f32`` casts both products' operands to float32 and multiplies them in IEEE float32 (not TF32): a float32
cache takes it, and Triton's interpreter computes 16-bit ``tl.dot`` wrongly (triton-lang/triton issue 11584), so
the interpreter tests set it; otherwise the products run in q's dtype (bfloat16 / float16) with float32
accumulation, the codes of a quantized cache widened to it (exact: |int8| ≤ 127, e4m3 has 3 mantissa bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["decode_attention", "reference_decode_attention"]

#: the running max's start: finite, so a block with no valid slot adds exp(-inf) = 0, never NaN
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _block(
    q, k_ptrs, v_ptrs, ks_ptrs, vs_ptrs, valid, d_ok, m, l, acc, qk_scale, SCALED: tl.constexpr, F32: tl.constexpr
):
    """One block of slots into the running (m, l, acc): the online softmax's update."""
    k = tl.load(k_ptrs, mask=valid[:, None] & d_ok[None, :], other=0.0)
    if F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if SCALED:
        s = s * tl.load(ks_ptrs, mask=valid, other=0.0)[None, :]
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    v = tl.load(v_ptrs, mask=valid[:, None] & d_ok[None, :], other=0.0)
    if SCALED:
        p = p * tl.load(vs_ptrs, mask=valid, other=0.0)[None, :]
    if F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    acc = acc * alpha[:, None] + pv
    return m_new, l, acc


@triton.jit
def _decode_attention_kernel(
    Q, K, V, KS, VS, START, LENS, PAGES, OUT, LSE,
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_sb, stride_sh,
    stride_pb, stride_ph,
    stride_ob, stride_oh, stride_lb,
    qk_scale, v_unit,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, N_PAGES: tl.constexpr, PAGE: tl.constexpr,
    USE_PAGES: tl.constexpr, SCALED: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(START + b)
    length = tl.load(LENS + b)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < GROUP
    d_ok = d < D
    q_rows = (h * GROUP + g)[:, None] * stride_qh
    q = tl.load(Q + b * stride_qb + q_rows + d[None, :], mask=g_ok[:, None] & d_ok[None, :])
    m = tl.full([GROUP_PAD], NEG_BIG, tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    s_base = b * stride_sb + h * stride_sh
    if USE_PAGES:
        offs = tl.arange(0, PAGE)
        for i in range(N_PAGES):
            page = tl.load(PAGES + b * stride_pb + h * stride_ph + i)
            slots = start + tl.maximum(page, 0) * PAGE + offs
            valid = (page >= 0) & (slots < length)
            m, l, acc = _block(
                q, k_base + slots[:, None] * stride_kn + d[None, :], v_base + slots[:, None] * stride_vn + d[None, :],
                KS + s_base + slots, VS + s_base + slots, valid, d_ok, m, l, acc, qk_scale, SCALED, F32,
            )  # fmt: skip
    else:
        offs = tl.arange(0, BLOCK_N)
        for n0 in range((start // BLOCK_N) * BLOCK_N, length, BLOCK_N):
            slots = n0 + offs
            valid = (slots >= start) & (slots < length)
            m, l, acc = _block(
                q, k_base + slots[:, None] * stride_kn + d[None, :], v_base + slots[:, None] * stride_vn + d[None, :],
                KS + s_base + slots, VS + s_base + slots, valid, d_ok, m, l, acc, qk_scale, SCALED, F32,
            )  # fmt: skip
    empty = l == 0.0
    out = acc * v_unit / tl.where(empty, 1.0, l)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l)))
    rows = h * GROUP + g
    tl.store(OUT + b * stride_ob + rows[:, None] * stride_oh + d[None, :], out.to(OUT.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])  # fmt: skip
    tl.store(LSE + b * stride_lb + rows, lse, mask=g_ok)


def decode_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    *,
    pages: torch.Tensor | None = None,
    page: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    unit: tuple[float, float] = (1.0, 1.0),
    block_n: int = 64,
    dot_f32: bool = False,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, D]; one layer's K, V [B, Hkv, capacity, D] (the cache's buffers, any dtype; one-byte codes with
    ``k_scale`` / ``v_scale`` [B, Hkv, capacity] float32 and the codes' ``unit`` (k, v) of
    :meth:`KVQuantizer.widen`); ``start``, ``lens`` [B] int32 on the device: each row's first valid slot and
    its length; ``pages`` [B, Hkv, k] int32 (ascending, −1 unused) of ``page`` slots each: attend to those only.
    → (out [B, Hq, D] in q's dtype, lse [B, Hq] float32), written into ``out`` / ``lse`` when given (a captured
    step's static buffers). The module docstring gives the formula."""
    B, hq, D = q.shape
    hkv = K.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    if K.stride(-1) != 1 or V.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode_attention needs q, K and V contiguous in the head dimension")
    group = hq // hkv
    scaled = k_scale is not None
    if scaled != (v_scale is not None):
        raise ValueError("a quantized cache needs both k_scale and v_scale")
    use_pages = pages is not None
    if use_pages and (page < 1 or page & (page - 1)):
        raise ValueError(f"page must be a power of two >= 1, got {page}")
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(B, hq, dtype=torch.float32, device=q.device) if lse is None else lse
    scales = k_scale if scaled else torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    v_scales = v_scale if scaled else scales
    page_ids = pages if use_pages else torch.empty(1, 1, 1, dtype=torch.int32, device=q.device)
    _decode_attention_kernel[(B, hkv)](
        q, K, V, scales, v_scales, start, lens, page_ids, out, lse,
        q.stride(0), q.stride(1),
        K.stride(0), K.stride(1), K.stride(2),
        V.stride(0), V.stride(1), V.stride(2),
        scales.stride(0), scales.stride(1),
        page_ids.stride(0), page_ids.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        unit[0] * D**-0.5, unit[1],
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=D, D_PAD=max(16, triton.next_power_of_2(D)),
        BLOCK_N=block_n, N_PAGES=page_ids.shape[-1] if use_pages else 1, PAGE=page if use_pages else 1,
        USE_PAGES=use_pages, SCALED=scaled, F32=dot_f32,
    )  # fmt: skip
    return out, lse


def reference_decode_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    *,
    pages: torch.Tensor | None = None,
    page: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    unit: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_attention`'s numbers in float64 torch, every (row, head) apart: the tests' reference."""
    B, hq, D = q.shape
    hkv, C = K.shape[1], K.shape[2]
    group = hq // hkv
    out = torch.zeros(B, hq, D, dtype=torch.float64)
    lse = torch.full((B, hq), float("-inf"), dtype=torch.float64)
    slot = torch.arange(C)
    for b in range(B):
        for h in range(hkv):
            valid = (slot >= int(start[b])) & (slot < int(lens[b]))
            if pages is not None:
                chosen = torch.zeros(C, dtype=torch.bool)
                for p in pages[b, h].tolist():
                    if p >= 0:
                        chosen[int(start[b]) + p * page : int(start[b]) + (p + 1) * page] = True
                valid &= chosen
            if not valid.any():
                continue
            k = K[b, h, valid].double()
            v = V[b, h, valid].double()
            ck = k_scale[b, h, valid].double() * unit[0] if k_scale is not None else 1.0
            cv = v_scale[b, h, valid].double() * unit[1] if v_scale is not None else 1.0
            qg = q[b, h * group : (h + 1) * group].double()
            s = (qg @ k.T) * ck / D**0.5
            lse[b, h * group : (h + 1) * group] = torch.logsumexp(s, -1)
            out[b, h * group : (h + 1) * group] = (s.softmax(-1) * cv) @ v
    return out, lse
