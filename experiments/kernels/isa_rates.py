"""The weight products' kernels built several ways in one process: ``-march=native`` (on a CPU with
them: AVX512 panels for float32, ``linear.c``; vpdpbusd for the int8 kernels with VNNI,
``linear_int8.c``), plain AVX2, and, where the CPU has AVX-VNNI, AVX2 + AVX-VNNI without AVX512 (a
laptop's 256-bit VNNI), at a decode step's 16 rows on SmolLM2-135M's shapes, 30 layers of distinct
weights streamed as in a decode step. ``int8_group`` runs as the sampler runs it: weight scales per
group of 64, and the group column sums where the build has the unsigned-code tile
(``native.int8_group_u8``); on those builds its signed tile is timed too, and on the native build
groups of 32. GMAC/s (10⁹ multiply-adds
a second), best of 5.
Then R-KV's redundancy kernel (``kv_scores.c``) on a batch-16 compression's shapes (480 sequence ×
layer pairs, 3 KV heads, 288 and 384 slots, keys sharing a direction so that many pairs are kept),
ms, best of 3. Results: docs/results/bench_quant.md and compression_cost.md.

    python3 experiments/kernels/isa_rates.py
"""

from pathlib import Path

import torch

from sparserl.bench.measure import best_rate, best_seconds
from sparserl.rollout import native
from sparserl.rollout.quant.int8 import QMAX_FBGEMM, quantize_int8_per_channel
from sparserl.rollout.quant.int8_group import quantize_int8_weight_groups

ROWS, LAYERS = 16, 30
SHAPES = [(3072, 576), (576, 1536), (960, 576), (576, 576)]  # gate/up, down, q/k/v, o


def main() -> None:
    flags = Path("/proc/cpuinfo").read_text()
    print("CPU VNNI:", "avx_vnni" in flags or "avx512_vnni" in flags, " AVX512:", "avx512f" in flags)
    builds = {
        "native": native.library(),
        "avx2": native.load(native.build(flags=native.flags_for("-mavx2 -mfma -mf16c"))),
    }
    if "avx_vnni" in flags:
        builds["avx_vnni"] = native.load(native.build(flags=native.flags_for("-mavx2 -mfma -mf16c -mavxvnni")))
    torch.manual_seed(0)
    for N, K in SHAPES:
        ws = [torch.randn(N, K) * 0.05 for _ in range(LAYERS)]
        x = torch.randn(ROWS, K)
        macs = ROWS * N * K * LAYERS
        rates = {}
        for name, lib in builds.items():
            f32 = [native.pack_linear(w, lib=lib) for w in ws]
            rates[f"float32 {name}"] = best_rate(lambda: [native.linear(x, p, lib=lib) for p in f32], macs, 3)
        qs = [quantize_int8_per_channel(w, QMAX_FBGEMM) for w in ws]
        for name, lib in builds.items():
            packed = [(native.pack_int8(q, lib=lib), s) for q, s in qs]
            rates[f"int8 {name}"] = best_rate(
                lambda: [native.linear_int8(x, p, s, lib=lib) for p, s in packed], macs, 3
            )
        qgs = [quantize_int8_weight_groups(w, 64) for w in ws]
        ones = torch.ones(N)
        for name, lib in builds.items():
            packed = [
                (
                    native.pack_int8(q, lib=lib),
                    native.pack_group_scales(g, lib=lib),
                    native.pack_group_colsums(q, 64, lib=lib),
                )
                for q, g in qgs
            ]
            rates[f"int8_group {name}"] = best_rate(
                lambda: [
                    native.linear_int8(x, p, ones, group=64, group_scales=g, group_colsum=c, lib=lib)
                    for p, g, c in packed
                ],
                macs,
                3,
            )
            if name == "native":  # groups of 32 (the qurl_group preset's)
                packed32 = [
                    (
                        native.pack_int8(q, lib=lib),
                        native.pack_group_scales(g, lib=lib),
                        native.pack_group_colsums(q, 32, lib=lib),
                    )
                    for q, g in (quantize_int8_weight_groups(w, 32) for w in ws)
                ]
                rates["int8_group g32 native"] = best_rate(
                    lambda: [
                        native.linear_int8(x, p, ones, group=32, group_scales=g, group_colsum=c, lib=lib)
                        for p, g, c in packed32
                    ],
                    macs,
                    3,
                )
            if native.int8_group_u8(lib):  # the same build's signed tile, as before the unsigned one
                rates[f"int8_group {name} signed"] = best_rate(
                    lambda: [native.linear_int8(x, p, ones, group=64, group_scales=g, lib=lib) for p, g, _ in packed],
                    macs,
                    3,
                )
        print(f"{N} x {K}: " + "  ".join(f"{n} {v:.1f}" for n, v in rates.items()), flush=True)
    for L in (288, 384):
        keys = torch.randn(480, 3, L, 64) + 0.8 * torch.randn(1, 3, 1, 64)
        valid = torch.ones(480, L, dtype=torch.bool)
        ms = {}
        for name, lib in builds.items():
            ms[name] = 1e3 * best_seconds(lambda: native.rkv_redundancy(keys, valid, 0.5, lib=lib), passes=3)
        print(f"R-KV redundancy, {L} slots: " + "  ".join(f"{n} {v:.1f} ms" for n, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
