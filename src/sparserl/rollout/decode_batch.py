"""The eager engine's batch of live rows: the state of :meth:`~.engine.RolloutEngine._batch_steps` between two
decode steps, as an object that rows can join and leave while it runs.

Each row is one response: its prompt (left-padded to the batch's prompt width, so any row fits any place), its
random stream and seed (a row's draws depend on those and its own token index only,
:func:`~.sampling.row_uniforms`, so which rows share a step changes no token, up to the order of a BLAS's sums),
and its output buffers. At most ``slots`` rows decode at once; the others wait, in the order added, and each takes
the place of a row that ends (continuous batching: its prompt prefilled, its cache joined to the batch's,
:meth:`~.cache.CompressedKVCache.append`). Rows are added in blocks under a key (:meth:`add`), and a block whose
rows have all ended leaves with its output (:meth:`take`): one rollout in :meth:`~.engine.RolloutEngine.generate`,
or the rollouts in flight on a rollout worker sharing one batch (:mod:`.stream`), where the next rollouts' rows
take the places that the tail of the current one frees.

Every row shares the batch's sampling (temperature, top-p/k, stop strings, ``max_new_tokens``, what is kept) and
compressor; rows differ in prompt, stream and seed.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .cache import CompressedKVCache
from .kv.none import Dense
from .output import KVStats, RolloutOutput
from .sampling import SamplingParams, row_uniforms, sample

DENSE = Dense()  # the dense engine's buffer rule, for KVStats.bytes_dense_alloc


def same_sampling(a: SamplingParams, b: SamplingParams) -> bool:
    """Whether rows sampled with ``a`` and ``b`` can share a batch: the same params but the seed and ``n``."""
    return dataclasses.replace(a, seed=0, n=1) == dataclasses.replace(b, seed=0, n=1)


class DecodeBatch:
    """Rows decoded together on ``engine`` with sampling ``p`` (its seed is each block's own, :meth:`add`), prompts
    left-padded to ``width`` tokens, at most ``slots`` rows at once (None: every row added)."""

    def __init__(self, engine, p: SamplingParams, width: int, slots: int | None = None):
        m, c, dev = engine.model, engine.compressor, engine.device
        if engine.compile and c.selects_per_step:  # the compiled layer step attends over every slot
            raise ValueError(
                f"compile={engine.compile!r} with compressor {c.name!r}: the compiled decode step reads "
                "the whole cache and cannot choose pages per step; use compile=False"
            )
        self.engine, self.p, self.dev = engine, p, dev
        self.P = int(width)
        if self.P >= m.max_positions:
            raise ValueError(f"prompt width {self.P} is not shorter than the model's context ({m.max_positions})")
        self.max_new = min(p.max_new_tokens, m.max_positions - self.P)
        self.slots = None if slots is None else max(1, int(slots))
        self.numbered = engine.weights_version is not None
        self.t0 = time.perf_counter()
        self.prefill_s = 0.0
        self.steps = 0  # decode steps run
        self.max_live = 0  # the most rows decoded at once
        self.dense_tokens_peak = 0
        self.blocks: dict = {}  # key -> rows added under it, in the order added (contiguous)
        pad = engine.tokenizer.pad_token_id or 0
        self._pad = pad
        # every row added and not yet taken: prompt, stream, seed, outputs
        P, T = self.P, self.max_new
        self.ids = torch.zeros(0, P, dtype=torch.long, device=dev)
        self.valid = torch.zeros(0, P, dtype=torch.bool, device=dev)
        self.positions = torch.zeros(0, P, dtype=torch.long, device=dev)
        self.prompt_len = torch.zeros(0, dtype=torch.long, device=dev)
        self.streams = torch.zeros(0, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(0, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(0, T, dtype=torch.long, device=dev)
        self.logp = torch.zeros(0, T, dtype=torch.float32, device=dev)
        k = p.logprobs_topk
        self.top_v = torch.zeros(0, T, k, device=dev) if k else None
        self.top_i = torch.zeros(0, T, k, dtype=torch.long, device=dev) if k else None
        self.dists = torch.empty(0, T, m.embed.shape[0], device=dev) if p.keep_distributions else None
        self.kept_h = torch.empty(0, T, m.hidden, dtype=m.dtype, device=dev) if p.keep_hidden else None
        self.versions = torch.zeros(0, T, dtype=torch.long, device=dev) if self.numbered else None
        self.lengths = torch.zeros(0, dtype=torch.long, device=dev)
        self.forced = None  # [N, T] tokens to replay and where each row ends (rows added with ``forced``)
        self.forced_len = None
        self.finish: list[str] = []
        self.kept: list[int] = []
        self.ended: list[bool] = []
        self.busy_s = torch.zeros(0, dtype=torch.float64)  # each row's share of the steps' time (host)
        # the live rows: index of each (into the per-row tensors), their cache, next logits and head inputs
        self.active = torch.zeros(0, dtype=torch.long, device=dev)
        self.cache: CompressedKVCache | None = None
        self.logits = self.x = None
        self.true_len = torch.zeros(0, dtype=torch.long, device=dev)  # next position of each live row
        self.at = torch.zeros(0, dtype=torch.long, device=dev)  # each live row's token index
        self.logits_version = torch.zeros(0, dtype=torch.long, device=dev)  # the push that computed `logits`
        self.waiting: list[int] = []  # rows not started yet, in order
        self.eos = (
            torch.tensor(sorted(engine.eos_ids), dtype=torch.long, device=dev)
            if (engine.eos_ids and not p.ignore_eos)
            else None
        )
        self.newline = engine.newline_ids() if c.needs_newlines else None
        tok = engine.tokenizer
        self.stop_tail = max((len(tok(s, add_special_tokens=False)["input_ids"]) for s in p.stop), default=0) + 2

    # --- rows in and out -------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """Rows decoding or waiting."""
        return len(self.active) > 0 or bool(self.waiting)

    def add(self, key, prompts: list[list[int]], streams: torch.Tensor, seed: int, forced=None) -> None:
        """Rows for ``prompts`` (token ids, one per row) under ``key``, drawing from ``streams`` [R] (int64) with
        ``seed``; they wait for a place. ``forced`` (one token list per row): each row's tokens are these instead of
        draws (:meth:`~.engine.RolloutEngine.generate`)."""
        if key in self.blocks:
            raise ValueError(f"rows under {key!r} are in the batch already")
        self.widen(max(len(x) for x in prompts))
        dev, R, T = self.dev, len(prompts), self.max_new
        first = len(self.ended)
        ids, valid, positions = self.engine.left_padded(prompts, self.P)
        cat = lambda a, b: b if a.shape[0] == 0 else torch.cat([a, b])  # noqa: E731  (the first block: no copy)
        self.ids, self.valid = cat(self.ids, ids), cat(self.valid, valid)
        self.positions = cat(self.positions, positions)
        self.prompt_len = cat(self.prompt_len, valid.sum(-1))
        self.streams = cat(self.streams, streams.to(dev, torch.long))
        self.seeds = cat(self.seeds, torch.full((R,), int(seed), dtype=torch.long, device=dev))
        self.tokens = cat(self.tokens, torch.zeros(R, T, dtype=torch.long, device=dev))
        self.logp = cat(self.logp, torch.zeros(R, T, dtype=torch.float32, device=dev))
        if self.top_v is not None:
            self.top_v = cat(self.top_v, self.top_v.new_zeros(R, *self.top_v.shape[1:]))
            self.top_i = cat(self.top_i, self.top_i.new_zeros(R, *self.top_i.shape[1:]))
        if self.dists is not None:
            self.dists = cat(self.dists, self.dists.new_empty(R, *self.dists.shape[1:]))
        if self.kept_h is not None:
            self.kept_h = cat(self.kept_h, self.kept_h.new_empty(R, *self.kept_h.shape[1:]))
        if self.versions is not None:
            self.versions = cat(self.versions, self.versions.new_zeros(R, T))
        self.lengths = cat(self.lengths, torch.zeros(R, dtype=torch.long, device=dev))
        if forced is not None or self.forced is not None:
            if first and self.forced is None or forced is None:
                raise ValueError("forced rows and sampled rows cannot share a batch")
            f_len = torch.tensor([min(len(f), T) for f in forced], device=dev)
            f_ids = torch.zeros(R, T, dtype=torch.long)
            for b, f in enumerate(forced):
                f_ids[b, : f_len[b]] = torch.tensor(f[:T])
            self.forced = f_ids.to(dev) if self.forced is None else cat(self.forced, f_ids.to(dev))
            self.forced_len = f_len if self.forced_len is None else cat(self.forced_len, f_len)
        self.finish += ["length"] * R
        self.kept += [0] * R
        self.ended += [False] * R
        self.busy_s = cat(self.busy_s, torch.zeros(R, dtype=torch.float64))
        self.blocks[key] = R
        self.waiting += range(first, first + R)
        self.fill()

    def widen(self, width: int) -> None:
        """The prompt width raised to ``width`` (no change if not wider): every row's padding, and the cache's
        (:meth:`~.cache.CompressedKVCache.pad_front`), ``width - P`` slots longer, as if the batch had begun with
        the wider prompts; their responses keep ``max_new_tokens``."""
        n = int(width) - self.P
        if n <= 0:
            return
        limit = self.engine.model.max_positions
        if width + self.max_new > limit:
            raise ValueError(
                f"a prompt of {width} tokens leaves no room for {self.max_new} new tokens in the model's context "
                f"({limit})"
            )
        pad = lambda t, value: torch.cat([t.new_full((t.shape[0], n), value), t], 1)  # noqa: E731
        self.ids, self.valid, self.positions = pad(self.ids, self._pad), pad(self.valid, False), pad(self.positions, 0)
        self.P = int(width)
        if self.cache is not None:
            self.cache.pad_front(n)

    def rows_of(self, key) -> range:
        """The rows added under ``key`` (their indices into the per-row tensors now)."""
        start = 0
        for k, n in self.blocks.items():
            if k == key:
                return range(start, start + n)
            start += n
        raise KeyError(key)

    def done(self, key) -> bool:
        """Every row of ``key`` has ended."""
        return all(self.ended[r] for r in self.rows_of(key))

    def take(self, key) -> RolloutOutput:
        """The output of ``key``'s rows, which have all ended (in the order added; ``prompt_index``, ``prompt_ids``
        and ``texts`` are the caller's to set), and the rows out of the batch. ``seconds``: the rows' share of the
        decode steps' time (each step's time split evenly over the rows it ran); KV figures: the batch's."""
        rows = self.rows_of(key)
        if not all(self.ended[r] for r in rows):
            raise RuntimeError(f"rows of {key!r} are still running")
        sl = slice(rows.start, rows.stop)
        lens = self.lengths[sl].tolist()
        tokens, logp = self.tokens[sl].cpu(), self.logp[sl].cpu()
        top_v = self.top_v[sl].cpu() if self.top_v is not None else None
        top_i = self.top_i[sl].cpu() if self.top_i is not None else None
        versions = self.versions[sl].cpu() if self.versions is not None else None
        dists, kept_h = self.dists, self.kept_h
        B = len(rows)
        cache = self.cache
        if cache is not None:
            cache._account()
        m = self.engine.model
        out = RolloutOutput(
            prompt_index=[],
            prompt_ids=[],
            response_ids=[tokens[b, : lens[b]].tolist() for b in range(B)],
            sampler_logprobs=[logp[b, : lens[b]].tolist() for b in range(B)],
            finish_reason=self.finish[sl],
            kv_tokens_kept=self.kept[sl],
            kv=KVStats(
                cache.bytes_peak if cache is not None else 0,
                cache.bytes_theory_peak if cache is not None else 0,
                self.dense_tokens_peak * m.kv_bytes_per_token(),
                cache.n_compressions if cache is not None else 0,
                self.max_live * DENSE.capacity(self.P, self.max_new) * m.kv_bytes_per_token(),
            ),
            tokens_generated=sum(lens),
            seconds=float(self.busy_s[sl].sum()),
            prefill_seconds=self.prefill_s,
            top_logprobs=[top_v[b, : lens[b]] for b in range(B)] if top_v is not None else None,
            top_indices=[top_i[b, : lens[b]] for b in range(B)] if top_i is not None else None,
            distributions=[dists[rows.start + b, : lens[b]] for b in range(B)] if dists is not None else None,
            hidden=[kept_h[rows.start + b, : lens[b]] for b in range(B)] if kept_h is not None else None,
            token_versions=[versions[b, : lens[b]].tolist() for b in range(B)] if versions is not None else None,
        )
        self._drop(rows)  # the rows out (the output's views keep the buffers they read)
        del self.blocks[key]
        return out

    def _drop(self, rows: range) -> None:
        """The ended ``rows`` (contiguous) out of the per-row tensors; the indices after them move down."""
        keep = torch.ones(len(self.ended), dtype=torch.bool)
        keep[rows.start : rows.stop] = False
        idx = keep.nonzero().flatten().to(self.dev)
        for name in ("ids", "valid", "positions", "prompt_len", "streams", "seeds", "tokens", "logp", "lengths"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        for name in ("top_v", "top_i", "dists", "kept_h", "versions", "forced", "forced_len"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).index_select(0, idx))
        self.busy_s = self.busy_s[keep]
        for name in ("finish", "kept", "ended"):
            values = getattr(self, name)
            setattr(self, name, values[: rows.start] + values[rows.stop :])
        n = len(rows)
        self.active = torch.where(self.active >= rows.stop, self.active - n, self.active)
        self.waiting = [r - n if r >= rows.stop else r for r in self.waiting]

    # --- decoding --------------------------------------------------------------------------------
    def fill(self) -> None:
        """The waiting rows into the free places (all of them without ``slots``): their prompts prefilled, their
        cache joined to the batch's, their first logits beside the live rows'."""
        free = len(self.waiting) if self.slots is None else self.slots - len(self.active)
        if not self.waiting or free <= 0:
            return
        engine, c, m = self.engine, self.engine.compressor, self.engine.model
        t0 = time.perf_counter()
        new = torch.tensor(self.waiting[:free], device=self.dev)
        self.waiting = self.waiting[len(new) :]
        want_q = c.window if c.needs_queries else 0
        want_attn = c.needs_attention and c.compress_prompt
        logits, keys, values, queries, acc, x = engine._prefill_distinct(
            self.ids[new], self.valid[new], self.positions[new], want_q, want_attn
        )
        capacity = c.capacity(self.P, self.max_new)
        if self.cache is not None and self.cache.capacity > capacity:  # budgets lowered since: the larger buffer
            capacity = self.cache.capacity
        cache = CompressedKVCache(
            keys, values, self.valid[new], self.positions[new], capacity, c, m.n_heads, queries, acc,
            kv_quant=engine.kv_quant,
        )  # fmt: skip
        del keys, values, queries, acc
        live = len(self.active)
        if self.cache is None:
            self.cache = cache
        else:
            if cache.capacity > self.cache.capacity:  # budgets raised since the batch began
                self.cache.grow(cache.capacity)
            self.cache.append(cache)
        del cache
        self.logits = torch.cat([self.logits[:live], logits]) if live else logits
        self.x = torch.cat([self.x[:live], x]) if live else x
        self.active = torch.cat([self.active, new])
        self.true_len = torch.cat([self.true_len, self.prompt_len[new]])
        self.at = torch.cat([self.at, torch.zeros_like(new)])
        version = engine.weights_version if self.numbered else 0
        self.logits_version = torch.cat([self.logits_version, torch.full_like(new, version or 0)])
        self.max_live = max(self.max_live, len(self.active))
        seconds = time.perf_counter() - t0
        self.prefill_s += seconds
        self.busy_s[new.cpu()] += seconds / len(new)

    def step(self) -> None:
        """One decode step: each live row draws its next token from its logits; rows that end (EOS, a stop string,
        their length) leave, the others' tokens enter the cache (compressed where due) and give their next logits,
        and waiting rows take the places freed."""
        engine, p, c, dev = self.engine, self.p, self.engine.compressor, self.dev
        t0 = time.perf_counter()
        active, at, max_new, t = self.active, self.at, self.max_new, self.steps
        ran = active.cpu()  # the rows this step's time is split over
        tok, lp, full = sample(self.logits, p, row_uniforms(self.seeds[active], self.streams[active], at))
        if self.forced is not None:
            tok = self.forced[active, at]
            lp = full.gather(-1, tok[:, None])[:, 0].float()
        if engine.step_hook is not None:  # the distribution each row's token was drawn from
            engine.step_hook("sample", t=t, cache=self.cache, rows=active, logprobs=full)
        self.tokens[active, at] = tok
        self.logp[active, at] = lp
        if self.top_v is not None:
            tv, ti = torch.topk(full, p.logprobs_topk, dim=-1)
            self.top_v[active, at], self.top_i[active, at] = tv, ti
        if self.dists is not None:
            self.dists[active, at] = full
        if self.kept_h is not None:  # the head's input these logits came from
            self.kept_h[active, at] = self.x
        if self.versions is not None:  # the push whose weights drew each row's token
            self.versions[active, at] = self.logits_version
        self.lengths[active] = at + 1
        done = torch.zeros(len(active), dtype=torch.bool, device=dev)
        if self.eos is not None:
            done |= torch.isin(tok, self.eos)
        if p.stop:
            ends = (at + 1).tolist()
            for r in range(len(active)):
                if done[r]:
                    continue
                row = int(active[r])
                tail = engine.tokenizer.decode(self.tokens[row, max(0, ends[r] - self.stop_tail) : ends[r]].tolist())
                if any(s in tail for s in p.stop):
                    done[r] = True
        if p.min_new_tokens > 1:  # too short to end yet: EOS and stop strings are tokens like others
            done &= at + 1 >= p.min_new_tokens
        stopped = done  # by EOS or a stop string: finish "stop"
        if self.forced is not None:  # a replayed row ends where its forced tokens end too
            done = done | (self.forced_len[active] <= at + 1)
        ended = done | (at + 1 >= max_new)
        cache, true_len = self.cache, self.true_len
        if bool(ended.any()):  # bookkeeping for the sequences that end here
            kt = cache.kept_tokens().tolist()
            self.dense_tokens_peak = max(self.dense_tokens_peak, int(true_len.sum()))
            for r in stopped.nonzero().flatten().tolist():
                self.finish[int(active[r])] = "stop"
            for r in ended.nonzero().flatten().tolist():
                self.kept[int(active[r])] = kt[r]
                self.ended[int(active[r])] = True
            keep_rows = (~ended).nonzero().flatten()
            active, tok, true_len, at = active[keep_rows], tok[keep_rows], true_len[keep_rows], at[keep_rows]
            self.logits_version = self.logits_version[keep_rows]
            cache.select(keep_rows)  # the live rows' logits: the decode step's below
        if len(active):  # one decode step: the sampled token enters the cache
            if engine.step_hook is not None:
                engine.step_hook("before_decode", t=t, cache=cache, rows=active, tokens=tok, positions=true_len)
            self.logits, self.x = engine._decode(tok, true_len, cache)
            self.logits_version.fill_(engine.weights_version if self.numbered else 0)
            if engine.step_hook is not None:
                engine.step_hook("after_decode", t=t, cache=cache, rows=active, logits=self.logits)
            true_len = true_len + 1
            due = cache.due(self.newline[tok] if self.newline is not None else None, seq_len=true_len)
            due &= max_new - 2 - at > c.tail_slack  # the skip rule: the rest fits without it
            if due.any():
                self.dense_tokens_peak = max(self.dense_tokens_peak, int(true_len.sum()))
                cache.compress(due, seq_len=true_len)
            at = at + 1
        self.active, self.true_len, self.at = active, true_len, at
        self.steps += 1
        self.busy_s[ran] += (time.perf_counter() - t0) / max(len(ran), 1)
        self.fill()  # refill: the next waiting rows start in the places freed

    def recompute(self) -> None:
        """The live rows' cache and next logits recomputed with the weights the engine holds now
        (:meth:`~.engine.RolloutEngine.recompute_cache`)."""
        if not len(self.active):
            return
        active, at = self.active, self.at
        self.logits, self.x = self.engine.recompute_cache(
            self.cache, self.ids[active], self.valid[active], self.tokens[active, : int(at.max())], at
        )
        self.logits_version.fill_(self.engine.weights_version if self.numbered else 0)
