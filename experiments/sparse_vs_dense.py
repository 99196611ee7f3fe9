"""Sparse vs dense rollouts on the embedded model: dense, sparse + `none` correction, sparse +
`sparse_rl` correction, with the same seeds and steps, the KV budget below the response length.

    python experiments/sparse_vs_dense.py --steps 12 --out docs/results/sparse_vs_dense

Each run trains with the `default` config (R-KV, budget 8 decode tokens past the prompt, responses up to 64) and
the two presets that change one thing: `dense` (no compression, no correction) and `sparse_naive`
(compression, no correction). At the end each run is evaluated on held-out `arith` problems (a
different seed from training) under dense and under sparse inference. Tables and plots go to OUT.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sparserl.config import load_config, validate
from sparserl.eval.report import make_comparison
from sparserl.train.trainer import train

RUNS = [("dense", "dense"), ("sparse_naive", "sparse_naive"), ("sparse_rl", "default")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-limit", type=int, default=48)
    ap.add_argument("--out", default="docs/results/sparse_vs_dense")
    ap.add_argument("--runs-dir", default="runs/sparse_vs_dense")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dirs, summary = [], []
    for label, preset in RUNS:
        cfg = validate(load_config(preset, [
            f"train.steps={args.steps}", f"train.seed={args.seed}", "data.eval=arith:n=200,seed=12345",
            f"data.eval_limit={args.eval_limit}", "eval.compressor=rkv", "log.progress=plain",
            "checkpoint.every=1000", *args.overrides]))
        t = time.time()
        run = train(cfg, run_dir=Path(args.runs_dir) / label)
        run_dirs.append(run)
        ev = json.loads((run / "eval.json").read_text())
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        half = max(1, len(rows) // 2)
        summary.append({
            "run": label, "config": preset, "minutes": (time.time() - t) / 60,
            "reward_first_half": sum(r["reward/mean"] for r in rows[:half]) / half,
            "reward_second_half": sum(r["reward/mean"] for r in rows[half:]) / max(1, len(rows) - half),
            "heldout_dense_pass@1": ev["dense"]["pass@1"],
            "heldout_sparse_pass@1": ev.get("sparse", {}).get("pass@1"),
            "mismatch_k3_mean": sum(r.get("mismatch/k3_kl", 0.0) for r in rows) / len(rows),
            "token_masked_frac_mean": sum(r.get("rs/token_masked_frac", 0.0) for r in rows) / len(rows),
            "kv_bytes_peak_mean": sum(r["kv/bytes_peak"] for r in rows) / len(rows),
            "kv_bytes_dense_mean": sum(r.get("kv/bytes_dense", 0) for r in rows) / len(rows),
            "rollout_s_mean": sum(r["time/rollout_s"] for r in rows) / len(rows),
            "step_s_mean": sum(r["time/rollout_s"] + r["time/reward_s"] + r["time/score_s"] + r["time/update_s"] for r in rows) / len(rows),
        })
    make_comparison(run_dirs, out, labels=[r[0] for r in RUNS])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = ["# Sparse vs dense rollouts (embedded SmolLM2-135M, arith)", "",
             f"Command: `python experiments/sparse_vs_dense.py {' '.join(sys.argv[1:])}`", "",
             "| run | reward 1st half | reward 2nd half | held-out dense pass@1 | held-out sparse pass@1 | "
             "mismatch k3 | tokens masked | KV peak MiB | dense KV MiB | rollout s | step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        sp = "-" if s["heldout_sparse_pass@1"] is None else f"{s['heldout_sparse_pass@1']:.3f}"
        lines.append(f"| {s['run']} | {s['reward_first_half']:.3f} | {s['reward_second_half']:.3f} | "
                     f"{s['heldout_dense_pass@1']:.3f} | {sp} | {s['mismatch_k3_mean']:.4f} | "
                     f"{s['token_masked_frac_mean']:.3f} | {s['kv_bytes_peak_mean'] / 2**20:.0f} | "
                     f"{s['kv_bytes_dense_mean'] / 2**20:.0f} | {s['rollout_s_mean']:.1f} | {s['step_s_mean']:.1f} |")
    (out / "README.md").write_text("\n".join(lines) + "\n\nPlots: compare_*.png; per-step table: comparison.md\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
