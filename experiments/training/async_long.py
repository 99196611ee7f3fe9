"""Tables of a ``sparserl compare`` of the long job on rollout workers: synchronous, one step ahead and k steps
ahead with partial rollouts, over seeds; step time, the workers' idle share, finished responses per second,
reward, the α tail per length bin, the policy lag, and the projection to workers on machines of their own.

    sparserl compare long data.eval=null checkpoint.every=0 log.progress=plain log.tensorboard=false \\
        --arms "sync=cluster.rollout_workers=1,async=cluster.rollout_workers=1;rollout.async=true,\\
    partial=cluster.rollout_workers=1;rollout.async=true;rollout.max_staleness=2;rollout.partial=true" \\
        --seeds 3 --steps 4 --paired-against sync --out /work/exp/long_async
    python3 experiments/training/async_long.py /work/exp/long_async --json docs/results/async_long/summary.json

Per run, the means leave out step 1 (no rollout was sent ahead of it: every arm waits for its whole rollout there)
unless ``--all-steps``. **Step time** is ``time/step_s`` (the step's wall clock: the rollout's wait, scoring, α,
the update and the push). **Batch occupancy** is a step's mean response length over its longest: the share of the
row-steps of a batch that sample while it runs to its longest response (what refilling finished rows could use).
Ratios against ``sync`` are per seed (the same seed's prompts and samples at step 1), then the median over seeds.

The projection (``project``), per arm from the sync arm's station means (median over seeds): ``R`` the sampling on
one worker (``time/generate_s``), ``W`` workers on machines of their own, ``L`` the learner's stations (reward,
scoring, α, update, without the push ``P``): a synchronous step takes ``R/W + L + P``; a step with rollouts sent
ahead ``max(R/W, L + P)`` (the sampling of later steps runs while the learner works). With ``rollout_share`` R is
rescaled so that R / (R + L + P) is that share of a synchronous step on one worker (the 70% the seeds report on
GPUs).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from sparserl import runlog as names
from sparserl.runlog import read_metrics

ARMS = ("sync", "async", "partial")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def run_figures(run_dir: Path, first: int) -> dict:
    """A run's means over its steps from ``first`` (1-based) on, and its per-step rows of interest."""
    rows = read_metrics(run_dir)
    rest = rows[first - 1 :]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    responses = cfg["train"]["prompts_per_step"] * cfg["rollout"]["n"]
    col = lambda key, rs=rest: [r.get(key) for r in rs]  # noqa: E731
    bins: dict[int, list[float]] = {}
    for row in rows:  # the α tail over every step: the same steps in every arm
        for key, value in row.items():
            if key.startswith(names.MISMATCH_ALPHA_P5_BIN):
                bins.setdefault(int(key[len(names.MISMATCH_ALPHA_P5_BIN) :]), []).append(float(value))
    occupancy = [
        r[names.LENGTH_MEAN] / r[names.LENGTH_MAX] for r in rest if r.get(names.LENGTH_MAX) and r.get(names.LENGTH_MEAN)
    ]
    return {
        "steps": len(rows),
        "reward_per_step": col(names.REWARD_MEAN, rows),
        "step_s_per_step": col(names.TIME_STEP, rows),
        "length_mean_per_step": col(names.LENGTH_MEAN, rows),
        # seconds per 1,000 generated tokens (32 x the mean length), from the second step on: a ratio that the
        # arms' different answer lengths after step 1 do not move
        "step_s_per_ktok": _mean(
            r[names.TIME_STEP] / (r[names.LENGTH_MEAN] * responses / 1000) for r in rest if r.get(names.LENGTH_MEAN)
        ),
        "reward_mean": _mean(col(names.REWARD_MEAN, rows)),
        "step_s": _mean(col(names.TIME_STEP)),
        "stations": {
            key: _mean(col(key))
            for key in (*names.STATIONS, names.TIME_GENERATE, names.TIME_PUSH)
            if any(x is not None for x in col(key))
        },
        "worker_idle_frac": _mean(col(names.CLUSTER_WORKER_IDLE)),
        "responses_per_s": _mean(col(names.RESPONSES_PER_S)),
        "rollout_tokens_per_s": _mean(col(names.ROLLOUT_TOKENS_PER_S)),
        "length_mean": _mean(col(names.LENGTH_MEAN, rows)),
        "occupancy": _mean(occupancy),
        "policy_lag_steps": col(names.MISMATCH_POLICY_LAG, rows),
        "policy_lag_tokens_mean": _mean(col(names.MISMATCH_POLICY_LAG_TOKENS)),
        "partial_frac": _mean(col(names.ROLLOUT_PARTIAL_FRAC)),
        "alpha_mean": _mean(col(names.MISMATCH_ALPHA_MEAN, rows)),
        "alpha_p5": _mean(col(names.MISMATCH_ALPHA_P5, rows)),
        "k3": _mean(col(names.MISMATCH_K3, rows)),
        "alpha_p5_bin": {b: v for b, v in sorted(bins.items())},
        "rss_peak_bytes": max((x for x in col(names.MEMORY_RSS_PEAK, rows) if x is not None), default=None),
        "predicted_peak_bytes": max((x for x in col(names.MEMORY_PREDICTED_PEAK, rows) if x is not None), default=None),
    }


def project(station: dict, workers: int, rollout_share: float | None = None) -> dict:
    """Step times with ``workers`` rollout workers on machines of their own, synchronous and sent ahead, from
    one arm's station means (the module docstring)."""
    R, P = station[names.TIME_GENERATE], station[names.TIME_PUSH]
    L = sum(station.get(k, 0.0) for k in (names.TIME_REWARD, names.TIME_SCORE, names.TIME_ALPHA, names.TIME_UPDATE))
    L -= P  # the push is part of the update's time
    if rollout_share is not None:
        R = rollout_share / (1 - rollout_share) * (L + P)
    sync, ahead = R / workers + L + P, max(R / workers, L + P)
    return {"workers": workers, "rollout_share": rollout_share, "R": R, "L": L, "P": P, "sync_s": sync,
            "ahead_s": ahead, "speedup": sync / ahead}  # fmt: skip


def summarize(out: Path, first: int) -> dict:
    comparison = out / "comparison.json"  # written when the compare ends; the runs' folders before that
    command = json.loads(comparison.read_text()).get("command") if comparison.exists() else None
    runs: dict[str, dict[str, dict]] = {}
    for run in sorted((out / "runs").iterdir()):
        if (run / "metrics.jsonl").exists():
            arm, seed = run.name.rsplit("-seed", 1)
            runs.setdefault(arm, {})[seed] = run_figures(run, first)
    per_arm = {}
    for arm, seeds in runs.items():
        bins: dict[int, list[float]] = {}
        for r in seeds.values():
            for b, vs in r["alpha_p5_bin"].items():
                bins.setdefault(b, []).extend(vs)
        per_arm[arm] = {
            "seeds": len(seeds),
            **{
                key: _mean(r[key] for r in seeds.values())
                for key in (
                    "reward_mean",
                    "step_s",
                    "step_s_per_ktok",
                    "worker_idle_frac",
                    "responses_per_s",
                    "rollout_tokens_per_s",
                    "length_mean",
                    "occupancy",
                    "policy_lag_tokens_mean",
                    "partial_frac",
                    "alpha_mean",
                    "alpha_p5",
                    "k3",
                )
            },
            "alpha_p5_bin_mean": {b: statistics.fmean(v) for b, v in sorted(bins.items())},
            "alpha_p5_bin_min": {b: min(v) for b, v in sorted(bins.items())},
        }
        if arm != "sync" and "sync" in runs:
            ratios = {
                s: runs["sync"][s]["step_s"] / r["step_s"]
                for s, r in seeds.items()
                if s in runs["sync"] and r["step_s"] and runs["sync"][s]["step_s"]  # both past their first step
            }
            per_arm[arm]["step_speedup_vs_sync"] = ratios
            per_arm[arm]["step_speedup_vs_sync_median"] = statistics.median(ratios.values()) if ratios else None
    projection = []
    if "sync" in runs:
        keys = next(iter(runs["sync"].values()))["stations"]
        done = [r["stations"] for r in runs["sync"].values() if set(keys) <= set(r["stations"])]
        station = {k: statistics.median(st[k] for st in done) for k in keys}
        projection = [project(station, w, share) for share in (None, 0.7) for w in (1, 2, 4, 8)]
    return {"command": command, "first_step": first, "arms": per_arm, "runs": runs,
            "projection": projection}  # fmt: skip


def _f(x, fmt="{:.3f}"):
    return "–" if x is None else fmt.format(x)


def tables(summary: dict) -> str:
    lines = [
        "| run | mean reward | s / step | rollout wait s | generate s | worker idle | responses / s | occupancy "
        "| token lag | partial | α p5 | k3 | peak RSS GB |",
        "|---|" + "---:|" * 12,
    ]
    for arm, seeds in summary["runs"].items():
        for seed, r in seeds.items():
            st = r["stations"]
            lines.append(
                f"| {arm}-seed{seed} | {_f(r['reward_mean'])} | {_f(r['step_s'], '{:.0f}')} "
                f"| {_f(st.get(names.TIME_ROLLOUT), '{:.1f}')} | {_f(st.get(names.TIME_GENERATE), '{:.0f}')} "
                f"| {_f(r['worker_idle_frac'], '{:.2f}')} | {_f(r['responses_per_s'], '{:.3f}')} "
                f"| {_f(r['occupancy'], '{:.2f}')} | {_f(r['policy_lag_tokens_mean'], '{:.2f}')} "
                f"| {_f(r['partial_frac'], '{:.2f}')} | {_f(r['alpha_p5'])} | {_f(r['k3'], '{:.4f}')} "
                f"| {_f(r['rss_peak_bytes'] and r['rss_peak_bytes'] / 1e9, '{:.2f}')} |"
            )
    arms = summary["arms"]
    lines += ["", "| arm | seeds | mean reward | s / step | step speed-up vs sync (per seed; median) | worker idle "
              "| responses / s | α p5 |", "|---|" + "---:|" * 7]  # fmt: skip
    for arm, a in arms.items():
        ratios = a.get("step_speedup_vs_sync")
        speed = (
            f"{', '.join(f'{v:.3f}' for v in ratios.values())}; **{a['step_speedup_vs_sync_median']:.3f}**"
            if ratios
            else "–"
        )
        lines.append(
            f"| {arm} | {a['seeds']} | {_f(a['reward_mean'])} | {_f(a['step_s'], '{:.0f}')} | {speed} "
            f"| {_f(a['worker_idle_frac'], '{:.2f}')} | {_f(a['responses_per_s'], '{:.3f}')} | {_f(a['alpha_p5'])} |"
        )
    all_bins = sorted({b for a in arms.values() for b in a["alpha_p5_bin_mean"]})
    lines += ["", "| arm | " + " | ".join(f"bin {b}" for b in all_bins) + " |", "|---|" + "---:|" * len(all_bins)]
    for arm, a in arms.items():
        cells = [
            f"{a['alpha_p5_bin_mean'][b]:.3f} (min {a['alpha_p5_bin_min'][b]:.3f})"
            if b in a["alpha_p5_bin_mean"]
            else "–"
            for b in all_bins
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if summary["projection"]:
        lines += ["", "| rollout share | workers | R s | L s | P s | sync s / step | sent ahead s / step | speed-up |",
                  "|---|" + "---:|" * 7]  # fmt: skip
        for p in summary["projection"]:
            share = "measured" if p["rollout_share"] is None else f"{p['rollout_share']:.0%}"
            lines.append(
                f"| {share} | {p['workers']} | {p['R']:.1f} | {p['L']:.1f} | {p['P']:.1f} | {p['sync_s']:.1f} "
                f"| {p['ahead_s']:.1f} | {p['speedup']:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the sparserl compare --out folder")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--all-steps", action="store_true", help="means over every step (default: from step 2)")
    args = parser.parse_args()
    summary = summarize(args.out, 1 if args.all_steps else 2)
    print(tables(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
