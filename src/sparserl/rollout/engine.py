"""The rollout engine: batched sampling on a compressed KV cache.

    engine = RolloutEngine(loaded_model, compressor=get_compressor("rkv", budget=256), dtype="bfloat16")
    out = engine.generate(["What is 2 + 3?"], SamplingParams(n=8, max_new_tokens=256, seed=0))

Dense sampling is the ``none`` compressor (``get_compressor("none")``): one code path for dense and
sparse, and no ``None`` standing for "dense". The engine runs on the model's device
(``model.device``): the prompts, the cache and the outputs of a step live there; results come back
as plain lists.

Per response it returns token ids, the sampler's log-prob of each sampled token (under the
distribution actually sampled from), the finish reason (``stop``: EOS or a stop string;
``length``), the tokens its cache held at the end, and KV statistics for the batch.

Design for what comes next: the engine's weights are its own (``SamplerModel``) and can be pushed
from a trainer (:meth:`update_weights`) or replaced by quantized linear layers; the compressor's
``budget_for(length)`` lets a schedule change the budget with position; the engine holds no global
state, so it can live in another process (a Ray actor) as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch

from ..batch import distinct_prompts
from ..models.loading import DTYPES, LoadedModel
from . import fused, native
from .bf16_kernel_choice import choose as choose_bf16_kernel
from .cache import CompressedKVCache
from .compiled import decode_layers
from .decode_batch import DecodeBatch
from .dtype_choice import choose, for_sampler, resolve_dtype
from .kv.base import KVCompressor
from .kv_quant import get_kv_quantizer
from .model import PACKED_MAX_ROWS, SamplerModel
from .output import RolloutOutput
from .quant.smooth import CALIBRATION_TEXT, CALIBRATION_TOKENS
from .sampling import SamplingParams

Prompt = str | list[dict]


class RolloutEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        compressor: KVCompressor,
        dtype: str | torch.dtype | None = None,
        max_batch: int | Callable[[int, int], int | None] | None = None,
        compile: bool | str = False,
        pack_weights: bool | None = None,
        kv_quant: str = "none",
        quant: str = "none",
        quant_smooth: float = 0.0,
        quant_group: int | None = None,
        fused: bool = True,
        quant_outliers: int = 0,
        quant_head: bool = False,
        weights: dict | None = None,
        bf16_kernel: str | None = None,
        static: bool = False,
        static_check_every: int = 8,
        fp32_head: bool = False,
    ):
        """``compressor``: a :class:`KVCompressor`; ``get_compressor("none")`` for a dense cache. ``weights``: the
        state dict the sampler starts from (None: ``loaded.model``'s own; see :class:`SamplerModel`).
        ``compile``: run each decode layer through ``torch.compile`` (:mod:`sparserl.rollout.compiled`;
        the first step compiles, once per model shape and process); True = inductor, a string = that
        ``torch.compile`` backend (e.g. ``"aot_eager"``: the same capture, no code generation).
        ``pack_weights``: decode with
        oneDNN-packed weights (:func:`sparserl.rollout.model.pack_weight`); None = where supported.
        ``kv_quant``: how the KV cache stores K/V, ``none | int8 | fp8`` (:mod:`sparserl.rollout.kv_quant`).
        ``quant``: the sampler's weight quantization, ``none | int8 | int8_group | int8_weight_only | fp8``
        (:mod:`sparserl.rollout.quant`; re-quantized at every :meth:`update_weights`, the time in
        ``self.model.last_quantize_s``). ``quant_smooth``: SmoothQuant's migration strength for the
        quantized activations (0 = off), calibrated at every push on :data:`CALIBRATION_TEXT`
        (:mod:`sparserl.rollout.quant.smooth`). ``quant_group``: inputs per weight and activation scale of
        ``int8_group`` (None: 64). ``quant_outliers``: input channels of every quantized linear kept in
        float32, chosen on the same calibration (:mod:`sparserl.rollout.quant.outliers`). ``quant_head``: the
        LM head quantized too (:class:`SamplerModel`). ``bf16_kernel``: which of
        :func:`native.bf16_kernels` runs a bfloat16 sampler's products on CPU; None = the faster, measured
        once per machine where there are two (:mod:`sparserl.rollout.bf16_kernel_choice`).
        ``fused``: on CPU, run each decode layer as three native calls
        (:mod:`sparserl.rollout.fused`; the same numbers) where its weights allow; False = the eager
        step, operator by operator (profiling). ``static``: decode on the fixed-shape step without host reads
        (:mod:`sparserl.rollout.static_step`; on CUDA captured as a graph and attending through the Triton
        kernel when Triton is installed), the host checking the rows' done flags every ``static_check_every``
        steps."""
        self.tokenizer = loaded.tokenizer
        param = next(loaded.model.parameters())
        #: what ``dtype="auto"`` chose and why (:mod:`sparserl.rollout.dtype_choice`); None for a named dtype
        self.dtype_choice = for_sampler(choose(param.device, engine=type(self)), quant) if dtype == "auto" else None
        self.dtype = (
            DTYPES[self.dtype_choice.dtype]
            if self.dtype_choice
            else resolve_dtype(dtype)
            if dtype is not None
            else param.dtype
        )
        #: which bf16 kernel was chosen and why (:mod:`sparserl.rollout.bf16_kernel_choice`); None where
        #: given or not a bf16 sampler on the native kernels
        self.bf16_kernel_choice = None
        if (
            bf16_kernel is None
            and self.dtype == torch.bfloat16
            and param.device.type == "cpu"
            and native.active()
            and quant == "none"
        ):
            self.bf16_kernel_choice = choose_bf16_kernel(param.device, engine=type(self))
            bf16_kernel = self.bf16_kernel_choice.kernel
        calibration_ids = None
        if quant_smooth or quant_outliers:
            ids = self.tokenizer(CALIBRATION_TEXT, add_special_tokens=False)["input_ids"]
            calibration_ids = torch.tensor(ids[:CALIBRATION_TOKENS])[None]
        self.model = SamplerModel(
            loaded.model,
            self.dtype,
            pack_weights,
            quant=quant,
            quant_smooth=quant_smooth,
            calibration_ids=calibration_ids,
            quant_group=quant_group,
            quant_outliers=quant_outliers,
            quant_head=quant_head,
            weights=weights,
            bf16_kernel=bf16_kernel,
            fp32_head=fp32_head,
        )
        self.device = self.model.device
        self.compressor = _checked(compressor)
        self.max_batch = max_batch
        self.last_batch_rows: int | None = None  # the rows per batch of the last generate()
        self.kv_quant = get_kv_quantizer(kv_quant).name  # an unknown name fails here, with a hint
        self.compile: str | None = ("inductor" if compile is True else compile) or None
        self.fused = bool(fused)
        self.static = bool(static)
        self.static_check_every = int(static_check_every)
        if self.static_check_every < 1:
            raise ValueError(f"static_check_every must be >= 1, got {static_check_every}")
        self.static_graph = True  # on CUDA: replay the step as a captured graph
        from .gpu import triton_available

        self.static_triton = triton_available()  # on CUDA: attention through the Triton kernel
        self.eos_ids = self._eos_ids(loaded.model)
        self._newline_ids: torch.Tensor | None = None
        self.step_hook = None  # tests/debugging: called as hook(event, **state) around each decode step
        self.weights_version: int | None = None  # the push the weights came with (update_weights); None: not numbered

    @classmethod
    def from_engine(cls, other: RolloutEngine, compressor: KVCompressor) -> RolloutEngine:
        """Another engine over the same sampler weights (no copy) with a different compressor."""
        new = cls.__new__(cls)
        new.__dict__.update(other.__dict__)
        new.compressor = _checked(compressor)
        return new

    # --- weights -------------------------------------------------------------------------------
    def update_weights(self, source, version: int | None = None) -> None:
        """Push new weights in: a state dict or a model (e.g. the trainer's, after a step). ``version``: the
        push's number (rollout workers); each token sampled from logits these weights computed records it
        (``RolloutOutput.token_versions``)."""
        state = source.state_dict() if hasattr(source, "state_dict") else source
        self.model.load_weights(state)
        self.weights_version = version

    # --- prompts -------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        tok = self.tokenizer
        if isinstance(prompt, list):
            if getattr(tok, "chat_template", None):
                ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                return list(ids)
            text = "\n".join(f"{m['role']}: {m['content']}" for m in prompt) + "\nassistant:"
            return tok(text, add_special_tokens=False)["input_ids"]
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
        return tok(prompt, add_special_tokens=False)["input_ids"]

    def _eos_ids(self, hf_model) -> set[int]:
        ids = set()
        for src in (getattr(hf_model, "generation_config", None), hf_model.config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if e is not None:
                ids.update(e if isinstance(e, (list, tuple)) else [e])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def newline_ids(self) -> torch.Tensor:
        """Bool [V]: tokens whose text holds a newline (the ``newline`` compression trigger)."""
        if self._newline_ids is None:
            V = self.model.embed.shape[0]
            flags = torch.zeros(V, dtype=torch.bool)
            for i in range(min(V, len(self.tokenizer))):
                if "\n" in self.tokenizer.decode([i]):
                    flags[i] = True
            self._newline_ids = flags.to(self.device)
        return self._newline_ids

    # --- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams | None = None,
        prompt_ids: list[list[int]] | None = None,
        forced: list[list[int]] | None = None,
        first_prompt: int = 0,
    ) -> RolloutOutput:
        """Sample ``params.n`` responses per prompt. ``forced`` (one token list per response, in output
        order): each step's token is the given one instead of a draw, so the run replays a sampled batch
        (:mod:`sparserl.mismatch.replay`): the same tokens enter the cache, the compressor sees the same
        states, rows end where they ended, and ``sampler_logprobs`` are the forced tokens' log-probs.
        ``first_prompt``: the global index of the first prompt when this call samples a shard of a larger
        batch; response ``j`` of prompt ``i`` draws from row ``(first_prompt + i)·n + j``'s stream
        (:func:`~sparserl.rollout.sampling.row_uniforms`), so a shard samples what the whole batch would."""
        params = params or SamplingParams()
        prompt_ids, expanded = self.expand(prompts, params, prompt_ids)
        if forced is not None and (len(forced) != len(expanded) or any(len(f) == 0 for f in forced)):
            raise ValueError(f"forced: {len(forced)} token lists for {len(expanded)} responses (each non-empty)")
        rows, chunk = self.split_rows(prompt_ids, expanded, params, first_prompt)
        if self.static and forced is None:
            from .static_step import generate_static, static_unsupported

            if static_unsupported(self.compressor, params) is None:  # `chunk` rows at once, refilled as rows end
                out = generate_static(self, [e[1] for e in expanded], params, rows, slots=chunk)
                return self._named(out, expanded)
        outs = [
            self._generate_batch(
                [e[1] for e in expanded[s : s + chunk]],
                params,
                rows[s : s + chunk],
                forced[s : s + chunk] if forced is not None else None,
            )
            for s in range(0, len(expanded), chunk)
        ]
        return self._named(join_sequential(outs), expanded)

    def expand(
        self, prompts: list[Prompt], params: SamplingParams, prompt_ids: list[list[int]] | None = None
    ) -> tuple[list[list[int]], list[tuple[int, list[int]]]]:
        """The prompts' token ids (``prompt_ids`` when given, else encoded) and the responses to sample, as
        (prompt index, prompt ids), ``params.n`` per prompt in prompt-major order; ``params`` validated, and an
        empty prompt or one as long as the model's context refused."""
        params.validate()
        if prompt_ids is None:
            if not prompts:
                raise ValueError("no prompts given")
            prompt_ids = [self.encode(p) for p in prompts]
        for i, ids in enumerate(prompt_ids):
            if len(ids) == 0:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) >= self.model.max_positions:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens, longer than the model's context ({self.model.max_positions})"
                )
        return prompt_ids, [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(params.n)]

    def split_rows(
        self, prompt_ids: list[list[int]], expanded: list, params: SamplingParams, first_prompt: int
    ) -> tuple[torch.Tensor, int]:
        """The rollout's rows and how they are batched: (each response's global row id [R] int64, response ``j``
        of prompt ``i`` is row ``(first_prompt + i)·n + j`` (its random stream); the rows sampled at once,
        :meth:`batch_rows`, also kept as :attr:`last_batch_rows` so that a replay splits the rollout the same
        way)."""
        rows = torch.arange(len(expanded), dtype=torch.long) + first_prompt * params.n
        self.last_batch_rows = self.batch_rows(prompt_ids, params.max_new_tokens, len(expanded))
        return rows, self.last_batch_rows

    def _named(self, out: RolloutOutput, expanded: list[tuple[int, list[int]]]) -> RolloutOutput:
        """``out`` with each response's prompt index, prompt tokens and decoded text."""
        out.prompt_index = [e[0] for e in expanded]
        out.prompt_ids = [list(e[1]) for e in expanded]
        out.texts = [self.tokenizer.decode(r, skip_special_tokens=True) for r in out.response_ids]
        return out

    def _prefill_distinct(self, ids, valid, positions, want_q: int, want_attn: bool):
        """:meth:`SamplerModel.prefill` of each distinct prompt once (:func:`sparserl.batch.distinct_prompts`,
        as the learner's shared-prompt forward), its outputs (logits, keys, values, the window's queries, the
        attention each slot received) copied to every row that holds it. A GRPO batch holds each prompt
        ``n`` times (the default job: 4 prompts x 8), so its prefill does ``n`` times less work. A row's
        outputs are functions of its own padded tokens only (P is the batch's longest prompt either way),
        so each row gets its own prefill's values, up to the order of the sums a BLAS picks for another
        number of rows: on SmolLM2-135M with MKL, float32 log-probs moved by up to 3e-5 and bf16 not at
        all (the tokens were the same; the tiny test model's are the same bits)."""
        rows, back = distinct_prompts(ids, valid)
        if len(rows) == ids.shape[0]:
            return self.model.prefill(ids, valid, positions, want_q, want_attn)
        out = self.model.prefill(ids[rows], valid[rows], positions[rows], want_q, want_attn)
        return tuple(
            None
            if x is None
            else x.index_select(0, back)
            if isinstance(x, torch.Tensor)
            else [t.index_select(0, back) for t in x]
            for x in out
        )

    def batch_rows(self, prompt_ids: list[list[int]], max_new: int, n_rows: int) -> int:
        """Rows generated at once for a rollout of ``n_rows`` responses to ``prompt_ids``: ``max_batch`` (or its
        value for the longest prompt and ``max_new``), at most ``n_rows``."""
        rows = self.max_batch
        if callable(rows):
            rows = rows(max(len(ids) for ids in prompt_ids), max_new)
        return min(rows or n_rows, n_rows)

    def left_padded(
        self, prompts: list[list[int]], width: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's prompts left-padded to the longest (or ``width``), on the engine's device: (ids [B, P],
        valid [B, P] bool, positions [B, P]: each token's position in its own prompt, 0 on the padding)."""
        B, P = len(prompts), max(width or 0, max(len(x) for x in prompts))
        ids = torch.full((B, P), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        valid = torch.zeros(B, P, dtype=torch.bool)
        for b, x in enumerate(prompts):
            ids[b, P - len(x) :] = torch.tensor(x)
            valid[b, P - len(x) :] = True
        ids, valid = ids.to(self.device), valid.to(self.device)  # built on the CPU, one copy each
        return ids, valid, (valid.long().cumsum(-1) - 1).clamp(min=0)

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[list[int]], p: SamplingParams, row_ids: torch.Tensor, forced: list[list[int]] | None = None
    ) -> RolloutOutput:
        """One batch; ``row_ids`` [B] (int64): each response's random stream."""
        return run_to_end(self._batch_steps(prompts, p, row_ids, forced))

    def _batch_steps(
        self,
        prompts: list[list[int]],
        p: SamplingParams,
        row_ids: torch.Tensor,
        forced: list[list[int]] | None = None,
        slots: int | None = None,
    ) -> Generator[int, str | None, RolloutOutput]:
        """:meth:`_generate_batch` one decode step at a time: yields the number of decode steps run so far (after
        each: the K/V of each live row's last token written, its next token's logits computed) and returns the
        batch's output. Between two steps the caller may load other weights (:meth:`update_weights`): the rows go
        on with them, their cache as it is (``next``), or recomputed with them (``send(RECOMPUTE)``:
        :meth:`recompute_cache`) (:class:`SegmentedRollout`).

        ``slots`` (not with ``forced``): rows decoded at once (None: every row). The others wait, in order, and
        each takes the place of a row that ends (continuous batching, :class:`~.decode_batch.DecodeBatch`): its
        prompt prefilled, its cache joined to the batch's (:meth:`CompressedKVCache.append`), so the batch stays
        full while a group's long tail runs. Every prompt is left-padded to the batch's longest, so any row fits
        any place. A row's draws depend on its stream and its own token index only
        (:func:`~.sampling.row_uniforms`), so which rows share a step changes no token (up to the order of a
        BLAS's sums)."""
        batch = DecodeBatch(
            self, p, max(len(x) for x in prompts), None if (slots is None or forced is not None) else slots
        )
        batch.add(0, prompts, row_ids, p.seed, forced)
        while True:
            batch.step()
            if not batch.live:
                break
            if (yield batch.steps) == RECOMPUTE:  # weights loaded since: the live rows' K/V and next logits with them
                batch.recompute()
        out = batch.take(0)
        out.seconds = time.perf_counter() - batch.t0
        return out

    #: tokens (rows x sequence length) :meth:`recompute_cache` forwards at once: bounds its K/V and temporaries
    RECOMPUTE_TOKENS = 8192

    @torch.inference_mode()
    def recompute_cache(
        self,
        cache: CompressedKVCache,
        ids: torch.Tensor,
        valid: torch.Tensor,
        response: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache of live rows recomputed with the weights the engine holds now (NeMo-RL's
        ``recompute_kv_cache_after_weight_updates``, ``rollout.partial_kv=recompute``): one forward over each
        row's prompt (``ids`` / ``valid`` [r, P], left-padded) and response so far (``response`` [r, t]), whose
        K/V replace the cached ones at the positions the cache holds (:meth:`CompressedKVCache.rewrite_rows`: a
        compressing cache keeps the tokens it chose, with their K/V recomputed). Returns the next token's logits
        [r, V] and their head input [r, hidden] from that forward: the first token after a recompute is drawn
        with attention over the whole sequence (as vLLM's recomputing prefill does), the ones after from the cache.
        ``lengths`` [r]: each row's response length when they differ (rows that joined a running batch), its
        first ``lengths[i]`` tokens of ``response`` taken. Rows ``RECOMPUTE_TOKENS`` tokens at a time."""
        seq = torch.cat([ids, response], 1)
        ok = torch.cat([valid, torch.ones_like(response, dtype=torch.bool)], 1)
        if lengths is not None:  # each row's unused response columns moved to its left: the padding stays in front
            T, W = response.shape[1], seq.shape[1]
            lengths = lengths.to(seq.device)
            ok[:, valid.shape[1] :] = torch.arange(T, device=seq.device)[None, :] < lengths[:, None]
            column = (torch.arange(W, device=seq.device)[None, :] - (T - lengths)[:, None]) % W
            seq, ok = seq.gather(1, column), ok.gather(1, column)
        positions = (ok.long().cumsum(-1) - 1).clamp(min=0)
        offset = (~ok).sum(1)  # columns before position 0
        rows = max(1, self.RECOMPUTE_TOKENS // seq.shape[1])
        logits, xs = [], []
        for s in range(0, seq.shape[0], rows):
            part = slice(s, s + rows)
            lg, keys, values, queries, _, x = self.model.prefill(
                seq[part], ok[part], positions[part], cache.window, False
            )
            cache.rewrite_rows(part, keys, values, offset[part], queries if cache.window else None)
            logits.append(lg)
            xs.append(x)
            del keys, values, queries
        cache.restart_selector()
        return torch.cat(logits), torch.cat(xs)

    def _fused_decode(self) -> bool:
        """Whether :meth:`_decode` runs the fused native layers (:mod:`.fused`) and so their head."""
        return self.fused and not self.compile and fused.available(self.model)

    def _decode(self, tok: torch.Tensor, positions: torch.Tensor, cache: CompressedKVCache):
        """One decode step: (float32 logits [B, V], the LM head's input x [B, hidden] they came from, in the
        sampler's dtype: :meth:`hidden_logits` of it gives the same logits)."""
        m = self.model
        h = torch.nn.functional.embedding(tok, m.embed)[:, None, :]  # [B, 1, hidden]
        bias = cache.begin_step(positions)
        if self._fused_decode():  # float32 h (a float32 sampler's in place)
            h = fused.decode_layers(m, h, *m.rope(positions[:, None], torch.float32), cache, bias)
            cache.end_step()
            x = fused.final_norm(m, h[:, 0])
            return fused.head(m, x), x
        cos, sin = m.rope(positions[:, None])  # [B, 1, D]
        if self.compile:
            h = decode_layers(m, h, cos, sin, cache, bias, self.compile)
        else:
            for layer, lw in enumerate(m.layers):
                q, k, v = m.qkv(lw, h, cos, sin)  # [B, H, 1, D]
                a = cache.attend(layer, q, k, v, bias)
                m.linear(a[:, None, :], lw.o, add_to=h)  # h, the residual stream, is this step's own: added in place
                m.linear(m.mlp_act(lw, h), lw.down, add_to=h)
        cache.end_step()
        x = m.final_norm(h[:, 0])
        return m.head(x).float(), x

    @torch.inference_mode()
    def hidden_logits(self, x: torch.Tensor, first: bool) -> torch.Tensor:
        """Float32 logits [..., V] from kept head inputs x [..., hidden] (``RolloutOutput.hidden``) by the
        sampler's own head, the one that made the logits it sampled from: the prefill's (``first``: response
        token 0) or the decode step's (tokens 1 on; the fused layers' head where :meth:`_decode` runs them),
        with the weights it holds now. Each row is its own: a quantized head's activation scales are per token."""
        m = self.model
        if not first and self._fused_decode():
            return fused.head(m, x)
        # a decode step's few rows run on the packed kernel (model.linear): blocks of as many, for its sums
        return torch.cat([m.head(part.to(m.dtype)).float() for part in x.split(PACKED_MAX_ROWS)])


#: sent into :meth:`RolloutEngine._batch_steps` after a weight load: recompute the live rows' cache with the new weights
RECOMPUTE = "recompute"


def _checked(compressor: KVCompressor) -> KVCompressor:
    if not isinstance(compressor, KVCompressor):
        raise TypeError(
            f"compressor must be a KVCompressor (get_compressor('none') for a dense cache), "
            f"got {type(compressor).__name__}"
        )
    return compressor


def join_sequential(outs: list[RolloutOutput]) -> RolloutOutput:
    """Outputs sampled one after another, joined into the first (which is returned): the per-response lists
    concatenated, the KV peaks the largest, compressions, tokens and times summed. ``prompt_index``,
    ``prompt_ids`` and ``texts`` are the caller's to set."""
    if len(outs) == 1:
        return outs[0]
    o = outs[0]
    for x in outs[1:]:
        o.response_ids += x.response_ids
        o.sampler_logprobs += x.sampler_logprobs
        o.finish_reason += x.finish_reason
        o.kv_tokens_kept += x.kv_tokens_kept
        o.kv.bytes_peak = max(o.kv.bytes_peak, x.kv.bytes_peak)
        o.kv.bytes_theory = max(o.kv.bytes_theory, x.kv.bytes_theory)
        o.kv.bytes_dense = max(o.kv.bytes_dense, x.kv.bytes_dense)
        o.kv.compressions += x.kv.compressions
        o.kv.bytes_dense_alloc = max(o.kv.bytes_dense_alloc, x.kv.bytes_dense_alloc)
        o.tokens_generated += x.tokens_generated
        o.seconds += x.seconds
        o.prefill_seconds += x.prefill_seconds
        if o.top_logprobs is not None:
            o.top_logprobs += x.top_logprobs
            o.top_indices += x.top_indices
        if o.distributions is not None:
            o.distributions += x.distributions
        if o.hidden is not None:
            o.hidden += x.hidden
        if o.token_versions is not None:
            o.token_versions += x.token_versions
    return o


def run_to_end(steps: Generator[int, None, RolloutOutput]) -> RolloutOutput:
    """What a generator of decode steps (:meth:`RolloutEngine._batch_steps`) returns, run to its end."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value
