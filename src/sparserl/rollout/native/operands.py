"""A weight product's operands as the kernels take them: rows of unit stride, an output buffer."""

from __future__ import annotations

import torch


def rows_view(x: torch.Tensor) -> torch.Tensor | None:
    """x [..., n] as a [rows, n] view with unit stride along n, or None when it cannot be one."""
    try:
        x2 = x.view(-1, x.shape[-1])
    except RuntimeError:
        return None
    return x2 if x2.stride(-1) == 1 else None


def product_io(x: torch.Tensor, N: int, K: int, bias: torch.Tensor | None, add_to: torch.Tensor | None):
    """A product's operands as the kernels take them: (x as [rows, K] rows, rows, the output [..., N] float32
    (``add_to`` itself when given), N, K), or None when x, bias or add_to do not fit."""
    if x.shape[-1] != K or (bias is not None and (not bias.is_contiguous() or bias.numel() != N)):
        return None
    x2 = rows_view(x)
    if x2 is None:
        x2 = x.reshape(-1, K).contiguous()
    rows = x2.shape[0]
    if add_to is not None and (not add_to.is_contiguous() or add_to.numel() != rows * N):
        return None
    out = add_to if add_to is not None else torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    return x2, rows, out, N, K
