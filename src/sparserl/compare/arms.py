"""Arms of a comparison and their expansion into runs (arm × seed).

An arm is a set of config overrides (or another preset as the config) applied on top of the
comparison's ``CONFIG [key=value ...]``. ``--arms`` names them, comma-separated:

- a built-in arm (:data:`BUILTIN_ARMS`): ``base`` (the config as given), ``dense`` (full KV cache,
  no correction), ``sparse_naive`` (the config's compressed sampler, no correction), ``sparse_rl``
  (the config's compressed sampler with Sparse-RL's correction);
- a preset, ``preset:<name>`` or just ``<name>`` when no built-in arm has that name
  (``sparserl.config.list_presets()``): that preset is the arm's CONFIG, the comparison's overrides
  still apply on top;
- a user's own arm, ``NAME=key=value;key=value``, e.g. ``tight=rollout.kv_budget=16;algorithm.correction=tis``,
  or a variant of a preset, ``NAME=preset:<name>;key=value``, e.g.
  ``loose=preset:default;rollout.kv_controller.threshold=0.7`` (the preset is its CONFIG, then the
  comparison's overrides, then its own).

Commas and semicolons inside brackets or quotes do not split (``c=algorithm.correction=[tis,mis]``).

:func:`expand` turns arms × seeds into :class:`RunSpec` s, one run folder ``<arm>-seed<k>`` each with
``train.seed=<k>``, and builds and validates every run's full config first: every problem of every
arm comes back in one :class:`CompareError` naming the arm, before any run starts.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config, ConfigError, list_presets, load_config, validate
from ..errors import SparserlError
from ..registry import did_you_mean

__all__ = [
    "Arm",
    "BUILTIN_ARMS",
    "CompareError",
    "RunSpec",
    "expand",
    "parse_arm",
    "parse_arms",
    "resolve_seeds",
    "run_name",
    "split_top_level",
]

#: name -> (overrides, what the arm is)
BUILTIN_ARMS: dict[str, tuple[tuple[str, ...], str]] = {
    "base": ((), "the config as given"),
    # the controller steers a compressor's budgets: with none it has nothing to steer
    "dense": (
        ("rollout.compressor=none", "rollout.kv_controller=null", "algorithm.correction=none"),
        "full KV cache, no correction",
    ),
    "sparse_naive": (("algorithm.correction=none",), "the config's compressed sampler, no correction"),
    "sparse_rl": (("algorithm.correction=sparse_rl",), "the config's compressed sampler, Sparse-RL correction"),
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class CompareError(SparserlError, ValueError):
    """Bad input to ``sparserl compare`` (an arm, an option, a run folder); found before any run starts."""


@dataclass(frozen=True)
class Arm:
    """One arm: ``overrides`` applied after the comparison's own; ``config`` (a preset or YAML path)
    replaces the comparison's CONFIG when set."""

    name: str
    overrides: tuple[str, ...] = ()
    config: str | None = None
    description: str = ""

    def spec(self) -> str:
        """How the arm reads on a command line."""
        if self.config is not None:
            if not self.overrides and self.name == Path(self.config).stem:
                return f"preset:{self.config}"
            return f"{self.name}={';'.join((f'preset:{self.config}', *self.overrides))}"
        if self.name in BUILTIN_ARMS and self.overrides == BUILTIN_ARMS[self.name][0]:
            return self.name
        return f"{self.name}={';'.join(self.overrides)}"


def split_top_level(text: str, sep: str) -> list[str]:
    """Split ``text`` at ``sep`` outside brackets, braces, parentheses and quotes; strip the parts."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _known() -> list[str]:
    return [*BUILTIN_ARMS, *(p for p in list_presets() if p not in BUILTIN_ARMS)]


def _preset(preset: str, arm: str) -> str:
    """``preset`` when it names a preset, else a CompareError naming the arm, with a did-you-mean hint."""
    if preset not in list_presets():
        raise CompareError(
            f"arm '{arm}': no preset named '{preset}'{did_you_mean(preset, list_presets())}; "
            f"presets: {', '.join(list_presets())}"
        )
    return preset


def parse_arm(item: str) -> Arm:
    """One ``--arms`` item: a built-in arm, ``preset:<name>`` / a preset name, ``NAME=key=value;...`` or
    ``NAME=preset:<name>;key=value;...``."""
    item = item.strip()
    if not item:
        raise CompareError("--arms: an empty arm (two commas in a row, or a trailing comma)")
    if item.startswith("preset:"):
        preset = _preset(item.removeprefix("preset:").strip(), item)
        return Arm(preset, (), preset, f"preset {preset}")
    if "=" in item:
        name, rest = item.split("=", 1)
        name = name.strip()
        if not _NAME.match(name):
            hint = (
                (
                    " (it looks like an override: give overrides shared by all arms after CONFIG, or name "
                    "the arm: NAME=key=value;key=value)"
                )
                if "." in name
                else ""
            )
            raise CompareError(
                f"arm '{item}': '{name}' is not a valid arm name (letters, digits, '_' and '-'; "
                f"it names the run folders){hint}"
            )
        overrides = tuple(o.strip() for o in split_top_level(rest, ";") if o.strip())
        preset = None
        if overrides and overrides[0].startswith("preset:"):  # NAME=preset:<p>;key=value: a variant of a preset
            preset = _preset(overrides[0].removeprefix("preset:").strip(), name)
            overrides = overrides[1:]
        if not overrides and preset is None:
            raise CompareError(f"arm '{item}': no overrides after '{name}='; write {name}=key=value;key=value")
        bad = [o for o in overrides if "=" not in o]
        if bad:
            where = " (a preset goes first: NAME=preset:<name>;key=value)" if bad[0].startswith("preset:") else ""
            raise CompareError(
                f"arm '{name}': '{bad[0]}' is not of the form section.key=value "
                f"(separate an arm's overrides with ';', arms with ','){where}"
            )
        return Arm(name, overrides, preset, f"preset {preset}, user-defined" if preset else "user-defined")
    if item in BUILTIN_ARMS:
        overrides, what = BUILTIN_ARMS[item]
        return Arm(item, overrides, None, what)
    if item in list_presets():
        return Arm(item, (), item, f"preset {item}")
    raise CompareError(
        f"unknown arm '{item}'{did_you_mean(item, _known())}; built-in arms: "
        f"{', '.join(BUILTIN_ARMS)}; presets: {', '.join(list_presets())} (or preset:<name>); "
        "or define one as NAME=key=value;key=value (NAME=preset:<name>;key=value: a variant of a preset)"
    )


def parse_arms(spec: str | Arm | Iterable[str | Arm]) -> list[Arm]:
    """``--arms`` (a comma-separated string, or several of them, or Arm objects) as a list of arms;
    names must be unique and there must be at least one."""
    items: list[str | Arm] = [spec] if isinstance(spec, (str, Arm)) else list(spec)
    arms: list[Arm] = []
    for it in items:
        if isinstance(it, Arm):
            arms.append(it)
        else:
            arms += [parse_arm(x) for x in split_top_level(it, ",")]
    if not arms:
        raise CompareError("--arms: no arms given (e.g. --arms dense,sparse_naive,sparse_rl)")
    seen: set[str] = set()
    dup = [a.name for a in arms if a.name in seen or seen.add(a.name)]
    if dup:
        raise CompareError(
            f"--arms: arm '{dup[0]}' is given twice; arm names must be unique (they name the run "
            "folders); name a variant yourself as NAME=key=value;key=value"
        )
    return arms


def resolve_seeds(seeds: int | Sequence[int] | str | None, seed_list: Sequence[int] | str | None = None) -> list[int]:
    """The seeds: ``seed_list`` (e.g. ``"0,1,2"``) when given, else ``0 .. seeds-1``."""
    if seed_list is not None and not isinstance(seed_list, str) and not list(seed_list):
        seed_list = ""
    if seed_list is not None:
        if isinstance(seed_list, str):
            try:
                out = [int(s) for s in seed_list.split(",") if s.strip()]
            except ValueError:
                raise CompareError(
                    f"--seed-list {seed_list!r}: expected comma-separated integers, e.g. 0,1,2"
                ) from None
        else:
            out = [int(s) for s in seed_list]
        if not out:
            raise CompareError("--seed-list: no seeds given (e.g. --seed-list 0,1,2)")
        if len(set(out)) != len(out):
            raise CompareError(f"--seed-list {','.join(map(str, out))}: a seed is given twice")
        return out
    if isinstance(seeds, (list, tuple)):
        return resolve_seeds(None, list(seeds))
    if isinstance(seeds, bool) or not isinstance(seeds, int):
        raise CompareError(f"--seeds {seeds!r}: expected a whole number >= 1 (runs per arm)")
    if seeds < 1:
        raise CompareError(f"--seeds {seeds}: must be >= 1 (runs per arm, with train.seed = 0 .. seeds-1)")
    return list(range(seeds))


def run_name(arm: str, seed: int) -> str:
    """The run folder name of an arm's seed: ``<arm>-seed<k>``."""
    return f"{arm}-seed{seed}"


@dataclass
class RunSpec:
    """One run of a comparison: an ordinary training run in ``run_dir``."""

    arm: Arm
    seed: int
    name: str
    run_dir: Path
    config: str
    overrides: tuple[str, ...]
    cfg: Config = field(repr=False)

    def command(self) -> str:
        """The ``sparserl train`` command that makes (or resumes, with ``--resume``) this run."""
        return shlex.join(["sparserl", "train", self.config, *self.overrides, "--run-dir", str(self.run_dir)])


def _indent(msg: str) -> str:
    return msg.replace("\n", "\n    ")


def expand(
    config: str | Path | None,
    overrides: Sequence[str],
    arms: Sequence[Arm] | str,
    seeds: int | Sequence[int],
    steps: int | None = None,
    runs_dir: str | Path = "runs",
) -> list[RunSpec]:
    """Every arm × seed as a :class:`RunSpec` (arm-major order), each config built and validated.

    Overrides of a run, in order: the comparison's ``overrides``, the arm's, ``train.steps=<steps>``
    (when given), ``train.seed=<seed>``. Raises one :class:`CompareError` listing every arm whose
    config fails (``load_config`` + ``validate``)."""
    arms = parse_arms(arms)
    seed_values = resolve_seeds(seeds)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise CompareError(f"--steps {steps!r}: must be a whole number >= 1 (train.steps of every run)")
    config = str(config) if config is not None else "default"
    overrides = tuple(overrides)
    try:  # the shared part first: a bad CONFIG or override is one error, not one per arm
        load_config(config, overrides)
    except ConfigError as e:
        raise CompareError(f"CONFIG {config} with the overrides given: {_indent(str(e))}") from None
    specs, errors = [], []
    for arm in arms:
        src = arm.config or config
        for seed in seed_values:
            over = (
                *overrides,
                *arm.overrides,
                *([f"train.steps={steps}"] if steps is not None else []),
                f"train.seed={seed}",
            )
            try:
                cfg = validate(load_config(src, over))
            except ConfigError as e:
                errors.append(f"arm '{arm.name}' ({arm.spec()}): {_indent(str(e))}")
                break  # the seed does not change what is wrong
            name = run_name(arm.name, seed)
            specs.append(RunSpec(arm, seed, name, Path(runs_dir) / name, src, over, cfg))
    if errors:
        head = "an arm's config is invalid" if len(errors) == 1 else f"{len(errors)} arms' configs are invalid"
        raise CompareError(f"{head} (nothing was run):\n  - " + "\n  - ".join(errors))
    return specs
