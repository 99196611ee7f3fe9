"""The sampler's own decoder: a lean forward of a Llama-family causal LM over its own weights.

transformers' modules are built for generality (hooks, cache classes, attention dispatch); a decode
step of a 30-layer model spends most of its time in Python there. The sampler keeps its own copy of
the weights in the rollout dtype, with q/k/v and gate/up fused into one matmul each, and runs a
forward that is just the math. The same numbers as transformers' forward (tested): RMSNorm in
float32, RoPE from the model's own ``inv_freq`` (so scaled RoPE variants carry over), optional q/k/v
bias (Qwen2) and per-head q/k norms (Qwen3).

The sampler's weights live on the device of the model it was built from (:attr:`SamplerModel.device`);
pushed weights are moved there, and every tensor of a forward is made there.

Weights live in ``SamplerWeights`` so that they can be replaced from a trainer
(:meth:`SamplerModel.load_weights`) and, later, swapped for quantized linear layers: every matmul of
a weight goes through :meth:`SamplerModel.linear`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor  # [2 * inter, hidden]
    down: torch.Tensor


class SamplerModel:
    """Decoder math for llama / qwen2 / qwen3 / mistral configs."""

    def __init__(self, hf_model: torch.nn.Module, dtype: torch.dtype | None = None):
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
        self.load_weights(hf_model.state_dict())

    # --- weights -------------------------------------------------------------------------------
    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """(Re)build the sampler's weights from a Hugging Face state dict (trainer → sampler push),
        on the sampler's device and in its dtype."""
        dt, dev = self.dtype, self.device

        def get(name, required=True):
            t = state.get(name)
            if t is None and required:
                raise KeyError(f"sampler weights: missing {name}")
            return None if t is None else t.detach().to(device=dev, dtype=dt)

        self.embed = get("model.embed_tokens.weight").contiguous()
        lm = state.get("lm_head.weight")
        self.lm_head = self.embed if lm is None or getattr(self.config, "tie_word_embeddings", False) else lm.detach().to(device=dev, dtype=dt).contiguous()
        self.norm = get("model.norm.weight")
        self.layers = []
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

    def weight_bytes(self) -> int:
        total = self.embed.numel() * self.embed.element_size()
        if self.lm_head is not self.embed:
            total += self.lm_head.numel() * self.lm_head.element_size()
        for lw in self.layers:
            for t in (lw.qkv, lw.o, lw.gate_up, lw.down):
                total += t.numel() * t.element_size()
        return total

    def decode_read_bytes(self) -> int:
        """Bytes of weights one decode step must read (the embedding is a gather, not a read)."""
        total = self.lm_head.numel() * self.lm_head.element_size()
        for lw in self.layers:
            for t in (lw.qkv, lw.o, lw.gate_up, lw.down):
                total += t.numel() * t.element_size()
        return total

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies over all layers and KV heads."""
        return 2 * self.n_layers * self.n_kv * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()

    # --- pieces of the forward -----------------------------------------------------------------
    @staticmethod
    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x Wᵀ (+ b). For the few rows of a decode step the product is computed as (W xᵀ)ᵀ: BLAS
        runs the skinny GEMM ~1.5x faster in that orientation on CPUs (measured, see
        docs/results/)."""
        rows = x.numel() // x.shape[-1]
        if rows > 64 or x.dtype != torch.float32:
            return F.linear(x, w, b)
        x2 = x.reshape(rows, x.shape[-1])
        y = torch.matmul(w, x2.t()).t()
        if b is not None:
            y = y + b
        return y.reshape(*x.shape[:-1], w.shape[0])

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # fused kernel, same math as transformers' LlamaRMSNorm
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for integer positions of any shape [...] → [..., D] in the sampler dtype."""
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.rope_scale).to(self.dtype), (emb.sin() * self.rope_scale).to(self.dtype)

    @staticmethod
    def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def qkv(self, lw: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h [..., T, hidden] → q [..., Hq, T, D], k, v [..., Hkv, T, D] (post-RoPE); cos/sin [..., T, D]."""
        x = self.rms_norm(h, lw.ln1)
        out = self.linear(x, lw.qkv, lw.qkv_bias)
        D, hq, hkv = self.head_dim, self.n_heads, self.n_kv
        out = out.view(*out.shape[:-1], hq + 2 * hkv, D)  # [..., T, H, D]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        if lw.q_norm is None:  # one RoPE over q and k together
            qk = self.apply_rope(out[..., : hq + hkv, :], cos, sin)
            q, k = qk[..., :hq, :], qk[..., hq:, :]
        else:  # Qwen3: per-head RMSNorm on q and k before RoPE
            q = self.apply_rope(self.rms_norm(out[..., :hq, :], lw.q_norm), cos, sin)
            k = self.apply_rope(self.rms_norm(out[..., hq : hq + hkv, :], lw.k_norm), cos, sin)
        v = out[..., hq + hkv :, :]
        return q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)

    def mlp(self, lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        x = self.rms_norm(h, lw.ln2)
        gu = self.linear(x, lw.gate_up)
        g, u = gu.chunk(2, dim=-1)
        return self.linear(F.silu(g) * u, lw.down)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.rms_norm(h, self.norm), self.lm_head)

    # --- prefill -------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor,
                want_queries: int = 0, want_attention: bool = False):
        """Full forward over left-padded prompts.

        input_ids/valid/positions: [B, P]. Returns (last-position logits [B, V] float32, keys and
        values per layer [B, Hkv, P, D], the last ``want_queries`` queries per layer [B, Hq, w, D]
        (or None), and per layer the attention each prompt slot received summed over the prompt's
        queries and the GQA group [B, Hkv, P] (or None)).
        """
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
            q, k, v = self.qkv(lw, h, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            if want_attention:
                s = torch.matmul(q.float(), k.float().repeat_interleave(g, 1).transpose(-1, -2)) / self.head_dim**0.5
                p_ = s.masked_fill(~mask, float("-inf")).softmax(-1)
                p_ = p_ * valid[:, None, :, None]  # padding queries give nothing
                acc.append(p_.sum(dim=2).view(B, self.n_kv, g, P).sum(2))
            a = a.transpose(1, 2).reshape(B, P, self.n_heads * self.head_dim)
            h = h + self.linear(a, lw.o)
            h = h + self.mlp(lw, h)
            keys.append(k)
            values.append(v)
            if want_queries:
                queries.append(q[:, :, -want_queries:])
        logits = self.logits(h[:, -1]).float()
        return logits, keys, values, (queries or None), (acc or None)
