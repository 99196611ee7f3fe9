"""The cheapest schedule meeting an α tail threshold, from a table of rows (a pure function).

For one compressor, given rows ``{"budget", "bin_start", "bin_end", "alpha_p5"}`` (one per measured
budget and length bin): choose a budget ``b_i`` per bin, **non-decreasing** with length (Sparrow's
schedules grow with it), such that the 5th percentile of α in every bin stays ``>= threshold``, at the
least cost (any cost that grows with each bin's budget: e.g. ``Σ_i width_i · b_i``, the KV the sampler
attends to).

Rule: a bin's smallest meeting budget ``m_i`` is the smallest measured budget whose p5 reaches the
threshold there; more KV is taken to be never worse (a budget above one that meets a bin meets it
too), so the cheapest non-decreasing schedule is the running maximum ``b_i = max_{j <= i} m_j``.

- A bin that no measured budget meets gets the largest budget and is listed in ``unmet_bins``; every
  later bin then holds the largest budget as well (non-decreasing).
- A (budget, bin) pair without a row counts as not meeting the threshold there.
- Should the chosen budget of a bin measure under the threshold although a smaller one met it (a
  non-monotone table: sampling noise), the bin is listed in ``nonmonotone_bins``: worth more samples.
"""

from __future__ import annotations

import math

__all__ = ["cheapest_schedule"]


def _meets(p5, threshold: float) -> bool:
    return p5 is not None and not (isinstance(p5, float) and math.isnan(p5)) and p5 >= threshold


def cheapest_schedule(rows: list[dict], compressor: str, threshold: float) -> dict:
    """``{"compressor", "threshold", "budget_by_bin": [[bin_start, budget], ...], "unmet_bins": [...],
    "nonmonotone_bins": [...], "alpha_p5_by_bin": [[bin_start, p5 at the chosen budget or None], ...]}``
    for ``compressor``'s rows (rows of other compressors are ignored); the rule is the module docstring's.
    ``budget_by_bin`` is a schedule as it stands (:class:`~sparserl.rollout.kv.schedule.KVSchedule`)."""
    mine = [r for r in rows if r["compressor"] == compressor]
    if not mine:
        raise ValueError(f"no rows for compressor {compressor!r}")
    budgets = sorted({int(r["budget"]) for r in mine})
    starts = sorted({int(r["bin_start"]) for r in mine})
    p5 = {(int(r["budget"]), int(r["bin_start"])): r["alpha_p5"] for r in mine}
    chosen, unmet, nonmonotone = [], [], []
    floor = budgets[0]
    for start in starts:
        meeting = [b for b in budgets if _meets(p5.get((b, start)), threshold)]
        if not meeting:
            unmet.append(start)
        floor = max(floor, meeting[0] if meeting else budgets[-1])
        chosen.append(floor)
        if meeting and not _meets(p5.get((floor, start)), threshold):
            nonmonotone.append(start)
    return {
        "compressor": compressor,
        "threshold": threshold,
        "budget_by_bin": [[s, b] for s, b in zip(starts, chosen)],
        "unmet_bins": unmet,
        "nonmonotone_bins": nonmonotone,
        "alpha_p5_by_bin": [[s, p5.get((b, s))] for s, b in zip(starts, chosen)],
    }
