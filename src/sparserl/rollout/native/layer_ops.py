"""``layer_ops.c``: the small operators of a layer, each in one pass: RMSNorm (:func:`rms_norm`),
SiLU(gate)·up (:func:`silu_mul`) and RoPE in place (:func:`rope_`).
"""

from __future__ import annotations

import torch

from . import compiler
from .operands import rows_view


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, lib=None) -> torch.Tensor | None:
    """``x / sqrt(mean(x²) + eps) · w`` over the last dimension (``layer_ops.c``), or None."""
    lib = compiler.lib_for(lib, x, w)
    x2 = None if lib is None or not w.is_contiguous() or w.numel() != x.shape[-1] else rows_view(x)
    if x2 is None:
        return None
    out = torch.empty(x.shape, dtype=torch.float32)
    lib.sparserl_rms_norm(
        x2.shape[0], x2.shape[1], x2.data_ptr(), x2.stride(0), w.data_ptr(), eps, out.data_ptr(), x2.shape[1]
    )
    return out


def silu_mul(gate_up: torch.Tensor, lib=None) -> torch.Tensor | None:
    """``silu(g) · u`` for ``gate_up = [g | u]`` [..., 2 I] → [..., I] (``layer_ops.c``), or None."""
    lib = compiler.lib_for(lib, gate_up)
    x2 = None if lib is None or gate_up.shape[-1] % 2 else rows_view(gate_up)
    if x2 is None:
        return None
    inter = x2.shape[1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=torch.float32)
    lib.sparserl_silu_mul(x2.shape[0], inter, x2.data_ptr(), x2.stride(0), out.data_ptr(), inter)
    return out


def rope_(x: torch.Tensor, n_heads: int, cos: torch.Tensor, sin: torch.Tensor, lib=None) -> bool:
    """RoPE in place on the first ``n_heads`` heads of x [..., H, D] (contiguous), with cos / sin
    [..., D] (one row per row of x, contiguous): ``x·cos + rotate_half(x)·sin`` (``layer_ops.c``).
    False when the kernel does not take this input (x untouched)."""
    lib = compiler.lib_for(lib, x, cos, sin)
    if lib is None or not (x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()) or x.dim() < 2:
        return False
    H, D = x.shape[-2:]
    rows = x.numel() // (H * D) if H * D else 0
    if D % 2 or n_heads > H or cos.shape != sin.shape or cos.shape[-1] != D or cos.numel() != rows * D:
        return False
    if rows:
        lib.sparserl_rope(rows, n_heads, D, x.data_ptr(), H * D, cos.data_ptr(), sin.data_ptr(), D)
    return True
