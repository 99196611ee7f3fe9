"""KV-cache quantizers (``rollout.kv_quant``: ``none | int8 | fp8``): what the sampler's cache stores
per cached key / value vector.

Granularity: one symmetric float32 scale per [token, KV head] vector of ``head_dim`` elements
(KIVI, Liu et al. 2024, arXiv 2402.02750, quantizes keys per channel and values per token;
KVQuant, Hooper et al. 2024, arXiv 2401.18079, per channel with outliers; FP8-RL, 2026, stores an
FP8 KV cache whose per-tensor scales are recalibrated at every training step):

    int8:  s = max_i |x_i| / 127,   c_i = clamp(round(x_i / s), -127, 127)  (int8),    x̂_i = c_i s
           |x_i - x̂_i| <= s / 2
    fp8:   s = max_i |x_i| / 448,   c_i = E4M3(x_i / s)  (torch.float8_e4m3fn, round to nearest even),
           x̂_i = c_i s;   |x_i - x̂_i| <= max(|x_i| / 16, s · 2^-10)  (3 mantissa bits: half an ulp
           is 2^-4 relative for normal codes; subnormal codes are spaced 2^-9, so half a step 2^-10)

Why per token and head rather than FP8-RL's per-step scales: a scale computed from the vector being
written needs no calibration at all, so nothing goes stale when the learner pushes a new policy
between steps (a per-tensor scale calibrated on the previous policy's activations can clip the new
one's outliers, which is why FP8-RL must recalibrate at every step), and no pass over a calibration
batch is needed. Per-token scales also survive eviction as they are: a compressor moves a kept
token's scale with its codes, whereas per-channel (KIVI-key-style) scales are shared by a group of
tokens and would have to be recomputed when the group's members are evicted. The price is 4 bytes per
vector: with ``head_dim`` 64, 64 + 4 bytes instead of 256 (0.27x float32, 0.53x bfloat16).

Storage is really one byte per element (int8 codes, or ``torch.float8_e4m3fn`` codes) plus the float32
scales. Attention reads the codes and applies the scales per token after the products
(:func:`sparserl.rollout.cache.attention`: ``q · (c s) = (q · c) s`` and ``Σ p_j s_j c_j``), so it never
materialises scaled keys. On CPU the fused kernel (:mod:`sparserl.rollout.native`) reads the one-byte
codes directly and widens them in registers; elsewhere the torch path widens the codes to the compute
dtype for the matmuls. Either way the products run in float32: the memory saving is real, the
arithmetic is not faster, and quantizing every written vector costs a few small operators per layer
(measured at 1,024 tokens, batch 16: int8 KV 0.90x and fp8 KV 0.66x the float32 cache's tokens/s,
``docs/results/native_attention.md``). The fused CPU step writes int8 codes in the layer's C call
instead (``decode_layer.c``, this formula in the same float32 operations): there int8 KV runs 1.04x the
bf16 cache (``docs/results/bf16_decode/``). Widening fp8 codes with ``.to(float32)`` takes ~50 ns per
element on CPU (scalar), so on CPU the codes are widened by bit arithmetic through float16 instead
(:meth:`FP8.widen`, exact; the kernel does the same with F16C); on CUDA the native conversion is used.
"""

from __future__ import annotations

import torch

from ..registry import Registry

__all__ = ["KV_QUANTIZERS", "KVQuantizer", "available_kv_quants", "get_kv_quantizer", "kv_bytes_per_token"]

SCALE_DTYPE = torch.float32
SCALE_BYTES = 4


class KVQuantizer:
    """``none``: the cache stores keys / values in the sampler dtype (no scales)."""

    name = "none"
    storage: torch.dtype | None = None  # the codes' dtype (None: the sampler dtype, no codes)
    qmax = 0.0  # the largest code magnitude

    @property
    def quantized(self) -> bool:
        return self.storage is not None

    def storage_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.storage or dtype

    def bytes_per_vector(self, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one cached [token, KV head] vector takes (codes + scale)."""
        if not self.quantized:
            return head_dim * torch.empty(0, dtype=dtype).element_size()
        return head_dim * torch.empty(0, dtype=self.storage).element_size() + SCALE_BYTES

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., D] → (codes [..., D] in :attr:`storage`, scale [...] float32)."""
        scale = x.detach().abs().amax(dim=-1).float().div_(self.qmax).clamp_(min=torch.finfo(SCALE_DTYPE).tiny)
        return self._encode(x.float() / scale[..., None]), scale

    def _encode(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def widen(self, codes: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
        """Codes [..., D] → (values in ``dtype``, unit): the code values are ``values * unit``
        (exact; the unit lets a backend's fastest exact conversion return scaled values)."""
        return codes.to(dtype), 1.0

    def dequantize(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(codes [..., D], scale [...]) → x̂ [..., D] in ``dtype`` (computed in float32)."""
        values, unit = self.widen(codes, torch.float32)
        return (values * (scale.float() * unit)[..., None]).to(dtype)


class Int8(KVQuantizer):
    name = "int8"
    storage = torch.int8
    qmax = 127.0

    def _encode(self, y: torch.Tensor) -> torch.Tensor:
        return y.round_().clamp_(-127, 127).to(torch.int8)


class FP8(KVQuantizer):
    name = "fp8"
    storage = torch.float8_e4m3fn
    qmax = 448.0  # the largest finite E4M3 value

    def _encode(self, y: torch.Tensor) -> torch.Tensor:
        return y.clamp_(-self.qmax, self.qmax).to(torch.float8_e4m3fn)

    def widen(self, codes: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
        """On CUDA the native conversion; elsewhere exact bit arithmetic: E4M3 ``s eeee mmm`` shifted
        left by 7 is the float16 ``s 0eeee mmm0000000`` = the code times 2^-8 (subnormal codes land
        on float16 subnormals with the same factor), then one float16 → ``dtype`` conversion (F16C).
        The sign-extended shift sets bit 14 for negative codes; the mask clears it."""
        if codes.device.type == "cuda":
            return codes.to(dtype), 1.0
        bits = codes.view(torch.int8).to(torch.int16)
        bits.bitwise_left_shift_(7).bitwise_and_(~(1 << 14))
        return bits.view(torch.float16).to(dtype), 256.0


KV_QUANTIZERS: Registry[KVQuantizer] = Registry("rollout.kv_quant")
for _q in (KVQuantizer(), Int8(), FP8()):
    KV_QUANTIZERS.register(_q.name)(_q)
del _q


def get_kv_quantizer(name: str | KVQuantizer) -> KVQuantizer:
    """The quantizer named ``name`` (a quantizer passes through). Unknown names raise
    :class:`~sparserl.registry.UnknownNameError` (a ``SparserlError``) naming ``rollout.kv_quant``
    with a did-you-mean hint."""
    if isinstance(name, KVQuantizer):
        return name
    return KV_QUANTIZERS.get(name)


def available_kv_quants() -> list[str]:
    """Every ``rollout.kv_quant`` name: the one list the config, the CLI and the bench use."""
    return KV_QUANTIZERS.names()


def kv_bytes_per_token(n_layers: int, n_kv: int, head_dim: int, dtype: torch.dtype, kv_quant: str = "none") -> int:
    """Bytes of K and V one token occupies over all layers and KV heads, codes and scales counted."""
    return 2 * n_layers * n_kv * get_kv_quantizer(kv_quant).bytes_per_vector(head_dim, dtype)
