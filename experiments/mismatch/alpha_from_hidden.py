"""The exact α's time against the rollout's, with ``q`` recomputed from the sampler's kept head inputs
(``mismatch.alpha_q=hidden``), read from kept distributions (``kept``, where they fit) and replayed
(``replay``), at long responses, in one process.

The default job's model (SmolLM2-135M) and sampler precision (``rollout.dtype: auto``), ``--responses``
responses (``--prompts`` prompts x the rest) of ``--tokens`` new tokens each (``ignore_eos``), for each sampler
of ``--samplers`` (``none``: dense; ``rkv``: R-KV at ``--budget``). Per sampler, the arms of one round:

- ``rollout``: the rollout keeping its head inputs (``SamplingParams.keep_hidden``, what training runs);
- ``hidden``: α from them (:func:`sparserl.mismatch.exact_alpha.hidden_alpha`): ``q`` by the sampler's head,
  ``p`` by the learner's head from its hidden states;
- ``kept``: the rollout keeping ``q`` and α reading it, only where a step's ``q`` fits in ``--kept-mib``
  (its time includes that rollout: the figure is kept's α time, rollout subtracted per round);
- ``replay``: α with ``q`` from a replay of the sampler on its tokens (:func:`~.exact_alpha.exact_alpha`).

``p``'s hidden states come from one no-grad forward of the learner made once, outside the timings (in
training the old-policy scoring forward keeps them: ``time/score_s``). Rounds alternate the arms' order
(:func:`sparserl.bench.measure.time_rounds`); a ratio is the median of the per-round ratios α / rollout.
The arms' α agree (largest difference reported).

    python3 experiments/mismatch/alpha_from_hidden.py --rounds 3 --json docs/results/alpha_from_hidden/L1024.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from sparserl.bench.measure import time_rounds
from sparserl.config import load_config, validate
from sparserl.mismatch import exact_alpha as exact
from sparserl.mismatch.measure import dense_hidden
from sparserl.models.mixed_precision import learner_autocast, learner_compute_dtype
from sparserl.rollout import native
from sparserl.rollout.dtype_auto import cpu_name
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.score.shared_prompt import lm_head_weight
from sparserl.train.trainer import build_trainer, rollout_batch, sampling_params


def rss_gib() -> float:
    """This process's peak resident set so far, GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--responses", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--samplers", default="none,rkv")
    ap.add_argument("--kept-mib", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=exact.DEFAULT_CHUNK)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="hidden,replay,kept", help="α arms timed besides the rollout")
    ap.add_argument(
        "--clock",
        choices=("wall", "process"),
        default="wall",
        help="process: this process's CPU seconds (time.process_time), for a machine shared with other jobs",
    )
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    n = args.responses // args.prompts
    cfg = validate(
        load_config(
            args.config,
            [
                "data.eval=null",
                "log.tensorboard=false",
                "checkpoint.every=0",
                "log.out_dir=/tmp/alpha_from_hidden_runs",
                f"train.prompts_per_step={args.prompts}",
                f"rollout.n={n}",
                f"rollout.max_new_tokens={args.tokens}",
                *args.overrides,
            ],
        )
    )
    trainer = build_trainer(cfg)
    examples = trainer.data.next_batch()
    prompts = [e.prompt for e in examples]
    params = dataclasses.replace(sampling_params(cfg, 1), ignore_eos=True)
    hidden_params = dataclasses.replace(params, keep_hidden=True)
    kept_params = dataclasses.replace(params, keep_distributions=True)
    tau = params.temperature if params.temperature > 0 else 1.0
    dtype = learner_compute_dtype(cfg.model, trainer.learner)
    weight = lm_head_weight(trainer.learner).to(dtype)
    kept_fits = exact.distributions_fit(args.responses, args.tokens, weight.shape[0], args.kept_mib)
    report = {
        "command": "python3 experiments/mismatch/alpha_from_hidden.py "
        + " ".join(
            [args.config, *args.overrides]
            + [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("config", "overrides")]
        ),
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "sampler_dtype": str(trainer.engine.dtype).removeprefix("torch."),
        "learner_head_dtype": str(dtype).removeprefix("torch."),
        "responses": args.responses,
        "tokens": args.tokens,
        "kept_fits": kept_fits,
        "samplers": {},
    }
    for name in args.samplers.split(","):
        comp = build_compressor("none") if name == "none" else build_compressor(name, kv_budget=args.budget)
        engine = RolloutEngine.from_engine(trainer.engine, comp)
        t0 = time.perf_counter()
        ro = engine.generate(prompts, hidden_params)
        first_s = time.perf_counter() - t0
        batch = rollout_batch(trainer, ro, [0.0] * len(ro.response_ids))
        with learner_autocast(cfg.model, batch.response_ids.device):
            hidden = dense_hidden(trainer.learner, batch, cfg.train.micro_batch_size).to(dtype)
        print(f"{name}: first rollout {first_s:.1f} s, peak RSS {rss_gib():.2f} GiB", flush=True)
        alphas = {}

        def rollout_arm():
            out = engine.generate(prompts, hidden_params)
            assert out.response_ids == ro.response_ids, "the rollout sampled other tokens"

        def hidden_arm():
            alphas["hidden"] = exact.hidden_alpha(engine, ro.hidden, params, hidden, weight, tau, args.chunk)

        def replay_arm():
            alphas["replay"], _ = exact.exact_alpha(engine, ro.prompt_ids, ro.response_ids, params, hidden, weight, tau)

        def kept_arm():  # the rollout keeping q, then α reading it
            out = engine.generate(prompts, kept_params)
            alphas["kept"] = exact.recorded_alpha(out.distributions, hidden, weight, tau)

        wanted = args.arms.split(",")
        arms = {"rollout": rollout_arm, "hidden": hidden_arm, "replay": replay_arm, "kept": kept_arm}
        arms = {k: v for k, v in arms.items() if k == "rollout" or (k in wanted and (k != "kept" or kept_fits))}
        res = time_rounds(
            arms,
            args.rounds,
            clock=time.process_time if args.clock == "process" else time.perf_counter,
            on_run=lambda r, arm, sec, _: print(f"{name} round {r + 1}: {arm} {sec:.2f} s", flush=True),
        )
        mask = batch.response_mask.cpu().bool()
        entry = {
            "seconds": res.seconds,
            "alpha_over_rollout": {
                arm: statistics.median(res.ratios(arm, "rollout")) for arm in arms if arm != "rollout"
            },
            "alpha_mean": float(alphas["hidden"][mask].mean()),
            "kept_hidden_bytes": sum(x.numel() * x.element_size() for x in ro.hidden),
            "peak_rss_gib": rss_gib(),
        }
        if "replay" in arms:
            diff = (alphas["hidden"] - alphas["replay"])[mask].abs().max()
            entry["max_abs_alpha_diff_hidden_vs_replay"] = float(diff)
        if "kept" in arms:
            entry["alpha_over_rollout"]["kept"] = statistics.median(
                [(k - r) / r for k, r in zip(res.seconds["kept"], res.seconds["rollout"])]
            )
            entry["max_abs_alpha_diff_hidden_vs_kept"] = float((alphas["hidden"] - alphas["kept"])[mask].abs().max())
        report["samplers"][name] = entry
        print(name, json.dumps(entry["alpha_over_rollout"]), f"peak RSS {rss_gib():.2f} GiB", flush=True)
        alphas.clear()  # this sampler's α; its rollout and p's hidden states go with the next sampler's
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
