"""The comparison's output in ``--out``: plots, ``comparison.md`` and ``comparison.json``.

    compare_reward.png     reward per arm: mean over seeds, min-max band
    compare_mismatch.png   k3 KL (sampler vs dense) and the fraction masked by the correction, same way
    compare_kv.png         KV tokens kept vs a dense cache, and KV bytes the sampler allocated
    comparison.md          the tables (reward, stability and acceptance α, KV and time, held-out, each arm
                           against the dense arm seed by seed with a 95% interval), the definitions,
                           the command, links to the plots and run folders
    comparison.json        every number of the tables, per arm and per run

Plots use matplotlib's object API on the Agg canvas (as ``sparserl.eval.report``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import runlog as names
from ..eval.report import MiB, _figure, _finish, _fmt, _fmt_bytes, _save, load_run
from .aggregate import (
    STEP_TIME,
    Band,
    band,
    collapse_rule,
    mean_std,
    paired_difference,
    reward_curve,
    summarize_arm,
    versus_dense,
)
from .arms import RunSpec

__all__ = ["CURVE_KEYS", "arm_curves", "write_comparison"]

#: the metrics read from each run for the comparison
CURVE_KEYS = (
    names.REWARD_VERIFIER_MEAN,
    names.REWARD_MEAN,
    names.ACCURACY,
    names.MISMATCH_K3,
    names.MASKED_FRAC,
    names.MISMATCH_ALPHA_MEAN,
    names.MISMATCH_ALPHA_P5,
    names.KV_SAMPLER_ALLOC,
    names.KV_DENSE_ALLOC,
    names.KV_KEPT_FRAC,
    names.KV_KEPT_TOKENS,
    names.KV_DENSE_TOKENS,
    names.TIME_ROLLOUT,
)


def arm_curves(specs: list[RunSpec]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """``{arm: {run: {metric: {step: value}}}}`` read from the run folders (a resumed run's redone
    step counts once); :data:`~sparserl.compare.aggregate.STEP_TIME` is each step's time (``runlog.step_seconds``)."""
    out: dict[str, dict] = {}
    for s in specs:
        run = load_run(s.run_dir)
        curves = {k: dict(zip(*run.series(k))) for k in CURVE_KEYS}
        curves[STEP_TIME] = dict(zip(*run.step_times()))
        out.setdefault(s.arm.name, {})[s.name] = curves
    return out


def _plot_bands(
    curves: Mapping[str, Mapping[str, Mapping]], panels: list[tuple[str, str, str, float]], title: str, path: Path
) -> Path | None:
    """One panel per (metric, panel title, y label, scale): each arm's mean line and min-max band."""
    panels = [p for p in panels if any(c.get(p[0]) for runs in curves.values() for c in runs.values())]
    if not panels:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(len(panels))
    for ax, (key, ptitle, ylabel, scale) in zip(axes, panels):
        for i, (arm, runs) in enumerate(curves.items()):
            b: Band = band([c.get(key) for c in runs.values()])
            if not b:
                continue
            color = f"C{i % 10}"
            many = len(b.steps) <= 30
            ax.plot(
                b.steps,
                [y * scale for y in b.mean],
                color=color,
                marker="o" if many else None,
                markersize=3,
                label=f"{arm} (mean of {len(runs)})",
            )
            if len(runs) > 1:
                ax.fill_between(
                    b.steps, [y * scale for y in b.lo], [y * scale for y in b.hi], color=color, alpha=0.2, linewidth=0
                )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _finish(ax, ptitle, ylabel)
    fig.suptitle(f"{title} (line: mean over seeds; band: min-max)")
    return _save(fig, path)


def _pm(mean, std, digits: int = 3) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def _x(v) -> str:
    return f"{_fmt(v, 3)}x" if v is not None else "–"


def _pct(v) -> str:
    return f"{100 * v:.0f}%" if v is not None else "–"


def _signed(v, digits: int = 3) -> str:
    return "–" if v is None else f"{v:+.{digits}f}".replace("-", "−")


def _paired_cell(p: dict | None) -> str:
    """``−0.052 [−0.210, +0.106] within noise`` (one pair: the difference alone; none: –)."""
    if not p or p["mean"] is None:
        return "–"
    if p["ci95"] is None:
        return f"{_signed(p['mean'])} (one seed)"
    lo, hi = p["ci95"]
    return f"{_signed(p['mean'])} [{_signed(lo)}, {_signed(hi)}] {p['verdict']}"


def paired_differences(
    sums: Mapping[str, dict], specs: list[RunSpec], reference: str, evals: Mapping[str, dict] | None
) -> dict[str, dict]:
    """Every other arm against ``reference``, seed by seed (:func:`~.aggregate.paired_difference`):
    ``{arm: {"final_reward": ..., "eval_<mode>_pass@1": ...}}``, the held-out pass@1 under dense and under
    sparse inference with ``evals``."""
    seed_of = {s.name: s.seed for s in specs}

    def rewards(arm):
        return {seed_of[r]: v for r, v in sums[arm]["final_reward"]["per_seed"].items()}

    def pass_at_1(arm, mode):
        return {
            seed_of[r]: evals[r][mode]["pass@1"] for r in sums[arm]["runs"] if evals and r in evals and mode in evals[r]
        }

    out = {}
    for arm in sums:
        if arm == reference:
            continue
        out[arm] = {"final_reward": paired_difference(rewards(arm), rewards(reference))}
        if evals:
            for mode in names.EVAL_MODES:
                out[arm][f"eval_{mode}_pass@1"] = paired_difference(pass_at_1(arm, mode), pass_at_1(reference, mode))
    return out


PAIRED_NOTE = (
    "Each arm's figure minus the reference arm's run of the same seed (the same `train.seed` draws the "
    "same prompts), then the mean difference and its 95% interval, mean ± t(0.975, pairs − 1) · std / "
    "√pairs (Student's t). *better* / *worse*: the interval lies above / below 0; *within noise*: it holds "
    "0, and its half-width is about the smallest difference these seeds could have shown."
)


def _paired_section(title: str, rows: Mapping[str, dict], note: str) -> list[str]:
    md = [
        "",
        f"## {title}, seed by seed",
        "",
        note,
        "",
        "| arm | pairs | final reward | held-out pass@1, dense inference | held-out pass@1, sparse inference |",
        "|---|---|---|---|---|",
    ]
    for arm, p in rows.items():
        md.append(
            f"| {arm} | {p['final_reward']['n']} | {_paired_cell(p['final_reward'])} | "
            f"{_paired_cell(p.get('eval_dense_pass@1'))} | {_paired_cell(p.get('eval_sparse_pass@1'))} |"
        )
    return md


def _eval_summary(records: Mapping[str, dict], runs: list[str]) -> dict:
    out = {}
    recs = [records[r] for r in runs if r in records]
    for mode in names.EVAL_MODES:
        m, s = mean_std([r[mode]["pass@1"] for r in recs if mode in r])
        out[mode] = {
            "pass@1_mean": m,
            "pass@1_std": s,
            "compressor": next((r[mode].get("compressor") for r in recs if mode in r), None),
            "kv_budget": next((r[mode].get("kv_budget") for r in recs if mode in r), None),
        }
    m, s = mean_std([r["sparse"]["pass@1"] - r["dense"]["pass@1"] for r in recs if "sparse" in r and "dense" in r])
    out["sparse_minus_dense"] = {"mean": m, "std": s}
    out["problems"] = next((r["dense"]["problems"] for r in recs if "dense" in r), None)
    return out


def write_comparison(
    out: Path,
    specs: list[RunSpec],
    statuses: Mapping[str, str],
    *,
    config: str,
    overrides: list[str],
    seeds: list[int],
    collapse_k3: float,
    command: str | None = None,
    evals: Mapping[str, dict] | None = None,
    eval_data: str | None = None,
    starts: Mapping[str, dict] | None = None,
    paired_against: Sequence[str] = (),
) -> Path:
    """Write the plots, ``comparison.md`` and ``comparison.json`` into ``out``; returns the .md path. Every arm
    is paired seed by seed with the dense arm (``vs_dense_paired``) and with each arm of ``paired_against``
    (``paired[<arm>]``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = arm_curves(specs)
    arms = list(dict.fromkeys(s.arm.name for s in specs))
    arm_of = {s.arm.name: s.arm for s in specs}
    sums = {a: summarize_arm(curves[a], k3_threshold=collapse_k3) for a in arms}
    dense_arm = next((s.arm.name for s in specs if s.cfg.rollout.compressor == "none"), None)
    versus_dense(sums, dense_arm)
    if evals:
        for a in arms:
            sums[a]["eval"] = _eval_summary(evals, sums[a]["runs"])
    if dense_arm is not None:
        for a, p in paired_differences(sums, specs, dense_arm, evals).items():
            sums[a]["vs_dense_paired"] = p
    references = [r for r in paired_against if r != dense_arm]
    for ref in references:
        for a, p in paired_differences(sums, specs, ref, evals).items():
            sums[a].setdefault("paired", {})[ref] = p

    plots = {
        "reward": _plot_bands(
            {a: {r: {"reward": reward_curve(c)} for r, c in runs.items()} for a, runs in curves.items()},
            [("reward", "the verifier's mean reward", "reward", 1.0)],
            "Reward per arm",
            out / "compare_reward.png",
        ),
        "mismatch": _plot_bands(
            curves,
            [
                (names.MISMATCH_K3, "k3 KL, sampler vs dense", "k3", 1.0),
                (names.MASKED_FRAC, "masked by the correction", "fraction", 1.0),
            ],
            "Mismatch per arm",
            out / "compare_mismatch.png",
        ),
        "kv": _plot_bands(
            curves,
            [
                (names.KV_KEPT_FRAC, "KV tokens kept vs dense at each response's end", "fraction", 1.0),
                (names.KV_SAMPLER_ALLOC, "KV bytes allocated by the sampler", "MiB", MiB),
            ],
            "KV cache per arm",
            out / "compare_kv.png",
        ),
    }
    plots = {k: v for k, v in plots.items() if v is not None}
    k = max((s["final_k"] for s in sums.values()), default=1)
    steps = max((s.cfg.train.steps for s in specs), default=0)

    md = [
        f"# Comparison: {', '.join(arms)} × {len(seeds)} seed{'s' if len(seeds) != 1 else ''}",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')}. Base config `{config}`"
        + (f" with `{' '.join(overrides)}`" if overrides else "")
        + f"; {steps} steps per run; seeds "
        f"{', '.join(map(str, seeds))} (`train.seed`).",
        "",
    ]
    if command:
        md += ["```", command, "```", ""]
    md += ["## Arms", "", "| arm | what | config | overrides |", "|---|---|---|---|"]
    for a in arms:
        arm = arm_of[a]
        md.append(
            f"| {a} | {arm.description} | {arm.config or config} | {' '.join(f'`{o}`' for o in arm.overrides) or '–'} |"
        )
    md += [
        "",
        "## Reward and stability",
        "",
        f"Final reward: per seed the mean `{names.REWARD_VERIFIER_MEAN}` (the verifier's reward, without a "
        f"weighted or length-shaped reward's other parts; `{names.REWARD_MEAN}` in runs logged before it) of its "
        f"last k = max(1, steps // 4) = {k} steps, then mean ± sample std over the seeds. "
        "Best step: where the mean-over-seeds curve is highest. "
        f"Collapse: {collapse_rule(collapse_k3)}. α mean, α p5: Sparrow's acceptance α "
        f"(`{names.MISMATCH_ALPHA_MEAN}`, `{names.MISMATCH_ALPHA_P5}`), per seed the mean of the same last k "
        f"steps, then mean ± sample std over the seeds that logged it; – where the arm did not measure α "
        f"(`mismatch.alpha=off`).",
        "",
        "| arm | seeds | final reward | best step (mean reward) | collapsed seeds | k3 KL mean / max | masked | "
        "α mean | α p5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        s = sums[a]
        coll = [
            f"{r.removeprefix(a + '-')}: {'; '.join(c['reasons'])}" for r, c in s["collapsed"].items() if c["collapsed"]
        ]
        md.append(
            f"| {a} | {s['seeds']} | {_pm(s['final_reward']['mean'], s['final_reward']['std'])} | "
            f"{_fmt(s['best']['step'])} ({_fmt(s['best']['mean_reward'], 3)}) | "
            f"{s['n_collapsed']}/{s['seeds']}{' (' + '; '.join(coll) + ')' if coll else ''} | "
            f"{_fmt(s['k3']['mean'], 3)} / {_fmt(s['k3']['max'], 3)} | {_pct(s['masked_frac'])} | "
            f"{_pm(s['alpha']['mean']['mean'], s['alpha']['mean']['std'])} | "
            f"{_pm(s['alpha']['p5']['mean'], s['alpha']['p5']['std'])} |"
        )
    md += [
        "",
        "## KV memory and time",
        "",
        "Like with like: bytes the sampler allocated against what the dense engine allocates for the same "
        "batches (prompt + max_new_tokens per sequence); tokens the cache held at each response's end "
        "against a dense cache's tokens then"
        + (
            f"; and the sampler's allocation against the dense arm's (`{dense_arm}`) measured one."
            if dense_arm
            else "."
        ),
        "",
        "| arm | KV allocated: sampler vs dense engine (saved) | KV tokens kept vs dense (saved) | "
        "vs dense arm | rollout s / step | s / step |",
        "|---|---|---|---|---|---|",
    ]
    for a in arms:
        kv, t = sums[a]["kv"], sums[a]["time"]
        md.append(
            f"| {a} | {_fmt_bytes(kv['sampler_alloc_bytes'])} vs {_fmt_bytes(kv['dense_alloc_bytes'])} "
            f"({_pct(kv['alloc_saved_frac'])}, {_x(kv['alloc_reduction'])} less) | "
            f"{_fmt(kv['kept_tokens'], 3)} vs {_fmt(kv['dense_tokens'], 3)} ({_pct(kv['tokens_saved_frac'])}) | "
            f"{_x(kv['vs_dense_arm'])} | {_fmt(t['rollout_s'], 3)} | {_fmt(t['step_s'], 3)} |"
        )
    if evals:
        e0 = next(iter(evals.values()))
        st = e0.get("settings", {})
        md += [
            "",
            "## Held-out evaluation",
            "",
            f"Each run's final checkpoint on `{eval_data}` ({_fmt(sums[arms[0]]['eval']['problems'])} problems, "
            f"n={st.get('n')}, temperature {st.get('temperature')}), under dense inference and under sparse "
            "inference (the arm's own sampler; a dense arm uses the base config's). pass@1 mean ± sample std "
            "over seeds; sparse − dense per seed, then averaged: the closer to 0, the less the model degrades "
            "under sparse inference. The prompts are the runs' own (`data.template`, `data.system_prompt`)"
            + ("; *before training* is the model every run started from." if starts else "."),
            "",
            "| arm | pass@1 dense | pass@1 sparse (sampler) | sparse − dense |",
            "|---|---|---|---|",
        ]
        for a in arms:
            e = sums[a]["eval"]
            samp = e["sparse"]["compressor"]
            samp = f"{samp}, budget {e['sparse']['kv_budget']}" if samp else "none"
            md.append(
                f"| {a} | {_pm(e['dense']['pass@1_mean'], e['dense']['pass@1_std'])} | "
                f"{_pm(e['sparse']['pass@1_mean'], e['sparse']['pass@1_std'])} ({samp}) | "
                f"{_pm(e['sparse_minus_dense']['mean'], e['sparse_minus_dense']['std'])} |"
            )
        for _name, r in (starts or {}).items():
            samp = f"{r['sparse']['compressor']}, budget {r['sparse']['kv_budget']}" if "sparse" in r else "none"
            sp = r.get("sparse", {}).get("pass@1")
            md.append(
                f"| *before training* | {_fmt(r['dense']['pass@1'], 3)} | {_fmt(sp, 3)} ({samp}) | "
                f"{_fmt(sp - r['dense']['pass@1'] if sp is not None else None, 3)} |"
            )
        md += ["", f"Per-run results: `{out / 'eval'}/<run>.json`."]
    others = {a: sums[a]["vs_dense_paired"] for a in arms if "vs_dense_paired" in sums[a]}
    if others:
        md += _paired_section(f"Against the dense arm (`{dense_arm}`)", others, PAIRED_NOTE)
    for i, ref in enumerate(references):
        note = PAIRED_NOTE if not others and i == 0 else f"As above, against `{ref}`."
        md += _paired_section(f"Against `{ref}`", {a: sums[a]["paired"][ref] for a in arms if a != ref}, note)
    if plots:
        md += ["", "## Plots", ""]
        for key, p in plots.items():
            md += [f"[{p.name}]({p.name})", "", f"![{key}]({p.name})", ""]
    md += [
        "",
        "## Runs",
        "",
        "Each run is an ordinary run folder (`sparserl report <folder>` works on it); `status` is what this "
        "call did: `done` = finished before, skipped; `resumed`; `trained`.",
        "",
        "| run | arm | seed | status | folder | report | reproduce |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        rel = _rel(s.run_dir, out)
        md.append(
            f"| {s.name} | {s.arm.name} | {s.seed} | {statuses.get(s.name, '–')} | [{rel}]({rel}) | "
            f"[report.md]({rel}/report.md) | `{s.command()}` |"
        )
    path = out / "comparison.md"
    path.write_text("\n".join(md).rstrip() + "\n")

    record = {
        "command": command,
        "config": config,
        "overrides": list(overrides),
        "seeds": list(seeds),
        "steps": steps,
        "final_k": k,
        "collapse": {"rule": collapse_rule(collapse_k3), "k3_threshold": collapse_k3},
        "dense_arm": dense_arm,
        "paired_against": references,
        "eval_data": eval_data,
        "start_eval": dict(starts or {}),
        "arms": {
            a: {
                "overrides": list(arm_of[a].overrides),
                "config": arm_of[a].config or config,
                "description": arm_of[a].description,
                **sums[a],
            }
            for a in arms
        },
        "runs": {
            s.name: {
                "arm": s.arm.name,
                "seed": s.seed,
                "run_dir": str(s.run_dir),
                "status": statuses.get(s.name),
                "command": s.command(),
                **({"eval": evals[s.name]} if evals and s.name in evals else {}),
            }
            for s in specs
        },
        "plots": {k_: p.name for k_, p in plots.items()},
    }
    (out / "comparison.json").write_text(json.dumps(record, indent=2, default=str))
    return path


def _rel(p: Path, base: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path(base).resolve()))
    except ValueError:
        return str(p)
