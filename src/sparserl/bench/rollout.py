"""``sparserl bench rollout``: transformers' ``generate`` (dense, the baseline), sparserl dense and
sparserl with each compressor, and optionally peers (``--peers openvino``:
:mod:`sparserl.bench.openvino_peer`), side by side in one process, all generating exactly L tokens
per sequence from the same prompt. Every row runs ``repeat`` times, in rounds
(:mod:`sparserl.bench.measure`); a ratio is the median of the per-round ratios, against the
``generate`` row and the sparserl dense row of the same process.

Fields per result: engine, compressor, batch, max_new_tokens, kv_budget, tokens_per_s (the median
of ``tokens_per_s_runs``, one per run), ratio_vs_hf_generate, ratio_vs_sparserl_dense,
kv_bytes_peak (allocated for K/V), kv_bytes_theory (what the kept tokens need), rss_peak_bytes
(process RSS sampled during the runs), roofline_fraction, roofline_bound ("memory" | "compute") and
roofline_tokens_per_s (:mod:`sparserl.bench.roofline`, from the machine's measured bandwidth and
GEMM throughput, ``machine.memory_bandwidth_bytes_per_s`` and ``machine.gemm_flops_per_s``; a
quantized row's from the bytes its weights and KV cache hold and its own products' measured rate,
``gemm_flops_per_s_by_quant``).
A bfloat16 row on the native kernels names its weight products' kernel in ``bf16_kernel`` (``amx``,
``avx512_bf16``, ...); the machine record's ``bf16_kernel_choice`` says why that one (measured once per
machine where the CPU has two, :mod:`sparserl.rollout.bf16_kernel_choice`).
A peer that cannot run here is listed under ``peers_skipped`` with the reason and how to install it.
Every sparserl row of the unquantized sampler also carries ``predicted_ratio_vs_dense``: the cost model's
(:mod:`sparserl.cost`) dense seconds over the row's, on the measured bandwidth and GEMM rate (None
for a method it has no terms for, e.g. H2O). Block top-k (``blocktopk``) rows read ``kv_budget / 16``
pages a step in every layer but the first two; their K/V bytes are the dense row's (nothing is
evicted; the page key sums, 1/16 of the keys in float32, are not K/V).

Quantized samplers (``quants``, ``kv_quants``: weight and KV quantization, :mod:`sparserl.rollout.quant`
and :mod:`sparserl.rollout.kv_quant`): every combination other than ``none``/``none`` adds sparserl
rows (one per compressor) over its own engine. Every sparserl row carries ``quant``, ``kv_quant``,
``weight_bytes`` (the sampler's weights as held), ``quant_kernel``, ``quant_emulated`` (the
low-precision product simulated in float32: numbers, not speed) and ``quantize_s`` (one
re-quantization of all weights, as at a push from the learner); the quantized rows with the dense
cache add the per-token mismatch against the dense sampler of the same process
(:mod:`sparserl.bench.mismatch`: ``alpha_mean``, ``alpha_p5``, ``k3_kl``, ``mismatch_tokens``, over
``mismatch_rows`` sequences of the same length).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
from pathlib import Path

import torch

from ..cost import MachineRates, ModelShape, rollout_cost
from ..memory.rollout_rows import device_rows_that_fit, engine_row_bytes
from ..models.hf_cache import output_cache
from ..models.loading import load_model, resolve_device
from ..rollout import fused, native
from ..rollout.dtype_auto import choose, for_sampler, resolve_dtype
from ..rollout.engine import RolloutEngine
from ..rollout.kv import CompressorOptionError, KVCompressor, build_compressor
from ..rollout.kv.schedule import ScheduleError, load_schedule
from ..rollout.kv_quant import get_kv_quantizer, kv_bytes_per_token
from ..rollout.profile import BENCH_PROMPT
from ..rollout.quant import build_quant
from ..rollout.quant.outliers import check_outliers_fit
from ..rollout.sampling import SamplingParams
from .machine import decode_linear_weights, gemm_flops_per_s, machine_info, memory_bandwidth
from .measure import Row, RssSampler, Run, median_round_ratio, run_rounds
from .mismatch import sampler_mismatch
from .openvino_peer import PeerUnavailable, openvino_rows
from .roofline import decode_step_flops, mean_kv_tokens, roofline

PEERS = ("openvino",)
KERNELS = ("native", "torch")  # --kernels: the C kernels (attention, weight products; where they apply), torch's ops

__all__ = ["BENCH_PROMPT", "KERNELS", "PEERS", "RssSampler", "bench_compressor", "run_bench", "write_json"]


def _hf_generate_run(lm, prompt_ids: list[int], batch: int, L: int, seed: int) -> Run:
    model = lm.model
    ids = torch.tensor([prompt_ids] * batch, device=model.device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=L,
            min_new_tokens=L,
            return_dict_in_generate=True,
            pad_token_id=lm.tokenizer.pad_token_id,
        )
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        seconds = time.perf_counter() - t
    gen = out.sequences.shape[1] - ids.shape[1]
    kv = 0
    for layer in getattr(output_cache(out), "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None:
                kv += tensor.numel() * tensor.element_size()
    return Run(seconds, batch * gen, kv, 0)


def bench_compressor(
    name: str, kv_budget: int, step_length: int, compress_prompt: bool | None = None, tail_slack: int = 0
) -> KVCompressor:
    """The compressor a benchmark row runs: the method's defaults at this budget, with the
    observation window cut to a quarter of the budget when the default does not fit (e.g.
    SnapKV's 32-query window at a small budget). ``none`` is the dense cache. ``compress_prompt``:
    the prompt joins the compressible region (None: the method's default), so the buffer is
    ``budget + step_length`` slots like an engine that evicts over the whole sequence.
    ``tail_slack``: spare slots for skipping the compressions of a generation's last tokens
    (``rollout.tail_slack``)."""
    small_window = dict(
        kv_budget=kv_budget,
        step_length=step_length,
        window=max(1, kv_budget // 4),
        compress_prompt=compress_prompt,
        tail_slack=tail_slack,
    )
    try:
        comp = build_compressor(
            name, kv_budget=kv_budget, step_length=step_length, compress_prompt=compress_prompt, tail_slack=tail_slack
        )
    except CompressorOptionError:
        return build_compressor(name, **small_window)
    if comp.compresses and comp.window >= kv_budget // 2 and name != "h2o":
        return build_compressor(name, **small_window)
    return comp


def scheduled_compressors(
    path: str, names: list[str], step_length: int, compress_prompt: bool | None, tail_slack: int
) -> list[KVCompressor]:
    """One compressor per name in ``names`` that ``path`` holds a schedule for (a plain schedule: every
    name; ``sparserl calibrate``'s output: the names it calibrated), with the bench's other options.
    The observation window is cut to a quarter of the smallest budget where the method's own does not
    fit. Raises :class:`ScheduleError` when the file is bad or fits none of them."""
    out, misses = [], []
    for name in names:
        try:
            schedule = load_schedule(path, name, source=path)
        except ScheduleError as e:
            if "no schedule for compressor" not in str(e):
                raise
            misses.append(str(e))
            continue
        common = dict(
            kv_schedule=schedule, step_length=step_length, compress_prompt=compress_prompt, tail_slack=tail_slack
        )
        try:
            comp = build_compressor(name, **common)
        except CompressorOptionError:  # the method's window does not fit the smallest budget: as bench_compressor
            comp = build_compressor(name, window=max(1, schedule.min_budget // 4), **common)
        out.append(comp)
    if not out:
        raise ScheduleError(misses[0] if misses else f"{path}: no compressor to schedule (--compressors is empty)")
    return out


def mean_scheduled_kv_tokens(comp: KVCompressor, prompt_tokens: int, new_tokens: int) -> float:
    """Mean cached tokens per sequence over the decode steps under a schedule: at each length the
    cache holds at most the prompt (unless compressible) + that length's budget + half a period."""
    fixed = 0 if comp.compress_prompt else prompt_tokens
    total = 0.0
    for t in range(new_tokens):
        length = prompt_tokens + t
        total += min(length, fixed + comp.budget_for(length) + comp.step_length / 2)
    return total / max(1, new_tokens)


def mean_kept_cap(comp: KVCompressor, prompt_tokens: int, kv_budget: int, step_length: int) -> float | None:
    """The mean number of kept tokens per sequence once a compressing cache is full (None: dense):
    it cycles between ``budget`` and ``budget + step_length`` compressible tokens, after the whole
    prompt unless the prompt is compressible too."""
    if not comp.evicts:
        return None
    return (0 if comp.compress_prompt else prompt_tokens) + kv_budget + step_length / 2


def cost_model_terms(comp: KVCompressor) -> dict | None:
    """:func:`sparserl.cost.rollout_cost`'s keyword arguments for a row's compressor ({}: dense), or None
    where the cost model has no terms for it (H2O's scores, block top-k with a schedule)."""
    if not comp.compresses:
        return {}
    if comp.selects_per_step:
        return (
            None
            if comp.schedule is not None
            else {"blocktopk_pages": comp.budget // 16, "dense_layers": comp.dense_layers}
        )
    if comp.name in ("rkv", "snapkv", "streaming") and comp.trigger == "step_length":
        return {"compressor": comp}
    return None


def predicted_ratio(
    shape: ModelShape, rates: MachineRates, n: int, prompt_tokens: int, new_tokens: int, comp: KVCompressor
) -> tuple[float | None, float | None]:
    """(the cost model's predicted tokens/s of this row over the dense row, its mean tokens attended per
    sequence and layer over the decode steps), or (None, None) without cost terms for the method."""
    terms = cost_model_terms(comp)
    if terms is None:
        return None, None
    row = rollout_cost(shape, rates, n, prompt_tokens, new_tokens, **terms)
    dense = rollout_cost(shape, rates, n, prompt_tokens, new_tokens)
    return dense.seconds / row.seconds, row.kv_tokens_mean


def _sparserl_run(engine: RolloutEngine, params: SamplingParams, kernels: str = "native") -> Run:
    with native.torch_only() if kernels == "torch" else contextlib.nullcontext():
        out = engine.generate([BENCH_PROMPT], params)
    return Run(
        out.seconds,
        out.tokens_generated,
        out.kv.bytes_peak,
        out.kv.bytes_theory,
        extra={"kv_bytes_dense": out.kv.bytes_dense, "compressions": out.kv.compressions},
    )


def _peer_rows(peer: str, **kw) -> list[Row]:
    if peer == "openvino":
        return openvino_rows(**kw)
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


def sparserl_commit() -> str | None:
    """The sparserl commit measured (``+dirty`` when the work tree differs), when run from a checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", str(here.parent)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_bench(
    model: str = "smollm2-135m",
    batch: int = 16,
    max_new_tokens: int = 256,
    kv_budget: int = 256,
    compressors: list[str] | None = None,
    dtype: str = "auto",
    step_length: int = 128,
    seed: int = 0,
    hf_baseline: bool = True,
    repeat: int = 1,
    peers: list[str] | tuple = (),
    compile: bool = False,
    quants: list[str] | tuple = ("none",),
    kv_quants: list[str] | tuple = ("none",),
    mismatch_rows: int = 4,
    compress_prompt: bool | None = None,
    quant_smooth: float = 0.0,
    quant_group: int | None = None,
    quant_outliers: int = 0,
    quant_head: bool = False,
    kernels: list[str] | tuple = ("native",),
    tail_slack: int = 0,
    device: str = "auto",
    kv_schedule: str | None = None,
    log=print,
) -> dict:
    """``device``: where every sparserl row and the transformers baseline run (``auto``: CUDA when
    available, else the CPU; a peer engine that cannot run there is skipped with its reason).
    ``kernels``: the decode-step kernels to time (:data:`KERNELS`); each one after the first adds
    the dense and compressor rows again with those kernels (``torch``: torch's batched matmuls for
    attention and oneDNN's packed products for the weights, in the same process); the quantized rows
    run with the first. Every sparserl row carries ``kernels``, what ran (``native`` falls back to
    ``torch`` where the C kernels do not apply: GPU, bfloat16), and ``fused``, whether its decode
    layers ran as the fused native step (:mod:`sparserl.rollout.fused`). ``kv_schedule``: a schedule
    file (:func:`scheduled_compressors`) adding a row per compressor it fits, with ``kv_schedule`` set."""
    for kernel in kernels:
        if kernel not in KERNELS:
            raise ValueError(f"kernels {kernel!r}; known: {', '.join(KERNELS)}")
    compressors = compressors if compressors is not None else ["rkv", "snapkv", "streaming", "h2o"]
    for q in quants:  # an unknown name or a bad group fails now, with a hint, before the model loads
        build_quant(q, group=quant_group)
    for kq in kv_quants:
        get_kv_quantizer(kq)
    dev = resolve_device(device, key="--device")
    # auto: one dtype for every row; float32 where a quantized row has no fused bf16 step
    choice = for_sampler(choose(dev), next((q for q in quants if q != "none"), "none")) if dtype == "auto" else None
    dt = resolve_dtype(choice.dtype if choice else dtype)
    dtype_name = str(dt).replace("torch.", "")
    lm = load_model(model, dtype=dt, device=dev)
    if quant_outliers and any(build_quant(q).quantizes_activations for q in quants):
        check_outliers_fit(quant_outliers, lm.model.config)  # before any row runs
    L = max_new_tokens
    params = SamplingParams(n=batch, max_new_tokens=L, ignore_eos=True, seed=seed)
    dense_engine = RolloutEngine(lm, build_compressor("none"), dtype=dt)
    prompt_ids = dense_engine.encode(BENCH_PROMPT)
    P = len(prompt_ids)
    sm = dense_engine.model
    per_tok = sm.kv_bytes_per_token()
    weight_bytes = sm.decode_read_bytes()
    linear_elements = sum(w.numel() for w in decode_linear_weights(sm))
    # warm-up (allocator, BLAS threads)
    dense_engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
    if "torch" in kernels:  # its weights' oneDNN copies are made on first use: not inside a timed run
        with native.torch_only():
            dense_engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
    bw = memory_bandwidth(device=dev)
    gemm = gemm_flops_per_s(sm, batch)
    shape, rates = ModelShape.from_config(lm.model.config, dt), MachineRates(bw, gemm)
    # each row's ceilings: the bytes its sampler's weights and KV cache hold, its own products' rate
    ceilings = {("none", "none"): (weight_bytes, per_tok, gemm)}

    def quant_fields(engine: RolloutEngine, kv_quant: str, kernel: str = kernels[0]) -> dict:
        m = engine.model
        ran = "torch" if kernel == "torch" else native.kernels(m.device, m.dtype)
        return {
            "quant": m.quant,
            "kv_quant": kv_quant,
            "quant_smooth": m.quant_smooth,
            "quant_outliers": m.quant_outliers,
            "quant_head": m.quant_head,
            "quant_group": getattr(m.quantizer, "group", None),
            "weight_bytes": m.weight_bytes(),
            # the batch that grows with the KV saved: one response's buffers at this sampler's cache capacity,
            # and (CUDA) how many fit the device's free memory now (sparserl.memory.rollout_rows)
            "rollout_row_bytes": engine_row_bytes(engine, P, L),
            "rows_in_free_device_memory": device_rows_that_fit(engine, P, L),
            "quant_kernel": m.quant_kernel,
            "quant_emulated": m.quant_emulated,
            "quantize_s": m.last_quantize_s,
            "kernels": ran,
            "bf16_kernel": m.bf16_kernel if ran == "native" else None,
            "fused": ran == "native" and engine.fused and not engine.compile and fused.available(m),
        }

    rows: list[Row] = []
    if hf_baseline:
        rows.append(
            Row(
                {"engine": "hf_generate", "compressor": "none", "kv_budget": None},
                lambda: _with_theory(_hf_generate_run(lm, prompt_ids, batch, L, seed), batch * per_tok * (P + L - 1)),
                mean_kv_tokens(P, L),
            )
        )
    variants = [(False, kernel) for kernel in kernels] + ([(True, "torch")] if compile else [])
    for compiled, kernel in variants:  # the compiled step runs torch's attention (the kernel is not traced)
        for name in ["none", *(c for c in compressors if c != "none")]:
            comp = bench_compressor(name, kv_budget, step_length, compress_prompt, tail_slack)
            if compiled and comp.selects_per_step:  # the compiled step cannot choose pages per step
                continue
            engine = RolloutEngine.from_engine(dense_engine, comp) if comp.compresses or compiled else dense_engine
            if compiled:  # the same weights, the decode step through torch.compile (inductor)
                engine.compile = "inductor"
                engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))  # compiles
            # kept tokens grow from P to P + budget + period, then cycle between P + budget and that
            cap = mean_kept_cap(comp, P, kv_budget, step_length)
            predicted, read = predicted_ratio(shape, rates, batch, P, L, comp)
            rows.append(
                Row(
                    {
                        "engine": "sparserl",
                        "compressor": name,
                        "kv_budget": kv_budget if comp.compresses else None,
                        "compress_prompt": comp.evicts and comp.compress_prompt,
                        "tail_slack": comp.tail_slack if comp.evicts else None,
                        "compiled": compiled,
                        "predicted_ratio_vs_dense": predicted,
                        **quant_fields(engine, "none", kernel),
                    },
                    lambda engine=engine, kernel=kernel: _sparserl_run(engine, params, kernel),
                    read if comp.selects_per_step else mean_kv_tokens(P, L, cap),
                )
            )
    scheduled = [c for c in compressors if c != "none"]
    for comp in (
        scheduled_compressors(kv_schedule, scheduled, step_length, compress_prompt, tail_slack) if kv_schedule else ()
    ):
        engine = RolloutEngine.from_engine(dense_engine, comp)
        rows.append(
            Row(
                {
                    "engine": "sparserl",
                    "compressor": comp.name,
                    "kv_budget": comp.budget,
                    "kv_schedule": comp.schedule.pairs,
                    "compress_prompt": comp.compress_prompt,
                    "tail_slack": comp.tail_slack,
                    "compiled": False,
                    **quant_fields(engine, "none"),
                },
                lambda engine=engine: _sparserl_run(engine, params, kernels[0]),
                mean_scheduled_kv_tokens(comp, P, L),
            )
        )
    quant_engines = {}
    for q, kq in itertools.product(quants, kv_quants):
        if (q, kq) == ("none", "none"):
            continue
        w8a8 = build_quant(q).quantizes_activations  # SmoothQuant and outlier channels: W8A8-style rows only
        qe = RolloutEngine(
            lm,
            build_compressor("none"),
            dtype=dt,
            quant=q,
            quant_smooth=quant_smooth if w8a8 else 0.0,
            kv_quant=kq,
            quant_group=quant_group,
            quant_outliers=quant_outliers if w8a8 else 0,
            quant_head=quant_head and build_quant(q).quantizes,
        )
        qe.model.load_weights(lm.model.state_dict())  # time one re-quantization, as at a push
        with native.torch_only() if kernels[0] == "torch" else contextlib.nullcontext():  # the rows' kernels
            qe.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))  # warm-up
        quant_engines[q, kq] = qe
        with native.torch_only() if kernels[0] == "torch" else contextlib.nullcontext():
            ceilings[q, kq] = (
                qe.model.decode_read_bytes(),
                kv_bytes_per_token(sm.n_layers, sm.n_kv, sm.head_dim, sm.dtype, kq),
                gemm if q == "none" else gemm_flops_per_s(qe.model, batch),
            )
        for name in ["none", *(c for c in compressors if c != "none")]:
            comp = bench_compressor(name, kv_budget, step_length, compress_prompt, tail_slack)
            engine = RolloutEngine.from_engine(qe, comp) if comp.compresses else qe
            cap = mean_kept_cap(comp, P, kv_budget, step_length)
            rows.append(
                Row(
                    {
                        "engine": "sparserl",
                        "compressor": name,
                        "kv_budget": kv_budget if comp.compresses else None,
                        "compress_prompt": comp.compresses and comp.compress_prompt,
                        "tail_slack": comp.tail_slack if comp.compresses else None,
                        "compiled": False,
                        **quant_fields(qe, kq),
                    },
                    lambda engine=engine: _sparserl_run(engine, params, kernels[0]),
                    mean_kv_tokens(P, L, cap),
                )
            )
    skipped = {}
    for peer in peers:
        try:
            if dev.type != "cpu":
                raise PeerUnavailable(f"{peer}: a CPU engine, and this bench runs on {dev}; rerun with --device cpu")
            rows += _peer_rows(
                peer,
                lm=lm,
                model=model,
                dtype=dtype_name,
                batch=batch,
                max_new_tokens=L,
                kv_budget=kv_budget,
                prompt_ids=prompt_ids,
                kv_bytes_per_token=per_tok,
                threads=torch.get_num_threads(),
                seed=seed,
                quants=quants,
                log=log,
            )
        except PeerUnavailable as e:
            log(str(e))
            skipped[peer] = str(e)

    def bound(row: Row):
        kv_avg = row.kv_tokens_avg
        flops = decode_step_flops(batch, linear_elements, sm.n_layers, sm.n_heads, sm.head_dim, kv_avg)
        w_bytes, kv_tok, rate = ceilings.get(
            (row.fields.get("quant", "none"), row.fields.get("kv_quant", "none")), ceilings["none", "none"]
        )  # a peer: sparserl's of its precision
        return roofline(batch, w_bytes + batch * kv_tok * kv_avg, flops, bw, rate)

    def log_run(row: Row, run: Run) -> None:
        f = row.fields
        quant = f"w:{f['quant']} kv:{f['kv_quant']}" if f.get("quant") else ""
        log(
            f"{f['engine'] + ('+compile' if f.get('compiled') else ''):>16} {f['compressor']:>9} {quant:>24} "
            f"run {len(row.runs)}/{repeat}: {run.tokens / run.seconds:8.1f} tok/s  "
            f"kv_peak {run.kv_bytes_peak / 2**20:8.1f} MiB  kv_theory {run.kv_bytes_theory / 2**20:8.1f} MiB  "
            f"rss {run.rss_peak_bytes / 2**20:7.0f} MiB  "
            f"roofline {run.tokens / run.seconds / bound(row).tokens_per_s:.2f}"
        )

    run_rounds(rows, repeat, log_run)
    results = []
    for row in rows:
        b, last = bound(row), row.runs[-1]
        results.append(
            {
                **row.fields,
                "batch": batch,
                "max_new_tokens": L,
                "tokens_per_s": row.tokens_per_s,
                "tokens_per_s_runs": row.tokens_per_s_runs,
                "ratio_vs_hf_generate": None,
                "kv_bytes_peak": max(r.kv_bytes_peak for r in row.runs),
                "kv_bytes_theory": max(r.kv_bytes_theory for r in row.runs),
                "rss_peak_bytes": max(r.rss_peak_bytes for r in row.runs),
                "roofline_fraction": row.tokens_per_s / b.tokens_per_s,
                "roofline_bound": b.bound,
                "roofline_tokens_per_s": b.tokens_per_s,
                **last.extra,
            }
        )
    base = next((r["tokens_per_s_runs"] for r in results if r["engine"] == "hf_generate"), None)
    dense = next(
        r["tokens_per_s_runs"]
        for r in results  # the first kernel's dense row
        if r["engine"] == "sparserl"
        and r["compressor"] == "none"
        and not r["compiled"]
        and r["quant"] == "none"
        and r["kv_quant"] == "none"
    )
    for r in results:  # medians of per-round ratios (each round in this process), not ratios of medians
        r["ratio_vs_hf_generate"] = median_round_ratio(r["tokens_per_s_runs"], base) if base else None
        r["ratio_vs_sparserl_dense"] = median_round_ratio(r["tokens_per_s_runs"], dense)
    for (q, kq), qe in quant_engines.items():  # after the timed runs: they are not disturbed
        mm = sampler_mismatch(qe, sm, BENCH_PROMPT, min(mismatch_rows, batch), L, seed)
        log(
            f"mismatch w:{q} kv:{kq} vs dense: alpha mean {mm['alpha_mean']:.4f} p5 {mm['alpha_p5']:.4f} "
            f"k3 {mm['k3_kl']:.2e} over {mm['mismatch_tokens']} tokens"
        )
        for r in results:
            if r["engine"] == "sparserl" and r["compressor"] == "none" and (r["quant"], r["kv_quant"]) == (q, kq):
                r.update(mm)
    info = machine_info(bw, gemm, batch, device=dev)
    bf16_choice = dense_engine.bf16_kernel_choice
    info.update(
        dtype=dtype_name,
        dtype_auto=choice.to_dict() if choice else None,
        bf16_kernel_choice=bf16_choice.to_dict() if bf16_choice else None,
        model=model,
        prompt_tokens=P,
        repeat=repeat,
        sparserl_commit=sparserl_commit(),
    )
    info["gemm_flops_per_s_by_quant"] = {f"{q}/{kq}": c[2] for (q, kq), c in ceilings.items()}
    report = {"machine": info, "results": results}
    if skipped:
        report["peers_skipped"] = skipped
    return report


def _with_theory(run: Run, kv_bytes_theory: int) -> Run:
    run.kv_bytes_theory = kv_bytes_theory
    return run


def write_json(report: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2))
