"""What ``rollout.fp32_head`` does to a **dense** bfloat16 sampler's mismatch: k3 and Sparrow's acceptance α
against the float32 learner, on a step's batch, for a dense sampler in bfloat16 with its head in bfloat16 and in
float32 (and a float32 sampler, the floor).

The config's model and first steps' prompts as the trainer draws them (``--steps`` steps, ``--seeds`` sampling
seeds each), the config's sampling (temperature, top-k/top-p, ``rollout.max_new_tokens``), no compression. Per
arm and step: the sampler keeps the LM head's input at each position it sampled from (``keep_hidden``), its whole
distribution ``q`` is recomputed from it by its own head and sampling transform (what training's exact α does,
:func:`sparserl.mismatch.exact_alpha.hidden_alpha`); ``p`` is the float32 learner's forward over prompt and response
at the sampling temperature. Figures per arm over every token: k3 = E[ρ - 1 - log ρ] at the sampled tokens
(ρ = p / q), α = Σ_v min(p, q) (mean and 5th percentile), and the mean |log p - log q| of the sampled tokens.
The arms sample their own tokens (their heads differ), each from the same prompts and seeds.

    python3 experiments/mismatch/fp32_head_dense.py default --steps 2 --seeds 0,1,2 --json fp32_head_dense.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="default")
    parser.add_argument("--steps", type=int, default=2, help="the first steps' prompts")
    parser.add_argument("--seeds", default="0,1,2", help="sampling seeds, each over the same prompts")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.max_new_tokens=256")
    args = parser.parse_intermixed_args()

    import dataclasses

    import torch

    from sparserl.config import load_config, validate
    from sparserl.data.loaders import PromptSampler
    from sparserl.mismatch.acceptance import acceptance
    from sparserl.models.loading import load_model
    from sparserl.rollout.dtype_auto import cpu_name
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.sampling import sampled_distribution
    from sparserl.train.sampler_sync import sampling_params
    from sparserl.train.train_set import load_train_set

    cfg = validate(load_config(args.config, tuple(args.overrides)))
    lm = load_model(cfg.model.name, dtype="float32", seed=cfg.model.seed, device=cfg.model.device)
    arms = {
        "bf16 sampler, bf16 head": RolloutEngine(lm, build_compressor("none"), dtype="bfloat16"),
        "bf16 sampler, fp32 head": RolloutEngine(lm, build_compressor("none"), dtype="bfloat16", fp32_head=True),
        "fp32 sampler": RolloutEngine(lm, build_compressor("none"), dtype="float32"),
    }
    sampler = PromptSampler(list(load_train_set(cfg.data)), cfg.train.prompts_per_step, seed=cfg.train.seed)
    steps = {s: [e.prompt for e in sampler.next_batch()] for s in range(1, args.steps + 1)}
    seeds = [int(x) for x in args.seeds.split(",")]

    def measure(engine, prompts, params):
        out = engine.generate(prompts, params)
        k3, alpha, gap = [], [], []
        for prompt_ids, tokens, recorded, x in zip(out.prompt_ids, out.response_ids, out.sampler_logprobs, out.hidden):
            if not tokens:
                continue
            logits = torch.cat([engine.hidden_logits(x[:1], True), engine.hidden_logits(x[1:], False)])
            logq = sampled_distribution(logits, params).float()
            ids = torch.tensor([prompt_ids + tokens], device=lm.model.device)
            with torch.no_grad():
                learner = lm.model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
            logp = sampled_distribution(learner, params).float()  # the learner at the sampler's temperature/truncation
            at = torch.tensor(tokens, device=logp.device)[:, None]
            lp, lq = logp.gather(-1, at)[:, 0], torch.tensor(recorded, device=logp.device)
            log_rho = (lp - lq).double()
            finite = torch.isfinite(log_rho)  # a token outside the learner's truncated set: k3 infinite, counted apart
            k3.append((log_rho[finite].exp() - 1 - log_rho[finite]).tolist())
            gap.append((lp - lq).abs()[finite].tolist())
            alpha.append(acceptance(logp, logq).tolist())
        return [v for r in k3 for v in r], [v for r in alpha for v in r], [v for r in gap for v in r]

    results = {}
    for arm, engine in arms.items():
        t0 = time.perf_counter()
        k3, alpha, gap = [], [], []
        for step, prompts in steps.items():
            for seed in seeds:
                params = dataclasses.replace(sampling_params(cfg, step=step), seed=seed, keep_hidden=True)
                a, b, c = measure(engine, prompts, params)
                k3 += a
                alpha += b
                gap += c
        alpha_sorted = sorted(alpha)
        results[arm] = {
            "tokens": len(alpha),
            "k3_mean": statistics.fmean(k3),
            "alpha_mean": statistics.fmean(alpha),
            "alpha_p5": alpha_sorted[int(0.05 * (len(alpha_sorted) - 1))],
            "alpha_p1": alpha_sorted[int(0.01 * (len(alpha_sorted) - 1))],
            "sampled_logprob_gap_mean": statistics.fmean(gap),
            "seconds": time.perf_counter() - t0,
        }
        r = results[arm]
        print(
            f"{arm:24s} tokens {r['tokens']:6d}  k3 {r['k3_mean']:.2e}  α mean {r['alpha_mean']:.4f}  "
            f"p5 {r['alpha_p5']:.4f}  p1 {r['alpha_p1']:.4f}  |log p - log q| {r['sampled_logprob_gap_mean']:.2e}  "
            f"{r['seconds']:.0f} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "what": __doc__.splitlines()[0],
                    "config": args.config,
                    "overrides": args.overrides,
                    "steps": args.steps,
                    "seeds": seeds,
                    "machine": cpu_name(),
                    "torch": torch.__version__,
                    "arms": results,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
