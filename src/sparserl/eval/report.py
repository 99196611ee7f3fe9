"""Report of a finished (or running) run: PNG plots and a markdown summary.

``make_report(run_dir)`` reads ``metrics.jsonl`` (``sparserl.train.metrics``), ``config.yaml`` and any
``eval*.json`` of a run folder and writes into it::

    reward.png     reward/mean ± reward/std, accuracy (and held-out pass@1 points, dense and sparse)
    mismatch.png   sampler-vs-dense mismatch (mismatch/* but α), IS weights (is/*), rejection (rs/*)
    alpha.png      Sparrow's acceptance α over steps: its 5th percentile per length bin, overall, and
                   its mean, against Sparrow's stability threshold (only when the run measured α)
    kv_memory.png  KV bytes allocated, sampler vs dense engine; tokens kept vs dense at each end
    time.png       seconds per station per step, stacked (time/*_s)
    loss.png       policy/loss, grad_norm, policy/entropy, policy/kl_ref
    report.md      the headline (:func:`headline_lines`: KV vs dense, α's tail vs the threshold, final
                   reward, a verdict only where measured), the figures that matter, links to the plots

A plot whose metrics are all absent is skipped. Several runs are compared by ``sparserl compare``
(``sparserl.compare``), which reuses the readers and plot helpers here.

Plots use matplotlib's object API on the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import runlog as names
from ..runlog import STATIONS, SUBTIMES, TIME_STEP, read_metrics, step_seconds

__all__ = [
    "make_report",
    "load_run",
    "RunData",
    "summarize",
    "alpha_figure",
    "alpha_threshold",
    "headline",
    "headline_lines",
    "rows_by_step",
    "SPARROW_ALPHA_P5_THRESHOLD",
]

MISMATCH_NAMED = (names.MISMATCH_LOG_RATIO, names.MISMATCH_K3)
ALPHA_NAMED = (names.MISMATCH_ALPHA_MEAN, names.MISMATCH_ALPHA_P5, names.MISMATCH_ALPHA_P5_NOPHI)
#: Sparrow (Zhou et al., 2026, arXiv 2606.08446): training stayed stable while the 5th percentile of
#: the acceptance α in every sequence-length bin stayed above this (``sparserl.mismatch.acceptance``)
SPARROW_ALPHA_P5_THRESHOLD = 0.86
IS_NAMED = (names.IS_WEIGHT_MIN, names.IS_WEIGHT_MAX)
RS_NAMED = (names.TOKEN_MASKED_FRAC, names.SEQ_VETOED_FRAC)
MiB = 1 / 2**20


# ---------------------------------------------------------------------------------------------
# Reading a run
# ---------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """One run folder, read: rows deduplicated by step (the last row of a step wins), sorted."""

    run_dir: Path
    rows: list[dict]
    config: dict | None = None
    evals: list[tuple[str, dict]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run_dir.name

    def keys(self) -> set[str]:
        return {k for r in self.rows for k in r}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of ``key`` (steps where it is missing are left out)."""
        xs, ys = [], []
        for r in self.rows:
            v = r.get(key)
            if _is_num(v):
                xs.append(int(r["step"]))
                ys.append(float(v))
        return xs, ys

    def first_key(self, candidates: Iterable[str]) -> str | None:
        """The first of ``candidates`` with at least one value."""
        for k in candidates:
            if self.series(k)[0]:
                return k
        return None

    def step_times(self) -> tuple[list[int], list[float]]:
        """Seconds per step (:func:`sparserl.runlog.step_seconds`: ``time/step_s``, else the stations' sum)."""
        xs, ys = [], []
        for r in self.rows:
            seconds = step_seconds(r)
            if seconds is not None and math.isfinite(seconds):
                xs.append(int(r["step"]))
                ys.append(seconds)
        return xs, ys

    def station_keys(self) -> list[str]:
        """``time/*_s`` keys present that add up to a step: the stations first, then any other, never
        ``time/step_s`` nor a part of a station (``runlog.SUBTIMES``)."""
        present = self.keys()
        extra = sorted(
            k
            for k in present
            if k.startswith("time/") and k.endswith("_s") and k not in STATIONS and k not in SUBTIMES and k != TIME_STEP
        )
        return [k for k in STATIONS if k in present and self.series(k)[0]] + [k for k in extra if self.series(k)[0]]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _flatten(d: dict, prefix: str = "") -> dict:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
    return out


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder: metrics.jsonl, config.yaml (if any), eval*.json (if any)."""
    run_dir = Path(run_dir)
    rows = rows_by_step(read_metrics(run_dir))  # a resumed run's redone step replaces the old one
    config = None
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        try:
            loaded = yaml.safe_load(cfg_path.read_text())
            config = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError:
            config = None
    evals: list[tuple[str, dict]] = []
    for p in sorted(run_dir.glob("eval*.json")):
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if isinstance(data, dict):
            evals.append((p.name, _flatten(data)))
    evals.sort(key=lambda e: (e[1].get("step") if _is_num(e[1].get("step")) else math.inf, e[0]))
    return RunData(run_dir=run_dir, rows=rows, config=config, evals=evals)


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------
def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e9:
        return f"{int(x):,}" if abs(x) >= 10000 else str(int(x))
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _fmt_bytes(x: float | None) -> str:
    if x is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.2f} {unit}"
        x /= 1024
    return f"{x:.2f} GiB"


def _mean(v: Sequence[float]) -> float | None:
    return statistics.fmean(v) if v else None


def alpha_threshold(config: dict | None) -> tuple[float, str]:
    """The threshold a run's α tail is read against, and its name: the controller's
    (``rollout.kv_controller.threshold``) when the run has one, else Sparrow's (:data:`SPARROW_ALPHA_P5_THRESHOLD`)."""
    threshold = _dig(config or {}, "rollout.kv_controller.threshold")
    if _is_num(threshold):
        return float(threshold), "the controller's threshold"
    return SPARROW_ALPHA_P5_THRESHOLD, "Sparrow's threshold"


def summarize(run: RunData, tail: int = 5) -> dict[str, Any]:
    """The figures of a run: reward/accuracy first, last, best,
    tail mean; the same of α's mean and 5th percentile, and the 5th percentile's (overall and per length bin)
    last, worst and steps below the run's threshold (:func:`alpha_threshold`); mean seconds per step and per
    station; KV and mismatch means; final eval accuracy."""
    out: dict[str, Any] = {
        "name": run.name,
        "steps": len(run.rows),
        "first_step": run.rows[0]["step"] if run.rows else None,
        "last_step": run.rows[-1]["step"] if run.rows else None,
    }
    for label, key in (("reward", names.REWARD_MEAN), ("accuracy", names.ACCURACY)):
        xs, ys = run.series(key)
        if ys:
            i = max(range(len(ys)), key=lambda j: ys[j])
            out[label] = {
                "first": ys[0],
                "last": ys[-1],
                "best": ys[i],
                "best_step": xs[i],
                "tail_mean": _mean(ys[-tail:]),
                "key": key,
            }
    _, st = run.step_times()
    out["time_per_step_s"] = _mean(st)
    out["total_time_s"] = sum(st) if st else None
    out["stations"] = {k: _mean(run.series(k)[1]) for k in run.station_keys()}
    out["subtimes"] = {k: _mean(run.series(k)[1]) for k in SUBTIMES if run.series(k)[0]}
    for key in (
        names.KV_SAMPLER_ALLOC,
        names.KV_DENSE_ALLOC,
        names.KV_KEPT_FRAC,
        names.KV_KEPT_TOKENS,
        names.KV_DENSE_TOKENS,
    ):
        ys = run.series(key)[1]
        out[key] = {"mean": _mean(ys), "min": min(ys, default=None), "max": max(ys, default=None)}
    # Sparrow's acceptance α (higher is closer to dense): its mean and 5th percentile like the reward,
    # and per bin the worst step and how many steps were below Sparrow's threshold
    for key in ALPHA_NAMED:
        xs, ys = run.series(key)
        if ys:
            i = max(range(len(ys)), key=lambda j: ys[j])
            out[key] = {
                "first": ys[0],
                "last": ys[-1],
                "best": ys[i],
                "best_step": xs[i],
                "tail_mean": _mean(ys[-tail:]),
                "key": key,
            }
    thr, thr_name = alpha_threshold(run.config)
    out["alpha_threshold"], out["alpha_threshold_name"] = thr, thr_name
    out["alpha_tail"] = {}
    for key in [names.MISMATCH_ALPHA_P5] + alpha_bin_keys(run):
        xs, ys = run.series(key)
        if ys:
            i = min(range(len(ys)), key=lambda j: ys[j])
            out["alpha_tail"][key] = {
                "last": ys[-1],
                "worst": ys[i],
                "worst_step": xs[i],
                "steps": len(ys),
                "below": sum(y < thr for y in ys),
            }
    out["mismatch"] = {}
    for k in _mismatch_keys(run) + _group_keys(run, "is/", IS_NAMED) + _group_keys(run, "rs/", RS_NAMED):
        ys = run.series(k)[1]
        out["mismatch"][k] = {"mean": _mean(ys), "last": ys[-1], "max": max(ys)}
    # held-out pass@1 of the last evaluation, dense and sparse inference
    last_eval = run.evals[-1][1] if run.evals else {}
    out["eval_pass1"] = {mode: last_eval.get(f"{mode}/pass@1") for mode in names.EVAL_MODES}
    return out


def _group_keys(run: RunData, prefix: str, named: Sequence[str]) -> list[str]:
    present = {k for k in run.keys() if k.startswith(prefix) and run.series(k)[0]}
    return [k for k in named if k in present] + sorted(present - set(named))


def _is_alpha(key: str) -> bool:
    return key in ALPHA_NAMED or key.startswith(names.MISMATCH_ALPHA_P5_BIN)


def _mismatch_keys(run: RunData) -> list[str]:
    """``mismatch/*`` keys with values, α's left out (α has its own plot and rows)."""
    return [k for k in _group_keys(run, "mismatch/", MISMATCH_NAMED) if not _is_alpha(k)]


def alpha_bin_keys(run: RunData) -> list[str]:
    """The ``mismatch/alpha_p5_bin/<start>`` keys with values, by bin start."""
    prefix = names.MISMATCH_ALPHA_P5_BIN
    keys = [k for k in run.keys() if k.startswith(prefix) and k[len(prefix) :].isdigit() and run.series(k)[0]]
    return sorted(keys, key=lambda k: int(k[len(prefix) :]))


# ---------------------------------------------------------------------------------------------
# Headline: the figures that judge a run's promise, and a verdict only where one is measured
# ---------------------------------------------------------------------------------------------
#: the reward a run is judged by: the verifier's mean (a shaped reward's first part), else reward/mean
HEADLINE_REWARD_KEYS = (names.REWARD_VERIFIER_MEAN, names.REWARD_MEAN)


def rows_by_step(rows: Iterable[dict]) -> list[dict]:
    """Metrics rows deduplicated by step (the last row of a step wins: a resumed run's redone step) and sorted."""
    by_step: dict[int, dict] = {}
    for r in rows:
        if _is_num(r.get("step")):
            by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


def compare_command(config: dict | None) -> str:
    """The comparison that measures a run against dense: ``sparserl compare <config> --arms dense,<config>
    --seeds 6`` for a preset, else the same with the arm ``base`` (the config as given). Six paired seeds
    resolve final-reward differences of about 0.15-0.21 on the default job (the 95% intervals' half-widths in
    docs/results/compare_shipped); one seed resolves none."""
    if not config:
        return "sparserl compare CONFIG --arms dense,base --seeds 6"
    name = config.get("name") or "default"
    try:
        from ..config import list_presets

        preset = name in list_presets()
    except Exception:  # the presets cannot be listed: name the config file instead
        preset = name == "default"
    if preset:
        return f"sparserl compare {name} --arms dense,{name} --seeds 6"
    return "sparserl compare RUN/config.yaml --arms dense,base --seeds 6"


def _final(run: RunData, key: str, tail: int = 5) -> float | None:
    """Mean of ``key`` over the last ``tail`` steps logged."""
    return _mean(run.series(key)[1][-tail:])


def _is_dense(config: dict | None) -> bool:
    return _dig(config or {}, "rollout.compressor") == "none"


def headline(
    rows: Sequence[dict], config: dict | None = None, dense_rows: Sequence[dict] | None = None, tail: int = 5
) -> dict[str, Any]:
    """The figures that judge a run's promise, from its metrics rows (as in ``metrics.jsonl``) and its config
    (a dict, as in ``config.yaml``): KV bytes allocated against a dense engine for the same batches (mean
    dense / mean sampler allocation), KV tokens held at each response's end against dense, α's tail (5th
    percentile per length bin) against the run's threshold (:func:`alpha_threshold`) at the last step and over
    the run, the final reward (mean of the last ``tail`` steps of :data:`HEADLINE_REWARD_KEYS`' first logged
    key), and, with ``dense_rows`` (a dense run of the same seed: a compare's dense arm), the paired
    difference of the final rewards over the steps both logged: ``d = mean_t (r_t − r_t^dense)`` over the
    last ``tail`` common steps."""
    run = RunData(Path("."), rows_by_step(rows), config)
    s = summarize(run, tail)
    out: dict[str, Any] = {
        "steps": len(run.rows),
        "last_step": s["last_step"],
        "dense": _is_dense(config),
        "compare": compare_command(config),
    }
    alloc, dense = s[names.KV_SAMPLER_ALLOC]["mean"], s[names.KV_DENSE_ALLOC]["mean"]
    ratio = dense / alloc if alloc and dense else _mean(run.series(names.KV_ALLOC_REDUCTION)[1])
    out["kv_alloc"] = {"sampler": alloc, "dense": dense, "reduction": ratio}
    out["kv_tokens"] = {
        "kept": s[names.KV_KEPT_TOKENS]["mean"],
        "dense": s[names.KV_DENSE_TOKENS]["mean"],
        "kept_frac": s[names.KV_KEPT_FRAC]["mean"],
    }
    # α's tail: per bin at the last step, and the steps where any bin (else the overall p5) was below
    thr, thr_name = s["alpha_threshold"], s["alpha_threshold_name"]
    bins = alpha_bin_keys(run)
    tail_keys = bins or ([names.MISMATCH_ALPHA_P5] if run.series(names.MISMATCH_ALPHA_P5)[0] else [])
    alpha = None
    if tail_keys:
        measured = [r for r in run.rows if any(_is_num(r.get(k)) for k in tail_keys)]
        last = measured[-1]
        last_values = {k: float(last[k]) for k in tail_keys if _is_num(last.get(k))}
        alpha = {
            "threshold": thr,
            "threshold_name": thr_name,
            "controller": thr_name != "Sparrow's threshold",
            "per_bin": bool(bins),
            "last_step": int(last["step"]),
            "last": last_values,
            "below_last": {k: v for k, v in last_values.items() if v < thr},
            "steps": len(measured),
            "steps_below": sum(any(_is_num(r.get(k)) and r[k] < thr for k in tail_keys) for r in measured),
            "p5_last": last.get(names.MISMATCH_ALPHA_P5) if _is_num(last.get(names.MISMATCH_ALPHA_P5)) else None,
        }
    out["alpha"] = alpha
    key = next((k for k in HEADLINE_REWARD_KEYS if run.series(k)[0]), None)
    out["reward"] = (
        None
        if key is None
        else {
            "key": key,
            "final": _final(run, key, tail=tail),
            "tail": min(tail, len(run.series(key)[0])),
            "first": run.series(key)[1][0],
            "last": run.series(key)[1][-1],
        }
    )
    out["versus_dense"] = None
    if dense_rows is not None:
        ref = RunData(Path("."), rows_by_step(dense_rows))
        ref_key = next((k for k in HEADLINE_REWARD_KEYS if ref.series(k)[0]), None)
        versus: dict[str, Any] = {"pairs": 0}
        if key is not None and ref_key is not None:
            common = sorted(set(run.series(key)[0]) & set(ref.series(ref_key)[0]))[-tail:]
            mine, theirs = dict(zip(*run.series(key))), dict(zip(*ref.series(ref_key)))
            diffs = [mine[t] - theirs[t] for t in common]
            versus = {
                "pairs": len(diffs),
                "steps": common,
                "final": _mean([mine[t] for t in common]),
                "dense_final": _mean([theirs[t] for t in common]),
                "difference": _mean(diffs),
            }
        ref_alloc = _mean(ref.series(names.KV_SAMPLER_ALLOC)[1])
        versus["kv_alloc_vs_dense_run"] = ref_alloc / alloc if ref_alloc and alloc else None
        out["versus_dense"] = versus
    return out


def _bin_start(key: str) -> str:
    return key[len(names.MISMATCH_ALPHA_P5_BIN) :] if key.startswith(names.MISMATCH_ALPHA_P5_BIN) else "all"


def headline_lines(
    rows: Sequence[dict], config: dict | None = None, dense_rows: Sequence[dict] | None = None, tail: int = 5
) -> list[str]:
    """:func:`headline` as lines a person reads (the run summary prints them, ``report.md`` opens with them):
    KV allocated vs dense, KV tokens kept vs dense, α's tail vs the threshold, the final reward, and a verdict
    only where one is measured: a single run cannot tell whether its compression costs reward, so without
    ``dense_rows`` the last line says so and names the comparison that measures it."""
    h = headline(rows, config, dense_rows, tail)
    lines = []
    kv, tok = h["kv_alloc"], h["kv_tokens"]
    if kv["reduction"] is None:
        lines.append("KV allocated: not logged")
    elif h["dense"]:
        lines.append(
            f"KV allocated: as much as a dense engine (1/{kv['reduction']:.1f}; rollout.compressor=none "
            "keeps every token)"
        )
    else:
        amounts = f" (mean {_fmt_bytes(kv['sampler'])} vs {_fmt_bytes(kv['dense'])} per step)" if kv["sampler"] else ""
        lines.append(f"KV allocated: 1/{kv['reduction']:.1f} of a dense engine's for the same batches{amounts}")
    if tok["kept_frac"] is not None:
        counts = (
            f"{_fmt(tok['kept'], 3)} kept vs {_fmt(tok['dense'], 3)} dense, "
            if tok["kept"] is not None and tok["dense"] is not None
            else ""
        )
        lines.append(
            f"KV tokens held at each response's end: {counts}{100 * tok['kept_frac']:.0f}% "
            f"(1/{1 / tok['kept_frac']:.1f})"
            if tok["kept_frac"] > 0
            else f"KV tokens held at each response's end: {counts}0%"
        )
    a = h["alpha"]
    if a is None:
        lines.append(
            "α tail: not measured (mismatch.alpha=off): how far the sampler is from the dense policy is unknown"
        )
    else:
        what = "5th percentile per length bin" if a["per_bin"] else "5th percentile"
        steer = (
            " (rollout.kv_controller.threshold)"
            if a["controller"]
            else " (no controller: rollout.kv_controller is unset)"
        )
        below = ", ".join(f"bin {_bin_start(k)}: {_fmt(v, 3)}" for k, v in a["below_last"].items())
        lines.append(
            f"α tail ({what}) against {a['threshold_name']} {a['threshold']:g}{steer}: at the last step "
            f"({a['last_step']}) {len(a['below_last'])} of {len(a['last'])} "
            f"{'bins' if a['per_bin'] else 'values'} below{f' ({below})' if below else ''}; "
            f"{a['steps_below']} of {a['steps']} steps "
            f"{'had a bin below' if a['per_bin'] else 'were below'}"
        )
    r = h["reward"]
    if r is None:
        lines.append("final reward: not logged")
    else:
        over = "the last step" if r["tail"] == 1 else f"mean of the last {r['tail']} steps"
        lines.append(
            f"final reward ({r['key']}, {over}): {_fmt(r['final'], 3)} "
            f"(first step {_fmt(r['first'], 3)}, last {_fmt(r['last'], 3)})"
        )
    v = h["versus_dense"]
    if v is not None and v["pairs"]:
        kv_vs = (
            f"; KV allocated 1/{v['kv_alloc_vs_dense_run']:.1f} of the dense run's"
            if v["kv_alloc_vs_dense_run"]
            else ""
        )
        lines.append(
            f"versus the dense run (same seed, the last {v['pairs']} steps both logged): final reward "
            f"{_fmt(v['final'], 3)} vs {_fmt(v['dense_final'], 3)}, paired difference "
            f"{v['difference']:+.3f}{kv_vs}; one seed pair gives no 95% interval: `{h['compare']}` "
            "gives one"
        )
    elif v is not None:
        lines.append("versus the dense run: no reward logged at the same steps, no difference measured")
    elif h["dense"]:
        lines.append(
            "verdict: none, this run is the dense reference (rollout.compressor=none) a compressed run is "
            "measured against (`sparserl compare CONFIG --arms dense,base --seeds 6`)"
        )
    else:
        lines.append(
            f"verdict: no dense run to compare with: `{h['compare']}` measures it (a single run cannot "
            "tell whether its compression costs reward)"
        )
    return lines


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def _figure(n_panels: int, width: float = 6.4, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 1 if n_panels == 1 else 2
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width * (1 if cols == 1 else 1.6), height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def _line(ax, run: RunData, key: str, label: str | None = None, **kw) -> bool:
    xs, ys = run.series(key)
    if not xs:
        return False
    ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=label or key, **kw)
    return True


def _finish(ax, title: str, ylabel: str | None = None) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _plot_reward(run: RunData, out: Path) -> Path | None:
    evals = [names.eval_metric(mode) for mode in names.EVAL_MODES]
    if not any(run.series(k)[0] for k in (names.REWARD_MEAN, names.ACCURACY, *evals)):
        return None
    fig, (ax,) = _figure(1)
    xs, ys = run.series(names.REWARD_MEAN)
    if xs:
        ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=names.REWARD_MEAN)
        sd = dict(zip(*run.series(names.REWARD_STD)))
        if sd:
            lo = [y - sd.get(x, 0.0) for x, y in zip(xs, ys)]
            hi = [y + sd.get(x, 0.0) for x, y in zip(xs, ys)]
            ax.fill_between(xs, lo, hi, alpha=0.2, label="± reward/std")
    _line(ax, run, names.ACCURACY)
    for key, marker in zip(evals, ("s", "^")):
        ex, ey = run.series(key)
        if ex:
            ax.plot(ex, ey, marker, color="black", label=f"held-out {key}")
    _finish(ax, f"Reward — {run.name}", "reward / accuracy")
    return _save(fig, out / "reward.png")


def _plot_panels(
    run: RunData,
    panels: list[tuple[str, list[str], str | None]],
    title: str,
    path: Path,
    scale: dict[str, float] | None = None,
) -> Path | None:
    panels = [(t, [k for k in keys if run.series(k)[0]], yl) for t, keys, yl in panels]
    panels = [p for p in panels if p[1]]
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, (t, keys, yl) in zip(axes, panels):
        for k in keys:
            xs, ys = run.series(k)
            f = (scale or {}).get(k, 1.0)
            ax.plot(xs, [y * f for y in ys], marker="o" if len(xs) <= 30 else None, markersize=3, label=k)
        _finish(ax, t, yl)
    fig.suptitle(f"{title} — {run.name}")
    return _save(fig, path)


def alpha_figure(run: RunData):
    """The α plot's figure (None when the run measured no α, ``mismatch.alpha=off``): one line per
    length bin's 5th percentile (short to long, dark to light), the 5th percentile over all tokens, the
    mean, and the run's threshold (:func:`alpha_threshold`) as a dashed horizontal line."""
    bins = alpha_bin_keys(run)
    overall = [k for k in ALPHA_NAMED if run.series(k)[0]]
    if not bins and not overall:
        return None
    from matplotlib import colormaps

    fig, (ax,) = _figure(1, width=8.0, height=4.2)
    cmap = colormaps["viridis"]
    for i, key in enumerate(bins):
        _line(ax, run, key, color=cmap(0.85 * i / max(1, len(bins) - 1)), linewidth=1.2)
    _line(ax, run, names.MISMATCH_ALPHA_P5, color="black", linewidth=2.2)
    _line(ax, run, names.MISMATCH_ALPHA_MEAN, color="tab:orange", linewidth=2.2)
    if run.series(names.MISMATCH_ALPHA_P5_NOPHI)[0]:  # DistillSparse: the same sampler without φ
        _line(ax, run, names.MISMATCH_ALPHA_P5_NOPHI, color="gray", linewidth=1.6, linestyle=":")
    thr, thr_name = alpha_threshold(run.config)
    ax.axhline(thr, color="tab:red", linestyle="--", linewidth=1.5, label=f"{thr_name} {thr:g}")
    lo = min([thr] + [y for k in bins + overall for y in run.series(k)[1]])
    ax.set_ylim(max(0.0, lo - 0.05), 1.01)
    width = _dig(run.config or {}, "mismatch.alpha_bin")
    bin_words = f" ({width} tokens)" if _is_num(width) else ""
    _finish(ax, f"α: p5 per length bin{bin_words}, p5, mean\n{run.name}", "α")  # two lines: the legend takes the right
    ax.legend(
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        ncols=2 if len(bins) > 16 else 1,
    )
    return fig


def _plot_alpha(run: RunData, out: Path) -> Path | None:
    fig = alpha_figure(run)
    return _save(fig, out / "alpha.png") if fig is not None else None


def _plot_time(run: RunData, out: Path) -> Path | None:
    keys = run.station_keys()
    if not keys:
        return None
    fig, (ax,) = _figure(1)
    steps = [int(r["step"]) for r in run.rows]
    bottom = [0.0] * len(steps)
    for k in keys:
        vals = [float(r[k]) if _is_num(r.get(k)) else 0.0 for r in run.rows]
        ax.bar(steps, vals, bottom=bottom, label=k.removeprefix("time/").removesuffix("_s"), width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals)]
    _finish(ax, f"Time per step — {run.name}", "seconds")
    return _save(fig, out / "time.png")


def _run_plots(run: RunData, out: Path) -> dict[str, Path]:
    plots: dict[str, Path | None] = {}
    plots["reward"] = _plot_reward(run, out)
    plots["mismatch"] = _plot_panels(
        run,
        [
            ("sampler vs dense", _mismatch_keys(run), None),
            ("importance weights", _group_keys(run, "is/", IS_NAMED), None),
            ("rejection", _group_keys(run, "rs/", RS_NAMED), "fraction"),
        ],
        "Mismatch and correction",
        out / "mismatch.png",
    )
    plots["alpha"] = _plot_alpha(run, out)
    plots["kv_memory"] = _plot_panels(
        run,
        [
            ("KV bytes allocated: sampler vs dense engine", [names.KV_SAMPLER_ALLOC, names.KV_DENSE_ALLOC], "MiB"),
            ("tokens held at each response's end", [names.KV_KEPT_TOKENS, names.KV_DENSE_TOKENS], "tokens"),
        ],
        "KV cache",
        out / "kv_memory.png",
        scale={names.KV_SAMPLER_ALLOC: MiB, names.KV_DENSE_ALLOC: MiB},
    )
    plots["time"] = _plot_time(run, out)
    plots["loss"] = _plot_panels(
        run,
        [
            ("policy loss", [names.POLICY_LOSS], None),
            ("gradient norm", [names.GRAD_NORM], None),
            ("entropy", [names.ENTROPY], "nats / token"),
            ("KL to reference", [names.KL_REF], None),
        ],
        "Learner",
        out / "loss.png",
    )
    return {k: v for k, v in plots.items() if v is not None}


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------
_CONFIG_SUMMARY = (
    ("model", "model.name"),
    ("learner dtype", "model.dtype"),
    ("compressor", "rollout.compressor"),
    ("KV budget", "rollout.kv_budget"),
    ("trigger", "rollout.trigger"),
    ("step length", "rollout.step_length"),
    ("window", "rollout.window"),
    ("tail slack", "rollout.tail_slack"),
    ("samples per prompt", "rollout.n"),
    ("prompts per step", "train.prompts_per_step"),
    ("max new tokens", "rollout.max_new_tokens"),
    ("temperature", "rollout.temperature"),
    ("task", "data.train"),
    ("reward", "reward.fn"),
    ("advantages", "algorithm.adv_estimator"),
    ("correction", "algorithm.correction"),
    ("KL coef", "algorithm.kl_coef"),
    ("steps", "train.steps"),
    ("lr", "train.lr"),
)


def _trained_weights(config: dict) -> str:
    """Which weights the run trained: all, or peft LoRA adapters (rank, alpha, dropout, target modules); and
    DistillSparse's φ on the sampler when it ran."""
    rank = _dig(config, "train.lora_rank")
    if not rank:
        text = "all (full fine-tuning)"
    else:
        target = _dig(config, "train.lora_target")
        target = ", ".join(target) if isinstance(target, list) else target
        text = (
            f"LoRA adapters only (peft): rank {rank}, alpha {_dig(config, 'train.lora_alpha')}, dropout "
            f"{_dig(config, 'train.lora_dropout')}, on {target}; base weights frozen"
        )
    phi = _dig(config, "algorithm.distill_sparse")
    if isinstance(phi, dict):
        text += (
            f"; and on the sparse sampler only, DistillSparse's LoRA φ (rank {phi.get('rank')}, alpha "
            f"{phi.get('alpha')}, λ {phi.get('lambda')}, lr {phi.get('lr')})"
        )
    return text


def _dig(d: dict, dotted: str) -> Any:
    cur: Any = d
    for p in dotted.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


def _kv_lines(s: dict) -> list[str]:
    """The KV section: allocation against allocation, kept tokens against dense tokens."""
    alloc, dense = s[names.KV_SAMPLER_ALLOC], s[names.KV_DENSE_ALLOC]
    kept_frac, kept, dense_tok = s[names.KV_KEPT_FRAC], s[names.KV_KEPT_TOKENS], s[names.KV_DENSE_TOKENS]
    if alloc["mean"] is None and kept_frac["mean"] is None:
        return []
    md = ["## KV cache", ""]
    if alloc["mean"] is not None and dense["mean"]:
        md.append(
            f"- bytes allocated, sampler vs dense engine for the same batch: mean "
            f"{_fmt_bytes(alloc['mean'])} vs {_fmt_bytes(dense['mean'])} "
            f"({_fmt(dense['mean'] / alloc['mean'], 3)}x less; peak {_fmt_bytes(alloc['max'])})"
        )
    if kept_frac["mean"] is not None:
        md.append(
            f"- tokens held at the end of each response, kept vs dense: mean {_fmt(kept['mean'], 3)} vs "
            f"{_fmt(dense_tok['mean'], 3)}; kept fraction mean {kept_frac['mean']:.2f} "
            f"({_fmt(1 / kept_frac['mean'], 3)}x fewer), worst step {kept_frac['max']:.2f}"
        )
    return md + [""]


def _alpha_lines(s: dict) -> list[str]:
    """α's tail against the run's threshold (the controller's, else Sparrow's): per length bin (and overall),
    last, worst and steps below."""
    tail = s["alpha_tail"]
    if not tail:
        return []
    thr = s["alpha_threshold"]
    md = [
        f"Acceptance α's 5th percentile against {s['alpha_threshold_name']} {thr:g} (Sparrow's training "
        "stayed stable while every length bin's stayed above its threshold):",
        "",
        f"| metric | last | worst (step) | steps below {thr:g} |",
        "|---|---|---|---|",
    ]
    for k, v in tail.items():
        md.append(f"| {k} | {_fmt(v['last'])} | {_fmt(v['worst'])} ({v['worst_step']}) | {v['below']}/{v['steps']} |")
    return md + [""]


def _eval_table(evals: list[tuple[str, dict]]) -> list[str]:
    """One row per evaluation: held-out pass@1 (and avg@n, pass@n) under dense and sparse inference."""
    stats: list[str] = []
    for _, d in evals:
        for k in d:
            mode, _, stat = k.partition("/")
            if (
                mode in names.EVAL_MODES
                and (stat == "pass@1" or stat.startswith(("avg@", "pass@")))
                and stat not in stats
            ):
                stats.append(stat)
    cols = [f"{mode}/{stat}" for mode in names.EVAL_MODES for stat in stats]
    lines = ["| step | problems | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for _, d in evals:
        problems = next((d[f"{m}/problems"] for m in names.EVAL_MODES if f"{m}/problems" in d), None)
        lines.append(f"| {_fmt(d.get('step'))} | {_fmt(problems)} | " + " | ".join(_fmt(d.get(k)) for k in cols) + " |")
    samplers = {m: d[f"{m}/sampler"] for _, d in evals[-1:] for m in names.EVAL_MODES if d.get(f"{m}/sampler")}
    if samplers:  # which sampler each mode ran (the controller's budgets for a controller run)
        lines += [""] + [f"- {mode} inference ran {sampler}" for mode, sampler in samplers.items()]
    return lines


def make_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the plots and ``report.md`` of a run folder (into ``out_dir``, default the run folder);
    returns the path of ``report.md``. Works on a run still in progress."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.run_dir
    out.mkdir(parents=True, exist_ok=True)
    plots = _run_plots(run, out)
    s = summarize(run)

    md: list[str] = [
        f"# Run report: {run.name}",
        "",
        f"Run folder `{run.run_dir}`; report written {time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "",
    ]
    if run.rows:  # the figures that judge the run, as the run's summary prints them
        md += ["## Headline", ""] + [f"- {line}" for line in headline_lines(run.rows, run.config)] + [""]
    if run.config:
        md += ["## Configuration", "", "| setting | value |", "|---|---|"]
        if run.config.get("name"):
            md.append(f"| config | {run.config['name']} |")
        for label, key in _CONFIG_SUMMARY:
            v = _dig(run.config, key)
            if v is not None:
                md.append(f"| {label} | {_fmt(v)} |")
        md.append(f"| trained weights | {_trained_weights(run.config)} |")
        md += [
            "",
            "<details><summary>full config</summary>",
            "",
            "```yaml",
            yaml.safe_dump(run.config, sort_keys=False).rstrip(),
            "```",
            "",
            "</details>",
            "",
        ]

    md += ["## Training", ""]
    if not run.rows:
        md += ["No metrics logged yet (`metrics.jsonl` is missing or empty).", ""]
    else:
        md.append(f"{s['steps']} steps logged (step {s['first_step']} to {s['last_step']}).")
        if s["total_time_s"] is not None:
            md.append(f"Total time {_fmt(s['total_time_s'], 3)} s, {_fmt(s['time_per_step_s'], 3)} s per step.")
        md.append("")
        rows = [label for label in ("reward", "accuracy", *ALPHA_NAMED) if label in s]
        if rows:
            md += ["| metric | first | last | best (step) | mean of last 5 |", "|---|---|---|---|---|"]
            for label in rows:
                r = s[label]
                md.append(
                    f"| {r['key']} | {_fmt(r['first'])} | {_fmt(r['last'])} | "
                    f"{_fmt(r['best'])} ({r['best_step']}) | {_fmt(r['tail_mean'])} |"
                )
            md.append("")
        md += _alpha_lines(s)

    if s["stations"]:
        total = sum(v for v in s["stations"].values() if v) or 1.0
        md += ["## Time per station", "", "| station | mean s / step | share |", "|---|---|---|"]
        for k, v in s["stations"].items():
            md.append(f"| {k.removeprefix('time/').removesuffix('_s')} | {_fmt(v, 3)} | {100 * v / total:.0f}% |")
        for k, v in s.get("subtimes", {}).items():  # parts of a station, not added to the total
            md.append(
                f"| {k.removeprefix('time/').removesuffix('_s')} (part of "
                f"{SUBTIMES[k].removeprefix('time/').removesuffix('_s')}) | {_fmt(v, 3)} | |"
            )
        md.append("")

    md += _kv_lines(s)
    if s["mismatch"]:
        md += ["## Mismatch and correction", "", "| metric | mean | last | max |", "|---|---|---|---|"]
        for k, v in s["mismatch"].items():
            md.append(f"| {k} | {_fmt(v['mean'])} | {_fmt(v['last'])} | {_fmt(v['max'])} |")
        md.append("")

    if run.evals:
        md += ["## Evaluation", ""] + _eval_table(run.evals) + [""]

    if plots:
        md += ["## Plots", ""]
        for key, p in plots.items():
            rel = p.name if p.parent.resolve() == out.resolve() else str(p)
            md += [f"[{p.name}]({rel})", "", f"![{key}]({rel})", ""]

    path = out / "report.md"
    path.write_text("\n".join(md).rstrip() + "\n")
    return path
