"""Predicted rollout time: dense, a fixed KV budget, a schedule, and block top-k attention.

The cost model of Sparrow (Zhou et al., 2026, arXiv 2606.08446; docs/algorithms.md §3), after Kinetics
(Sadhukhan et al., 2025, "Kinetics: Rethinking Test-Time Scaling Laws", arXiv 2506.05333), turned
into seconds on a measured machine and following what this engine does step by step.

Notation: N sequences, L_in prompt and L_out response tokens; P_w the weights one decode step
multiplies (:attr:`ModelShape.decode_weights`: every layer's q/k/v, o, gate/up and down, and the LM
head; the embedding is a gather), b_w / b_kv bytes per weight / KV element; ℓ layers, H_q / H_kv
query / KV heads, d the head dim, D = 2 ℓ H_kv d (K and V elements of one cached token), r = H_q /
H_kv, V the vocabulary, h the hidden size; BW the measured read bandwidth and F the measured
throughput of the decode's GEMMs at the batch's rows (:class:`MachineRates`, measured by
:func:`sparserl.bench.machine.measure_rates`).

The engine prefills the prompts (that gives the first token), then runs L_out − 1 decode steps
s = 1 … L_out − 1 (the last token is sampled, never decoded). Step s attends over K_s tokens per
sequence and layer, and each step, like each compression, takes the slower of its reads and its
FLOPs (the roofline of :mod:`sparserl.bench.roofline`)::

    bytes_s = P_w b_w + N D b_kv K_s                       (+ block top-k's page scoring)
    flops_s = 2 N P_w + 2 r N D K_s                        (+ block top-k's page scoring)
    C       = t_prefill + Σ_s max(bytes_s / BW, flops_s / F) + Σ_compressions max(bytes_c / BW, flops_c / F)

    t_prefill = max(bytes_p / BW, flops_p / F_p),  bytes_p = P_w b_w + N L_in D b_kv,
                flops_p = 2 N L_in (P_w − V h) + 2 N V h + 4 N ℓ H_q d L_in²
                (the LM head on the last position only; SDPA over the whole masked L_in × L_in matrix;
                F_p the GEMM rate at the prefill's many rows when measured, else F)

K_s: dense L_in + s. A fixed budget B or a schedule B(L) (:class:`~sparserl.rollout.kv.schedule.
KVSchedule`, L = L_in + s): the cache grows one token a step and, when its compressible region (the
response, or the whole sequence with ``compress_prompt``) reaches B(L) + S (S = ``step_length``),
it is cut to B(L) — the compressor's ``due`` rule, skipped when the rest of the generation fits in
``tail_slack`` spare slots — so K_s cycles between L_in + B and L_in + B + S (B and B + S with
``compress_prompt``, whose prompt is compressed at prefill when longer than the buffer). Block top-k (pages of
p = 16 tokens, k pages read, the first ℓ_d = 2 layers dense): the KV is kept whole, the ℓ_d dense
layers attend over L_in + s tokens and the others over min(L_in + s, k p); scoring the pages (the
query against each page's mean key) adds N (ℓ − ℓ_d) H_kv d b_kv ⌈K_s / p⌉ bytes and
2 N (ℓ − ℓ_d) H_q d ⌈K_s / p⌉ FLOPs a step.

A compression of a region of R slots out of L cached ones, down to B, over all ℓ layers (what
:meth:`~sparserl.rollout.cache.CompressedKVCache.compress` and the compressors' scores do)::

    flops_c = N ℓ (2 H_q w L d [window attention: R-KV, SnapKV]  +  H_kv R (R − 1) d [R-KV's key
              cosine similarity: the upper triangle, as the C kernel computes it])
    bytes_c = N ℓ H_kv d b_kv (L [keys scored; R-KV and SnapKV]  +  8 B [the kept K and V:
              index_select into a copy, then index_copy_ back])

with w the observation window. StreamingLLM scores nothing (positions only): its compressions cost
the copy alone.

Against Kinetics: summed over the steps, the dense attention FLOPs 2 r N D Σ K_s ≈ r (2 L_in + L_out)
L_out N D are its ``r(2L_in + L_out)L_out N D``, and the KV reads N D b_kv Σ K_s ≈ b_kv (N L_in L_out D
+ N L_out² D / 2) its ``I(2 L_in L_out D + N L_out² D)`` with b_kv = 2, except that this engine keeps
(and reads) one copy of the prompt's KV per sequence where Kinetics shares the prefix; with a budget
B they become its ``2rNDBL_out + 2INDBL_out``. Two departures: Kinetics adds compute and memory
(a FLOP-equivalent cost), here each step takes the slower of the two; and the weight reads P_w b_w
of every step, which dominate a small batch on a CPU, are a memory term Kinetics leaves out
(it keeps only ``2PNL_out``).

Left out: sampling (a few passes over N × V logits a step), Python and operator-call overheads,
the per-step upkeep of the page means, and any difference between F and the rate of the
compressors' C kernels or of attention. The measured/predicted ratio of
``experiments/rollout/cost_model_validate.py`` says how much that is on a machine.

    shape = ModelShape.from_config(hf_config, "float32")
    # sparserl.bench.machine; or MachineRates.from_machine_info(bench["machine"])
    rates = measure_rates(engine.model, rows=16)
    rollout_cost(shape, rates, 16, 32, 1024, budget=128).seconds
    predicted_cost_vs_dense(shape, rates, 16, 32, 1024, schedule=[[0, 128], [2000, 512]])   # < 1: cheaper
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..rollout.kv import KVCompressor, build_compressor
from ..rollout.kv.schedule import KVSchedule

__all__ = [
    "Cost",
    "MachineRates",
    "ModelShape",
    "SCORING",
    "predicted_cost_vs_dense",
    "rollout_cost",
    "rollout_cost_lengths",
]

#: what a compression scores, per compressor: the window attention (``window``) and R-KV's key
#: cosine similarity (``redundancy``); every compression also copies the kept K and V
SCORING: dict[str, tuple[str, ...]] = {"rkv": ("window", "redundancy"), "snapkv": ("window",), "streaming": ()}


def _cfg(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def _element_bytes(dtype: str | torch.dtype) -> int:
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; expected a torch dtype name such as float32 or bfloat16")
        dtype = dt
    return torch.empty(0, dtype=dtype).element_size()


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a decoder: sizes, and bytes per weight / KV element as held."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = True
    weight_bytes: float = 4.0  # per weight element, as the sampler holds it
    kv_bytes: float = 4.0  # per K or V element, as the cache holds it
    head_bytes: float | None = None  # per LM-head weight element (None: weight_bytes; an int8 sampler keeps it float)
    qkv_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ModelShape: {name} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelShape: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        for name in ("weight_bytes", "kv_bytes", "head_bytes"):
            v = getattr(self, name)
            if name == "head_bytes" and v is None:
                continue
            if not v > 0:
                raise ValueError(f"ModelShape: {name} must be > 0, got {v!r}")

    @classmethod
    def from_config(
        cls, config: Any, dtype: str | torch.dtype = "float32", kv_dtype: str | torch.dtype | None = None
    ) -> ModelShape:
        """From a Hugging Face config (object or dict) of a llama / qwen2 / qwen3 / mistral decoder;
        ``dtype``: the sampler's weights, ``kv_dtype``: the cache's (default: ``dtype``)."""
        heads = _cfg(config, "num_attention_heads")
        hidden = _cfg(config, "hidden_size")
        if heads is None or hidden is None:
            raise ValueError("ModelShape.from_config: the config has no num_attention_heads / hidden_size")
        model_type = _cfg(config, "model_type")
        return cls(
            layers=_cfg(config, "num_hidden_layers"),
            hidden=hidden,
            heads=heads,
            kv_heads=_cfg(config, "num_key_value_heads") or heads,
            head_dim=_cfg(config, "head_dim") or hidden // heads,
            intermediate=_cfg(config, "intermediate_size"),
            vocab=_cfg(config, "vocab_size"),
            tied_embeddings=bool(_cfg(config, "tie_word_embeddings", True)),
            weight_bytes=float(_element_bytes(dtype)),
            kv_bytes=float(_element_bytes(kv_dtype if kv_dtype is not None else dtype)),
            qkv_bias=bool(_cfg(config, "attention_bias", False)) or model_type == "qwen2",
            qk_norm=model_type == "qwen3",
        )

    @property
    def layer_weights(self) -> int:
        """Weight elements of one layer's q/k/v, o, gate/up and down."""
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (q_dim + 2 * kv_dim) * self.hidden + self.hidden * q_dim + 3 * self.intermediate * self.hidden

    @property
    def decode_weights(self) -> int:
        """P_w: the weight elements one decode step multiplies (every layer's and the LM head)."""
        return self.layers * self.layer_weights + self.vocab * self.hidden

    @property
    def params(self) -> int:
        """P: the parameter count (embedding, LM head when untied, norms and biases included)."""
        per_layer = self.layer_weights + 2 * self.hidden
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.layers * per_layer + self.hidden

    @property
    def decode_weight_bytes(self) -> float:
        """P_w b_w: the bytes one decode step reads of the weights (the LM head at ``head_bytes``)."""
        head = self.vocab * self.hidden
        head_b = self.weight_bytes if self.head_bytes is None else self.head_bytes
        return (self.decode_weights - head) * self.weight_bytes + head * head_b

    @property
    def kv_width(self) -> int:
        """D: K and V elements of one cached token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    @property
    def gqa_ratio(self) -> int:
        """r = H_q / H_kv."""
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class MachineRates:
    """The machine's two ceilings: read bandwidth (bytes/s) and the decode GEMMs' throughput (FLOP/s)."""

    bandwidth: float
    gemm_flops: float  # at the decode's rows (the batch)
    prefill_flops: float | None = None  # at the prefill's rows (None: gemm_flops)

    def __post_init__(self):
        for name in ("bandwidth", "gemm_flops", "prefill_flops"):
            v = getattr(self, name)
            if v is None and name == "prefill_flops":
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"MachineRates: {name} must be a finite number > 0, got {v!r}")

    @property
    def prefill_rate(self) -> float:
        return self.prefill_flops if self.prefill_flops is not None else self.gemm_flops

    @classmethod
    def from_machine_info(cls, info: dict) -> MachineRates:
        """From a bench JSON's ``machine`` object (``memory_bandwidth_bytes_per_s``, ``gemm_flops_per_s``)."""
        try:
            return cls(float(info["memory_bandwidth_bytes_per_s"]), float(info["gemm_flops_per_s"]))
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"MachineRates.from_machine_info: needs memory_bandwidth_bytes_per_s and gemm_flops_per_s, got {e!r}"
            ) from None


@dataclass(frozen=True)
class Cost:
    """A predicted rollout: ``seconds`` = ``prefill_s + weight_s + attention_s + scoring_s +
    compression_s``. A decode step's time goes to its terms by the ceiling that bounds it: a
    memory-bound step splits by bytes read, a compute-bound one by FLOPs."""

    seconds: float
    prefill_s: float
    weight_s: float  # the decode steps' weight reads / products
    attention_s: float  # the decode steps' attention over the kept (or selected) tokens
    scoring_s: float  # block top-k: scoring the pages every step
    compression_s: float  # KV compressions: scoring and copying the kept slots
    method: str  # "dense" | "budget" | "schedule" | "blocktopk"
    decode_steps: int
    compressions: int
    kv_tokens_mean: float  # tokens attended per sequence and layer, mean over the decode steps
    kv_tokens_last: int  # tokens cached per sequence and layer at the end (the engine's kv_tokens_kept)
    memory_bound_steps: int
    bytes_read: float
    flops: float

    def to_dict(self) -> dict:
        return asdict(self)


def _positive_int(name: str, v: Any, low: int = 1) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"rollout_cost: {name} must be an integer >= {low}, got {v!r}")


def _compressor(budget, schedule, step_length, window, compressor, compress_prompt, tail_slack) -> KVCompressor | None:
    """The compressor the rollout runs (None: dense), checked as the engine would check it."""
    if isinstance(compressor, KVCompressor):
        if budget is not None or schedule is not None:
            raise ValueError("rollout_cost: a KVCompressor carries its own budget / schedule; do not pass them too")
        comp = compressor
    else:
        if compressor not in SCORING and compressor != "none":
            raise ValueError(
                f"rollout_cost: no cost terms for compressor {compressor!r}; known: {', '.join(SCORING)} (none: dense)"
            )
        if budget is not None and schedule is not None:
            raise ValueError("rollout_cost: give a fixed budget or a schedule, not both")
        if budget is not None:
            _positive_int("budget", budget)
        if (budget is None and schedule is None) or compressor == "none":
            if budget is not None or schedule is not None:
                raise ValueError("rollout_cost: compressor 'none' is dense; it takes no budget or schedule")
            return None
        comp = build_compressor(
            compressor,
            kv_budget=budget,
            step_length=step_length,
            window=window,
            compress_prompt=compress_prompt,
            tail_slack=tail_slack,
            options={"schedule": schedule} if schedule is not None else None,
        )
    if not comp.compresses:
        return None
    if comp.name not in SCORING:
        raise ValueError(f"rollout_cost: no cost terms for compressor {comp.name!r}; known: {', '.join(SCORING)}")
    if comp.trigger != "step_length":
        raise ValueError(f"rollout_cost: trigger {comp.trigger!r} depends on the text; only 'step_length' is modelled")
    return comp


def _trajectory(comp: KVCompressor | None, prompt_len: int, response_len: int):
    """The engine's cache lengths: (K_s for each decode step, compressions as (step, L, R, keep);
    step -1 is a compression of the prompt at prefill). Mirrors ``RolloutEngine._generate_batch``,
    :meth:`KVCompressor.due` and :meth:`CompressedKVCache.compress` for rows of equal length."""
    kept, events = [], []
    lens = prompt_len
    if comp is None:
        return [prompt_len + s for s in range(1, response_len)], events
    start = 0 if comp.compress_prompt else prompt_len  # the compressible region's first slot
    if comp.compress_prompt and prompt_len > comp.capacity(prompt_len, response_len):
        keep = int(comp.budget_for(prompt_len))
        events.append((-1, prompt_len, prompt_len, keep))
        lens = keep
    for t in range(response_len - 1):
        lens += 1
        kept.append(lens)
        seq_len = prompt_len + t + 1
        budget = int(comp.budget_for(seq_len))
        remaining = response_len - 2 - t
        if lens - start >= budget + comp.step_length and remaining > comp.tail_slack:
            events.append((t, lens, lens - start, budget))
            lens = start + budget
    return kept, events


def rollout_cost(
    shape: ModelShape,
    rates: MachineRates,
    n: int,
    prompt_len: int,
    response_len: int,
    *,
    budget: int | None = None,
    schedule: KVSchedule | list | str | None = None,
    step_length: int = 128,
    window: int | None = None,
    compressor: str | KVCompressor = "rkv",
    compress_prompt: bool = False,
    tail_slack: int = 0,
    blocktopk_pages: int | list | None = None,
    page_size: int = 16,
    dense_layers: int = 2,
) -> Cost:
    """Predicted seconds of one rollout of ``n`` sequences, ``prompt_len`` prompt tokens each,
    generating exactly ``response_len`` tokens (the formula in the module docstring).

    Dense when no budget, schedule, compressing ``compressor`` instance or ``blocktopk_pages`` is
    given. ``budget``: a fixed KV budget (tokens); ``schedule``: a Sparrow schedule (a
    :class:`KVSchedule`, its ``[[length, budget], ...]`` pairs or a JSON file, as ``rollout.kv_schedule``);
    ``step_length``, ``window`` (None: the method's default), ``compress_prompt``, ``tail_slack``:
    the compressor's options; ``compressor``: its name (``rkv``, ``snapkv``, ``streaming``) or a
    built :class:`KVCompressor` (then its own budget, schedule and options). ``blocktopk_pages``:
    block top-k attention reading that many pages of ``page_size`` tokens a step (the always-kept
    first and last pages among them) in every layer but the first ``dense_layers``; or
    ``[[length, pages], ...]`` pairs, the pages following the cached length as Sparrow's schedule
    does (pages_i from length l_i on). Bad input raises ``ValueError`` naming the argument."""
    _positive_int("n", n)
    _positive_int("response_len", response_len)
    return rollout_cost_lengths(
        shape,
        rates,
        prompt_len,
        [response_len] * n,
        budget=budget,
        schedule=schedule,
        step_length=step_length,
        window=window,
        compressor=compressor,
        compress_prompt=compress_prompt,
        tail_slack=tail_slack,
        blocktopk_pages=blocktopk_pages,
        page_size=page_size,
        dense_layers=dense_layers,
    )


def _pages_schedule(pages: int | list) -> list[tuple[int, int]]:
    """``blocktopk_pages`` as sorted ``(from length, pages)`` steps; an int is one step from 0."""
    if isinstance(pages, int) and not isinstance(pages, bool):
        _positive_int("blocktopk_pages", pages)
        return [(0, pages)]
    try:
        steps = sorted((int(length), int(k)) for length, k in pages)
    except (TypeError, ValueError):
        raise ValueError(
            f"rollout_cost: blocktopk_pages must be an integer >= 1 or [[length, pages], ...] pairs, got {pages!r}"
        ) from None
    if not steps or steps[0][0] != 0 or any(k < 1 for _, k in steps):
        raise ValueError(f"rollout_cost: blocktopk_pages pairs must start at length 0 with pages >= 1, got {pages!r}")
    return steps


def _pages_at(steps: list[tuple[int, int]], length: int) -> int:
    return steps[bisect.bisect_right([s for s, _ in steps], length) - 1][1]


def rollout_cost_lengths(
    shape: ModelShape,
    rates: MachineRates,
    prompt_len: int,
    response_lens: list[int] | tuple[int, ...],
    **sparsity,
) -> Cost:
    """Predicted seconds of one rollout of ``len(response_lens)`` sequences of ``prompt_len`` prompt
    tokens, sequence i generating ``response_lens[i]`` tokens: as :func:`rollout_cost`, but a
    sequence leaves the batch when it ends (the engine drops finished rows, as continuous batching
    does), so decode step s runs the N_s = #{i : L_out,i > s} rows still generating::

        bytes_s = P_w b_w + N_s D b_kv K_s,    flops_s = 2 N_s P_w + 2 r N_s D K_s

    The weights are read once a step whatever N_s: the long tail of a few rows pays the weight reads
    alone, which no KV sparsity shortens. ``sparsity``: :func:`rollout_cost`'s keyword arguments."""
    opts = dict(
        budget=None,
        schedule=None,
        step_length=128,
        window=None,
        compressor="rkv",
        compress_prompt=False,
        tail_slack=0,
        blocktopk_pages=None,
        page_size=16,
        dense_layers=2,
    )
    unknown = set(sparsity) - set(opts)
    if unknown:
        raise ValueError(f"rollout_cost: unknown argument(s) {', '.join(sorted(unknown))}")
    opts.update(sparsity)
    budget, schedule, blocktopk_pages = opts["budget"], opts["schedule"], opts["blocktopk_pages"]
    page_size, dense_layers = opts["page_size"], opts["dense_layers"]
    compressor = opts["compressor"]
    if not isinstance(shape, ModelShape) or not isinstance(rates, MachineRates):
        raise ValueError("rollout_cost: shape must be a ModelShape and rates a MachineRates")
    _positive_int("prompt_len", prompt_len)
    if not response_lens:
        raise ValueError("rollout_cost: response_lens must hold at least one length")
    for length in response_lens:
        _positive_int("response_len", length)
    _positive_int("step_length", opts["step_length"])
    _positive_int("tail_slack", opts["tail_slack"], low=0)
    if opts["window"] is not None:
        _positive_int("window", opts["window"], low=0)
    pages = None
    if blocktopk_pages is not None:
        if budget is not None or schedule is not None or isinstance(compressor, KVCompressor):
            raise ValueError(
                "rollout_cost: block top-k keeps the whole cache; give blocktopk_pages without "
                "a budget, a schedule or a compressor"
            )
        pages = _pages_schedule(blocktopk_pages)
        _positive_int("page_size", page_size)
        _positive_int("dense_layers", dense_layers, low=0)
        if dense_layers > shape.layers:
            raise ValueError(f"rollout_cost: dense_layers ({dense_layers}) exceeds the model's {shape.layers} layers")
    comp = _compressor(
        budget,
        schedule,
        opts["step_length"],
        opts["window"],
        compressor,
        opts["compress_prompt"],
        opts["tail_slack"],
    )
    lengths = sorted(response_lens)
    rows = len(lengths)
    kept, events = _trajectory(comp, prompt_len, lengths[-1])
    # decode step t (0-based) runs the rows whose response is longer than t + 1 tokens
    active = [rows - bisect.bisect_right(lengths, t + 1) for t in range(len(kept))]
    method = (
        "blocktopk"
        if pages is not None
        else "dense"
        if comp is None
        else "schedule"
        if comp.schedule is not None
        else "budget"
    )

    bw, F = rates.bandwidth, rates.gemm_flops
    ell, hq, hkv, d = shape.layers, shape.heads, shape.kv_heads, shape.head_dim
    layer_kv = 2 * hkv * d * shape.kv_bytes  # bytes of one token's K and V in one layer
    w_bytes = shape.decode_weight_bytes
    sparse_layers = ell - dense_layers if pages is not None else 0

    weight_s = attention_s = scoring_s = 0.0
    total_bytes = total_flops = tokens = 0.0
    memory_bound = 0
    for K, n in zip(kept, active):
        selected = _pages_at(pages, K) * page_size if pages is not None else 0
        layer_tokens = (ell - sparse_layers) * K + sparse_layers * min(K, selected)
        w_flops = 2.0 * n * shape.decode_weights
        a_bytes = n * layer_kv * layer_tokens
        a_flops = 4.0 * n * hq * d * layer_tokens  # q·kᵀ and p·v: 2 r N D K_s over the layers
        n_pages = math.ceil(K / page_size) if sparse_layers else 0
        s_bytes = n * sparse_layers * hkv * d * shape.kv_bytes * n_pages
        s_flops = 2.0 * n * sparse_layers * hq * d * n_pages
        mem_b, comp_f = w_bytes + a_bytes + s_bytes, w_flops + a_flops + s_flops
        if mem_b / bw >= comp_f / F:
            memory_bound += 1
            weight_s += w_bytes / bw
            attention_s += a_bytes / bw
            scoring_s += s_bytes / bw
        else:
            weight_s += w_flops / F
            attention_s += a_flops / F
            scoring_s += s_flops / F
        total_bytes += mem_b
        total_flops += comp_f
        tokens += n * layer_tokens / ell

    head = shape.vocab * shape.hidden
    p_bytes = w_bytes + rows * prompt_len * shape.kv_width * shape.kv_bytes
    p_flops = (
        2.0 * rows * prompt_len * (shape.decode_weights - head)
        + 2.0 * rows * head
        + 4.0 * rows * ell * hq * d * prompt_len**2
    )
    prefill_s = max(p_bytes / bw, p_flops / rates.prefill_rate)
    total_bytes += p_bytes
    total_flops += p_flops

    compression_s = 0.0
    terms = SCORING[comp.name] if comp is not None else ()
    w = comp.window if comp is not None else 0
    for t, L, R, keep in events:
        n = rows if t < 0 else active[t]
        c_flops = 0.0
        if "window" in terms:
            c_flops += 2.0 * n * ell * hq * w * L * d
        if "redundancy" in terms:
            c_flops += float(n) * ell * hkv * R * (R - 1) * d
        c_bytes = n * ell * hkv * d * shape.kv_bytes * ((L if terms else 0) + 8 * keep)
        compression_s += max(c_bytes / bw, c_flops / F)
        total_bytes += c_bytes
        total_flops += c_flops

    seconds = prefill_s + weight_s + attention_s + scoring_s + compression_s
    row_steps = sum(active)
    return Cost(
        seconds=seconds,
        prefill_s=prefill_s,
        weight_s=weight_s,
        attention_s=attention_s,
        scoring_s=scoring_s,
        compression_s=compression_s,
        method=method,
        decode_steps=len(kept),
        compressions=len(events),
        kv_tokens_mean=tokens / row_steps if row_steps else 0.0,
        kv_tokens_last=kept[-1] if kept else (events[0][3] if events else prompt_len),
        memory_bound_steps=memory_bound,
        bytes_read=total_bytes,
        flops=total_flops,
    )


def predicted_cost_vs_dense(
    shape: ModelShape, rates: MachineRates, n: int, prompt_len: int, response_len: int, **sparsity
) -> float:
    """Predicted seconds of this rollout / predicted seconds of the same rollout dense (lower =
    cheaper; 0.5 = twice as fast). ``sparsity``: :func:`rollout_cost`'s keyword arguments."""
    sparse = rollout_cost(shape, rates, n, prompt_len, response_len, **sparsity)
    dense = rollout_cost(shape, rates, n, prompt_len, response_len)
    return sparse.seconds / dense.seconds
