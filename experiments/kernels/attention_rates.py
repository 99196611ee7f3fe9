"""The fused decode attention (native/decode_attention.c) against memory: its effective read rate
over a decode step's caches, and the same against the kernel of another commit, in one process
(results: docs/results/native_attention.md).

For each cache length L: 30 layers of distinct [16, 3, 1100, 64] float32 K and V buffers (SmolLM2's
KV heads at batch 16, so that they come from memory as in a decode step), one query token of 9
heads, best of 9 rotating rounds (:func:`sparserl.bench.measure.time_rounds`);
the rate counts the K and V bytes of the L slots read. The ceiling beside
it is torch summing the same slices (a pure read, both threads). With ``--against COMMIT`` the
native sources of that commit are compiled with the same flags and timed alternately, their
outputs compared bit for bit; with ``--generate N`` the two libraries also run whole ``generate``
calls (batch 16, N new tokens, float32 dense, alternating, 2 rounds), as the bench runs them.

    python3 experiments/kernels/attention_rates.py --against 7409614 --generate 1024
"""

import argparse
import subprocess
import tempfile
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.rollout import native

B, HQ, HKV, D, LAYERS, CAP = 16, 9, 3, 64, 30, 1100


def library_of(commit: str):
    """The native library built from ``commit``'s sources (this checkout's git), same flags."""
    tmp = Path(tempfile.mkdtemp(prefix="sparserl_native_"))
    for src in native.SOURCES + native.HEADERS:
        text = subprocess.run(
            ["git", "show", f"{commit}:src/sparserl/rollout/native/{src.name}"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout
        (tmp / src.name).write_text(text)
    out = tmp / "lib.so"
    cc = native._compiler()
    subprocess.run([cc, *native.FLAGS, *(str(tmp / s.name) for s in native.SOURCES), "-o", str(out), "-lm"], check=True)
    return native.load(out)


def kernel_rates(libs: dict, lengths: list[int]) -> None:
    gen = torch.Generator().manual_seed(0)
    Ks = [torch.randn(B, HKV, CAP, D, generator=gen) for _ in range(LAYERS)]
    Vs = [torch.randn(B, HKV, CAP, D, generator=gen) for _ in range(LAYERS)]
    q = torch.randn(B, HQ, 1, D, generator=gen)
    for L in lengths:
        bias = torch.zeros(B, 1, 1, L)

        def attend(lib):
            return lambda: [native.decode_attention(q, K, V, bias, lib=lib) for K, V in zip(Ks, Vs)]

        def read():
            for K, V in zip(Ks, Vs):
                K[:, :, :L].sum()
                V[:, :, :L].sum()

        res = time_rounds({**{name: attend(lib) for name, lib in libs.items()}, "torch sum": read}, 9)
        best = {name: min(ts) for name, ts in res.seconds.items()}
        gb = LAYERS * 2 * B * HKV * L * D * 4 / 1e9
        row = ", ".join(f"{name} {1e3 * s:.1f} ms ({gb / s:.1f} GB/s)" for name, s in best.items())
        print(f"L {L}: {row}")
        if "against" in libs:
            print(f"  this commit / against: {best['against'] / best['this commit']:.2f}x faster")
            same = all(
                torch.equal(a, b)
                for a, b in zip(
                    native.decode_attention(q, Ks[0], Vs[0], bias, lib=libs["this commit"]),
                    native.decode_attention(q, Ks[0], Vs[0], bias, lib=libs["against"]),
                )
            )
            print(f"  same bits: {same}")


def generate_ab(libs: dict, max_new_tokens: int) -> None:
    from sparserl.models.loading import load_model
    from sparserl.rollout.profile import profile

    model = load_model("smollm2-135m", dtype="float32")

    def arm(lib):
        def run():
            native._LIB[:] = [lib]  # the packed weights' layout is the same in both libraries
            return profile(batch=B, max_new_tokens=max_new_tokens, loaded=model)

        return run

    res = time_rounds(
        {name: arm(lib) for name, lib in libs.items()},
        2,
        on_run=lambda r, name, s, out: print(
            f"generate {max_new_tokens}: {name} {out['ms_per_step']:.2f} ms/step, {out['tokens_per_s']:.1f} tok/s",
            flush=True,
        ),
    )
    ms = {name: res.values(name, lambda out: out["ms_per_step"]) for name in libs}
    if "against" in ms:
        print(f"  decode step, best of 2: against / this commit = {min(ms['against']) / min(ms['this commit']):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", help="a commit whose native kernels to time beside this checkout's")
    ap.add_argument("--lengths", default="300,560,1050")
    ap.add_argument("--generate", type=int, default=0, help="also time whole generations of this many tokens")
    a = ap.parse_args()
    libs = {"this commit": native.library()}
    if a.against:
        libs["against"] = library_of(a.against)
    kernel_rates(libs, [int(x) for x in a.lengths.split(",")])
    if a.generate:
        generate_ab(libs, a.generate)


if __name__ == "__main__":
    main()
