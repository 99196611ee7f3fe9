"""Seconds spent per station of a step, kept out of the stations' code: ``with laps(name): ...`` adds the
block's wall clock to ``laps.seconds[name]`` (``time/<station>_s``, :mod:`sparserl.runlog`)."""

from __future__ import annotations

import time
from contextlib import contextmanager


class Laps:
    """The step's clock: :attr:`seconds` per station name, and :meth:`total` since it started."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def total(self) -> float:
        return time.perf_counter() - self.started
