"""What this machine can do, measured: memory read bandwidth and the throughput of the decode's own
GEMMs (the two ceilings of :mod:`sparserl.bench.roofline`; :func:`measure_rates` gives them to the
cost model as :class:`~sparserl.cost.MachineRates`), and a description of the machine."""

from __future__ import annotations

import os
import platform
import time

import torch

from ..cost import MachineRates
from ..rollout import native
from ..rollout.model import NATIVE_BF16


def memory_bandwidth(nbytes: int = 512 << 20, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Measured read bandwidth of ``device``'s memory in bytes/s: the best of several full reads of a
    large buffer (after one untimed read)."""
    device = torch.device(device)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for i in range(repeats + 1):
        t = time.perf_counter()
        x.sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            best = min(best, time.perf_counter() - t)
    return nbytes / best


def decode_linear_weights(model) -> list[torch.Tensor]:
    """The weights one decode step multiplies, in the order it does: per layer the fused q/k/v, o,
    fused gate/up and down, then the LM head. ``model`` is a :class:`~sparserl.rollout.model.SamplerModel`."""
    weights = [w for lw in model.layers for w in (lw.qkv, lw.o, lw.gate_up, lw.down)]
    return [*weights, model.lm_head]


def gemm_flops_per_s(model, rows: int, repeats: int = 5) -> float:
    """FLOP/s of the decode step's GEMMs on this machine: ``rows`` activations (the batch) times
    every weight of :func:`decode_linear_weights`, through ``model.linear`` (the call the decode
    makes, same orientation, same weights in memory: a quantized sampler's run its int8 kernels), 2
    FLOPs (one multiply-add) per weight element per row; the best of ``repeats`` timed passes after
    one warm-up pass. A bf16 weight with its ``linear_bf16.c`` panels runs on them, as in the fused
    step (float32 activations rounded inside the kernel), not through torch's bf16 product."""
    weights = decode_linear_weights(model)
    gen = torch.Generator().manual_seed(0)
    inputs = {}
    panels = {
        id(w): getattr(w, NATIVE_BF16) for w in weights if native.active() and getattr(w, NATIVE_BF16, None) is not None
    }

    def key(w):  # a quantized weight or bf16 panels take float32 activations, a plain weight its own dtype
        return w.shape[1], (w.dtype if isinstance(w, torch.Tensor) and id(w) not in panels else torch.float32)

    def product(w):
        if id(w) in panels:
            return native.linear_bf16(inputs[key(w)], panels[id(w)])
        return model.linear(inputs[key(w)], w)

    for w in weights:
        if key(w) not in inputs:
            inputs[key(w)] = torch.randn(rows, w.shape[1], generator=gen).to(device=model.device, dtype=key(w)[1])
    flops = 2.0 * rows * sum(w.numel() for w in weights)
    best = float("inf")
    with torch.inference_mode():
        for i in range(repeats + 1):
            t = time.perf_counter()
            for w in weights:
                product(w)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if i:  # the first pass warms up
                best = min(best, time.perf_counter() - t)
    return flops / best


def measure_rates(model, rows: int = 16, prefill_rows: int | None = None) -> MachineRates:
    """The cost model's machine, measured now: :func:`memory_bandwidth` on the model's device and
    :func:`gemm_flops_per_s` through the sampler's own products at ``rows`` rows (the batch), and at
    ``prefill_rows`` when given (e.g. ``min(N · L_in, 256)``). ``model`` is a
    :class:`~sparserl.rollout.model.SamplerModel` or a :class:`~sparserl.rollout.engine.RolloutEngine`
    (its dtype and quantization are the ones measured). A few seconds."""
    sampler = getattr(model, "model", model)
    return MachineRates(
        memory_bandwidth(device=sampler.device),
        gemm_flops_per_s(sampler, rows),
        gemm_flops_per_s(sampler, prefill_rows) if prefill_rows else None,
    )


def machine_info(bandwidth: float, gemm_flops: float, gemm_rows: int, device: torch.device | str = "cpu") -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "isa": native.isa(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "memory_bandwidth_bytes_per_s": bandwidth,
        "gemm_flops_per_s": gemm_flops,
        "gemm_rows": gemm_rows,
        "cuda": torch.cuda.is_available(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else None,
        "native_arch": _native_arch(),
    }


def _native_arch() -> str | None:
    """What the native kernels were built for: "native" (-march=native), the flags of
    $SPARSERL_NATIVE_ARCH, or None where they do not run."""
    if native.library() is None:
        return None
    return os.environ.get("SPARSERL_NATIVE_ARCH") or "native"
