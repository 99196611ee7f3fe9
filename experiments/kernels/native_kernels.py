"""The decode step's weight products and small operators: sparserl's C kernels against torch's, in
one process. Results: docs/results/native_linear.md.

Products: SmolLM2-135M's four per-layer shapes (q/k/v 960x576, o 576x576, gate/up 3072x576,
down 576x1536) over 30 layers of distinct random weights (so they stream from memory as in a
decode step), ``rows`` activation rows, the best of 5 rotating rounds:
- float32: the C kernel's panels (linear.c) vs oneDNN's packed weights (torch's mkldnn linear);
- int8 (the sampler's ``int8``, per-token activations): the C kernel (linear_int8.c) vs fbgemm;
- int8_group (8-bit weights, activation scales per token and group of 64): its C kernel.
Small operators: RMSNorm, SiLU·up, RoPE of a batch-16 decode step, C vs torch, µs per call.

    python3 experiments/kernels/native_kernels.py               # rows 1, 4, 16, 32, 64
    python3 experiments/kernels/native_kernels.py 16 64
"""

import sys

import torch
import torch.nn.functional as F

from sparserl.bench.measure import time_rounds
from sparserl.rollout import native
from sparserl.rollout.model import apply_rope
from sparserl.rollout.quant import build_quant

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def best_of(fns: dict, rounds: int = 5) -> dict:
    """Each callable's fastest run over ``rounds`` rotating rounds (:func:`sparserl.bench.measure.time_rounds`)."""
    return {name: min(ts) for name, ts in time_rounds(fns, rounds).seconds.items()}


def products(rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(o, i, generator=gen) * 0.02 for o, i in SHAPES] for _ in range(LAYERS)]
    xs = {i: torch.randn(rows, i, generator=gen) for i in (576, 1536)}
    panels = [[native.pack_linear(w) for w in ws] for ws in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in ws] for ws in weights]
    int8 = build_quant("int8")
    int8_native = [[int8.quantize(w) for w in ws] for ws in weights]
    with native.torch_only():
        int8_fbgemm = [[int8.quantize(w) for w in ws] for ws in weights]
    int8_group = [[build_quant("int8_group").quantize(w) for w in ws] for ws in weights]

    def run_panels():
        for ps in panels:
            for p in ps:
                native.linear(xs[p.in_features], p)

    def run_onednn():
        for ps, ws in zip(onednn, weights):
            for p, w in zip(ps, ws):
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")

    def run_int8(layers):
        for ls in layers:
            for lin in ls:
                lin(xs[lin.in_features])

    def run_fbgemm():
        with native.torch_only():
            run_int8(int8_fbgemm)

    best = best_of(
        {
            "float32 C": run_panels,
            "float32 oneDNN": run_onednn,
            "int8 C": lambda: run_int8(int8_native),
            "int8 fbgemm": run_fbgemm,
            "int8_group C": lambda: run_int8(int8_group),
        }
    )
    flops = 2 * rows * sum(w.numel() for ws in weights for w in ws)
    cells = " | ".join(f"{best[k] * 1e3:.1f} ms ({flops / best[k] / 1e9:.0f} GF/s)" for k in best)
    print(
        f"| {rows} | {cells} | {best['float32 oneDNN'] / best['float32 C']:.2f}x | "
        f"{best['float32 C'] / best['int8 C']:.2f}x | {best['int8 fbgemm'] / best['int8 C']:.2f}x | "
        f"{best['float32 C'] / best['int8_group C']:.2f}x |",
        flush=True,
    )


def small_ops(batch: int = 16, calls: int = 2000) -> None:
    gen = torch.Generator().manual_seed(1)
    h, w = torch.randn(batch, 1, 576, generator=gen), torch.randn(576, generator=gen)
    gu = torch.randn(batch, 1, 3072, generator=gen)
    qkv = torch.randn(batch, 1, 15, 64, generator=gen)
    cos, sin = torch.randn(batch, 1, 64, generator=gen), torch.randn(batch, 1, 64, generator=gen)

    def torch_silu():
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    cases = {
        "RMSNorm [16, 576]": (lambda: native.rms_norm(h, w, 1e-5), lambda: F.rms_norm(h, (576,), w, 1e-5)),
        "SiLU(gate)·up [16, 3072]": (lambda: native.silu_mul(gu), torch_silu),
        "RoPE q+k [16, 12 heads, 64]": (
            lambda: native.rope_(qkv, 12, cos, sin),
            lambda: apply_rope(qkv[..., :12, :], cos.unsqueeze(-2), sin.unsqueeze(-2)),
        ),
    }
    for name, (c_fn, torch_fn) in cases.items():

        def loop(fn):
            return lambda: [fn() for _ in range(calls)]

        best = best_of({"C": loop(c_fn), "torch": loop(torch_fn)})
        print(f"| {name} | {best['C'] / calls * 1e6:.1f} | {best['torch'] / calls * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    assert native.library() is not None, "no native kernels (no C compiler, or SPARSERL_NATIVE=0)"
    with torch.inference_mode():
        print(
            "| rows | float32 C | float32 oneDNN | int8 C | int8 fbgemm | int8_group C | C vs oneDNN "
            "| int8 C vs float32 C | int8 C vs fbgemm | int8_group C vs float32 C |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for rows in [int(a) for a in sys.argv[1:]] or [1, 4, 16, 32, 64]:
            products(rows)
        print("\n| operator | C µs | torch µs |\n|---|---|---|")
        small_ops()
