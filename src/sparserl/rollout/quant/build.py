"""The one list of weight-quantizer names (``rollout.quant``) and the one builder.

available_quants()      # ['fp8', 'int8', 'int8_group', 'int8_weight_only', 'none']
build_quant("int8")     # an Int8W8A8; an unknown name raises UnknownNameError with did-you-mean
"""

from __future__ import annotations

from . import fp8, int8, int8_group, int8_weight_only, none  # noqa: F401  (imported to register them)
from .base import QUANTS, WeightQuantizer


def available_quants() -> list[str]:
    return QUANTS.names()


def build_quant(name: str, group: int | None = None) -> WeightQuantizer:
    """The quantizer named ``name`` (``rollout.quant``); a :class:`WeightQuantizer` passes through.
    ``group`` (``rollout.quant_group``): inputs per scale, for the quantizers that take
    one (``int8_group``); ignored by the others (the config rejects it with them)."""
    if isinstance(name, WeightQuantizer):
        return name
    cls = QUANTS.get(name)
    return cls(group=group) if group is not None and cls.takes_group else cls()
