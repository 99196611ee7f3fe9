"""A decode step with the same tensor shapes at every step and no read of a device value on the host: what a
CUDA graph needs (``torch.cuda.graph`` captures one step and replays it, one launch instead of ~1,200 small ones
from Python, ``docs/results/cuda/``).

The eager engine (:meth:`RolloutEngine._generate_batch`) attends over the longest row's slots (a length read on
the host each step), shrinks the batch when rows finish and reads ``done`` / ``due`` every step. Here, for one
batch of B rows and a cache of fixed ``capacity``:

- attention runs over every slot of the capacity with a mask built on the device from each row's ``start`` and
  ``lens`` (the torch path), or through the Triton kernel that reads those lengths itself
  (:func:`sparserl.rollout.gpu.decode_attention.decode_attention`, on CUDA);
- the step counter ``t``, each row's position, length and done flag are device tensors, updated in place; the
  sampling stream's draw reads ``t`` on the device (:func:`~sparserl.rollout.sampling.row_uniforms`);
- a finished row stays in the batch, masked: its token, length and cache no longer change (the slots it would
  write are its own, past its length); the host reads ``done`` every ``check_every`` steps only, and
  compression (its scoring and gather are host-driven) runs between steps at its fixed shape, when the
  compressor's ``due`` flags, read at the same time, say so.

The numbers are the eager engine's: the same sampler model functions, the same draws, the same compressions
(with ``check_every`` 1: a larger period compresses up to that many tokens later); attention over a masked
capacity instead of the longest row's slots (the masked slots add exp(−inf) = 0) sums in another order, so
log-probs agree to ~1e-7 and a token differs only where a draw falls that close to a CDF boundary (tested
against the eager engine for dense, every compressor that evicts, and block top-k, whose pages are chosen on the
device with k fixed). Not supported (refused): block top-k with a schedule (k changes with length), stop strings
(decoded on the host), the newline trigger, whole distributions, forced tokens (the replay); the eager step runs
those.
"""

from __future__ import annotations

import torch

from .cache import CompressedKVCache, attention
from .kv.none import Dense
from .output import KVStats, RolloutOutput
from .sampling import SamplingParams, row_uniforms, sample

__all__ = ["StaticDecodeStep", "generate_static", "static_unsupported"]


def static_unsupported(compressor, params: SamplingParams) -> str | None:
    """Why a batch cannot run on the static step (None: it can)."""
    if compressor.selects_per_step and compressor.schedule is not None:
        return f"compressor {compressor.name!r} with a schedule reads a number of pages that changes with length"
    if compressor.needs_newlines:
        return f"compressor {compressor.name!r} is due after a newline token, a per-step host decision"
    if params.stop:
        return "stop strings are matched on decoded text on the host"
    if params.keep_distributions or params.logprobs_topk:
        return "it keeps neither whole distributions nor top-k log-probs (only the head's inputs, keep_hidden)"
    return None


class StaticDecodeStep:
    """The decode loop's state for one batch as fixed-shape device tensors, and :meth:`step`, which advances it
    by one token in place. ``logits`` [B, V] float32 and ``x`` [B, H]: the prefill's last position's (the first
    token's distribution); ``cache``: the batch's :class:`CompressedKVCache` after prefill; ``row_ids`` [B]:
    each row's sampling stream; ``eos`` [E] long or None."""

    def __init__(
        self,
        model,
        cache: CompressedKVCache,
        logits: torch.Tensor,
        x: torch.Tensor,
        params: SamplingParams,
        row_ids: torch.Tensor,
        max_new: int,
        eos: torch.Tensor | None,
        use_triton: bool = False,
        keep_hidden: bool = False,
    ):
        dev = logits.device
        B = logits.shape[0]
        self.model, self.cache, self.params, self.max_new = model, cache, params, max_new
        self.row_ids = row_ids.to(dev)
        self.eos = eos
        self.use_triton = use_triton
        cache._uniform_len = None  # rows diverge from the first masked step: per-row slots
        self.logits = logits.float().clone()
        self.x = x.clone()
        self.steps = torch.zeros(B, dtype=torch.long, device=dev)  # each row's tokens so far (its stream's counter)
        self.positions = (cache.lens - cache.start).to(torch.long)  # a left-padded prompt's next position
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)
        self.lengths = torch.zeros(B, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(B, max_new, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros(B, max_new, dtype=torch.float32, device=dev)
        self.hidden = torch.zeros(B, max_new, x.shape[-1], dtype=x.dtype, device=dev) if keep_hidden else None
        self.rows = torch.arange(B, device=dev)
        self.slots = torch.arange(cache.capacity, device=dev)
        self.blocktopk = cache.selector is not None  # block top-k: chosen pages per step, sums kept here
        if self.blocktopk:
            method = cache.compressor
            self.first_sparse = min(method.dense_layers, cache.n_layers)
            self.k_pages = method.pages_for(cache.lens - cache.start).to(torch.long)  # fixed k: no schedule
            self.kmax = int(self.k_pages.max())  # read once, before the first step
            self.page_sums = page_key_sums(cache, self.first_sparse)
        # the next write of the queries' window ring, on the device (the cache's host-side count, q_head, is kept
        # by the driver calling cache.end_step() after each step: host arithmetic only)
        self.ring_slot = torch.full((), cache.q_head, dtype=torch.long, device=dev)

    def step(self) -> None:
        """One token for every running row, in place: draw from ``logits``, record it, then (for rows still
        running) write it into the cache and compute the next ``logits``. No host read of a device value."""
        m, c, p = self.model, self.cache, self.params
        tok, lp, _ = sample(self.logits, p, row_uniforms(p.seed, self.row_ids, self.steps))
        running = ~self.done
        col = self.steps.clamp(max=self.max_new - 1)[:, None]
        self.tokens.scatter_(1, col, torch.where(running, tok, self.tokens.gather(1, col)[:, 0])[:, None])
        self.logprobs.scatter_(1, col, torch.where(running, lp, self.logprobs.gather(1, col)[:, 0])[:, None])
        if self.hidden is not None:
            at = col[:, :, None].expand(-1, 1, self.x.shape[-1])
            kept = torch.where(running[:, None], self.x, self.hidden.gather(1, at)[:, 0])
            self.hidden.scatter_(1, at, kept[:, None].to(self.hidden.dtype))
        self.lengths.copy_(torch.where(running, self.steps + 1, self.lengths))
        ended = self.steps + 1 >= self.max_new
        if self.eos is not None:
            stop = torch.isin(tok, self.eos) & (self.steps + 1 >= p.min_new_tokens)
            ended = ended | stop
        self.steps.add_(running.long())
        self.done.copy_(self.done | ended)
        # the token enters the cache of the rows still running after it (a row's last token is not decoded, as in
        # the eager loop); a finished row writes its own next slot and attends as before, its results discarded
        # (its length and position no longer move)
        running = ~self.done
        slot = c.lens.clamp(max=c.capacity - 1)
        c.pos[:, self.rows, :, slot] = self.positions.to(torch.int32)[:, None, None].expand(-1, c.n_layers, c.n_kv)
        h = torch.nn.functional.embedding(tok, m.embed)[:, None, :]
        cos, sin = m.rope(self.positions[:, None])
        after = c.lens + running.long()  # each row's length once its token is written
        end = torch.maximum(after, slot + 1)  # a finished row attends over its own slots, its result discarded
        valid = (self.slots[None, :] >= c.start[:, None]) & (self.slots[None, :] < end[:, None])
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device).masked_fill_(~valid, float("-inf"))
        bias = bias[:, None, None, :]
        for layer, lw in enumerate(m.layers):
            q, k, v = m.qkv(lw, h, cos, sin)  # [B, H, 1, D]
            c._write(layer, (self.rows, slice(None), slot), k[:, :, 0], v[:, :, 0])
            if self.blocktopk and layer >= self.first_sparse:
                a = self._attend_pages(layer, q, slot, end)
            else:
                a = self._attend(layer, q, bias, slot)
            if c.q_ring is not None:
                c.q_ring[layer].index_copy_(2, self.ring_slot[None], q)
            m.linear(a[:, None, :], lw.o, add_to=h)
            m.linear(m.mlp_act(lw, h), lw.down, add_to=h)
        x = m.final_norm(h[:, 0])
        self.x.copy_(x)
        self.logits.copy_(m.head(x).float())
        c.lens.copy_(after)
        self.positions.add_(running.long())
        if c.q_ring is not None:
            self.ring_slot.copy_((self.ring_slot + 1) % c.window)

    def refill(
        self, rows: torch.Tensor, logits: torch.Tensor, x: torch.Tensor, row_ids: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Start new responses in the finished ``rows`` (their cache already refilled:
        :meth:`CompressedKVCache.refill_rows`): the prefill's last ``logits`` / ``x``, their sampling streams
        ``row_ids`` and next ``positions``; every buffer written in place."""
        self.logits[rows] = logits.float()
        self.x[rows] = x.to(self.x.dtype)
        self.row_ids[rows] = row_ids.to(self.row_ids.dtype)
        self.positions[rows] = positions.to(self.positions.dtype)
        for buf in (self.steps, self.lengths, self.tokens, self.logprobs, self.hidden):
            if buf is not None:
                buf[rows] = 0
        self.done[rows] = False
        if self.blocktopk:  # the new prompts' page sums (the other rows' are rebuilt to the same values)
            self.page_sums.copy_(page_key_sums(self.cache, self.first_sparse))

    def _attend_pages(self, layer: int, q: torch.Tensor, slot: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """Block top-k in one sparse layer (Sparrow's Vortex rule, :mod:`sparserl.rollout.kv.blocktopk`): the new
        key added to its page's sum, page scores, the k pages chosen (k fixed, known on the host), attention
        over them; every shape fixed, nothing read back."""
        from .kv.blocktopk import PAGE_TOKENS, choose_pages, page_scores
        from .page_attention import gathered_attention

        c = self.cache
        i = layer - self.first_sparse
        key = c.keys[layer][self.rows, :, slot]  # [B, Hkv, D], as written (dequantized below)
        if c.k_scale is not None:
            key = c.quant.dequantize(key, c.k_scale[layer][self.rows, :, slot], c.dtype)
        rel = slot - c.start
        page, first = rel // PAGE_TOKENS, (rel % PAGE_TOKENS == 0)[:, None, None]
        sums = self.page_sums[i]
        sums[self.rows, :, page] = torch.where(first, key.float(), sums[self.rows, :, page] + key.float())
        n_tokens = end - c.start
        pages = choose_pages(page_scores(q, sums, n_tokens), n_tokens, self.k_pages, kmax=self.kmax)
        if self.use_triton:
            from .gpu.decode_attention import decode_attention

            ks = c.k_scale[layer] if c.k_scale is not None else None
            vs = c.v_scale[layer] if c.v_scale is not None else None
            unit = (c.quant.widen(c.keys[layer][:1, :1, :1], q.dtype)[1],) * 2 if ks is not None else (1.0, 1.0)
            out, _ = decode_attention(
                q[:, :, 0], c.keys[layer], c.values[layer], c.start.to(torch.int32), end.to(torch.int32),
                pages=pages.to(torch.int32), page=PAGE_TOKENS, k_scale=ks, v_scale=vs, unit=unit,
                dot_f32=q.dtype == torch.float32,
            )  # fmt: skip
            return out.reshape(q.shape[0], -1)
        ks, vs = (c.k_scale[layer], c.v_scale[layer]) if c.k_scale is not None else (None, None)
        return gathered_attention(q, c.keys[layer], c.values[layer], pages, c.start, end, PAGE_TOKENS, ks, vs, c.quant)

    def _attend(self, layer: int, q: torch.Tensor, bias: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """This step's attention of one layer over the whole capacity, masked (torch), or through the Triton
        kernel (lengths read on the device); H2O's accumulated attention added for the valid slots."""
        c = self.cache
        if self.use_triton and c.attn_acc is None:
            from .gpu.decode_attention import decode_attention

            B, hq = q.shape[:2]
            lens = torch.maximum(c.lens + (~self.done).long(), slot + 1).to(torch.int32)  # as the mask's end
            ks = c.k_scale[layer] if c.k_scale is not None else None
            vs = c.v_scale[layer] if c.v_scale is not None else None
            unit = (1.0, 1.0)
            if ks is not None:
                unit = (c.quant.widen(c.keys[layer][:1, :1, :1], q.dtype)[1],) * 2
            out, _ = decode_attention(
                q[:, :, 0], c.keys[layer], c.values[layer], c.start.to(torch.int32), lens, k_scale=ks, v_scale=vs,
                unit=unit, dot_f32=q.dtype == torch.float32,  # a float32 sampler: IEEE products, not TF32
            )  # fmt: skip
            return out.reshape(B, hq * q.shape[-1])
        if c.k_scale is None:
            out, p = attention(q, c.keys[layer], c.values[layer], bias)
        else:
            out, p = attention(q, c.keys[layer], c.values[layer], bias, c.k_scale[layer], c.v_scale[layer], c.quant)
        if c.attn_acc is not None:
            c.attn_acc[layer] += p.sum(dim=2)
        return out


def page_key_sums(cache: CompressedKVCache, first_sparse: int) -> torch.Tensor:
    """Block top-k's page key sums of every layer from ``first_sparse`` on over each row's cached tokens
    [start, lens): [layers, B, Hkv, ⌈capacity / 16⌉, D] float32 (pages counted from each row's first token)."""
    from .kv.blocktopk import PAGE_TOKENS

    B, C = cache.batch, cache.capacity
    slot = torch.arange(C, device=cache.device)
    rel = slot[None, :] - cache.start[:, None]
    valid = (rel >= 0) & (slot[None, :] < cache.lens[:, None])
    page = torch.where(valid, rel // PAGE_TOKENS, 0)
    n_sparse = cache.n_layers - first_sparse
    sums = torch.zeros(
        n_sparse, B, cache.n_kv, -(-C // PAGE_TOKENS), cache.head_dim, dtype=torch.float32, device=cache.device
    )
    index = page[:, None, :, None].expand(B, cache.n_kv, C, cache.head_dim)
    for i in range(n_sparse):
        keys = cache.dequantized(first_sparse + i, C)[0].float() * valid[:, None, :, None]
        sums[i].scatter_add_(2, index, keys)
    return sums


#: the cache's tensors the step reads or writes: a captured graph holds their storage, so a compression that
#: rebinds one (``start`` after an eviction) has it copied back into the captured tensor (:func:`_pin`)
CACHE_BUFFERS = ("keys", "values", "k_scale", "v_scale", "pos", "attn_acc", "q_ring", "lens", "start")


def _pin(cache: CompressedKVCache, pinned: dict[str, torch.Tensor]) -> None:
    """Put back the captured tensors of ``cache`` that a compression rebound, with the new values copied in."""
    for name, tensor in pinned.items():
        now = getattr(cache, name)
        if now is not tensor:
            tensor.copy_(now)
            setattr(cache, name, tensor)


def warm_step(state: StaticDecodeStep) -> None:
    """One real step on a side stream: the warm-up ``torch.cuda.graph`` asks for before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        state.step()
    torch.cuda.current_stream().wait_stream(stream)


def captured_step(state: StaticDecodeStep):
    """``state.step`` captured as a CUDA graph (recorded, not run: call it after :data:`WARM_STEPS` warm
    steps); returns the function that replays it. Only on CUDA."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        state.step()
    return graph.replay


#: real steps run eagerly on a side stream before the capture
WARM_STEPS = 2


@torch.inference_mode()
def generate_static(
    engine, prompts: list[list[int]], p: SamplingParams, row_ids: torch.Tensor, slots: int | None = None
):
    """Every response of a rollout (``prompts``: one token list per response, ``row_ids`` their sampling streams) on
    :class:`StaticDecodeStep`, ``slots`` rows at a time (None: all at once): the eager engine's prefill and cache,
    then a fixed-shape step per token. The host reads the done flags (and a compressing cache's due flags) every
    ``engine.static_check_every`` steps; then it compresses the due rows and puts the next waiting responses into
    the finished rows (their prompts prefilled and written into the rows' cache slots), so the batch stays full
    while GRPO's long tail runs. On CUDA the step is replayed as a captured graph (``engine.static_graph``).
    Returns the eager path's :class:`RolloutOutput` (responses in the order given)."""
    import time

    m, c, dev = engine.model, engine.compressor, engine.device
    why = static_unsupported(c, p)
    if why is not None:
        raise ValueError(f"the static decode step cannot run this batch: {why}")
    every = max(1, int(engine.static_check_every))
    n = len(prompts)
    B = n if (slots is None or c.compress_prompt) else max(1, min(slots, n))  # a compressed prompt: no refill
    row_ids = row_ids.to(dev)
    P = max(len(x) for x in prompts)  # every prompt left-padded to the longest: a refill fits any row
    max_new = min(p.max_new_tokens, m.max_positions - P)
    want_q = c.window if c.needs_queries else 0
    want_attn = c.needs_attention and c.compress_prompt
    t0 = time.perf_counter()

    def prefill(indices: list[int]):
        ids, valid, positions = engine.left_padded([prompts[i] for i in indices], width=P)
        return (valid, positions, *engine._prefill_distinct(ids, valid, positions, want_q, want_attn))

    valid, positions, logits, keys, values, queries, acc, x = prefill(list(range(B)))
    # a compressing cache is checked every `every` steps: room for the tokens written before its due flags are read
    capacity = c.capacity(P, max_new) + (every - 1 if c.compresses else 0)
    cache = CompressedKVCache(
        keys, values, valid, positions, capacity, c, m.n_heads, queries, acc, kv_quant=engine.kv_quant
    )
    del keys, values, queries, acc
    prefill_s = time.perf_counter() - t0
    eos = (
        torch.tensor(sorted(engine.eos_ids), dtype=torch.long, device=dev)
        if (engine.eos_ids and not p.ignore_eos)
        else None
    )
    use_triton = dev.type == "cuda" and engine.static_triton
    state = StaticDecodeStep(m, cache, logits, x, p, row_ids[:B], max_new, eos, use_triton, p.keep_hidden)
    pinned = {name: getattr(cache, name) for name in CACHE_BUFFERS if getattr(cache, name) is not None}
    response_of_row = list(range(B))  # which response each row holds (host bookkeeping)
    waiting = list(range(B, n))
    results: dict[int, tuple] = {}
    dense_tokens_peak = 0

    def harvest(rows: list[int]) -> None:
        """Copy the finished ``rows``' responses out (one host read for them all)."""
        if not rows:
            return
        index = torch.tensor(rows, device=dev)
        lens = state.lengths[index].tolist()
        toks, lps = state.tokens[index].cpu(), state.logprobs[index].cpu()
        hidden = state.hidden[index] if state.hidden is not None else None
        kept = cache.kept_tokens()[index].tolist()
        for k, b in enumerate(rows):
            last = int(toks[k, lens[k] - 1]) if lens[k] else -1
            stop = eos is not None and last in engine.eos_ids and lens[k] >= p.min_new_tokens
            results[response_of_row[b]] = (
                toks[k, : lens[k]].tolist(),
                lps[k, : lens[k]].tolist(),
                "stop" if stop else "length",
                kept[k],
                hidden[k, : lens[k]] if hidden is not None else None,
            )

    graph = dev.type == "cuda" and engine.static_graph and max_new > WARM_STEPS + 1
    step = state.step
    t = 0
    while True:
        if graph and t < WARM_STEPS:
            warm_step(state)
        else:
            if graph and t == WARM_STEPS:
                step = captured_step(state)
            step()
        t += 1
        cache.end_step()  # the queries' ring position, host arithmetic
        if t % every:
            continue
        done = state.done.tolist()  # the host reads: every `every` steps
        dense_tokens_peak = max(dense_tokens_peak, int((state.positions * ~state.done).sum()))
        finished = [b for b in range(B) if done[b] and response_of_row[b] is not None]
        harvest(finished)
        for b in finished:
            response_of_row[b] = None
        if waiting and finished:  # refill: the next responses start in the finished rows
            take = finished[: len(waiting)]
            new, waiting = waiting[: len(take)], waiting[len(take) :]
            valid, positions, logits, keys, values, queries, acc, x = prefill(new)
            rows = torch.tensor(take, device=dev)
            cache.refill_rows(rows, keys, values, valid, positions, queries, acc)
            state.refill(rows, logits, x, row_ids[torch.tensor(new, device=dev)], valid.sum(-1))
            for b, r in zip(take, new):
                response_of_row[b] = r
        if all(r is None for r in response_of_row):
            break
        if c.compresses:
            remaining = max_new - 1 - state.steps  # tokens a row may still write (the eager skip rule's count)
            due = cache.due(None, seq_len=state.positions) & ~state.done & (remaining > c.tail_slack)
            if bool(due.any()):
                cache._uniform_len = None  # the static step writes per row and never updates it: lengths read here
                cache.compress(due, seq_len=state.positions)
                _pin(cache, pinned)  # a captured graph keeps reading the tensors it recorded
    cache._account()
    seconds = time.perf_counter() - t0
    order = [results[i] for i in range(n)]
    lens = [len(r[0]) for r in order]
    return RolloutOutput(
        prompt_index=[],
        prompt_ids=[],
        response_ids=[r[0] for r in order],
        sampler_logprobs=[r[1] for r in order],
        finish_reason=[r[2] for r in order],
        kv_tokens_kept=[r[3] for r in order],
        kv=KVStats(
            cache.bytes_peak,
            cache.bytes_theory_peak,
            dense_tokens_peak * m.kv_bytes_per_token(),
            cache.n_compressions,
            B * Dense().capacity(P, max_new) * m.kv_bytes_per_token(),
        ),
        tokens_generated=sum(lens),
        seconds=seconds,
        prefill_seconds=prefill_s,
        hidden=[r[4] for r in order] if p.keep_hidden else None,
    )
