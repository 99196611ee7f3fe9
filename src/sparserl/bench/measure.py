"""Timing rows of a benchmark: each row is run ``repeat`` times, in rounds (every row once per round,
so a drift of the machine's speed over the minutes of a benchmark falls on all rows alike), and
reported by the median of its runs."""
from __future__ import annotations

import os
import statistics
import threading
from dataclasses import dataclass, field
from typing import Callable


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


def run_rounds(rows: list[Row], repeat: int, on_run: Callable[[Row, Run], None] | None = None) -> None:
    """Run every row ``repeat`` times, round by round; each row keeps its runs in ``row.runs``. The
    order rotates by one row each round (round ``r`` starts with row ``r mod n``), so that no row
    always runs first or right after the same one: measured here, the first run of a round can read
    several percent off, and a fixed order put that on the dense baseline every round."""
    for r in range(repeat):
        k = r % len(rows) if rows else 0
        for row in rows[k:] + rows[:k]:
            with RssSampler() as rss:
                run = row.run()
            run.rss_peak_bytes = max(run.rss_peak_bytes, rss.peak)
            row.runs.append(run)
            if on_run is not None:
                on_run(row, run)
