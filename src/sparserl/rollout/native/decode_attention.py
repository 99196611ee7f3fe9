"""``decode_attention.c``: the fused decode attention, which the cache's
:func:`sparserl.rollout.cache.attention` uses on CPU for float32 / bfloat16 K/V and int8 / fp8 KV codes.
"""

from __future__ import annotations

import torch

from . import compiler

KV_TYPES = {torch.float32: 0, torch.int8: 1, torch.float8_e4m3fn: 2, torch.bfloat16: 3}  # the kernel's kv_type codes
UNIT = {torch.float32: 1.0, torch.int8: 1.0, torch.float8_e4m3fn: 256.0, torch.bfloat16: 1.0}  # fp8: code * 2^-8
SCALED_KV = (torch.int8, torch.float8_e4m3fn)  # KV codes that come with per-token scales


def decode_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    bias: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    lib=None,
):
    """The C kernel's softmax(q Kᵀ/√D + bias) V (shapes as :func:`sparserl.rollout.cache.attention`:
    q [B, Hq, 1, D] float32; K/V [B, Hkv, capacity, D] float32 or bfloat16 (the bf16 sampler's cache,
    read as the same values in float32), or int8 / float8_e4m3fn codes with
    ``k_scale`` / ``v_scale`` [B, Hkv, capacity] float32; bias [B, 1, 1, L] float32) → (out [B, Hq * D],
    p [B, Hkv, g, L] float32), or None when this input is not one the kernel takes (the caller then
    runs torch). ``lib``: another build of the kernel (tests), else :func:`library`."""
    lib = compiler.running(lib)
    if lib is None or q.device.type != "cpu" or q.dtype != torch.float32 or torch.compiler.is_compiling():
        return None
    kv_type = KV_TYPES.get(K.dtype)
    if kv_type is None or K.dtype != V.dtype or (K.dtype in SCALED_KV) != (k_scale is not None):
        return None
    B, hq, _, D = q.shape
    hkv, L = K.shape[1], bias.shape[-1]
    if (
        q.stride(-1) != 1
        or K.stride() != V.stride()
        or K.stride(-1) != 1
        or hq % hkv
        or bias.dtype != torch.float32
        or not bias.is_contiguous()
        or L > K.shape[2]
    ):
        return None
    if k_scale is not None and (
        k_scale.stride() != v_scale.stride()
        or k_scale.stride(-1) != 1
        or k_scale.dtype != torch.float32
        or v_scale.dtype != torch.float32
    ):
        return None
    g = hq // hkv
    out = torch.empty(B, hq * D, dtype=torch.float32)
    p = torch.empty(B, hkv, g, L, dtype=torch.float32)
    ks_ptr = vs_ptr = None
    s_sb = s_sh = 0
    if k_scale is not None:
        ks_ptr, vs_ptr = k_scale.data_ptr(), v_scale.data_ptr()
        s_sb, s_sh = k_scale.stride(0), k_scale.stride(1)
    unit = UNIT[K.dtype]
    rc = lib.sparserl_decode_attention(
        B,
        hq,
        hkv,
        L,
        D,
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        K.data_ptr(),
        V.data_ptr(),
        K.stride(0),
        K.stride(1),
        K.stride(2),
        ks_ptr,
        vs_ptr,
        s_sb,
        s_sh,
        kv_type,
        bias.data_ptr(),
        L,
        D**-0.5 * unit,
        unit,
        out.data_ptr(),
        p.data_ptr(),
    )
    return None if rc != 0 else (out, p)
