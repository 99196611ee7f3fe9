"""The sampler's own decoder: a lean forward of a Llama-family causal LM over its own weights.

transformers' modules are built for generality (hooks, cache classes, attention dispatch); a decode
step of a 30-layer model spends most of its time in Python there. The sampler keeps its own copy of
the weights in the rollout dtype, with q/k/v and gate/up fused into one matmul each, and runs a
forward that is just the math. The same numbers as transformers' forward (tested): RMSNorm in
float32, RoPE from the model's own ``inv_freq`` (so scaled RoPE variants carry over), optional q/k/v
bias (Qwen2) and per-head q/k norms (Qwen3).

The sampler's weights live on the device of the model it was built from (:attr:`SamplerModel.device`);
pushed weights are moved there, and every tensor of a forward is made there.

Weights live in ``LayerWeights`` so that they can be replaced from a trainer
(:meth:`SamplerModel.load_weights`); every matmul of a weight goes through :func:`linear`.

Quantized sampler (``quant``, :mod:`sparserl.rollout.quant`): every linear weight of the decoder
layers (fused q/k/v, o, fused gate/up, down) is replaced by its quantized form each time weights are
loaded (every push from the learner), with no full-precision copy kept; the LM head and the
embeddings stay in the sampler dtype (the head is ~21% of SmolLM2-135M's decode weight reads and the
logits' precision is what the mismatch metrics see), the head unless ``quant_head``. The time the quantization took is
:attr:`SamplerModel.last_quantize_s`. With ``quant_smooth`` (SmoothQuant,
:mod:`sparserl.rollout.quant.smooth`) each push also runs the calibration ids through the
full-precision layers, one layer at a time, for the activations' per-channel maxima; so does
``quant_outliers`` (:mod:`sparserl.rollout.quant.outliers`), which keeps the ``k`` input channels
of largest maxima in float32.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import native
from .quant import QuantizedLinear, build_quant, nbytes
from .quant.outliers import OutlierLinear, check_outliers, check_outliers_fit, outlier_channels
from .quant.smooth import ActivationObserver, SmoothedLinear, check_strength, smoothing_factors

QUANTIZED_FIELDS = ("qkv", "o", "gate_up", "down")  # the LayerWeights a quantizer replaces


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    qkv: torch.Tensor | QuantizedLinear  # [(Hq + 2 Hkv) * D, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor | QuantizedLinear
    ln2: torch.Tensor
    gate_up: torch.Tensor | QuantizedLinear  # [2 * inter, hidden]
    down: torch.Tensor | QuantizedLinear


class SamplerModel:
    """Decoder math for llama / qwen2 / qwen3 / mistral configs."""

    def __init__(
        self,
        hf_model: torch.nn.Module,
        dtype: torch.dtype | None = None,
        pack_weights: bool | None = None,
        quant: str = "none",
        quant_smooth: float = 0.0,
        calibration_ids: torch.Tensor | None = None,
        quant_group: int | None = None,
        quant_outliers: int = 0,
        quant_head: bool = False,
        weights: dict[str, torch.Tensor] | None = None,
        bf16_kernel: str | None = None,
        fp32_head: bool = False,
    ):
        """``bf16_kernel``: which of :func:`native.bf16_kernels` runs a bfloat16 sampler's weight products
        (its weights packed in that kernel's layout); None = the library's default (AMX where the CPU
        has it; the engine passes its measured choice, :mod:`sparserl.rollout.bf16_kernel_choice`).
        ``weights``: the state dict to start from (None: ``hf_model``'s own; a learner with LoRA adapters
        hands its merged weights). ``pack_weights``: keep a packed copy of every linear weight for the decode step's
        products (:func:`pack_weight`); None = when supported (CPU, float32, oneDNN built in); the
        quantized weights are not packed (their kernels pack their own). ``quant``: a name of
        :func:`sparserl.rollout.quant.available_quants` (``none`` = the sampler dtype).
        ``quant_smooth``: SmoothQuant's migration strength (0 = off; needs a quantizer of the
        activations, ``int8``, ``int8_group`` or ``fp8``) with its ``calibration_ids`` [B, P] (no padding).
        ``quant_group``: inputs per weight and activation scale of ``int8_group`` (None: its default, 64).
        ``quant_outliers``: input channels of every quantized linear kept in float32 (0 = none; the
        same quantizers and calibration as ``quant_smooth``). ``quant_head``: quantize the LM head
        too, the same way (its SmoothQuant factors and outlier channels calibrated on the final
        norm's output); the embedding stays in the sampler dtype. ``fp32_head``: under a bfloat16 / float16 sampler,
        the LM head's weight kept as a float32 copy of the pushed (learner's) weight and its product run in
        float32 from the final norm's output: the head a float32 learner has, on the sampler's own head input.
        prime-rl's ``enable_fp32_lm_head`` (on vLLM: the bf16 weight, float32 output) and SGLang's
        ``--enable-fp32-lm-head`` (the bf16 weight cast to float32) keep the half-precision weight and drop only
        the logits' rounding; this keeps the weight's precision too. A float32 sampler's head is float32 already."""
        cfg = hf_model.config
        if getattr(cfg, "model_type", None) not in ("llama", "qwen2", "qwen3", "mistral"):
            raise ValueError(f"sampler: unsupported model_type {getattr(cfg, 'model_type', None)!r}")
        self.config = cfg
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size
        self.max_positions = getattr(cfg, "max_position_embeddings", 1 << 30)
        first = next(hf_model.parameters())
        self.dtype = dtype or first.dtype
        self.device = first.device
        rot = hf_model.model.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().to(self.device).clone()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.pack_weights = packing_supported(self.device, self.dtype) if pack_weights is None else bool(pack_weights)
        if bf16_kernel is not None and bf16_kernel not in native.bf16_kernels():
            raise ValueError(
                f"sampler: bf16_kernel={bf16_kernel!r} does not run on this machine; it runs "
                f"{', '.join(native.bf16_kernels()) or 'none (no native library)'}"
            )
        self.bf16_layout = None if bf16_kernel is None else native.BF16_KERNEL_LAYOUT[bf16_kernel]
        self.bf16_kernel: str | None = None  # the kernel that runs the packed bf16 weights (None: none packed)
        self.quantizer = build_quant(quant, group=quant_group)
        self.quant: str = self.quantizer.name
        self.quant_kernel: str = self.quantizer.kernel_on(self.device)  # what runs the layers' products
        self.quant_emulated: bool = self.quantizer.emulated_on(self.device)
        self.last_quantize_s = 0.0  # seconds the last load_weights spent quantizing (time/quantize_s)
        self.quant_smooth = check_strength(quant_smooth)
        self.quant_outliers = check_outliers(quant_outliers)
        check_outliers_fit(self.quant_outliers, cfg)
        self.quant_head = bool(quant_head)
        self.fp32_head = bool(fp32_head) and self.dtype != torch.float32
        if self.fp32_head and self.quant_head:
            raise ValueError("sampler: fp32_head and quant_head ask for two different heads; choose one")
        if self.quant_head and not self.quantizer.quantizes:
            raise ValueError(
                "sampler: quant_head needs a weight quantization (quant int8, int8_group, fp8, ...), "
                f"not quant={self.quant!r}"
            )
        self.calibration_ids = None
        for key, on in (("quant_smooth", self.quant_smooth), ("quant_outliers", self.quant_outliers)):
            if on and not self.quantizer.quantizes_activations:
                raise ValueError(
                    f"sampler: {key} needs a quantization of the activations "
                    f"(int8, int8_group or fp8), not quant={self.quant!r}"
                )
        if self.quant_smooth or self.quant_outliers:
            if calibration_ids is None or calibration_ids.numel() == 0:
                raise ValueError(
                    "sampler: quant_smooth and quant_outliers need calibration_ids (token ids to "
                    "measure activations on)"
                )
            self.calibration_ids = (
                torch.as_tensor(calibration_ids, device=self.device).long().reshape(-1, calibration_ids.shape[-1])
            )
        self.load_weights(weights if weights is not None else hf_model.state_dict())

    # --- weights -------------------------------------------------------------------------------
    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """(Re)build the sampler's weights from a Hugging Face state dict (trainer → sampler push),
        on the sampler's device and in its dtype; the layers' linear weights quantized when
        ``quant`` is not ``none`` (timed: :attr:`last_quantize_s`)."""
        dt, dev = self.dtype, self.device

        def get(name, required=True):
            t = state.get(name)
            if t is None and required:
                raise KeyError(f"sampler weights: missing {name}")
            return None if t is None else t.detach().to(device=dev, dtype=dt)

        self.embed = get("model.embed_tokens.weight").contiguous()
        lm = state.get("lm_head.weight")
        if lm is None or getattr(self.config, "tie_word_embeddings", False):
            lm = state["model.embed_tokens.weight"]
        # tied or not, the head is the embedding's own tensor in the sampler dtype, or (fp32_head) a float32 copy
        head_dtype = torch.float32 if self.fp32_head else dt
        tied = lm is state["model.embed_tokens.weight"] and head_dtype == dt
        self.lm_head = self.embed if tied else lm.detach().to(device=dev, dtype=head_dtype).contiguous()
        self.norm = get("model.norm.weight")
        self.layers = []
        qz = self.quantizer
        quantize_s = 0.0
        calib = self._calibration_start() if qz.quantizes and (self.quant_smooth or self.quant_outliers) else None
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            q, k, v = (get(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            qb = get(p + "self_attn.q_proj.bias", required=False)
            bias = None
            if qb is not None:
                bias = torch.cat([qb, get(p + "self_attn.k_proj.bias"), get(p + "self_attn.v_proj.bias")])
            self.layers.append(
                LayerWeights(
                    ln1=get(p + "input_layernorm.weight"),
                    qkv=torch.cat([q, k, v]).contiguous(),
                    qkv_bias=bias,
                    q_norm=get(p + "self_attn.q_norm.weight", required=False),
                    k_norm=get(p + "self_attn.k_norm.weight", required=False),
                    o=get(p + "self_attn.o_proj.weight").contiguous(),
                    ln2=get(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]).contiguous(),
                    down=get(p + "mlp.down_proj.weight").contiguous(),
                )
            )
            if qz.quantizes:  # layer by layer: one layer's float weights alive at a time
                lw = self.layers[-1]
                t0 = time.perf_counter()
                if calib is None:
                    for f in QUANTIZED_FIELDS:
                        setattr(lw, f, qz.quantize(getattr(lw, f)))
                else:
                    self._quantize_calibrated(lw, calib)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                quantize_s += time.perf_counter() - t0
        if qz.quantizes and self.quant_head:  # calib["h"] is now the last layer's output
            t0 = time.perf_counter()
            with torch.inference_mode():
                amax = None if calib is None else rms_norm(calib["h"], self.norm, self.eps).abs().flatten(0, -2).amax(0)
                self.lm_head = self._quantize_weight(self.lm_head, amax)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            quantize_s += time.perf_counter() - t0
        self.last_quantize_s = quantize_s
        head = [] if self.fp32_head else [self.lm_head]  # a float32 head of a half sampler: its own product
        if self.fp32_head and packing_supported(dev, torch.float32):  # on the float32 decode kernel, as a float32
            pack_weight(self.lm_head)  # sampler's head
        if self.pack_weights:
            for w in [*head, *(t for lw in self.layers for t in (lw.qkv, lw.o, lw.gate_up, lw.down))]:
                if isinstance(w, torch.Tensor):
                    pack_weight(w)
        elif self.dtype == torch.bfloat16 and dev.type == "cpu" and native.active():  # the fused bf16 step's
            for w in [*head, *(t for lw in self.layers for t in (lw.qkv, lw.o, lw.gate_up, lw.down))]:
                if isinstance(w, torch.Tensor):
                    packed = native.pack_linear_bf16(w.float(), self.bf16_layout)  # bf16 -> f32 -> bf16: same bits
                    if packed is not None:
                        setattr(w, NATIVE_BF16, packed)
                        self.bf16_kernel = native.bf16_kernel_of(packed)

    # --- calibration: SmoothQuant (quant.smooth) and outlier channels (quant.outliers) ----------------
    def _calibration_start(self) -> dict:
        ids = self.calibration_ids
        B, P = ids.shape
        positions = torch.arange(P, device=self.device)[None].expand(B, P)
        cos, sin = self.rope(positions)
        mask = torch.ones(P, P, dtype=torch.bool, device=self.device).tril()[None, None]
        return {"h": F.embedding(ids, self.embed), "cos": cos, "sin": sin, "mask": mask}

    @torch.inference_mode()
    def _quantize_calibrated(self, lw: LayerWeights, calib: dict) -> None:
        """Run the calibration activations through ``lw`` in full precision (recording every linear's
        input maxima per channel), move ``calib["h"]`` on to the next layer, then quantize each
        linear weight: as SmoothQuant's ``W diag(s)`` with ``1/s`` applied to its inputs, and/or with
        the ``quant_outliers`` inputs of largest (smoothed) maxima kept in float32."""
        observers = {f: ActivationObserver(getattr(lw, f)) for f in QUANTIZED_FIELDS}
        observed = LayerWeights(**{**vars(lw), **observers})
        calib["h"] = self._layer(observed, calib["h"], calib["cos"], calib["sin"], calib["mask"])[0]
        for f, obs in observers.items():
            setattr(lw, f, self._quantize_weight(getattr(lw, f), obs.amax))

    def _quantize_weight(self, w: torch.Tensor, amax: torch.Tensor | None) -> QuantizedLinear:
        """``w`` [out, in] by the sampler's quantizer; given the calibration's ``max|X_j|`` [in]
        (``amax``), as SmoothQuant's ``W diag(s)`` behind ``1/s`` and/or with the ``quant_outliers``
        inputs of largest (smoothed) maxima in float32."""
        if amax is None:
            return self.quantizer.quantize(w)
        amax = amax.float()
        if self.quant_smooth:
            s = smoothing_factors(amax, w, self.quant_smooth).to(w.device)
            w, amax = (w.float() * s[None, :]).to(w.dtype), amax / s
        if self.quant_outliers:
            q = OutlierLinear.quantize(self.quantizer, w, outlier_channels(amax, self.quant_outliers))
        else:
            q = self.quantizer.quantize(w)
        return SmoothedLinear(q, 1.0 / s) if self.quant_smooth else q

    def weight_bytes(self) -> int:
        """Bytes of the weights the sampler holds (quantized values and scales for quantized
        layers; the oneDNN-packed copies not counted)."""
        total = self.embed.numel() * self.embed.element_size()
        if self.lm_head is not self.embed:
            total += nbytes(self.lm_head)
        for lw in self.layers:
            for t in (lw.qkv, lw.o, lw.gate_up, lw.down):
                total += nbytes(t)
        return total

    def decode_read_bytes(self) -> int:
        """Bytes of weights one decode step must read (the embedding is a gather, not a read)."""
        total = nbytes(self.lm_head)
        for lw in self.layers:
            for t in (lw.qkv, lw.o, lw.gate_up, lw.down):
                total += nbytes(t)
        return total

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies over all layers and KV heads."""
        return 2 * self.n_layers * self.n_kv * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()

    # --- pieces of the forward (the math lives in the module-level functions below) ---------------
    @staticmethod
    def linear(
        x: torch.Tensor,
        w: torch.Tensor | QuantizedLinear,
        b: torch.Tensor | None = None,
        add_to: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every matmul of a weight goes through here (see :func:`linear`)."""
        return linear(x, w, b, add_to)

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.eps)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for integer positions of any shape [...] → [..., D] in ``dtype`` (default: the
        sampler dtype)."""
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        dt = dtype or self.dtype
        return (emb.cos() * self.rope_scale).to(dt), (emb.sin() * self.rope_scale).to(dt)

    def qkv(self, lw: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h [..., T, hidden] → q [..., Hq, T, D], k, v [..., Hkv, T, D] (post-RoPE); cos/sin [..., T, D]."""
        return project_qkv(
            h,
            cos,
            sin,
            lw.ln1,
            lw.qkv,
            lw.qkv_bias,
            lw.q_norm,
            lw.k_norm,
            self.n_heads,
            self.n_kv,
            self.head_dim,
            self.eps,
        )

    def mlp(self, lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        return mlp(h, lw.ln2, lw.gate_up, lw.down, self.eps)

    def mlp_act(self, lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        """The MLP's input to its down projection: ``silu(gate) · up`` of the normed h."""
        return mlp_act(h, lw.ln2, lw.gate_up, self.eps)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head's input: the final RMSNorm of the last layer's output h [..., hidden] (h's dtype)."""
        return rms_norm(h, self.norm, self.eps)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head's product ``x Wᵀ`` [..., V] of :meth:`final_norm`'s output (each row on its own: a
        quantized head's activation scales are per token; ``fp32_head``: in float32, x taken to float32)."""
        if self.fp32_head:
            return linear(x.float(), self.lm_head)
        return linear(x, self.lm_head)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.final_norm(h))

    # --- prefill -------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        want_queries: int = 0,
        want_attention: bool = False,
    ):
        """Full forward over left-padded prompts.

        input_ids/valid/positions: [B, P]. Returns (last-position logits [B, V] float32, keys and
        values per layer [B, Hkv, P, D], the last ``want_queries`` queries per layer [B, Hq, w, D]
        (or None), per layer the attention each prompt slot received summed over the prompt's
        queries and the GQA group [B, Hkv, P] (or None), and the head's input at the last position
        [B, hidden]: the logits are ``head(x).float()``).
        """
        h, keys, values, queries, acc = self._forward(input_ids, valid, positions, want_queries, want_attention)
        x = self.final_norm(h[:, -1])
        return self.head(x).float(), keys, values, queries, acc, x

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The last layer's output at every position [B, P, hidden] (before the final norm; the
        next-token logits are :meth:`logits` of it): teacher forcing, e.g. to score given tokens."""
        return self._forward(input_ids, valid, positions, 0, False)[0]

    def _forward(self, input_ids, valid, positions, want_queries: int, want_attention: bool):
        B, P = input_ids.shape
        h = F.embedding(input_ids, self.embed)
        cos, sin = self.rope(positions)
        dev = input_ids.device
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        mask = causal[None] & valid[:, None, :]
        mask |= torch.eye(P, dtype=torch.bool, device=dev)[None]  # padding rows attend to themselves (no NaN)
        mask = mask[:, None]
        keys, values, queries, acc = [], [], [], []
        g = self.n_heads // self.n_kv
        for lw in self.layers:
            h, q, k, v = self._layer(lw, h, cos, sin, mask)
            if want_attention:
                s = torch.matmul(q.float(), k.float().repeat_interleave(g, 1).transpose(-1, -2)) / self.head_dim**0.5
                p_ = s.masked_fill(~mask, float("-inf")).softmax(-1)
                p_ = p_ * valid[:, None, :, None]  # padding queries give nothing
                acc.append(p_.sum(dim=2).view(B, self.n_kv, g, P).sum(2))
            keys.append(k)
            values.append(v)
            if want_queries:
                queries.append(q[:, :, -want_queries:])
        return h, keys, values, (queries or None), (acc or None)

    def _layer(self, lw: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor):
        """One decoder layer over whole sequences h [B, P, hidden] (``mask`` [B or 1, 1, P, P]
        bool) → (h', q, k, v)."""
        B, P = h.shape[:2]
        q, k, v = self.qkv(lw, h, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        a = a.transpose(1, 2).reshape(B, P, self.n_heads * self.head_dim)
        h = h + self.linear(a, lw.o)
        return h + self.mlp(lw, h), q, k, v


# --- the math of a layer, as plain functions of tensors (shared by the eager forward, the prefill
# and the compiled decode step, :mod:`sparserl.rollout.compiled`) ----------------------------------
PACKED = "_sparserl_packed"  # attribute of a weight tensor holding its oneDNN-packed copy
NATIVE_PACKED = "_sparserl_native_packed"  # ... holding its panels for the C kernel (native.pack_linear)
NATIVE_BF16 = "_sparserl_native_bf16"  # a bf16 weight's panels for linear_bf16.c (native.pack_linear_bf16)
PACKED_MAX_ROWS = 64  # packed products (the C kernel's, else oneDNN's) up to this many rows; plain GEMM beyond


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack_weight(w: torch.Tensor, rows_hint: int = 16) -> None:
    """Attach to ``w`` [out, in] a copy laid out for products with a few rows: the C kernel's
    panels (:func:`sparserl.rollout.native.pack_linear`) when the native kernels are on, else
    oneDNN's blocked layout.

    MKL's sgemm repacks the weight on every call; for a decode step's skinny products (16-32 rows,
    weights streamed from memory) that doubles the traffic. The prepacked oneDNN product ran one
    step's weight matmuls of SmolLM2-135M ~1.9x faster than sgemm on this 2-core AVX2 CPU, and the C
    kernel 1.13-1.6x faster again at 4-64 rows (docs/results/native_linear.md). Results differ by
    float reassociation (~1e-6 relative). Costs a second copy of the weights; a oneDNN copy is made
    on first use too where the C kernel is not used (:func:`sparserl.rollout.native.torch_only`)."""
    packed = native.pack_linear(w) if native.active() else None
    if packed is not None:
        setattr(w, NATIVE_PACKED, packed)
    else:
        setattr(w, PACKED, torch.ops.mkldnn._reorder_linear_weight(w, rows_hint))


def _onednn_packed(w: torch.Tensor) -> torch.Tensor | None:
    packed = getattr(w, PACKED, None)
    if packed is None and hasattr(w, NATIVE_PACKED):  # packing wanted, the C kernel not used here
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)
        setattr(w, PACKED, packed)
    return packed


def _panels(x: torch.Tensor, w) -> torch.Tensor | None:
    """w's C-kernel panels when x Wᵀ should run on them (a decode-sized, eager product), else None."""
    if torch.compiler.is_compiling() or x.numel() // x.shape[-1] > PACKED_MAX_ROWS:
        return None
    return getattr(w, NATIVE_PACKED, None)


def linear(
    x: torch.Tensor,
    w: torch.Tensor | QuantizedLinear,
    b: torch.Tensor | None = None,
    add_to: torch.Tensor | None = None,
) -> torch.Tensor:
    """x Wᵀ (+ b); with ``add_to`` (the residual stream h), ``h += x Wᵀ (+ b)`` in place, returning h
    (the C kernel accumulates into h: no separate sum). A quantized weight runs its own kernel
    (:mod:`sparserl.rollout.quant`). For the few rows of a decode step (up to
    :data:`PACKED_MAX_ROWS`), a packed weight (:func:`pack_weight`): the C kernel's panels, else
    oneDNN's; beyond, or unpacked, (W xᵀ)ᵀ: BLAS runs the skinny GEMM ~1.5x faster in that
    orientation than x Wᵀ on CPUs (measured, see docs/results/)."""
    panels = _panels(x, w)
    if add_to is not None:
        if panels is not None and native.linear(x, panels, b, add_to=add_to) is not None:
            return add_to
        return add_to.add_(linear(x, w, b))
    if isinstance(w, QuantizedLinear):
        return w(x, b)
    rows = x.numel() // x.shape[-1]
    if rows > PACKED_MAX_ROWS or x.dtype != torch.float32:
        return F.linear(x, w, b)
    if not torch.compiler.is_compiling():
        y = native.linear(x, panels, b) if panels is not None else None
        if y is not None:
            return y
        packed = _onednn_packed(w)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    x2 = x.reshape(rows, x.shape[-1])
    y = torch.matmul(w, x2.t()).t()
    if b is not None:
        y = y + b
    return y.reshape(*x.shape[:-1], w.shape[0])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # same math as transformers' LlamaRMSNorm: the C kernel's one pass, or torch's
        y = native.rms_norm(x, w, eps) if x.device.type == "cpu" else None
        return y if y is not None else F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def project_qkv(h, cos, sin, ln1, qkv_w, qkv_b, q_norm, k_norm, n_heads: int, n_kv: int, head_dim: int, eps: float):
    """h [..., T, hidden] → q [..., Hq, T, D], k, v [..., Hkv, T, D] (post-RoPE); cos/sin [..., T, D]."""
    x = rms_norm(h, ln1, eps)
    out = linear(x, qkv_w, qkv_b)
    D, hq, hkv = head_dim, n_heads, n_kv
    out = out.view(*out.shape[:-1], hq + 2 * hkv, D)  # [..., T, H, D]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    if q_norm is None and out.device.type == "cpu" and native.rope_(out, hq + hkv, cos, sin):
        q, k = out[..., :hq, :], out[..., hq : hq + hkv, :]  # rotated in place by the C kernel
    elif q_norm is None:  # one RoPE over q and k together
        qk = apply_rope(out[..., : hq + hkv, :], cos, sin)
        q, k = qk[..., :hq, :], qk[..., hq:, :]
    else:  # Qwen3: per-head RMSNorm on q and k before RoPE
        q = apply_rope(rms_norm(out[..., :hq, :], q_norm, eps), cos, sin)
        k = apply_rope(rms_norm(out[..., hq : hq + hkv, :], k_norm, eps), cos, sin)
    v = out[..., hq + hkv :, :]
    return q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)


def mlp(h: torch.Tensor, ln2: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, eps: float) -> torch.Tensor:
    return linear(mlp_act(h, ln2, gate_up, eps), down)


def mlp_act(h: torch.Tensor, ln2: torch.Tensor, gate_up: torch.Tensor, eps: float) -> torch.Tensor:
    """``silu(g) · u`` where ``[g | u] = rms_norm(h) [gate | up]ᵀ`` (SwiGLU, Shazeer 2020)."""
    gu = linear(rms_norm(h, ln2, eps), gate_up)
    act = native.silu_mul(gu) if gu.device.type == "cpu" else None
    if act is None:
        g, u = gu.chunk(2, dim=-1)
        act = F.silu(g) * u
    return act
