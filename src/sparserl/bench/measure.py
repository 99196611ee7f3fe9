"""Round-robin timing in one process: every arm runs once per round, the order rotating by one arm each
round, so a drift of the machine's speed over the minutes of a measurement falls on all arms alike and
no arm always runs first; an arm is reported by the median of its runs and compared with another by the
median of the per-round ratios (a round run at half speed moves both sides of its ratio).

- :func:`time_rounds`: arms as plain callables (``name -> fn``), wall time of each call and what it
  returned, optional untimed warm-up calls; :class:`Rounds` gives medians and per-round ratios.
- :func:`run_rounds`: the rows of ``sparserl bench rollout`` (:class:`Row`, each run returning its own
  :class:`Run` record, peak memory sampled around it).
- :func:`best_seconds`, :func:`best_rate`: the best of several passes, for kernels timed alone (no other
  arm to pair with)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Peak resident memory while a block runs (sampled every 5 ms in a thread)."""

    def __enter__(self):
        self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


@dataclass
class Run:
    """One timed run of a row: ``tokens`` generated in ``seconds`` (prefill included)."""

    seconds: float
    tokens: int
    kv_bytes_peak: int
    kv_bytes_theory: int
    rss_peak_bytes: int = 0
    extra: dict = field(default_factory=dict)  # row-specific fields of this run (e.g. compressions)


@dataclass
class Row:
    """A benchmark row: what it is (``fields``: engine, compressor, kv_budget, ...), how to run it
    once, and the mean number of cached tokens per sequence its decode reads (for the roofline)."""

    fields: dict
    run: Callable[[], Run]
    kv_tokens_avg: float
    runs: list[Run] = field(default_factory=list)

    @property
    def tokens_per_s_runs(self) -> list[float]:
        return [r.tokens / r.seconds for r in self.runs]

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.tokens_per_s_runs)


def median_round_ratio(runs: list[float], baseline_runs: list[float]) -> float:
    """The median over rounds of ``runs[i] / baseline_runs[i]``: each ratio taken within one round of one
    process, so a round run at half speed moves both sides (a median divided by a median does not)."""
    if len(runs) != len(baseline_runs) or not runs:
        raise ValueError(f"rounds differ: {len(runs)} against {len(baseline_runs)}")
    return statistics.median(a / b for a, b in zip(runs, baseline_runs))


def round_order(names: list, r: int) -> list:
    """Round ``r``'s order: ``names`` rotated to start at ``names[r mod n]``."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


@dataclass
class Rounds:
    """What :func:`time_rounds` measured: per arm, in round order, each call's wall ``seconds`` and what
    it returned (``results``)."""

    seconds: dict[str, list[float]]
    results: dict[str, list[Any]]

    def values(self, name: str, value: Callable[[Any], float] | None = None) -> list[float]:
        """Per round, ``value`` of the arm's result (e.g. ``lambda out: out.tokens_per_s``), or its seconds."""
        return list(self.seconds[name]) if value is None else [value(x) for x in self.results[name]]

    def median(self, name: str, value: Callable[[Any], float] | None = None) -> float:
        return statistics.median(self.values(name, value))

    def ratios(self, name: str, baseline: str, value: Callable[[Any], float] | None = None) -> list[float]:
        """Per round, the arm's value over the baseline's (with seconds: > 1 means ``name`` is slower)."""
        return [a / b for a, b in zip(self.values(name, value), self.values(baseline, value))]

    def median_ratio(self, name: str, baseline: str, value: Callable[[Any], float] | None = None) -> float:
        """:func:`median_round_ratio` of the arm's values against the baseline's."""
        return median_round_ratio(self.values(name, value), self.values(baseline, value))


def time_rounds(
    arms: dict[str, Callable[[], Any]],
    rounds: int,
    warmup: int = 0,
    rotate: bool = True,
    on_run: Callable[[int, str, float, Any], None] | None = None,
    reset: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Rounds:
    """Call every arm once per round for ``rounds`` rounds (order rotated each round unless ``rotate``
    is false), after ``warmup`` untimed calls of each; ``reset()`` after every call, untimed (e.g. put
    back the weights an arm updated); ``on_run(round, name, seconds, result)`` after each timed call
    (to print progress). Arms that synchronize a device do so inside the callable."""
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name]()
            if reset is not None:
                reset()
    out = Rounds({n: [] for n in names}, {n: [] for n in names})
    for r in range(rounds):
        for name in round_order(names, r) if rotate else names:
            t = clock()
            result = arms[name]()
            seconds = clock() - t
            out.seconds[name].append(seconds)
            out.results[name].append(result)
            if reset is not None:
                reset()
            if on_run is not None:
                on_run(r, name, seconds, result)
    return out


def best_seconds(
    fn: Callable[[], Any], passes: int = 5, calls: int = 1, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The fastest of ``passes`` timed passes of ``calls`` calls of ``fn``, in seconds per call."""
    best = float("inf")
    for _ in range(passes):
        t = clock()
        for _ in range(calls):
            fn()
        best = min(best, clock() - t)
    return best / calls


def best_rate(fn: Callable[[], Any], macs: int, calls: int, passes: int = 5) -> float:
    """GMAC/s (10⁹ multiply-adds a second) of ``fn``, ``macs`` multiply-adds a call: ``macs`` over
    :func:`best_seconds` of ``passes`` passes of ``calls`` calls."""
    return macs / best_seconds(fn, passes=passes, calls=calls) / 1e9


def run_rounds(rows: list[Row], repeat: int, on_run: Callable[[Row, Run], None] | None = None) -> None:
    """Run every row ``repeat`` times, round by round; each row keeps its runs in ``row.runs``. The
    order rotates by one row each round (round ``r`` starts with row ``r mod n``), so that no row
    always runs first or right after the same one: the first run of a round can read several percent
    off, and a fixed order would put that on the same row, e.g. the dense baseline, every round."""
    for r in range(repeat):
        for row in round_order(rows, r):
            with RssSampler() as rss:
                run = row.run()
            run.rss_peak_bytes = max(run.rss_peak_bytes, rss.peak)
            row.runs.append(run)
            if on_run is not None:
                on_run(row, run)
