"""A KV cache whose memory is really bounded: preallocated buffers sized to ``budget + period``.

Dense or sparse, one code path: the compressor (``none`` for dense) sizes the buffers
(:meth:`KVCompressor.capacity`, decided by the engine) and says when a sequence is due. Every
buffer lives on the device of the prefill keys (the model's device).

Layout per layer: K and V buffers [B, Hkv, capacity, D]; sequences are left-padded after prefill
(slots ``< start[b]`` are padding). Each decode step writes one slot per sequence at ``lens[b]``
(no growing ``torch.cat``: the buffers never move). When a sequence's compressible region reaches
``budget + step_length`` tokens (or, with the ``newline`` trigger, after a newline once past the
budget) the compressor picks ``budget`` slots per KV head and the cache gathers them into the front
of the region; everything after is free for new tokens. The true position of every slot is kept
(``pos``), so rotary positions continue from the true length, and tests can recompute attention
over exactly the kept keys.

When sequences finish, :meth:`select` shrinks every buffer to the sequences still running, so
finished sequences cost neither compute nor memory.

Memory accounting: ``bytes_allocated`` is what the K/V buffers hold (the figure a benchmark
reports as ``kv_bytes_peak``); ``bytes_theory`` is what the valid cached tokens need.
"""
from __future__ import annotations

import torch

from .kv.base import KVCompressor, ScoreInputs


class CompressedKVCache:
    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        valid: torch.Tensor,
        positions: torch.Tensor,
        capacity: int,
        compressor: KVCompressor,
        n_heads: int,
        queries: list[torch.Tensor] | None = None,
        attn_acc: list[torch.Tensor] | None = None,
    ):
        """Build from prefill outputs: keys/values per layer [B, Hkv, P, D], ``valid`` [B, P] bool,
        ``positions`` [B, P]. Prompt compression (if the compressor allows it) happens here."""
        B, hkv, P, D = keys[0].shape
        self.n_layers = len(keys)
        self.n_kv, self.head_dim, self.n_heads = hkv, D, n_heads
        self.dtype, self.device = keys[0].dtype, keys[0].device
        self.compressor = compressor
        self.region_start = 0 if compressor.compress_prompt else P
        self.window = compressor.window if compressor.needs_queries else 0
        self.track_attention = compressor.needs_attention
        self.capacity = capacity
        self.n_compressions = 0
        self.bytes_peak = 0
        self.bytes_theory_peak = 0

        start = (~valid).sum(dim=1)  # left padding → first valid slot
        self.start = start.clone()
        dev = self.device
        self.lens = torch.full((B,), P, dtype=torch.long, device=dev)
        self._uniform_len: int | None = P  # all lens equal (the common case: plain slicing)

        pos = positions[:, None, :].expand(B, hkv, P).to(torch.int32)
        self.k = [torch.zeros(B, hkv, capacity, D, dtype=self.dtype, device=dev) for _ in range(self.n_layers)]
        self.v = [torch.zeros(B, hkv, capacity, D, dtype=self.dtype, device=dev) for _ in range(self.n_layers)]
        self.pos = torch.zeros(self.n_layers, B, hkv, capacity, dtype=torch.int32, device=dev)
        self.acc = (
            [torch.zeros(B, hkv, capacity, dtype=torch.float32, device=dev) for _ in range(self.n_layers)]
            if self.track_attention else None
        )
        if P > capacity:
            # only reachable with a compressible prompt longer than the budget: compress the prompt
            # while it still sits in the prefill tensors, then copy the kept slots in
            self._compress_prefill(keys, values, pos, valid, queries, attn_acc)
        else:
            for layer in range(self.n_layers):
                self.k[layer][:, :, :P] = keys[layer]
                self.v[layer][:, :, :P] = values[layer]
                self.pos[layer, :, :, :P] = pos
                if self.acc is not None and attn_acc is not None:
                    self.acc[layer][:, :, :P] = attn_acc[layer]
        # ring of the last `window` queries per layer: [L, B, Hq, w, D]
        self.q_ring = None
        self.q_count = 0
        self.q_head = 0  # next write slot of the ring
        if self.window:
            self.q_ring = torch.zeros(self.n_layers, B, n_heads, self.window, D, dtype=self.dtype, device=dev)
            if queries is not None:
                w = min(self.window, queries[0].shape[2])
                for layer in range(self.n_layers):
                    self.q_ring[layer, :, :, -w:] = queries[layer][:, :, -w:]
                self.q_count = w
        self._account()

    # --- bookkeeping ---------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.lens.shape[0]

    @property
    def max_len(self) -> int:
        return self._uniform_len if self._uniform_len is not None else int(self.lens.max())

    def bytes_allocated(self) -> int:
        per = self.k[0].numel() * self.k[0].element_size()
        return 2 * per * self.n_layers

    def bytes_valid(self) -> int:
        per_token = 2 * self.n_layers * self.n_kv * self.head_dim * self.k[0].element_size()
        return int((self.lens - self.start).sum()) * per_token

    def _account(self) -> None:
        self.bytes_peak = max(self.bytes_peak, self.bytes_allocated())
        self.bytes_theory_peak = max(self.bytes_theory_peak, self.bytes_valid())

    def kept_tokens(self) -> torch.Tensor:
        """Valid cached tokens per sequence (per layer and KV head)."""
        return self.lens - self.start

    def region_len(self) -> torch.Tensor:
        return self.lens - self.region_start

    # --- the decode step -----------------------------------------------------------------------
    def begin_step(self, new_positions: torch.Tensor) -> torch.Tensor:
        """Reserve the slot each sequence writes this step and return the additive attention bias
        [B, 1, 1, L] over slots 0..L-1 (L = longest length after the write)."""
        B = self.batch
        if self._uniform_len is not None:
            slot = self._uniform_len
            self.pos[:, :, :, slot] = new_positions.to(torch.int32)[None, :, None]
        else:
            bidx = torch.arange(B, device=self.device)
            self.pos[:, bidx, :, self.lens] = new_positions.to(torch.int32)[:, None, None].expand(B, self.n_layers, self.n_kv)
        self._slot = self.lens.clone()
        self.lens += 1
        if self._uniform_len is not None:
            self._uniform_len += 1
        L = self.max_len
        ar = torch.arange(L, device=self.device)
        valid = (ar[None, :] >= self.start[:, None]) & (ar[None, :] < self.lens[:, None])
        self._valid_step = valid
        bias = torch.zeros(B, L, dtype=torch.float32, device=self.device).masked_fill_(~valid, float("-inf"))
        return bias[:, None, None, :]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Write this step's k, v [B, Hkv, 1, D] and attend q [B, Hq, 1, D] over the cache.

        softmax(q Kᵀ/√d + bias) V computed per GQA group without expanding K/V."""
        B, hq, _, D = q.shape
        hkv = self.n_kv
        g = hq // hkv
        K, V = self.k[layer], self.v[layer]
        if self._uniform_len is not None:
            slot = self._uniform_len - 1
            K[:, :, slot : slot + 1] = k
            V[:, :, slot : slot + 1] = v
        else:
            bidx = torch.arange(B, device=self.device)
            K[bidx, :, self._slot] = k[:, :, 0]
            V[bidx, :, self._slot] = v[:, :, 0]
        L = bias.shape[-1]
        Kl, Vl = K[:, :, :L], V[:, :, :L]
        qg = q.reshape(B, hkv, g, D)
        s = torch.matmul(qg, Kl.transpose(-1, -2)) * (D**-0.5)  # [B, hkv, g, L]
        p = (s.float() + bias).softmax(dim=-1)
        if self.acc is not None:
            self.acc[layer][:, :, :L] += p.sum(dim=2)
        if self.q_ring is not None:
            self.q_ring[layer, :, :, self.q_head] = q[:, :, 0]
        out = torch.matmul(p.to(self.dtype), Vl)  # [B, hkv, g, D]
        return out.reshape(B, hq * D)

    def end_step(self) -> None:
        if self.q_ring is not None:
            self.q_head = (self.q_head + 1) % self.window
            self.q_count = min(self.q_count + 1, self.window)

    # --- compression ---------------------------------------------------------------------------
    def due(self, newline: torch.Tensor | None = None) -> torch.Tensor:
        """Bool [B]: sequences whose cache must be compressed now (the compressor's rule)."""
        return self.compressor.due(self.region_len(), newline)

    def _ordered_queries(self, layer: int, rows: torch.Tensor) -> torch.Tensor | None:
        if self.q_ring is None:
            return None
        w = self.window
        order = [(self.q_head + i) % w for i in range(w)]  # oldest first
        q = self.q_ring[layer][rows][:, :, order]
        return q[:, :, w - self.q_count :] if self.q_count < w else q

    def compress(self, due: torch.Tensor) -> None:
        """Compress every due sequence down to the budget (groups of equal length at a time)."""
        rows_all = due.nonzero().flatten()
        if rows_all.numel() == 0:
            return
        self._account()  # the peak is right before an eviction
        lens = self.lens[rows_all]
        for L in lens.unique().tolist():
            rows = rows_all[lens == L]
            self._compress_rows(rows, int(L))
        self.n_compressions += 1
        u = self.lens.unique()
        self._uniform_len = int(u[0]) if u.numel() == 1 else None

    def _compress_rows(self, rows: torch.Tensor, L: int) -> None:
        c = self.compressor
        rs = self.region_start
        keep = c.budget_for(L)
        ar = torch.arange(L, device=self.device)
        valid = ar[None, :] >= self.start[rows][:, None]
        n_valid_region = valid[:, rs:].sum(-1)
        for layer in range(self.n_layers):
            K, V = self.k[layer], self.v[layer]
            kr = K[rows, :, :L]
            inp = ScoreInputs(
                keys=kr,
                region=slice(rs, L),
                valid=valid,
                queries=self._ordered_queries(layer, rows),
                positions=self.pos[layer][rows, :, :L],
                attn_acc=self.acc[layer][rows, :, :L] if self.acc is not None else None,
            )
            idx = c.select(inp, keep) + rs  # [n, hkv, keep] slots
            gi = idx[..., None].expand(-1, -1, -1, self.head_dim)
            K[rows, :, rs : rs + keep] = kr.gather(2, gi)
            V[rows, :, rs : rs + keep] = V[rows, :, :L].gather(2, gi)
            self.pos[layer, rows, :, rs : rs + keep] = self.pos[layer][rows, :, :L].gather(2, idx)
            if self.acc is not None:
                a = self.acc[layer][rows, :, :L].gather(2, idx)
                self.acc[layer][rows, :, rs : rs + keep] = a
                self.acc[layer][rows, :, rs + keep :] = 0
        self.lens[rows] = rs + keep
        if rs == 0:  # the prompt was compressible: padding may have been kept at the front
            self.start[rows] = (keep - n_valid_region).clamp(min=0)

    def _compress_prefill(self, keys, values, pos, valid, queries, attn_acc) -> None:
        """Compress a compressible prompt longer than the buffer while it sits in the prefill
        tensors; only the kept slots are copied into the (budget-sized) buffers."""
        c = self.compressor
        B, P = valid.shape
        keep = c.budget_for(P)
        n_valid = valid.sum(-1)
        for layer in range(self.n_layers):
            qs = None
            if queries is not None:
                qs = queries[layer][:, :, -c.window :] if c.needs_queries else None
            inp = ScoreInputs(keys=keys[layer], region=slice(0, P), valid=valid, queries=qs,
                              positions=pos, attn_acc=attn_acc[layer] if attn_acc is not None else None)
            idx = c.select(inp, keep)
            gi = idx[..., None].expand(-1, -1, -1, self.head_dim)
            self.k[layer][:, :, :keep] = keys[layer].gather(2, gi)
            self.v[layer][:, :, :keep] = values[layer].gather(2, gi)
            self.pos[layer, :, :, :keep] = pos.gather(2, idx)
            if self.acc is not None and attn_acc is not None:
                self.acc[layer][:, :, :keep] = attn_acc[layer].gather(2, idx)
        self.lens[:] = keep
        self.start = (keep - n_valid).clamp(min=0)
        self._uniform_len = keep
        self.n_compressions += 1

    # --- shrinking the batch -------------------------------------------------------------------
    def select(self, keep_rows: torch.Tensor) -> None:
        """Keep only these sequences (new, smaller buffers; the old ones are freed)."""
        self._account()
        self.k = [t.index_select(0, keep_rows) for t in self.k]
        self.v = [t.index_select(0, keep_rows) for t in self.v]
        self.pos = self.pos.index_select(1, keep_rows)
        if self.acc is not None:
            self.acc = [t.index_select(0, keep_rows) for t in self.acc]
        if self.q_ring is not None:
            self.q_ring = self.q_ring.index_select(1, keep_rows)
        self.lens = self.lens.index_select(0, keep_rows)
        self.start = self.start.index_select(0, keep_rows)
        u = self.lens.unique()
        self._uniform_len = int(u[0]) if u.numel() == 1 else None
