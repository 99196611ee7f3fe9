"""Which of ``linear_bf16.c``'s kernels the bf16 sampler runs where the CPU offers two: measured, not
assumed.

An AMX Xeon runs the fused bf16 step's weight products two ways (:func:`native.bf16_kernels`): AMX tiles
(``_tile_dpbf16ps``, weights packed in 1 KB B tiles) and AVX512-BF16 (``vdpbf16ps`` on 32-column
panels). A tile does 16 x 16 x 32 multiply-adds an instruction, but a decode step's 16 rows stream
every weight from memory once, and the tiles add their own loads, stores and configuration: which one is
faster at that shape is a property of the machine.
So the first bf16 sampler built on such a CPU times its decode step on each kernel, with
:mod:`sparserl.rollout.dtype_choice`'s probe (SmolLM2-135M's shape, random weights, batch 16, a dense
cache): :data:`~sparserl.rollout.dtype_choice.ROUNDS` rounds in alternating order, the median of the
per-round ratios decides, and the answer is cached beside ``dtype: auto``'s, under the same machine key
(CPU model and instruction sets, torch, kernels). A CPU with one kernel measures nothing.

An engine given ``bf16_kernel`` runs that kernel (an error names the ones this machine has); the
answer and its reason are the engine's ``bf16_kernel_choice`` and the bench JSON's ``bf16_kernel_choice``.
The engine passes its own class (``engine``) to be timed, so this module sits below
:mod:`sparserl.rollout.engine`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from ..models.measure_apart import run_apart
from . import dtype_choice, native
from .dtype_choice import ROUNDS, check_timer, decode_step_seconds, machine_key, probe_model
from .kv import build_compressor


@dataclass
class KernelChoice:
    """The bf16 kernel chosen and why."""

    kernel: str
    reason: str
    key: str
    seconds_per_step: dict = field(default_factory=dict)  # kernel -> median seconds of one decode step
    ratio_rounds: list = field(default_factory=list)  # per round: the second kernel's step time / the first's
    measured_at: str = ""
    cached: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def cache_key(device: torch.device) -> str:
    return f"{machine_key(device)} | bf16 kernel"


def engine_timer(engine, kernels: tuple[str, ...], device: torch.device):
    """``timer(kernel) -> seconds of one bf16 decode step`` on that kernel: one ``engine`` (the engine
    class) a kernel over the probe model, each warmed up once."""
    lm = probe_model(device)
    engines = {}
    for kernel in kernels:
        engines[kernel] = engine(lm, build_compressor("none"), dtype=torch.bfloat16, bf16_kernel=kernel)
        decode_step_seconds(engines[kernel])
    return lambda kernel: decode_step_seconds(engines[kernel])


def measure(kernels: tuple[str, ...], device: torch.device, timer=None, engine=None) -> KernelChoice:
    """Time the two kernels (:data:`ROUNDS` rounds, each timing both, alternating which goes first) and
    choose the faster by the median of the per-round ratios. ``timer(kernel)``: seconds of one decode
    step (tests pass a fake); else ``engine`` (the engine class) is timed on the probe model."""
    first, second = kernels
    check_timer(timer, engine)
    timer = timer or engine_timer(engine, kernels, device)
    per = {k: [] for k in kernels}
    ratios = []
    for k in range(ROUNDS):
        for kernel in kernels if k % 2 == 0 else kernels[::-1]:
            per[kernel].append(timer(kernel))
        ratios.append(per[second][-1] / per[first][-1])
    ratio = statistics.median(ratios)
    chosen, other = (second, first) if ratio < 1.0 else (first, second)
    speedup = 1 / ratio if chosen == second else ratio
    reason = (
        f"measured: a bf16 decode step on {chosen} is {speedup:.2f}x one on {other} (median of {ROUNDS} "
        f"per-round ratios, SmolLM2-135M's shape, batch 16)"
    )
    return KernelChoice(
        chosen,
        reason,
        cache_key(device),
        {k: statistics.median(v) for k, v in per.items()},
        [round(r, 4) for r in ratios],
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def choose(
    device: str | torch.device = "cpu", timer=None, log=print, kernels: tuple[str, ...] | None = None, engine=None
) -> KernelChoice:
    """The bf16 kernel for the fused step on ``device`` (a CPU): the only one where there is one, else the
    cached measurement for this machine, else measured now with ``timer`` or the engine class ``engine``
    (:func:`measure`) and cached. ``kernels``: the candidates (default :func:`native.bf16_kernels`)."""
    device = torch.device(device)
    kernels = tuple(kernels if kernels is not None else native.bf16_kernels())
    key = cache_key(device)
    if len(kernels) == 1:
        return KernelChoice(kernels[0], f"the only bf16 kernel this machine runs ({kernels[0]})", key)
    if len(kernels) != 2:
        raise ValueError(f"bf16 kernels to choose from: expected one or two, got {kernels!r}")
    cached = dtype_choice._read_cache().get(key)
    if isinstance(cached, dict) and cached.get("kernel") in kernels:
        return KernelChoice(**{**cached, "cached": True})
    log(f"bf16 kernel: timing the bf16 decode step on {' and '.join(kernels)} on {key} (once) ...")
    check_timer(timer, engine)
    # a fake timer (tests) in place; the engines on the probe model in a child process (:mod:`.measure_apart`)
    choice = (
        measure(kernels, device, timer, engine)
        if timer is not None
        else run_apart(measure, kernels, device, None, engine)
    )
    log(f"bf16 kernel: {choice.kernel} ({choice.reason}); cached in {dtype_choice._cache_path()}")
    data = dtype_choice._read_cache()
    data[key] = choice.to_dict()
    dtype_choice._write_cache(data)
    return choice
