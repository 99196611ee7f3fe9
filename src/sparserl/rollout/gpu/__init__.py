"""Triton kernels for the compressed KV cache on a GPU: decode attention over the bounded cache (every slot, or
block top-k's chosen pages read in place) and R-KV's redundancy without the [L, L] similarity matrix.

Each kernel reads the rows' lengths (and block top-k's pages) from device tensors, so a decode step that calls
it needs no host sync and keeps the same shapes from step to step (what CUDA-graph capture asks). Each has a
torch reference it is tested against under Triton's interpreter (``TRITON_INTERPRET=1``, on CPU tensors) in
the ordinary test suite, and :mod:`.resources` compiles it for sm_90 without a GPU to read its registers and
spills. Triton is the ``gpu`` extra (``pip install sparserl[gpu]``); nothing here is imported unless asked for.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether Triton is installed (the kernels here need it; the CPU engine does not)."""
    return importlib.util.find_spec("triton") is not None
