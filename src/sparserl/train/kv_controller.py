"""The online budget controller: each sequence-length bin's KV budget follows the measured α tail
between training steps (``rollout.kv_controller``).

Sparrow (Zhou et al., 2026, arXiv 2606.08446; docs/algorithms.md §3) calibrates its schedule once, offline,
on the model before training. The policy moves during training, and so does the mismatch a budget
causes; this controller re-reads the tail every step instead. For each bin ``b`` whose 5th percentile
of α was measured this step (``mismatch/alpha_p5_bin/<b>``, :mod:`sparserl.mismatch.measure`):

    p5_b <  threshold             → B_b ← min(B_b + step, max_budget)                 (raise at once)
    p5_b >= threshold + margin    for ``patience`` steps in a row
                                  → B_b ← max(B_b − step, min_budget)                 (lower slowly)
    otherwise                     → B_b held

Raising at once and lowering only after ``patience`` clear steps with a ``margin`` is the hysteresis:
a bin does not oscillate around the threshold, and a collapse (the tail falling) is answered on the
next step. A bin with no tokens this step is held, its streak kept. A bin seen for the first time
starts at the budget the initial schedule (``rollout.kv_schedule``, else ``rollout.kv_budget``) gives
at its start, clamped to the bounds. The result is a schedule (:class:`~sparserl.rollout.kv.schedule.
KVSchedule`, one pair per bin), so the sampler's buffers hold at most ``max_budget`` tokens. Its state
(budgets and streaks) is saved with each checkpoint, so a resumed run steers exactly as the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import runlog as names
from ..rollout.kv.schedule import KVSchedule

__all__ = ["KVController", "alpha_tail_by_bin"]


def alpha_tail_by_bin(metrics: dict) -> dict[int, float]:
    """{bin start: 5th percentile of α} from a step's metrics (``mismatch/alpha_p5_bin/<start>``)."""
    prefix = names.MISMATCH_ALPHA_P5_BIN
    return {int(k[len(prefix) :]): float(v) for k, v in metrics.items() if k.startswith(prefix)}


@dataclass
class KVController:
    """Per-bin budgets steered by the α tail (rule in the module docstring)."""

    threshold: float
    margin: float
    patience: int
    bin: int
    min_budget: int
    max_budget: int
    step: int
    initial: KVSchedule
    budgets: dict[int, int] = field(default_factory=dict)  # bin start -> budget
    streaks: dict[int, int] = field(default_factory=dict)  # bin start -> steps in a row clear of the margin

    @classmethod
    def from_config(cls, kc, alpha_bin: int, initial: KVSchedule | int) -> KVController:
        """From ``rollout.kv_controller`` (``kc``), ``mismatch.alpha_bin`` and the starting schedule or budget."""
        start = initial if isinstance(initial, KVSchedule) else KVSchedule((0,), (int(initial),))
        return cls(
            kc.threshold, kc.margin, kc.patience, kc.bin or alpha_bin, kc.min_budget, kc.max_budget, kc.step, start
        )

    def _clamp(self, budget: int) -> int:
        return max(self.min_budget, min(self.max_budget, int(budget)))

    def budget_at(self, bin_start: int) -> int:
        """The budget of the bin starting at ``bin_start`` (a new bin: the initial schedule's, clamped)."""
        if bin_start not in self.budgets:
            return self._clamp(self.initial.budget_for(bin_start))
        return self.budgets[bin_start]

    def schedule(self) -> KVSchedule:
        """The schedule the next rollout runs with: the initial one (clamped) where no bin was measured,
        each measured bin's budget from its start on."""
        starts = sorted(set(self.budgets) | {length for length in self.initial.lengths})
        pairs, last = [], None
        for start in starts:
            budget = self.budgets[start] if start in self.budgets else self._at_unmeasured(start)
            if budget != last:
                pairs.append([start, budget])
                last = budget
        if pairs[0][0] != 0:
            pairs.insert(0, [0, pairs[0][1]])
        return KVSchedule.from_pairs(pairs, "kv_controller")

    def _at_unmeasured(self, start: int) -> int:
        # an initial schedule's breakpoint inside a measured bin belongs to that bin
        measured = [b for b in self.budgets if b <= start < b + self.bin]
        return self.budgets[measured[0]] if measured else self._clamp(self.initial.budget_for(start))

    def update(self, tail: dict[int, float]) -> dict[int, str]:
        """Apply one step's α tail ({bin start: p5}); returns {bin start: raise | lower | hold}."""
        actions = {}
        for start in sorted(tail):
            p5 = tail[start]
            budget = self.budget_at(start)
            if p5 < self.threshold:
                self.budgets[start], self.streaks[start] = self._clamp(budget + self.step), 0
                actions[start] = "raise"
                continue
            streak = self.streaks.get(start, 0) + 1 if p5 >= self.threshold + self.margin else 0
            if streak >= self.patience:
                self.budgets[start], streak = self._clamp(budget - self.step), 0
                actions[start] = "lower"
            else:
                self.budgets[start] = budget
                actions[start] = "hold"
            self.streaks[start] = streak
        return actions

    def steer(self, compressor, alpha_metrics: dict) -> dict[str, int]:
        """After a step's α is measured: update from its tail and give ``compressor`` the new schedule
        for the next rollout. Returns the budgets this step's rollout ran with (``kv/budget_bin/<start>``)."""
        ran = self.metrics()
        self.update(alpha_tail_by_bin(alpha_metrics))
        compressor.set_schedule(self.schedule())
        return ran

    def metrics(self) -> dict[str, int]:
        """``kv/budget_bin/<start>`` for every bin the schedule names (the budgets a rollout runs with)."""
        return {f"{names.KV_BUDGET_BIN}{start}": budget for start, budget in self.schedule().pairs}

    def state_dict(self) -> dict:
        return {
            "budgets": {str(k): v for k, v in self.budgets.items()},
            "streaks": {str(k): v for k, v in self.streaks.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.budgets = {int(k): int(v) for k, v in state["budgets"].items()}
        self.streaks = {int(k): int(v) for k, v in state["streaks"].items()}
