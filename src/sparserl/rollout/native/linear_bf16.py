"""``linear_bf16.c``: the weight products in bfloat16, ``x Wᵀ (+ b)`` with x rounded to bf16 in the call and
float32 sums (:func:`pack_linear_bf16`, :func:`linear_bf16`): AVX512-BF16's ``vdpbf16ps``, AMX tiles where
the CPU has them (:func:`bf16_kernel` says which runs), AVX2 or plain C elsewhere; the bf16 sampler's
fused step (:mod:`sparserl.rollout.fused`) multiplies by its weights here.
"""

from __future__ import annotations

import torch

from . import compiler
from .operands import product_io

#: ``linear_bf16.c``'s kernels by their code (``sparserl_bf16_kernel``)
BF16_KERNELS = ("c", "avx2", "avx512_bf16", "amx")
#: the packed layouts of :func:`pack_linear_bf16`: name → (panel width, k padded to a multiple of);
#: "panels": the build's panel width (32 with AVX512-BF16, else 16), k in pairs
BF16_LAYOUTS = {"amx": (16, 32)}


def bf16_kernel(lib=None) -> str:
    """Which path of ``linear_bf16.c`` this machine runs on the weights :func:`pack_linear_bf16` packs:
    ``"amx"`` (AMX tiles: the build targets AVX512-BF16, the compiler knows AMX, the CPU has amx_bf16
    and Linux grants the tile state), ``"avx512_bf16"``, ``"avx2"``, ``"c"`` (the portable loops), or
    ``"torch"`` without the library."""
    lib = lib or compiler.library()
    return "torch" if lib is None else BF16_KERNELS[lib.sparserl_bf16_kernel()]


#: the layout :func:`pack_linear_bf16` packs for each kernel (the kernel runs on weights of that layout)
BF16_KERNEL_LAYOUT = {"amx": "amx", "avx512_bf16": "panels", "avx2": "panels", "c": "panels"}


def bf16_kernels(lib=None) -> tuple[str, ...]:
    """The kernels of ``linear_bf16.c`` this machine runs, each on its layout
    (:data:`BF16_KERNEL_LAYOUT`): ``("amx", "avx512_bf16")`` on an AMX Xeon, ``("avx512_bf16",)`` on a
    CPU with AVX512-BF16 only, ``("avx2",)``, ``("c",)``; the portable loops are left out where a
    vector kernel runs. Empty without the library. Which of two is faster is measured, not assumed
    (:mod:`sparserl.rollout.bf16_kernel_choice`)."""
    lib = lib or compiler.library()
    if lib is None:
        return ()
    found = []
    for kernel, layout in BF16_KERNEL_LAYOUT.items():
        width, kpad = _bf16_layout(layout, lib)
        ran = BF16_KERNELS[lib.sparserl_bf16_kernel_for(width, kpad)]
        if ran == kernel and kernel not in found:
            found.append(kernel)
    return tuple(k for k in found if k != "c") or ("c",)


def _bf16_layout(layout: str | None, lib) -> tuple[int, int]:
    if layout is None:
        code = lib.sparserl_bf16_default_layout()
        return code >> 8, code & 0xFF
    if layout == "panels":
        return lib.sparserl_bf16_panel_width(), 2
    if layout not in BF16_LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected None, 'panels' or one of {sorted(BF16_LAYOUTS)}")
    return BF16_LAYOUTS[layout]


def pack_linear_bf16(w: torch.Tensor, layout: str | None = None, lib=None) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → its bfloat16 values (round to nearest even, as ``w.bfloat16()``)
    packed for :func:`linear_bf16` (``linear_bf16.c``): panels of ``width`` output columns, k in
    pairs, ``Wb[p][k // 2][j][k % 2] = bf16(W[width p + j][k])``, zero past N and past K up to K
    rounded to ``kpad``. ``layout``: None, the one :func:`bf16_kernel` runs on; ``"panels"``, the
    build's panels (width 32 where it targets AVX512-BF16, else 16; kpad 2); ``"amx"``, width 16 and
    kpad 32 (16 rows of a panel are one AMX B tile; packs on any CPU). The result (bfloat16, 1-D)
    carries ``out_features``, ``in_features``, ``panel_width`` and ``k_pad``; None without the library."""
    lib = lib or compiler.library()
    if lib is None or w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2:
        return None
    width, kpad = _bf16_layout(layout, lib)
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // width) * width * (-(-K // kpad) * kpad), dtype=torch.bfloat16)
    lib.sparserl_pack_bf16(N, K, width, kpad, w.data_ptr(), packed.data_ptr())
    packed.out_features, packed.in_features, packed.panel_width, packed.k_pad = N, K, width, kpad
    return packed


def bf16_kernel_of(packed: torch.Tensor, lib=None) -> str:
    """The kernel :func:`linear_bf16` runs here on these panels (by their layout)."""
    lib = lib or compiler.library()
    return "torch" if lib is None else BF16_KERNELS[lib.sparserl_bf16_kernel_for(packed.panel_width, packed.k_pad)]


def unpack_bf16(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_linear_bf16`'s panels back to W's bfloat16 values [N, K]."""
    N, K, width, kpad = packed.out_features, packed.in_features, packed.panel_width, packed.k_pad
    k_pad = -(-K // kpad) * kpad
    P = packed.numel() // (width * k_pad)
    return packed.view(P, k_pad // 2, width, 2).permute(0, 2, 1, 3).reshape(P * width, k_pad)[:N, :K].contiguous()


def to_bf16(x: torch.Tensor, lib=None) -> torch.Tensor | None:
    """x float32 (CPU) → bfloat16 by ``linear_bf16.c``'s rounding (what the kernel does to its
    activations; the bits of ``x.bfloat16()``), or None without the library."""
    lib = compiler.lib_for(lib, x)
    if lib is None:
        return None
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    lib.sparserl_to_bf16(x.numel(), x.data_ptr(), out.data_ptr())
    return out


def linear_bf16(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None = None,
    lib=None,
    add_to: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``bf16(x) bf16(W)ᵀ (+ bias)`` with float32 sums on ``linear_bf16.c``, W given as
    :func:`pack_linear_bf16`'s panels; x [..., K] float32 (rounded to bfloat16 in the kernel), bias
    [N] float32, the result float32. ``add_to`` [..., N] (contiguous): the product is added to it in
    place and it is returned. None when the kernel does not take this input (the caller runs torch)."""
    lib = compiler.lib_for(lib, x, *(t for t in (bias, add_to) if t is not None))
    if lib is None or packed.device.type != "cpu" or packed.dtype != torch.bfloat16 or not packed.is_contiguous():
        return None
    io = product_io(x, packed.out_features, packed.in_features, bias, add_to)
    if io is None:
        return None
    x2, rows, out, N, K = io
    if (
        rows
        and lib.sparserl_linear_bf16(
            rows,
            N,
            K,
            x2.data_ptr(),
            x2.stride(0),
            packed.data_ptr(),
            packed.panel_width,
            packed.k_pad,
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            N,
            int(add_to is not None),
        )
        != 0
    ):
        return None
    return out
