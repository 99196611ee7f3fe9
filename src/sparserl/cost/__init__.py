"""Predicted time of a rollout (:mod:`.rollout`) and of a whole RL step (:mod:`.step`) from a model's
shapes and a machine's rates: measured here (:func:`sparserl.bench.machine.measure_rates`) or assumed
for a GPU (:mod:`.machines`), for the shapes of :mod:`.shapes`."""

from __future__ import annotations

from .rollout import (
    SCORING,
    Cost,
    MachineRates,
    ModelShape,
    predicted_cost_vs_dense,
    rollout_cost,
    rollout_cost_lengths,
)
from .step import STATIONS, Step, forward_cost, spread_lengths, step_cost, with_weight_bytes

__all__ = [
    "Cost",
    "MachineRates",
    "ModelShape",
    "SCORING",
    "predicted_cost_vs_dense",
    "rollout_cost",
    "rollout_cost_lengths",
    "STATIONS",
    "Step",
    "forward_cost",
    "spread_lengths",
    "step_cost",
    "with_weight_bytes",
]
