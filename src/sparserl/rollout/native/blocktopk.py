"""``blocktopk.c``: block top-k sparse attention (:mod:`sparserl.rollout.kv.blocktopk`): the page key sums
kept up to date, the pages chosen by query · mean key, attention over their rows only.
"""

from __future__ import annotations

import torch

from . import compiler


def blocktopk_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    sums: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    k_pages: torch.Tensor | None,
    page: int,
    sink: int,
    recent: int,
    update: bool = True,
    attend: bool = True,
    chosen: torch.Tensor | None = None,
    lib=None,
):
    """``blocktopk.c``: block top-k attention for one decode step of one layer, after the step's k, v
    are written at slot ``lens - 1`` (the formula in :mod:`sparserl.rollout.kv.blocktopk`). q [B, Hq, 1, D]
    float32 (unit stride in D); K, V [B, Hkv, capacity, D] float32 with the same strides (a layer's
    view of the cache); ``sums`` [B, Hkv, pages, D] float32 (the page key sums, unit strides in the last
    two dims; updated with the new key when ``update``); ``start``, ``lens`` [B] int64 (the first slot and
    the length after the write) and ``k_pages`` [B] int32 (pages each row reads), contiguous; ``chosen``
    [B, Hkv, max_k] int32 (contiguous) receives the pages read, ascending, -1 after them. Returns out
    [B, Hq * D] (with ``attend=False``, True: the update alone ran), or None, with nothing done, when
    the kernel does not take this input (the caller runs torch: :mod:`sparserl.rollout.page_attention`)."""
    lib = compiler.running(lib)
    if lib is None or torch.compiler.is_compiling():
        return None
    if (
        any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (q, sums))
        or K.device.type != "cpu"
        or K.dtype not in (torch.float32, torch.bfloat16)
        or V.dtype != K.dtype
    ):
        return None
    B, hq, _, D = q.shape
    hkv = K.shape[1]
    if (
        q.stride(-1) != 1
        or K.stride() != V.stride()
        or K.stride(-1) != 1
        or hq % hkv
        or sums.stride(-1) != 1
        or sums.stride(-2) != D
        or sums.shape[:2] != (B, hkv)
        or sums.shape[-1] != D
        or K.shape[0] != B
        or K.shape[-1] != D
    ):
        return None
    ints = [(start, torch.int64), (lens, torch.int64)] + ([(k_pages, torch.int32)] if attend else [])
    if any(t.device.type != "cpu" or t.dtype != dt or not t.is_contiguous() or t.numel() != B for t, dt in ints):
        return None
    if chosen is not None and (
        chosen.dtype != torch.int32 or not chosen.is_contiguous() or chosen.shape[:2] != (B, hkv)
    ):
        return None
    max_k = chosen.shape[2] if chosen is not None else int(k_pages.max()) if attend else 1
    out = torch.empty(B, hq * D, dtype=torch.float32) if attend else None
    rc = lib.sparserl_blocktopk_attention(
        B,
        hq,
        hkv,
        D,
        page,
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        K.data_ptr(),
        V.data_ptr(),
        K.stride(0),
        K.stride(1),
        K.stride(2),
        sums.data_ptr(),
        sums.stride(0),
        sums.stride(1),
        start.data_ptr(),
        lens.data_ptr(),
        k_pages.data_ptr() if attend else None,
        int(update),
        sink,
        recent,
        D**-0.5,
        out.data_ptr() if attend else None,
        chosen.data_ptr() if chosen is not None else None,
        max_k,
        int(K.dtype == torch.bfloat16),
    )
    if rc == -2:
        raise MemoryError("sparserl_blocktopk_attention: out of memory")
    if rc != 0:
        return None
    return out if attend else True
