"""The bfloat16 weight products (linear_bf16.c) against the float32 ones (linear.c) and torch's
bfloat16 matmul, at a decode step's 16 rows on SmolLM2-135M's product shapes.
Every shape is timed over 30 layers of distinct weights called one after the other
(the model's 30 layers: the weights stream from memory as in a decode step), best of 3 passes; in
each of 5 rounds (``--rounds``) every arm runs in the same process (arms in a rotated order:
:func:`sparserl.bench.measure.time_rounds`), and a ratio is the median of the per-round ratios.
Writes docs/results/bf16_linear/products.json.

Arms: ``float32`` native.linear on its panels; ``bf16`` native.linear_bf16 on pack_linear_bf16's
layout (x float32 in, rounded to bf16 in the kernel, float32 out); ``torch_bf16``
``F.linear(x.bfloat16(), w_bf16)`` (oneDNN; bf16 out), the conversion of x included;
``torch_float32`` ``F.linear(x, w)`` for reference. Where the CPU runs two bf16 kernels (an AMX Xeon),
``bf16`` is one arm per kernel, ``bf16_amx`` and ``bf16_avx512_bf16`` (each on its own layout), and
the ratios name them. ``--out F`` writes elsewhere (``--no-write``: nowhere).

    flock /work/exp/cpu.lock python3 experiments/kernels/bf16_linear_bench.py
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from sparserl.bench.measure import best_seconds, time_rounds
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name

ROWS, LAYERS, PASSES = 16, 30, 3
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # N, K
KERNELS = native.bf16_kernels()
BF16_ARMS = ("bf16",) if len(KERNELS) < 2 else tuple(f"bf16_{k}" for k in KERNELS)
ARMS = ("float32", *BF16_ARMS, "torch_bf16", "torch_float32")
OUT = Path(__file__).resolve().parents[2] / "docs" / "results" / "bf16_linear" / "products.json"


def arms_for(N: int, K: int, gen: torch.Generator) -> tuple[dict, torch.Tensor]:
    ws = [torch.randn(N, K, generator=gen) * 0.05 for _ in range(LAYERS)]
    x = torch.randn(ROWS, K, generator=gen)
    f32 = [native.pack_linear(w) for w in ws]
    layouts = {"bf16": None} if len(KERNELS) < 2 else {f"bf16_{k}": native.BF16_KERNEL_LAYOUT[k] for k in KERNELS}
    b16 = {arm: [native.pack_linear_bf16(w, layout) for w in ws] for arm, layout in layouts.items()}
    tb16 = [w.bfloat16() for w in ws]
    # the check that each arm computes the product (first layer)
    ref = x.bfloat16().double() @ ws[0].bfloat16().double().T
    for packed in b16.values():
        err = (native.linear_bf16(x, packed[0]).double() - ref).abs().max().item() / ref.abs().max().item()
        assert err < 1e-5, err
    fns = {
        "float32": lambda: [native.linear(x, p) for p in f32],
        **{arm: (lambda ps=ps: [native.linear_bf16(x, p) for p in ps]) for arm, ps in b16.items()},
        "torch_bf16": lambda: [F.linear(x.bfloat16(), w) for w in tb16],
        "torch_float32": lambda: [F.linear(x, w) for w in ws],
    }
    return fns, x


def best_time(fn) -> float:
    fn()  # warm-up
    return best_seconds(fn, passes=PASSES)


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    machine = {
        "cpu": cpu_name(),
        "isa": native.isa(),
        "bf16_kernels": KERNELS,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps({"machine": machine}), flush=True)
    setups = {name: arms_for(N, K, gen)[0] for name, (N, K) in SHAPES.items()}
    arms = {
        f"{name}/{arm}": (lambda fn=fns[arm]: 1e6 * best_time(fn) / LAYERS)  # µs per product
        for name, fns in setups.items()
        for arm in ARMS
    }
    res = time_rounds(arms, ROUNDS)
    rounds = []
    for r in range(ROUNDS):
        row = {name: {arm: res.results[f"{name}/{arm}"][r] for arm in ARMS} for name in setups}
        row["step"] = {arm: sum(row[s][arm] for s in SHAPES) for arm in ARMS}  # the 4 products of a layer
        rounds.append(row)
        print(
            json.dumps(
                {"round": r, "us_per_product": {k: {a: round(v, 1) for a, v in d.items()} for k, d in row.items()}}
            ),
            flush=True,
        )
    ratios = {}
    for key in [*SHAPES, "step"]:
        per = {"torch_bf16_over_float32": [rd[key]["float32"] / rd[key]["torch_bf16"] for rd in rounds]}
        for arm in BF16_ARMS:
            per[f"{arm}_over_float32"] = [rd[key]["float32"] / rd[key][arm] for rd in rounds]
            per[f"{arm}_over_torch_bf16"] = [rd[key]["torch_bf16"] / rd[key][arm] for rd in rounds]
        if len(BF16_ARMS) == 2:
            per[f"{BF16_ARMS[0]}_over_{BF16_ARMS[1]}"] = [
                rd[key][BF16_ARMS[1]] / rd[key][BF16_ARMS[0]] for rd in rounds
            ]
        ratios[key] = {
            k: {"per_round": [round(v, 3) for v in vs], "median": round(statistics.median(vs), 3)}
            for k, vs in per.items()
        }
    gmacs = {
        key: {arm: round(ROWS * N * K / (statistics.median(rd[key][arm] for rd in rounds) * 1e3), 1) for arm in ARMS}
        for key, (N, K) in SHAPES.items()
    }
    result = {
        "what": "bf16 weight products at 16 rows, SmolLM2-135M shapes, 30 layers streamed",
        "command": "flock /work/exp/cpu.lock python3 experiments/kernels/bf16_linear_bench.py",
        "machine": machine,
        "rows": ROWS,
        "layers": LAYERS,
        "rounds": ROUNDS,
        "passes": PASSES,
        "shapes": {k: list(v) for k, v in SHAPES.items()},
        "note": "ratio = median of per-round ratios (time of the denominator's arm / time of the numerator's "
        "arm: >1 means the first named is faster); us_per_product = best of passes, per layer",
        "us_per_product_rounds": [{k: {a: round(v, 2) for a, v in d.items()} for k, d in rd.items()} for rd in rounds],
        "gmac_per_s_median": gmacs,
        "ratios": ratios,
    }
    print(
        json.dumps(
            {
                "ratios": {k: {n: v["median"] for n, v in d.items()} for k, d in ratios.items()},
                "gmac_per_s_median": gmacs,
            },
            indent=1,
        )
    )
    if "--no-write" not in sys.argv:
        out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else OUT
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
