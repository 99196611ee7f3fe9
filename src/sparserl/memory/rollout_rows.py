"""How many responses a sampler's device holds at once: the rollout batch that grows with the KV saved
(Sparse-RL's memory promise, Luo et al., 2026: a bounded cache lets the same GPU run more rollouts concurrently).

    rows = ⌊(1 − margin) · free / row⌋,   row = capacity · kv bytes a token + prefill layer + sampling buffers

with ``row`` :func:`~.predict.rollout_row_bytes` (capacity: the compressor's, budget + step length for a bounded
cache, prompt + new tokens for a dense one) and ``free`` the device's free memory now
(``torch.cuda.mem_get_info``). On CUDA ``RolloutEngine(max_batch="auto")`` splits a rollout into batches of this
many rows; ``sparserl bench rollout`` reports it for each compressor.
"""

from __future__ import annotations

import torch

from ..cost import ModelShape
from .predict import rollout_row_bytes

__all__ = ["MARGIN", "device_rows_that_fit", "engine_row_bytes", "rows_that_fit"]

#: the share of free device memory left unused (the allocator's fragmentation, temporaries not counted per row)
MARGIN = 0.1


def rows_that_fit(row_bytes: int, free_bytes: int, margin: float = MARGIN) -> int:
    """Rows of ``row_bytes`` each that fit in ``free_bytes`` less the ``margin``; at least 1."""
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
    return max(1, int((1.0 - margin) * free_bytes // row_bytes))


def engine_row_bytes(engine, prompt_tokens: int, max_new: int) -> int:
    """:func:`~.predict.rollout_row_bytes` of one response of ``engine`` (its model, dtype, compressor and KV
    storage) after a prompt of ``prompt_tokens``, up to ``max_new`` new tokens."""
    m = engine.model
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[m.dtype]
    shape = ModelShape.from_config(m.config, dtype)
    return sum(rollout_row_bytes(shape, engine.compressor, prompt_tokens, max_new, dtype, engine.kv_quant).values())


def device_rows_that_fit(engine, prompt_tokens: int, max_new: int) -> int | None:
    """On CUDA, the rows of ``engine`` that fit the device's free memory now; None on another device (the CPU's
    memory is the whole run's, checked by preflight: :mod:`.limit`)."""
    if engine.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(engine.device)
    return rows_that_fit(engine_row_bytes(engine, prompt_tokens, max_new), free)
