"""The cost model (``sparserl.cost``) against the engine's measured time.

For every response length and KV budget (``none`` = dense), runs the rollout engine on batch ``--batch``
with ``ignore_eos`` (exactly L new tokens per sequence) for ``--rounds`` rounds (every budget once a
round, in a rotating order: :func:`sparserl.bench.measure.time_rounds`), and predicts the same rollout
with :func:`sparserl.cost.rollout_cost` from the model's config and this machine's rates measured by the bench's probes
(:func:`sparserl.bench.machine.measure_rates`). Writes ``cost_model.md`` (a table: predicted s, measured s
(median of the rounds), measured / predicted, the predicted and the measured speedup over dense, the
predicted and the counted compressions) and ``cost_model.json`` into ``--out``, with the machine
(CPU, instruction sets, bandwidth, GEMM rate) and the command line at the top.

The default model is SmolLM2-135M's shape with seeded random weights (no load, no download: the
probe model of :mod:`sparserl.rollout.dtype_choice`), prompts of ``--prompt-len`` token ids; its time
is the real model's, since every sequence runs exactly L tokens. ``--model smollm2-135m`` loads the
real one as the bench does and uses the bench's prompt. The compressor is built as the bench builds
its rows (:func:`sparserl.bench.rollout.bench_compressor`).

    python3 experiments/rollout/cost_model_validate.py                      # 4 lengths × 4 budgets, batch 16
    python3 experiments/rollout/cost_model_validate.py --lengths 32 --budgets none,16 --batch 2 --rounds 1 \
        --out /tmp/cost_smoke                                       # a smoke test, well under a minute
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from sparserl.bench.machine import machine_info, measure_rates
from sparserl.bench.measure import time_rounds
from sparserl.bench.rollout import bench_compressor, sparserl_commit
from sparserl.cost import ModelShape, rollout_cost
from sparserl.models.loading import LoadedModel, load_model, resolve_device
from sparserl.rollout.dtype_auto import resolve_dtype
from sparserl.rollout.dtype_choice import probe_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

PREFILL_ROWS = 256  # the prefill's GEMM rate is measured at N · L_in rows, at most this many (it saturates)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _budgets(text: str) -> list[int | None]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if x:
            out.append(None if x in ("none", "dense") else int(x))
    if None not in out:
        out.insert(0, None)  # every speedup is against dense: it always runs
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        default="random",
        help="random (SmolLM2-135M's shape, random weights; default) or a "
        "name / path load_model takes, e.g. smollm2-135m",
    )
    ap.add_argument("--lengths", default="256,512,1024,2048", help="response lengths, comma-separated")
    ap.add_argument("--budgets", default="none,64,128,256", help="KV budgets, comma-separated; none = dense")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compressor", default="rkv")
    ap.add_argument("--step-length", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens of the random model")
    ap.add_argument("--dtype", default="auto", help="the sampler's dtype (auto: as the bench chooses)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/cost_model/")
    args = ap.parse_args(argv)
    args.lengths, args.budgets = _ints(args.lengths), _budgets(args.budgets)
    for name in ("batch", "rounds", "step_length", "prompt_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.lengths or min(args.lengths) < 1:
        ap.error("--lengths: give positive response lengths")
    if any(b is not None and b < 1 for b in args.budgets):
        ap.error("--budgets: every budget must be >= 1 (or none)")
    return args


def _model(args, device: torch.device, dtype: torch.dtype) -> tuple[LoadedModel, list[int] | None]:
    """The model and, for the random one, its prompt ids (None: encode the bench's prompt)."""
    if args.model == "random":
        probe = probe_model(device)
        ids = [(7 * i) % 1000 + 10 for i in range(args.prompt_len)]
        return LoadedModel(probe.model, probe.tokenizer, "smollm2-135m shape, random weights", None), ids
    return load_model(args.model, dtype=dtype, device=device), None


def run(args) -> dict:
    dev = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, dev)
    lm, prompt_ids = _model(args, dev, dtype)
    dense = RolloutEngine(lm, build_compressor("none"), dtype=dtype)
    prompt_ids = prompt_ids or dense.encode(BENCH_PROMPT)
    engines, comps = {}, {}
    for b in args.budgets:
        comps[b] = build_compressor("none") if b is None else bench_compressor(args.compressor, b, args.step_length)
        engines[b] = dense if b is None else RolloutEngine.from_engine(dense, comps[b])

    def generate(engine, n, L):
        return engine.generate(
            ["-"], SamplingParams(n=n, max_new_tokens=L, ignore_eos=True, seed=args.seed), prompt_ids=[prompt_ids]
        )

    for engine in engines.values():  # warm-up: allocator, thread pool, packed weights
        generate(engine, 2, 4)
    P, N = len(prompt_ids), args.batch
    prefill_rows = min(N * P, PREFILL_ROWS)
    rates = measure_rates(dense.model, rows=N, prefill_rows=prefill_rows)
    shape = ModelShape.from_config(lm.model.config, dense.model.dtype)
    print(
        f"rates: {rates.bandwidth / 1e9:.2f} GB/s, {rates.gemm_flops / 1e9:.2f} GFLOP/s at {N} rows, "
        f"{rates.prefill_rate / 1e9:.2f} at {prefill_rows}; prompt {P} tokens",
        flush=True,
    )

    results = []
    order = list(args.budgets)
    for L in args.lengths:
        res = time_rounds(
            {b: (lambda b=b: generate(engines[b], N, L)) for b in order},
            args.rounds,
            on_run=lambda r, b, sec, out: print(f"L {L} round {r + 1}: {b or 'dense'} {out.seconds:.2f}s", flush=True),
        )
        engine_seconds = lambda out: out.seconds  # noqa: E731  (the engine's own clock, prefill included)
        seconds = {b: res.values(b, engine_seconds) for b in order}
        counted = {b: res.results[b][-1].kv.compressions for b in order}
        dense_pred = rollout_cost(shape, rates, N, P, L)
        for b in order:
            pred = dense_pred if b is None else rollout_cost(shape, rates, N, P, L, compressor=comps[b])
            measured = statistics.median(seconds[b])
            results.append(
                {
                    "response_len": L,
                    "kv_budget": b,
                    "compressor": "none" if b is None else args.compressor,
                    "window": None if b is None else comps[b].window,
                    "step_length": None if b is None else args.step_length,
                    "predicted_s": pred.seconds,
                    "measured_s": measured,
                    "measured_s_runs": seconds[b],
                    "measured_over_predicted": measured / pred.seconds,
                    "predicted_speedup_vs_dense": dense_pred.seconds / pred.seconds,
                    "measured_speedup_vs_dense": res.median_ratio(None, b, engine_seconds),
                    "compressions_predicted": pred.compressions,
                    "compressions_counted": counted[b],
                    "cost": pred.to_dict(),
                }
            )
    info = machine_info(rates.bandwidth, rates.gemm_flops, N, device=dev)
    info.update(
        dtype=str(dense.model.dtype).replace("torch.", ""),
        model=lm.name,
        prompt_tokens=P,
        sparserl_commit=sparserl_commit(),
    )
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": info,
        "shape": {**asdict(shape), "decode_weights": shape.decode_weights, "params": shape.params},
        "rates": {
            "bandwidth_bytes_per_s": rates.bandwidth,
            "gemm_flops_per_s": rates.gemm_flops,
            "prefill_flops_per_s": rates.prefill_rate,
            "prefill_rows": prefill_rows,
        },
        "batch": N,
        "rounds": args.rounds,
        "results": results,
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Cost model against the engine (`sparserl.cost`)",
        "",
        f"    {report['command']}",
        "",
        f"- CPU: {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads); instruction sets: "
        f"{' '.join(m['isa']) or 'none of the listed'}; device {m['device']}"
        f"{' (' + m['gpu'] + ')' if m.get('gpu') else ''}",
        f"- measured: read bandwidth {m['memory_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, decode GEMMs "
        f"{m['gemm_flops_per_s'] / 1e9:.2f} GFLOP/s at {m['gemm_rows']} rows, "
        f"{report['rates']['prefill_flops_per_s'] / 1e9:.2f} GFLOP/s at {report['rates']['prefill_rows']} (prefill)",
        f"- model {m['model']}, {m['dtype']}, prompt {m['prompt_tokens']} tokens, batch {report['batch']}, "
        f"{report['rounds']} round(s); torch {m['torch']}, sparserl {m.get('sparserl_commit')}, {report['date']}",
        "",
        "Measured: the engine's seconds (prefill included), median of the rounds. Speedups over dense: "
        "predicted = dense predicted / predicted; measured = median of the per-round dense / this.",
        "",
        "| L | budget | predicted s | measured s | measured / predicted | speedup predicted | speedup measured "
        "| compressions predicted / counted | memory-bound steps | weight / attention / compression / prefill s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        c = r["cost"]
        lines.append(
            f"| {r['response_len']} | {r['kv_budget'] or 'dense'} | {r['predicted_s']:.3f} | {r['measured_s']:.3f} "
            f"| {r['measured_over_predicted']:.2f} | {r['predicted_speedup_vs_dense']:.2f}x "
            f"| {r['measured_speedup_vs_dense']:.2f}x | {r['compressions_predicted']} / {r['compressions_counted']} "
            f"| {c['memory_bound_steps']}/{c['decode_steps']} | {c['weight_s']:.2f} / {c['attention_s']:.2f} / "
            f"{c['compression_s']:.2f} / {c['prefill_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_model.json").write_text(json.dumps(report, indent=2))
    (out / "cost_model.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'cost_model.md'} and {out / 'cost_model.json'}")


if __name__ == "__main__":
    main()
