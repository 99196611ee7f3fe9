"""Held-out evaluation during and at the end of a run, under dense inference and under the sparse sampler
the run trained with: the same compressor, and with the online KV controller (``rollout.kv_controller``)
the per-bin budgets it has reached, not the configured starting budget. Each mode's record names its
sampler (``sampler``: :func:`describe_sampler`), in ``eval-step<N>.json`` and in the log.
"""

from __future__ import annotations

from pathlib import Path

from .. import runlog as names
from ..eval.evaluate import evaluate, write_eval_record
from ..reward.weighted import verifier
from ..rollout.engine import RolloutEngine
from ..rollout.kv import compressor_from_fields, get_compressor
from ..rollout.sampling import SamplingParams
from .eval_set import load_eval_set
from .lora import sampler_state
from .sampler_sync import local_sampler


def describe_sampler(compressor, budgets_from: str) -> str:
    """One line naming a sampler's KV cache: the compressor and its budgets (a schedule's per-bin pairs,
    else the one budget) and where they came from (``budgets_from``)."""
    if not compressor.compresses:
        return "dense KV cache (no compressor)"
    if compressor.schedule is not None:
        budgets = "per-bin budgets " + ", ".join(f"{length}:{budget}" for length, budget in compressor.schedule.pairs)
    else:
        budgets = f"kv_budget {compressor.budget}"
    return f"{compressor.name}, {budgets} ({budgets_from})"


def sparse_compressor(trainer):
    """(the sparse eval's compressor, where its budgets come from): ``eval.compressor`` or the run's
    ``rollout.compressor``; when that is the compressor the online controller steered, its schedule is the
    controller's last (:meth:`~.kv_controller.KVController.schedule`), so the eval runs the sampler the
    run trained with at the end."""
    cfg, e = trainer.cfg, trainer.cfg.eval
    sparse = compressor_from_fields(cfg.rollout, name=e.compressor)
    if trainer.kv_controller is not None and sparse.name == cfg.rollout.compressor:
        sparse.set_schedule(trainer.kv_controller.schedule())
        return sparse, "the KV controller's budgets at this step"
    if e.compressor and e.compressor != cfg.rollout.compressor:
        return sparse, "eval.compressor"
    return sparse, "rollout.kv_schedule" if cfg.rollout.kv_schedule else "rollout.kv_budget"


def held_out_eval(trainer, step: int, run: Path, log=print) -> dict:
    """Held-out pass@1 (avg@n, pass@n) of the current weights under dense and under the run's sparse
    sampler (or ``eval.compressor``; not with ``eval.dense_only``, Sparrow's ``val_dense_only``); written to
    ``eval-step<N>.json`` (each mode with its ``sampler``),
    returned as the step's ``eval/<mode>/<stat>`` metrics."""
    cfg, e = trainer.cfg, trainer.cfg.eval
    examples = list(load_eval_set(cfg.data))  # the same prompt form as training
    params = SamplingParams(
        n=e.n,
        temperature=e.temperature,
        seed=cfg.train.seed,
        max_new_tokens=e.max_new_tokens or cfg.rollout.max_new_tokens,
    )
    sparse, budgets_from = sparse_compressor(trainer)
    results = {}
    for mode, compressor in (("dense", get_compressor("none")), ("sparse", sparse)):
        if mode == "sparse" and (not compressor.compresses or e.dense_only):  # eval.dense_only: Sparrow's
            continue
        sampler = local_sampler(trainer)
        if mode == "dense" and trainer.distill is not None:  # the dense policy is θ's: φ is the sparse sampler's
            sampler.update_weights(sampler_state(trainer.learner))
            trainer.engine_stale = True  # the sparse mode reloads θ + φ
        engine = RolloutEngine.from_engine(sampler, compressor)
        described = describe_sampler(compressor, budgets_from)
        results[mode] = {**evaluate(engine, examples, params, verifier(trainer.reward_fn)), "sampler": described}
        log(
            f"eval step {step} {mode}: pass@1 {results[mode]['pass@1']:.3f} on {len(examples)} problems "
            f"of {cfg.data.eval} ({described})"
        )
    write_eval_record(run, step, cfg.data.eval, results)
    return {
        names.eval_metric(mode, stat): v
        for mode, res in results.items()
        for stat, v in res.items()
        if stat.startswith(("pass@", "avg@"))
    }
