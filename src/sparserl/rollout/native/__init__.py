"""Native CPU kernels of the sampler, compiled on first use with the machine's C compiler.

Eight C sources, one library; each source's Python wrappers sit beside it under the same stem:

- ``decode_attention.c`` (:mod:`.decode_attention`): the fused decode attention, which the cache's
  :func:`sparserl.rollout.cache.attention` uses on CPU for float32 K/V and int8 / fp8 KV codes;
- ``linear.c`` (:mod:`.linear`): the decode step's float32 weight products ``x Wᵀ (+ b)`` for a few
  rows, on weights packed once in panels (:func:`pack_linear`; :func:`sparserl.rollout.model.linear`
  uses it);
- ``layer_ops.c`` (:mod:`.layer_ops`): the small operators of a layer, each in one pass: RMSNorm
  (:func:`rms_norm`), SiLU(gate)·up (:func:`silu_mul`) and RoPE in place (:func:`rope_`);
- ``linear_int8.c`` (:mod:`.linear_int8`): the ``int8`` sampler's W8A8 products with per-token
  activation scales on AVX2 integer instructions (:func:`pack_int8`, :func:`linear_int8`;
  :mod:`sparserl.rollout.quant.int8`), and ``int8_group``'s with per-group scales and the full 8-bit
  weight grid (``linear_int8(group=G)``; :mod:`sparserl.rollout.quant.int8_group`);
- ``decode_layer.c``: a whole decode layer in two calls around the attention, every product through
  one weight descriptor (:class:`Weight`, in :mod:`.structs`: float32 panels, ``int8``, ``int8_group``,
  SmoothQuant's ``1/s``); :mod:`sparserl.rollout.fused` calls it on the library directly;
- ``kv_scores.c`` (:mod:`.kv_scores`): the compressors' scores without their large temporaries: R-KV's
  redundancy term (:func:`rkv_redundancy`) and the observation-window attention (:func:`window_attention`);
- ``linear_bf16.c`` (:mod:`.linear_bf16`): the weight products in bfloat16 with float32 sums
  (:func:`pack_linear_bf16`, :func:`linear_bf16`): AVX512-BF16's ``vdpbf16ps``, AMX tiles where the
  CPU has them (:func:`bf16_kernel` says which runs), AVX2 or plain C elsewhere;
- ``blocktopk.c`` (:mod:`.blocktopk`): block top-k sparse attention (:func:`blocktopk_attention`;
  :mod:`sparserl.rollout.kv.blocktopk`).

All are plain C (AVX2 intrinsics where the compiler targets them, OpenMP), loaded with :mod:`ctypes`:
no torch headers, so they compile in about a second. :mod:`.compiler` builds, caches and loads the
library and holds the switches (``SPARSERL_NATIVE=0``, :func:`torch_only`); :mod:`.structs` the C
structs; :mod:`.operands` the shaping of a product's operands. Every wrapper returns None (or False)
where the kernel does not take its input, and the caller runs torch.

This package re-exports the names its callers use (``native.linear(...)``).
"""

from .blocktopk import blocktopk_attention
from .compiler import (
    FLAGS,
    HEADERS,
    ISA,
    SOURCES,
    NativeArchError,
    _compiler,  # noqa: F401  (tests ask whether this machine has a C compiler)
    active,
    build,
    cache_dir,
    cpu_flags,
    default_flags,
    enabled,
    flags_for,
    isa,
    kernels,
    library,
    load,
    reset,
    torch_only,
)
from .decode_attention import KV_TYPES, SCALED_KV, UNIT, decode_attention
from .kv_scores import rkv_redundancy, window_attention
from .layer_ops import rms_norm, rope_, silu_mul
from .linear import linear, pack_linear
from .linear_bf16 import (
    BF16_KERNEL_LAYOUT,
    BF16_KERNELS,
    BF16_LAYOUTS,
    bf16_kernel,
    bf16_kernel_of,
    bf16_kernels,
    linear_bf16,
    pack_linear_bf16,
    to_bf16,
    unpack_bf16,
)
from .linear_int8 import (
    int8_full_range,
    int8_group_u8,
    linear_int8,
    linear_int8_outliers,
    pack_group_colsums,
    pack_group_scales,
    pack_int8,
    pack_outliers,
    unpack_int8,
)
from .structs import Weight

__all__ = [
    "BF16_KERNELS",
    "BF16_KERNEL_LAYOUT",
    "BF16_LAYOUTS",
    "FLAGS",
    "HEADERS",
    "ISA",
    "KV_TYPES",
    "NativeArchError",
    "SCALED_KV",
    "SOURCES",
    "UNIT",
    "Weight",
    "active",
    "bf16_kernel",
    "bf16_kernel_of",
    "bf16_kernels",
    "blocktopk_attention",
    "build",
    "cache_dir",
    "cpu_flags",
    "decode_attention",
    "default_flags",
    "enabled",
    "flags_for",
    "int8_full_range",
    "int8_group_u8",
    "isa",
    "kernels",
    "library",
    "linear",
    "linear_bf16",
    "linear_int8",
    "linear_int8_outliers",
    "load",
    "pack_group_colsums",
    "pack_group_scales",
    "pack_int8",
    "pack_linear",
    "pack_linear_bf16",
    "pack_outliers",
    "reset",
    "rkv_redundancy",
    "rms_norm",
    "rope_",
    "silu_mul",
    "to_bf16",
    "torch_only",
    "unpack_bf16",
    "unpack_int8",
    "window_attention",
]
