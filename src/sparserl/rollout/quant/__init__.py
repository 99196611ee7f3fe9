"""Weight quantizers of the sampler (``rollout.quant``): ``none``, ``int8`` (QuRL W8A8),
``int8_weight_only`` and ``fp8`` (FP8-RL E4M3). One list of names (:func:`available_quants`), one
builder (:func:`build_quant`); each method in its own file, named as its paper names it."""

from .base import QUANTS, QuantizedLinear, WeightQuantizer, nbytes
from .build import available_quants, build_quant

__all__ = ["QUANTS", "QuantizedLinear", "WeightQuantizer", "available_quants", "build_quant", "nbytes"]
