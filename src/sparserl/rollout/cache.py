"""A KV cache whose memory is really bounded: preallocated buffers sized to ``budget + period``.

Dense or sparse, one code path: the compressor (``none`` for dense) sizes the buffers
(:meth:`KVCompressor.capacity`, decided by the engine) and says when a sequence is due. Every
buffer lives on the device of the prefill keys (the model's device).

Layout: one K and one V buffer for all layers, [n_layers, B, Hkv, capacity, D] (``k[layer]`` is a
view of one layer); sequences are left-padded after prefill
(slots ``< start[b]`` are padding). Each decode step writes one slot per sequence at ``lens[b]``
(no growing ``torch.cat``: the buffers never move). When a sequence's compressible region reaches
``budget + step_length`` tokens (or, with the ``newline`` trigger, after a newline once past the
budget) the compressor picks ``budget`` slots per KV head and the cache gathers them into the front
of the region; everything after is free for new tokens. The true position of every slot is kept
(``pos``), so rotary positions continue from the true length, and tests can recompute attention
over exactly the kept keys.

A compression scores and gathers all layers of the due sequences in a few large operations (the
layers are folded into the batch of :class:`ScoreInputs`, in chunks that bound the scoring
temporaries, :meth:`KVCompressor.score_bytes`) instead of a loop of small ones per layer: the same
selections, a fraction of the operator calls (what dominates a short period such as the default
job's ``step_length: 2``).

When sequences finish, :meth:`select` shrinks every buffer to the sequences still running, so
finished sequences cost neither compute nor memory.

A method that keeps every token and chooses per step what attention reads (block top-k,
:mod:`sparserl.rollout.kv.blocktopk`) gives the cache a selector (:meth:`KVCompressor.attention_selector`):
the cache tells it of each step (:meth:`begin_step`) and of batch shrinks, and a layer it calls
sparse attends through it (:meth:`attend`); :meth:`attended` says which slots a layer read.

Quantized KV (``kv_quant``: ``int8`` / ``fp8``, :mod:`sparserl.rollout.kv_quant`): the K/V buffers
hold one-byte codes and two more buffers ``k_scale`` / ``v_scale`` [n_layers, B, Hkv, capacity] hold
one float32 scale per [token, KV head] vector. Every write quantizes (prefill, decode, the compiled
step); attention applies the scales per token after the products (:func:`attention`); a compressor
scores the dequantized keys; every move of a slot (eviction, batch shrink) moves its scales with its
codes. The current token is quantized before it is attended, like every other.

Memory accounting: ``bytes_allocated`` is what the K/V buffers hold, codes and scales (the figure a
benchmark reports as ``kv_bytes_peak``); ``bytes_theory`` is what the valid cached tokens need.
"""

from __future__ import annotations

import torch

from . import native
from .kv.base import KVCompressor, ScoreInputs
from .kv_quant import KVQuantizer, get_kv_quantizer


class CompressedKVCache:
    SCORE_CHUNK_BYTES = 128 << 20  # bound on a compression's scoring temporaries (chunks of layers)

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
        kv_quant: str | KVQuantizer = "none",
    ):
        """Build from prefill outputs: keys/values per layer [B, Hkv, P, D], ``valid`` [B, P] bool,
        ``positions`` [B, P]. Prompt compression (if the compressor allows it) happens here.
        ``kv_quant``: how K/V are stored (``none | int8 | fp8``, :mod:`sparserl.rollout.kv_quant`)."""
        B, hkv, P, D = keys[0].shape
        self.n_layers = len(keys)
        self.n_kv, self.head_dim, self.n_heads = hkv, D, n_heads
        self.dtype, self.device = keys[0].dtype, keys[0].device
        self.compressor = compressor
        self.quant = get_kv_quantizer(kv_quant)
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
        nl = self.n_layers
        store = self.quant.storage_dtype(self.dtype)
        self.keys = torch.zeros(nl, B, hkv, capacity, D, dtype=store, device=dev)
        self.values = torch.zeros(nl, B, hkv, capacity, D, dtype=store, device=dev)
        self.k_scale = self.v_scale = None  # [L, B, Hkv, capacity] float32 when quantized
        if self.quant.quantized:
            self.k_scale = torch.zeros(nl, B, hkv, capacity, dtype=torch.float32, device=dev)
            self.v_scale = torch.zeros(nl, B, hkv, capacity, dtype=torch.float32, device=dev)
        self.pos = torch.zeros(nl, B, hkv, capacity, dtype=torch.int32, device=dev)
        self.attn_acc = (
            torch.zeros(nl, B, hkv, capacity, dtype=torch.float32, device=dev) if self.track_attention else None
        )
        if P >= capacity:
            # only reachable with a compressible prompt that fills the buffer (budget + step length, or
            # more): compress the prompt while it still sits in the prefill tensors, then copy the kept
            # slots in (a prompt of exactly the buffer's size left no slot for the first response token)
            self._compress_prefill(keys, values, pos, valid, queries, attn_acc)
        else:
            for layer in range(nl):
                self._write(layer, (slice(None), slice(None), slice(0, P)), keys[layer], values[layer])
                if self.attn_acc is not None and attn_acc is not None:
                    self.attn_acc[layer, :, :, :P] = attn_acc[layer]
            self.pos[:, :, :, :P] = pos
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
        self.selector = compressor.attention_selector(self)  # None unless the method selects per step
        self._account()

    # --- bookkeeping ---------------------------------------------------------------------------
    @property
    def k(self) -> list[torch.Tensor]:
        """Per-layer views [B, Hkv, capacity, D] of the key buffer (the codes when quantized; see
        :meth:`dequantized`)."""
        return list(self.keys.unbind(0))

    @property
    def v(self) -> list[torch.Tensor]:
        return list(self.values.unbind(0))

    @property
    def acc(self) -> list[torch.Tensor] | None:
        """Per-layer views [B, Hkv, capacity] of the accumulated attention (H2O), or None."""
        return None if self.attn_acc is None else list(self.attn_acc.unbind(0))

    @property
    def batch(self) -> int:
        return self.lens.shape[0]

    @property
    def max_len(self) -> int:
        return self._uniform_len if self._uniform_len is not None else int(self.lens.max())

    def dequantized(self, layer: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer over slots ``0..length-1`` [B, Hkv, length, D] in the sampler
        dtype, as attention sees them (dequantized codes when quantized; views otherwise)."""
        L = self.capacity if length is None else length
        K, V = self.keys[layer, :, :, :L], self.values[layer, :, :, :L]
        if self.k_scale is None:
            return K, V
        return (
            self.quant.dequantize(K, self.k_scale[layer, :, :, :L], self.dtype),
            self.quant.dequantize(V, self.v_scale[layer, :, :, :L], self.dtype),
        )

    def bytes_per_token(self) -> int:
        """Bytes of K and V one cached token takes over all layers and KV heads (codes + scales)."""
        return 2 * self.n_layers * self.n_kv * self.quant.bytes_per_vector(self.head_dim, self.dtype)

    def bytes_allocated(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.keys, self.values, self.k_scale, self.v_scale) if t is not None
        )

    def bytes_valid(self) -> int:
        return int((self.lens - self.start).sum()) * self.bytes_per_token()

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
            self.pos[:, bidx, :, self.lens] = new_positions.to(torch.int32)[:, None, None].expand(
                B, self.n_layers, self.n_kv
            )
        self._slot = self.lens.clone()
        self.lens += 1
        if self._uniform_len is not None:
            self._uniform_len += 1
        L = self.max_len
        ar = torch.arange(L, device=self.device)
        valid = (ar[None, :] >= self.start[:, None]) & (ar[None, :] < self.lens[:, None])
        self._valid_step = valid
        bias = torch.zeros(B, L, dtype=torch.float32, device=self.device).masked_fill_(~valid, float("-inf"))
        if self.selector is not None:
            self.selector.begin_step(self)
        return bias[:, None, None, :]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Write this step's k, v [B, Hkv, 1, D] and attend q [B, Hq, 1, D] over the cache.

        softmax(q Kᵀ/√d + bias) V computed per GQA group without expanding K/V."""
        B = q.shape[0]
        if self._uniform_len is not None:
            slot = self._uniform_len - 1
            self._write(layer, (slice(None), slice(None), slice(slot, slot + 1)), k, v)
        else:
            bidx = torch.arange(B, device=self.device)
            self._write(layer, (bidx, slice(None), self._slot), k[:, :, 0], v[:, :, 0])
        if self.selector is not None and self.selector.sparse(layer):  # reads the pages it chooses
            out = self.selector.attend(self, layer, q)
            self.record_query(layer, q)
            return out
        if self.k_scale is None:
            out, p = attention(q, self.keys[layer], self.values[layer], bias)
        else:
            out, p = attention(
                q, self.keys[layer], self.values[layer], bias, self.k_scale[layer], self.v_scale[layer], self.quant
            )
        if self.attn_acc is not None:
            self.attn_acc[layer, :, :, : bias.shape[-1]] += p.sum(dim=2)
        self.record_query(layer, q)
        return out

    def attended(self, layer: int) -> torch.Tensor:
        """Bool [B, Hkv, L] (L = :attr:`max_len`): the slots ``layer`` read at this step (after its
        attention): every valid slot, or the pages a selector chose."""
        if self.selector is not None:
            return self.selector.attended(self, layer)
        slot = torch.arange(self.max_len, device=self.device)
        valid = (slot[None, :] >= self.start[:, None]) & (slot[None, :] < self.lens[:, None])
        return valid[:, None, :].expand(self.batch, self.n_kv, self.max_len).clone()

    def _write(self, layer: int, index: tuple, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [..., D] at ``[layer][index]`` (``index`` over batch, head, slot), quantized
        (codes and scales) when the cache is."""
        if self.k_scale is None:
            self.keys[layer][index] = k
            self.values[layer][index] = v
            return
        for codes, scales, x in ((self.keys, self.k_scale, k), (self.values, self.v_scale, v)):
            c, s = self.quant.quantize(x)
            codes[layer][index] = c
            scales[layer][index] = s

    def write_slots(self) -> torch.Tensor:
        """[B] the slot each row writes this step (after :meth:`begin_step`)."""
        return self._slot

    def record_query(self, layer: int, q: torch.Tensor) -> None:
        """Keep this step's query [B, Hq, 1, D] in the observation-window ring (if one is kept)."""
        if self.q_ring is not None:
            self.q_ring[layer, :, :, self.q_head] = q[:, :, 0]

    def record_queries(self, q: torch.Tensor) -> None:
        """Every layer's query of this step at once, q [L, B, Hq, D] (one copy instead of L)."""
        if self.q_ring is not None:
            self.q_ring[:, :, :, self.q_head] = q

    def end_step(self) -> None:
        if self.q_ring is not None:
            self.q_head = (self.q_head + 1) % self.window
            self.q_count = min(self.q_count + 1, self.window)

    # --- compression ---------------------------------------------------------------------------
    def due(
        self, newline: torch.Tensor | None = None, remaining: int | None = None, seq_len: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bool [B]: sequences whose cache must be compressed now (the compressor's rule, skip rule
        included: ``remaining`` = tokens still to be written into the cache after this step;
        ``seq_len`` [B]: each sequence's length so far, for a schedule's budget)."""
        return self.compressor.due(self.region_len(), newline, remaining, seq_len)

    def _layer_chunks(self, n: int, L: int) -> list[slice]:
        """Slices of layers scored together: as many as keep the scoring temporaries of ``n``
        sequences of ``L`` slots under :attr:`SCORE_CHUNK_BYTES`."""
        per_layer = self.compressor.score_bytes(n, self.n_kv, self.n_heads, L, self.head_dim)
        step = max(1, min(self.n_layers, self.SCORE_CHUNK_BYTES // max(1, per_layer)))
        return [slice(a, min(a + step, self.n_layers)) for a in range(0, self.n_layers, step)]

    def _ordered_queries(self, layers: slice, rows: torch.Tensor | None) -> torch.Tensor | None:
        """The window's queries, oldest first, [layers * n, Hq, w', D] (layer-major), or None."""
        if self.q_ring is None:
            return None
        w = self.window
        q = self.q_ring[layers] if rows is None else self.q_ring[layers, rows]
        if self.q_head:  # the ring's oldest query is at q_head
            order = torch.tensor([(self.q_head + i) % w for i in range(w)], device=self.device)
            q = q.index_select(3, order)
        if self.q_count < w:
            q = q[:, :, :, w - self.q_count :]
        return q.flatten(0, 1)

    def compress(self, due: torch.Tensor, seq_len: torch.Tensor | None = None) -> None:
        """Compress every due sequence down to its budget (``budget_for(seq_len)``: a schedule's, else
        the fixed one), groups of equal cache length and budget at a time."""
        rows_all = due.nonzero().flatten()
        if rows_all.numel() == 0:
            return
        self._account()  # the peak is right before an eviction
        c = self.compressor
        if seq_len is None or c.schedule is None:  # one budget for every row
            if rows_all.numel() == self.batch and self._uniform_len is not None:
                self._compress_rows(None, self._uniform_len, c.budget)  # the common case: all rows, plain slices
            else:
                lens = self.lens[rows_all]
                for L in lens.unique().tolist():
                    self._compress_rows(rows_all[lens == L], int(L), c.budget)
        else:  # a schedule: each row's budget at its own length
            lens, keeps = self.lens[rows_all], c.budget_for(seq_len).to(self.device)[rows_all]
            for L, keep in torch.stack([lens, keeps], 1).unique(dim=0).tolist():
                self._compress_rows(rows_all[(lens == L) & (keeps == keep)], int(L), int(keep))
        self.n_compressions += 1
        u = self.lens.unique()
        self._uniform_len = int(u[0]) if u.numel() == 1 else None

    def _compress_rows(self, rows: torch.Tensor | None, L: int, keep: int) -> None:
        """Compress ``rows`` (None: all of them), all of length ``L``, to ``keep`` slots each, over every
        layer: the layers
        are folded into the batch of one :class:`ScoreInputs` per chunk of layers, and the kept
        slots are moved with one row copy (``index_select`` on the flattened buffer; ~8x faster on
        CPU than a ``gather`` with an index expanded over the head dim)."""
        c = self.compressor
        rs = self.region_start
        B, hkv, cap = self.batch, self.n_kv, self.capacity
        start = self.start if rows is None else self.start[rows]
        valid = torch.arange(L, device=self.device)[None, :] >= start[:, None]
        n = valid.shape[0]
        n_valid_region = valid[:, rs:].sum(-1)
        batch_rows = torch.arange(B, device=self.device) if rows is None else rows
        for layers in self._layer_chunks(n, L):
            nl = layers.stop - layers.start
            at = (layers, slice(None) if rows is None else rows, slice(None), slice(0, L))
            keys, pos = self.keys[at], self.pos[at]
            acc = self.attn_acc[at] if self.attn_acc is not None else None
            if self.k_scale is not None:  # scores see the keys attention sees
                keys = self.quant.dequantize(keys, self.k_scale[at], self.dtype)
            inp = ScoreInputs(
                keys=keys.flatten(0, 1),
                region=slice(rs, L),
                valid=valid.repeat(nl, 1),
                queries=self._ordered_queries(layers, rows),
                positions=pos.flatten(0, 1),
                attn_acc=acc.flatten(0, 1) if acc is not None else None,
            )
            idx = c.select(inp, keep) + rs  # [nl * n, Hkv, keep] kept slots
            # flat slot numbers in the buffers viewed as [layers * B * Hkv * capacity, ...]
            line = (
                (torch.arange(layers.start, layers.stop, device=self.device)[:, None] * B + batch_rows[None, :])[
                    :, :, None
                ]
                * hkv
                + torch.arange(hkv, device=self.device)
            ) * cap  # [nl, n, Hkv]
            src = (line.view(nl * n, hkv, 1) + idx).flatten()
            dst = (line[..., None] + torch.arange(rs, rs + keep, device=self.device)).flatten()
            for buf in (self.keys, self.values):
                flat = _raw(buf).view(-1, self.head_dim)
                flat.index_copy_(0, dst, flat.index_select(0, src))
            for buf in (self.pos, self.attn_acc, self.k_scale, self.v_scale):  # scales move with their codes
                if buf is not None:
                    flat = buf.view(-1)
                    flat.index_copy_(0, dst, flat.index_select(0, src))
            if self.attn_acc is not None:
                if rows is None:
                    self.attn_acc[layers, :, :, rs + keep :] = 0
                else:
                    self.attn_acc[layers, rows, :, rs + keep :] = 0
        if rows is None:
            self.lens[:] = rs + keep
        else:
            self.lens[rows] = rs + keep
        if rs == 0:  # the prompt was compressible: padding may have been kept at the front
            new_start = (keep - n_valid_region).clamp(min=0)
            if rows is None:
                self.start = new_start
            else:
                self.start[rows] = new_start

    def _compress_prefill(self, keys, values, pos, valid, queries, attn_acc) -> None:
        """Compress a compressible prompt that fills the buffer while it sits in the prefill
        tensors; only the kept slots are copied into the (budget-sized) buffers."""
        c = self.compressor
        B, P = valid.shape
        keep = int(c.budget_for(int(valid.sum(-1).max())))
        n_valid = valid.sum(-1)
        D = self.head_dim
        for layers in self._layer_chunks(B, P):
            K, V = torch.stack(keys[layers]), torch.stack(values[layers])  # [l, B, Hkv, P, D]
            nl = K.shape[0]
            scales = None
            if self.k_scale is not None:  # quantize first: scores see the keys attention will see
                (K, ks), (V, vs) = self.quant.quantize(K), self.quant.quantize(V)
                scales = ((self.k_scale, ks), (self.v_scale, vs))
            qs = None
            if queries is not None and c.needs_queries:
                qs = torch.stack([q[:, :, -c.window :] for q in queries[layers]]).flatten(0, 1)
            acc = torch.stack(attn_acc[layers]) if attn_acc is not None else None
            score_keys = K if scales is None else self.quant.dequantize(K, ks, self.dtype)
            inp = ScoreInputs(
                keys=score_keys.flatten(0, 1),
                region=slice(0, P),
                valid=valid.repeat(nl, 1),
                queries=qs,
                positions=pos.repeat(nl, 1, 1),
                attn_acc=acc.flatten(0, 1) if acc is not None else None,
            )
            idx = c.select(inp, keep)  # [nl * B, Hkv, keep]
            src = (idx + torch.arange(nl * B * self.n_kv, device=self.device).view(nl * B, self.n_kv, 1) * P).flatten()
            shape = (nl, B, self.n_kv, keep)
            self.keys[layers, :, :, :keep] = _raw(K).view(-1, D).index_select(0, src).view(*shape, D).view(K.dtype)
            self.values[layers, :, :, :keep] = _raw(V).view(-1, D).index_select(0, src).view(*shape, D).view(V.dtype)
            for buf, s in scales or ():
                buf[layers, :, :, :keep] = s.reshape(-1).index_select(0, src).view(shape)
            self.pos[layers, :, :, :keep] = inp.positions.reshape(-1).index_select(0, src).view(shape)
            if self.attn_acc is not None and acc is not None:
                self.attn_acc[layers, :, :, :keep] = acc.reshape(-1).index_select(0, src).view(shape)
        self.lens[:] = keep
        self.start = (keep - n_valid).clamp(min=0)
        self._uniform_len = keep
        self.n_compressions += 1

    # --- shrinking the batch -------------------------------------------------------------------
    def refill_rows(
        self,
        rows: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        valid: torch.Tensor,
        positions: torch.Tensor,
        queries: list[torch.Tensor] | None = None,
        attn_acc: list[torch.Tensor] | None = None,
    ) -> None:
        """Put new prompts into the finished ``rows`` [r] of a batch that keeps its shape (the static decode step,
        :mod:`.static_step`), in place: their prefill's keys / values per layer [r, Hkv, P, D] at slots 0..P-1 (P,
        the batch's prompt width: the prompts left-padded to it, ``valid`` [r, P]), their positions, the window's
        last queries in the ring's order and the attention each slot received (or 0). Every buffer keeps its
        storage (a captured graph reads it). Not for a compressible prompt (``compress_prompt``), whose prefill
        compresses as it is written."""
        P = valid.shape[1]
        if self.compressor.compress_prompt or P != self.region_start:
            raise ValueError("refill_rows: the prompts must be left-padded to the batch's width, kept whole")
        for layer in range(self.n_layers):
            self._write(layer, (rows, slice(None), slice(0, P)), keys[layer], values[layer])
        pos = positions.to(torch.int32)[:, None, :].expand(-1, self.n_kv, P)
        self.pos[:, rows, :, :P] = pos[None].expand(self.n_layers, -1, -1, -1)
        if self.attn_acc is not None:
            self.attn_acc[:, rows] = 0
            if attn_acc is not None:
                self.attn_acc[:, rows, :, :P] = torch.stack(attn_acc)
        if self.q_ring is not None:
            self.q_ring[:, rows] = 0
            if queries is not None:
                self._ring_latest(rows, queries)
        self.lens[rows] = P
        self.start[rows] = (~valid).sum(dim=1).to(self.start.dtype)
        self._uniform_len = None

    def rewrite_rows(
        self,
        rows: slice,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        offset: torch.Tensor,
        queries: list[torch.Tensor] | None = None,
    ) -> None:
        """The K/V of every slot of ``rows`` replaced by a forward's over the whole sequence (keys / values per
        layer [r, Hkv, L, D], the sequences left-padded by ``offset`` [r] columns, so position ``p`` sits at
        column ``offset + p``): each slot takes the column of the position it holds (``pos``), so the cache keeps
        the same tokens with their K/V recomputed (a partial rollout after a weight load,
        :meth:`~sparserl.rollout.engine.RolloutEngine.recompute_cache`). The window's queries become the forward's
        last ones (in the ring's order); the attention accumulated per slot (H2O's scores) is kept: like the
        choice of slots, it was made under the older weights. Call :meth:`restart_selector` after the last rows."""
        L, D = keys[0].shape[2], self.head_dim
        for layer in range(self.n_layers):
            column = (offset.to(self.device)[:, None, None] + self.pos[layer, rows].long()).clamp(0, L - 1)
            at = column[..., None].expand(-1, -1, -1, D)  # [r, Hkv, capacity, D]
            k, v = keys[layer].gather(2, at), values[layer].gather(2, at)
            self._write(layer, (rows, slice(None), slice(None)), k, v)
        if self.q_ring is not None and queries is not None:
            self.q_count = max(self.q_count, self._ring_latest(rows, queries))

    def _ring_latest(self, rows, queries: list[torch.Tensor]) -> int:
        """A forward's last queries per layer [r, Hq, w', D] into ``rows`` of the observation window's ring, as its
        latest (the ring's oldest query sits at ``q_head``); returns how many went in."""
        w = min(self.window, queries[0].shape[2])
        order = torch.tensor([(self.q_head - w + i) % self.window for i in range(w)], device=self.device)
        for layer in range(self.n_layers):
            ring = self.q_ring[layer, rows]
            ring[:, :, order] = queries[layer][:, :, -w:]
            self.q_ring[layer, rows] = ring
        return w

    def restart_selector(self) -> None:
        """After :meth:`rewrite_rows`: a method that selects per step starts its state again from the cached keys
        (block top-k's page key sums are rebuilt when it next reads pages)."""
        if self.selector is not None:
            self.selector = self.compressor.attention_selector(self)

    def append(self, other: CompressedKVCache) -> None:
        """Join ``other``'s sequences after this cache's (new, larger buffers; this cache may hold none): rows that
        start while these run (the eager engine's refill, :meth:`~.engine.RolloutEngine._batch_steps`). Both
        caches hold prompts of the same width and have the same compressor, capacity and layout. The window's
        queries of ``other`` are turned to this ring's order (its oldest at :attr:`q_head`); a per-step selector
        starts again from the joined keys; compressions and byte peaks carry over."""
        same = ("capacity", "region_start", "n_layers", "n_kv", "head_dim", "window", "dtype")
        if any(getattr(self, a) != getattr(other, a) for a in same) or self.quant.name != other.quant.name:
            raise ValueError(
                "append: the caches differ in " + ", ".join(a for a in same if getattr(self, a) != getattr(other, a))
            )
        self._account()
        other._account()
        join = lambda a, b: torch.cat([_raw(a), _raw(b)], 1).view(a.dtype)  # noqa: E731
        self.keys, self.values = join(self.keys, other.keys), join(self.values, other.values)
        if self.k_scale is not None:
            self.k_scale, self.v_scale = join(self.k_scale, other.k_scale), join(self.v_scale, other.v_scale)
        self.pos = join(self.pos, other.pos)
        if self.attn_acc is not None:
            self.attn_acc = join(self.attn_acc, other.attn_acc)
        if self.q_ring is not None:  # other's oldest query at its q_head, moved to ours
            self.q_ring = join(self.q_ring, other.q_ring.roll(self.q_head - other.q_head, dims=3))
            self.q_count = max(self.q_count, other.q_count)
        self.lens = torch.cat([self.lens, other.lens])
        self.start = torch.cat([self.start, other.start])
        u = self.lens.unique()
        self._uniform_len = int(u[0]) if u.numel() == 1 else None
        self.n_compressions += other.n_compressions
        self.bytes_peak = max(self.bytes_peak, other.bytes_peak)
        self.bytes_theory_peak = max(self.bytes_theory_peak, other.bytes_theory_peak)
        self.restart_selector()
        self._account()

    def grow(self, capacity: int) -> None:
        """Buffers of ``capacity`` slots (more than now; the new ones empty): rows whose compressor's budgets
        were raised since the cache began join it (:meth:`append` needs one capacity)."""
        extra = capacity - self.capacity
        if extra < 0:
            raise ValueError(f"grow: {capacity} slots is fewer than the cache's {self.capacity}")
        if extra == 0:
            return

        def wider(buf):
            raw = _raw(buf)
            pad = raw.new_zeros(*raw.shape[:3], extra, *raw.shape[4:])
            return torch.cat([raw, pad], 3).view(buf.dtype)

        self.keys, self.values, self.pos = wider(self.keys), wider(self.values), wider(self.pos)
        if self.k_scale is not None:
            self.k_scale, self.v_scale = wider(self.k_scale), wider(self.v_scale)
        if self.attn_acc is not None:
            self.attn_acc = wider(self.attn_acc)
        self.capacity = capacity
        self.restart_selector()
        self._account()

    def pad_front(self, n: int) -> None:
        """``n`` empty slots before every row's: the cache a prompt width ``n`` wider would have given (left padding
        ``n`` longer, the prompt's region with it), so that rows of wider prompts can join it (:meth:`append`)."""
        if n <= 0:
            return

        def wider(buf):
            raw = _raw(buf)
            return torch.cat([raw.new_zeros(*raw.shape[:3], n, *raw.shape[4:]), raw], 3).view(buf.dtype)

        self.keys, self.values, self.pos = wider(self.keys), wider(self.values), wider(self.pos)
        if self.k_scale is not None:
            self.k_scale, self.v_scale = wider(self.k_scale), wider(self.v_scale)
        if self.attn_acc is not None:
            self.attn_acc = wider(self.attn_acc)
        self.start, self.lens = self.start + n, self.lens + n
        if self._uniform_len is not None:
            self._uniform_len += n
        if not self.compressor.compress_prompt:
            self.region_start += n
        self.capacity += n
        self.restart_selector()
        self._account()

    def select(self, keep_rows: torch.Tensor) -> None:
        """Keep only these sequences (new, smaller buffers; the old ones are freed)."""
        self._account()
        self.keys = _raw(self.keys).index_select(1, keep_rows).view(self.keys.dtype)
        self.values = _raw(self.values).index_select(1, keep_rows).view(self.values.dtype)
        if self.k_scale is not None:
            self.k_scale = self.k_scale.index_select(1, keep_rows)
            self.v_scale = self.v_scale.index_select(1, keep_rows)
        self.pos = self.pos.index_select(1, keep_rows)
        if self.attn_acc is not None:
            self.attn_acc = self.attn_acc.index_select(1, keep_rows)
        if self.q_ring is not None:
            self.q_ring = self.q_ring.index_select(1, keep_rows)
        if self.selector is not None:
            self.selector.select(keep_rows)
        self.lens = self.lens.index_select(0, keep_rows)
        self.start = self.start.index_select(0, keep_rows)
        u = self.lens.unique()
        self._uniform_len = int(u[0]) if u.numel() == 1 else None


def _raw(buf: torch.Tensor) -> torch.Tensor:
    """The same bytes as uint8 for float8 buffers (CPU ``index_copy_`` has no float8 kernel)."""
    return buf.view(torch.uint8) if buf.dtype.is_floating_point and buf.element_size() == 1 else buf


def attention(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    bias: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    quant: KVQuantizer | None = None,
):
    """softmax(q Kᵀ/√d + bias) V over the first L = ``bias.shape[-1]`` slots, per GQA group without
    expanding K/V: q [B, Hq, 1, D], K/V [B, Hkv, capacity, D], bias [B, 1, 1, L] (float32) →
    (out [B, Hq * D], probabilities [B, Hkv, g, L] float32).

    Quantized K/V (codes, with ``k_scale`` / ``v_scale`` [B, Hkv, capacity] and their ``quant``): the
    per-token scales are applied after the products, q·(c_j s_j) = (q·c_j) s_j and Σ_j p_j s_j c_j,
    so only the codes are widened (to q's dtype) and no scaled copy of K or V is made.

    On CPU, float32 K/V and int8 / fp8 codes run the fused C kernel (:mod:`sparserl.rollout.native`: one
    pass over K and V, 1.6-2.5x faster than the two batched matmuls below); everything else, and
    every input it does not take, runs the torch code below (the same numbers within float
    reassociation, tested)."""
    if q.device.type == "cpu":
        fused = native.decode_attention(q, K, V, bias, k_scale, v_scale)  # None: not a shape it takes
        if fused is not None:
            return fused
    B, hq, _, D = q.shape
    hkv = K.shape[1]
    L = bias.shape[-1]
    Kl, Vl = K[:, :, :L], V[:, :, :L]
    qg = q.reshape(B, hkv, hq // hkv, D)
    if k_scale is None:
        s = torch.matmul(qg, Kl.transpose(-1, -2)) * (D**-0.5)  # [B, hkv, g, L]
        p = (s.float() + bias).softmax(dim=-1)
        out = torch.matmul(p.to(K.dtype), Vl)  # [B, hkv, g, D]
        return out.reshape(B, hq * D), p
    Kw, k_unit = quant.widen(Kl, q.dtype)
    s = torch.matmul(qg, Kw.transpose(-1, -2)).float() * (k_scale[:, :, None, :L] * (k_unit * D**-0.5))
    p = (s + bias).softmax(dim=-1)
    Vw, v_unit = quant.widen(Vl, q.dtype)
    out = torch.matmul((p * (v_scale[:, :, None, :L] * v_unit)).to(q.dtype), Vw)
    return out.reshape(B, hq * D), p
