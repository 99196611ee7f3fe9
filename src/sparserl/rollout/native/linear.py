"""``linear.c``: the decode step's float32 weight products ``x Wᵀ (+ b)`` for a few rows, on weights
packed once in panels (:func:`pack_linear`; :func:`sparserl.rollout.model.linear` uses it).
"""

from __future__ import annotations

import torch

from . import compiler
from .operands import product_io


def pack_linear(w: torch.Tensor, lib=None) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → its panels for :func:`linear` (``linear.c``: ``Wp[p][k][j] =
    W[NR p + j][k]``, NR = 24, or 32 where the build has AVX512; zero past N),
    or None when the library is not available."""
    lib = lib or compiler.library()
    return None if lib is None else pack_panels(w, lib, lib.sparserl_linear_panel_width())


def pack_panels(w: torch.Tensor, lib, width: int) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → panels of ``width`` columns, ``Wp[p][k][j] = W[width p + j][k]``
    (``linear.c``'s ``sparserl_pack_panels``), with ``out_features``, ``in_features`` attached."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2:
        return None
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // width) * width * K, dtype=torch.float32)
    lib.sparserl_pack_panels(N, K, width, w.data_ptr(), packed.data_ptr())
    packed.out_features, packed.in_features = N, K  # what the panels hold
    return packed


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None = None,
    lib=None,
    add_to: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``x Wᵀ (+ bias)`` on the C kernel, W given as :func:`pack_linear`'s panels; x [..., K] float32.
    ``add_to`` [..., N] (contiguous): the product is added to it in place and it is returned. None
    when the kernel does not take this input (the caller runs torch)."""
    lib = compiler.lib_for(lib, x, packed, *(t for t in (bias, add_to) if t is not None))
    if lib is None:
        return None
    io = product_io(x, packed.out_features, packed.in_features, bias, add_to)
    if io is None:
        return None
    x2, rows, out, N, K = io
    if (
        rows
        and lib.sparserl_linear(
            rows,
            N,
            K,
            x2.data_ptr(),
            x2.stride(0),
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            N,
            int(add_to is not None),
        )
        != 0
    ):
        return None
    return out
