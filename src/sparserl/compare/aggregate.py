"""The numbers of a comparison: per arm, its seeds' curves aligned by step and summarised.

Pure functions on curves (``{step: value}`` per seed); nothing here reads files.

- :func:`band`: per step, the mean over the seeds that logged it, and their min and max.
- :func:`final_value`: a seed's final value = mean of its last ``k`` logged steps,
  ``k = tail_k(steps) = max(1, steps // 4)``; an arm's final = mean ± sample std (n - 1; 0 for one
  seed) of its seeds' finals.
- :func:`best_step`: the step where the arm's mean curve is highest (the first such step).
- :func:`collapse`: a seed *collapsed* when the mean reward of its last third of logged steps is
  below the mean of its first third by more than ``drop`` (0.05; a third = ``max(1, n // 3)``
  steps, so a one-step run never collapses by this rule), or when any step's k3 KL between the
  sampler and the dense policy (``mismatch/k3_kl``) is above ``k3_threshold`` (1.0, ``--collapse-k3``).
- :func:`summarize_arm`: all of that for one arm, plus mismatch, Sparrow's acceptance α (mean and 5th
  percentile: each seed's final value as the reward's, then mean ± std over the seeds that logged it;
  None when none did, ``mismatch.alpha=off``), KV (allocation against allocation, kept tokens against
  dense tokens) and time means; :func:`versus_dense` adds each arm's KV allocation against the dense
  arm's measured one.
- :func:`paired_difference`: an arm against the dense arm seed by seed (the same ``train.seed`` draws the
  same prompts, so the pairs share that part of the noise): the differences ``d_s = x_s - y_s``, their
  mean ``d̄``, sample std ``s_d``, and the 95% interval ``d̄ ± t_{0.975, n-1} · s_d / √n`` (Student's t);
  *better* / *worse* when the interval lies above / below 0, else *within noise*, with the interval's
  half-width the smallest difference these seeds could have told apart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .. import runlog as names

__all__ = [
    "Band",
    "Collapse",
    "COLLAPSE_DROP",
    "COLLAPSE_K3",
    "STEP_TIME",
    "band",
    "best_step",
    "collapse",
    "collapse_rule",
    "final_value",
    "mean_std",
    "paired_difference",
    "summarize_arm",
    "tail_k",
    "versus_dense",
]

COLLAPSE_DROP = 0.05
COLLAPSE_K3 = 1.0
#: the key under which a seed's per-step time (``runlog.step_seconds``) is passed in
STEP_TIME = "step_time"

Curve = Mapping[int, float]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ordered(curve: Curve | None) -> list[tuple[int, float]]:
    return sorted((int(s), float(v)) for s, v in (curve or {}).items() if _finite(v))


def tail_k(steps: int) -> int:
    """How many last steps make a seed's final value: ``max(1, steps // 4)``."""
    return max(1, int(steps) // 4)


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1; 0 for one value); (None, None) for none."""
    vals = [float(v) for v in values if _finite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


@dataclass
class Band:
    """An arm's curve: per step, the mean over the seeds that logged it, their min, max and count."""

    steps: list[int] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.steps)


def band(curves: Sequence[Curve | None]) -> Band:
    """Align the seeds' curves by step: mean, min and max over the seeds present at each step."""
    by_step: dict[int, list[float]] = {}
    for c in curves:
        for s, v in _ordered(c):
            by_step.setdefault(s, []).append(v)
    b = Band()
    for s in sorted(by_step):
        vs = by_step[s]
        b.steps.append(s)
        b.mean.append(statistics.fmean(vs))
        b.lo.append(min(vs))
        b.hi.append(max(vs))
        b.count.append(len(vs))
    return b


def final_value(curve: Curve | None, k: int) -> float | None:
    """Mean of the last ``k`` logged steps of a curve (None when it is empty)."""
    pts = _ordered(curve)
    if not pts:
        return None
    return statistics.fmean(v for _, v in pts[-max(1, k) :])


def best_step(b: Band) -> tuple[int | None, float | None]:
    """The step where the mean curve is highest (the first one on a tie) and its value."""
    if not b:
        return None, None
    i = max(range(len(b.mean)), key=lambda j: (b.mean[j], -j))
    return b.steps[i], b.mean[i]


@dataclass
class Collapse:
    """Whether a seed collapsed, and why (empty when it did not)."""

    collapsed: bool
    reasons: list[str] = field(default_factory=list)


def collapse_rule(k3_threshold: float = COLLAPSE_K3, drop: float = COLLAPSE_DROP) -> str:
    """The collapse rule in words (for the report)."""
    return (
        f"a seed collapsed when the mean reward of its last third of steps is below the mean of its "
        f"first third by more than {drop:g} (a third = max(1, steps // 3) logged steps), or when any "
        f"step's `{names.MISMATCH_K3}` (k3 KL, sampler vs dense policy) exceeds {k3_threshold:g}"
    )


def collapse(
    reward: Curve | None, k3: Curve | None = None, k3_threshold: float = COLLAPSE_K3, drop: float = COLLAPSE_DROP
) -> Collapse:
    """Apply the collapse rule (module docstring) to one seed's reward and k3 curves."""
    reasons = []
    pts = _ordered(reward)
    if len(pts) >= 2:
        t = max(1, len(pts) // 3)
        first = statistics.fmean(v for _, v in pts[:t])
        last = statistics.fmean(v for _, v in pts[-t:])
        if last < first - drop:
            span = "step" if t == 1 else f"{t} steps"
            reasons.append(f"reward fell from {first:.3f} (first {span}) to {last:.3f} (last {span})")
    spikes = [(s, v) for s, v in _ordered(k3) if v > k3_threshold]
    if spikes:
        s, v = max(spikes, key=lambda p: p[1])
        reasons.append(
            f"k3 {v:.3g} > {k3_threshold:g} at step {s}" + (f" ({len(spikes)} steps above)" if len(spikes) > 1 else "")
        )
    return Collapse(bool(reasons), reasons)


def _mean_over(curves: Sequence[Curve | None]) -> float | None:
    """Mean over every logged step of every seed."""
    vals = [v for c in curves for _, v in _ordered(c)]
    return statistics.fmean(vals) if vals else None


def _max_over(curves: Sequence[Curve | None]) -> float | None:
    vals = [v for c in curves for _, v in _ordered(c)]
    return max(vals) if vals else None


def reward_curve(seed: Mapping[str, Curve]) -> Curve | None:
    """The reward an arm is ranked by: the verifier's mean (``reward/verifier_mean``), so that an arm whose reward
    is shaped (a length penalty, a weighted format bonus) compares with one whose is not; ``reward/mean`` for a run
    logged before that metric existed (the same figure for a single reward)."""
    return seed.get(names.REWARD_VERIFIER_MEAN) or seed.get(names.REWARD_MEAN)


def summarize_arm(
    seeds: Mapping[str, Mapping[str, Curve]],
    k3_threshold: float = COLLAPSE_K3,
    drop: float = COLLAPSE_DROP,
    k: int | None = None,
) -> dict:
    """One arm's figures from its seeds' curves: ``seeds`` maps a run name to ``{metric: {step: value}}``
    (``runlog`` names, plus :data:`STEP_TIME`). ``k``: steps in each seed's final value (default
    :func:`tail_k` of the longest seed)."""
    runs = list(seeds)

    def curves(key: str) -> list[Curve | None]:
        return [seeds[r].get(key) for r in runs]

    rewards = [reward_curve(seeds[r]) for r in runs]
    n_steps = max((len(_ordered(c)) for c in rewards), default=0)
    k = tail_k(n_steps) if k is None else k
    finals = {r: final_value(reward_curve(seeds[r]), k) for r in runs}
    fmean, fstd = mean_std([v for v in finals.values() if v is not None])

    def final_over_seeds(key: str) -> dict:
        per_seed = {r: final_value(seeds[r].get(key), k) for r in runs}
        m, s = mean_std([v for v in per_seed.values() if v is not None])
        return {"mean": m, "std": s, "per_seed": per_seed, "seeds": sum(v is not None for v in per_seed.values())}

    rb = band(rewards)
    bstep, bval = best_step(rb)
    coll = {r: collapse(reward_curve(seeds[r]), seeds[r].get(names.MISMATCH_K3), k3_threshold, drop) for r in runs}
    alloc, dense_alloc = _mean_over(curves(names.KV_SAMPLER_ALLOC)), _mean_over(curves(names.KV_DENSE_ALLOC))
    kept = _mean_over(curves(names.KV_KEPT_FRAC))
    return {
        "runs": runs,
        "seeds": len(runs),
        "steps": n_steps,
        "final_k": k,
        "final_reward": {"mean": fmean, "std": fstd, "per_seed": finals},
        "best": {"step": bstep, "mean_reward": bval},
        "collapsed": {r: asdict(c) for r, c in coll.items()},
        "n_collapsed": sum(c.collapsed for c in coll.values()),
        "k3": {"mean": _mean_over(curves(names.MISMATCH_K3)), "max": _max_over(curves(names.MISMATCH_K3))},
        "masked_frac": _mean_over(curves(names.MASKED_FRAC)),
        "alpha": {"mean": final_over_seeds(names.MISMATCH_ALPHA_MEAN), "p5": final_over_seeds(names.MISMATCH_ALPHA_P5)},
        "kv": {
            "sampler_alloc_bytes": alloc,
            "dense_alloc_bytes": dense_alloc,
            "alloc_reduction": dense_alloc / alloc if alloc and dense_alloc else None,
            "alloc_saved_frac": 1 - alloc / dense_alloc if alloc and dense_alloc else None,
            "kept_frac": kept,
            "tokens_saved_frac": 1 - kept if kept is not None else None,
            "kept_tokens": _mean_over(curves(names.KV_KEPT_TOKENS)),
            "dense_tokens": _mean_over(curves(names.KV_DENSE_TOKENS)),
        },
        "time": {"rollout_s": _mean_over(curves(names.TIME_ROLLOUT)), "step_s": _mean_over(curves(STEP_TIME))},
    }


#: Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom; between rows the smaller df's
#: (wider) value, past 30 the normal's 1.960 would be too narrow below ~60, so 30's is kept (conservative)
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t_975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` >= 1 degrees of freedom (:data:`T_975`)."""
    return T_975[max(k for k in T_975 if k <= df)]


def paired_difference(values: Mapping[int, float | None], reference: Mapping[int, float | None]) -> dict:
    """``values`` minus ``reference`` seed by seed (both keyed by seed; the seeds both have, finite): ``n``,
    ``mean``, ``std`` (n - 1), the 95% interval ``ci95`` [lo, hi] (None under 2 pairs) and the ``verdict``:
    ``better`` (lo > 0), ``worse`` (hi < 0), ``within noise`` or None (under 2 pairs)."""
    seeds = sorted(s for s in values if s in reference and _finite(values[s]) and _finite(reference[s]))
    diffs = [float(values[s]) - float(reference[s]) for s in seeds]
    mean, std = mean_std(diffs)
    ci, verdict = None, None
    if len(diffs) >= 2:
        half = t_975(len(diffs) - 1) * std / math.sqrt(len(diffs))
        ci = [mean - half, mean + half]
        verdict = "better" if ci[0] > 0 else "worse" if ci[1] < 0 else "within noise"
    return {"n": len(diffs), "seeds": seeds, "mean": mean, "std": std, "ci95": ci, "verdict": verdict}


def versus_dense(summaries: Mapping[str, dict], dense_arm: str | None) -> None:
    """Add ``kv.vs_dense_arm`` (the dense arm's measured allocation / this arm's, ×) to each summary."""
    ref = summaries.get(dense_arm, {}).get("kv", {}).get("sampler_alloc_bytes") if dense_arm else None
    for s in summaries.values():
        a = s["kv"]["sampler_alloc_bytes"]
        s["kv"]["vs_dense_arm"] = ref / a if ref and a else None
        s["kv"]["dense_arm"] = dense_arm
