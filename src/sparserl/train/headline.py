"""The run's headline, as the trainer's summary prints it: the figures that judge a run's promise and a
verdict only where one is measured.

    KV allocated: 1/3.2 of a dense engine's for the same batches (mean 2.00 MiB vs 6.40 MiB per step)
    KV tokens held at each response's end: 20 kept vs 80 dense, 25% (1/4.0)
    α tail (5th percentile per length bin) against the controller's threshold 0.86 (...): at the last step ...
    final reward (reward/verifier_mean, mean of the last 5 steps): 0.42 (first step 0.10, last 0.45)
    verdict: no dense run to compare with: `sparserl compare default --arms dense,default --seeds 6` measures it

The figures and their wording live in :func:`sparserl.eval.report.headline_lines`, so that ``report.md``
opens with the same lines (``sparserl.eval`` never imports ``sparserl.train``); this module takes the
trainer's typed :class:`~sparserl.config.Config` and reads it as the run's ``config.yaml`` holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import config_to_dict
from ..eval.report import headline
from ..eval.report import headline_lines as _report_headline_lines

__all__ = ["headline", "headline_lines"]


def _as_dict(cfg: Any) -> dict | None:
    if cfg is None or isinstance(cfg, dict):
        return cfg
    return config_to_dict(cfg)


def headline_lines(rows: Sequence[dict], cfg: Any, dense_rows: Sequence[dict] | None = None) -> list[str]:
    """The headline of a run from its metrics rows (``metrics.jsonl``'s dicts, a resumed step's last row
    winning) and its config (a :class:`~sparserl.config.Config` or the dict of ``config.yaml``):
    KV allocated vs dense, KV tokens kept vs dense, α's tail vs the controller's threshold
    (``rollout.kv_controller``; else Sparrow's), the final reward, and the verdict line: with
    ``dense_rows`` (the dense run of the same seed, a compare's dense arm) the paired difference of the
    final rewards, else that a single run cannot compare with dense and which comparison measures it."""
    return _report_headline_lines(rows, _as_dict(cfg), dense_rows)
