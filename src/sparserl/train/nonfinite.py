"""No silent NaN in training: a step whose loss or gradient norm is not finite is not applied, and
``train.max_nonfinite_steps`` such steps in a row stop the run with one line saying why.

One non-finite step can turn every weight into NaN through the optimizer (AdamW divides by the
running second moment, so a single ``inf`` gradient element poisons that element for good; a NaN
poisons it at once). The update therefore asks :meth:`NonfiniteSteps.finite` before
``optimizer.step()``; on False it skips the step (gradients zeroed, weights and LR schedule as they
were) and says so with :meth:`NonfiniteSteps.record`, which raises :class:`NonfiniteTrainingError`
once ``limit`` steps in a row were skipped: a run that cannot take a finite step is stopped rather
than logged on with a frozen policy. A finite step resets the count.

:func:`all_finite` and :func:`first_nonfinite` check weights and optimizer state (the checkpoint
writer refuses a model that is not finite: :func:`sparserl.train.checkpoint.save_checkpoint`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import SparserlError

__all__ = [
    "LIKELY_CAUSES",
    "NonfiniteSteps",
    "NonfiniteTrainingError",
    "all_finite",
    "first_nonfinite",
    "is_finite_number",
]

#: what makes a step's loss or gradient norm non-finite, most frequent first
LIKELY_CAUSES = (
    "non-finite rewards or advantages",
    "a learning rate too high (train.lr)",
    "a sequence the model cannot score (a log-probability of -inf)",
)


class NonfiniteTrainingError(SparserlError):
    """``train.max_nonfinite_steps`` steps in a row had a loss or gradient norm that is not finite; the
    message names the step, the count and the likely causes. The weights are those of the last finite
    step (no non-finite step was applied, no checkpoint holds one)."""


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` (a Python number or a tensor of any shape) is finite everywhere; None counts as
    finite (a quantity that was not computed)."""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return True
        return bool(torch.isfinite(value).all())
    return math.isfinite(float(value))


class NonfiniteSteps:
    """Counts the non-finite steps in a row and stops the run after ``limit`` of them.

    Use in the update::

        guard = NonfiniteSteps(cfg.train.max_nonfinite_steps)
        ...
        ok = guard.finite(loss, grad_norm)
        if ok:
            optimizer.step(); scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        metrics[names.SKIPPED_NONFINITE] = guard.record(step, ok)   # raises after `limit` in a row

    ``record`` returns 1 for a skipped step and 0 for an applied one (the step's metric);
    :attr:`in_a_row` is the current streak and :attr:`skipped` the run's total. ``state_dict`` /
    ``load_state_dict`` carry both across a resume."""

    def __init__(self, limit: int = 3):
        if int(limit) < 1:
            raise ValueError(f"train.max_nonfinite_steps={limit}: must be >= 1")
        self.limit = int(limit)
        self.in_a_row = 0
        self.skipped = 0

    @classmethod
    def from_config(cls, cfg) -> NonfiniteSteps:
        """From ``train.max_nonfinite_steps`` (3 when the config has no such key)."""
        return cls(getattr(getattr(cfg, "train", None), "max_nonfinite_steps", 3))

    @staticmethod
    def finite(loss: Any, grad_norm: Any = None) -> bool:
        """Whether the step may be applied: its loss and its gradient norm (the total norm
        ``clip_grad_norm_`` returns, which is NaN or inf when any gradient element is) are finite."""
        return is_finite_number(loss) and is_finite_number(grad_norm)

    def record(self, step: int, finite: bool) -> int:
        """Note step ``step``'s outcome: 0 for a finite (applied) step, which resets the streak; 1 for a
        skipped one. Raises :class:`NonfiniteTrainingError` when this makes ``limit`` in a row."""
        if finite:
            self.in_a_row = 0
            return 0
        self.in_a_row += 1
        self.skipped += 1
        if self.in_a_row >= self.limit:
            raise NonfiniteTrainingError(
                f"step {step}: the loss or gradient norm was not finite for {self.in_a_row} steps in a row "
                f"(train.max_nonfinite_steps={self.limit}); those steps were skipped and the weights are the last "
                f"finite step's. Likely causes: {'; '.join(LIKELY_CAUSES)}"
            )
        return 1

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "skipped": self.skipped}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.in_a_row = int(state.get("in_a_row", 0))
        self.skipped = int(state.get("skipped", 0))


def _named_tensors(obj: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) of a module's state dict, a state dict, or an optimizer's state (nested)."""
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    elif isinstance(obj, torch.optim.Optimizer):
        obj = {"state": obj.state_dict()["state"]}
    if isinstance(obj, torch.Tensor):
        yield "", obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            for name, t in _named_tensors(v):
                yield f"{k}.{name}" if name else str(k), t
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            for name, t in _named_tensors(v):
                yield f"{i}.{name}" if name else str(i), t


def first_nonfinite(obj: Any) -> str | None:
    """The name of the first floating tensor of ``obj`` (a module, its state dict, an optimizer, or a
    nested dict/list of tensors) holding a NaN or an infinity, or None when every one is finite.

    One host synchronisation per device: the per-tensor checks are stacked and read together."""
    by_device: dict[torch.device, list[tuple[int, str, torch.Tensor]]] = {}
    for i, (name, t) in enumerate(_named_tensors(obj)):
        if (t.is_floating_point() or t.is_complex()) and t.numel():
            by_device.setdefault(t.device, []).append((i, name, t))
    bad: list[tuple[int, str]] = []
    for tensors in by_device.values():
        flags = torch.stack([torch.isfinite(t).all() for _, _, t in tensors]).tolist()
        bad += [(i, name) for (i, name, _), ok in zip(tensors, flags) if not ok]
    return min(bad)[1] if bad else None


def all_finite(obj: Any) -> bool:
    """Whether every floating tensor of a module, state dict or optimizer is finite (:func:`first_nonfinite`)."""
    return first_nonfinite(obj) is None
