"""SmoothQuant (Xiao et al. 2023, arXiv 2211.10438): migrate activation outliers into the weights
before a W8A8 product (``rollout.quant_smooth``, the migration strength ``a``; 0 = off).

A few input channels of a decoder's linear layers carry activations 10-1000x the others (on
SmolLM2-135M the ``down`` projection's inputs reach 2,400x the median channel); a per-token
activation scale is set by them and every other channel lands on a few levels. Per input channel
``j`` of ``X W^T``::

    s_j = max|X_j|^a / max|W_j|^(1 - a),     X W^T = (X diag(s)^-1) (W diag(s))^T

exact in full precision; the product is then quantized as ``X diag(s)^-1`` (per token) times
``W diag(s)`` (per output channel), both flatter than before. ``a = 0.5`` is the paper's default.

``max|X_j|`` comes from a **calibration**: a fixed batch of token ids (the engine's
:data:`CALIBRATION_TEXT`) run through the full-precision weights being quantized, layer by layer,
at every push (so the factors follow the policy as it trains, and depend only on the weights: a
resumed run quantizes exactly as an uninterrupted one). The division by ``s`` is one elementwise
product on the activations inside the quantized call (:class:`SmoothedLinear`).
"""

from __future__ import annotations

import torch

from .base import QuantizedLinear

__all__ = [
    "CALIBRATION_TEXT",
    "CALIBRATION_TOKENS",
    "ActivationObserver",
    "SmoothedLinear",
    "check_strength",
    "smoothing_factors",
]

# Calibration text: chat-style maths, like the prompts and answers the sampler writes.
CALIBRATION_TEXT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Let's think step by step. In May she sold "
    "48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips. The answer is \\boxed{72}.\n"
    "Solve for x: 3x + 7 = 22. Subtract 7 from both sides: 3x = 15, so x = 5. Check: 3 * 5 + 7 = 22.\n"
    "The area of a circle of radius r is \\pi r^2; with r = 3 it is 9\\pi, about 28.27 square units. "
    "Write your final answer within \\boxed{}."
)

CALIBRATION_TOKENS = 256  # at most this many ids of it


def check_strength(a: float) -> float:
    """The migration strength must lie in [0, 1) (0 = no smoothing)."""
    a = float(a)
    if not 0.0 <= a < 1.0:
        raise ValueError(f"SmoothQuant migration strength must be in [0, 1), got {a}")
    return a


def smoothing_factors(x_amax: torch.Tensor, w: torch.Tensor, a: float, floor: float = 1e-5) -> torch.Tensor:
    """``s_j = max|X_j|^a / max|W_j|^(1-a)`` for input channels ``j`` of ``w [out, in]``, given the
    calibration's ``max|X_j|`` [in] (channels never seen active, or all-zero weight columns, get the
    floor instead of 0 or inf)."""
    xs = x_amax.float().clamp(min=floor)
    ws = w.detach().float().abs().amax(dim=0).clamp(min=floor)
    return (xs.pow(a) / ws.pow(1.0 - a)).clamp(min=floor)


class SmoothedLinear(QuantizedLinear):
    """``x Wᵀ`` as ``(x / s) (W s)ᵀ`` with ``W s`` quantized: ``inner`` holds the quantized
    ``W diag(s)``; ``inv_s = 1 / s`` [in]."""

    def __init__(self, inner: QuantizedLinear, inv_s: torch.Tensor):
        super().__init__(inner.out_features, inner.in_features)
        self.inner, self.inv_s = inner, inv_s.float()
        self.kernel, self.emulated = inner.kernel, inner.emulated

    def nbytes(self) -> int:
        return self.inner.nbytes() + self.inv_s.numel() * 4

    def dequantize(self) -> torch.Tensor:
        """The effective weight in the original basis: ``dequant(W s) / s``."""
        return self.inner.dequantize() * self.inv_s[None, :]

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return self.inner.matmul(x2 * self.inv_s)


class ActivationObserver(QuantizedLinear):
    """A full-precision weight that records ``max|X_j|`` per input channel of what it multiplies
    (the calibration's forward goes through the sampler's one ``linear()`` like any weight)."""

    def __init__(self, w: torch.Tensor):
        super().__init__(*w.shape)
        self.w = w
        self.amax = torch.zeros(w.shape[1], dtype=torch.float32, device=w.device)

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        self.amax = torch.maximum(self.amax, x2.abs().amax(dim=0))
        return x2 @ self.w.float().t()
