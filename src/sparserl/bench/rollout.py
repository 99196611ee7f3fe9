"""``sparserl bench rollout``: transformers' ``generate`` (dense, the baseline), sparserl dense and
sparserl with each compressor, side by side in one process, all generating exactly L tokens per
sequence. Ratios are against the ``generate`` run of the same process.

Fields per result: tokens_per_s, ratio_vs_hf_generate, kv_bytes_peak (allocated for K/V),
kv_bytes_theory (what the kept tokens need), rss_peak_bytes (process RSS sampled during the run),
roofline_fraction (speed over the bound set by the measured memory bandwidth and the bytes one
decode step must read: weights + the average kept KV).
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time
from pathlib import Path

import torch

from ..models.loading import load_model, parse_dtype
from ..rollout.engine import RolloutEngine
from ..rollout.kv import CompressorOptionError, KVCompressor, build_compressor
from ..rollout.sampling import SamplingParams

BENCH_PROMPT = [{"role": "user", "content": "Write a long, detailed story about a dragon who learns mathematics."}]


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Peak resident memory while a block runs (sampled every 5 ms in a thread)."""

    def __enter__(self):
        self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


def memory_bandwidth(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Measured read bandwidth in bytes/s: the best of several full reads of a large buffer."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def machine_info(bandwidth: float) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "memory_bandwidth_bytes_per_s": bandwidth,
        "cuda": torch.cuda.is_available(),
    }


def _roofline(tokens_per_s: float, batch: int, weight_bytes: int, kv_read_avg: float, bw: float) -> float:
    bound = batch * bw / (weight_bytes + kv_read_avg)
    return tokens_per_s / bound


def _hf_generate(lm, prompt_ids: list[int], batch: int, L: int, seed: int) -> dict:
    model = lm.model
    ids = torch.tensor([prompt_ids] * batch)
    torch.manual_seed(seed)
    with RssSampler() as rss, torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=L, min_new_tokens=L,
            return_dict_in_generate=True, pad_token_id=lm.tokenizer.pad_token_id,
        )
        seconds = time.perf_counter() - t
    gen = out.sequences.shape[1] - ids.shape[1]
    kv = 0
    pkv = out.past_key_values
    for layer in getattr(pkv, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None:
                kv += tensor.numel() * tensor.element_size()
    return {"seconds": seconds, "tokens": batch * gen, "kv_bytes_peak": kv, "rss_peak_bytes": rss.peak}


def bench_compressor(name: str, kv_budget: int, step_length: int) -> KVCompressor:
    """The compressor a benchmark row runs: the method's defaults at this budget, with the
    observation window cut to a quarter of the budget when the default does not fit (e.g.
    SnapKV's 32-query window at a small budget). ``none`` is the dense cache."""
    small_window = dict(kv_budget=kv_budget, step_length=step_length, window=max(1, kv_budget // 4))
    try:
        comp = build_compressor(name, kv_budget=kv_budget, step_length=step_length)
    except CompressorOptionError:
        return build_compressor(name, **small_window)
    if comp.compresses and comp.window >= kv_budget // 2 and name != "h2o":
        return build_compressor(name, **small_window)
    return comp


def run_bench(model: str = "smollm2-135m", batch: int = 16, max_new_tokens: int = 256, kv_budget: int = 256,
              compressors: list[str] | None = None, dtype: str = "auto", step_length: int = 128,
              seed: int = 0, hf_baseline: bool = True, log=print) -> dict:
    compressors = compressors if compressors is not None else ["rkv", "snapkv", "streaming", "h2o"]
    dt = parse_dtype(dtype)
    lm = load_model(model, dtype=dt)
    bw = memory_bandwidth()
    results = []
    L = max_new_tokens
    params = SamplingParams(n=batch, max_new_tokens=L, ignore_eos=True, seed=seed)
    dense_engine = RolloutEngine(lm, build_compressor("none"), dtype=dt)
    prompt_ids = dense_engine.encode(BENCH_PROMPT)
    P = len(prompt_ids)
    per_tok = dense_engine.model.kv_bytes_per_token()
    wbytes = dense_engine.model.decode_read_bytes()
    # warm-up (allocator, BLAS threads)
    dense_engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))

    def record(engine_name, comp_name, tps, kv_peak, kv_theory, rss, kv_read_avg, extra=None):
        r = {
            "engine": engine_name, "compressor": comp_name, "batch": batch, "max_new_tokens": L,
            "kv_budget": None if comp_name == "none" else kv_budget, "tokens_per_s": tps,
            "ratio_vs_hf_generate": None, "kv_bytes_peak": kv_peak, "kv_bytes_theory": kv_theory,
            "rss_peak_bytes": rss, "roofline_fraction": _roofline(tps, batch, wbytes, kv_read_avg, bw),
        }
        r.update(extra or {})
        results.append(r)
        log(f"{engine_name:>16} {comp_name:>9}: {tps:8.1f} tok/s  kv_peak {kv_peak / 2**20:8.1f} MiB  "
            f"kv_theory {kv_theory / 2**20:8.1f} MiB  rss {rss / 2**20:7.0f} MiB  "
            f"roofline {r['roofline_fraction']:.2f}")

    dense_kv_avg = batch * per_tok * (P + L / 2)
    if hf_baseline:
        h = _hf_generate(lm, prompt_ids, batch, L, seed)
        record("hf_generate", "none", h["tokens"] / h["seconds"], h["kv_bytes_peak"],
               batch * per_tok * (P + L - 1), h["rss_peak_bytes"], dense_kv_avg)
    for name in ["none", *(c for c in compressors if c != "none")]:
        comp = bench_compressor(name, kv_budget, step_length)
        engine = RolloutEngine(lm, comp, dtype=dt) if comp.compresses else dense_engine
        with RssSampler() as rss:
            out = engine.generate([BENCH_PROMPT], params)
        tps = out.tokens_generated / out.seconds
        if not comp.compresses:
            kv_avg = dense_kv_avg
        else:  # kept tokens grow from P to P+budget(+period) and then cycle between budget and budget+period
            cycle = min(L, kv_budget + step_length / 2)
            kv_avg = batch * per_tok * (P + cycle)
        record("sparserl", name, tps, out.kv.bytes_peak, out.kv.bytes_theory, rss.peak, kv_avg,
               {"kv_bytes_dense": out.kv.bytes_dense, "compressions": out.kv.compressions})
    base = next((r["tokens_per_s"] for r in results if r["engine"] == "hf_generate"), None)
    dense = next(r["tokens_per_s"] for r in results if r["engine"] == "sparserl" and r["compressor"] == "none")
    for r in results:
        r["ratio_vs_hf_generate"] = r["tokens_per_s"] / base if base else None
        r["ratio_vs_sparserl_dense"] = r["tokens_per_s"] / dense
    info = machine_info(bw)
    info["dtype"] = str(dt).replace("torch.", "")
    info["model"] = model
    info["prompt_tokens"] = P
    return {"machine": info, "results": results}


def write_json(report: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2))
