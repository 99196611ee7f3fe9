"""LoRA (peft) against full training on the main job: optimizer-state bytes, step time and the reward curve.

One round per seed: in this one process, the default job with full training and with LoRA
(``train.lora_rank``, ``lora_alpha``, ``train.lr`` as given), in alternating order. Per run: the bytes of the
optimizer state in the last checkpoint (``optimizer.safetensors``: AdamW's two moments of every trained
parameter), the trained parameters, the mean step time over steps 2.. (sum of the stations) and of the
update station, and the reward per step. A round's ratios are full / LoRA; the figures are the medians of
the rounds' ratios.

    flock /work/exp/cpu.lock python3 experiments/training/lora_vs_full.py --seed 0 --out docs/results/lora/seed0.json
    flock /work/exp/cpu.lock python3 experiments/training/lora_vs_full.py --seed 1 --out docs/results/lora/seed1.json
    python3 experiments/training/lora_vs_full.py --table docs/results/lora/seed*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sparserl.bench.measure import round_order


def run(arm: str, seed: int, lora: list[str], extra: list[str], folder: Path) -> dict:
    from sparserl import runlog as names
    from sparserl.config import load_config, validate
    from sparserl.runlog import read_metrics
    from sparserl.train.checkpoint import latest_checkpoint
    from sparserl.train.trainer import train

    overrides = [f"train.seed={seed}", "log.progress=plain", "log.tensorboard=false", *extra]
    cfg = validate(load_config("default", overrides + (lora if arm == "lora" else [])))
    start = time.perf_counter()
    folder = train(cfg, run_dir=folder / arm, log=lambda *_: None)
    wall = time.perf_counter() - start
    rows = read_metrics(folder)
    ckpt = latest_checkpoint(folder)
    weights = sum(f.stat().st_size for f in (ckpt / "model").glob("*.safetensors"))
    rest = rows[1:]
    return {
        "arm": arm,
        "seed": seed,
        "overrides": overrides + (lora if arm == "lora" else []),
        "wall_s": wall,
        "optimizer_state_bytes": (ckpt / "optimizer.safetensors").stat().st_size,
        "checkpoint_weight_bytes": weights,
        "step_s": statistics.fmean(sum(r[k] for k in names.STATIONS) for r in rest),
        "update_s": statistics.fmean(r[names.TIME_UPDATE] for r in rest),
        "reward": [r[names.REWARD_MEAN] for r in rows],
        "eval": {k: v for k, v in rows[-1].items() if k.startswith("eval/")},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lora", nargs="*", default=["train.lora_rank=16", "train.lora_alpha=32", "train.lr=2e-4"])
    ap.add_argument("--table", nargs="*", type=Path, help="print the table of stored rounds instead")
    ap.add_argument("overrides", nargs="*", help="more overrides for both arms")
    args = ap.parse_args(argv)
    if args.table:
        return table(args.table)
    order = round_order(["full", "lora"], args.seed)  # a seed is a round: the order rotates across processes
    out = {"command": "python3 experiments/training/lora_vs_full.py " + " ".join(argv or sys.argv[1:])}
    from sparserl.rollout.dtype_auto import cpu_name
    from sparserl.rollout.native import isa

    out["machine"] = {"cpu": cpu_name(), "isa": isa()}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in order:
            out[arm] = run(arm, args.seed, args.lora, args.overrides, Path(tmp))
            print(json.dumps({k: v for k, v in out[arm].items() if k != "overrides"}), flush=True)
    out["ratios"] = {
        key: out["full"][key] / out["lora"][key] for key in ("optimizer_state_bytes", "step_s", "update_s")
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(out["ratios"])
    return 0


def table(files: list[Path]) -> int:
    rounds = [json.loads(f.read_text()) for f in files]
    for key in ("optimizer_state_bytes", "step_s", "update_s"):
        ratios = [r["ratios"][key] for r in rounds]
        print(
            f"full / LoRA {key}: median {statistics.median(ratios):.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    for r in rounds:
        for arm in ("full", "lora"):
            a = r[arm]
            print(
                f"seed {a['seed']} {arm}: optimizer state {a['optimizer_state_bytes'] / 2**20:.1f} MiB, "
                f"step {a['step_s']:.1f} s, "
                f"update {a['update_s']:.1f} s, reward "
                + " ".join(f"{x:.2f}" for x in a["reward"])
                + f", eval {a['eval']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
