"""Attention over chosen pages of the KV cache, in torch: block top-k's path off the C kernel (CUDA,
bfloat16, a quantized KV cache, native kernels off) and the kernel's reference in tests.

Sparrow's Vortex engine (Zhou et al., 2026, arXiv 2606.08446) reads, at each decode step, only k pages
of p tokens per (sequence, KV head) (:mod:`sparserl.rollout.kv.blocktopk` chooses them). Here the chosen
pages' rows are gathered into a compact [B, Hkv, k·p, D] copy (a read of those rows only), and the
cache's attention runs over it:

    out_i = softmax(q_i K_Sᵀ / √d + bias) V_S,   S = the slots of the chosen pages, in slot order,

bias −inf on the compact positions past a row's last token (its partial last page, and the k − n
unused pages of a row with fewer pages than k). Every head of a row has the same number of pages and
the same partial last page at the same compact position (the last page is always read and sorts last),
so the bias is per row, as :func:`sparserl.rollout.cache.attention` takes it.
"""

from __future__ import annotations

import torch

__all__ = ["gathered_attention", "page_slots"]


def page_slots(pages: torch.Tensor, start: torch.Tensor, lens: torch.Tensor, page: int):
    """The cache slots of chosen pages: pages [B, Hkv, k] (ascending, -1 after the last), each row's
    first slot ``start`` [B] and length ``lens`` [B] → (slots [B, Hkv, k·page] long, clamped into the
    row's valid range where unused; valid [B, Hkv, k·page] bool)."""
    B, hkv, k = pages.shape
    offset = torch.arange(page, device=pages.device)
    slots = (start[:, None, None, None] + pages[..., None].clamp(min=0) * page + offset).reshape(B, hkv, k * page)
    valid = (pages >= 0)[..., None].expand(B, hkv, k, page).reshape(B, hkv, k * page) & (slots < lens[:, None, None])
    slots = torch.where(valid, slots, start[:, None, None].expand_as(slots))
    return slots, valid


def gathered_attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    pages: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    page: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    quant=None,
) -> torch.Tensor:
    """q [B, Hq, 1, D]; one layer's K, V [B, Hkv, capacity, D] (codes with ``k_scale`` / ``v_scale`` [B,
    Hkv, capacity] and their ``quant`` when quantized); the chosen pages [B, Hkv, k] → out [B, Hq · D]:
    attention over the chosen pages' tokens only (the module docstring)."""
    from .cache import attention  # the cache's attention (its C kernel on CPU where it applies)

    slots, valid = page_slots(pages, start, lens, page)
    D = K.shape[-1]
    index = slots[..., None].expand(*slots.shape, D)
    Kg, Vg = (_raw(x).gather(2, index).view(x.dtype) for x in (K, V))
    ks = k_scale.gather(2, slots) if k_scale is not None else None
    vs = v_scale.gather(2, slots) if v_scale is not None else None
    bias = torch.zeros(valid.shape[0], valid.shape[2], dtype=torch.float32, device=q.device)
    bias = bias.masked_fill_(~valid[:, 0], float("-inf"))[:, None, None, :]
    return attention(q, Kg, Vg, bias, ks, vs, quant)[0]


def _raw(buf: torch.Tensor) -> torch.Tensor:
    """The same bytes as uint8 for float8 codes (CPU ``gather`` has no float8 kernel)."""
    return buf.view(torch.uint8) if buf.dtype.is_floating_point and buf.element_size() == 1 else buf
