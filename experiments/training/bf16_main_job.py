"""The main job with the bf16 sampler against the float32 one: the same config and seed,
``rollout.dtype`` float32 then bfloat16, one after the other in this process's machine; per step the
reward, the sampler's mismatch against the dense old policy (k3, Sparrow's exact α: mean and p5) and the
rollout's time, and their means. The learner is float32 in both (``model.dtype``).

    python3 experiments/training/bf16_main_job.py --steps 8 --json docs/results/bf16_decode/main_job.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sparserl import runlog as names

KEEP = (
    names.REWARD_MEAN,
    names.MISMATCH_K3,
    names.MISMATCH_ALPHA_MEAN,
    names.MISMATCH_ALPHA_P5,
    names.TIME_ROLLOUT,
    names.TIME_GENERATE,
)


def run(dtype: str, steps: int, seed: int, folder: Path) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "sparserl.cli",
        "train",
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"rollout.dtype={dtype}",
        "checkpoint.every=0",
        "data.eval=null",
        "log.tensorboard=false",
        "--run-dir",
        str(folder / dtype),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (folder / dtype / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r.get(k) for k in ("step", *KEEP)} for r in rows if names.REWARD_MEAN in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    out = {"command": "python3 experiments/training/bf16_main_job.py " + " ".join(sys.argv[1:]), "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("float32", "bfloat16"):
            steps = run(dtype, args.steps, args.seed, Path(tmp))
            means = {
                k: statistics.fmean(s[k] for s in steps if s.get(k) is not None)
                for k in KEEP
                if any(s.get(k) is not None for s in steps)
            }
            out["arms"][dtype] = {"steps": steps, "mean": means}
            print(dtype, json.dumps({k: round(v, 4) for k, v in means.items()}), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
