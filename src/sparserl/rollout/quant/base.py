"""What every weight quantizer of the sampler is: a :class:`WeightQuantizer` turns a linear weight
``W [out, in]`` into a :class:`QuantizedLinear`, a callable ``y = x Wᵀ (+ b)`` that holds only the
quantized values and their scales (no full-precision copy: memory is half the point).

The sampler's one ``linear()`` (:func:`sparserl.rollout.model.linear`) calls a quantized weight as
``w(x, b)``; plain tensors keep the float path.
"""

from __future__ import annotations

import torch

from ...registry import Registry

QUANTS: Registry[type[WeightQuantizer]] = Registry("rollout.quant")


class QuantizedLinear:
    """A quantized weight: ``self(x, b)`` = x Wᵀ (+ b) for x [..., in]; output in x's dtype."""

    kernel: str = ""  # what runs the product (e.g. "fbgemm", "_int_mm", "emulated")
    emulated: bool = False  # True when the low-precision product is simulated in float32

    def __init__(self, out_features: int, in_features: int):
        self.out_features, self.in_features = out_features, in_features

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def numel(self) -> int:
        return self.out_features * self.in_features

    def nbytes(self) -> int:
        """Bytes held: quantized values plus scales."""
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """The weight the product effectively uses, float32 [out, in] (tests, diagnostics)."""
        raise NotImplementedError

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [rows, in] float32 → [rows, out] float32."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float()
        y = self.matmul(x2)
        if b is not None:
            y = y + b.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class WeightQuantizer:
    """Builds the :class:`QuantizedLinear` of a weight (on the weight's device)."""

    name = ""
    quantizes = True  # False for ``none``: the sampler keeps its float weights
    quantizes_activations = False  # True for W8A8-style methods (int8, fp8): SmoothQuant applies
    takes_group = False  # True when the activation scales are per group of inputs (rollout.quant_group)

    def quantize(self, w: torch.Tensor) -> QuantizedLinear:
        raise NotImplementedError

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, scales)`` of ``w`` on the grid :meth:`quantize` uses on ``w``'s device (codes
        comparable with ``!=``): what ``quant/update_visible_frac`` compares before and after a step."""
        raise NotImplementedError

    def emulated_on(self, device: torch.device | str) -> bool:
        """Whether the product is simulated in float32 on this device (the bench prints it)."""
        return False

    def kernel_on(self, device: torch.device | str) -> str:
        """What runs the product on this device."""
        return ""


def nbytes(w) -> int:
    """Bytes of a linear weight as the sampler holds it (a tensor or a :class:`QuantizedLinear`)."""
    return w.nbytes() if isinstance(w, QuantizedLinear) else w.numel() * w.element_size()
