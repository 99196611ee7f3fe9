"""Tables of a ``sparserl compare`` over seeds (the long job's, the main job's): reward, held-out pass@1 (dense and
sparse inference), k3, the α tail per length bin, the tokens each step generated (its rollout cost: every response
sampled, oversampled and dense fallback ones included), the tokens and responses the correction gave no gradient
and its weights' mean and effective sample size, KV held, time and peak memory per run.

    python3 experiments/training/long_seeds.py /work/exp/long_seeds --json docs/results/long_seeds/summary.json

Reads ``<out>/comparison.json`` (arms, runs, held-out evaluations) and each run's ``metrics.jsonl``. The α tail
per bin is each step's ``mismatch/alpha_p5_bin/<start>`` (the 5th percentile of α over the step's tokens whose
position falls in that bin), reported per arm as the mean over every step of every seed, and the lowest
step; a bin counts only where a step logged it (responses reach it). ``memory/rss_peak_bytes`` is the process's
high-water mark, and ``sparserl compare`` runs its runs one after another in one process: a run's figure is
the largest of its own and every earlier run's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sparserl import runlog as names
from sparserl.runlog import read_metrics


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def run_figures(run_dir: Path) -> dict:
    rows = read_metrics(run_dir)
    bins: dict[int, list[float]] = {}
    budgets: dict[int, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(names.MISMATCH_ALPHA_P5_BIN):
                bins.setdefault(int(key[len(names.MISMATCH_ALPHA_P5_BIN) :]), []).append(float(value))
            elif key.startswith(names.KV_BUDGET_BIN):
                budgets.setdefault(int(key[len(names.KV_BUDGET_BIN) :]), []).append(float(value))
    col = lambda key: [row.get(key) for row in rows]  # noqa: E731
    return {
        "steps": len(rows),
        "reward_per_step": col(names.REWARD_MEAN),
        "reward_mean": _mean(col(names.REWARD_MEAN)),
        "length_mean": _mean(col(names.LENGTH_MEAN)),
        "step_s_mean": _mean(col(names.TIME_STEP)),
        "run_s": sum(x for x in col(names.TIME_STEP) if x is not None),
        "rollout_s_mean": _mean(col(names.TIME_ROLLOUT)),
        "rollout_tokens_per_s": _mean(col(names.ROLLOUT_TOKENS_PER_S)),
        "rss_peak_bytes": max((x for x in col(names.MEMORY_RSS_PEAK) if x is not None), default=None),
        "predicted_peak_bytes": max((x for x in col(names.MEMORY_PREDICTED_PEAK) if x is not None), default=None),
        "kv_sampler_alloc_bytes": _mean(col(names.KV_SAMPLER_ALLOC)),
        "kv_dense_alloc_bytes": _mean(col(names.KV_DENSE_ALLOC)),
        "kv_kept_frac": _mean(col(names.KV_KEPT_FRAC)),
        "alpha_mean": _mean(col(names.MISMATCH_ALPHA_MEAN)),
        "k3_mean": _mean(col(names.MISMATCH_K3)),
        "alpha_p5": _mean(col(names.MISMATCH_ALPHA_P5)),
        "tokens_per_step": _mean(
            t * g for t, g in zip(col(names.ROLLOUT_TOKENS_PER_S), col(names.TIME_GENERATE)) if t is not None and g
        ),
        "masked_frac": _mean(col(names.MASKED_FRAC)),
        "token_masked_frac": _mean(col(names.TOKEN_MASKED_FRAC)),
        "seq_vetoed_frac": _mean(col(names.SEQ_VETOED_FRAC)),
        "is_weight_mean": _mean(col(names.IS_WEIGHT_MEAN)),
        "is_ess": _mean(col(names.IS_ESS)),
        "dense_fallback_frac": _mean(col(names.DENSE_FALLBACK_FRAC)),
        "oversample_acceptance_kept": _mean(col(names.OVERSAMPLE_ACCEPT_KEPT)),
        "oversample_acceptance_dropped": _mean(col(names.OVERSAMPLE_ACCEPT_DROPPED)),
        "alpha_p5_bin": {b: v for b, v in sorted(bins.items())},
        "kv_budget_bin": {b: _mean(v) for b, v in sorted(budgets.items())},
    }


def summarize(out: Path) -> dict:
    comparison = json.loads((out / "comparison.json").read_text())
    arms: dict[str, dict] = {}
    for name, run in comparison["runs"].items():
        figures = run_figures(out / "runs" / name)
        ev = run.get("eval") or {}
        figures["pass1_dense"] = (ev.get("dense") or {}).get("pass@1")
        figures["pass1_sparse"] = (ev.get("sparse") or {}).get("pass@1")
        arms.setdefault(run["arm"], {})[name] = figures
    start = {
        k: {m: (v.get(m) or {}).get("pass@1") for m in ("dense", "sparse")}
        for k, v in (comparison.get("start_eval") or {}).items()
    }
    per_arm = {}
    for arm, runs in arms.items():
        bins: dict[int, list[float]] = {}
        for r in runs.values():
            for b, vs in r["alpha_p5_bin"].items():
                bins.setdefault(b, []).extend(vs)
        per_arm[arm] = {
            "seeds": len(runs),
            "reward_mean": _mean(r["reward_mean"] for r in runs.values()),
            "reward_std_over_seeds": statistics.pstdev([r["reward_mean"] for r in runs.values()]),
            "pass1_dense": _mean(r["pass1_dense"] for r in runs.values()),
            "pass1_sparse": _mean(r["pass1_sparse"] for r in runs.values()),
            "step_s_mean": _mean(r["step_s_mean"] for r in runs.values()),
            **{
                key: _mean(r[key] for r in runs.values())
                for key in (
                    "k3_mean",
                    "alpha_p5",
                    "tokens_per_step",
                    "masked_frac",
                    "token_masked_frac",
                    "seq_vetoed_frac",
                    "is_weight_mean",
                    "is_ess",
                    "dense_fallback_frac",
                    "oversample_acceptance_kept",
                    "oversample_acceptance_dropped",
                )
            },
            "kv_sampler_alloc_bytes": _mean(r["kv_sampler_alloc_bytes"] for r in runs.values()),
            "kv_dense_alloc_bytes": _mean(r["kv_dense_alloc_bytes"] for r in runs.values()),
            "kv_kept_frac": _mean(r["kv_kept_frac"] for r in runs.values()),
            "alpha_p5_bin_mean": {b: statistics.fmean(v) for b, v in sorted(bins.items())},
            "alpha_p5_bin_min": {b: min(v) for b, v in sorted(bins.items())},
            "alpha_p5_bin_steps": {b: len(v) for b, v in sorted(bins.items())},
        }
    return {"command": comparison.get("command"), "start_eval": start, "arms": per_arm, "runs": arms}


def _f(x, fmt="{:.3f}"):
    return "–" if x is None else fmt.format(x)


def tables(summary: dict) -> str:
    lines = [
        "| run | steps | mean reward | held-out pass@1 dense | sparse | s / step | run s | rollout tok/s "
        "| sampler KV MiB | kept frac | α p5 | peak RSS GB |",
        "|---|" + "---:|" * 11,
    ]
    for runs in summary["runs"].values():
        for name, r in runs.items():
            lines.append(
                f"| {name} | {r['steps']} | {_f(r['reward_mean'])} | {_f(r['pass1_dense'])} | {_f(r['pass1_sparse'])} "
                f"| {_f(r['step_s_mean'], '{:.0f}')} | {_f(r['run_s'], '{:.0f}')} "
                f"| {_f(r['rollout_tokens_per_s'], '{:.0f}')} "
                f"| {_f(r['kv_sampler_alloc_bytes'] and r['kv_sampler_alloc_bytes'] / 2**20, '{:.0f}')} "
                f"| {_f(r['kv_kept_frac'], '{:.2f}')} | {_f(r['alpha_p5'])} "
                f"| {_f(r['rss_peak_bytes'] and r['rss_peak_bytes'] / 1e9, '{:.2f}')} |"
            )
    arms = summary["arms"]
    lines += [
        "",
        "| arm | seeds | mean reward | pass@1 dense | pass@1 sparse | k3 | α p5 | tokens / step | masked "
        "| tokens rejected | responses vetoed | weight mean | ESS | dense fallback "
        "| oversample acceptance kept / dropped |",
        "|---|" + "---:|" * 14,
    ]
    for arm, a in arms.items():
        lines.append(
            f"| {arm} | {a['seeds']} | {_f(a['reward_mean'])} ± {_f(a['reward_std_over_seeds'])} "
            f"| {_f(a['pass1_dense'])} | {_f(a['pass1_sparse'])} | {_f(a['k3_mean'], '{:.4f}')} | {_f(a['alpha_p5'])} "
            f"| {_f(a['tokens_per_step'], '{:.0f}')} | {_f(a['masked_frac'])} | {_f(a['token_masked_frac'])} "
            f"| {_f(a['seq_vetoed_frac'])} | {_f(a['is_weight_mean'])} | {_f(a['is_ess'])} "
            f"| {_f(a['dense_fallback_frac'])} "
            f"| {_f(a['oversample_acceptance_kept'])} / {_f(a['oversample_acceptance_dropped'])} |"
        )
    all_bins = sorted({b for a in arms.values() for b in a["alpha_p5_bin_mean"]})
    lines += ["", "| arm | " + " | ".join(f"bin {b}" for b in all_bins) + " |", "|---|" + "---:|" * len(all_bins)]
    for arm, a in arms.items():
        cells = [
            f"{a['alpha_p5_bin_mean'][b]:.3f} (min {a['alpha_p5_bin_min'][b]:.3f}, n {a['alpha_p5_bin_steps'][b]})"
            if b in a["alpha_p5_bin_mean"]
            else "–"
            for b in all_bins
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the sparserl compare --out folder")
    parser.add_argument("--json", type=Path, help="write the summary here")
    args = parser.parse_args()
    summary = summarize(args.out)
    print(tables(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
