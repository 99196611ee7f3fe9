"""One-step-asynchronous rollouts against synchronous ones: the step time on this machine, and its
projection to a cluster from the measured station times.

Each round runs, in this one process, the same short training run twice on one rollout worker (a local
Ray started by each run): ``sync`` (cluster.rollout_workers=1) and ``async`` (+ rollout.async=true), in
alternating order (:func:`sparserl.bench.measure.time_rounds`).
A step's time is the sum of its stations (``time/rollout_s`` + reward + score +
update, the push included); step 1 is left out (warm-up, and the async run sends two rollouts there).
The ratio of a round is sync's mean step over async's; the figure is the median of the rounds' ratios.

    flock /work/exp/cpu.lock python3 experiments/training/async_step_time.py --rounds 3 --steps 5 \\
        --out docs/results/async_rollouts/async_step_time.json
    flock /work/exp/cpu.lock python3 experiments/training/async_step_time.py --arms one learners2 \\
        --rounds 3 --steps 4 \\
        --out docs/results/async_rollouts/learners_step_time.json train.prompts_per_step=4

``--arms`` picks other pairs: ``one`` (everything in the training process), ``sync``, ``async``, ``async2`` (two
steps ahead: ``rollout.max_staleness=2``), ``async2_partial`` (and ``rollout.partial``;
docs/results/async_staleness), ``async2_partial_recompute`` (and ``rollout.partial_kv=recompute``), ``learners2``
(two data-parallel learners, the sampler in the training process), and with the exact α ``sync_replay`` (the
training process replays the worker's sampler), ``sync_kept`` and ``async_kept`` (the worker sends back the q it
kept while it sampled):

    python3 experiments/training/async_step_time.py --arms sync_replay sync_kept --rounds 3 --steps 4 \
        --out docs/results/alpha_kept/workers_sync.json train.prompts_per_step=4

The projection (``project``): with ``R`` the sampling of a step on one worker (``time/generate_s``),
``W`` workers, ``P`` the push (the training process's part, ``time/push_s``), ``K`` a worker loading the
weights, and ``L`` the learner's stations (reward + score + update without the push), a synchronous step
takes ``R/W + K + L + P`` and a one-step-asynchronous one ``max(R/W + K, L + P)``: the sampling of step
k + 1 and the loading run on the workers while the learner updates on step k.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from sparserl.bench.measure import time_rounds

#: R-KV at a fixed budget of 40 with Sparse-RL: the measured job (the default's α-tail controller needs
#: ``mismatch.alpha``, which BASE turns off to time the stations alone)
JOB = "sparse_rl_fixed40"
BASE = [
    "train.prompts_per_step=2",
    "mismatch.alpha=off",
    "data.eval=null",
    "checkpoint.every=0",
    "log.progress=plain",
    "log.tensorboard=false",
]
ARMS = {
    "one": [],
    "sync": ["cluster.rollout_workers=1"],
    "async": ["cluster.rollout_workers=1", "rollout.async=true"],
    "async2": ["cluster.rollout_workers=1", "rollout.async=true", "rollout.max_staleness=2"],  # two steps ahead
    # two steps ahead, each rollout in two segments: the second with the weights pushed in between
    "async2_partial": [
        "cluster.rollout_workers=1",
        "rollout.async=true",
        "rollout.max_staleness=2",
        "rollout.partial=true",
    ],
    # the same, each load recomputing the live responses' cache with the new weights (rollout.partial_kv)
    "async2_partial_recompute": [
        "cluster.rollout_workers=1",
        "rollout.async=true",
        "rollout.max_staleness=2",
        "rollout.partial=true",
        "rollout.partial_kv=recompute",
    ],
    "learners2": ["cluster.learners=2"],
    # the exact α with a rollout worker: replayed in the training process,
    # or from the q the worker kept while it sampled, synchronous or one step ahead
    "sync_replay": ["cluster.rollout_workers=1", "mismatch.alpha=exact", "mismatch.alpha_record_mib=0"],
    "sync_kept": ["cluster.rollout_workers=1", "mismatch.alpha=exact"],
    "async_kept": ["cluster.rollout_workers=1", "rollout.async=true", "mismatch.alpha=exact"],
}


def run_arm(arm: str, steps: int, extra: list[str], folder: Path) -> list[dict]:
    from sparserl.config import load_config, validate
    from sparserl.runlog import read_metrics
    from sparserl.train.trainer import train

    cfg = validate(load_config(JOB, [*BASE, *ARMS[arm], f"train.steps={steps}", *extra]))
    run = train(cfg, run_dir=folder / arm, log=lambda *_: None)
    return read_metrics(run)


def step_time(row: dict) -> float:
    from sparserl.runlog import step_seconds

    return step_seconds(row)


def stations(rows: list[dict]) -> dict:
    """Mean per step (step 1 left out) of each station and of the parts the projection needs."""
    from sparserl import runlog as names

    keys = [
        *names.STATIONS,
        names.TIME_GENERATE,
        names.TIME_PUSH,
        names.ROLLOUT_TOKENS_PER_S,
        names.LENGTH_MEAN,
        names.MISMATCH_POLICY_LAG,
        names.CLUSTER_WORKER_IDLE,
        names.RESPONSES_PER_S,
        names.MISMATCH_POLICY_LAG_TOKENS,
        names.REWARD_MEAN,
        names.MISMATCH_K3,
    ]
    rest = rows[1:]
    out = {k: statistics.fmean(r[k] for r in rest) for k in keys if all(k in r for r in rest)}
    out["step_s"] = statistics.fmean(step_time(r) for r in rest)
    return out


def project(sync: dict, async_: dict, workers: int, rollout_share: float | None = None) -> dict:
    """Step times of ``workers`` rollout workers on machines of their own, sync and async, from the two arms'
    station means. ``R`` sampling on one worker (sync's ``time/generate_s``); ``L`` the learner's stations
    without the push (sync's, the learner on all its cores); ``P`` the push in the training process (sync:
    ``time/push_s``, which waits for the workers to load; async: the same without that wait); ``K`` a worker
    loading the weights (the difference). With ``rollout_share`` R is rescaled so that R / (R + L + P) = that
    share of a synchronous step on one worker (the seeds' 70-90% at 4K-37K tokens)."""
    from sparserl import runlog as names

    R, P_sync, P_async = sync[names.TIME_GENERATE], sync[names.TIME_PUSH], async_[names.TIME_PUSH]
    K = max(0.0, P_sync - P_async)
    L = sync[names.TIME_REWARD] + sync[names.TIME_SCORE] + sync[names.TIME_UPDATE] - P_sync
    if rollout_share is not None:
        R = rollout_share / (1 - rollout_share) * (L + P_sync)
    step_sync = R / workers + L + P_sync
    step_async = max(R / workers + K, L + P_async)
    return {
        "workers": workers,
        "rollout_share": rollout_share,
        "sync_s": step_sync,
        "async_s": step_async,
        "speedup": step_sync / step_async,
        "R": R,
        "L": L,
        "P_sync": P_sync,
        "P_async": P_async,
        "K": K,
    }


def add_projection(out: dict) -> None:
    """``out["projection"]`` from the rounds' station means (the median over rounds of each), printed."""
    means = {arm: [r[arm]["mean"] for r in out["rounds"]] for arm in ("sync", "async")}
    median = {arm: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for arm, ms in means.items()}
    out["station_medians"] = median
    out["projection"] = [
        project(median["sync"], median["async"], w, share) for share in (None, 0.7, 0.8, 0.9) for w in (1, 2, 4, 8)
    ]
    for p in out["projection"]:
        print(
            f"  workers {p['workers']}, rollout share {p['rollout_share']}: sync {p['sync_s']:.2f} s, async "
            f"{p['async_s']:.2f} s, {p['speedup']:.2f}x"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--arms",
        nargs=2,
        default=["sync", "async"],
        choices=list(ARMS),
        help="the two arms; a round's ratio is the first's mean step over the second's",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--project", action="store_true", help="only recompute the projection of --out's rounds")
    ap.add_argument("overrides", nargs="*", help="more config overrides for both arms")
    args = ap.parse_args(argv)
    if args.project:
        out = json.loads(args.out.read_text())
        add_projection(out)
        args.out.write_text(json.dumps(out, indent=1))
        return 0
    import os

    import torch

    from sparserl.rollout.dtype_auto import cpu_name
    from sparserl.rollout.native import isa

    machine = {"cpu": cpu_name(), "isa": isa(), "cores": os.cpu_count(), "torch": torch.__version__}

    first, second = args.arms

    def arm_run(arm):
        def run():
            with tempfile.TemporaryDirectory() as tmp:
                rows = run_arm(arm, args.steps, args.overrides, Path(tmp))
            return {
                "steps": [
                    {
                        "step_s": step_time(r),
                        **{key: r.get(key) for key in r if key.startswith("time/")},
                        "lag": r.get("mismatch/policy_lag_steps"),
                    }
                    for r in rows
                ],
                "mean": stations(rows),
            }

        return run

    step_s = lambda got: got["mean"]["step_s"]  # noqa: E731  (the figure the rounds are compared on)
    res = time_rounds(
        {first: arm_run(first), second: arm_run(second)},
        args.rounds,
        on_run=lambda k, arm, sec, got: print(f"round {k + 1}: {arm} {step_s(got):.2f} s/step", flush=True),
    )
    ratios = res.ratios(first, second, step_s)
    rounds = [
        {**{arm: {**res.results[arm][k], "run_s": res.seconds[arm][k]} for arm in (first, second)}, "ratio": ratios[k]}
        for k in range(args.rounds)
    ]
    out = {
        "command": "python3 experiments/training/async_step_time.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine,
        "arms": args.arms,
        "rounds": rounds,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
    }
    print(
        f"median of per-round ratios {first}/{second}: {out['median_ratio']:.3f} "
        f"({', '.join(f'{r:.3f}' for r in ratios)})"
    )
    if set(args.arms) == {"sync", "async"}:
        add_projection(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
