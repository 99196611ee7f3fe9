"""Freed tensor memory handed back to the system between a step's phases: glibc's ``malloc_trim(0)``.

torch's CPU tensors come from glibc's ``malloc``. A request of at least the *mmap threshold* gets a mapping of its
own, unmapped when freed; a smaller one comes from the heap. The threshold starts at 128 KiB and rises to the size
of every mapped block freed, up to 32 MiB, so after a run's first steps the learner's activations (2-30 MiB each in
a micro-batch of 4,096 tokens) come from the heap, and the holes their frees leave between blocks still in use stay
resident: without a trim the dense long job's peak grew 9.0 → 12.4 GB over five steps although its live tensors did
not (docs/results/long_seeds/). ``malloc_trim(0)`` gives every whole free page of every arena back to the kernel
(``madvise(MADV_DONTNEED)``), holes included, so a phase starts from what is live.

:func:`trim_freed_memory` runs it where a phase's tensors have just been freed: after the rollout, after α (before the
update), after each update micro-batch's backward and at the step's end. The call itself walks the free lists
(milliseconds); its cost is the next micro-batch faulting the returned pages in again: 1.04-1.14x the update's
forwards and backwards on that job, against a peak held at 9.61 GB instead of growing to 12.0 GB in four steps
(docs/results/memory_over_a_run/).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["resident_bytes", "returned_bytes", "trim_freed_memory"]

_malloc_trim = None
_looked = False


def _trim_function():
    global _malloc_trim, _looked
    if not _looked:
        _looked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            function = libc.malloc_trim  # glibc only: musl and macOS have none
        except (OSError, AttributeError):
            return None
        function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
        _malloc_trim = function
    return _malloc_trim


def trim_freed_memory() -> bool:
    """Hand the C heap's free pages back to the kernel (glibc's ``malloc_trim(0)``); True when some were returned,
    False when none were or the C library is not glibc."""
    function = _trim_function()
    return bool(function(0)) if function is not None else False


def resident_bytes() -> int:
    """This process's resident set now, in bytes (0 where ``/proc`` does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def returned_bytes() -> int:
    """:func:`trim_freed_memory`, and the resident bytes it gave back (the resident set before less after)."""
    before = resident_bytes()
    trim_freed_memory()
    return max(0, before - resident_bytes())
