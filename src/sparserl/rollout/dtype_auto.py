"""``dtype: auto`` for callers that hold no engine yet (the CLI, the config's rules, the benchmarks): the
answer :mod:`sparserl.rollout.dtype_choice` measures, with :class:`~sparserl.rollout.engine.RolloutEngine`
as the engine it times where no answer is cached.

The measurement, its cache and its records live in :mod:`sparserl.rollout.dtype_choice`, below the
engine (the engine resolves its own ``auto`` there, timing its own class); this module sits above it.
"""

from __future__ import annotations

import torch

from ..models.machine import cpu_name, device_label
from . import dtype_choice
from .dtype_choice import AutoChoice, for_sampler, machine_key
from .engine import RolloutEngine

__all__ = ["AutoChoice", "choose", "cpu_name", "device_label", "for_sampler", "machine_key", "resolve_dtype"]


def choose(device: str | torch.device = "auto", timer=None, log=print) -> AutoChoice:
    """The sampler's dtype for ``auto`` on ``device``: the cached answer for this machine, else measured
    now on :class:`RolloutEngine` (or with ``timer``) and cached (:func:`dtype_choice.choose`)."""
    return dtype_choice.choose(device, timer, log, engine=RolloutEngine)


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "auto") -> torch.dtype:
    """A sampler dtype name (``auto`` | ``float32`` | ``bfloat16`` | ``float16``) or torch dtype as a
    torch dtype; ``auto`` is :func:`choose`'s answer for ``device``."""
    return dtype_choice.resolve_dtype(dtype, device, engine=RolloutEngine)
