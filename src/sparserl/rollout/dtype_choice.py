"""The sampler's dtype for ``dtype: auto``, measured on this machine rather than guessed.

The first time ``auto`` is asked for on a machine, the sampler's decode step is timed in float32 and
in bfloat16 (the engine's own step: the fused C step where it runs, else torch's), on a model of the
default model's shape (SmolLM2-135M's config with random weights: nothing is loaded), batch 16, a
dense cache behind a 4-token prompt (a short prefill: the step, not the prefill, is timed). Rounds
alternate the two dtypes; each round's ratio is taken in the same process and the median of those
ratios decides (a few seconds in all). The answer is cached per CPU (its model name and instruction
sets), device, torch version, native kernels on or off, and :data:`MEASURE_VERSION` in
``dtype_auto.json`` beside the native kernels (``$SPARSERL_NATIVE_CACHE``, default
``~/.cache/sparserl/native``), so a new CPU or a new torch measures again.

Why measure: which dtype is faster depends on the CPU and on our kernels. The fused C step is float32:
on an AVX512-BF16 Xeon without AMX it ran 1.53x the bf16 step; on an AVX2-only CPU bf16 products are
emulated; on an AMX Xeon our float32 step ran 316 tok/s against our bfloat16's 283, so the AMX flag
alone does not decide.

The engine times itself: it passes its own class (``engine``) and this module builds the probe's
engines from it, so this module sits below :mod:`sparserl.rollout.engine`;
:mod:`sparserl.rollout.dtype_auto` answers callers that hold no engine. Only the sampler's dtype is
chosen here (``rollout.dtype`` / ``--dtype``); the learner's ``model.dtype`` stays its own option. On
CUDA the same measurement runs on the GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .. import json_cache
from ..models.loading import DTYPES, IdsOnlyTokenizer, LoadedModel, ModelLoadError, resolve_device
from ..models.machine import device_label
from ..models.measure_apart import run_apart
from . import native
from .kv import build_compressor
from .sampling import SamplingParams

#: bump when the measurement or the kernels it times change enough to redo every cached answer
MEASURE_VERSION = 3  # the bf16 step fused (linear_bf16.c, a bf16 KV cache in the C attention), on its measured kernel
CACHE_FILE = "dtype_auto.json"
CANDIDATES = ("float32", "bfloat16")
BATCH, PROMPT_TOKENS, STEPS, ROUNDS = 16, 4, 8, 3


@dataclass
class AutoChoice:
    """What ``auto`` chose and why (recorded in the bench JSON and the run's config)."""

    dtype: str
    reason: str
    key: str
    seconds_per_step: dict = field(default_factory=dict)  # dtype -> median seconds of one decode step
    ratio_rounds: list = field(default_factory=list)  # per round: bfloat16 step time / float32 step time
    measured_at: str = ""
    cached: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def machine_key(device: torch.device) -> str:
    """The cache key: device (and GPU name), CPU model and its instruction sets, torch, kernels."""
    where = device_label(device)
    kernels = "native" if device.type == "cpu" and native.enabled() else "torch"
    return f"{where} | torch {torch.__version__} | kernels {kernels} | v{MEASURE_VERSION}"


def _cache_path() -> Path:
    return native.cache_dir() / CACHE_FILE


def _read_cache() -> dict:
    return json_cache.read(_cache_path())


def _write_cache(data: dict) -> None:
    json_cache.write(_cache_path(), data, "dtype auto")


def probe_model(device: torch.device) -> LoadedModel:
    """A model of SmolLM2-135M's shape with seeded random weights (no load, no download; built on the
    meta device and filled directly: transformers' own initialisation takes seconds longer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).eval()
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for name, buf in model.named_buffers():  # RoPE's inverse frequencies, not parameters
            if "inv_freq" in name:
                dim = buf.numel() * 2
                buf.copy_(1.0 / 100000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    return LoadedModel(model, IdsOnlyTokenizer(), "dtype-auto-probe", None)


def decode_step_seconds(engine) -> float:
    """Seconds of one decode step of ``engine`` (batch :data:`BATCH`, dense cache): the median over
    :data:`STEPS` steps of one generation."""
    prompts = [[(7 * i + 11 * b) % 1000 + 10 for i in range(PROMPT_TOKENS)] for b in range(BATCH)]
    times = []
    engine.step_hook = _step_timer(times, engine.device)
    try:
        engine._generate_batch(prompts, SamplingParams(max_new_tokens=STEPS + 1, ignore_eos=True), torch.arange(BATCH))
    finally:
        engine.step_hook = None
    return statistics.median(times)


def _step_timer(times: list, device: torch.device):
    start = [0.0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def hook(event, **_):
        if event == "sample":
            return
        sync()
        if event == "before_decode":
            start[0] = time.perf_counter()
        elif event == "after_decode":
            times.append(time.perf_counter() - start[0])

    return hook


def engine_timer(engine, device: torch.device):
    """``timer(dtype name) -> seconds of one decode step``: one ``engine`` (the engine class) a dtype over
    the probe model, each warmed up once (packing, first allocations, thread pool)."""
    lm = probe_model(device)
    engines = {}
    for name in CANDIDATES:
        engines[name] = engine(lm, build_compressor("none"), dtype=DTYPES[name])
        decode_step_seconds(engines[name])
    return lambda name: decode_step_seconds(engines[name])


def check_timer(timer, engine) -> None:
    """A measurement times with ``timer``, else with engines of the class ``engine``: one of them is given."""
    if timer is None and engine is None:
        raise ValueError("a measurement needs a timer or the engine class to time (engine=RolloutEngine)")


def measure(device: torch.device, timer=None, engine=None) -> AutoChoice:
    """Time both candidates (:data:`ROUNDS` rounds, each timing both) and choose the faster.
    ``timer(dtype name)`` returns seconds of one decode step (tests pass a fake); else ``engine`` (the
    engine class) is timed on the probe model (:func:`engine_timer`)."""
    check_timer(timer, engine)
    timer = timer or engine_timer(engine, device)
    per = {name: [] for name in CANDIDATES}
    ratios = []
    for k in range(ROUNDS):
        for name in CANDIDATES if k % 2 == 0 else CANDIDATES[::-1]:  # alternate which goes first
            per[name].append(timer(name))
        ratios.append(per["bfloat16"][-1] / per["float32"][-1])
    ratio = statistics.median(ratios)
    chosen = "bfloat16" if ratio < 1.0 else "float32"
    slower = "float32" if chosen == "bfloat16" else "bfloat16"
    speedup = 1 / ratio if chosen == "bfloat16" else ratio
    reason = (
        f"measured: a {chosen} decode step is {speedup:.2f}x {slower}'s (median of {ROUNDS} per-round "
        f"ratios, SmolLM2-135M's shape, batch {BATCH})"
    )
    return AutoChoice(
        chosen,
        reason,
        machine_key(device),
        {n: statistics.median(v) for n, v in per.items()},
        [round(r, 4) for r in ratios],
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def choose(device: str | torch.device = "auto", timer=None, log=print, engine=None) -> AutoChoice:
    """The sampler's dtype for ``auto`` on ``device``: the cached answer for this machine, else measured
    now with ``timer`` or the engine class ``engine`` (:func:`measure`) and cached."""
    dev = resolve_device(device)
    key = machine_key(dev)
    cached = _read_cache().get(key)
    if isinstance(cached, dict) and cached.get("dtype") in CANDIDATES:
        return AutoChoice(**{**cached, "cached": True})
    log(f"dtype auto: timing the sampler's decode step in float32 and bfloat16 on {key} (once) ...")
    check_timer(timer, engine)
    # a fake timer (tests) in place; the engines on the probe model in a child process (:mod:`.measure_apart`)
    choice = measure(dev, timer, engine) if timer is not None else run_apart(measure, dev, None, engine)
    log(f"dtype auto: {choice.dtype} ({choice.reason}); cached in {_cache_path()}")
    data = _read_cache()
    data[key] = choice.to_dict()
    _write_cache(data)
    return choice


def for_sampler(choice: AutoChoice, quant: str = "none") -> AutoChoice:
    """``choice`` for a sampler with these weights: a bfloat16 answer stands where the fused bf16 step
    covers the sampler (unquantized weights), else float32 with the reason: int8 / fp8 weights have no
    fused bf16 step and would run eager in bf16, slower than their float32 kernels."""
    if choice.dtype != "bfloat16" or quant == "none":
        return choice
    return replace(
        choice,
        dtype="float32",
        reason=f"{choice.reason}; but rollout.quant={quant} has no fused bfloat16 step, so float32",
    )


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "auto", engine=None) -> torch.dtype:
    """A sampler dtype name (``auto`` | ``float32`` | ``bfloat16`` | ``float16``) or torch dtype as a
    torch dtype; ``auto`` is :func:`choose`'s answer for ``device`` (measured with ``engine`` where no
    answer is cached)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return DTYPES[choose(device, engine=engine).dtype]
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected auto or one of {sorted(DTYPES)}")
    return DTYPES[dtype]
