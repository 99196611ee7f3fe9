"""This page's tables from its `sparserl bench step` outputs: the rounds each file contributes, merged arm by arm,
then summarized as `bench step` does (medians; ratios as the median of per-round ratios, every ratio taken
within one process's round).

    python3 docs/results/long_step_split/tables.py

`bench_step.json`'s second round is left out: a test suite ran beside it (see the page).
"""

from __future__ import annotations

import json
from pathlib import Path

from sparserl import runlog as names
from sparserl.bench.step import summarize

HERE = Path(__file__).parent
#: (file, rounds of it that count)
SOURCES = [("bench_step.json", [0]), ("bench_rerun.json", [0])]
ORDER = ["dense", "dense_mb3072", "v0.2.0_dense", "controller", "rkv_fixed256", "blocktopk256", "int8"]


def merged_rounds() -> dict[str, list[dict]]:
    """Per arm, its rounds from every source, aligned so that round i of every arm ran in the same process."""
    rounds: dict[str, list[dict | None]] = {}
    offset = 0
    for name, keep in SOURCES:
        path = HERE / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())["rounds"]
        for arm, runs in data.items():
            slots = rounds.setdefault(arm, [])
            slots.extend([None] * (offset - len(slots)))
            slots.extend(runs[i] for i in keep)
        offset += len(keep)
    return rounds


def table() -> str:
    rounds = merged_rounds()
    base = rounds["dense"]
    lines = [
        "| arm | rounds | step s | rollout s | scoring s | α s | update s | rollout / step | α / rollout "
        "| rollout tok/s | response tokens | s per 1k tokens | sampler KV MiB | peak RSS GB | RSS at start GB "
        "| step vs dense | rollout vs dense |",
        "|---|" + "---:|" * 16,
    ]
    for arm in [a for a in ORDER if a in rounds] + [a for a in rounds if a not in ORDER]:
        pairs = [(r, b) for r, b in zip(rounds[arm], base) if r is not None and b is not None]
        row = summarize({arm: [r for r, _ in pairs], "dense": [b for _, b in pairs]}, "dense")[arm]
        lines.append(
            f"| {arm} | {row['rounds']} | {row[names.TIME_STEP]:.1f} | {row[names.TIME_ROLLOUT]:.1f} "
            f"| {row[names.TIME_SCORE]:.1f} | {row[names.TIME_ALPHA]:.1f} | {row[names.TIME_UPDATE]:.1f} "
            f"| {row['rollout_frac']:.0%} | {row['alpha_over_rollout']:.0%} "
            f"| {row[names.ROLLOUT_TOKENS_PER_S]:.0f} | {row['response_tokens']:.0f} "
            f"| {row['step_s_per_1k_tokens']:.2f} "
            f"| {row[names.KV_SAMPLER_ALLOC] / 2**20:.0f} | {row['rss_peak_bytes'] / 1e9:.2f} "
            f"| {row['rss_before_bytes'] / 1e9:.2f} | {row['step_vs_baseline']:.2f} "
            f"| {row['rollout_vs_baseline']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
