"""DistillSparse on the default task: the KV budget a distilled sampler needs for the α tail of a plain one
(Sparrow, docs/algorithms.md §3). Results: docs/results/distill_sparse/.

Per seed, in one process:

1. train the main job (SmolLM2-135M, one-digit sums, R-KV) with ``algorithm.distill_sparse`` at
   ``--train-budget`` for ``--steps`` steps, logging α's 5th percentile with φ (the sampler that ran) and
   without it (the same sampler on θ alone, replayed on the same tokens) at every step;
2. then, with the final θ, calibrate both samplers, θ + φ and θ alone, on the held-out problems
   (``arith:seed=1000``, the default eval set): each samples its own responses at every budget of
   ``--budgets`` and its replay gives the exact α against the dense θ (``sparserl calibrate``'s
   measurement, :func:`sparserl.calibrate.measure.measure`).

The answer per seed: the smallest budget at which θ + φ's α tail is at least θ alone's at the reference
budget (``--reference``, the default job's 40).

    python3 experiments/training/distill_sparse_budget.py --seeds 0 1 2 --out docs/results/distill_sparse
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from sparserl.calibrate.measure import measure
from sparserl.config import load_config, validate
from sparserl.data import load_dataset
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import compressor_from_fields, get_compressor
from sparserl.rollout.sampling import SamplingParams
from sparserl.train.lora import sampler_state
from sparserl.train.trainer import build_trainer, sampler_weights, train_step

KEEP = (
    "reward/mean",
    "mismatch/k3_kl",
    "mismatch/alpha_p5",
    "mismatch/alpha_p5_nophi",
    "mismatch/alpha_mean",
    "mismatch/alpha_mean_nophi",
    "distill/loss",
    "distill/pg_loss",
    "distill/k3_kl",
    "distill/grad_norm",
    "time/distill_s",
    "time/alpha_s",
    "time/update_s",
    "time/rollout_s",
)


def calibrate(
    trainer, weights: dict, budgets: list[int], prompts: int, n: int, seed: int, tokens: str = "sampler"
) -> list[dict]:
    """α (mean, p5) of the run's sparse sampler with ``weights`` at each budget, on ``prompts`` held-out problems
    x ``n`` samples, against the dense learner; ``tokens``: each sampler's own responses (``sampler``,
    Sparrow's), or the dense θ's responses, the same for every sampler (``dense``: a paired comparison)."""
    cfg = trainer.cfg
    examples = list(load_dataset("arith:seed=1000", limit=prompts, system_prompt=cfg.data.system_prompt))
    prompt_ids = [trainer.engine.encode(e.prompt) for e in examples]
    params = SamplingParams(
        n=n, temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=seed
    )
    samplers = [
        (cfg.rollout.compressor, b, compressor_from_fields(cfg.rollout.model_copy(update={"kv_budget": b})))
        for b in budgets
    ]
    dense = RolloutEngine.from_engine(trainer.engine, get_compressor("none"))  # shares the engine's weights
    dense_tokens = None
    if tokens == "dense":  # θ's dense sampler draws the tokens, the same whatever ``weights`` are
        trainer.engine.update_weights(sampler_state(trainer.learner))
        dense_tokens = dense.generate([], params, prompt_ids=prompt_ids)
    trainer.engine.update_weights(weights)
    trainer.engine_stale = True
    found = measure(
        dense,
        trainer.learner,
        samplers,
        prompt_ids,
        params,
        bin_width=cfg.mismatch.alpha_bin,
        tokens=tokens,
        log=lambda *_: None,
        dense_out=dense_tokens,
    )
    return [{k: s[k] for k in ("budget", "alpha_mean", "alpha_p5", "tokens", "replay_err")} for s in found.samplers]


def needed_budget(distilled: list[dict], plain: list[dict], reference: int) -> int | None:
    """The smallest budget at which the distilled sampler's α p5 reaches the plain one's at ``reference``."""
    target = next(r["alpha_p5"] for r in plain if r["budget"] == reference)
    return next((r["budget"] for r in sorted(distilled, key=lambda r: r["budget"]) if r["alpha_p5"] >= target), None)


def run_seed(seed: int, args) -> dict:
    overrides = [
        f"train.seed={seed}",
        f"train.steps={args.steps}",
        f"rollout.kv_budget={args.train_budget}",
        f"algorithm.distill_sparse={{rank: {args.rank}, lambda: {args.lam}, lr: {args.lr}}}",
        "log.tensorboard=false",
        "data.eval=null",
        f"rollout.dtype={args.dtype}",
    ]
    cfg = validate(load_config("default", overrides))
    torch.manual_seed(seed)
    trainer = build_trainer(cfg)
    steps = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        metrics = train_step(trainer, step)
        steps.append({"step": step, "seconds": time.perf_counter() - t0, **{k: metrics.get(k) for k in KEEP}})
        print(json.dumps(steps[-1]), flush=True)
    plain_weights, distilled_weights = sampler_state(trainer.learner), sampler_weights(trainer)
    delta = max(float((distilled_weights[k] - plain_weights[k]).abs().max()) for k in plain_weights)
    distilled = calibrate(trainer, distilled_weights, args.budgets, args.prompts, args.n, seed)
    plain = calibrate(trainer, plain_weights, args.budgets, args.prompts, args.n, seed)
    paired = {
        arm: calibrate(trainer, w, args.budgets, args.prompts, args.n, seed, tokens="dense")
        for arm, w in (("distilled", distilled_weights), ("plain", plain_weights))
    }
    return {
        "seed": seed,
        "overrides": overrides,
        "steps": steps,
        "phi_max_abs_delta_weight": delta,
        "calibration": {"distilled": distilled, "plain": plain},
        "calibration_dense_tokens": paired,
        "needed_budget": needed_budget(distilled, plain, args.reference),
        "needed_budget_dense_tokens": needed_budget(paired["distilled"], paired["plain"], args.reference),
    }


def summarize(folder: Path) -> str:
    """Markdown tables of every ``seed*_lam*.json`` in ``folder``: per run, the α tail by budget with and without
    φ after training, the budget φ needs, and α p5 during training (first / last 3 steps' mean)."""
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("seed*_lam*.json"))]
    out = [_table(docs, "calibration", "needed_budget", "each sampler's own tokens")]
    paired = [d for d in docs if "calibration_dense_tokens" in d]
    if paired:
        out.append(_table(paired, "calibration_dense_tokens", "needed_budget_dense_tokens", "θ's dense tokens, paired"))
    return "\n\n".join(out)


def _table(docs: list[dict], key: str, needed: str, title: str) -> str:
    lines = [
        f"α 5th percentile after training, on {title}:",
        "",
        "| λ | lr | seed | "
        + " | ".join(f"p5 @{r['budget']} φ / plain" for r in docs[0][key]["plain"])
        + " | budget for plain@ref's p5 | training p5 φ / plain (last 3) | reward (last 3) |",
        "|---|---|---|" + "---|" * (len(docs[0][key]["plain"]) + 3),
    ]
    for d in docs:
        lam = next(o for o in d["overrides"] if o.startswith("algorithm.distill_sparse"))
        cal = d[key]
        cells = [f"{a['alpha_p5']:.3f} / {b['alpha_p5']:.3f}" for a, b in zip(cal["distilled"], cal["plain"])]
        last = d["steps"][-3:]

        def mean(metric):
            return sum(s[metric] for s in last) / len(last)

        lines.append(
            f"| {lam.split('lambda: ')[1].split(',')[0]} | {lam.split('lr: ')[1].rstrip('}')} | {d['seed']} | "
            + " | ".join(cells)
            + f" | {d[needed]} | {mean('mismatch/alpha_p5'):.3f} / "
            f"{mean('mismatch/alpha_p5_nophi'):.3f} | {mean('reward/mean'):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--train-budget", type=int, default=32, help="the KV budget φ is trained at")
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 24, 32, 40, 48])
    ap.add_argument("--reference", type=int, default=40, help="the plain sampler's budget whose α tail is the target")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lam", type=float, default=0.001)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument(
        "--dtype",
        default="float32",
        help="the sampler's dtype (rollout.dtype): float32, as the "
        "first runs had it (their auto measured float32 faster on that machine), unless asked",
    )
    ap.add_argument("--out", default="docs/results/distill_sparse")
    ap.add_argument("--summarize", action="store_true", help="print the tables of the JSONs in --out and stop")
    args = ap.parse_args()
    if args.summarize:
        print(summarize(Path(args.out)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        result = run_seed(seed, args)
        machine = {"cpu": cpu_name(), "isa": native.isa(), "cores": os.cpu_count(), "torch": torch.__version__}
        doc = {
            "machine": machine,
            "command": "python3 experiments/training/distill_sparse_budget.py "
            + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items()
                if k not in ("seeds", "summarize")
            )
            + f" --seeds {seed}",
            **result,
        }
        name = f"seed{seed}_lam{args.lam:g}.json"
        (out / name).write_text(json.dumps(doc, indent=1))
        print(
            f"seed {seed}: needed budget {result['needed_budget']} (reference {args.reference}); wrote {out / name}",
            flush=True,
        )


if __name__ == "__main__":
    main()
