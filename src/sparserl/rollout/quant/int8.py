"""INT8 W8A8 (QuRL, Li et al. 2026, arXiv 2602.13953): 8-bit weights and 8-bit activations, the
product on integer kernels.

Weights, symmetric per output channel (row ``o`` of ``W [out, in]``)::

    s_o = max_i |W_oi| / 127,   Q_oi = clamp(round(W_oi / s_o), -127, 127),   W ≈ s_o Q_o

Activations, dynamic per token (row ``t`` of ``X [rows, in]``), quantized at every call::

    a_t = max_i |X_ti| / 127,   P_ti = clamp(round(X_ti / a_t), -127, 127)

and ``Y_to = a_t s_o Σ_i P_ti Q_oi``, the sum in int32.

Kernels:

- **x86 CPU with sparserl's native kernels** (``linear_int8.c``, :mod:`sparserl.rollout.native`):
  exactly the formula above (symmetric per-token activations) on AVX2 integer instructions, with
  the 7-bit weight grid described below (``vpmaddubsw`` saturation). fbgemm (next) runs where the
  native kernels are off (``SPARSERL_NATIVE=0``, :func:`~sparserl.rollout.native.torch_only`).
- **CUDA** (and any non-CPU device): ``torch._int_mm`` on ``P`` and ``Qᵀ`` (int8 × int8 → int32),
  then the two scales. Exactly the formula above (:func:`int8_matmul_per_token`).
- **x86 CPU**: fbgemm's dynamic int8 linear (``torch.ops.quantized.linear_dynamic``, the kernel of
  ``torch.ao.nn.quantized.dynamic.Linear``). That op quantizes its input **per tensor** and
  **asymmetrically** to uint8 (scale and zero point from the whole input's min and max,
  ``torch._choose_qparams_per_tensor``). To get per-token scales from it, each row is first divided
  by its own ``max |X_t|`` and the output row multiplied back: every row of the normalized input
  spans at most ``[-1, 1]``, so the one tensor scale ``c = (M - m) / 255`` (``m``, ``M`` the
  normalized input's min and max, ``M - m ≤ 2``) is a per-token grid ``a_t = max|X_t| · c`` on the
  original rows, with a shared zero point. That is per-token dynamic 8-bit activation
  quantization, asymmetric (uint8 with a zero point) rather than symmetric int8: a step at most
  ``2 max|X_t| / 255`` (the symmetric int8 step is ``max|X_t| / 127``).

  Saturation: on AVX2 (no VNNI) fbgemm multiplies u8 × s8 pairs with ``vpmaddubsw``, whose int16
  pair sums saturate above 32767; with 8-bit activations and weights up to ±127 that happened
  (measured on SmolLM2-135M's real activations: up to 14% relative error against the float64
  product of the same quantized values). The two ways out are 7-bit activations (fbgemm's
  ``reduce_range=True``, torch's default) or 7-bit weights; measured on the same layers, 7-bit
  weights were the more accurate (relative output error 1.6-4.0% vs 1.2-7.2%), so the fbgemm path
  quantizes the weights to ``|Q| ≤ 64`` (``s_o = max|W_o| / 64``; 255·64·2 = 32640 ≤ 32767: no
  saturation, the result equals the float reference of the same quantized values) and keeps the
  activations at 8 bits. So ``int8`` on an x86 CPU without VNNI is W7A8 in effect (int8 storage,
  129 levels). **With VNNI** (``vpdpbusd`` adds each u8 × s8 product into 32 bits: no 16-bit pair
  sums) the native kernel and fbgemm are exact on the full grid, and the weights use ``|Q| ≤ 127``
  (:func:`cpu_weight_qmax`): the full W8A8 above, as ``torch._int_mm`` (CUDA). Measured on
  SmolLM2-135M (teacher-forced α, ``docs/results/smoothquant.md``): 0.922 on the 7-bit grid, 0.930
  on the 8-bit one.
"""

from __future__ import annotations

import warnings

import torch

from .. import native
from .base import QUANTS, QuantizedLinear, WeightQuantizer

__all__ = [
    "Int8W8A8",
    "cpu_weight_qmax",
    "quantize_int8_per_channel",
    "dequantize_int8_per_channel",
    "quantize_int8_per_token",
    "int8_matmul_per_token",
    "int_mm",
    "fbgemm_available",
]

QMAX = 127
QMAX_FBGEMM = 64  # no int16 saturation in fbgemm's AVX2 u8 x s8 products (module docstring)


def quantize_int8_per_channel(w: torch.Tensor, qmax: int = QMAX) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] → (Q int8 [out, in], s float32 [out]) with ``W ≈ s[:, None] * Q``, symmetric per
    output channel: ``s_o = max|W_o| / qmax`` (1 for an all-zero row), ``|W - s Q| ≤ s / 2``."""
    wf = w.detach().float()
    scales = wf.abs().amax(dim=1) / qmax
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(wf / scales[:, None]).clamp_(-qmax, qmax).to(torch.int8)
    return q, scales


def dequantize_int8_per_channel(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(Q int8 [out, in], s [out]) → ``s[:, None] * Q`` in float32."""
    return q.float() * scales.float()[:, None]


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X [rows, in] → (P int8 [rows, in], a float32 [rows, 1]), symmetric per row (token):
    ``a_t = max|X_t| / 127``."""
    xf = x.float()
    a = xf.abs().amax(dim=-1, keepdim=True) / QMAX
    a = torch.where(a > 0, a, torch.ones_like(a))
    return torch.round(xf / a).clamp_(-QMAX, QMAX).to(torch.int8), a


def int_mm(p: torch.Tensor, q_t: torch.Tensor, pad: bool | None = None) -> torch.Tensor:
    """``P Qᵀ`` in int32 on ``torch._int_mm``, for P int8 [rows, in] and Qᵀ int8 [in, out].
    On CUDA (``pad``, default: there) cuBLASLt's int8 product takes Qᵀ column-major only (the
    transpose of a contiguous Q, as ``q.t()`` is), more than 16 rows and sizes in multiples of 8; it
    answers CUBLAS_STATUS_NOT_SUPPORTED otherwise (seen on an H100 and an H200). Other operands are
    laid out and zero-padded so (zeros add nothing to a sum), and the padding dropped."""
    rows, k = p.shape
    n = q_t.shape[1]
    if p.is_cuda if pad is None else pad:
        up = lambda size: -(-size // 8) * 8  # noqa: E731  (a one-line rounding helper local to this branch)
        rows_to, k_to, n_to = max(24, up(rows)), up(k), up(n)
        if (rows_to, k_to) != (rows, k):
            p = torch.nn.functional.pad(p, (0, k_to - k, 0, rows_to - rows))
        if (k_to, n_to) != (k, n) or q_t.stride(0) != 1:
            q_t = torch.nn.functional.pad(q_t.t(), (0, k_to - k, 0, n_to - n)).contiguous().t()  # pad may return a view
    return torch._int_mm(p, q_t)[:rows, :n]


def int8_matmul_per_token(x: torch.Tensor, q_t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """X [rows, in] (float) times the int8 weight given transposed, ``Qᵀ [in, out]`` (contiguous
    as ``Q`` is: a view), with per-channel scales [out]: ``a_t s_o Σ_i P_ti Q_oi`` in float32,
    the sum on ``torch._int_mm`` (:func:`int_mm`, int32 accumulation)."""
    p, a = quantize_int8_per_token(x)
    return int_mm(p, q_t).float() * a * scales[None, :]


def cpu_weight_qmax() -> int:
    """The int8 weight grid on this CPU: 127 where its int8 products are exact on it (VNNI: the
    native build's :func:`~sparserl.rollout.native.int8_full_range`, or the CPU's flags where fbgemm
    runs), else :data:`QMAX_FBGEMM` (module docstring)."""
    if native.library() is not None:
        return QMAX if native.int8_full_range() else QMAX_FBGEMM
    flags = native.cpu_flags()
    return QMAX if ("avx512_vnni" in flags or "avx_vnni" in flags) else QMAX_FBGEMM


def fbgemm_available(device: torch.device | str) -> bool:
    return torch.device(device).type == "cpu" and "fbgemm" in torch.backends.quantized.supported_engines


class Int8Linear(QuantizedLinear):
    """Q int8 [out, in] and s float32 [out]; the product on sparserl's AVX2 kernel or fbgemm (x86
    CPU), or ``torch._int_mm``."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        super().__init__(*q.shape)
        self.q, self.scales = q, scales
        self.packed = None  # fbgemm's
        self.native = native.pack_int8(q) if q.device.type == "cpu" and native.active() else None
        if self.native is not None:
            self.kernel = "native"  # fbgemm's packed copy made on first use where it runs (torch_only)
            self.q = None  # the panels are the weight: no second copy
        elif fbgemm_available(q.device):
            self.kernel = "fbgemm"
            self.packed = _fbgemm_prepack(q, scales)
            self.q = None  # the packed copy is the weight: no second copy
        else:
            self.kernel = "_int_mm"

    def nbytes(self) -> int:
        return self.numel() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8_per_channel(self.codes(), self.scales)

    def codes(self) -> torch.Tensor:
        """Q int8 [out, in], from wherever the weight is held."""
        if self.q is not None:
            return self.q
        if self.native is not None:
            return native.unpack_int8(self.native)
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            y = native.linear_int8(x2, self.native, self.scales)
            if y is not None:
                return y
            if torch.compiler.is_compiling():  # the same per-token maths, traceable
                return int8_matmul_per_token(x2, self.codes().t(), self.scales)
            if self.packed is None and fbgemm_available(x2.device):
                self.packed = _fbgemm_prepack(self.codes(), self.scales)
        if self.packed is None:
            return int8_matmul_per_token(x2, self.q.t(), self.scales)
        # per-token: rows scaled to max |x| = 1, fbgemm's per-tensor uint8 grid, rows scaled back
        m = torch.linalg.vector_norm(x2, float("inf"), dim=-1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny)
        return torch.ops.quantized.linear_dynamic(x2 / m, self.packed, False) * m


def _fbgemm_prepack(q: torch.Tensor, scales: torch.Tensor):
    """fbgemm's packed weight of exactly these int8 values and per-channel scales (zero points 0)."""
    with warnings.catch_warnings():  # torch's quantized-tensor deprecation notice: the kernels stay
        warnings.simplefilter("ignore", UserWarning)
        qt = torch._make_per_channel_quantized_tensor(q, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0)
    engine = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "fbgemm"
        return torch.ops.quantized.linear_prepack(qt, None)
    finally:
        torch.backends.quantized.engine = engine


@QUANTS.register("int8")
class Int8W8A8(WeightQuantizer):
    """QuRL's INT8 W8A8: per-output-channel symmetric int8 weights, dynamic per-token 8-bit
    activations, integer products (module docstring)."""

    name = "int8"
    quantizes_activations = True

    def quantize(self, w: torch.Tensor) -> Int8Linear:
        return Int8Linear(*self.codes(w))

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        on_cpu = torch.device(w.device).type == "cpu" and (fbgemm_available(w.device) or native.library() is not None)
        return quantize_int8_per_channel(w, cpu_weight_qmax() if on_cpu else QMAX)

    def kernel_on(self, device) -> str:
        if torch.device(device).type == "cpu" and native.active():
            return "native"
        return "fbgemm" if fbgemm_available(device) else "_int_mm"
