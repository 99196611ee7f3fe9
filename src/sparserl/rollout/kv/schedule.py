"""A sparsity schedule (Sparrow, Zhou et al., 2026, arXiv 2606.08446; docs/algorithms.md §3): the KV budget
as a piecewise-constant function of the current sequence length.

    budget(L) = b_i   for   l_i <= L < l_{i+1}        (L below l_0: b_0)

given as pairs ``[[l_0, b_0], [l_1, b_1], ...]`` with the lengths strictly increasing. ``L`` is the
sequence length the sampler has reached (prompt tokens + tokens generated so far), the same axis as
the α tail's length bins (:mod:`sparserl.mismatch.acceptance`), so a calibrated ``budget_by_bin`` is a
schedule as it stands. Sparrow's schedules grow with length; any positive budgets are accepted (the
online controller may lower one bin below the next). The cache's buffers are sized to the largest
budget (:attr:`KVSchedule.max_budget`).

Where a schedule comes from (:func:`load_schedule`): the pairs themselves, or a JSON file holding the
pairs, an object with ``budget_by_bin``, or ``sparserl calibrate``'s output (the schedule of the
sampler's compressor).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ...errors import SparserlError

__all__ = ["KVSchedule", "ScheduleError", "load_schedule", "parse_pairs"]


class ScheduleError(SparserlError, ValueError):
    """A schedule that cannot be used; the message names its source (file or key) and the entry."""


@dataclass(frozen=True)
class KVSchedule:
    """Sorted ``(length, budget)`` pairs; see the module docstring for the rule."""

    lengths: tuple[int, ...]
    budgets: tuple[int, ...]

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[int]], source: str = "kv_schedule") -> KVSchedule:
        lengths, budgets = zip(*parse_pairs(pairs, source))
        return cls(tuple(lengths), tuple(budgets))

    @property
    def pairs(self) -> list[list[int]]:
        return [[length, budget] for length, budget in zip(self.lengths, self.budgets)]

    @cached_property
    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.lengths), torch.tensor(self.budgets)

    @property
    def max_budget(self) -> int:
        return max(self.budgets)

    @property
    def min_budget(self) -> int:
        return min(self.budgets)

    def budget_for(self, seq_len: int | torch.Tensor) -> int | torch.Tensor:
        """The budget at sequence length ``seq_len`` (an int, or a tensor of lengths → a long tensor)."""
        if isinstance(seq_len, torch.Tensor):  # every decode step: the tables are built once
            bounds, budgets = (t.to(seq_len.device) for t in self._tables)
            idx = (torch.bucketize(seq_len, bounds, right=True) - 1).clamp_(min=0)
            return budgets[idx]
        i = 0
        for k, length in enumerate(self.lengths):
            if seq_len >= length:
                i = k
        return self.budgets[i]

    def __str__(self) -> str:
        return " ".join(f"{length}:{budget}" for length, budget in zip(self.lengths, self.budgets))


def parse_pairs(pairs: Any, source: str = "kv_schedule") -> list[tuple[int, int]]:
    """Checked ``[(length, budget), ...]``: a non-empty list of pairs of integers, lengths ≥ 0 and
    strictly increasing, budgets ≥ 1. Errors name ``source`` and the entry."""
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise ScheduleError(f"{source}: expected a non-empty list of [length, budget] pairs, got {pairs!r}")
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(pairs):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
        ):
            raise ScheduleError(f"{source}[{i}]: expected a pair of integers [length, budget], got {pair!r}")
        length, budget = pair
        if length < 0:
            raise ScheduleError(f"{source}[{i}]: length {length} must be >= 0")
        if budget < 1:
            raise ScheduleError(f"{source}[{i}]: budget {budget} must be >= 1")
        if out and length <= out[-1][0]:
            raise ScheduleError(f"{source}[{i}]: lengths must increase strictly; {length} follows {out[-1][0]}")
        out.append((length, budget))
    return out


def load_schedule(spec: Any, compressor: str | None = None, source: str = "rollout.kv_schedule") -> KVSchedule:
    """A schedule from pairs or from a JSON file (path as a string): a list of pairs, an object with
    ``budget_by_bin``, or ``sparserl calibrate``'s output (``{"schedules": [...]}``: the entry of
    ``compressor``, which must then be unique)."""
    if isinstance(spec, KVSchedule):
        return spec
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ScheduleError(f"{source}: file {str(path)!r} not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ScheduleError(f"{source}: cannot read {str(path)!r}: {e}") from None
        except json.JSONDecodeError as e:
            raise ScheduleError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return load_schedule(data, compressor, source=str(path))
    if isinstance(spec, dict):
        if "budget_by_bin" in spec:
            return KVSchedule.from_pairs(spec["budget_by_bin"], f"{source}: budget_by_bin")
        if "schedules" in spec:
            entries = spec["schedules"]
            if not isinstance(entries, list) or not entries:
                raise ScheduleError(f"{source}: 'schedules' holds no schedule")
            names = sorted({str(e.get("compressor")) for e in entries if isinstance(e, dict)})
            mine = [
                e for e in entries if isinstance(e, dict) and (compressor is None or e.get("compressor") == compressor)
            ]
            if not mine:
                raise ScheduleError(f"{source}: no schedule for compressor {compressor!r}; it has: {', '.join(names)}")
            if len(mine) > 1:
                raise ScheduleError(
                    f"{source}: {len(mine)} schedules match (compressors {', '.join(names)}); "
                    "name the sampler's compressor (rollout.compressor) or keep one"
                )
            return load_schedule(mine[0], compressor, source)
        raise ScheduleError(
            f"{source}: a JSON object needs 'budget_by_bin' or 'schedules', got keys "
            f"{', '.join(map(str, spec)) or 'none'}"
        )
    return KVSchedule.from_pairs(spec, source)
