"""The bf16 sampler's decode step against the float32 one, in one process, and its mismatch
against the float32 policy.

Speed: SmolLM2-135M (embedded), batch 16, ``--tokens`` new tokens from the bench's prompt, dense and R-KV
(budget ``--budget``), each in float32 (the fused float32 step), bfloat16 fused (``linear_bf16.c`` on
bf16 panels, a bf16 KV cache in decode_attention.c) and bfloat16 eager (``fused=False``: torch's bf16
operators one at a time). Where the CPU runs two bf16 kernels (an AMX
Xeon: ``amx`` and ``avx512_bf16``, :func:`native.bf16_kernels`), the fused bf16 arm runs once on each
(``bfloat16_fused_amx``, ``bfloat16_fused_avx512_bf16``). Every round runs every arm once, in a rotated
order (:func:`sparserl.bench.measure.time_rounds`); a ratio is the median of the per-round ratios
against float32 of the same compressor.

Mismatch: the bf16 samplers' responses (dense cache) replayed on the float32 dense sampler (the policy
the learner holds, float32 by default): per token α = Σ_x min(p(x), q(x)) over the vocabulary and k3 =
r - 1 - log r with r = p(y) / q(y) for the sampled y; mean and 5th percentile of α, mean k3.

    python3 experiments/rollout/bf16_decode.py --tokens 256 --budget 128 --json docs/results/bf16_decode/L256.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.mismatch.replay import replay
from sparserl.models.loading import load_model
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams


def arms(eager: bool = True) -> list[tuple[str, bool, str | None]]:
    """(dtype, fused, bf16 kernel): float32, the fused bf16 step on each bf16 kernel, the eager bf16 step."""
    return [
        ("float32", True, None),
        *(("bfloat16", True, k) for k in native.bf16_kernels() or (None,)),
        *([("bfloat16", False, None)] if eager else []),
    ]


def arm_name(dtype: str, is_fused: bool, kernel: str | None = None) -> str:
    if dtype == "float32":
        return dtype
    if not is_fused:
        return f"{dtype}_eager"
    return f"{dtype}_fused" + (f"_{kernel}" if kernel and len(native.bf16_kernels()) > 1 else "")


def mismatch(lm, sampler: RolloutEngine, reference: RolloutEngine, n: int, tokens: int) -> dict:
    params = SamplingParams(n=n, max_new_tokens=tokens, ignore_eos=True, seed=1)
    out = sampler.generate([BENCH_PROMPT], params)
    q, p = {}, {}

    def keep(store):
        def on_step(t, rows, logprobs):
            for r, lp in zip(rows.tolist(), logprobs.float()):
                store[(r, t)] = lp

        return on_step

    replay(sampler, out.prompt_ids, out.response_ids, params, on_step=keep(q))
    replay(reference, out.prompt_ids, out.response_ids, params, on_step=keep(p))
    alphas, k3 = [], []
    for (r, t), lq in q.items():
        lp = p[(r, t)]
        alphas.append(float(torch.minimum(lp, lq).exp().sum()))
        y = out.response_ids[r][t]
        ratio = float((lp[y] - lq[y]).exp())
        k3.append(ratio - 1 - float(lp[y] - lq[y]))
    alphas.sort()
    return {
        "tokens": len(alphas),
        "alpha_mean": statistics.fmean(alphas),
        "alpha_p5": alphas[int(0.05 * (len(alphas) - 1))],
        "k3_mean": statistics.fmean(k3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mismatch-n", type=int, default=8, help="responses replayed for the mismatch (0: none)")
    ap.add_argument("--skip-eager", action="store_true", help="leave out the eager bf16 arm (the slowest)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    lm = load_model("smollm2-135m", dtype="float32")
    engines = {}
    for dtype, is_fused, kernel in arms(not args.skip_eager):
        name = arm_name(dtype, is_fused, kernel)
        base = RolloutEngine(
            lm, build_compressor("none"), dtype=dtype, fused=is_fused, bf16_kernel=kernel if is_fused else None
        )
        engines[(name, "none")] = base
        engines[(name, "rkv")] = RolloutEngine.from_engine(base, build_compressor("rkv", kv_budget=args.budget))
    params = SamplingParams(n=args.batch, max_new_tokens=args.tokens, ignore_eos=True, seed=0)
    for engine in engines.values():  # warm-up: packing, allocations, thread pool
        engine.generate([BENCH_PROMPT], SamplingParams(n=2, max_new_tokens=4, ignore_eos=True))
    keys = list(engines)

    def show(k, name, seconds, out):
        print(
            f"round {k + 1} {name:>20}: {args.batch * args.tokens / seconds:7.1f} tok/s  "
            f"kv_peak {out.kv.bytes_peak / 2**20:7.1f} MiB",
            flush=True,
        )

    res = time_rounds(
        {
            f"{name}/{comp}": (lambda e=engine: e.generate([BENCH_PROMPT], params))
            for (name, comp), engine in engines.items()
        },
        args.rounds,
        on_run=show,
    )
    rounds = []
    for k in range(args.rounds):
        rounds.append({})
        for name in res.seconds:
            rounds[-1][name] = args.batch * args.tokens / res.seconds[name][k]
            rounds[-1][f"{name}/kv_peak_bytes"] = res.results[name][k].kv.bytes_peak
    ratios = {}
    for name, comp in keys:
        per_round = res.ratios(f"float32/{comp}", f"{name}/{comp}")  # seconds: float32's over this arm's
        ratios[f"{name}/{comp}_vs_float32"] = {"median": statistics.median(per_round), "rounds": per_round}
        if comp != "none":
            per_round = res.ratios(f"{name}/none", f"{name}/{comp}")
            ratios[f"{name}/{comp}_vs_{name}/none"] = {"median": statistics.median(per_round), "rounds": per_round}
    result = {
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "bf16_kernels": native.bf16_kernels(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
        },
        "command": "python3 experiments/rollout/bf16_decode.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "rounds": rounds,
        "ratios": ratios,
    }
    if args.mismatch_n:
        reference = engines[("float32", "none")]
        result["mismatch_vs_float32"] = {
            name: mismatch(lm, engines[(name, "none")], reference, args.mismatch_n, args.tokens)
            for name in dict.fromkeys(n for n, _ in keys)
            if name != "float32"
        }
    for key, value in ratios.items():
        print(f"{key:>40}: {value['median']:.3f}x  (rounds {', '.join(f'{x:.3f}' for x in value['rounds'])})")
    print(json.dumps(result.get("mismatch_vs_float32", {}), indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
