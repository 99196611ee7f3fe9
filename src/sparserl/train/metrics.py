"""Metrics: one JSON line per step, TensorBoard scalars, optional W&B, and a progress display.

``MetricsLogger`` is the one place a step's numbers go; ``sparserl.runlog.read_metrics`` reads them
back (the report, the comparison, resume). Metric names are defined once, in ``sparserl.runlog``.

The file ``metrics.jsonl`` is append-only, one ``{"step": ..., <metrics>, "time": <unix s>}`` per
line, flushed at once so a killed run loses at most the line being written; ``read_metrics`` skips
such a truncated line and ``truncate_after`` drops the steps a resumed run will redo.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import runlog as names
from ..runlog import METRICS_FILE, read_metrics

__all__ = ["MetricsLogger", "read_metrics", "format_step_line", "PROGRESS_FIELDS"]

# (label, candidate metric names (first present wins), format) for the one-line step summary.
PROGRESS_FIELDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", (names.REWARD_MEAN,), "{:.3f}"),
    ("acc", (names.ACCURACY,), "{:.3f}"),
    ("k3", (names.MISMATCH_K3,), "{:.2g}"),
    ("α p5", (names.MISMATCH_ALPHA_P5,), "{:.3f}"),
    ("masked", (names.MASKED_FRAC,), "{:.1%}"),
    ("kv kept", (names.KV_KEPT_FRAC,), "{:.0%}"),
    ("kv alloc", (names.KV_ALLOC_REDUCTION,), "1/{:.1f}"),
    ("len", (names.LENGTH_MEAN,), "{:.0f}"),
    ("batches", (names.GEN_BATCHES,), "{:.0f}"),  # with algorithm.filter_groups only
)


def _to_float(v: Any) -> float | None:
    """A metric value as a float (tensors and numpy scalars too); None if it is not a number."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item):
        try:
            x = item()
        except (ValueError, RuntimeError):  # a tensor with more than one element
            return None
        return float(x) if isinstance(x, (int, float, bool)) else None
    return None


def format_step_line(step: int, metrics: Mapping[str, Any], total_steps: int | None = None) -> str:
    """``step 3/20 reward 0.410 acc 0.410 kl 0.002 kv 3.1x 12.3s``: the fields present, in order."""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    for label, keys, fmt in PROGRESS_FIELDS:
        for k in keys:
            x = _to_float(metrics.get(k)) if k in metrics else None
            if x is not None and math.isfinite(x):
                parts.append(f"{label} {fmt.format(x)}")
                break
    secs = names.step_seconds({k: _to_float(v) for k, v in metrics.items() if k.startswith("time/")})
    if secs is not None:
        parts.append(f"{secs:.1f}s")
    return " ".join(parts)


class MetricsLogger:
    """Writes each step's metrics to ``run_dir/metrics.jsonl``, TensorBoard and (optionally) W&B,
    and shows progress.

    ``progress``: ``auto`` (a live ``rich`` bar when stdout is a terminal, else ``plain``),
    ``rich``, ``plain`` (one line per step on stdout), or ``none``.
    Appends to an existing ``metrics.jsonl`` (resume); call ``truncate_after(step)`` first to drop
    the steps that will be redone.
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str | None = None,
        config_dict: dict | None = None,
        progress: str = "auto",
        total_steps: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.total_steps = total_steps
        self._drop_partial_line()
        self._file = open(self.path, "a", encoding="utf-8")
        self._closed = False

        self._tb = None
        self._tb_enabled = tensorboard
        if tensorboard:
            self._tb = self._open_tb()

        self._wandb = None
        if wandb:
            try:
                import wandb as _wandb  # type: ignore[import-not-found]
            except ImportError:
                warnings.warn(
                    "log.wandb is set but wandb is not installed (pip install wandb); "
                    "logging to metrics.jsonl and TensorBoard only",
                    stacklevel=2,
                )
            else:
                self._wandb = _wandb.init(
                    project=wandb_project or "sparserl",
                    name=self.run_dir.name,
                    dir=str(self.run_dir),
                    config=config_dict or {},
                    resume="allow",
                )

        if progress == "auto":
            progress = "rich" if sys.stdout.isatty() else "plain"
        if progress not in ("rich", "plain", "none"):
            raise ValueError(f"progress={progress!r}: expected auto, rich, plain or none")
        self.progress_mode = progress
        self._progress = None
        self._task = None
        if progress == "rich":
            self._start_rich()

    # -- setup -------------------------------------------------------------------------------
    def _open_tb(self, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard package missing
            warnings.warn(f"TensorBoard logging off: {e}", stacklevel=3)
            return None
        return SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step, flush_secs=30)

    def _start_rich(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[summary]}"),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total_steps, summary="")

    def _drop_partial_line(self) -> None:
        """If the file ends mid-line (a run killed while writing), cut that partial line off."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as f:
                f.truncate(cut)

    # -- logging -----------------------------------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` for ``step``: one JSON line (flushed), TensorBoard, W&B, progress.

        Values may be Python numbers, 0-d tensors or numpy scalars (converted to float); strings
        are kept in the JSON line only; non-finite numbers are written as null.
        """
        if self._closed:
            raise RuntimeError("MetricsLogger is closed")
        row: dict[str, Any] = {"step": int(step)}
        scalars: dict[str, float] = {}
        for k, v in metrics.items():
            if k in ("step", "time"):
                continue
            x = _to_float(v)
            if x is None:
                if isinstance(v, str) or v is None:
                    row[k] = v
                continue
            row[k] = x if math.isfinite(x) else None
            scalars[k] = x
        row["time"] = time.time()
        for k in row:
            if not names.is_registered(k):
                warnings.warn(
                    f"metric {k!r} is not registered in sparserl.runlog.METRICS (docs/metrics.md lists those that are)",
                    names.UnregisteredMetricWarning,
                    stacklevel=2,
                )
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        try:
            os.fsync(self._file.fileno())
        except OSError:
            pass

        if self._tb is not None:
            for k, x in scalars.items():
                self._tb.add_scalar(k, x, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(scalars), step=int(step))

        line = format_step_line(step, metrics, self.total_steps)
        if self.progress_mode == "plain":
            print(line, flush=True)
        elif self._progress is not None:
            summary = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""
            self._progress.console.print(line, highlight=False)
            self._progress.update(self._task, completed=int(step), summary=summary)

    def message(self, text: str) -> None:
        """Print a line of text without breaking the progress display."""
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
        elif self.progress_mode != "none":
            print(text, flush=True)

    def truncate_after(self, step: int) -> int:
        """Drop the rows with ``step > step`` (a resumed run redoes them); returns rows kept.

        TensorBoard events after ``step`` are purged by reopening the writer with ``purge_step``.
        """
        self._file.close()
        rows_kept: list[str] = []
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and row["step"] <= step:
                    rows_kept.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in rows_kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        if self._tb is not None:
            self._tb.close()
            self._tb = self._open_tb(purge_step=int(step) + 1)
        if self._progress is not None:
            self._progress.update(self._task, completed=int(step))
        return len(rows_kept)

    def close(self) -> None:
        """Flush and close everything (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._progress is not None:
            self._progress.stop()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
