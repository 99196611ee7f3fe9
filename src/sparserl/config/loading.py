"""Reading a configuration: YAML files, presets with ``base:`` chains, merging, dotted overrides; and
writing the resolved config back.

    cfg = load_config("default")                                # a preset in sparserl/configs/
    cfg = load_config("my_run.yaml", ["rollout.kv_budget=64", 'rollout.stop=["\\n\\n"]',
                                      "rollout.compressor_options.lam=0.1"])  # file + overrides
    save_config(cfg, run_dir / "config.yaml")                   # the run records what it ran

A file may start with ``base: <preset name or path>``: the base is loaded first and the file's keys
merge over it (mappings key by key, anything else replaces). Values follow YAML with two YAML 1.2
fixes: ``1e-5`` is a float and only ``true``/``false`` are booleans (``yes``/``on`` stay strings).
Every bad value of a file and its overrides goes into one :class:`~sparserl.config.messages.ConfigError`.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import ValidationError

from ..registry import did_you_mean
from .messages import ConfigError, fail, messages
from .schema import SECTIONS, Config, field_at, strip_annotated, subsection

__all__ = [
    "PRESET_DIR",
    "list_presets",
    "preset_path",
    "load_config",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "config_yaml",
    "save_config",
    "build",
]

#: the shipped presets (package data: sparserl/configs/*.yaml)
PRESET_DIR = Path(__file__).resolve().parents[1] / "configs"


def list_presets() -> list[str]:
    """Names of the presets shipped in ``sparserl/configs/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def build(data: dict, source_of: Callable[[str], str], errors: Iterable[str] = ()) -> Config:
    """The Config from a nested dict (no ``base``; an empty section is left out), or one ConfigError."""
    errors = list(errors)
    data = {k: v for k, v in data.items() if k != "base" and not (v is None and k in SECTIONS)}
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        errors += messages(e, source_of, data)
    if errors:
        fail(errors)
    return cfg


# --- YAML with YAML-1.2 floats and booleans ------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader where ``1e-5`` is a float and only true/false are booleans."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass


# --- loading: presets, files with `base:`, overrides ---------------------------------------------
def preset_path(name: str) -> Path:
    """Path of the preset ``name`` (with or without ``.yaml``); ConfigError if there is none."""
    stem = name.removesuffix(".yaml")
    if (p := PRESET_DIR / f"{stem}.yaml").is_file():
        return p
    presets = list_presets()
    raise ConfigError(
        f"no config file or preset named '{name}'{did_you_mean(stem, presets)}; presets: {', '.join(presets)}"
    )


def _find(path_or_name: str | Path, relative_to: Path | None = None) -> Path:
    p = Path(path_or_name).expanduser()
    for c in [p] if p.is_absolute() else ([relative_to / p] if relative_to else []) + [p]:
        if c.is_file():
            return c.resolve()
    return preset_path(str(path_or_name))


def _merge(base: dict, over: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: circular 'base' chain: {' -> '.join(map(str, (*seen, path)))}")
    try:
        data = _yaml_load(path.read_bytes().decode("utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} line {line}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); a config is a YAML file"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    if (base := data.pop("base", None)) is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' expects a preset name or a path, got {base!r}")
        base_raw = _load_raw(_find(base, path.parent), (*seen, path))
        base_raw.pop("name", None)  # the name is the leaf file's
        data = _merge(base_raw, data)
    return data


def _takes_str(ann: Any) -> bool:
    return ann is str or (typing.get_origin(ann) is Union and str in map(strip_annotated, typing.get_args(ann)))


def _apply_override(data: dict, item: str) -> str:
    """Set one ``a.b.c=value`` in the nested dict ``data``; returns the dotted key of the field."""
    if "=" not in item:
        raise ConfigError(f"override: '{item}' is not of the form section.key=value")
    key, text = item.split("=", 1)
    parts = (key := key.strip().removeprefix("--")).split(".")
    if not all(parts):
        raise ConfigError(f"override: '{item}' has an empty key")
    try:
        value = _yaml_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text  # e.g. "a: b: c" is not YAML: keep the text
    n = 2 if len(parts) > 1 and parts[0] in SECTIONS else 1
    info = field_at(tuple(parts[:n]))
    if len(parts) > n and subsection(info) is not None:  # a sub-section's key: rollout.kv_controller.threshold
        n += 1
        info = field_at(tuple(parts[:n]))  # None for an unknown key: validation names it, with a hint
    ann = strip_annotated(info.annotation) if info else None
    if len(parts) == 1 and key in SECTIONS:  # section={...} merges into the section
        if not isinstance(value, dict):
            raise ConfigError(f"override: '{key}' is a section; set one key as '{key}.key=value'")
        value = {**(data.get(key) or {}), **{str(k): v for k, v in value.items()}}
    elif len(parts) > n and info is not None and typing.get_origin(ann) is not dict:
        raise ConfigError(f"override: '{'.'.join(parts[:n])}' is not a mapping; cannot set '{key}'")
    elif len(parts) == n and type(value) in (bool, int, float) and _takes_str(ann):
        value = text.strip()  # a string field given what YAML reads as a number (run_name=007): the text
    node = data
    for p in parts[:-1]:
        node[p] = node = dict(node[p]) if isinstance(node.get(p), dict) else {}
    node[parts[-1]] = value
    return ".".join(parts[:n])


def _with_overrides(data: dict, overrides: Iterable[str], source: str | None) -> Config:
    """Apply overrides to a nested dict and build the Config: every problem in one ConfigError."""
    touched, errors = set(), []
    in_file = {
        f"{name}.{key}"
        for name, section in data.items()
        if isinstance(section, dict)
        for key, value in section.items()
        if isinstance(value, dict)
    }  # the file's sub-sections
    for item in [overrides] if isinstance(overrides, str) else overrides:
        try:
            touched.add(_apply_override(data, item))
        except ConfigError as e:
            errors.append(str(e))

    def source_of(key: str) -> str:  # an override of the key or of a section holding it, or of a
        parts = key.split(".")  # sub-section key when the file has no such sub-section
        overridden = any(".".join(parts[:i]) in touched for i in range(1, len(parts) + 1))
        sub = ".".join(parts[:2])
        created = len(parts) == 3 and sub not in in_file and any(t.startswith(sub + ".") for t in touched)
        return "override" if source is None or overridden or created else source

    return build(data, source_of, errors)


def load_config(path_or_name: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config from a YAML file or a preset name, then apply dotted overrides.

    ``path_or_name``: a path to a YAML file, a preset name (``default``, ``sparse_rl_math``,
    ``dense``, ``sparse_naive``; see ``list_presets()``), or None for ``default``.
    ``overrides``: strings ``section.key=value`` (value read with YAML rules), e.g.
    ``rollout.kv_budget=64``, ``algorithm.clip_eps_high=null``, ``rollout.compressor_options.lam=0.1``.

    One ConfigError lists every bad value of the file and the overrides; the cross-field rules are
    ``validate``'s, which the caller runs once every override is in.
    """
    path = _find(path_or_name if path_or_name is not None else "default")
    raw = _load_raw(path)
    raw.setdefault("name", path.stem)
    return _with_overrides(raw, overrides, str(path))


def config_from_dict(data: dict | None, source: str = "dict") -> Config:
    """A Config from a nested mapping (missing keys keep their defaults); one ConfigError naming ``source``
    lists every unknown key and bad value."""
    return build(dict(data or {}), lambda _key: source)


def apply_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """Apply ``section.key=value`` strings to ``cfg`` in place (and return it).

    A key under a mapping field (``rollout.compressor_options.lam=0.1``) sets that entry;
    ``section={...}`` merges a mapping into a section; ``name=...`` renames the config.
    """
    cfg.__dict__.update(_with_overrides(config_to_dict(cfg), overrides, None).__dict__)
    return cfg


# --- saving --------------------------------------------------------------------------------------
def config_to_dict(cfg: Config) -> dict:
    """The config as nested plain dicts (tuples become lists): ``Config.from_dict`` reads it back."""
    return cfg.model_dump(mode="json", by_alias=True)


def config_yaml(cfg: Config, notes: list[str] | tuple = (), title: str = "written by save_config") -> str:
    """The full resolved config as YAML text (``load_config`` reads it back unchanged); ``notes`` become
    comment lines at its top."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None, allow_unicode=True, width=100)
    header = "".join(f"# {line}\n" for note in notes for line in str(note).splitlines())
    return f"# Full resolved sparserl config ({title}).\n" + header + text


def save_config(cfg: Config, path: str | Path, notes: list[str] | tuple = ()) -> Path:
    """Write :func:`config_yaml` to ``path``; ``notes``: what ``auto`` values resolved to on this machine,
    and why."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_yaml(cfg, notes))
    return path
