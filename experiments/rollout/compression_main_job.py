"""The main job's rollout (``python -m sparserl.rollout.profile --job default``: R-KV budget 40, step 2)
with the compressors' score kernels (native/kv_scores.c) in C against torch's, every other kernel
native in both, and the dense rollout; rotating rounds (:func:`sparserl.bench.measure.time_rounds`,
3 by default). Prints each run's tokens/s, ms per decode step and the profile's split, and the C
scores' speed-up over torch's as the median of the per-round ratios. Results: docs/results/compression_cost.md.

    python3 experiments/rollout/compression_main_job.py [rounds]
"""

import json
import sys

from sparserl.bench.measure import time_rounds
from sparserl.rollout import native
from sparserl.rollout.profile import profile

KERNELS = (native.rkv_redundancy, native.window_attention)


def scores_in_c(on: bool) -> None:
    """Off: the two score kernels decline every input, so the compressors run their torch code."""
    native.rkv_redundancy = KERNELS[0] if on else (lambda *a, **k: None)
    native.window_attention = KERNELS[1] if on else (lambda *a, **k: None)


def arm(compressor: str, c_scores: bool):
    def run():
        scores_in_c(c_scores)
        return profile(job="default", compressor=compressor)

    return run


def show(rnd, name, seconds, r):
    split = {k: round(v, 3) for k, v in r["split_fraction"].items()}
    print(
        rnd,
        name,
        json.dumps(
            {
                "tokens_per_s": round(r["tokens_per_s"], 1),
                "ms_per_step": round(r["ms_per_step"], 1),
                "compressions": r["compressions"],
                "split": split,
            }
        ),
        flush=True,
    )


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
res = time_rounds(
    {"dense": arm("none", True), "rkv, C scores": arm("rkv", True), "rkv, torch scores": arm("rkv", False)},
    rounds,
    on_run=show,
)
speed = lambda r: r["tokens_per_s"]  # noqa: E731  (the figure the rounds are compared on)
print(
    "C scores over torch's, median of per-round ratios:",
    round(res.median_ratio("rkv, C scores", "rkv, torch scores", speed), 3),
)
