"""``kv_scores.c``: the compressors' scores without their large temporaries: R-KV's redundancy term
(:func:`rkv_redundancy`; :func:`sparserl.rollout.kv.rkv.redundancy` uses it) and the observation-window
attention (:func:`window_attention`; :func:`sparserl.rollout.kv.base.window_attention`).
"""

from __future__ import annotations

import torch

from . import compiler


def rkv_redundancy(keys: torch.Tensor, valid: torch.Tensor, threshold: float, lib=None) -> torch.Tensor | None:
    """R-KV's mean thresholded similarity of every key (``kv_scores.c``; before the softmax of
    :func:`sparserl.rollout.kv.rkv.redundancy`): keys [n, H, L, D] float32 or bfloat16 (the bf16
    sampler's cache, read as the float32 values it holds; unit stride in D), valid [n, L] bool →
    [n, H, L] float32, or None when the kernel does not take this input."""
    lib = compiler.lib_for_keys(lib, keys)
    if (
        lib is None
        or keys.dim() != 4
        or keys.stride(-1) != 1
        or valid.dtype != torch.bool
        or valid.device.type != "cpu"
    ):
        return None
    n, heads, length, dim = keys.shape
    if valid.shape != (n, length) or (length > 1 and valid.stride(1) != 1):
        return None
    out = torch.empty(n, heads, length, dtype=torch.float32)
    if out.numel() == 0:
        return out
    rc = lib.sparserl_rkv_redundancy(
        n,
        heads,
        length,
        dim,
        keys.data_ptr(),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        valid.data_ptr(),
        valid.stride(0),
        float(threshold),
        out.data_ptr(),
        int(keys.dtype == torch.bfloat16),
    )
    if rc != 0:
        raise MemoryError("sparserl_rkv_redundancy: out of memory")
    return out


def window_attention(
    queries: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, reduce_group: str, lib=None
) -> torch.Tensor | None:
    """The observation window's attention (``kv_scores.c``; what
    :func:`sparserl.rollout.kv.base.window_attention` computes): queries [n, Hq, w, D] (the last
    ``w`` slots' queries, oldest first), keys [n, Hkv, L, D] (float32, or bfloat16 read as the float32
    values it holds; bf16 queries are widened here, they are few), valid [n, L] bool → [n, Hkv, L]
    float32, or None when the kernel does not take this input."""
    if queries.dtype == torch.bfloat16 and keys.dtype == torch.bfloat16:
        queries = queries.float()
    lib = compiler.lib_for_keys(lib, keys, queries)
    if (
        lib is None
        or keys.dim() != 4
        or queries.dim() != 4
        or keys.stride(-1) != 1
        or queries.stride(-1) != 1
        or valid.dtype != torch.bool
        or valid.device.type != "cpu"
        or reduce_group not in ("max", "mean")
    ):
        return None
    n, hq, w, dim = queries.shape
    heads, length = keys.shape[1], keys.shape[2]
    if (
        keys.shape[0] != n
        or keys.shape[3] != dim
        or hq % heads
        or valid.shape != (n, length)
        or (length > 1 and valid.stride(1) != 1)
        or w > length
    ):
        return None
    out = torch.empty(n, heads, length, dtype=torch.float32)
    if out.numel() == 0:
        return out
    rc = lib.sparserl_window_attention(
        n,
        heads,
        hq // heads,
        w,
        length,
        dim,
        queries.data_ptr(),
        queries.stride(0),
        queries.stride(1),
        queries.stride(2),
        keys.data_ptr(),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        valid.data_ptr(),
        valid.stride(0),
        int(reduce_group == "max"),
        out.data_ptr(),
        int(keys.dtype == torch.bfloat16),
    )
    if rc != 0:
        raise MemoryError("sparserl_window_attention: out of memory")
    return out
