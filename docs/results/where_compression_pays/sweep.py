"""Where a compressed sampler starts to pay in a whole RL step: the step's predicted speedup over dense by response
length and responses per step, on this CPU (rates measured by `sparserl bench step-cost`, a file given) and on an
assumed H200 (Qwen3 shapes), and the step's predicted peak memory (SmolLM2-135M on the CPU) dense against R-KV.

    python3 docs/results/where_compression_pays/sweep.py \
        --cpu-rates docs/results/where_compression_pays/cpu_rates.json \
        --out docs/results/where_compression_pays/sweep.json           # or one --part cpu|memory|gpu at a time

Every figure is a prediction of the cost model (`sparserl.cost`, docs/algorithms.md §3) or of the memory model
(`sparserl.memory`); the page beside this script puts the measured 1,024-token step next to them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CPU_LENGTHS = [512, 1024, 2048, 4096, 8192]
GPU_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
BATCHES = [8, 32, 64]
PAYS = 1.05  # a step at least 5% shorter counts as paying


def step_cost(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cost.json"
        subprocess.run(
            ["sparserl", "bench", "step-cost", *args, "--json", str(out)], check=True, capture_output=True, text=True
        )
        return json.loads(out.read_text())


def speedups(report: dict) -> dict[str, dict[str, float]]:
    arms = report["arms"]
    dense = arms["dense"]
    return {
        name: {
            "step_x": dense["time/step_s"] / a["time/step_s"],
            "rollout_x": dense["time/rollout_s"] / a["time/rollout_s"],
            "dense_rollout_frac": dense["time/rollout_s"] / dense["time/step_s"],
        }
        for name, a in arms.items()
        if name != "dense"
    }


def cpu_time(rates: str) -> list[dict]:
    rows = []
    for length in CPU_LENGTHS:
        budget = length // 4
        for n in BATCHES:
            report = step_cost(
                [
                    "--setting",
                    "long-job",
                    "--machine",
                    rates,
                    "--lengths",
                    str(length),
                    "--responses",
                    str(n),
                    "--micro-batch-tokens",
                    str(max(4096, length + 512)),
                    "--arms",
                    f"dense,rkv{budget},blocktopk,int8",
                ]
            )
            rows.append({"length": length, "responses": n, "budget": budget, "arms": speedups(report)})
            print(f"cpu L={length} n={n}: {rows[-1]['arms']}", file=sys.stderr)
    return rows


def gpu_time(model: str) -> list[dict]:
    rows = []
    for length in GPU_LENGTHS:
        budget = length // 8  # Sparse-RL's ratio: 512 KV tokens of 4,096
        for n in BATCHES:
            report = step_cost(
                [
                    "--setting",
                    "sparrow",
                    "--model",
                    model,
                    "--lengths",
                    str(length),
                    "--responses",
                    str(n),
                    "--arms",
                    f"dense,rkv{budget},sparrow",
                ]
            )
            rows.append({"length": length, "responses": n, "budget": budget, "arms": speedups(report)})
            print(f"{model} L={length} n={n}: {rows[-1]['arms']}", file=sys.stderr)
    return rows


def cpu_memory() -> list[dict]:
    """SmolLM2-135M's predicted step peak, dense against R-KV at a quarter of the length, 32 responses."""
    from sparserl.config import load_config
    from sparserl.cost.shapes import model_shape
    from sparserl.memory import predict_peak

    shape = model_shape("smollm2-135m")
    rows = []
    for length in CPU_LENGTHS:
        common = [
            f"rollout.max_new_tokens={length}",
            f"train.max_tokens_per_micro_batch={max(4096, length + 512)}",
            "rollout.dtype=bfloat16",
            "model.mixed_precision=bfloat16",
            "rollout.kv_controller=null",
        ]
        row = {"length": length}
        for arm, extra in (("dense", ["rollout.compressor=none"]), ("rkv", [f"rollout.kv_budget={length // 4}"])):
            for ckpt in ("false", "true"):
                cfg = load_config("long", [*common, *extra, f"train.gradient_checkpointing={ckpt}"])
                p = predict_peak(cfg, shape, 416)
                row[f"{arm}_ckpt{ckpt}"] = {
                    "peak": p.peak,
                    "station": p.largest_station,
                    "kv": p.stations.get("rollout", {}).get("KV cache", 0),
                }
        rows.append(row)
        print(f"memory L={length}: {row}", file=sys.stderr)
    return rows


def _family(arm: str) -> str:
    """``rkv256`` -> ``rkv`` (the budget is the row's); other arm names as they are."""
    return "rkv" if arm.startswith("rkv") and arm[3:].isdigit() else arm


def time_table(rows: list[dict]) -> str:
    """Step x (rollout x) of each arm against dense, a row per length, a column per arm and batch."""
    arms = [_family(a) for a in rows[0]["arms"]]
    batches = sorted({r["responses"] for r in rows})
    head = [f"{a} @ {n}" for a in arms for n in batches]
    lines = [
        "| length | budget | " + " | ".join(head) + " | dense rollout frac @ " + "/".join(map(str, batches)) + " |"
    ]
    lines.append("|---:|---:|" + "---:|" * (len(head) + 1))
    for length in sorted({r["length"] for r in rows}):
        at = {r["responses"]: r for r in rows if r["length"] == length}
        cells = []
        for a in arms:
            for n in batches:
                arm = next(v for k, v in at[n]["arms"].items() if _family(k) == a)
                x = arm["step_x"]
                cell = f"{x:.2f} ({arm['rollout_x']:.2f})"
                cells.append(f"**{cell}**" if x >= PAYS else cell)
        fracs = "/".join(f"{next(iter(at[n]['arms'].values()))['dense_rollout_frac']:.0%}" for n in batches)
        lines.append(f"| {length:,} | {at[batches[0]]['budget']:,} | " + " | ".join(cells) + f" | {fracs} |")
    return "\n".join(lines)


def memory_table(rows: list[dict]) -> str:
    lines = [
        "| length | dense | R-KV (L/4) | dense, checkpointed | R-KV, checkpointed | dense KV |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cell = lambda k: f"{r[k]['peak'] / 1e9:.2f} GB ({r[k]['station']})"  # noqa: E731
        lines.append(
            f"| {r['length']:,} | {cell('dense_ckptfalse')} | {cell('rkv_ckptfalse')} | {cell('dense_ckpttrue')} "
            f"| {cell('rkv_ckpttrue')} | {r['dense_ckptfalse']['kv'] / 1e9:.2f} GB |"
        )
    return "\n".join(lines)


def tables(result: dict) -> str:
    out = []
    for key, title in (
        ("cpu_time", "this CPU, SmolLM2-135M"),
        ("qwen3-1.7b", "H200, Qwen3-1.7B"),
        ("qwen3-4b", "H200, Qwen3-4B"),
    ):
        if key in result:
            out += [f"### {title}", "", time_table(result[key]), ""]
    if "cpu_memory" in result:
        out += ["### Peak memory, this CPU, SmolLM2-135M, 32 responses", "", memory_table(result["cpu_memory"]), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-rates", help="a sparserl bench step-cost --json output measured here (for --part cpu)")
    parser.add_argument(
        "--part",
        action="append",
        choices=["cpu", "memory", "gpu", "tables"],
        help="default: cpu, memory and gpu; tables alone prints the tables of --out",
    )
    parser.add_argument("--out", type=Path, required=True, help="updated in place: parts not run are kept")
    args = parser.parse_args()
    parts = args.part or ["cpu", "memory", "gpu"]
    if parts == ["tables"]:
        print(tables(json.loads(args.out.read_text())))
        return
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if "cpu" in parts:
        if not args.cpu_rates:
            parser.error("--part cpu needs --cpu-rates")
        result.update(cpu_rates=args.cpu_rates, cpu_time=cpu_time(args.cpu_rates))
    if "memory" in parts:
        result["cpu_memory"] = cpu_memory()
    if "gpu" in parts:
        result.update({"qwen3-1.7b": gpu_time("qwen3-1.7b"), "qwen3-4b": gpu_time("qwen3-4b")})
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(tables(result))


if __name__ == "__main__":
    main()
