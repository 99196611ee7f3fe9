"""The GPU sampler on a lent GPU, in one call: each Triton kernel against a float64 reference, the decode-attention
kernel's time per layer against the engine's eager torch attention and against the memory floor, and the static
decode step (captured as a CUDA graph there) against the eager engine: the same tokens, and the time a token.

    python3 experiments/device/gpu_engine_check.py --out DIR             # on the GPU machine (≤ a few minutes)
    python3 experiments/device/gpu_engine_check.py --smoke --out DIR     # here, in Triton's interpreter (CI)

1. The copy ceiling: a device-to-device copy of 1 GiB (read + write bytes / s), the floor's bandwidth.
2. Each kernel (decode attention over every slot, over block top-k's pages, over an int8 cache; R-KV's
   redundancy; the observation window's scores) against :func:`reference_decode_attention` in float64 or the
   engine's own torch / C scores: the max absolute error.
3. Decode attention for one layer of SmolLM2-135M's shapes (9 query heads, 3 KV heads, head dim 64, bfloat16) at
   batch 256: a dense cache of 1,024 and 4,096 tokens, R-KV's bounded cache (budget 256 + step 32), and block
   top-k's 8 pages of 16 out of 4,096: the kernel's time (CUDA events, median of 20 after 5 warm-ups), the eager
   torch path's (:func:`sparserl.rollout.cache.attention` / :func:`gathered_attention`), and the kernel's K/V bytes
   read / time as a fraction of the copy ceiling.

4. The static decode step (:mod:`sparserl.rollout.static_step`; on CUDA a captured graph, attention through the
   Triton kernel) against the eager engine on the tiny test model (built from a config, no download; 2 layers,
   so a step is launch-bound: what the graph removes): greedy tokens of dense and each evicting compressor
   (identical expected, also with 2 rows for 6 responses, finished rows refilled), sampled log-probs up to the
   first differing token (≤ 1e-2 expected), and seconds per generated token at batch 64 x 128 new tokens, eager
   against static.

Results: ``DIR/gpu_kernels.json`` and a table on stdout. With ``--smoke`` (CPU, interpreter) the shapes are tiny
and the timings mean nothing: it checks that the script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in Triton's interpreter")
    args = p.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    from sparserl.rollout.cache import attention
    from sparserl.rollout.gpu.decode_attention import decode_attention, reference_decode_attention
    from sparserl.rollout.gpu.rkv_redundancy import rkv_redundancy
    from sparserl.rollout.kv.rkv import redundancy
    from sparserl.rollout.kv_quant import get_kv_quantizer
    from sparserl.rollout.page_attention import gathered_attention

    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke on a CPU")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    f32 = args.smoke  # the interpreter's 16-bit dot is wrong: float32 operands there
    gen = torch.Generator(device="cpu").manual_seed(0)
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter smoke)"}

    def timed(fn, reps: int = 20, warm: int = 5) -> float:
        """Median seconds of ``fn`` (CUDA events on the GPU)."""
        if args.smoke:
            reps, warm = 1, 0
        for _ in range(warm):
            fn()
        times = []
        for _ in range(reps):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1000)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # 1. the copy ceiling
    n_copy = (1 << 20) if args.smoke else (1 << 30)
    src = torch.empty(n_copy, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    out["copy_bytes_per_s"] = 2 * n_copy / copy_s
    n_gemm = 256 if args.smoke else 8192  # and the GEMM ceiling: one square product in the sampler's dtype
    a_mat = torch.randn(n_gemm, n_gemm, device=device).to(dtype)
    gemm_s = timed(lambda: a_mat @ a_mat)
    out["gemm_flops_per_s"] = 2 * n_gemm**3 / gemm_s

    # 2. each kernel against float64
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    B, hkv, g, D, C = (3, 3, 3, 64, 100) if args.smoke else (8, 3, 3, 64, 1000)
    q, K, V = rand(B, hkv * g, D), rand(B, hkv, C, D), rand(B, hkv, C, D)
    start = torch.tensor([0, 7, 3] + [0] * (B - 3), dtype=torch.int32, device=device)
    lens = torch.tensor([C, C - 13, 61] + [C] * (B - 3), dtype=torch.int32, device=device)
    errors = {}
    got = decode_attention(q, K, V, start, lens, dot_f32=f32)[0]
    ref = reference_decode_attention(q.cpu(), K.cpu(), V.cpu(), start.cpu(), lens.cpu())[0]
    errors["decode_attention"] = float((got.cpu().double() - ref).abs().max())
    page, k = 16, 4
    pages = torch.stack([torch.arange(k, dtype=torch.int32)] * hkv)[None].repeat(B, 1, 1).to(device)
    got = decode_attention(q, K, V, start, lens, pages=pages, page=page, dot_f32=f32)[0]
    ref = reference_decode_attention(q.cpu(), K.cpu(), V.cpu(), start.cpu(), lens.cpu(), pages=pages.cpu(), page=page)
    errors["page_attention"] = float((got.cpu().double() - ref[0]).abs().max())
    quant = get_kv_quantizer("int8")
    (kc, ks), (vc, vs) = quant.quantize(K.float()), quant.quantize(V.float())
    got = decode_attention(q, kc, vc, start, lens, k_scale=ks, v_scale=vs, dot_f32=f32)[0]
    ref = reference_decode_attention(
        q.cpu(), kc.cpu(), vc.cpu(), start.cpu(), lens.cpu(), k_scale=ks.cpu(), v_scale=vs.cpu()
    )
    errors["decode_attention_int8"] = float((got.cpu().double() - ref[0]).abs().max())
    keys = rand(2, hkv, 80 if args.smoke else 600, D)
    valid = torch.ones(2, keys.shape[2], dtype=torch.bool, device=device)
    valid[0, :5] = False
    red = rkv_redundancy(keys, valid)
    errors["rkv_redundancy"] = float((red.cpu() - redundancy(keys.cpu().float(), valid.cpu())).abs().max())
    from sparserl.rollout.gpu.window_scores import window_scores
    from sparserl.rollout.kv.base import ScoreInputs, window_attention

    queries = rand(2, hkv * g, 8, D)
    got = window_scores(queries, keys, valid, "max", dot_f32=f32)
    inp = ScoreInputs(keys.cpu().float(), slice(0, keys.shape[2]), valid.cpu(), queries.cpu().float(), None)
    errors["window_scores"] = float((got.cpu() - window_attention(inp, "max")).abs().max())
    out["max_abs_error_vs_reference"] = errors

    # 3. decode attention at batch 256 (one layer of SmolLM2-135M's shapes)
    B = 2 if args.smoke else 256
    lengths = (32,) if args.smoke else (1024, 4096)
    rows = []

    def case(name: str, capacity: int, length: int, n_pages: int | None = None):
        q, K, V = rand(B, hkv * g, D), rand(B, hkv, capacity, D), rand(B, hkv, capacity, D)
        st = torch.zeros(B, dtype=torch.int32, device=device)
        ln = torch.full((B,), length, dtype=torch.int32, device=device)
        if n_pages is None:
            bias = torch.zeros(B, 1, 1, length, device=device)
            kernel = timed(lambda: decode_attention(q, K, V, st, ln, dot_f32=f32))
            eager = timed(lambda: attention(q[:, :, None], K, V, bias))
            read = 2 * B * hkv * length * D * K.element_size()
        else:
            n_all = length // 16
            pg = torch.stack(
                [torch.randperm(n_all - 1, generator=gen)[: n_pages - 1].sort().values for _ in range(B * hkv)]
            )
            pg = torch.cat([pg, torch.full((B * hkv, 1), n_all - 1)], 1).view(B, hkv, n_pages).int().to(device)
            kernel = timed(lambda: decode_attention(q, K, V, st, ln, pages=pg, page=16, dot_f32=f32))
            eager = timed(lambda: gathered_attention(q[:, :, None], K, V, pg.long(), st.long(), ln.long(), 16))
            read = 2 * B * hkv * n_pages * 16 * D * K.element_size()
        rows.append(
            {
                "case": name,
                "batch": B,
                "kernel_s": kernel,
                "eager_s": eager,
                "kernel_vs_eager": eager / kernel,
                "kv_bytes_read": read,
                "fraction_of_copy_ceiling": read / kernel / out["copy_bytes_per_s"],
            }
        )

    for L in lengths:
        case(f"dense {L}", L, L)
        case(f"R-KV bounded (256 + 32) at {L}", min(L, 288), min(L, 288))
        case(f"block top-k 8 x 16 of {L}", L, L, n_pages=min(8, L // 16))
    out["decode_attention_batch"] = rows

    # 4. the static (captured) step against the eager engine
    from sparserl.models.loading import load_model
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    tiny = load_model("tiny", dtype="float32", seed=0, device=device)
    prompts = ["hello there", "What is 3 + 4? Answer with a number.", "Count: one two"]
    static_rows = []
    for name, kw in (
        ("none", {}),
        ("rkv", {"budget": 12, "step_length": 4}),
        ("snapkv", {"budget": 12, "step_length": 4, "window": 4}),
        ("streaming", {"budget": 12, "step_length": 4}),
        ("h2o", {"budget": 12, "step_length": 4}),
        ("blocktopk", {"pages": 3, "dense_layers": 1}),
    ):
        comp = get_compressor(name, **kw) if kw else get_compressor(name)
        eager = RolloutEngine(tiny, comp, fused=False)
        static = RolloutEngine(tiny, comp, fused=False, static=True, static_check_every=1)
        length = 60 if name == "blocktopk" or not args.smoke else 24  # block top-k: rows of 4-5 pages, 3 read
        greedy = SamplingParams(n=2, max_new_tokens=length, seed=5, temperature=0.0)
        reference = eager.generate(prompts, greedy).response_ids
        same = reference == static.generate(prompts, greedy).response_ids
        static.max_batch = 2  # two rows for six responses: finished rows refilled with waiting ones
        same_refilled = reference == static.generate(prompts, greedy).response_ids
        static.max_batch = None
        sampled = SamplingParams(n=2, max_new_tokens=24 if args.smoke else 40, seed=5, temperature=1.0)
        a, b = eager.generate(prompts, sampled), static.generate(prompts, sampled)
        gap = 0.0
        for ra, rb, la, lb in zip(a.response_ids, b.response_ids, a.sampler_logprobs, b.sampler_logprobs):
            n = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), len(ra))
            gap = max([gap] + [abs(x - y) for x, y in zip(la[:n], lb[:n])])
        static_rows.append(
            {
                "compressor": name,
                "greedy_tokens_identical": same,
                "greedy_tokens_identical_refilled": same_refilled,
                "max_logprob_gap": gap,
            }
        )
    B, new = (4, 8) if args.smoke else (64, 128)
    speed = SamplingParams(n=B, max_new_tokens=new, seed=1, ignore_eos=True)
    engines = {
        "eager": RolloutEngine(tiny, get_compressor("none"), fused=False),
        "static": RolloutEngine(tiny, get_compressor("none"), fused=False, static=True, static_check_every=16),
    }
    per_token = {}
    for label, engine in engines.items():
        engine.generate(prompts[:1], speed)  # warm: kernels, graph pool
        times = []
        for _ in range(1 if args.smoke else 3):
            t0 = time.perf_counter()
            engine.generate(prompts[:1], speed)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / (B * new))
        per_token[label] = statistics.median(times)
    out["static_step"] = {"compressors": static_rows, "seconds_per_token": per_token, "batch": B, "new_tokens": new}
    # 5. the whole engine, eager against static, on SmolLM2-135M's shape and a 1.5B shape (random weights)
    out["engine_throughput"] = engine_throughput(args.smoke, device, dtype, out["copy_bytes_per_s"])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "gpu_kernels.json").write_text(json.dumps(out, indent=1))
    print(f"device: {out['device']}; copy ceiling {out['copy_bytes_per_s'] / 1e9:.0f} GB/s")
    print("max |error| vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    print(f"{'case':<36} {'kernel us':>10} {'eager us':>10} {'vs eager':>9} {'of ceiling':>11}")
    for r in rows:
        print(
            f"{r['case']:<36} {r['kernel_s'] * 1e6:>10.1f} {r['eager_s'] * 1e6:>10.1f} "
            f"{r['kernel_vs_eager']:>8.2f}x {r['fraction_of_copy_ceiling']:>10.1%}"
        )
    print(f"{'shape':<12} {'compressor':<10} {'eager tok/s':>12} {'static tok/s':>13} {'static/eager':>13} "
          f"{'eager of floor':>15} {'static of floor':>16}")  # fmt: skip
    for r in out["engine_throughput"]:
        print(
            f"{r['shape']:<12} {r['compressor']:<10} {r['eager_tokens_per_s']:>12.0f} "
            f"{r['static_tokens_per_s']:>13.0f} {r['static_vs_eager']:>12.2f}x "
            f"{r['eager_fraction_of_floor']:>14.1%} {r['static_fraction_of_floor']:>15.1%}"
        )
    print("static step against the eager engine (tiny model):")
    for r in static_rows:
        print(
            f"  {r['compressor']:<10} greedy tokens identical: {r['greedy_tokens_identical']} "
            f"(2 rows refilled: {r['greedy_tokens_identical_refilled']}), "
            f"sampled log-prob gap {r['max_logprob_gap']:.2e}"
        )
    print(
        f"  s per token at batch {B} x {new}: eager {per_token['eager'] * 1e6:.1f} us, static "
        f"{per_token['static'] * 1e6:.1f} us ({per_token['eager'] / per_token['static']:.2f}x)"
    )


#: decoder shapes with random weights (no download): SmolLM2-135M's and Qwen2.5-1.5B's; the smoke run's is tiny
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=512, tie_word_embeddings=True),
}  # fmt: skip


def random_model(shape: dict, device: str, dtype):
    """A Llama-architecture model of ``shape`` with random weights, built on ``device``, with the tiny test
    model's tokenizer (the prompts' ids fit any vocabulary here)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sparserl.models.loading import LoadedModel, tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(**shape, max_position_embeddings=8192, eos_token_id=tok.eos_token_id, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return LoadedModel(model=model.to(dtype).eval(), tokenizer=tok, name="random", path=None)


def engine_throughput(smoke: bool, device: str, dtype, copy_bytes_per_s: float) -> list[dict]:
    """Tokens per second of the eager engine and the static (captured) step at batch 256 x 1,024 new tokens for
    dense, R-KV (budget 256, step 32) and block top-k (16 pages of 16), and each as a fraction of its memory
    floor: the weights plus the KV read each step (at the average cached length) over the copy ceiling."""
    import torch

    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    B, new = (2, 16) if smoke else (256, 1024)
    arms = (("none", {}), ("rkv", {"budget": 256, "step_length": 32}), ("blocktopk", {"pages": 16}))
    rows = []
    for shape_name in ("smoke",) if smoke else ("smollm2-135m", "qwen2.5-1.5b"):
        lm = random_model(SHAPES[shape_name], device, dtype)
        prompt = [list(range(10, 60))]  # 50 prompt tokens
        params = SamplingParams(n=B, max_new_tokens=new, seed=0, ignore_eos=True)
        for name, kw in arms:
            comp = get_compressor(name, **kw) if kw else get_compressor(name)
            result = {"shape": shape_name, "compressor": name, "batch": B, "new_tokens": new}
            for label, static in (("eager", False), ("static", True)):
                engine = RolloutEngine(lm, comp, dtype=dtype, static=static, static_check_every=16)
                engine.generate([""], SamplingParams(n=2, max_new_tokens=4), prompt_ids=prompt)  # warm
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = engine.generate([""], params, prompt_ids=prompt)
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
                m = engine.model
                P = len(prompt[0])
                avg_kv = {
                    "none": P + new / 2,
                    "rkv": min(P + new / 2, P + 256 + 16),
                    "blocktopk": min(P + new / 2, 256),
                }
                floor_step = (m.decode_read_bytes() + B * avg_kv[name] * m.kv_bytes_per_token()) / copy_bytes_per_s
                result[f"{label}_tokens_per_s"] = o.tokens_generated / seconds
                result[f"{label}_fraction_of_floor"] = floor_step * new / seconds
                del engine
            result["static_vs_eager"] = result["static_tokens_per_s"] / result["eager_tokens_per_s"]
            rows.append(result)
        del lm
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
