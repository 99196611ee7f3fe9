"""The samplers a step's prediction compares (arms) and the table that puts them side by side.

An arm is a sampler: its :func:`~.rollout.rollout_cost` keyword arguments and its weights' bytes. Named arms:

- ``dense``: the whole cache, the weights as held;
- ``rkv<B>`` (e.g. ``rkv256``): R-KV at a fixed budget of B tokens, compressing every 128 tokens;
- ``controller``: R-KV at budgets per 128-token response bin (the online controller's bins), given
  as ``controller_budgets`` (a schedule over the sequence length, offset by the prompt);
- ``blocktopk``: block top-k reading ``blocktopk_pages`` pages of 16 tokens, layers 0-1 dense;
- ``sparrow``: block top-k with Sparrow's published page schedule for the model (:mod:`.sparrow`);
- ``int8``: dense with int8 layer weights (1 byte each; the LM head stays as held, ``rollout.quant_head``
  off); ``fp8`` the same bytes.
"""

from __future__ import annotations

import re

from .. import runlog as names
from .rollout import MachineRates, ModelShape
from .sparrow import SCHEDULES, pages_schedule
from .step import STATIONS, Step, step_cost, with_weight_bytes

__all__ = ["ARM_HELP", "arm_sparsity", "beside", "predict_arms", "table"]

ARM_HELP = "dense, rkv<B> (e.g. rkv256), controller, blocktopk, sparrow (Qwen3 shapes), int8, fp8"


def arm_sparsity(
    arm: str,
    model: str,
    prompt_len: int,
    *,
    controller_budgets: list[int] | tuple[int, ...] = (64, 96, 128, 160, 192, 224, 256, 256),
    controller_bin: int = 128,
    blocktopk_pages: int = 16,
) -> tuple[dict, float | None]:
    """An arm's rollout keyword arguments and its layer weights' bytes (None: as the model holds them).
    Raises ``ValueError`` naming the arm."""
    if arm == "dense":
        return {}, None
    if arm in ("int8", "fp8"):
        return {}, 1.0
    m = re.fullmatch(r"rkv(\d+)", arm)
    if m:
        return {"budget": int(m.group(1)), "compressor": "rkv"}, None
    if arm == "controller":
        if not controller_budgets:
            raise ValueError("arm controller: give at least one budget per bin")
        schedule = [[0, controller_budgets[0]]] + [
            [prompt_len + i * controller_bin, b] for i, b in enumerate(controller_budgets) if i
        ]
        return {"schedule": schedule, "compressor": "rkv"}, None
    if arm == "blocktopk":
        return {"blocktopk_pages": blocktopk_pages}, None
    if arm == "sparrow":
        if model not in SCHEDULES:
            raise ValueError(f"arm sparrow: Sparrow published schedules for {', '.join(SCHEDULES)} only, not {model!r}")
        return {"blocktopk_pages": pages_schedule(model)}, None
    raise ValueError(f"unknown arm {arm!r}; known: {ARM_HELP}")


def predict_arms(
    arms: list[str],
    model: str,
    sampler: ModelShape,
    rates: MachineRates,
    prompt_len: int,
    response_lens: list[int],
    *,
    learner: ModelShape | None = None,
    learner_rates: MachineRates | None = None,
    arm_rates: dict[str, MachineRates] | None = None,
    arm_options: dict | None = None,
    **step_options,
) -> dict[str, Step]:
    """Each arm's predicted step: the sampler ``sampler`` (its weights and KV as held) on ``rates``
    (``arm_rates``: an arm's own, e.g. an int8 sampler's measured products), the learner ``learner``
    on ``learner_rates`` (default: the sampler's); ``arm_options``: :func:`arm_sparsity`'s keywords."""
    out = {}
    for arm in arms:
        sparsity, weight_bytes = arm_sparsity(arm, model, prompt_len, **(arm_options or {}))
        shape = with_weight_bytes(sampler, weight_bytes) if weight_bytes is not None else sampler
        out[arm] = step_cost(
            shape,
            (arm_rates or {}).get(arm, rates),
            prompt_len,
            response_lens,
            learner=learner,
            learner_rates=learner_rates,
            **step_options,
            **sparsity,
        )
    return out


def table(steps: dict[str, Step], baseline: str | None = None) -> str:
    """A markdown table: seconds per station (the run log's names), the step, the rollout's fraction,
    the rollout's and the step's speedup over ``baseline`` (default: the first arm), and the rollout's
    response tokens per second."""
    baseline = baseline or next(iter(steps))
    base = steps[baseline]
    short = [s.removeprefix("time/").removesuffix("_s") for s in STATIONS]
    head = ["arm", *short, "step", "rollout frac", "rollout x", "step x", "rollout tok/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, s in steps.items():
        row = [f"{s.stations[k]:.3g}" for k in STATIONS]
        rx = base.stations[names.TIME_ROLLOUT] / s.stations[names.TIME_ROLLOUT]
        sx = base.seconds / s.seconds
        lines.append(
            "| "
            + " | ".join(
                [
                    arm,
                    *row,
                    f"{s.seconds:.3g}",
                    f"{s.rollout_fraction:.0%}",
                    f"{rx:.2f}",
                    f"{sx:.2f}",
                    f"{s.response_tokens / s.stations[names.TIME_ROLLOUT]:.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def beside(steps: dict[str, Step], measured: dict[str, dict], aliases: dict[str, str] | None = None) -> str:
    """A markdown table of each station's fraction of the step, predicted / measured, for the arms in both
    ``steps`` and ``measured`` (a measured arm's run-log figures by arm name, e.g. ``sparserl bench step``'s
    ``summary``); ``aliases``: measured arm name → predicted arm name where they differ (e.g.
    ``rkv_fixed`` → ``rkv256``). Empty when no arm is in both."""
    aliases = aliases or {}
    short = [s.removeprefix("time/").removesuffix("_s") for s in STATIONS]
    head = ["arm", *(f"{s} pred / meas" for s in short), "step s pred / meas"]
    lines = []
    for name, row in measured.items():
        s = steps.get(aliases.get(name, name))
        total = row.get(names.TIME_STEP)
        if s is None or not total:
            continue
        cells = [f"{s.stations[k] / s.seconds:.0%} / {row.get(k, 0.0) / total:.0%}" for k in STATIONS]
        lines.append("| " + " | ".join([name, *cells, f"{s.seconds:.3g} / {total:.3g}"]) + " |")
    if not lines:
        return ""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines])
