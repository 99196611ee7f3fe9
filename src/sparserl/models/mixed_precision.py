"""Mixed precision for the learner (``model.mixed_precision``): its forwards and backward in bfloat16,
its weights, gradients and AdamW state in float32.

Under ``bfloat16`` every learner forward of a step (the old policy's scoring, the reference's, the
update's forward; α's ``p``) runs inside ``torch.autocast(device, bfloat16)``: the linear layers
multiply bfloat16 copies of the float32 weights with float32 accumulation, while the residual
stream, the RMSNorms, softmax and the log-probs stay float32 (autocast's rules). The backward runs the
same products in bfloat16 (autograd keeps the dtype autocast chose); the gradients land on the float32
weights, and AdamW updates those. This is TRL's ``bf16=True`` (accelerate's autocast over float32
weights) and verl's FSDP ``mixed_precision`` with ``param_dtype: bf16``: the rounding of 16-bit
products, never of the weights or of Adam's moments.

The scoring and the update share one setting, so at a step's first update the PPO ratio
``exp(log π_θ − log π_old)`` is exactly 1 (the same kernels on the same weights).

``auto`` measures, once per machine, rather than guessing from the CPU's flags: bfloat16 products are
native on AMX, AVX512-BF16 and CUDA since Ampere, emulated on AVX2. The probe times a forward and
backward shaped like the default model's learner step (SmolLM2-135M's linear layers over
:data:`PROBE_ROWS` token rows, and its LM head over :data:`HEAD_ROWS`; random weights, nothing loaded)
in float32 and under bfloat16 autocast, :data:`ROUNDS` rounds in alternating order, and takes
bfloat16 when the median of the per-round ratios (float32 seconds / bfloat16 seconds) is at least
:data:`AUTO_MIN_SPEEDUP`: below that, exact float32 costs little. A first round in which bfloat16 is
slower than :data:`HOPELESS` times float32's speed stops there (with oneDNN held to AVX2 here, bf16 ran
at 0.035x: 6 s a round). The answer is cached per device, CPU model and instruction sets, and torch
version in ``mixed_precision_auto.json`` beside the sampler's ``dtype_auto.json``
(``$SPARSERL_NATIVE_CACHE``). ``sparserl bench learner`` measures the whole step.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from .. import json_cache
from .loading import parse_dtype, resolve_device
from .machine import cache_dir, device_label
from .measure_apart import run_apart

MODES = ("auto", "off", "bfloat16")
AUTO_MIN_SPEEDUP = 1.1
HOPELESS = 0.25  # a first round where bf16 is this slow ends the measurement (emulated bf16: 0.035x, AVX2)
PROBE_ROWS, HEAD_ROWS, ROUNDS = 512, 128, 3
CACHE_FILE = "mixed_precision_auto.json"
MEASURE_VERSION = 1
# SmolLM2-135M's per-layer products (in, out): q, k, v, o, gate, up, down; its LM head [49152, 576]
LAYER_SHAPES = ((576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576))
HEAD_SHAPE = (576, 49152)


@dataclass
class PrecisionChoice:
    """What ``auto`` chose and why (logged, and recorded with the run's config)."""

    mode: str
    reason: str
    key: str
    seconds: dict = field(default_factory=dict)  # mode -> median seconds of the probe's forward + backward
    ratio_rounds: list = field(default_factory=list)  # per round: float32 seconds / bfloat16 seconds
    measured_at: str = ""
    cached: bool = False


_CHOSEN: dict[str, PrecisionChoice] = {}  # this process's answers, by machine key


@functools.cache
def machine_key(device: torch.device) -> str:
    return f"{device_label(device)} | torch {torch.__version__} | learner v{MEASURE_VERSION}"


def _cache_path():
    return cache_dir() / CACHE_FILE


def _write_cache(key: str, choice: PrecisionChoice) -> None:
    path = _cache_path()
    json_cache.write(path, {**json_cache.read(path), key: asdict(choice)}, "mixed precision auto")


def probe_timer(device: torch.device):
    """``timer(mode) -> seconds`` of one forward and backward of the probe (see the module docstring)
    with ``mode`` ``off`` (float32) or ``bfloat16`` (autocast), each warmed up once."""
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [
        torch.randn(o, i, generator=gen, device=device).mul_(0.02).requires_grad_(True)
        for i, o in (*LAYER_SHAPES, HEAD_SHAPE)
    ]
    rows = {
        width: torch.randn(PROBE_ROWS, width, generator=gen, device=device).requires_grad_(True)
        for width in {i for i, _ in LAYER_SHAPES}
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(mode: str) -> float:
        sync()
        start = time.perf_counter()
        with autocast_for(mode, device):
            loss = 0.0
            for w in weights[:-1]:  # each product on its own input rows: its time, not a network's values
                loss = loss + (rows[w.shape[1]] @ w.t()).float().square().mean()
            head = weights[-1]
            loss = loss + (rows[head.shape[1]][:HEAD_ROWS] @ head.t()).float().logsumexp(-1).mean()
        loss.backward()
        sync()
        for w in (*weights, *rows.values()):
            w.grad = None
        return time.perf_counter() - start

    for mode in ("off", "bfloat16"):
        run(mode)
    return run


def measure(device: torch.device, timer=None) -> PrecisionChoice:
    """Time the probe in both precisions (:data:`ROUNDS` rounds, alternating) and choose."""
    timer = timer or probe_timer(device)
    per = {"off": [], "bfloat16": []}
    ratios = []
    for k in range(ROUNDS):
        for mode in ("off", "bfloat16") if k % 2 == 0 else ("bfloat16", "off"):
            per[mode].append(timer(mode))
        ratios.append(per["off"][-1] / per["bfloat16"][-1])
        if ratios[0] < HOPELESS:  # no slow round makes bf16 4x slower: emulated products, not worth 2 more
            break
    speedup = statistics.median(ratios)
    mode = "bfloat16" if speedup >= AUTO_MIN_SPEEDUP else "off"
    verdict = "at least" if mode == "bfloat16" else "under"
    reason = (
        f"measured: the learner's products under bfloat16 autocast run {speedup:.2f}x float32's, "
        f"{verdict} {AUTO_MIN_SPEEDUP}x (median of {len(ratios)} per-round ratios, SmolLM2-135M's shapes)"
    )
    return PrecisionChoice(
        mode,
        reason,
        machine_key(device),
        {m: statistics.median(v) for m, v in per.items()},
        [round(r, 4) for r in ratios],
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def choose(device: str | torch.device = "auto", timer=None, log=print) -> PrecisionChoice:
    """``auto``'s answer on ``device``: this process's, else the cached one for this machine, else
    measured now (and cached)."""
    dev = resolve_device(device)
    key = machine_key(dev)
    if key in _CHOSEN:
        return _CHOSEN[key]
    cached = json_cache.read(_cache_path()).get(key)
    if isinstance(cached, dict) and cached.get("mode") in ("off", "bfloat16"):
        choice = PrecisionChoice(**{**cached, "cached": True})
    else:
        log(f"mixed precision auto: timing the learner's products in float32 and bfloat16 on {key} (once) ...")
        # a fake timer (tests) in place; the probe's tensors in a child process (:mod:`.measure_apart`)
        choice = measure(dev, timer) if timer is not None else run_apart(measure, dev)
        log(f"mixed precision auto: {choice.mode} ({choice.reason}); cached in {_cache_path()}")
        _write_cache(key, choice)
    _CHOSEN[key] = choice
    return choice


def resolve(mode: str, device: str | torch.device = "auto") -> str:
    """``off`` or ``bfloat16``: ``mode`` itself, or ``auto``'s answer on ``device``."""
    if mode not in MODES:
        raise ValueError(f"model.mixed_precision={mode!r}: expected one of {', '.join(MODES)}")
    return choose(device).mode if mode == "auto" else mode


def learner_precision(model_cfg, device: str | torch.device | None = None) -> str:
    """``off`` or ``bfloat16``: what a config's ``model`` section computes in on ``device`` (default
    ``model.device``). 16-bit weights (``model.dtype``) compute in their own dtype: ``off``."""
    if model_cfg.dtype != "float32":
        return "off"
    return resolve(model_cfg.mixed_precision, model_cfg.device if device is None else device)


def autocast_for(precision: str, device: torch.device):
    """``torch.autocast(device.type, bfloat16)`` for ``precision="bfloat16"``, else a context that does
    nothing (``off``)."""
    if precision == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "off":
        raise ValueError(f"precision {precision!r}: expected off or bfloat16")
    return contextlib.nullcontext()


def learner_autocast(model_cfg, device: torch.device):
    """The context every learner forward runs in: autocast to bfloat16 under mixed precision, else
    nothing (:func:`learner_precision`)."""
    return autocast_for(learner_precision(model_cfg, device), device)


def learner_compute_dtype(model_cfg, learner: torch.nn.Module | None = None) -> torch.dtype:
    """The dtype a config's learner multiplies in: bfloat16 under mixed precision, else its weights'
    (``learner``'s when given, else ``model.dtype``; the device likewise)."""
    param = next(learner.parameters()) if learner is not None else None
    weights = param.dtype if param is not None else parse_dtype(model_cfg.dtype)
    if weights != torch.float32:
        return weights
    device = param.device if param is not None else None
    return torch.bfloat16 if learner_precision(model_cfg, device) == "bfloat16" else weights
