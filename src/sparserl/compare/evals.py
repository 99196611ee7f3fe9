"""``--eval DATA``: each run's final model on a held-out set, under dense and under sparse inference.

For every run, the model of its newest complete checkpoint (``<run>/checkpoints/step-N/model``) is
evaluated with :func:`sparserl.eval.evaluate.evaluate` twice: with the dense cache and with the run's
own compressed sampler (``rollout.*`` of its config). A dense arm has no sampler of its own, so its
"sparse inference" is the comparison's base config's sampler (or, when that is dense too, the first
arm's that compresses): every arm is then read under the same sparse inference, which is what claim
3 (a model trained on sparse rollouts degrades less under sparse inference) compares.

Greedy (temperature 0) by default; the reward is the run's ``reward.fn``; responses up to
``eval.max_new_tokens`` (default ``rollout.max_new_tokens``). Results go to ``<out>/eval/<run>.json``;
a later call with the same checkpoint and settings reads that file instead of evaluating again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..config import Config, RolloutConfig
from .arms import CompareError, RunSpec

__all__ = ["eval_all", "eval_run", "eval_start", "evaluate_model", "sparse_sampler_for", "START"]

#: name prefix of the starting model's evaluations (``start-<compressor>-b<budget>``)
START = "start"

_SAMPLER_KEYS = ("compressor", "kv_budget", "trigger", "step_length", "window", "compress_prompt", "compressor_options")


def _sampler(r: RolloutConfig) -> dict:
    return {k: getattr(r, k) for k in _SAMPLER_KEYS}


def sparse_sampler_for(spec: RunSpec, base: Config | None, specs: list[RunSpec]) -> dict | None:
    """The rollout fields of the sparse inference an arm is evaluated under (module docstring);
    None when no config of the comparison compresses."""
    if spec.cfg.rollout.compressor != "none":
        return _sampler(spec.cfg.rollout)
    if base is not None and base.rollout.compressor != "none":
        return _sampler(base.rollout)
    other = next((s for s in specs if s.cfg.rollout.compressor != "none"), None)
    return _sampler(other.cfg.rollout) if other else None


class _Fields:
    def __init__(self, d: dict):
        self.__dict__.update(d)


def eval_run(
    spec: RunSpec,
    data: str,
    *,
    limit: int | None,
    n: int,
    temperature: float,
    sparse: dict | None,
    out_dir: Path,
    log: Callable[[str], object] = print,
) -> dict:
    """Evaluate one run's final model (or read the cached result); returns the record written to
    ``out_dir/<run>.json``: ``{"run", "arm", "seed", "checkpoint", "step", "settings", "dense": {...},
    "sparse": {...}}`` (each mode: :func:`evaluate`'s figures)."""
    from ..train.checkpoint import latest_checkpoint
    from .runner import checkpoint_step

    ck = latest_checkpoint(spec.run_dir)
    if ck is None:
        raise CompareError(f"--eval: run {spec.run_dir} has no complete checkpoint to evaluate")
    cfg = spec.cfg
    record = {
        "run": spec.name,
        "arm": spec.arm.name,
        "seed": spec.seed,
        "checkpoint": str(ck),
        "step": checkpoint_step(spec.run_dir),
    }
    return evaluate_model(
        str(ck / "model"),
        cfg,
        data,
        limit=limit,
        n=n,
        temperature=temperature,
        sparse=sparse,
        path=out_dir / f"{spec.name}.json",
        record=record,
        log=log,
    )


def evaluate_model(
    model: str,
    cfg: Config,
    data: str,
    *,
    limit: int | None,
    n: int,
    temperature: float,
    sparse: dict | None,
    path: Path,
    record: dict,
    log: Callable[[str], object] = print,
) -> dict:
    """Evaluate ``model`` (a checkpoint's model folder or a model name) dense and under ``sparse``, with
    ``cfg``'s prompts (``data.template``, ``data.system_prompt``: what the run trained on), reward,
    dtype and response length; ``record`` plus the results go to ``path`` (read back instead when it
    holds the same model and settings)."""
    settings = {
        "data": data,
        "limit": limit,
        "n": n,
        "temperature": temperature,
        "max_new_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        "reward": cfg.reward.fn,
        "seed": cfg.train.seed,
        "sparse_sampler": sparse,
        "template": cfg.data.template,
        "system_prompt": cfg.data.system_prompt,
    }
    columns = {k: getattr(cfg.data, k) for k in ("prompt_key", "label_key", "eval_prompt_key", "eval_label_key")}
    settings.update({k: v for k, v in columns.items() if v is not None})  # set ones only: older records stay valid
    name = record.get("run", path.stem)
    from ..runlog import EVAL_MODES

    if path.is_file():
        try:
            cached = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            cached = None
        if (
            isinstance(cached, dict)
            and cached.get("checkpoint") == record.get("checkpoint")
            and cached.get("settings") == settings
        ):
            log(f"eval {name}: cached in {path}")
            return cached

    from ..eval.evaluate import evaluate
    from ..models.loading import load_model
    from ..reward.weighted import load_rewards, verifier
    from ..rollout.engine import RolloutEngine
    from ..rollout.kv import build_compressor, compressor_from_fields
    from ..rollout.sampling import SamplingParams
    from ..train.eval_set import load_eval_set

    examples = list(load_eval_set(cfg.data, data, limit=limit))
    lm = load_model(model, dtype=cfg.model.dtype, device=cfg.model.device)
    reward_fn = verifier(load_rewards(cfg.reward.fn, cfg.reward.weights, timeout_s=cfg.reward.timeout_s))
    params = SamplingParams(
        n=n, temperature=temperature, max_new_tokens=settings["max_new_tokens"], seed=cfg.train.seed
    )
    record = {**record, "settings": settings}
    comps = {"dense": build_compressor("none")}
    if sparse is not None:
        comps["sparse"] = compressor_from_fields(_Fields(sparse))
    for mode in EVAL_MODES:
        if mode not in comps:
            continue
        res = evaluate(RolloutEngine(lm, comps[mode], dtype=cfg.rollout.dtype), examples, params, reward_fn)
        res["compressor"] = comps[mode].name
        res["kv_budget"] = sparse["kv_budget"] if mode == "sparse" else None
        record[mode] = res
        log(
            f"eval {name} {mode} ({comps[mode].name}): pass@1 {res['pass@1']:.3f} on "
            f"{res['problems']} problems of {data}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)
    return record


def eval_all(
    specs: list[RunSpec],
    base: Config | None,
    data: str,
    *,
    limit: int | None,
    n: int,
    temperature: float,
    out_dir: Path,
    log: Callable[[str], object] = print,
) -> dict[str, dict]:
    """:func:`eval_run` for every run; ``{run name: record}``."""
    return {
        s.name: eval_run(
            s,
            data,
            limit=limit,
            n=n,
            temperature=temperature,
            sparse=sparse_sampler_for(s, base, specs),
            out_dir=out_dir,
            log=log,
        )
        for s in specs
    }


def eval_start(
    specs: list[RunSpec],
    base: Config | None,
    data: str,
    *,
    limit: int | None,
    n: int,
    temperature: float,
    out_dir: Path,
    log: Callable[[str], object] = print,
) -> dict[str, dict]:
    """The model every run started from (``model.name``), evaluated like the runs' final models: dense and
    under each distinct sparse sampler of the comparison (the reference for what training changed);
    ``{"start-<compressor>-b<budget>": record}`` (``"start"`` when no arm compresses)."""
    out: dict[str, dict] = {}
    for s in specs:
        sparse = sparse_sampler_for(s, base, specs)
        name = f"{START}-{sparse['compressor']}-b{sparse['kv_budget']}" if sparse else START
        if name in out:
            continue
        record = {"run": name, "arm": START, "seed": s.cfg.train.seed, "checkpoint": s.cfg.model.name, "step": 0}
        out[name] = evaluate_model(
            s.cfg.model.name,
            s.cfg,
            data,
            limit=limit,
            n=n,
            temperature=temperature,
            sparse=sparse,
            path=out_dir / f"{name}.json",
            record=record,
            log=log,
        )
    return out
