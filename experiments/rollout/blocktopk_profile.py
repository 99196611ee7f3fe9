"""Where block top-k's decode step spends its time (docs/results/blocktopk.md), three measurements:

1. ``step``: SmolLM2-135M float32, batch 16, the fused native step, after a prompt of ``--tokens`` tokens
   (the length at the end of the bench's 2,048-token rows): the median step and, per step, the time in
   the dense attention kernel (decode_attention.c: every layer of dense, layers 0-1 of block top-k) and
   in block top-k's kernel (blocktopk.c: layers 2-29), timed around their ctypes calls;
2. ``kernel``: one layer's attention with cold caches (30 layers of separate K/V buffers of SmolLM2's
   heads, a new query per call, cycled as a decode step does): dense, and block top-k reading k pages;
3. ``lengths``: a whole 2,048-token generation at batch 16 from a short prompt (what the bench times),
   dense, block top-k 256 and R-KV 256 one after the other: the wall time, and the median decode step
   per 256 steps (how the step grows with the cache, and from which length block top-k reads less);
4. ``scattered``: this machine's read rate for random 4 KB chunks (``index_select``, what a chosen page of
   16 float32 keys of 64 is) against a streaming read, both through torch over 30 cold buffers.

    python3 experiments/rollout/blocktopk_profile.py --tokens 2040

``--only kernel`` runs the second alone (``--only step,kernel,lengths,scattered``: all four);
``--against OLD.c`` builds the library a second time with another
``blocktopk.c`` (e.g. ``git show 2936d6b:src/sparserl/rollout/native/blocktopk.c > /tmp/old.c``) and runs
the kernel measurement on both in turn, ``--rounds`` rotating rounds in one process
(:func:`sparserl.bench.measure.time_rounds`): per-round ratios, and whether
both give the same pages and the same bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from sparserl.bench.measure import best_seconds, time_rounds
from sparserl.models.loading import load_model
from sparserl.rollout import native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.sampling import SamplingParams

B, HQ, HKV, D, LAYERS = 16, 9, 3, 64, 30  # SmolLM2-135M's attention, the bench's batch


def step_profile(tokens: int, steps: int = 24) -> dict:
    lm = load_model("smollm2-135m", dtype="float32")
    dense_engine = RolloutEngine(lm, build_compressor("none"), dtype="float32")
    text = "The quick brown fox jumps over the lazy dog. " * (tokens // 8)
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    lib = native.library()
    spent = {"dense_kernel_ms": 0.0, "blocktopk_kernel_ms": 0.0}

    class Timed:  # around a ctypes function: the time inside the kernel call
        def __init__(self, fn, key):
            self.fn, self.key = fn, key

        def __call__(self, *args):
            t = time.perf_counter()
            rc = self.fn(*args)
            spent[self.key] += (time.perf_counter() - t) * 1e3
            return rc

    real = lib.sparserl_decode_attention, lib.sparserl_blocktopk_attention
    lib.sparserl_decode_attention = Timed(real[0], "dense_kernel_ms")
    lib.sparserl_blocktopk_attention = Timed(real[1], "blocktopk_kernel_ms")
    out = {}
    try:
        for name in ("none", "blocktopk"):
            engine = RolloutEngine.from_engine(dense_engine, build_compressor(name, kv_budget=256))
            times = []

            def hook(event, t=None, **kw):
                if event == "sample" and t == 4:  # the first steps warm up
                    times.clear()
                    for key in spent:
                        spent[key] = 0.0
                elif event == "before_decode":
                    hook.t0 = time.perf_counter()
                elif event == "after_decode":
                    times.append((time.perf_counter() - hook.t0) * 1e3)

            engine.step_hook = hook
            engine.generate([], SamplingParams(n=B, max_new_tokens=steps, ignore_eos=True, seed=0), prompt_ids=[ids])
            step = statistics.median(times)
            per_step = {key: v / len(times) for key, v in spent.items()}
            out[name] = {
                "cached_tokens": len(ids) + steps,
                "step_ms": step,
                **per_step,
                "rest_ms": step - sum(per_step.values()),
            }
    finally:
        lib.sparserl_decode_attention, lib.sparserl_blocktopk_attention = real
    return out


def length_profile(new_tokens: int = 2048, budget: int = 256) -> dict:
    lm = load_model("smollm2-135m", dtype="float32")
    dense_engine = RolloutEngine(lm, build_compressor("none"), dtype="float32")
    text = "Explain in detail how the quick brown fox jumps over the lazy dog, step by step, please."
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    out = {"prompt_tokens": len(ids), "new_tokens": new_tokens}
    for name in ("none", "blocktopk", "rkv"):
        engine = RolloutEngine.from_engine(dense_engine, build_compressor(name, kv_budget=budget))
        steps, mark = [], {}

        def hook(event, **kw):
            if event == "before_decode":
                mark["t"] = time.perf_counter()
            elif event == "after_decode":
                steps.append((time.perf_counter() - mark["t"]) * 1e3)

        engine.step_hook = hook
        t0 = time.perf_counter()
        engine.generate([], SamplingParams(n=B, max_new_tokens=new_tokens, ignore_eos=True, seed=0), prompt_ids=[ids])
        wall = time.perf_counter() - t0
        out[name] = {
            "wall_s": wall,
            "tokens_per_s": B * new_tokens / wall,
            "decode_s": sum(steps) / 1e3,
            "median_step_ms_per_256": [statistics.median(steps[i : i + 256]) for i in range(0, len(steps), 256)],
        }
    for name in ("blocktopk", "rkv"):
        out[name]["speedup_vs_dense"] = out["none"]["wall_s"] / out[name]["wall_s"]
    return out


def _best_per_layer(fn, reps: int = 5) -> float:
    """µs per layer: the best of ``reps`` passes over the 30 layers."""
    return best_seconds(lambda: [fn(layer) for layer in range(LAYERS)], passes=reps) / LAYERS * 1e6


def kernel_profile(tokens: int, pages=(3, 8, 16, 32), against: str | None = None, rounds: int = 1) -> dict:
    """Microseconds per layer, cold (the best of 5 passes over the 30 layers, per round; the median
    of the rounds): dense, and block top-k reading k pages, with this build and, given ``against``,
    with the library built with that blocktopk.c, both in each round."""
    gen = torch.Generator().manual_seed(0)
    cap = tokens + 8
    K = torch.randn(LAYERS, B, HKV, cap, D, generator=gen)
    V = torch.randn(LAYERS, B, HKV, cap, D, generator=gen)
    start, lens = torch.zeros(B, dtype=torch.int64), torch.full((B,), tokens, dtype=torch.int64)
    full = tokens // 16
    sums = torch.zeros(LAYERS, B, HKV, -(-cap // 16), D)
    sums[:, :, :, :full] = K[:, :, :, : full * 16].reshape(LAYERS, B, HKV, full, 16, D).sum(4)
    queries = [torch.randn(B, HQ, 1, D, generator=gen) for _ in range(LAYERS)]
    bias = torch.zeros(B, 1, 1, tokens)
    libs = {"": native.library()}
    if against:
        libs["against_"] = native.load(_build_with(against))

    def run(lib, k, l, chosen):
        k_pages = torch.full((B,), k, dtype=torch.int32)
        return native.blocktopk_attention(
            queries[l], K[l], V[l], sums[l], start, lens, k_pages, 16, 1, 2, update=False, chosen=chosen, lib=lib
        )

    out: dict = {}
    if against:  # the same pages and the same bits?
        for k in pages:
            got = []
            for lib in libs.values():
                chosen = torch.empty(B, HKV, k, dtype=torch.int32)
                got.append((run(lib, k, 3, chosen), chosen))
            out[f"same_pages_and_bits_{k}"] = bool(
                torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
            )

    def blocktopk(lib, k):
        chosen = torch.empty(B, HKV, k, dtype=torch.int32)
        return lambda: _best_per_layer(lambda l: run(lib, k, l, chosen))

    arms = {"dense_us": lambda: _best_per_layer(lambda l: native.decode_attention(queries[l], K[l], V[l], bias))}
    arms.update({f"{name}blocktopk_{k}_pages_us": blocktopk(lib, k) for k in pages for name, lib in libs.items()})
    res = time_rounds(arms, rounds)  # each arm returns its own best per-layer µs
    times = {key: res.values(key, float) for key in arms}
    for key, ts in times.items():
        out[key] = statistics.median(ts)
        if rounds > 1:
            out[key.replace("_us", "_us_rounds")] = ts
    if against:
        for k in pages:
            ratios = res.ratios(f"against_blocktopk_{k}_pages_us", f"blocktopk_{k}_pages_us", float)
            out[f"speedup_{k}_pages_vs_against"] = statistics.median(ratios)
            out[f"speedup_{k}_pages_vs_against_rounds"] = ratios
    lo, hi = min(pages), max(pages)  # the cost of a page read: the slope; the scores and the rest: the intercept
    slope = (out[f"blocktopk_{hi}_pages_us"] - out[f"blocktopk_{lo}_pages_us"]) / (hi - lo)
    out["us_per_page"] = slope
    out["us_fixed"] = out[f"blocktopk_{lo}_pages_us"] - slope * lo
    out["page_sums_bytes_per_layer"] = sums[0].numel() * 4
    for k in pages:  # K and V rows of the chosen pages and the sums of the pages, per second
        read = B * HKV * k * 16 * D * 4 * 2 + B * HKV * -(-tokens // 16) * D * 4
        out[f"blocktopk_{k}_pages_gb_per_s"] = read / out[f"blocktopk_{k}_pages_us"] / 1e3
    out["dense_gb_per_s"] = B * HKV * tokens * D * 4 * 2 / out["dense_us"] / 1e3
    return out


def _build_with(source: str) -> Path:
    """The native library built with ``source`` in place of blocktopk.c (same compiler and flags)."""
    sources = [str(Path(source).resolve()) if s.name == "blocktopk.c" else str(s) for s in native.SOURCES]
    out = Path(tempfile.mkdtemp()) / "against.so"
    flags = native.default_flags() + ["-I", str(native.SOURCES[0].parent)]
    res = subprocess.run(
        [native._compiler() or "cc", *flags, *sources, "-o", str(out), "-lm"], capture_output=True, text=True
    )
    if res.returncode:
        raise SystemExit(res.stderr)
    return out


def scattered_read_rate(chunks: int = 1536) -> dict:
    buffers = [torch.randn(B * HKV * 2100 // 16, 16 * D) for _ in range(LAYERS)]  # 4 KB rows, ~26 MB each
    gen = torch.Generator().manual_seed(0)
    index = [torch.randint(0, buffers[0].shape[0], (chunks,), generator=gen) for _ in range(LAYERS)]
    scattered = _best_per_layer(lambda l: buffers[l].index_select(0, index[l]))
    stream = _best_per_layer(lambda l: buffers[l].sum())
    return {
        "random_4kb_chunks_gb_per_s": chunks * 4096 / scattered / 1e3,
        "streaming_gb_per_s": buffers[0].numel() * 4 / stream / 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2040, help="prompt tokens (the cache's length)")
    ap.add_argument(
        "--only",
        default="step,kernel,scattered",
        help="which measurements, comma-separated (step, kernel, lengths, scattered)",
    )
    ap.add_argument("--against", help="another blocktopk.c: the kernel measurement on both builds, in turn")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the kernel measurement")
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    only = set(args.only.split(","))
    report = {}
    if "step" in only:
        report["step"] = step_profile(args.tokens)
    if "kernel" in only:
        report["kernel"] = kernel_profile(args.tokens + 24, against=args.against, rounds=args.rounds)
    if "lengths" in only:
        report["lengths"] = length_profile()
    if "scattered" in only:
        report["scattered"] = scattered_read_rate()
    report["isa"] = native.isa()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
