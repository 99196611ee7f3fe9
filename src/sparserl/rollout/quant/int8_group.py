"""INT8 W8A8 with per-group activation scales (``rollout.quant = int8_group``): QuRL's INT8 sampler
(Li et al. 2026, arXiv 2602.13953) with the activations quantized in 1 × G tiles along the input,
the activation side of the fine-grained (1 × 128 activation, 128 × 128 weight tile) FP8 recipe
FP8-RL follows (DeepSeek-V3, arXiv 2412.19437); G = ``rollout.quant_group``, default :data:`GROUP` = 64.

Weights, symmetric per output channel on the full 8-bit grid (as :mod:`.int8`)::

    s_o = max_i |W_oi| / 127,   Q_oi = clamp(round(W_oi / s_o), -127, 127)

Activations, dynamic per token ``t`` and group ``j`` of G consecutive inputs::

    a_tj = max_{i ∈ j} |X_ti| / 127,   P_ti = clamp(round(X_ti / a_tj), -127, 127)

and ``Y_to = s_o Σ_j a_tj Σ_{i ∈ j} P_ti Q_oi``, each group's sum in int32.

Why (``docs/results/smoothquant.md``): the per-token scale of ``int8`` is set by the token's outlier
input channel (the largest channel max is 13x the median for q/k/v, up to 2,442x for down), so the
other channels sit on a few levels; a group's scale is set by the outliers of its own 64 channels
only. Teacher-forced on real text (α = Σ min(p, q) against the float32 sampler): ``int8`` 0.922,
this 0.968, and 0.977 with SmoothQuant (``rollout.quant_smooth 0.5``).

Kernels: on x86 CPU with sparserl's native kernels, ``linear_int8.c``'s group kernel (AVX2,
``vpsignb`` + ``vpmaddubsw``: |P| against Q carrying P's sign, so the 8-bit grid cannot saturate);
on CUDA one ``torch._int_mm`` per group; elsewhere an emulation in float32 of exactly these
integers (labelled ``emulated``). 64 divides the hidden sizes of the common models (576, 1,536,
2,048, 4,096 ...); a last shorter group is allowed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native
from .base import QUANTS, QuantizedLinear, WeightQuantizer
from .int8 import QMAX, dequantize_int8_per_channel, quantize_int8_per_channel

GROUP = 64


def quantize_int8_per_group(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """X [rows, in] → (P int8 [rows, in], a float32 [rows, ceil(in / group)]), symmetric per row and
    group of ``group`` inputs: ``a_tj = max_{i ∈ j} |X_ti| / 127`` (1 for an all-zero group)."""
    rows, k = x.shape
    n_groups = -(-k // group)
    xf = F.pad(x.float(), (0, n_groups * group - k)).view(rows, n_groups, group)
    a = xf.abs().amax(dim=-1) / QMAX
    a = torch.where(a > 0, a, torch.ones_like(a))
    p = torch.round(xf / a[..., None]).clamp_(-QMAX, QMAX).to(torch.int8).view(rows, -1)[:, :k]
    return p, a


def int8_matmul_per_group(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """``s_o Σ_j a_tj Σ_{i ∈ j} P_ti Q_oi`` in float32 for X [rows, in] and Q int8 [out, in]: one
    ``torch._int_mm`` per group on CUDA; elsewhere each group's integer sum in float32, which is
    exact (at most 64 · 127² < 2²⁴ per group)."""
    p, a = quantize_int8_per_group(x, group)
    rows, k = p.shape
    out = torch.zeros(rows, q.shape[0], dtype=torch.float32, device=x.device)
    for j in range(a.shape[1]):
        cols = slice(j * group, min(k, (j + 1) * group))
        if p.is_cuda:
            pj = p[:, cols]
            if rows <= 16:  # _int_mm on CUDA wants more than 16 rows
                pj = torch.cat([pj, pj.new_zeros(17 - rows, pj.shape[1])])
            acc = torch._int_mm(pj.contiguous(), q[:, cols].t().contiguous())[:rows].float()
        else:
            acc = p[:, cols].float() @ q[:, cols].float().t()
        out += acc * a[:, j : j + 1]
    return out * scales[None, :]


class Int8GroupLinear(QuantizedLinear):
    """Q int8 [out, in] (|Q| ≤ 127) and s float32 [out]; the product on sparserl's AVX2 group kernel
    (x86 CPU), ``torch._int_mm`` per group (CUDA) or the float32 emulation."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, group: int = GROUP):
        super().__init__(*q.shape)
        self.scales, self.group = scales, group
        self.native = native.pack_int8(q) if q.device.type == "cpu" and native.active() else None
        self.q = None if self.native is not None else q  # the panels are the weight: no second copy
        self.emulated = self.native is None and q.device.type != "cuda"
        self.kernel = "native" if self.native is not None else ("emulated" if self.emulated else "_int_mm")

    def nbytes(self) -> int:
        return self.numel() + self.scales.numel() * 4

    def codes(self) -> torch.Tensor:
        return self.q if self.q is not None else native.unpack_int8(self.native)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8_per_channel(self.codes(), self.scales)

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            y = native.linear_int8(x2, self.native, self.scales, group=self.group)
            if y is not None:
                return y
            if self.q is None:  # the torch path runs here (torch_only, compile): keep its codes
                self.q = self.codes()
        return int8_matmul_per_group(x2, self.q, self.scales, self.group)


@QUANTS.register("int8_group")
class Int8GroupW8A8(WeightQuantizer):
    """INT8 W8A8 with per-token-and-group activation scales (module docstring)."""

    name = "int8_group"
    quantizes_activations = True
    takes_group = True

    def __init__(self, group: int = GROUP):
        if isinstance(group, bool) or not isinstance(group, int) or group < 4 or group % 4:
            raise ValueError(f"int8_group: group must be a positive multiple of 4 (the kernel's 4-byte steps), "
                             f"got {group!r}")
        self.group = group

    def quantize(self, w: torch.Tensor) -> Int8GroupLinear:
        return Int8GroupLinear(*self.codes(w), group=self.group)

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_int8_per_channel(w, QMAX)

    def kernel_on(self, device) -> str:
        if torch.device(device).type == "cpu" and native.active():
            return "native"
        return "_int_mm" if torch.device(device).type == "cuda" else "emulated"

    def emulated_on(self, device) -> bool:
        return self.kernel_on(device) == "emulated"
