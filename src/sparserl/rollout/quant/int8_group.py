"""INT8 W8A8 with per-group scales (``rollout.quant = int8_group``): QuRL's INT8 sampler (Li et al.
2026, arXiv 2602.13953) with weights and activations quantized in groups of G consecutive inputs,
the fine-grained scaling of the FP8 recipe FP8-RL follows (DeepSeek-V3, arXiv 2412.19437: 1 × 128
activation tiles; here the weight tiles are 1 × G too); G = ``rollout.quant_group``, default
:data:`GROUP` = 64.

Weights, symmetric per output channel ``o`` and group ``j`` of G inputs, on the full 8-bit grid::

    g_oj = max_{i ∈ j} |W_oi| / 127,   Q_oi = clamp(round(W_oi / g_oj), -127, 127)

Activations, dynamic per token ``t`` and group ``j``::

    a_tj = max_{i ∈ j} |X_ti| / 127,   P_ti = clamp(round(X_ti / a_tj), -127, 127)

and ``Y_to = Σ_j a_tj g_oj Σ_{i ∈ j} P_ti Q_oi``, each group's sum in int32.

Why (``docs/results/smoothquant.md``): the per-token scale of ``int8`` is set by the token's outlier
input channel (the largest channel max is 13x the median for q/k/v, up to 2,442x for down), so the
other channels sit on a few levels; a group's scale is set by the outliers of its own 64 channels
only, and the same holds for a weight row. Measured on the bench's generated tokens (an emulation
of exactly these roundings, ``docs/results/smoothquant.md``): per-channel weights with group activations and
SmoothQuant 0.5 reach α 0.968; group scales on both sides 0.977.

Kernels: on x86 CPU with sparserl's native kernels, ``linear_int8.c``'s group kernel: with VNNI
(AVX512 VNNI on 512 bits, AVX-VNNI on 256) on the per-token kernel's tile (unsigned codes P + 128,
each group's sum corrected by 128 times its column sums of Q, kept per group); otherwise on AVX2
with ``vpsignb`` + ``vpmaddubsw`` (|P| against Q carrying P's sign, so the 8-bit grid cannot
saturate). Both give the same bits. On CUDA one ``torch._int_mm`` per group, on each group's ``Qᵀ``
made once per push; elsewhere an emulation in float32 of exactly these
integers (labelled ``emulated``). 64 divides the hidden sizes of the common models (576, 1,536,
2,048, 4,096 ...); a last shorter group is allowed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native
from .base import QUANTS, QuantizedLinear, WeightQuantizer
from .int8 import QMAX, int_mm

GROUP = 64


def quantize_int8_weight_groups(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] → (Q int8 [out, in], g float32 [out, ceil(in / group)]) with ``W ≈ g Q`` per
    group, symmetric per output and group of ``group`` inputs: ``g_oj = max_{i ∈ j} |W_oi| / 127``
    (1 for an all-zero group), ``|W - g Q| ≤ g / 2``. The same rounding as the activations."""
    return quantize_int8_per_group(w.detach(), group)


def dequantize_int8_weight_groups(q: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """(Q int8 [out, in], g [out, ceil(in / group)]) → ``g Q`` in float32."""
    return q.float() * scales.float().repeat_interleave(group, dim=1)[:, : q.shape[1]]


def quantize_int8_per_group(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """X [rows, in] → (P int8 [rows, in], a float32 [rows, ceil(in / group)]), symmetric per row and
    group of ``group`` inputs: ``a_tj = max_{i ∈ j} |X_ti| / 127`` (1 for an all-zero group)."""
    rows, k = x.shape
    n_groups = -(-k // group)
    xf = x.float()
    if n_groups * group != k:  # a last shorter group: zeros do not change its max (no copy otherwise)
        xf = F.pad(xf, (0, n_groups * group - k))
    xf = xf.reshape(rows, n_groups, group)
    a = xf.abs().amax(dim=-1) / QMAX
    a = torch.where(a > 0, a, torch.ones_like(a))
    p = torch.round(xf / a[..., None]).clamp_(-QMAX, QMAX).to(torch.int8).view(rows, -1)[:, :k]
    return p, a


def group_columns(k: int, group: int = GROUP) -> list[slice]:
    """The input columns of each group of ``group`` (the last one shorter when ``group`` does not
    divide ``k``)."""
    return [slice(j, min(k, j + group)) for j in range(0, k, group)]


def transposed_groups(q: torch.Tensor, group: int = GROUP) -> list[torch.Tensor]:
    """Q int8 [out, in] → each group's ``Qᵀ`` [cols, out], column-major (the transpose of a contiguous
    [out, cols]): ``torch._int_mm``'s second operand in the layout cuBLASLt's int8 product takes (:func:`int_mm`),
    made once per push rather than at every product."""
    return [q[:, cols].contiguous().t() for cols in group_columns(q.shape[1], group)]


def int8_matmul_per_group(
    x: torch.Tensor,
    q: torch.Tensor | None,
    scales: torch.Tensor,
    group: int = GROUP,
    use_int_mm: bool | None = None,
    q_t_groups: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """``Σ_j a_tj g_oj Σ_{i ∈ j} P_ti Q_oi`` in float32 for X [rows, in], Q int8 [out, in] and the
    weight scales g [out, n_groups]: one ``torch._int_mm`` per group (``use_int_mm``; default: on
    CUDA, or when the groups come as ``q_t_groups``, :func:`transposed_groups`, in place of Q);
    else each group's integer sum in float32. Both are exact (at most 64 · 127² < 2²⁴ per group),
    so the two give the same bits."""
    p, a = quantize_int8_per_group(x, group)
    rows, k = p.shape
    out = torch.zeros(rows, scales.shape[0], dtype=torch.float32, device=x.device)
    if use_int_mm is None:
        use_int_mm = p.is_cuda or q_t_groups is not None
    if use_int_mm and q_t_groups is None:
        q_t_groups = transposed_groups(q, group)
    for j, cols in enumerate(group_columns(k, group)):
        if use_int_mm:
            acc = int_mm(p[:, cols].contiguous(), q_t_groups[j]).float()
        else:
            acc = p[:, cols].float() @ q[:, cols].float().t()
        out += acc * (a[:, j : j + 1] * scales[None, :, j])
    return out


class Int8GroupLinear(QuantizedLinear):
    """Q int8 [out, in] (|Q| ≤ 127) and g float32 [out, n_groups]; the product on sparserl's AVX2
    group kernel (x86 CPU), ``torch._int_mm`` per group (CUDA) or the float32 emulation."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, group: int = GROUP):
        super().__init__(*q.shape)
        if scales.shape != (q.shape[0], -(-q.shape[1] // group)):
            raise ValueError(
                f"int8_group: scales {tuple(scales.shape)} for a weight {tuple(q.shape)} in groups of "
                f"{group}; expected one per output and group"
            )
        self.scales, self.group = scales, group
        self.native = native.pack_int8(q) if q.device.type == "cpu" and native.active() else None
        # the kernel's operands: per-channel factors of 1, g packed per panel, and the group column
        # sums where the build runs groups on its wider unsigned-code tile (None elsewhere)
        self.kernel_scales = (
            (torch.ones(q.shape[0]), native.pack_group_scales(scales), native.pack_group_colsums(q, group))
            if self.native is not None
            else None
        )
        # on CUDA the weight is held as each group's Qᵀ, the form torch._int_mm takes
        self.q_t_groups = transposed_groups(q, group) if self.native is None and q.is_cuda else None
        # the panels, or the groups, are the weight: no second copy
        self.q = None if self.native is not None or self.q_t_groups is not None else q
        self.emulated = self.native is None and q.device.type != "cuda"
        self.kernel = "native" if self.native is not None else ("emulated" if self.emulated else "_int_mm")

    def nbytes(self) -> int:
        """The codes, g, and the group column sums where the kernel reads them."""
        sums = self.kernel_scales[2] if self.kernel_scales is not None else None
        return self.numel() + self.scales.numel() * 4 + (0 if sums is None else self.scales.numel() * 4)

    def codes(self) -> torch.Tensor:
        if self.q is not None:
            return self.q
        if self.q_t_groups is not None:
            return torch.cat([t.t() for t in self.q_t_groups], dim=1)
        return native.unpack_int8(self.native)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8_weight_groups(self.codes(), self.scales, self.group)

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            ones, packed, sums = self.kernel_scales
            y = native.linear_int8(x2, self.native, ones, group=self.group, group_scales=packed, group_colsum=sums)
            if y is not None:
                return y
            if self.q is None:  # the torch path runs here (torch_only, compile): keep its codes
                self.q = self.codes()
        return int8_matmul_per_group(x2, self.q, self.scales, self.group, q_t_groups=self.q_t_groups)


@QUANTS.register("int8_group")
class Int8GroupW8A8(WeightQuantizer):
    """INT8 W8A8 with weight and activation scales per group of inputs (module docstring)."""

    name = "int8_group"
    quantizes_activations = True
    takes_group = True

    def __init__(self, group: int = GROUP):
        if isinstance(group, bool) or not isinstance(group, int) or group < 4 or group % 4:
            raise ValueError(
                f"int8_group: group must be a positive multiple of 4 (the kernel's 4-byte steps), got {group!r}"
            )
        self.group = group

    def quantize(self, w: torch.Tensor) -> Int8GroupLinear:
        return Int8GroupLinear(*self.codes(w), group=self.group)

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_int8_weight_groups(w, self.group)

    def kernel_on(self, device) -> str:
        if torch.device(device).type == "cpu" and native.active():
            return "native"
        return "_int_mm" if torch.device(device).type == "cuda" else "emulated"

    def emulated_on(self, device) -> bool:
        return self.kernel_on(device) == "emulated"
