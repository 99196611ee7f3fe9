"""The main job's rollout (``python -m sparserl.rollout.profile --job default``: R-KV budget 40, step 2)
with the compressors' score kernels (native/kv_scores.c) in C against torch's, every other kernel
native in both, and the dense rollout; 3 rounds, alternating. Prints each run's tokens/s, ms per
decode step and the profile's split. Results: docs/results/compression_cost.md.

    python3 experiments/rollout/compression_main_job.py
"""
import json

from sparserl.rollout import native
from sparserl.rollout.profile import profile

KERNELS = (native.rkv_redundancy, native.window_attention)


def scores_in_c(on: bool) -> None:
    """Off: the two score kernels decline every input, so the compressors run their torch code."""
    native.rkv_redundancy = KERNELS[0] if on else (lambda *a, **k: None)
    native.window_attention = KERNELS[1] if on else (lambda *a, **k: None)


for rnd in range(3):
    for name, compressor, on in [("dense", "none", True), ("rkv, C scores", "rkv", True),
                                 ("rkv, torch scores", "rkv", False)]:
        scores_in_c(on)
        r = profile(job="default", compressor=compressor)
        split = {k: round(v, 3) for k, v in r["split_fraction"].items()}
        print(rnd, name, json.dumps({"tokens_per_s": round(r["tokens_per_s"], 1), "ms_per_step": round(r["ms_per_step"], 1),
                                     "compressions": r["compressions"], "split": split}), flush=True)
