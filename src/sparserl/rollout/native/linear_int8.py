"""``linear_int8.c``: the ``int8`` sampler's W8A8 products with per-token activation scales on AVX2
integer instructions (:func:`pack_int8`, :func:`linear_int8`; :mod:`sparserl.rollout.quant.int8`), and
``int8_group``'s with per-group scales and the full 8-bit weight grid (``linear_int8(group=G)``;
:mod:`sparserl.rollout.quant.int8_group`), and the products with float32 outlier channels
(:func:`linear_int8_outliers`; :mod:`sparserl.rollout.quant.outliers`).
"""

from __future__ import annotations

import torch

from . import compiler
from .linear import pack_panels
from .operands import rows_view


def pack_int8(q: torch.Tensor, lib=None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Int8 codes Q [N, K] → (panels, column sums) for :func:`linear_int8` (|Q| ≤ 64 per token,
    ≤ 127 where :func:`int8_full_range`; |Q| ≤ 127 with groups; see ``linear_int8.c``),
    or None when the library is not available."""
    lib = lib or compiler.library()
    if lib is None or q.device.type != "cpu" or q.dtype != torch.int8 or q.dim() != 2:
        return None
    q = q.contiguous()
    N, K = q.shape
    nr = lib.sparserl_int8_panel_width()
    n_pad, k_pad = -(-N // nr) * nr, -(-K // 4) * 4
    panels = torch.empty(n_pad * k_pad, dtype=torch.int8)
    colsum = torch.empty(n_pad, dtype=torch.int32)
    lib.sparserl_pack_int8(N, K, q.data_ptr(), panels.data_ptr(), colsum.data_ptr())
    panels.out_features, panels.in_features, panels.panel_width = N, K, nr
    return panels, colsum


def _pack_per_group(values: torch.Tensor, fill, lib) -> torch.Tensor:
    """[N, NG] → per int8 panel of NR outputs, per group, the panel's NR values (``[P][NG][NR]``,
    ``fill`` past N)."""
    nr = lib.sparserl_int8_panel_width()
    n, ng = values.shape
    n_pad = -(-n // nr) * nr
    padded = torch.full((n_pad, ng), fill, dtype=values.dtype)
    padded[:n] = values
    return padded.view(n_pad // nr, nr, ng).transpose(1, 2).contiguous().view(-1)


def pack_group_scales(scales: torch.Tensor, lib=None) -> torch.Tensor | None:
    """Weight scales per output and group, g [N, NG] float32 → :func:`linear_int8`'s
    ``group_scales`` (per panel and group, 1 past N), or None without the library."""
    lib = lib or compiler.library()
    if lib is None or scales.device.type != "cpu" or scales.dim() != 2:
        return None
    return _pack_per_group(scales.float(), 1.0, lib)


def pack_group_colsums(q: torch.Tensor, group: int, lib=None) -> torch.Tensor | None:
    """Int8 codes Q [N, K] → their column sums per group of ``group`` inputs, packed as
    :func:`pack_group_scales` (int32, 0 past N): :func:`linear_int8`'s ``group_colsum``. None
    without the library, or where the build has no use for them (:func:`int8_group_u8`)."""
    lib = lib or compiler.library()
    if lib is None or q.device.type != "cpu" or q.dim() != 2 or not int8_group_u8(lib):
        return None
    n, k = q.shape
    ng = -(-k // group)
    padded = q if ng * group == k else torch.nn.functional.pad(q, (0, ng * group - k))
    sums = padded.reshape(n, ng, group).sum(-1, dtype=torch.int32)
    return _pack_per_group(sums, 0, lib)


def int8_group_u8(lib=None) -> bool:
    """Whether this build runs ``int8_group`` on the per-token kernel's unsigned codes and tile when
    given the group column sums: where that tile's dot is one vpdpbusd (AVX512 VNNI on 512 bits,
    AVX-VNNI on 256; ``linear_int8.c``)."""
    lib = lib or compiler.library()
    return bool(lib is not None and lib.sparserl_int8_group_u8())


def int8_full_range(lib=None) -> bool:
    """Whether :func:`linear_int8`'s per-token products are exact on the full weight grid |Q| ≤ 127
    (a VNNI build, or the portable C); False on plain AVX2 / AVX512BW (|Q| ≤ 64 there) or with no
    library."""
    lib = lib or compiler.library()
    return bool(lib is not None and lib.sparserl_int8_full_range())


def unpack_int8(packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """:func:`pack_int8`'s panels back to the codes Q [N, K] int8 (``Wq[p][k/4][j][k%4] = Q[NR p + j][k]``,
    NR = the build's panel width: 16, or 32 with AVX512)."""
    panels = packed[0]
    N, K, nr = panels.out_features, panels.in_features, panels.panel_width
    k_pad = -(-K // 4) * 4
    n_pad = panels.numel() // k_pad
    return panels.view(n_pad // nr, k_pad // 4, nr, 4).permute(0, 2, 1, 3).reshape(n_pad, k_pad)[:N, :K].contiguous()


def _group_operands_ok(group: int | None, group_scales: torch.Tensor | None, group_colsum: torch.Tensor | None) -> bool:
    """Whether the int8 kernels take this group size and ``int8_group``'s packed operands (both
    only with a group; contiguous; the column sums int32 on the CPU:
    :func:`~sparserl.rollout.native.compiler.lib_for` checks the
    float ones)."""
    if group is None:
        return group_scales is None and group_colsum is None
    return (
        group > 0
        and group % 4 == 0
        and (group_scales is None or group_scales.is_contiguous())
        and (
            group_colsum is None
            or (
                group_colsum.dtype == torch.int32 and group_colsum.device.type == "cpu" and group_colsum.is_contiguous()
            )
        )
    )


def linear_int8(
    x: torch.Tensor,
    packed: tuple[torch.Tensor, torch.Tensor],
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    group: int | None = None,
    group_scales: torch.Tensor | None = None,
    group_colsum: torch.Tensor | None = None,
    lib=None,
) -> torch.Tensor | None:
    """The int8 W8A8 products of ``linear_int8.c`` on x [..., K] float32, Q given as
    :func:`pack_int8`'s panels and ``scales`` [N] float32:

    - ``group=None``: ``a_t s_n Σ_k P_tk Q_nk (+ bias)``, P quantized per token (``int8``; |Q| ≤ 64,
      ≤ 127 where :func:`int8_full_range`);
    - ``group=G``: ``s_n Σ_j a_tj g_nj Σ_{k ∈ j} P_tk Q_nk (+ bias)``, one scale per token and group
      of G inputs, ``g`` the weights' scales per output and group (``group_scales``,
      :func:`pack_group_scales`; None: 1) (``int8_group``; |Q| ≤ 127, G a multiple of 4).
      ``group_colsum`` (:func:`pack_group_colsums`): the builds with VNNI (AVX512 or AVX-VNNI) then
      run the groups on the per-token kernel's tile (:func:`int8_group_u8`), with the same bits.

    None when the kernel does not take this input (the caller runs another kernel)."""
    panels, colsum = packed
    lib = compiler.lib_for(lib, x, scales, *(t for t in (bias, group_scales) if t is not None))
    if (
        lib is None
        or not scales.is_contiguous()
        or (bias is not None and not bias.is_contiguous())
        or not _group_operands_ok(group, group_scales, group_colsum)
    ):
        return None
    N, K = panels.out_features, panels.in_features
    x2 = rows_view(x) if x.shape[-1] == K else None
    if x2 is None:
        return None
    rows = x2.shape[0]
    out = torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    if rows == 0:
        return out
    k_pad, b_ptr = -(-K // 4) * 4, None if bias is None else bias.data_ptr()
    if group is None:  # work: the rows' scales (4 bytes each) and their quantized values
        work = torch.empty(rows * (4 + k_pad), dtype=torch.uint8)
        rc = lib.sparserl_linear_int8(
            rows,
            N,
            K,
            x2.data_ptr(),
            x2.stride(0),
            panels.data_ptr(),
            colsum.data_ptr(),
            scales.data_ptr(),
            b_ptr,
            out.data_ptr(),
            N,
            work.data_ptr(),
        )
    else:
        work = torch.empty(rows * (4 * -(-K // group) + k_pad), dtype=torch.uint8)
        rc = lib.sparserl_linear_int8_group(
            rows,
            N,
            K,
            group,
            x2.data_ptr(),
            x2.stride(0),
            panels.data_ptr(),
            None if group_colsum is None else group_colsum.data_ptr(),
            scales.data_ptr(),
            None if group_scales is None else group_scales.data_ptr(),
            b_ptr,
            out.data_ptr(),
            N,
            work.data_ptr(),
        )
    return None if rc != 0 else out


def pack_outliers(w_outliers: torch.Tensor, lib=None) -> torch.Tensor | None:
    """``W[:, idx]`` [N, n] float32 (CPU) → its panels for :func:`linear_int8` with outliers
    (``Wo[p][j][c] = W[NR p + c, idx[j]]``, NR the int8 panel width), or None without the library."""
    lib = lib or compiler.library()
    return None if lib is None else pack_panels(w_outliers, lib, lib.sparserl_int8_panel_width())


def linear_int8_outliers(
    x: torch.Tensor,
    packed: tuple[torch.Tensor, torch.Tensor],
    scales: torch.Tensor,
    idx: torch.Tensor,
    outlier_panels: torch.Tensor,
    group: int | None = None,
    group_scales: torch.Tensor | None = None,
    group_colsum: torch.Tensor | None = None,
    lib=None,
) -> torch.Tensor | None:
    """:func:`linear_int8` of x [..., K] with the inputs ``idx`` (int32 [n]) zeroed, plus their
    float32 product with :func:`pack_outliers`'s panels (``linear_int8.c``,
    ``sparserl_linear_int8_outliers``; no bias: the caller adds it). None when the kernel does not
    take this input."""
    panels, colsum = packed
    lib = compiler.lib_for(lib, x, scales, outlier_panels, *(t for t in (group_scales,) if t is not None))
    if (
        lib is None
        or not scales.is_contiguous()
        or idx.dtype != torch.int32
        or not idx.is_contiguous()
        or not _group_operands_ok(group, group_scales, group_colsum)
    ):
        return None
    N, K = panels.out_features, panels.in_features
    x2 = rows_view(x) if x.shape[-1] == K else None
    if x2 is None or outlier_panels.out_features != N or outlier_panels.in_features != idx.numel():
        return None
    out = torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    sums = colsum if group is None else group_colsum
    if (
        x2.shape[0]
        and lib.sparserl_linear_int8_outliers(
            x2.shape[0],
            N,
            K,
            group or 0,
            x2.data_ptr(),
            x2.stride(0),
            panels.data_ptr(),
            None if sums is None else sums.data_ptr(),
            scales.data_ptr(),
            None if group_scales is None else group_scales.data_ptr(),
            None,
            out.data_ptr(),
            N,
            0,
            idx.numel(),
            idx.data_ptr(),
            outlier_panels.data_ptr(),
        )
        != 0
    ):
        return None
    return out
