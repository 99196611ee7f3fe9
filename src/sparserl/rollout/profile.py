"""Where a decode step's time goes: ``python -m sparserl.rollout.profile``.

Runs one ``generate`` and splits its decode time (prefill excluded) into:

- ``matmul``: every product with a decoder weight (q/k/v, o, gate/up, down), i.e. each call of
  :func:`sparserl.rollout.model.linear` outside the LM head, quantized or not (``--quant``);
- ``lm_head``: the final norm and the LM head's product (:meth:`SamplerModel.final_norm` and
  :meth:`~SamplerModel.head`, or the fused step's :func:`~sparserl.rollout.fused.final_norm` and
  :func:`~sparserl.rollout.fused.head`, float even
  when the decoder's weights are quantized, unless ``--quant-head``);
- ``attention``: softmax(q Kᵀ) V over the cache (:func:`sparserl.rollout.cache.attention`);
- ``compression``: :meth:`CompressedKVCache.compress` (scoring, selection, moving the kept slots);
- ``sampling``: log-softmax, inverse-CDF draw, log-prob of the sampled token;
- ``other``: the rest, i.e. Python, RMSNorm, RoPE, residual adds, cache writes and bookkeeping;
- ``layers``: with the fused step (:mod:`sparserl.rollout.fused`, the engine's default on CPU), all
  the decoder layers at once (their products, norms, RoPE, cache writes and attention run inside
  three native calls a layer and cannot be told apart); ``--unfused`` runs the eager step,
  operator by operator, to split them as above.

Each part is timed by a wrapper around the function (the CPU runs operators synchronously; on CUDA
pass ``--sync`` so that each part waits for its kernels); a timed part called inside another (the
LM head's product inside ``lm_head``) counts for the outer one. With ``--compile`` the layer math is one
compiled function: only compression, sampling and the total are split. ``--torch-profiler`` also
prints torch.profiler's top operators by self time.

    python -m sparserl.rollout.profile --batch 16 --max-new-tokens 256 --compressor rkv --kv-budget 256 \\
        --step-length 128
    python -m sparserl.rollout.profile --job default --compressor rkv     # the default training job's shape
    python -m sparserl.rollout.profile --batch 16 --max-new-tokens 1024 --quant int8   # the quantized sampler
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

from . import cache as cache_mod
from . import decode_batch as decode_batch_mod
from . import fused as fused_mod
from . import model as model_mod
from .cache import CompressedKVCache
from .engine import RolloutEngine
from .kv import build_compressor
from .kv_quant import get_kv_quantizer
from .quant import build_quant
from .quant.outliers import check_outliers
from .quant.smooth import check_strength
from .sampling import SamplingParams

#: the benchmark's prompt (``sparserl bench rollout`` too): long free text, so no row stops early
BENCH_PROMPT = [{"role": "user", "content": "Write a long, detailed story about a dragon who learns mathematics."}]
SYSTEM = (
    "You are a careful math tutor. Read the problem, add or subtract the numbers it gives, and reply "
    "with one short sentence that ends with the final answer as a number in \\boxed{}."
)


def _timed(fn, name: str, acc: dict, active: list, sync):
    """``fn`` wrapped to add its time to ``acc[name]``; ``active`` (shared by the wrappers) holds the
    timed call under way, so that a timed part called inside another (the LM head's product inside
    ``lm_head``, linear's ``add_to`` fallback inside ``matmul``) counts for the outer one only."""

    def wrapper(*a, **kw):
        if active:
            return fn(*a, **kw)
        sync()
        active.append(name)
        t = time.perf_counter()
        try:
            out = fn(*a, **kw)
            sync()
        finally:
            acc[name] += time.perf_counter() - t
            active.pop()
        return out

    return wrapper


class Split:
    """Patch the timed functions for the duration of a ``with`` block."""

    def __init__(self, compiled: bool, sync: bool):
        self.acc: dict[str, float] = defaultdict(float)
        self.active: list = []
        self.compiled = compiled
        self.sync = torch.cuda.synchronize if sync and torch.cuda.is_available() else (lambda: None)

    def __enter__(self):
        from .model import SamplerModel

        # (owner, attribute, label); the first two fall back to an older layout of the code (a
        # SamplerModel.linear staticmethod; attention inline in CompressedKVCache.attend)
        points = [
            (model_mod, "linear", "matmul") if hasattr(model_mod, "linear") else (SamplerModel, "linear", "matmul"),
            (cache_mod, "attention", "attention")
            if hasattr(cache_mod, "attention")
            else (CompressedKVCache, "attend", "attention"),
            (CompressedKVCache, "compress", "compression"),
            (decode_batch_mod, "sample", "sampling"),
            (SamplerModel, "final_norm", "lm_head"),
            (SamplerModel, "head", "lm_head"),
            (fused_mod, "final_norm", "lm_head"),
            (fused_mod, "head", "lm_head"),
            (fused_mod, "decode_layers", "layers"),
        ]
        self.saved = []
        for owner, name, label in points:
            if self.compiled and label in ("matmul", "attention", "layers"):
                continue  # inside the compiled function: not separable
            raw = owner.__dict__[name]
            fn = raw.__func__ if isinstance(raw, staticmethod) else raw
            wrapped = _timed(fn, label, self.acc, self.active, self.sync)
            setattr(owner, name, staticmethod(wrapped) if isinstance(raw, staticmethod) else wrapped)
            self.saved.append((owner, name, raw))
        # the prefill's matmuls are not decode time: take them back out
        prefill = SamplerModel.__dict__["prefill"]

        def no_prefill(*a, **kw):
            before = dict(self.acc)
            out = prefill(*a, **kw)
            for k in list(self.acc):
                self.acc[k] = before.get(k, 0.0)
            return out

        SamplerModel.prefill = no_prefill
        self.saved.append((SamplerModel, "prefill", prefill))
        return self

    def __exit__(self, *exc):
        for owner, name, raw in self.saved:
            setattr(owner, name, raw)


def job_prompts(job: str, batch: int):
    """(prompts, n) for a shape: ``bench`` = the benchmark's prompt ``batch`` times; ``default`` = the
    default training job (system prompt + a one-digit sum, 4 prompts x 8 samples)."""
    if job == "default":
        qs = [f"What is {a} + {b}?" for a, b in [(3, 5), (7, 2), (4, 4), (9, 6)]]
        return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in qs], batch // len(qs)
    return [BENCH_PROMPT], batch


def check_quant_options(
    quant: str, quant_group: int | None, quant_smooth: float, kv_quant: str, quant_outliers: int = 0
) -> None:
    """A ValueError naming the option for an unknown quantizer name, a bad group (or a group without
    ``int8_group``), a SmoothQuant strength outside [0, 1) or a negative number of outlier channels."""
    quantizer = build_quant(quant, quant_group)
    if quant_group is not None and not quantizer.takes_group:
        raise ValueError(f"--quant-group {quant_group} applies to --quant int8_group only; --quant is {quant!r}")
    try:
        check_strength(quant_smooth)
    except ValueError as e:
        raise ValueError(f"--quant-smooth: {e}") from None
    try:
        check_outliers(quant_outliers)
    except ValueError as e:
        raise ValueError(f"--quant-outliers: {e}") from None
    get_kv_quantizer(kv_quant)


def profile(
    model: str = "smollm2-135m",
    dtype: str = "float32",
    batch: int = 16,
    max_new_tokens: int = 256,
    compressor: str = "none",
    kv_budget: int = 256,
    step_length: int = 128,
    window: int | None = None,
    compress_prompt: bool | None = None,
    job: str = "bench",
    compile: bool = False,
    seed: int = 0,
    torch_profiler: bool = False,
    sync: bool = False,
    quant: str = "none",
    quant_group: int | None = None,
    quant_smooth: float = 0.0,
    kv_quant: str = "none",
    loaded=None,
    fused: bool = True,
    quant_outliers: int = 0,
    quant_head: bool = False,
) -> dict:
    """One timed ``generate`` of the shape, split as in the module docstring; ``loaded``: an already
    loaded model (else ``model`` is loaded in ``dtype``); ``fused``: the engine's fused step where
    it runs (False: the eager step, split by operator)."""
    from ..models.loading import load_model

    if job == "default":  # the default training job's rollout settings
        batch, max_new_tokens, kv_budget, step_length = 32, 48, 40, 2
        window = 8 if window is None else window
        compress_prompt = True if compress_prompt is None else compress_prompt
    comp = build_compressor(
        compressor, kv_budget=kv_budget, step_length=step_length, window=window, compress_prompt=compress_prompt
    )
    check_quant_options(quant, quant_group, quant_smooth, kv_quant, quant_outliers)  # before the model loads
    lm = loaded if loaded is not None else load_model(model, dtype=dtype)
    eng = RolloutEngine(
        lm,
        comp,
        dtype=dtype,
        quant=quant,
        quant_group=quant_group,
        quant_smooth=quant_smooth,
        quant_outliers=quant_outliers,
        quant_head=quant_head,
        kv_quant=kv_quant,
        fused=fused,
        **({"compile": True} if compile else {}),
    )
    prompts, n = job_prompts(job, batch)
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=seed, ignore_eos=(job != "default"))
    eng.generate(prompts, SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))  # warm-up (and compile)
    table = None
    with Split(compile, sync) as split:
        if torch_profiler:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as tprofile

            with tprofile(activities=[ProfilerActivity.CPU]) as prof:
                out = eng.generate(prompts, params)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)
        else:
            out = eng.generate(prompts, params)
    decode = out.seconds - out.prefill_seconds
    parts = {k: v for k, v in split.acc.items()}
    parts["other"] = decode - sum(parts.values())
    steps = max(len(r) for r in out.response_ids)
    return {
        "job": job,
        "compressor": compressor,
        "compile": compile,
        "fused": fused and "layers" in parts,
        "batch": batch,
        "max_new_tokens": max_new_tokens,
        "quant": quant,
        "quant_group": quant_group,
        "quant_smooth": quant_smooth,
        "quant_outliers": quant_outliers,
        "quant_head": quant_head,
        "kv_quant": kv_quant,
        "kv_budget": None if compressor == "none" else kv_budget,
        "step_length": step_length,
        "tokens": out.tokens_generated,
        "seconds": out.seconds,
        "prefill_seconds": out.prefill_seconds,
        "tokens_per_s": out.tokens_per_s,
        "decode_steps": steps,
        "ms_per_step": 1e3 * decode / max(1, steps),
        "compressions": out.kv.compressions,
        "kv_bytes_peak": out.kv.bytes_peak,
        "split_seconds": parts,
        "split_fraction": {k: v / decode for k, v in parts.items()},
        "torch_profiler": table,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--compressor", default="none")
    ap.add_argument("--kv-budget", type=int, default=256)
    ap.add_argument("--step-length", type=int, default=128)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--job", choices=["bench", "default"], default="bench")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--unfused", action="store_true", help="the eager decode step, split operator by operator")
    ap.add_argument("--torch-profiler", action="store_true")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--quant", default="none", help="the sampler's weights: none | int8 | int8_group | ...")
    ap.add_argument("--quant-group", type=int, default=None, help="int8_group's inputs per weight and activation scale")
    ap.add_argument("--quant-smooth", type=float, default=0.0, help="SmoothQuant's migration strength")
    ap.add_argument("--quant-outliers", type=int, default=0, help="input channels per linear kept in float32")
    ap.add_argument("--quant-head", action="store_true", help="quantize the LM head too")
    ap.add_argument("--kv-quant", default="none", help="the KV cache's storage: none | int8 | fp8")
    ap.add_argument("--json", default=None, help="append the result as one JSON line to this file")
    a = ap.parse_args(argv)
    try:  # a bad option is one line on stderr, before anything loads
        build_compressor(a.compressor, kv_budget=a.kv_budget, step_length=a.step_length, window=a.window)
        check_quant_options(a.quant, a.quant_group, a.quant_smooth, a.kv_quant, a.quant_outliers)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    r = profile(
        a.model,
        a.dtype,
        a.batch,
        a.max_new_tokens,
        a.compressor,
        a.kv_budget,
        a.step_length,
        a.window,
        None,
        a.job,
        a.compile,
        torch_profiler=a.torch_profiler,
        sync=a.sync,
        quant=a.quant,
        quant_group=a.quant_group,
        quant_smooth=a.quant_smooth,
        kv_quant=a.kv_quant,
        fused=not a.unfused,
        quant_outliers=a.quant_outliers,
        quant_head=a.quant_head,
    )
    split = "  ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(r["split_fraction"].items(), key=lambda x: -x[1]) if v)
    quant = "" if a.quant == "none" and a.kv_quant == "none" else f" w:{a.quant} kv:{a.kv_quant}"
    print(
        f"{r['job']} {r['compressor']}{quant}{' compiled' if r['compile'] else ''}{' fused' if r['fused'] else ''} "
        f"B={r['batch']} L={r['max_new_tokens']}: "
        f"{r['tokens_per_s']:.1f} tok/s, {r['ms_per_step']:.1f} ms/step, {r['compressions']} compressions | {split}"
    )
    print(
        "ms/step: "
        + "  ".join(
            f"{k} {1e3 * v / max(1, r['decode_steps']):.1f}"
            for k, v in sorted(r["split_seconds"].items(), key=lambda x: -x[1])
            if v
        )
    )
    if r["torch_profiler"]:
        print(r["torch_profiler"])
    if a.json:
        r = {k: v for k, v in r.items() if k != "torch_profiler"}
        with open(a.json, "a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
