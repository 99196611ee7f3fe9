"""The machine a measurement runs on: its CPU's model name and instruction sets, the device's label,
and the folder where this machine's compiled kernels and measured choices are kept.

The sampler's ``dtype: auto`` (:mod:`sparserl.rollout.dtype_auto`), the learner's
``model.mixed_precision: auto`` (:mod:`sparserl.models.mixed_precision`) and the native kernels' build
(:mod:`sparserl.rollout.native.compiler`) name the machine the same way, from here.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

#: the instruction sets that decide which kernels and dtypes are fast, as /proc/cpuinfo names them
ISA = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cache_dir() -> Path:
    """``$SPARSERL_NATIVE_CACHE`` (default ``~/.cache/sparserl/native``), created if missing: the compiled
    kernels and the measured ``auto`` answers (``dtype_auto.json``, ...); an EnvPathError when it cannot be
    a folder."""
    from ..envpath import env_dir

    return env_dir("SPARSERL_NATIVE_CACHE", Path.home() / ".cache" / "sparserl" / "native")


def cpu_signature() -> str:
    """The CPU's feature line of ``/proc/cpuinfo`` (``flags`` / ``Features``), else the platform's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    line = cpu_signature()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def isa() -> list[str]:
    """Which of :data:`ISA` this CPU has (what a measurement's machine is named by)."""
    flags = cpu_flags()
    return [f for f in ISA if f in flags]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_label(device: torch.device) -> str:
    """The device a measurement ran on: the GPU's name, or the CPU's model and instruction sets."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{cpu_name()} [{' '.join(isa())}]"
