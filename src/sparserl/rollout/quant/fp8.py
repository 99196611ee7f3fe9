"""FP8 W8A8 (FP8-RL, 2026; QuRL's FP8 arm, arXiv 2602.13953): E4M3 weights and activations.

Weights, per output channel (FP8-RL uses 128x128 blocks; per channel here, the layout
``torch._scaled_mm``'s row-wise scaling takes)::

    s_o = max_i |W_oi| / 448,   Q_o = e4m3(W_o / s_o)        (448 = the largest E4M3 value)

Activations, dynamic per token: ``a_t = max_i |X_ti| / 448``, ``P_t = e4m3(X_t / a_t)``; and
``Y_to = a_t s_o Σ_i P_ti Q_oi``.

Kernels: ``torch._scaled_mm`` (row-wise scales, bfloat16 out) on a CUDA GPU of compute capability
>= 8.9 (Ada, Hopper). Elsewhere (this CPU) an **emulation**: the same E4M3 values, dequantized and
multiplied in float32 (``emulated = True``; the numbers of FP8, not its speed). The weights are held
as ``torch.float8_e4m3fn`` (1 byte) either way.
"""

from __future__ import annotations

import torch

from .base import QUANTS, QuantizedLinear, WeightQuantizer

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448

__all__ = ["Fp8W8A8", "quantize_fp8_per_channel", "quantize_fp8_per_token", "scaled_mm_available"]


def quantize_fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] → (Q e4m3 [out, in], s float32 [out]), ``W ≈ s[:, None] * Q``."""
    wf = w.detach().float()
    s = wf.abs().amax(dim=1) / E4M3_MAX
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (wf / s[:, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), s


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X [rows, in] → (P e4m3, a float32 [rows, 1])."""
    xf = x.float()
    a = xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    a = torch.where(a > 0, a, torch.ones_like(a))
    return (xf / a).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), a


def scaled_mm_available(device: torch.device | str) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(QuantizedLinear):
    """Q e4m3 [out, in] and s float32 [out]. For ``torch._scaled_mm``, which takes inputs and
    outputs in multiples of 16 only, Q is held zero-padded to them (zero codes add nothing to a sum;
    the extra outputs are dropped)."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        super().__init__(*q.shape)
        self.emulated = not scaled_mm_available(q.device)
        self.kernel = "emulated" if self.emulated else "_scaled_mm"
        if not self.emulated:
            n, k = (-(-size // 16) * 16 for size in q.shape)
            if (n, k) != tuple(q.shape):
                codes = torch.zeros(n, k, dtype=torch.uint8, device=q.device)
                codes[: q.shape[0], : q.shape[1]] = q.view(torch.uint8)
                q = codes.view(E4M3)
                scales = torch.cat([scales, scales.new_ones(n - scales.shape[0])])
        self.q, self.scales = q, scales

    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return self.q[: self.out_features, : self.in_features].float() * self.scales[: self.out_features, None]

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if not self.emulated:
            if x2.shape[1] != self.q.shape[1]:
                x2 = torch.nn.functional.pad(x2, (0, self.q.shape[1] - x2.shape[1]))
            p, a = quantize_fp8_per_token(x2)
            y = torch._scaled_mm(p, self.q.t(), scale_a=a, scale_b=self.scales[None, :], out_dtype=torch.bfloat16)
            return y[:, : self.out_features].float()
        p, a = quantize_fp8_per_token(x2)
        return (p.float() @ self.q.float().t()) * a * self.scales


@QUANTS.register("fp8")
class Fp8W8A8(WeightQuantizer):
    name = "fp8"
    quantizes_activations = True

    def quantize(self, w: torch.Tensor) -> Fp8Linear:
        return Fp8Linear(*quantize_fp8_per_channel(w))

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = quantize_fp8_per_channel(w)
        return q.view(torch.uint8), scales  # e4m3 codes compared as their bytes

    def emulated_on(self, device) -> bool:
        return not scaled_mm_available(device)

    def kernel_on(self, device) -> str:
        return "emulated" if self.emulated_on(device) else "_scaled_mm"
