"""Bit-exact training on CUDA: torch's deterministic kernels (``train.deterministic``, on by default;
TRL's ``full_determinism``).

On the CPU the kernels sparserl trains with are deterministic already: a run, its rerun and its
``--resume`` give the same bits. On CUDA some backward kernels add with atomics in whatever order the
threads arrive (the embedding's and the log-prob gather's scatter-adds, for instance), so the last bits
of a sum change from run to run; seen on an H100, where a run resumed after 2 of 3 steps ended with
other weights than the run that went straight through. Deterministic mode asks torch for the kernels
that add in a fixed order, and cuBLAS for a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read when
cuBLAS starts, so before the model reaches the GPU). An operation with no deterministic CUDA kernel
warns instead of failing (``warn_only``).
"""
from __future__ import annotations

import os

import torch

from ..models.loading import resolve_device


def use_deterministic_kernels(device) -> bool:
    """On a CUDA ``device`` (``model.device``, ``auto`` resolved): deterministic kernels from here on,
    for this process. Returns whether it changed anything (False on the CPU, deterministic as it is)."""
    if resolve_device(device).type != "cuda":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    return True
