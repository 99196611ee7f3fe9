"""Outlier input channels in full precision (``rollout.quant_outliers: k``; 0 = off).

The mixed-precision decomposition of LLM.int8() (Dettmers et al. 2022, arXiv 2208.07339): a few
input channels of a decoder's linear layers carry activations far above the rest (on SmolLM2-135M
the ``down`` projection's inputs reach 2,400x the median channel), and a per-token int8 scale set
by them leaves every other channel on a few levels. Split the product over the input channels ``O``
(the outliers) and the rest ``R``::

    X Wᵀ = X_R W_Rᵀ  (int8: per-token scales over R only, per-channel weight scales over R only)
         + X_O W_Oᵀ  (full precision)

LLM.int8() picks ``O`` per call (any channel with a value above 6). Here ``O`` is fixed per
push, as QUIK (Ashkboos et al. 2023, arXiv 2310.09259) does: the ``k`` channels with the largest
``max|X_j|`` on the sampler's calibration text (the observer SmoothQuant uses,
:mod:`sparserl.rollout.quant.smooth`), re-chosen at every push from the weights being pushed. A
fixed ``O`` keeps the int8 kernel's layout and makes the full-precision part one small product
(``k`` columns). With SmoothQuant on as well, the channels are chosen on the smoothed inputs.

Measured on SmolLM2-135M (teacher-forced α against the float32 sampler on real text,
``docs/results/smoothquant.md``): ``int8`` 0.931 → 0.971 with ``k = 16``; with
SmoothQuant 0.5 as well, 0.972 (``k = 8``) and 0.974 (``k = 16``). On the bench's generated tokens
0.957-0.961 (``k = 16`` + SmoothQuant), where the 8-bit weights alone reach 0.974.
"""

from __future__ import annotations

import torch

from ...errors import SparserlError
from .. import native
from .base import QuantizedLinear, WeightQuantizer
from .int8 import Int8Linear
from .int8_group import Int8GroupLinear

__all__ = ["OutlierCountError", "OutlierLinear", "check_outliers", "check_outliers_fit", "outlier_channels"]


class OutlierCountError(SparserlError, ValueError):
    """``rollout.quant_outliers`` takes every input of one of the model's quantized linears."""


def check_outliers(k: int) -> int:
    """The number of outlier channels must be a non-negative integer (0 = none)."""
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"the number of outlier channels must be an integer >= 0, got {k!r}")
    return int(k)


def _too_many(k: int, inputs: int) -> OutlierCountError:
    return OutlierCountError(
        f"rollout.quant_outliers={k}: {k} outlier channels leave none of a linear's "
        f"{inputs} inputs to quantize (take fewer than {inputs})"
    )


def check_outliers_fit(k: int, config) -> None:
    """Before any work: ``k`` must leave inputs to quantize in every quantized linear of a model
    with this (Hugging Face) config: q/k/v and gate/up take ``hidden_size`` inputs, o the heads'
    width, down ``intermediate_size`` (the LM head ``hidden_size`` too)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inputs = min(config.hidden_size, config.num_attention_heads * head_dim, config.intermediate_size)
    if k >= inputs:
        raise _too_many(k, inputs)


def outlier_channels(x_amax: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` input channels of largest calibrated ``max|X_j|`` [in], ascending (int64 [k])."""
    if k >= x_amax.numel():
        raise _too_many(k, x_amax.numel())
    return torch.topk(x_amax.float(), k).indices.sort().values


class OutlierLinear(QuantizedLinear):
    """``x Wᵀ`` as ``x_R W_Rᵀ`` on ``inner`` (the quantized weight with columns ``idx`` zeroed;
    its inputs at ``idx`` zeroed too, so its activation scales see only ``R``) plus
    ``x_O W_Oᵀ`` in float32 (``w_outliers = W[:, idx]``). With a native ``int8`` / ``int8_group``
    inner weight both parts run in one C call (``linear_int8.c``: the float32 part inside the int8
    product's loop over output panels), the one the fused decode step makes too."""

    def __init__(self, inner: QuantizedLinear, idx: torch.Tensor, w_outliers: torch.Tensor):
        super().__init__(inner.out_features, inner.in_features)
        self.inner, self.idx = inner, idx.long()
        self.w_outliers = w_outliers.detach().float().contiguous()  # [out, k]
        self.idx32 = self.idx.to(torch.int32).contiguous()  # the C kernel's indices
        self.kernel, self.emulated = inner.kernel, inner.emulated
        native_inner = isinstance(inner, (Int8Linear, Int8GroupLinear)) and inner.native is not None
        self.panels = native.pack_outliers(self.w_outliers) if native_inner else None
        self.group = inner.group if isinstance(inner, Int8GroupLinear) else None

    @classmethod
    def quantize(cls, quantizer: WeightQuantizer, w: torch.Tensor, idx: torch.Tensor) -> OutlierLinear:
        """``w`` [out, in] with the columns ``idx`` kept in float32 and the rest quantized."""
        rest = w.detach().clone()
        rest[:, idx] = 0
        return cls(quantizer.quantize(rest), idx, w.detach()[:, idx])

    def nbytes(self) -> int:
        return self.inner.nbytes() + self.w_outliers.numel() * 4 + self.idx.numel() * 4

    def dequantize(self) -> torch.Tensor:
        w = self.inner.dequantize().clone()
        w[:, self.idx] = self.w_outliers
        return w

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if self.panels is not None and native.active():
            scales, group_scales, group_colsum = (
                self.inner.kernel_scales if self.group is not None else (self.inner.scales, None, None)
            )
            y = native.linear_int8_outliers(
                x2,
                self.inner.native,
                scales,
                self.idx32,
                self.panels,
                group=self.group,
                group_scales=group_scales,
                group_colsum=group_colsum,
            )
            if y is not None:
                return y
        rest = x2.clone()
        outliers = rest[:, self.idx]  # a copy (gather)
        rest[:, self.idx] = 0
        return self.inner.matmul(rest).add_(outliers @ self.w_outliers.t())
