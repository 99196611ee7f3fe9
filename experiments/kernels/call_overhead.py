"""What one call from Python costs on this machine, before any arithmetic: a native product through
its wrapper and bare through ctypes, the RMSNorm wrapper against torch's, and single torch
operations (best of 5 x 3,000 calls, µs). Why the decode step became three native calls a layer
(sparserl.rollout.fused). Results: docs/results/engine_profile.md.

    python3 experiments/kernels/call_overhead.py
"""

import torch

from sparserl.bench.measure import best_seconds
from sparserl.rollout import native


def per_call_us(fn, n: int = 3000) -> float:
    return best_seconds(fn, passes=5, calls=n) * 1e6


def main() -> None:
    lib = native.library()
    x, w = torch.randn(16, 576), torch.randn(16, 576)
    panels, out = native.pack_linear(w), torch.empty(16, 16)
    xp, pp, op = x.data_ptr(), panels.data_ptr(), out.data_ptr()
    rows = {
        "native.linear 16x576x16 (wrapper)": lambda: native.linear(x, panels),
        "sparserl_linear 16x576x16 (bare ctypes)": lambda: lib.sparserl_linear(
            16, 16, 576, xp, 576, pp, None, op, 16, 0
        ),
        "native.rms_norm 16x576 (wrapper)": lambda: native.rms_norm(x, w[0], 1e-5),
        "F.rms_norm 16x576": lambda: torch.nn.functional.rms_norm(x, (576,), w[0], 1e-5),
        "x.view(-1, 576)": lambda: x.view(-1, 576),
        "torch.empty(16, 16)": lambda: torch.empty(16, 16),
        "x.device.type": lambda: x.device.type,
    }
    for name, fn in rows.items():
        print(f"{name:45s} {per_call_us(fn):7.2f} µs", flush=True)


if __name__ == "__main__":
    main()
