"""INT8 weight-only: the weights stored as int8 with symmetric per-output-channel scales (the same
quantization as QuRL's W8A8 weights, :func:`.int8.quantize_int8_per_channel`), the activations left
in float::

    Y_to = s_o Σ_i X_ti Q_oi

Kernel: the int8 values converted to float inside each call and one float matmul, the scales
applied to the output columns (``F.linear(x, Q.float()) * s``). Measured on this 2-core AVX2 CPU
for the decode's four products of SmolLM2-135M: that runs 5.7x (16 rows) and 3.2x (64 rows) slower
than the oneDNN-packed float32 product, and ``torch._weight_int8pack_mm`` (torch's int8 weight-only
CPU kernel) 18x and 40x slower (docs/results/bench_quant.md). Its use is the memory: a quarter of
the float32 weight bytes; it is not a speed path here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import QUANTS, QuantizedLinear, WeightQuantizer
from .int8 import dequantize_int8_per_channel, quantize_int8_per_channel


class Int8WeightOnlyLinear(QuantizedLinear):
    kernel = "dequantize+matmul"

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        super().__init__(*q.shape)
        self.q, self.scales = q, scales

    def nbytes(self) -> int:
        return self.numel() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8_per_channel(self.q, self.scales)

    def matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return F.linear(x2, self.q.float()) * self.scales


@QUANTS.register("int8_weight_only")
class Int8WeightOnly(WeightQuantizer):
    name = "int8_weight_only"

    def quantize(self, w: torch.Tensor) -> Int8WeightOnlyLinear:
        return Int8WeightOnlyLinear(*quantize_int8_per_channel(w))

    def codes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_int8_per_channel(w)

    def kernel_on(self, device) -> str:
        return Int8WeightOnlyLinear.kernel
