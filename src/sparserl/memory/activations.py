"""Bytes a Llama-style decoder keeps per token: what autograd saves for the backward, layer by layer, and
what a no-grad forward holds while one layer runs.

Notation (:class:`~sparserl.cost.ModelShape`): H the hidden size, I the MLP's intermediate size, H_q query
heads of width d, V the vocabulary; ``r`` bytes of the residual stream (the weights' dtype: 4 under
float32, also under bfloat16 autocast, whose RMSNorms and residual adds stay float32), ``c`` bytes of the
products (2 under bfloat16 autocast or bfloat16 weights, else 4), ``K`` the keys a query attends to.

A decoder layer's saved tensors per token, read off its ops (transformers' Llama layer with SDPA)::

    2 RMSNorms       r (4 H + 2)            input x and x / rms (H each) and 1 / rms, twice
    linear inputs    c (n_in H + H_q d)     q/k/v's and gate/up's input, and o's; n_in = 2, or 5 under
                                            autocast, which casts the input once per product (q, k, v, gate, up)
    SDPA             c 3 H_q d + 4 H_q      q, and k, v repeated to H_q heads (GQA), the log-sum-exp
    MLP              c 4 I                  gate and up outputs, SiLU(gate), and down's input
    mask             c K                    the additive attention mask [rows, 1, T, K], one per layer

(the sum reproduces the bytes a saved-tensor hook counts on SmolLM2-135M's shape exactly, float32 and
bfloat16 autocast alike: ``experiments/training/memory_prediction.py``). Under autocast every layer also
keeps bfloat16 copies of its weights for the backward (:func:`autocast_weight_bytes`).

Gradient checkpointing (transformers' ``gradient_checkpointing_enable``) keeps only each layer's input,
r H a token, and recomputes one layer's saved tensors at a time in the backward.
"""

from __future__ import annotations

from ..cost import ModelShape

__all__ = [
    "autocast_weight_bytes",
    "checkpointed_layer_bytes",
    "layer_forward_bytes",
    "saved_layer_bytes",
]


def saved_layer_bytes(shape: ModelShape, residual: int, compute: int, keys: int, autocast: bool) -> int:
    """Bytes autograd saves in one decoder layer for one token attending to ``keys`` positions (the module
    docstring's sum)."""
    H, I, q_width = shape.hidden, shape.intermediate, shape.heads * shape.head_dim
    n_in = 5 if autocast else 2
    norms = residual * (4 * H + 2)
    linear_inputs = compute * (n_in * H + q_width)
    sdpa = compute * 3 * q_width + 4 * shape.heads
    mlp = compute * 4 * I
    mask = compute * keys
    return norms + linear_inputs + sdpa + mlp + mask


def checkpointed_layer_bytes(shape: ModelShape, residual: int) -> int:
    """Bytes one layer keeps per token under gradient checkpointing: its input hidden state."""
    return residual * shape.hidden


def autocast_weight_bytes(shape: ModelShape) -> int:
    """bfloat16 copies of every decoder layer's linear weights that autocast caches for the backward."""
    return 2 * shape.layers * shape.layer_weights


def layer_forward_bytes(shape: ModelShape, residual: int, compute: int, keys: int) -> int:
    """Bytes one token holds while a no-grad forward runs one layer: the residual and the normed input
    (r 2 H), q/k/v with k, v repeated to H_q heads and the attention's output (c 4 H_q d), gate, up and
    their product (c 3 I), and its row of the attention mask (c K)."""
    q_width = shape.heads * shape.head_dim
    return residual * 2 * shape.hidden + compute * (4 * q_width + 3 * shape.intermediate + keys)
