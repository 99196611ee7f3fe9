"""Run a comparison's runs one at a time, resumably.

Each :class:`~sparserl.compare.arms.RunSpec` is an ordinary training run in its own folder. Its
state decides what happens:

- ``done``: a complete checkpoint at step ``train.steps`` and metrics for every step 1..steps:
  skipped;
- ``partial``: some metrics or checkpoints (a killed run, or one asked for more steps now):
  ``train(cfg, resume=True, run_dir=...)`` continues from its last complete checkpoint;
- ``new``: nothing yet: ``train(cfg, run_dir=...)``.

:func:`check_existing` runs first, before any training: a folder made with a different config (any
key but ``train.steps`` and the ``log`` section) or holding more steps than asked is an error, so a
comparison never mixes runs of different settings.
"""

from __future__ import annotations

import gc
import inspect
import re
from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, config_to_dict, load_config
from ..runlog import read_metrics
from .arms import CompareError, RunSpec

__all__ = ["DONE", "NEW", "PARTIAL", "check_existing", "checkpoint_step", "config_differences", "run_all", "run_state"]

DONE, PARTIAL, NEW = "done", "partial", "new"
_STEP = re.compile(r"^step-(\d+)$")
#: config keys that may differ between a run folder and the comparison (resume extends a run)
_FREE = ("train.steps", "log.")


def checkpoint_step(run_dir: str | Path) -> int | None:
    """The step of the newest complete checkpoint of a run (None when there is none)."""
    from ..train.checkpoint import latest_checkpoint

    ck = latest_checkpoint(run_dir)
    m = _STEP.match(ck.name) if ck is not None else None
    return int(m.group(1)) if m else None


def _logged_steps(run_dir: Path) -> set[int]:
    return {int(r["step"]) for r in read_metrics(run_dir) if isinstance(r.get("step"), int)}


def run_state(spec: RunSpec) -> str:
    """``done``, ``partial`` or ``new`` (module docstring)."""
    run = spec.run_dir
    steps = spec.cfg.train.steps
    logged = _logged_steps(run)
    ck = checkpoint_step(run)
    if ck == steps and set(range(1, steps + 1)) <= logged:
        return DONE
    if logged or ck is not None or (run / "checkpoints").is_dir():
        return PARTIAL
    return NEW


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and prefix == "":
            out.update(_flat(v, f"{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(saved: dict, wanted: dict) -> list[str]:
    """``key: saved -> wanted`` for each top-level field that differs (``train.steps`` and ``log.*``
    excepted)."""
    a, b = _flat(saved), _flat(wanted)
    out = []
    for key in sorted(set(a) | set(b)):
        if key.startswith(_FREE[1]) or key == _FREE[0]:
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def check_existing(specs: list[RunSpec]) -> dict[str, str]:
    """Each run's state; a :class:`CompareError` listing every existing run folder that does not fit
    this comparison (another config, or more steps than ``train.steps``)."""
    states, errors = {}, []
    for spec in specs:
        state = run_state(spec)
        states[spec.name] = state
        if state == NEW:
            continue
        steps = spec.cfg.train.steps
        have = max([*_logged_steps(spec.run_dir), checkpoint_step(spec.run_dir) or 0])
        if have > steps:
            errors.append(
                f"{spec.run_dir} already holds {have} steps, more than train.steps={steps} of this "
                f"comparison: give --steps {have} (or more), or another --out"
            )
        saved_path = spec.run_dir / "config.yaml"
        if saved_path.is_file():
            try:
                saved = config_to_dict(load_config(saved_path))
            except ConfigError as e:
                errors.append(f"{saved_path} does not read as a config ({e}); remove the run folder to run it again")
                continue
            diff = config_differences(saved, config_to_dict(spec.cfg))
            if diff:
                errors.append(
                    f"{spec.run_dir} was trained with another config than arm '{spec.arm.name}' asks "
                    f"now ({'; '.join(diff[:6])}{'; ...' if len(diff) > 6 else ''}): use another "
                    f"--out, or remove that folder to run it again"
                )
    if errors:
        raise CompareError(
            "run folders that do not fit this comparison (nothing was run):\n  - " + "\n  - ".join(errors)
        )
    return states


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def run_all(specs: list[RunSpec], log: Callable[[str], object] = print) -> dict[str, str]:
    """Run (or resume, or skip) every spec in order; returns ``{run name: done | resumed | trained}``
    where ``done`` means it was finished before this call."""
    from ..train import trainer

    statuses = {}
    for i, spec in enumerate(specs, 1):
        state = run_state(spec)
        head = f"[{i}/{len(specs)}] {spec.name}"
        if state == DONE:
            log(f"{head}: done ({spec.cfg.train.steps} steps), skipped")
            statuses[spec.name] = "done"
            continue
        kw = {}
        if state == PARTIAL:
            # check_existing allowed only train.steps / log.* to differ from the saved config
            if "allow_config_change" in inspect.signature(trainer.train).parameters:
                kw["allow_config_change"] = True
            log(
                f"{head}: resuming in {spec.run_dir} (checkpoint step {checkpoint_step(spec.run_dir) or 0} of "
                f"{spec.cfg.train.steps})"
            )
            trainer.train(spec.cfg, resume=True, run_dir=spec.run_dir, log=log, **kw)
            statuses[spec.name] = "resumed"
        else:
            log(f"{head}: training in {spec.run_dir} ({spec.cfg.train.steps} steps)")
            trainer.train(spec.cfg, run_dir=spec.run_dir, log=log)
            statuses[spec.name] = "trained"
        _free_memory()
    return statuses
