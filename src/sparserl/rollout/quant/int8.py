"""INT8 W8A8 (QuRL, Li et al. 2026, arXiv 2602.13953): 8-bit weights and 8-bit activations, the
product on integer kernels.

Weights, symmetric per output channel (row ``o`` of ``W [out, in]``)::

    s_o = max_i |W_oi| / 127,   Q_oi = clamp(round(W_oi / s_o), -127, 127),   W ≈ s_o Q_o

Activations, dynamic per token (row ``t`` of ``X [rows, in]``), quantized at every call::

    a_t = max_i |X_ti| / 127,   P_ti = clamp(round(X_ti / a_t), -127, 127)

and ``Y_to = a_t s_o Σ_i P_ti Q_oi``, the sum in int32.

Kernels:

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
  ``2 max|X_t| / 255`` (the symmetric int8 step is ``max|X_t| / 127``). fbgemm runs
  ``reduce_range=False`` (full 8 bits) here; on AVX2 its u8 × s8 pair sums can saturate int16 in
  rare cases, which the tests check against the float reference of the same quantized values.
"""
from __future__ import annotations

import torch

__all__ = ["quantize_int8_per_channel", "dequantize_int8_per_channel", "quantize_int8_per_token",
           "int8_matmul_per_token"]

QMAX = 127


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] → (Q int8 [out, in], s float32 [out]) with ``W ≈ s[:, None] * Q``, symmetric per
    output channel: ``s_o = max|W_o| / 127`` (1 for an all-zero row), ``|W - s Q| ≤ s / 2``."""
    wf = w.detach().float()
    scales = wf.abs().amax(dim=1) / QMAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(wf / scales[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
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


def int8_matmul_per_token(x: torch.Tensor, q_t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """X [rows, in] (float) times the int8 weight given transposed, ``Qᵀ [in, out]`` (contiguous
    as ``Q`` is: a view), with per-channel scales [out]: ``a_t s_o Σ_i P_ti Q_oi`` in float32,
    the sum on ``torch._int_mm`` (int32 accumulation). ``_int_mm`` on CUDA wants more than 16
    rows: smaller inputs are zero-padded to 17 rows."""
    p, a = quantize_int8_per_token(x)
    rows = p.shape[0]
    if p.is_cuda and rows <= 16:
        p = torch.cat([p, p.new_zeros(17 - rows, p.shape[1])])
    acc = torch._int_mm(p, q_t)[:rows]
    return acc.float() * a * scales[None, :]
