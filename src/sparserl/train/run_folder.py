"""The run folder: where a run lives, whether a folder holds one, which run ``--resume`` continues,
whether its config may change, and the record of every config it ran with.

``config.yaml`` is the config a run started with and is never overwritten; a resume with a changed
config (``--allow-config-change``) adds ``config-resume-<step>.yaml``. Keys that cannot change a
run's past (``RESUME_FREE_KEYS``: more ``train.steps``, logging, checkpoint frequency) may change
freely; any other change is refused with the list of keys, old -> new. A run folder that has
checkpoints but no recorded config is refused too, before anything loads: the config its weights were
trained with is unknown, and a default one would fail later on a weight mismatch without saying why.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .. import runlog as names
from ..config import Config, ConfigError, config_to_dict, load_config, save_config
from ..data import DataError
from ..errors import SparserlError
from .checkpoint import complete_checkpoints


@contextmanager
def naming_data_key(key: str, value: str):
    """A :class:`DataError` inside names the config key it came from (``data.train='x.jsonl': ...``)."""
    try:
        yield
    except DataError as e:
        raise type(e)(f"{key}={value!r}: {e}") from None


class ResumeError(SparserlError, ValueError):
    """A run that cannot be started or resumed as asked: no such run folder, a config that differs from
    the run's, fewer steps than the run already has, or a fresh run into a folder that holds one."""


RESUME_FREE_KEYS = names.RESUME_FREE_KEYS
CONFIG_FILE = names.CONFIG_FILE
_RESUME_CONFIG = re.compile(r"^config-resume-(\d+)(?:-(\d+))?\.yaml$")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def resolve_run_dir(cfg: Config, run_dir: str | None) -> Path:
    if run_dir:
        return Path(run_dir)
    name = cfg.log.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.name}"
    return Path(cfg.log.out_dir) / name


def holds_run(path: str | Path) -> bool:
    """True when ``path`` is a run folder that has started: metrics or checkpoints (a ``config.yaml``
    alone is a run that never finished building)."""
    p = Path(path)
    metrics = p / names.METRICS_FILE
    return (metrics.is_file() and metrics.stat().st_size > 0) or (p / "checkpoints").is_dir()


def is_run_folder(path: str | Path) -> bool:
    """True when ``path`` holds a run (``config.yaml``, ``metrics.jsonl`` or ``checkpoints/``)."""
    p = Path(path)
    return p.is_dir() and (
        (p / CONFIG_FILE).is_file() or (p / names.METRICS_FILE).is_file() or (p / "checkpoints").is_dir()
    )


#: keys that recorded configs may lack, with the value a run without the key ran with (a recorded config
#: lacking one reads as that value, not as the key's default): a config without model.mixed_precision
#: computed the learner in its own dtype
LATER_KEYS = {"model.mixed_precision": "off"}


def load_recorded_config(path: Path, overrides: list[str] | tuple = ()) -> Config:
    """A run's recorded config, ``overrides`` on top; a key of :data:`LATER_KEYS` it lacks takes the
    value the run ran with."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        raw = {}  # load_config names the problem
    missing = []
    for key, value in LATER_KEYS.items():
        section, name = key.split(".")
        if isinstance(raw, dict) and isinstance(raw.get(section), dict) and name not in raw[section]:
            missing.append(f"{key}={value}")
    return load_config(path, [*missing, *overrides])


def recorded_configs(run_dir: str | Path) -> list[Path]:
    """Every config a run ran with, oldest first: ``config.yaml`` (the first, never overwritten), then
    ``config-resume-<step>.yaml`` for each resume with a changed config (<step>: where it resumed)."""
    run = Path(run_dir)
    out = [run / CONFIG_FILE] if (run / CONFIG_FILE).is_file() else []
    later = [
        (int(m.group(1)), int(m.group(2) or 1), p)
        for p in run.glob("config-resume-*.yaml")
        if (m := _RESUME_CONFIG.match(p.name))
    ]
    return out + [p for *_, p in sorted(later)]


def _last_written(run: Path) -> float:
    files = [
        run / names.METRICS_FILE,
        *recorded_configs(run),
        run / "checkpoints" / "latest",
        *(run / "checkpoints").glob("step-*"),
    ]
    return max((f.stat().st_mtime for f in files if f.exists()), default=run.stat().st_mtime)


def newest_run(out_dir: str | Path) -> Path | None:
    """The run folder under ``out_dir`` written last (metrics, configs, checkpoints), or None."""
    root = Path(out_dir)
    runs = [p for p in root.iterdir() if is_run_folder(p)] if root.is_dir() else []
    return max(runs, key=_last_written) if runs else None


def find_resume_folder(cfg: Config, run_dir: str | Path | None, log=print, *, config_from_run: bool = False) -> Path:
    """The run folder ``--resume`` continues: ``run_dir``; else ``log.out_dir/log.run_name`` when the
    config names the run; else the newest run under ``log.out_dir`` (logged). It must exist and hold a
    run: a :class:`ResumeError` says what is missing. ``config_from_run``: the caller resumes with the
    run's own recorded config (no config was given), so a run that has a checkpoint but no recorded
    config is refused here, naming the missing file, before any config is validated or model loaded."""
    if run_dir is None and not cfg.log.run_name:
        run = newest_run(cfg.log.out_dir)
        if run is None:
            raise ResumeError(
                f"--resume without --run-dir: no run folder under log.out_dir={cfg.log.out_dir} to "
                "resume; give the run with --run-dir DIR (or drop --resume to start a new run)"
            )
        log(f"resuming the newest run under {cfg.log.out_dir}: {run}")
        if config_from_run:
            _refuse_missing_config(run)
        return run
    run = resolve_run_dir(cfg, str(run_dir) if run_dir else None)
    what = f"--run-dir {run}" if run_dir else f"log.out_dir/log.run_name {run}"
    if not run.exists():
        raise ResumeError(
            f"--resume: {what} does not exist, there is no run to resume (drop --resume to start a new run there)"
        )
    if not is_run_folder(run):
        raise ResumeError(
            f"--resume: {what} is not a run folder (no {CONFIG_FILE}, {names.METRICS_FILE} or checkpoints/)"
        )
    if config_from_run:
        _refuse_missing_config(run)
    return run


def _refuse_missing_config(run: Path) -> None:
    """Raise :class:`ResumeError` when ``run`` has a complete checkpoint but no recorded config: the config its
    weights were trained with is unknown, and another would fail later on a weight mismatch without saying why."""
    checkpoints = complete_checkpoints(run)
    if checkpoints and not recorded_configs(run):
        raise ResumeError(
            f"--resume: {run / CONFIG_FILE} is missing, so the config that {run} (checkpoint {checkpoints[0].name}) "
            f"ran with is unknown and another one would not fit its weights; pass the config it ran with "
            f"explicitly: sparserl train CONFIG [key=value ...] --resume --run-dir {run} --allow-config-change"
        )


def _flat(d: dict) -> dict:
    """``section.key -> value`` (a top-level scalar such as ``name`` keeps its key)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def resume_free(key: str) -> bool:
    """True for a key that may change on resume (:data:`RESUME_FREE_KEYS`)."""
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUME_FREE_KEYS)


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """``(section.key, old, new)`` for every key whose value differs between two config dicts."""
    a, b = _flat(old), _flat(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_resume_config(run: Path, cfg: Config, allow_config_change: bool = False) -> list[tuple[str, Any, Any]]:
    """Compare ``cfg`` with the config the run last ran with (its newest recorded config); returns the
    changes. A change of a key outside :data:`RESUME_FREE_KEYS` raises :class:`ResumeError` listing
    each such key with its old and new value, unless ``allow_config_change``. A run that has a complete
    checkpoint but no recorded config (``config.yaml`` deleted or never copied) raises :class:`ResumeError`
    naming the missing file, unless ``allow_config_change`` says that ``cfg`` is the run's config, given
    explicitly (it is then recorded as the run's ``config.yaml``)."""
    recorded = recorded_configs(run)
    if not recorded:
        if not allow_config_change:
            _refuse_missing_config(run)
        return []
    try:
        old = config_to_dict(load_recorded_config(recorded[-1]))
    except ConfigError as e:
        if allow_config_change:
            return [("config", str(recorded[-1]), "(unreadable)")]
        raise ResumeError(
            f"--resume: the run's recorded config {recorded[-1]} does not read ({e}); pass "
            "--allow-config-change to resume with this config anyway"
        ) from None
    changes = config_changes(old, config_to_dict(cfg))
    blocked = [c for c in changes if not resume_free(c[0])]
    if blocked and not allow_config_change:
        lines = "\n  - ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in blocked)
        raise ResumeError(
            f"--resume: the config differs from the one {run} ran with ({recorded[-1]}):\n  - {lines}\n"
            f"Resume with the run's own values, or pass --allow-config-change to go on with the new ones (the "
            f"new config is then kept as config-resume-<step>.yaml next to {CONFIG_FILE}). Keys that may change "
            f"freely: {', '.join(RESUME_FREE_KEYS)}."
        )
    return changes


def record_config(
    run: Path, cfg: Config, step: int, changes: list, resume: bool, notes: list[str] | tuple = ()
) -> Path | None:
    """Keep every config the run ran with: a new run writes ``config.yaml`` (over one left by a run that
    never took a step); a resume writes it when the run has none, else ``config-resume-<step>.yaml``
    when this config differs from the last one, and never overwrites ``config.yaml``."""
    if not resume or not recorded_configs(run):
        return save_config(cfg, run / CONFIG_FILE, notes)
    if not changes:
        return None
    path, k = run / f"config-resume-{step}.yaml", 1
    while path.exists():
        k += 1
        path = run / f"config-resume-{step}-{k}.yaml"
    return save_config(cfg, path, notes)


def checkpoint_step(path: Path | None) -> int | None:
    m = _STEP_DIR.match(path.name) if path is not None else None
    return int(m.group(1)) if m else None
