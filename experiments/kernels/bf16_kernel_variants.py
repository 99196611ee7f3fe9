"""Build-time variants of ``linear_bf16.c``'s kernels, timed against the shipped build in one process:
rows per tile (``-DRB``, AVX512-BF16: 8 or 4) and software prefetch ahead of the first row block
(``-DPREFETCH_K2``, panel rows ahead; 0 = none; the shipped build: 64); where the CPU runs AMX tiles,
also the AMX path (its own layout) with its B tiles prefetched 0 (shipped), 1, 2 or 4 k-blocks ahead
(``-DAMX_PREFETCH``). The timed unit is a decode step's weight
products at 16 rows on SmolLM2-135M's shapes, 30 layers of distinct weights one after the other (the
weights stream from memory as in the step), best of 3 passes; rounds rotate the order, and a ratio is the
median of the per-round ratios (shipped time / variant time: > 1, the variant is faster).

    python3 experiments/kernels/bf16_kernel_variants.py --json docs/results/bf16_linear/variants.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import best_seconds, time_rounds
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name

ROWS, LAYERS, PASSES = 16, 30, 3
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # N, K
VARIANTS = {
    "shipped": "",
    "RB=4": "-DRB=4",
    "prefetch 0": "-DPREFETCH_K2=0",
    "prefetch 16": "-DPREFETCH_K2=16",
    "prefetch 32": "-DPREFETCH_K2=32",
    "prefetch 64": "-DPREFETCH_K2=64",
    "prefetch 128": "-DPREFETCH_K2=128",
    "prefetch 256": "-DPREFETCH_K2=256",
}
if "amx" in native.bf16_kernels():
    VARIANTS.update(
        {
            "amx": "",
            "amx prefetch 0": "-DAMX_PREFETCH=0",
            "amx prefetch 1": "-DAMX_PREFETCH=1",
            "amx prefetch 2": "-DAMX_PREFETCH=2",
            "amx prefetch 4": "-DAMX_PREFETCH=4",
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default=None, help="comma-separated variant names (default: all; 'shipped' always runs)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    chosen = {"shipped", *args.only.split(",")} if args.only else set(VARIANTS)
    unknown = chosen - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--only: unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    libs = {
        name: native.load(native.build(flags=native.flags_for(f"-march=native {extra}".strip())))
        for name, extra in VARIANTS.items()
        if name in chosen
    }
    gen = torch.Generator().manual_seed(0)
    x = {name: torch.randn(ROWS, K, generator=gen) for name, (N, K) in SHAPES.items()}
    weights = {
        name: [torch.randn(N, K, generator=gen) * 0.05 for _ in range(LAYERS)] for name, (N, K) in SHAPES.items()
    }
    packed = {
        v: {
            s: [native.pack_linear_bf16(w, "amx" if v.startswith("amx") else "panels", lib=lib) for w in ws]
            for s, ws in weights.items()
        }
        for v, lib in libs.items()
    }
    ref = {s: native.linear_bf16(x[s], packed["shipped"][s][0], lib=libs["shipped"]) for s in SHAPES}
    for v, lib in libs.items():  # each variant computes the same product (AVX512: the same sums in the same order)
        for s in SHAPES:
            y = native.linear_bf16(x[s], packed[v][s][0], lib=lib)
            assert (
                torch.equal(y, ref[s])
                if not v.startswith("amx")
                else bool(((y - ref[s]).abs() <= 1e-4 * ref[s].abs().max()).all())
            ), (v, s)

    def step(v):
        lib = libs[v]
        for s in SHAPES:
            for p in packed[v][s]:
                native.linear_bf16(x[s], p, lib=lib)

    def best(v):
        step(v)  # warm-up
        return best_seconds(lambda: step(v), passes=PASSES)

    names = list(libs)
    res = time_rounds(
        {v: (lambda v=v: best(v)) for v in names},
        args.rounds,
        on_run=lambda r, v, sec, t: print(f"round {r + 1}: {v} {1e3 * t:.2f} ms", flush=True),
    )
    rounds = [{v: res.results[v][r] for v in names} for r in range(args.rounds)]
    weight_bytes = sum(N * K * 2 for N, K in SHAPES.values()) * LAYERS
    macs = sum(ROWS * N * K for N, K in SHAPES.values()) * LAYERS
    summary = {}
    for v in names:
        med = res.median(v, float)
        per = res.ratios("shipped", v, float)
        summary[v] = {
            "ms_median": 1e3 * med,
            "GB_per_s": weight_bytes / med / 1e9,
            "GMAC_per_s": macs / med / 1e9,
            "shipped_over_variant": {"median": statistics.median(per), "rounds": per},
        }
        print(
            f"{v:>14}: {1e3 * med:6.2f} ms  {weight_bytes / med / 1e9:5.1f} GB/s  {macs / med / 1e9:6.1f} GMAC/s  "
            f"x{statistics.median(per):.3f} (rounds {', '.join(f'{p:.3f}' for p in per)})"
        )
    result = {
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "bf16_kernels": native.bf16_kernels(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "command": f"python3 experiments/kernels/bf16_kernel_variants.py --rounds {args.rounds}"
        + (f" --only {args.only}" if args.only else "")
        + f" --json {args.json}",
        "variants": {n: VARIANTS[n] for n in names},
        "rows": ROWS,
        "layers": LAYERS,
        "shapes": SHAPES,
        "weight_bytes_per_step": weight_bytes,
        "macs_per_step": macs,
        "rounds_seconds": rounds,
        "summary": summary,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
