"""The weight products' rates at a decode step's 16 rows, per shape: float32 (linear.c), ``int8``
and ``int8_group`` (linear_int8.c), in GMAC/s (10⁹ multiply-adds a second), best of 5 in one
process; weights hot (one layer, called repeatedly) and streamed (30 layers of distinct weights,
as in a decode step); and each kernel's fixed cost per call (N = 16 outputs: the activation
quantization, Python and ctypes). Results: docs/results/bench_quant.md.

    python3 experiments/kernels/int8_kernel_rates.py
"""

import torch

from sparserl.bench.measure import best_rate
from sparserl.rollout import native
from sparserl.rollout.quant import build_quant

ROWS = 16
SHAPES = [(3072, 576), (576, 1536), (960, 576)]  # gate/up, down, q/k/v of SmolLM2-135M


def kernels(ws):
    """name → list of per-layer callables on x."""
    q8, qg = build_quant("int8"), build_quant("int8_group")
    lin8, ling, panels = [q8.quantize(w) for w in ws], [qg.quantize(w) for w in ws], [native.pack_linear(w) for w in ws]
    return {
        "float32": [lambda x, p=p: native.linear(x, p) for p in panels],
        "int8": [lambda x, l=l: l.matmul(x) for l in lin8],
        "int8_group": [lambda x, l=l: l.matmul(x) for l in ling],
    }


def main() -> None:
    torch.manual_seed(0)
    print("fixed cost per call (N = 16), µs:")
    for K in (576, 1536):
        ks = kernels([torch.randn(16, K) * 0.05])
        x = torch.randn(ROWS, K)
        row = {
            name: 1e6 * ROWS * 16 * K / (best_rate(lambda f=fs[0]: f(x), ROWS * 16 * K, 400) * 1e9)
            for name, fs in ks.items()
        }
        print(f"  K={K}: " + "  ".join(f"{n} {v:.1f}" for n, v in row.items()), flush=True)
    print("GMAC/s at 16 rows:")
    for N, K in SHAPES:
        for layers in (1, 30):
            ks = kernels([torch.randn(N, K) * 0.05 for _ in range(layers)])
            x = torch.randn(ROWS, K)
            reps = 60 if layers == 1 else 2
            row = {
                name: best_rate(lambda fs=fs: [f(x) for f in fs], ROWS * N * K * layers, reps)
                for name, fs in ks.items()
            }
            label = "hot" if layers == 1 else "30 layers streamed"
            print(f"  {N} x {K} {label}: " + "  ".join(f"{n} {v:.1f}" for n, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
