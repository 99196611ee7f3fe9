"""``torch.compile`` of the decode step (opt-in: ``RolloutEngine(..., compile=True)``).

One function per decoder layer, the same for every layer (the weights and the layer's cache buffers
are its arguments): RMSNorm → fused q/k/v → RoPE → write k, v at each row's slot (``index_put``, in
place) → attention over the cache's first ``L`` slots (:func:`sparserl.rollout.cache.attention`) →
o-proj → MLP. With a quantized KV cache (``kv_quant``) the step quantizes k, v on write (codes and
scales, :mod:`sparserl.rollout.kv_quant`) and attends over the codes with their scales.
Inductor fuses the norms, RoPE, softmax and SiLU into a few generated kernels (C++ on
CPU, Triton on CUDA); the matmuls stay library calls.

Shapes: the batch shrinks as rows finish (:meth:`CompressedKVCache.select` keeps the buffers dense,
no masked dead rows), the attended length ``L`` grows every step and the capacity changes between
calls; exactly these dimensions are marked dynamic (``maybe_mark_dynamic``) and none of their changes
recompiles. Everything else (weights, heads, head size) stays static: ``dynamic=True`` would make
every dimension of every weight a symbol too, and the symbolic-shape reasoning then costs ~30 s per
graph on 2 cores for no gain.
Compiled functions are shared by every engine over a model of the same shape (keyed by its
dimensions), so a second engine (another compressor) reuses the first one's compilation.

The same numbers as the eager step up to float reassociation inside fused kernels (tests: tokens and
log-probs within 1e-4 in float32 for every compressor).
"""

from __future__ import annotations

import torch

from .cache import CompressedKVCache, attention
from .kv_quant import get_kv_quantizer
from .model import SamplerModel, linear, mlp, project_qkv

_COMPILED: dict[tuple, object] = {}
_BACKEND: list[str] = []  # the backend whose compilations dynamo's cache holds now


def _layer_step(n_heads: int, n_kv: int, head_dim: int, eps: float, kv_quant: str = "none"):
    quant = get_kv_quantizer(kv_quant)

    def step(h, cos, sin, ln1, qkv_w, qkv_b, q_norm, k_norm, o, ln2, gate_up, down, K, V, KS, VS, slots, bias, acc):
        """h [B, hidden] → (h after the layer, q [B, Hq, 1, D]); writes K, V (their scales KS, VS when
        quantized, and acc) in place."""
        h = h[:, None, :]  # 2-D across the call: no guard on the stride of a size-1 dimension
        q, k, v = project_qkv(h, cos, sin, ln1, qkv_w, qkv_b, q_norm, k_norm, n_heads, n_kv, head_dim, eps)
        rows = torch.arange(q.shape[0], device=q.device)
        if quant.quantized:
            (kc, ks), (vc, vs) = quant.quantize(k[:, :, 0]), quant.quantize(v[:, :, 0])
            K[rows, :, slots], KS[rows, :, slots] = kc, ks
            V[rows, :, slots], VS[rows, :, slots] = vc, vs
            a, p = attention(q, K, V, bias, KS, VS, quant)
        else:
            K[rows, :, slots] = k[:, :, 0]
            V[rows, :, slots] = v[:, :, 0]
            a, p = attention(q, K, V, bias)
        if acc is not None:
            acc[:, :, : bias.shape[-1]] += p.sum(dim=2)
        h = h + linear(a[:, None, :], o)
        return (h + mlp(h, ln2, gate_up, down, eps))[:, 0], q

    return step


def compiled_layer_step(model: SamplerModel, backend: str = "inductor", kv_quant: str = "none"):
    """The compiled per-layer decode step for a model of this shape and KV storage (built once per
    shape, storage and backend)."""
    shape = (model.n_heads, model.n_kv, model.head_dim, float(model.eps), get_kv_quantizer(kv_quant).name)
    if _BACKEND and _BACKEND[0] != backend:  # dynamo caches by code object, not by backend: a switch
        torch._dynamo.reset()  # would silently reuse the other backend's graphs
    _BACKEND[:] = [backend]
    if (shape, backend) not in _COMPILED:
        _COMPILED[shape, backend] = torch.compile(_layer_step(*shape), backend=backend)
    return _COMPILED[shape, backend]


def decode_layers(
    model: SamplerModel,
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: CompressedKVCache,
    bias: torch.Tensor,
    backend: str = "inductor",
) -> torch.Tensor:
    """Run every layer of one decode step through the compiled layer step (after
    ``cache.begin_step``); returns the last hidden state [B, 1, hidden]."""
    step = compiled_layer_step(model, backend, cache.quant.name)
    slots = _dynamic(cache.write_slots(), 0)
    h, cos, sin, bias = h[:, 0].contiguous(), _dynamic(cos, 0), _dynamic(sin, 0), _dynamic(bias, 0, 3)
    for layer, lw in enumerate(model.layers):
        acc = _dynamic(cache.attn_acc[layer], 0, 2) if cache.attn_acc is not None else None
        ks, vs = (
            (_dynamic(cache.k_scale[layer], 0, 2), _dynamic(cache.v_scale[layer], 0, 2))
            if cache.k_scale is not None
            else (None, None)
        )
        h, q = step(
            _dynamic(h, 0),
            cos,
            sin,
            lw.ln1,
            lw.qkv,
            lw.qkv_bias,
            lw.q_norm,
            lw.k_norm,
            lw.o,
            lw.ln2,
            lw.gate_up,
            lw.down,
            _dynamic(cache.keys[layer], 0, 2),
            _dynamic(cache.values[layer], 0, 2),
            ks,
            vs,
            slots,
            bias,
            acc,
        )
        cache.record_query(layer, q)
    return h[:, None, :]


def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark the batch / length / capacity dimensions ``dims`` of ``t`` as dynamic (no recompilation
    when they change); returns ``t``."""
    for d in dims:
        torch._dynamo.maybe_mark_dynamic(t, d)
    return t
