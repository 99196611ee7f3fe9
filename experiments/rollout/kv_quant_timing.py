"""Decode speed, KV bytes and log-prob mismatch of the quantized KV cache (``kv_quant`` none / int8 / fp8).

    flock /work/exp/cpu.lock python experiments/rollout/kv_quant_timing.py --batch 16 --max-new-tokens 256

Dense cache (compressor ``none``), float32 sampler, the bench prompt, ``ignore_eos``; the kv_quant
settings run in rotating rounds (:func:`sparserl.bench.measure.time_rounds`): decode tokens/s (the prefill
excluded) is the median over rounds, a ratio to the float32 cache the median of the per-round ratios. Mismatch:
teacher-forced on the float32 cache's tokens (the step hook feeds them), per token over the full
vocabulary: |Δ log p| of the token, k3 KL(p_float ‖ p_quant) and α = Σ_x min(p, q). Also times the
attention function alone on a decode-shaped cache: the fused form (scales applied after the products)
against dequantize-then-attend.
"""

from __future__ import annotations

import argparse
import json

import torch

from sparserl.bench.measure import best_seconds, time_rounds
from sparserl.bench.mismatch import stepwise_logprobs
from sparserl.models.loading import load_model
from sparserl.rollout.cache import attention
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.kv_quant import get_kv_quantizer
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams


def teacher_forced(engine, prompt_ids, params, tokens=None):
    out, steps = stepwise_logprobs(engine, None, params, tokens, prompt_ids=prompt_ids)
    return torch.tensor(out.response_ids), steps


def attention_timing(B=16, hkv=3, hq=9, L=300, D=64, reps=50):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, hq, 1, D, generator=g)
    K, V = torch.randn(B, hkv, L + 8, D, generator=g), torch.randn(B, hkv, L + 8, D, generator=g)
    bias = torch.zeros(B, 1, 1, L)
    res = {}

    def best(f):
        f()  # warm-up
        return best_seconds(f, passes=5, calls=reps) * 1e6

    res["float32_us"] = best(lambda: attention(q, K, V, bias))
    for name in ("int8", "fp8"):
        qz = get_kv_quantizer(name)
        (kc, ks), (vc, vs) = qz.quantize(K), qz.quantize(V)
        res[f"{name}_fused_us"] = best(lambda: attention(q, kc, vc, bias, ks, vs, qz))
        res[f"{name}_dequant_then_attend_us"] = best(
            lambda: attention(
                q, qz.dequantize(kc[:, :, :L], ks[:, :, :L]), qz.dequantize(vc[:, :, :L], vs[:, :, :L]), bias
            )
        )
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mismatch-rows", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    lm = load_model(a.model, dtype="float32")
    quants = ["none", "int8", "fp8"]
    engines = {q: RolloutEngine(lm, build_compressor("none"), dtype="float32", kv_quant=q) for q in quants}
    prompt_ids = [engines["none"].encode(BENCH_PROMPT)]
    params = SamplingParams(n=a.batch, max_new_tokens=a.max_new_tokens, ignore_eos=True, seed=0)
    engines["none"].generate(
        None, SamplingParams(n=2, max_new_tokens=8, ignore_eos=True), prompt_ids=prompt_ids
    )  # warm-up
    rows = {q: {"kv_quant": q} for q in quants}

    def decode_rate(out):
        return out.tokens_generated / max(out.seconds - out.prefill_seconds, 1e-9)

    def show(r, q, seconds, out):
        print(
            f"{q:5s} decode {decode_rate(out):7.1f} tok/s  total {out.tokens_per_s:7.1f} tok/s  "
            f"kv {out.kv.bytes_peak / 2**20:.2f} MiB",
            flush=True,
        )

    res = time_rounds(
        {q: (lambda e=engines[q]: e.generate(None, params, prompt_ids=prompt_ids)) for q in quants},
        a.rounds,
        on_run=show,
    )
    for q in quants:
        if a.rounds:
            rows[q].update(decode_tok_s=res.median(q, decode_rate), kv_bytes_peak=res.results[q][-1].kv.bytes_peak)
    mp = SamplingParams(n=a.mismatch_rows, max_new_tokens=a.max_new_tokens, ignore_eos=True, seed=1)
    ref_tokens, ref = teacher_forced(engines["none"], prompt_ids, mp)
    nxt = ref_tokens[:, 1:, None]
    for q in quants:
        r = rows[q]
        if a.rounds:  # --rounds 0: mismatch and attention timing only
            r["ratio_tok_s_vs_float32_kv"] = res.median_ratio(q, "none", decode_rate)
            r["kv_bytes_ratio_vs_float32"] = r["kv_bytes_peak"] / rows["none"]["kv_bytes_peak"]
        if q == "none":
            continue
        _, got = teacher_forced(engines[q], prompt_ids, mp, ref_tokens)
        dlp = (ref.gather(-1, nxt) - got.gather(-1, nxt)).abs()
        p, lq = ref.exp(), got
        kl_k3 = (p * ((lq - ref).exp() - 1 - (lq - ref))).sum(-1)  # E_p[r - 1 - log r], r = q/p
        alpha = torch.minimum(p, lq.exp()).sum(-1)
        r.update(
            mismatch_tokens=int(dlp.numel()),
            abs_dlogp_mean=dlp.mean().item(),
            abs_dlogp_max=dlp.max().item(),
            k3_kl_mean=kl_k3.mean().item(),
            alpha_mean=alpha.mean().item(),
            alpha_p5=alpha.flatten().quantile(0.05).item(),
        )
    result = {
        "model": a.model,
        "batch": a.batch,
        "max_new_tokens": a.max_new_tokens,
        "rows": list(rows.values()),
        "attention": attention_timing(L=len(prompt_ids[0]) + a.max_new_tokens),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
