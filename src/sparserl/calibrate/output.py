"""The calibration's outputs: the JSON document and the console tables.

The JSON (``sparserl calibrate --json OUT``)::

    {"rows": [{"compressor", "budget", "bin_start", "bin_end", "alpha_mean", "alpha_p5", "n_tokens"}, ...],
     "schedules": [{"compressor", "threshold", "budget_by_bin": [[start, budget], ...], "unmet_bins": [...],
                    "nonmonotone_bins": [...],
                    "alpha_p5_by_bin": [[start, p5], ...], "predicted_cost_vs_dense",
                    "measured_tokens_per_s_vs_dense", "measured_tokens_per_s", "measured_dense_tokens_per_s",
                    "measured_rounds"}, ...],
     "samplers": [{"compressor", "budget", "tokens", "replay_err", "q", "tokens_per_s", ...}, ...],
     "meta": {"command", "model", "data", "limit", "prompts", "cpu", "device", "sampling", "tokens",
              "bin", "threshold", "seed", "replay_err_max", "q", "measured_rounds", "seconds", ...}}

``q``: how each sampler's distributions reached α: ``kept`` while it sampled (no replay, ``replay_err``
null), ``replayed`` on its own tokens, or ``replayed on dense tokens`` (``--tokens dense``). A sampler's
``tokens_per_s`` is its measuring generation's, which copies ``q`` out when it keeps it; the schedules'
``measured_*`` speeds come from generations that keep nothing.

``schedules`` loads as a sampler's schedule: ``load_schedule(OUT, compressor)``
(:mod:`sparserl.rollout.kv.schedule`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def document(rows: list[dict], schedules: list[dict], samplers: list[dict], meta: dict) -> dict:
    return {"rows": rows, "schedules": schedules, "samplers": samplers, "meta": meta}


def _clean(x):
    """JSON without NaN: NaN and infinities become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(doc: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")
    return path


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_tables(rows: list[dict], schedules: list[dict], threshold: float, console=None) -> None:
    """Per compressor: the p5 of α per budget (rows) and length bin (columns), red under the threshold,
    the schedule's choice in bold with a ``*``; then the schedules with their costs against dense."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    chosen = {(s["compressor"], start): budget for s in schedules for start, budget in s["budget_by_bin"]}
    for name in dict.fromkeys(r["compressor"] for r in rows):
        mine = [r for r in rows if r["compressor"] == name]
        starts = sorted({r["bin_start"] for r in mine})
        cell = {(r["budget"], r["bin_start"]): r for r in mine}
        table = Table(title=f"{name}: p5 of α per sequence-length bin (threshold {threshold:g})", title_justify="left")
        table.add_column("budget", justify="right")
        for s in starts:
            table.add_column(f"{s}-", justify="right")
        for budget in sorted({r["budget"] for r in mine}):
            out = [str(budget)]
            for s in starts:
                r = cell.get((budget, s))
                if r is None:
                    out.append("")
                    continue
                text = _fmt(r["alpha_p5"], ".4f")
                style = "red" if not (r["alpha_p5"] is not None and r["alpha_p5"] >= threshold) else ""
                if chosen.get((name, s)) == budget:
                    style = (style + " bold").strip()
                    text = f"{text} *"
                out.append(f"[{style}]{text}[/]" if style else text)
            table.add_row(*out, end_section=False)
        console.print(table)
    table = Table(
        title="schedules (length:budget, from that length on; * above: the chosen budget)", title_justify="left"
    )
    for col in ("compressor", "budget_by_bin", "unmet bins", "predicted cost vs dense", "tokens/s vs dense (1 round)"):
        table.add_column(col)
    for s in schedules:
        table.add_row(
            s["compressor"],
            " ".join(f"{a}:{b}" for a, b in s["budget_by_bin"]),
            ", ".join(map(str, s["unmet_bins"])) or "-",
            _fmt(s.get("predicted_cost_vs_dense")),
            _fmt(s.get("measured_tokens_per_s_vs_dense"), ".2f"),
        )
    console.print(table)
