"""A comparison's plan and run: every arm × seed as an ordinary training run, then one comparison
(:func:`compare`, the Python API behind ``sparserl compare``: :mod:`sparserl.commands.compare`).

Everything is checked before the first run starts (:func:`plan`): the arms, the seeds, the steps,
every run's full config, run folders left by an earlier call, the evaluation set, that ``--out`` is
writable; one :class:`~sparserl.compare.arms.CompareError` says what is wrong. Then the runs go one
at a time into ``DIR/runs/<arm>-seed<k>`` (a finished one is skipped, a killed one resumes), the
final models are evaluated with ``--eval``, and ``DIR`` gets the plots, ``comparison.md`` and
``comparison.json`` (``sparserl.compare.report``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .aggregate import COLLAPSE_K3
from .arms import Arm, CompareError, RunSpec, expand, parse_arms, resolve_seeds

__all__ = ["DEFAULT_ARMS", "Plan", "compare", "plan"]

DEFAULT_ARMS = "dense,sparse_naive,sparse_rl"


@dataclass
class Plan:
    """A checked comparison: its runs and their states before this call."""

    out: Path
    config: str
    overrides: list[str]
    arms: list[Arm]
    seeds: list[int]
    specs: list[RunSpec]
    states: dict[str, str]
    base: object  # the base Config (None when it does not validate on its own)
    paired_against: list[str]  # arms every other arm is also compared with seed by seed (besides the dense arm)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as e:
        raise CompareError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _positive(value, option: str, what: str, allow_none: bool = True, integer: bool = True) -> None:
    if value is None and allow_none:
        return
    ok = (
        (isinstance(value, int) and not isinstance(value, bool))
        if integer
        else (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    )
    if not ok or value <= 0:
        raise CompareError(f"{option} {value!r}: must be {'a whole number ' if integer else ''}> 0 ({what})")


def plan(
    config: str | None,
    overrides: Sequence[str] = (),
    arms: str | Sequence[str | Arm] = DEFAULT_ARMS,
    seeds: int | Sequence[int] = 3,
    *,
    out: str | Path,
    seed_list: Sequence[int] | str | None = None,
    steps: int | None = None,
    eval_data: str | None = None,
    eval_limit: int | None = None,
    eval_n: int = 1,
    eval_temperature: float = 0.0,
    collapse_k3: float = COLLAPSE_K3,
    paired_against: str | Sequence[str] | None = None,
) -> Plan:
    """Check everything and expand the runs; nothing is trained or written but ``out`` itself."""
    from ..config import ConfigError, load_config, validate
    from .runner import check_existing

    arm_list = parse_arms(arms)
    references = _references(paired_against, [a.name for a in arm_list])
    seed_values = resolve_seeds(seeds, seed_list)
    _positive(steps, "--steps", "train.steps of every run")
    _positive(eval_limit, "--eval-limit", "problems of the evaluation set")
    _positive(eval_n, "--eval-n", "samples per problem", allow_none=False)
    _positive(
        collapse_k3,
        "--collapse-k3",
        "the k3 KL above which a seed counts as collapsed",
        allow_none=False,
        integer=False,
    )
    if isinstance(eval_temperature, bool) or not isinstance(eval_temperature, (int, float)) or eval_temperature < 0:
        raise CompareError(f"--eval-temperature {eval_temperature!r}: must be >= 0 (0 = greedy)")
    config = str(config) if config is not None else "default"
    out = Path(out)
    specs = expand(config, list(overrides), arm_list, seed_values, steps, out / "runs")
    try:
        base = validate(load_config(config, [*overrides, *([f"train.steps={steps}"] if steps else [])]))
    except ConfigError:
        base = None  # fine when every arm fixes it (e.g. a dense arm of a config with a bad budget)
    states = check_existing(specs)
    if eval_data is not None:
        from ..train.eval_set import load_eval_set

        try:  # read as each run's evaluation will read it (the first run's data section)
            n = len(load_eval_set(specs[0].cfg.data, eval_data, limit=eval_limit))
        except (ValueError, OSError) as e:
            raise CompareError(f"--eval {eval_data}: {e}") from None
        if n == 0:
            raise CompareError(f"--eval {eval_data}: no problems to evaluate")
    _check_out(out)
    return Plan(out, config, list(overrides), arm_list, seed_values, specs, states, base, references)


def _references(paired_against: str | Sequence[str] | None, arm_names: list[str]) -> list[str]:
    """``--paired-against`` (comma-separated arm names, or a list) checked against the arms."""
    from ..registry import did_you_mean

    if paired_against is None:
        return []
    items = paired_against.split(",") if isinstance(paired_against, str) else list(paired_against)
    names = [str(x).strip() for x in items if str(x).strip()]
    if not names:
        raise CompareError("--paired-against: no arm given (e.g. --paired-against sparse_rl)")
    for name in names:
        if name not in arm_names:
            raise CompareError(
                f"--paired-against {name}: not one of this comparison's arms"
                f"{did_you_mean(name, arm_names)}; arms: {', '.join(arm_names)}"
            )
    return list(dict.fromkeys(names))


def compare(
    config: str | None,
    overrides: Sequence[str] = (),
    arms: str | Sequence[str | Arm] = DEFAULT_ARMS,
    seeds: int | Sequence[int] = 3,
    *,
    out: str | Path,
    seed_list: Sequence[int] | str | None = None,
    steps: int | None = None,
    eval_data: str | None = None,
    eval_limit: int | None = None,
    eval_n: int = 1,
    eval_temperature: float = 0.0,
    collapse_k3: float = COLLAPSE_K3,
    command: str | None = None,
    log: Callable[[str], object] = print,
    paired_against: str | Sequence[str] | None = None,
) -> Path:
    """Plan (check everything), run every arm × seed, evaluate (``eval_data``), write the comparison;
    returns the path of ``comparison.md``. Every arm is paired seed by seed with the dense arm, and with each
    arm of ``paired_against``."""
    from .evals import eval_all, eval_start
    from .report import write_comparison
    from .runner import run_all

    p = plan(
        config,
        overrides,
        arms,
        seeds,
        out=out,
        seed_list=seed_list,
        steps=steps,
        eval_data=eval_data,
        eval_limit=eval_limit,
        eval_n=eval_n,
        eval_temperature=eval_temperature,
        collapse_k3=collapse_k3,
        paired_against=paired_against,
    )
    todo = sum(st != "done" for st in p.states.values())
    log(
        f"compare: {len(p.arms)} arms × {len(p.seeds)} seeds = {len(p.specs)} runs in {p.out / 'runs'} "
        f"({len(p.specs) - todo} already done)"
    )
    statuses = run_all(p.specs, log=log)
    evals = starts = None
    if eval_data is not None:
        kw = dict(limit=eval_limit, n=eval_n, temperature=eval_temperature, out_dir=p.out / "eval", log=log)
        starts = eval_start(p.specs, p.base, eval_data, **kw)
        evals = eval_all(p.specs, p.base, eval_data, **kw)
    path = write_comparison(
        p.out,
        p.specs,
        statuses,
        config=p.config,
        overrides=p.overrides,
        seeds=p.seeds,
        collapse_k3=collapse_k3,
        command=command,
        evals=evals,
        eval_data=eval_data,
        starts=starts,
        paired_against=p.paired_against,
    )
    log(f"comparison: {path}")
    return path
