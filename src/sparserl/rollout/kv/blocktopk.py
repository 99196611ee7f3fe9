"""Block top-k sparse attention: Sparrow's Vortex engine (Zhou et al., 2026, "Sparrow", arXiv 2606.08446;
docs/algorithms.md §2). The KV cache is kept whole; every decode step reads only some of it.

A sequence's tokens are grouped in pages of p = 16 tokens counted from its first token (page j holds
positions 16 j .. 16 j + 15; the last page is partial). Each page keeps the running sum of its keys
``S_j`` (post-RoPE, as attention sees them; the new key is added as it is written), so its mean key
is ``k̄_j = S_j / n_j`` with n_j its token count. At each decode step, in every layer but the first
``dense_layers`` (Sparrow: 2, which stay dense), for each KV head h with the g query heads i of its
GQA group G(h):

    n   = ⌈T / p⌉ pages (T: the sequence's tokens, this step's included);   k = pages read
    s_j = max_{i ∈ G(h)} q_i · k̄_j                                          (page score)
    read = every page                                       if n ≤ k
         = {0} ∪ {n − 2, n − 1} ∪ top_{k−3}(s_j : 0 < j < n − 2)  otherwise (ties: the later page)
    out_i = softmax(q_i K_readᵀ / √d) V_read                (each head over its own pages)

The first page and the last two are always read (Sparrow); the rest are chosen per KV head.

The group's query heads are reduced by **max** over their scores: attention is computed per query
head, and a page one head needs is worth reading even if the group's other heads ignore it. A sum,
``(Σ_i q_i) · k̄_j``, is one product instead of g, but it lets the heads' signed dot products cancel:
a page one head scores high and another low would lose to a page every head finds middling (R-KV
reduces its groups by max for the same reason). The scoring reads only the page sums (1/16 of the
keys), and costs g dot products per page, small against attention over k·16 tokens.

k: ``pages`` when given (``rollout.blocktopk_pages``; it wins), else ``budget / 16`` (``rollout.kv_budget``,
tokens read per step and layer, a multiple of 16), or with a schedule (``rollout.kv_schedule``, Sparrow)
``budget(T) / 16`` at each row's current length T; at least the 3 always-read pages.

What it saves is attention reads, not memory: the buffers are dense (:meth:`BlockTopK.capacity`),
nothing is evicted (never :meth:`~BlockTopK.due`), so the KV statistics equal dense; the page sums
add 1/16 of the keys' bytes in float32 (:meth:`PageSelector.nbytes`), not counted as KV. Until some
row has more pages than it may read, every step is the dense step (the same numbers to the bit), and
the sums are built from the cache the first time one does.

The per-step work runs in the cache's attention (:meth:`PageSelector.attend`): the C kernel
(``native/blocktopk.c``: sums, choice and attention over the chosen rows in one call) on CPU in
float32, and the torch path otherwise (:func:`page_scores`, :func:`choose_pages`, then
:func:`sparserl.rollout.page_attention.gathered_attention`: a gather of the chosen pages, then
attention), e.g. on CUDA, in bfloat16 or with a quantized KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import native
from ..page_attention import gathered_attention
from .base import CompressorOptionError, KVCompressor, ScoreInputs, register

PAGE_TOKENS = 16  # tokens per page (Sparrow: Pareto-optimal)
SINK_PAGES = 1  # the first page, always read
RECENT_PAGES = 2  # the last two pages, always read (the newest token's among them)
ALWAYS_READ = SINK_PAGES + RECENT_PAGES

__all__ = ["ALWAYS_READ", "BlockTopK", "PAGE_TOKENS", "PageSelector", "choose_pages", "k_problems", "page_scores"]


def k_problems(
    budget: int | None,
    pages: int | None,
    schedule_budgets: list[int] | None,
    *,
    budget_key: str = "budget",
    pages_key: str = "pages",
    schedule_key: str = "schedule",
) -> list[str]:
    """What is wrong with the options that decide k (empty: nothing), each problem naming the
    caller's key, the value and what is valid: the compressor's own option names, or the config's
    (``rollout.kv_budget``, ``rollout.blocktopk_pages``, ``rollout.kv_schedule``)."""
    if pages is not None:
        if schedule_budgets is not None:
            return [
                f"{pages_key}={pages} and {schedule_key} both decide the pages block top-k reads; give one "
                f"({pages_key} a fixed number of pages, {schedule_key} budgets in tokens by length)"
            ]
        if pages < ALWAYS_READ:
            return [
                f"{pages_key}={pages}: block top-k reads at least the {ALWAYS_READ} pages it always keeps (the "
                f"first and the last {RECENT_PAGES}); give {ALWAYS_READ} or more"
            ]
        return []
    problems = []
    named = (
        [(f"{schedule_key} budget {b}", b) for b in schedule_budgets]
        if schedule_budgets is not None
        else [(f"{budget_key}={budget}", budget)]
    )
    for label, b in named:
        if b % PAGE_TOKENS:
            near = sorted(
                {
                    max(b // PAGE_TOKENS * PAGE_TOKENS, ALWAYS_READ * PAGE_TOKENS),
                    max(-(-b // PAGE_TOKENS) * PAGE_TOKENS, ALWAYS_READ * PAGE_TOKENS),
                }
            )
            problems.append(
                f"{label} is not a multiple of {PAGE_TOKENS}: block top-k reads whole pages of "
                f"{PAGE_TOKENS} tokens; use {' or '.join(map(str, near))}"
            )
        elif b < ALWAYS_READ * PAGE_TOKENS:
            problems.append(
                f"{label} is {b // PAGE_TOKENS} pages, fewer than the {ALWAYS_READ} block top-k always "
                f"reads (the first and the last {RECENT_PAGES}); use {ALWAYS_READ * PAGE_TOKENS} tokens "
                "or more"
            )
    return problems


@register("blocktopk")
@dataclass
class BlockTopK(KVCompressor):
    """Options: ``budget`` (tokens read per step and layer, a multiple of 16) or ``pages`` (k; wins
    when given), ``schedule`` (budgets by length), ``dense_layers`` (the first layers, read whole).
    The eviction options (``trigger``, ``step_length``, ``window``, ``compress_prompt``,
    ``tail_slack``) are accepted and unused: nothing is evicted."""

    pages: int | None = None
    dense_layers: int = 2

    selects_per_step = True

    def _resolve_schedule(self) -> None:
        super()._resolve_schedule()
        if self.pages is not None:  # the pages decide: the budget says the same in tokens
            self.budget = self.pages * PAGE_TOKENS

    def validate(self) -> None:
        if not isinstance(self.dense_layers, int) or self.dense_layers < 0:
            raise CompressorOptionError(f"blocktopk: dense_layers must be an integer >= 0, got {self.dense_layers!r}")
        if self.pages is not None and (not isinstance(self.pages, int) or isinstance(self.pages, bool)):
            raise CompressorOptionError(f"blocktopk: pages must be an integer, got {self.pages!r}")
        budgets = list(self.schedule.budgets) if self.schedule is not None else None
        problems = k_problems(self.budget, self.pages, budgets)
        if problems:
            raise CompressorOptionError("blocktopk: " + "; ".join(problems))

    # --- what the cache asks: a dense cache, never compressed -----------------------------------
    def capacity(self, prompt_len: int, max_new: int) -> int:
        return prompt_len + max_new

    def due(
        self,
        region_len: torch.Tensor,
        newline: torch.Tensor | None = None,
        remaining: int | None = None,
        seq_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return torch.zeros_like(region_len, dtype=torch.bool)

    @property
    def needs_newlines(self) -> bool:
        return False

    def score(self, inp: ScoreInputs) -> torch.Tensor:
        raise RuntimeError("blocktopk never evicts: it keeps every token and chooses pages at each step")

    def pages_for(self, n_tokens: torch.Tensor) -> torch.Tensor:
        """k, the pages each row reads at its length ``n_tokens`` [B] (long): ``pages``, else the
        (scheduled) budget over 16."""
        if self.pages is not None:
            return torch.full_like(n_tokens, self.pages)
        return torch.div(self.budget_for(n_tokens), PAGE_TOKENS, rounding_mode="floor")

    def attention_selector(self, cache) -> PageSelector:
        return PageSelector(self, cache)


# --- the choice, in torch (the C kernel's reference, and the path off the CPU) ---------------------
def page_scores(q: torch.Tensor, sums: torch.Tensor, n_tokens: torch.Tensor, page: int = PAGE_TOKENS) -> torch.Tensor:
    """s_j = max over the GQA group of q_i · S_j / n_j: q [B, Hq, 1, D], page key sums [B, Hkv, P, D],
    tokens per row [B] → [B, Hkv, P] float32 (pages past a row's end: their sums over 1 token)."""
    B, hq, _, D = q.shape
    hkv, P = sums.shape[1], sums.shape[2]
    counts = (n_tokens[:, None] - page * torch.arange(P, device=sums.device)).clamp(1, page)  # [B, P]
    mean = sums / counts[:, None, :, None].to(sums.dtype)
    s = torch.matmul(q.float().reshape(B, hkv, hq // hkv, D), mean.float().transpose(-1, -2))  # [B, Hkv, g, P]
    return s.amax(dim=2)


def choose_pages(
    scores: torch.Tensor,
    n_tokens: torch.Tensor,
    k_pages: torch.Tensor,
    page: int = PAGE_TOKENS,
    sink: int = SINK_PAGES,
    recent: int = RECENT_PAGES,
    kmax: int | None = None,
) -> torch.Tensor:
    """The pages each (row, KV head) reads: scores [B, Hkv, P], tokens per row [B], k per row [B] →
    [B, Hkv, max k] long, ascending, -1 after the row's min(n, k) pages (the rule in the module
    docstring: every page when n ≤ k, else the first ``sink`` and last ``recent`` and the best
    others, ties to the later page). ``kmax``: max k when the caller knows it (the static decode step: no
    read of ``k`` on the host)."""
    B, hkv, P = scores.shape
    dev = scores.device
    j = torch.arange(P, device=dev)
    n = (n_tokens + page - 1) // page  # [B]
    k = k_pages.to(torch.long)
    inside = j[None, :] < n[:, None]
    always = inside & ((j[None, :] < sink) | (j[None, :] >= (n - recent)[:, None]) | (n <= k)[:, None])
    s = scores.float().masked_fill(~inside[:, None, :], float("-inf")).masked_fill(always[:, None, :], float("inf"))
    # best first; among equal scores the later page first (a stable sort of the pages reversed)
    order = torch.sort(s.flip(-1), dim=-1, descending=True, stable=True).indices
    kmax = int(k.max()) if kmax is None else kmax
    top = (P - 1 - order)[..., :kmax]  # [B, Hkv, kmax] page ids
    rank = torch.arange(top.shape[-1], device=dev)
    keep = (rank[None, None, :] < torch.minimum(n, k)[:, None, None]) & (s.gather(-1, top) > float("-inf"))
    top = torch.where(keep, top, torch.full_like(top, P + 1)).sort(dim=-1).values
    out = torch.where(top > P, torch.full_like(top, -1), top)
    if out.shape[-1] < kmax:  # fewer pages than k in every row
        out = torch.cat([out, out.new_full((B, hkv, kmax - out.shape[-1]), -1)], dim=-1)
    return out


class PageSelector:
    """Block top-k's state for one generation, held by the cache: the page key sums of the sparse
    layers and each step's k and choice. A step: :meth:`begin_step` (k per row, and the sums built
    when reading pages starts), then per layer :meth:`attend` (eager) or :meth:`native_step` (the
    fused step), both of which add the layer's new key to its page sum, choose and attend."""

    def __init__(self, method: BlockTopK, cache):
        self.method = method
        self.first_sparse = min(method.dense_layers, cache.n_layers)
        self.n_sparse = cache.n_layers - self.first_sparse
        self.max_pages = -(-cache.capacity // PAGE_TOKENS)
        self.n_heads, self.n_kv, self.head_dim = cache.n_heads, cache.n_kv, cache.head_dim
        self.sums: torch.Tensor | None = None  # [n_sparse, B, Hkv, max_pages, D] float32, once pages are read
        self.reading = False  # this step reads pages (False: the dense step)
        self.k_pages: torch.Tensor | None = None  # [B] int32, this step
        self.chosen: torch.Tensor | None = None  # [n_sparse, B, Hkv, max k] int32, this step's pages (-1: none)
        self.scale = cache.head_dim**-0.5

    def nbytes(self) -> int:
        """Bytes of the page key sums (held beside the K/V buffers once pages are read)."""
        return 0 if self.sums is None else self.sums.numel() * self.sums.element_size()

    def sparse(self, layer: int) -> bool:
        """Whether ``layer`` reads chosen pages at this step (not one of the dense layers, and reading)."""
        return self.reading and layer >= self.first_sparse

    def begin_step(self, cache) -> None:
        """After the cache reserved this step's slot (``cache.lens`` counts the new token): k per row;
        the first time some row has more pages than it may read, the sums of every sparse layer's
        cached keys (the new token's is added by the layer's step)."""
        if not self.n_sparse:
            return
        n_tokens = cache.lens - cache.start
        k = self.method.pages_for(n_tokens)
        if self.sums is None and bool(((n_tokens + PAGE_TOKENS - 1) // PAGE_TOKENS > k).any()):
            self.sums = self._sums_of_cached_keys(cache)
        self.reading = self.sums is not None
        if self.reading:
            self.k_pages = k.to(torch.int32).contiguous()
            self.chosen = torch.empty(
                self.n_sparse, cache.batch, self.n_kv, int(k.max()), dtype=torch.int32, device=cache.device
            )
            # the fused step's addresses, once a step: (sums, its layer stride, chosen, its layer stride)
            self._addresses = (
                self.sums.data_ptr(),
                self.sums.stride(0) * 4,
                self.chosen.data_ptr(),
                self.chosen.stride(0) * 4,
            )

    def _sums_of_cached_keys(self, cache) -> torch.Tensor:
        """S_j of every sparse layer over the tokens cached before this step's (slots start .. lens - 2)."""
        B, L = cache.batch, cache.max_len - 1
        slot = torch.arange(L, device=cache.device)
        rel = slot[None, :] - cache.start[:, None]  # position of each slot in its row
        valid = (rel >= 0) & (slot[None, :] < cache.lens[:, None] - 1)
        page = torch.where(valid, rel // PAGE_TOKENS, 0)  # [B, L]
        sums = torch.zeros(
            self.n_sparse, B, self.n_kv, self.max_pages, self.head_dim, dtype=torch.float32, device=cache.device
        )
        index = page[:, None, :, None].expand(B, self.n_kv, L, self.head_dim)
        for i in range(self.n_sparse):  # a layer at a time: one float copy of its keys alive
            keys = cache.dequantized(self.first_sparse + i, L)[0].float() * valid[:, None, :, None]
            sums[i].scatter_add_(2, index, keys)
        return sums

    def attend(self, cache, layer: int, q: torch.Tensor) -> torch.Tensor:
        """One sparse layer's step after its k, v are written: q [B, Hq, 1, D] → out [B, Hq * D]. The C
        kernel where it takes the input (CPU, float32 K/V), else torch: the sum update, page scores, the
        choice, a gather of the chosen pages and attention over them."""
        i = layer - self.first_sparse
        K, V = cache.keys[layer], cache.values[layer]
        if cache.k_scale is None:
            out = native.blocktopk_attention(
                q,
                K,
                V,
                self.sums[i],
                cache.start,
                cache.lens,
                self.k_pages,
                PAGE_TOKENS,
                SINK_PAGES,
                RECENT_PAGES,
                chosen=self.chosen[i],
            )
            if out is not None:
                return out
        self._add_new_key(cache, layer)
        n_tokens = cache.lens - cache.start
        n_max = int(-(-int(n_tokens.max()) // PAGE_TOKENS))
        scores = page_scores(q, self.sums[i, :, :, :n_max], n_tokens)
        pages = choose_pages(scores, n_tokens, self.k_pages)
        self.chosen[i] = pages.to(torch.int32)
        ks, vs = (cache.k_scale[layer], cache.v_scale[layer]) if cache.k_scale is not None else (None, None)
        return gathered_attention(q, K, V, pages, cache.start, cache.lens, PAGE_TOKENS, ks, vs, cache.quant)

    def _add_new_key(self, cache, layer: int) -> None:
        """S_j += k (S_j = k on a page's first token) for the key written at slot lens - 1, as the C kernel."""
        rows = torch.arange(cache.batch, device=cache.device)
        slot = cache.lens - 1
        k = cache.keys[layer][rows, :, slot]  # [B, Hkv, D]
        if cache.k_scale is not None:
            k = cache.quant.dequantize(k, cache.k_scale[layer][rows, :, slot], cache.dtype)
        rel = slot - cache.start
        page, first = rel // PAGE_TOKENS, (rel % PAGE_TOKENS == 0)[:, None, None]
        sums = self.sums[layer - self.first_sparse]
        sums[rows, :, page] = torch.where(first, k.float(), sums[rows, :, page] + k.float())

    def native_step(
        self,
        lib,
        layer: int,
        cache,
        q_ptr: int,
        q_sb: int,
        q_sh: int,
        k_ptr: int,
        v_ptr: int,
        kv_sb: int,
        kv_sh: int,
        kv_sl: int,
        out_ptr: int,
    ) -> int:
        """:meth:`attend` on the C kernel at raw addresses (the fused step: q inside its q/k/v buffer, K/V
        float32 or bfloat16 with element strides); returns the kernel's code (0: done)."""
        i = layer - self.first_sparse
        sums0, sums_layer, chosen0, chosen_layer = self._addresses
        _, B, hkv, pages, D = self.sums.shape
        return lib.sparserl_blocktopk_attention(
            B,
            self.n_heads,
            hkv,
            D,
            PAGE_TOKENS,
            q_ptr,
            q_sb,
            q_sh,
            k_ptr,
            v_ptr,
            kv_sb,
            kv_sh,
            kv_sl,
            sums0 + i * sums_layer,
            hkv * pages * D,
            pages * D,
            cache.start.data_ptr(),
            cache.lens.data_ptr(),
            self.k_pages.data_ptr(),
            1,
            SINK_PAGES,
            RECENT_PAGES,
            self.scale,
            out_ptr,
            chosen0 + i * chosen_layer,
            self.chosen.shape[-1],
            int(cache.keys.dtype == torch.bfloat16),
        )

    def native_ok(self, cache) -> bool:
        """Whether :meth:`native_step` takes this cache's bookkeeping (CPU int64 start / lens)."""
        return all(
            t.device.type == "cpu" and t.dtype == torch.int64 and t.is_contiguous() for t in (cache.start, cache.lens)
        )

    def select(self, keep_rows: torch.Tensor) -> None:
        """Keep these rows only (the cache's batch shrinks)."""
        if self.sums is not None:
            self.sums = self.sums.index_select(1, keep_rows)

    def attended(self, cache, layer: int) -> torch.Tensor:
        """Bool [B, Hkv, L] (L = ``cache.max_len``): the slots ``layer`` read at this step."""
        L = cache.max_len
        slot = torch.arange(L, device=cache.device)
        rel = slot[None, :] - cache.start[:, None]
        valid = (rel >= 0) & (slot[None, :] < cache.lens[:, None])  # [B, L]
        mask = valid[:, None, :].expand(cache.batch, self.n_kv, L)
        if not self.sparse(layer):
            return mask.clone()
        pages = self.chosen[layer - self.first_sparse].long()  # [B, Hkv, k]
        read = torch.zeros(cache.batch, self.n_kv, self.max_pages + 1, dtype=torch.bool, device=cache.device)
        read.scatter_(2, torch.where(pages < 0, self.max_pages, pages), True)
        page_of = torch.where(valid, rel // PAGE_TOKENS, self.max_pages)[:, None, :].expand(-1, self.n_kv, -1)
        return mask & read.gather(2, page_of)
