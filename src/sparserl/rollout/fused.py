"""The fused decode step on CPU: each decoder layer in three native calls.

The eager step (:meth:`sparserl.rollout.engine.RolloutEngine._decode`) calls ~20 operators a layer
from Python: the norms, the four products, RoPE, the cache write, the attention, SiLU·up, views
and transposes. On the project's 2-core CPU each costs 10-40 µs in its wrapper and torch's
dispatch before any arithmetic, over 10 ms of a ~100-ms step of SmolLM2-135M at batch 16
(docs/results/engine_profile.md). Here a layer is

1. ``sparserl_layer_qkv`` (``native/decode_layer.c``): RMSNorm, the fused q/k/v product, RoPE, and
   k, v stored at each row's slot of a float32 cache;
2. the fused attention over the cache (``decode_attention.c``), called with addresses computed
   here (block top-k's sparse layers: its own kernel, ``blocktopk.c``, through the cache's selector);
   a quantized KV cache (``kv_quant``) takes :meth:`CompressedKVCache.attend` instead;
3. ``sparserl_layer_mlp``: ``h += a Woᵀ``, RMSNorm, gate/up, SiLU·up, ``h += act Wdownᵀ``.

The same kernels in the same order as the eager step, so the same numbers to the bit (tested for
float32, ``int8``, ``int8_group`` and SmoothQuant weights, a quantized KV cache and every
compressor). Weights the kernels do not take (``fp8``, ``int8_weight_only``, torch-only
packings), per-head q/k norms (Qwen3), another device or dtype, or native kernels off: the eager
step runs (:func:`decode_layers` returns None).

A bfloat16 sampler runs the same three calls with its weights as bf16 panels
(``linear_bf16.c``: ``vdpbf16ps`` on AVX512-BF16, AMX tiles where the CPU has them) and its KV cache
in bf16 (written rounded to nearest even, read widened exactly); everything else in float32: the
residual stream, the norms, RoPE (cos / sin computed in float32), SiLU·up, the attention's softmax and
sums, the LM head's sums and the sampling. Only the weights, each product's inputs and the cache are
rounded to bf16, where the eager bf16 step rounds every intermediate: it is not the eager step's bits
but closer to the float32 policy (tested). Block top-k reads its chosen pages of the bf16 cache in its own
kernel (``blocktopk.c``); a quantized KV cache takes the cache's own attention between the native calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from . import native
from .cache import CompressedKVCache
from .model import NATIVE_BF16, NATIVE_PACKED, SamplerModel, rms_norm
from .quant.int8 import Int8Linear
from .quant.int8_group import Int8GroupLinear
from .quant.outliers import OutlierLinear
from .quant.smooth import SmoothedLinear


def weight_descriptor(w, bias: torch.Tensor | None = None) -> native.Weight | None:
    """:class:`native.Weight` for a sampler weight (float32 panels, a native ``int8`` /
    ``int8_group`` weight, either with outlier channels in float32 and/or behind SmoothQuant's 1/s),
    or None."""
    smooth, outliers = None, {}
    if isinstance(w, SmoothedLinear):
        w, smooth = w.inner, w.inv_s
    if isinstance(w, OutlierLinear):
        if w.panels is None:
            return None
        w, outliers = w.inner, {"outlier_idx": w.idx32, "outlier_panels": w.panels}
    if isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16:
        panels = getattr(w, NATIVE_BF16, None)
        if panels is None or smooth is not None:
            return None
        return native.Weight.of(
            native.Weight.BF16,
            panels,
            panels.out_features,
            panels.in_features,
            bias=None if bias is None else bias.float().contiguous(),
        )
    if isinstance(w, torch.Tensor):
        panels = getattr(w, NATIVE_PACKED, None)
        if panels is None or smooth is not None:
            return None
        return native.Weight.of(native.Weight.FLOAT32, panels, panels.out_features, panels.in_features, bias=bias)
    if isinstance(w, Int8Linear) and w.native is not None:
        return native.Weight.of(
            native.Weight.INT8,
            w.native[0],
            w.out_features,
            w.in_features,
            colsum=w.native[1],
            scales=w.scales,
            bias=bias,
            smooth=smooth,
            **outliers,
        )
    if isinstance(w, Int8GroupLinear) and w.native is not None:
        ones, packed, sums = w.kernel_scales
        return native.Weight.of(
            native.Weight.INT8_GROUP,
            w.native[0],
            w.out_features,
            w.in_features,
            group=w.group,
            colsum=sums,
            scales=ones,
            group_scales=packed,
            bias=bias,
            smooth=smooth,
            **outliers,
        )
    return None


@dataclass
class FusedLayer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: native.Weight
    o: native.Weight
    gate_up: native.Weight
    down: native.Weight


class FusedLayers:
    """Every layer's descriptors for one set of sampler weights, and the step's scratch buffers
    per batch size."""

    def __init__(self, model: SamplerModel):
        self.source = model.layers  # the weights these describe: a push (load_weights) makes a new list
        self.layers: list[FusedLayer] | None = []
        for lw in model.layers:
            parts = [
                weight_descriptor(lw.qkv, lw.qkv_bias),
                weight_descriptor(lw.o),
                weight_descriptor(lw.gate_up),
                weight_descriptor(lw.down),
            ]
            if any(d is None for d in parts) or lw.q_norm is not None:
                self.layers = None
                return
            self.layers.append(FusedLayer(lw.ln1.float().contiguous(), lw.ln2.float().contiguous(), *parts))
        self.norm = model.norm.float().contiguous()  # the final norm in float32 (:func:`logits`)
        self.head = getattr(model.lm_head, NATIVE_BF16, None) if model.dtype == torch.bfloat16 else None
        self.width = (model.n_heads + 2 * model.n_kv) * model.head_dim
        self.inter = self.layers[0].gate_up.N // 2 if self.layers else 0
        self._buffers: dict[int, dict] = {}

    def buffers(self, model: SamplerModel, B: int) -> dict:
        buf = self._buffers.get(B)
        if buf is None:
            hq, hkv, D = model.n_heads, model.n_kv, model.head_dim
            qkv = torch.empty(B, self.width)
            heads = qkv.view(B, 1, hq + 2 * hkv, D)
            buf = {
                "x": torch.empty(B, model.hidden),
                "qkv": qkv,
                "a": torch.empty(B, hq * D),
                "gu": torch.empty(B, 2 * self.inter),
                "act": torch.empty(B, self.inter),
                # the eager step's q, k, v [B, H, 1, D]: views of qkv
                "q": heads[:, :, :hq].transpose(1, 2),
                "k": heads[:, :, hq : hq + hkv].transpose(1, 2),
                "v": heads[:, :, hq + hkv :].transpose(1, 2),
            }
            self._buffers = {B: buf}  # the batch only shrinks within a generate: keep one size
        return buf

    def layer_qkv(self, model: SamplerModel, B: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One q/k/v buffer per layer [L, B, width] and its queries [L, B, Hq, D]: with a cache that
        keeps the observation window's queries, every layer writes its own, and the ring takes all
        of them in one copy after the step."""
        buf = self.buffers(model, B)
        if "qkv_layers" not in buf:
            hq, hkv, D = model.n_heads, model.n_kv, model.head_dim
            qkv = torch.empty(len(self.layers), B, self.width)
            buf["qkv_layers"] = qkv, qkv.view(len(self.layers), B, hq + 2 * hkv, D)[:, :, :hq]
        return buf["qkv_layers"]


def fused_layers(model: SamplerModel) -> FusedLayers | None:
    """The model's :class:`FusedLayers` (rebuilt after a weight push), or None when its weights
    are not all ones the native layer takes."""
    plan = getattr(model, "_fused_layers", None)
    if plan is None or plan.source is not model.layers:
        plan = FusedLayers(model)
        model._fused_layers = plan
    return plan if plan.layers else None


def available(model: SamplerModel) -> bool:
    """Whether :func:`decode_layers` runs on this model now."""
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and native.active()
        and not torch.compiler.is_compiling()
        and fused_layers(model) is not None
    )


def final_norm(model: SamplerModel, h: torch.Tensor) -> torch.Tensor:
    """The input of :func:`head` from :func:`decode_layers`' output h [B, hidden] (float32), in the
    sampler's dtype: the final norm (for a bf16 sampler on its head's panels, in float32 and then rounded
    to bf16 as the kernel rounds its input, to nearest even: the same numbers the kernel reads)."""
    if model.dtype == torch.float32:
        return model.final_norm(h)
    plan = fused_layers(model)
    if plan.head is None:
        return model.final_norm(h.to(model.dtype))
    return rms_norm(h, plan.norm, model.eps).to(model.dtype)


def head(model: SamplerModel, x: torch.Tensor) -> torch.Tensor:
    """Float32 logits of :func:`final_norm`'s output x: the model's own head for a float32 sampler or a float32
    head (``fp32_head``); for a bf16 one, the head's bf16 panels with float32 sums (the eager bf16 head where it
    has none)."""
    if model.dtype == torch.float32 or model.fp32_head:
        return model.head(x).float()
    plan = fused_layers(model)
    out = native.linear_bf16(x.float(), plan.head) if plan.head is not None else None
    return out if out is not None else model.head(x.to(model.dtype)).float()


def logits(model: SamplerModel, h: torch.Tensor) -> torch.Tensor:
    """Float32 logits of :func:`decode_layers`' output h [B, hidden] (float32): :func:`head` of
    :func:`final_norm`."""
    return head(model, final_norm(model, h))


def decode_layers(
    model: SamplerModel,
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: CompressedKVCache,
    bias: torch.Tensor,
) -> torch.Tensor | None:
    """Every layer of one decode step (after ``cache.begin_step``) on the native layer: h [B, 1,
    hidden] (a float32 h is updated in place; the result is float32 in every case, :func:`logits` takes
    it), cos / sin [B, 1, D] float32, bias [B, 1, 1, L]. None, with nothing done, when :func:`available`
    is False."""
    if not available(model):
        return None
    plan, lib = fused_layers(model), native.library()
    B, hidden = h.shape[0], model.hidden
    hq, hkv, D = model.n_heads, model.n_kv, model.head_dim
    h, cos, sin, bias = h.float().contiguous(), cos.float().contiguous(), sin.float().contiguous(), bias.contiguous()
    buf = plan.buffers(model, B)
    x, qkv, a, gu, act = (buf[k].data_ptr() for k in ("x", "qkv", "a", "gu", "act"))
    hp, cp, sp, bp = h.data_ptr(), cos.data_ptr(), sin.data_ptr(), bias.data_ptr()
    L = bias.shape[-1]
    keys, values = cache.keys, cache.values
    selector = cache.selector
    int8_kv = keys.dtype == torch.int8  # codes and per-vector scales, written by the layer's C call
    direct = (
        keys.dtype in (torch.float32, torch.bfloat16, torch.int8)
        and (cache.k_scale is not None) == int8_kv
        and keys.stride() == values.stride()
        and keys.stride(-1) == 1
        and L <= keys.shape[3]
        and (not int8_kv or (cache.k_scale.stride() == cache.v_scale.stride() and cache.k_scale.stride(-1) == 1))
        and (selector is None or (selector.native_ok(cache) and not int8_kv))
    )
    if direct:  # the slot writes and the attention in C, at addresses computed here
        slots = cache.write_slots().to(torch.int64).contiguous()
        p = torch.empty(B, hkv, hq // hkv, L)
        item = keys.element_size()
        layer_bytes, (sb, sh, ss) = keys.stride(0) * item, keys.stride()[1:4]
        k0, v0 = keys.data_ptr(), values.data_ptr()
        kv_type = native.KV_TYPES[keys.dtype]
        ks0 = vs0 = None
        scale_layer_bytes = s_sb = s_sh = 0
        if int8_kv:
            k_scale, v_scale = cache.k_scale, cache.v_scale  # [layers, B, Hkv, capacity] float32, slots unit stride
            ks0, vs0 = k_scale.data_ptr(), v_scale.data_ptr()
            scale_layer_bytes, (s_sb, s_sh) = k_scale.stride(0) * 4, k_scale.stride()[1:3]
        queries = None
        if cache.q_ring is not None:  # each layer's q/k/v in its own buffer; the ring takes the q after
            qkv_layers, queries = plan.layer_qkv(model, B)
            qkv0, qkv_bytes = qkv_layers.data_ptr(), qkv_layers.stride(0) * qkv_layers.element_size()
    eps, scale = ctypes.c_float(model.eps), ctypes.c_float(D**-0.5)
    for layer, fl in enumerate(plan.layers):
        if direct:
            kp, vp = k0 + layer * layer_bytes, v0 + layer * layer_bytes
            ksp = vsp = None
            if int8_kv:
                ksp, vsp = ks0 + layer * scale_layer_bytes, vs0 + layer * scale_layer_bytes
            if queries is not None:
                qkv = qkv0 + layer * qkv_bytes
            rc = lib.sparserl_layer_qkv(
                B,
                hidden,
                hp,
                fl.ln1.data_ptr(),
                eps,
                fl.qkv,
                hq,
                hkv,
                D,
                cp,
                sp,
                x,
                qkv,
                kp,
                vp,
                sb,
                sh,
                ss,
                slots.data_ptr(),
                kv_type,
                ksp,
                vsp,
                s_sb,
                s_sh,
            )
            if selector is not None and selector.sparse(layer):  # block top-k: the pages it chooses
                rc = rc or selector.native_step(lib, layer, cache, qkv, plan.width, D, kp, vp, sb, sh, ss, a)
            else:
                rc = rc or lib.sparserl_decode_attention(
                    B,
                    hq,
                    hkv,
                    L,
                    D,
                    qkv,
                    plan.width,
                    D,
                    kp,
                    vp,
                    sb,
                    sh,
                    ss,
                    ksp,
                    vsp,
                    s_sb,
                    s_sh,
                    kv_type,
                    bp,
                    L,
                    scale,
                    1.0,
                    a,
                    p.data_ptr(),
                )
            if cache.attn_acc is not None:
                cache.attn_acc[layer, :, :, :L] += p.sum(dim=2)
            a_ptr = a
        else:
            rc = lib.sparserl_layer_qkv(
                B,
                hidden,
                hp,
                fl.ln1.data_ptr(),
                eps,
                fl.qkv,
                hq,
                hkv,
                D,
                cp,
                sp,
                x,
                qkv,
                None,
                None,
                0,
                0,
                0,
                None,
                0,
                None,
                None,
                0,
                0,
            )
            q, k, v = (buf[n] if model.dtype == torch.float32 else buf[n].to(model.dtype) for n in "qkv")
            out = cache.attend(layer, q, k, v, bias).float().contiguous()
            a_ptr = out.data_ptr()
        rc = rc or lib.sparserl_layer_mlp(
            B, hidden, hp, a_ptr, hq * D, fl.o, fl.ln2.data_ptr(), eps, fl.gate_up, fl.down, x, gu, act
        )
        if rc != 0:
            raise RuntimeError(f"sparserl native decode layer {layer} failed (rc={rc})")
    if direct and queries is not None:
        cache.record_queries(queries)
    return h
