"""KV-cache compressors, one file each (docs/algorithms.md §2), ``none`` (dense) among them.

``build_compressor(name, kv_budget=..., options=...)`` / ``compressor_from_fields(cfg.rollout)``
build one from options; ``get_compressor(name, **fields)`` from its own field names."""

from . import blocktopk, h2o, none, rkv, snapkv, streaming  # noqa: F401  (imported to register them)
from .base import (
    COMPRESSORS,
    CompressorOptionError,
    KVCompressor,
    ScoreInputs,
    available_compressors,
    get_compressor,
    option_names,
    register,
)
from .build import build_compressor, compressor_from_fields
from .none import Dense

__all__ = [
    "COMPRESSORS",
    "CompressorOptionError",
    "Dense",
    "KVCompressor",
    "ScoreInputs",
    "available_compressors",
    "build_compressor",
    "compressor_from_fields",
    "get_compressor",
    "option_names",
    "register",
]
