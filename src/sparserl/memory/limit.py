"""The memory a run may use: ``train.max_memory_gb``, else what the machine has available now.

Available now: ``MemAvailable`` of ``/proc/meminfo`` (psutil's ``available`` where there is no
``/proc``), plus what this process already holds (its resident set, which the prediction counts in its
baseline and weights), minus a margin of :data:`MARGIN_FRACTION` of it and at least :data:`MARGIN_BYTES`
(the page cache the kernel keeps hot, other processes growing meanwhile, allocator slack).
"""

from __future__ import annotations

from ..config import Config
from .allocator import resident_bytes

__all__ = ["MARGIN_BYTES", "MARGIN_FRACTION", "available_bytes", "memory_limit", "peak_resident_bytes"]

GB = 1e9
MARGIN_FRACTION = 0.10
MARGIN_BYTES = 500_000_000


def _meminfo_kb(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == field:
                    return int(value.split()[0])
    except OSError:
        return None
    return None


def available_bytes() -> int | None:
    """Bytes the machine could give this process now: MemAvailable plus its own resident set (None: unknown)."""
    kb = _meminfo_kb("MemAvailable")
    if kb is not None:
        return kb * 1024 + resident_bytes()
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available) + int(psutil.Process().memory_info().rss)


def memory_limit(cfg: Config) -> tuple[float, str]:
    """(bytes, where they come from): ``train.max_memory_gb``, else the available memory less the margin
    (``inf`` when the machine does not say)."""
    if cfg.train.max_memory_gb is not None:
        return cfg.train.max_memory_gb * GB, "train.max_memory_gb"
    avail = available_bytes()
    if avail is None:
        return float("inf"), "no memory limit known on this machine"
    margin = max(MARGIN_BYTES, MARGIN_FRACTION * avail)
    return avail - margin, f"available memory now, {avail / GB:.1f} GB, less a {margin / GB:.1f} GB margin"


def peak_resident_bytes() -> int:
    """This process's resident high-water mark so far, in bytes: the peak a run's memory prediction is checked
    against. ``VmHWM`` of ``/proc/self/status`` (this address space's own); elsewhere ``ru_maxrss``, which on
    Linux would also count the resident set a forked child inherited from its parent until its exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
