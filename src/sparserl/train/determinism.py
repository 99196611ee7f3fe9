"""Bit-exact training on CUDA: torch's deterministic kernels (``train.deterministic``, on by default;
TRL's ``full_determinism``).

On the CPU the kernels sparserl trains with are deterministic already: a run, its rerun and its
``--resume`` give the same bits. On CUDA some backward kernels add with atomics in whatever order the
threads arrive (the embedding's and the log-prob gather's scatter-adds, for instance), so the last bits
of a sum change from run to run; seen on an H100, where a run resumed after 2 of 3 steps ended with
other weights than the run that went straight through. Deterministic mode asks torch for the kernels
that add in a fixed order, and cuBLAS for a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read when
cuBLAS starts, so before the model reaches the GPU). Strictly (``warn_only=False``): in warn-only
mode torch keeps the memory-efficient attention's backward nondeterministic (it said so on the H100 and
the resumed run drifted); strict mode gives its deterministic kernel. An operation with no
deterministic CUDA kernel then stops the step: :func:`naming_nondeterministic_ops` turns torch's error
into one naming the key that lifts it. In the GPU runs of the test matrices (engine, replay, training),
no operation reported missing a deterministic kernel.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from ..errors import SparserlError
from ..models.loading import resolve_device


class NondeterministicOpError(SparserlError, RuntimeError):
    """An operation with no deterministic CUDA kernel, under ``train.deterministic=true``."""


def deterministic_state() -> tuple[bool, bool]:
    """Torch's deterministic-algorithms setting now (on, warn only), for :func:`restore_deterministic_state`."""
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def restore_deterministic_state(state: tuple[bool, bool]) -> None:
    """Put back a :func:`deterministic_state` (after a run: the process goes on as it was)."""
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


def use_deterministic_kernels(device) -> bool:
    """On a CUDA ``device`` (``model.device``, ``auto`` resolved): deterministic kernels from here on,
    for this process. Returns whether it changed anything (False on the CPU, deterministic as it is)."""
    if resolve_device(device).type != "cuda":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    return True


@contextmanager
def naming_nondeterministic_ops():
    """Torch's error for an operation without a deterministic kernel as a
    :class:`NondeterministicOpError` naming ``train.deterministic`` (the last checkpoint stays for
    ``--resume``)."""
    try:
        yield
    except RuntimeError as e:
        text = str(e)
        if "does not have a deterministic implementation" not in text and "CUBLAS_WORKSPACE_CONFIG" not in text:
            raise
        raise NondeterministicOpError(
            f"train.deterministic=true, but this step ran an operation with no deterministic CUDA kernel: "
            f"{text.splitlines()[0]} -- set train.deterministic=false (the last bits then vary from run to run) "
            "and go on with --resume"
        ) from e
