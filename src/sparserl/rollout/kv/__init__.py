"""KV-cache compressors, one file each (ALGORITHMS.md §2). ``get_compressor(name, **options)``."""
from .base import KVCompressor, ScoreInputs, available_compressors, get_compressor, register
from . import h2o, rkv, snapkv, streaming  # noqa: F401  (registration)

__all__ = ["KVCompressor", "ScoreInputs", "available_compressors", "get_compressor", "register"]
