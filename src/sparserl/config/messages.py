"""The configuration's error messages: pydantic's ``ValidationError`` as one line per problem.

Each line names where the value came from (the file, ``override`` or ``assignment``), the dotted key
(``rollout.kv_controller.threshold``), the bad value and what would be valid, with the closest name
for a misspelt key or choice. Several problems are listed together in one :class:`ConfigError`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

from pydantic import ValidationError

from ..errors import SparserlError
from ..registry import did_you_mean
from . import schema
from .schema import SECTIONS, Config, field_at, fields_of, strip_annotated, subsection, type_name

__all__ = ["ConfigError", "messages", "fail"]


class ConfigError(SparserlError, ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def messages(err: ValidationError, source_of: Callable[[str], str], data: dict, prefix: tuple = ()) -> list[str]:
    """One line per problem: ``<source>: <key>=<value>: <what is valid>``; ``source_of(key)`` names where the
    key's value came from, ``data`` is the mapping validated, ``prefix`` the location of a section validated alone."""
    out: list[str] = []
    for e in err.errors():
        loc = (*prefix, *e["loc"])
        n = 2 if len(loc) > 1 and loc[0] in SECTIONS else 1
        if n == 2 and len(loc) > 2 and isinstance(loc[2], str) and subsection(field_at(loc[:2])) is not None:
            n = 3  # a sub-section's key: rollout.kv_controller.threshold
        key = ".".join(map(str, loc[:n]))
        full = key + "".join(f"[{p}]" for p in loc[n:] if isinstance(p, int))
        src, kind, value, info = source_of(key), e["type"], e["input"], field_at(loc[:n])
        if kind == "extra_forbidden":
            sec = ".".join(map(str, loc[: n - 1])) if n >= 2 else None
            valid = list(fields_of(subsection(field_at(loc[:2])) if n == 3 else SECTIONS[sec] if sec else Config))
            hint = did_you_mean(loc[n - 1], valid)
            hint = hint.replace("'", f"'{sec}.", 1) if hint and sec else hint  # the dotted key
            out.append(
                f"{src}: unknown {'key' if sec else 'section'} '{key}'" + (hint or f"; valid: {', '.join(valid)}")
            )
        elif kind in _BOUNDS:
            bound = e["ctx"][_BOUNDS[kind][0]]
            bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
            out.append(f"{src}: {full}={value!r}: must be {_BOUNDS[kind][1]} {bound}")
        elif kind == "literal_error":
            valid = _choices(info.annotation)
            words = [v for v in valid if v not in ("bool", "int", "float", "str", "null")]
            out.append(f"{src}: {full}={value!r}: not one of {', '.join(valid)}{did_you_mean(value, words)}")
        elif kind == "missing":
            out.append(f"{src}: {full} is required ({info.description if info else 'no default'})")
        elif kind in ("value_error", "assertion_error"):
            out.append(f"{src}: {full}={value!r}: {e['ctx']['error']}")
        else:  # a type error: the field's whole value against the field's type
            got = data
            for p in loc[:n]:
                got = got.get(p, value) if isinstance(got, dict) else value
            line = (
                f"{src}: '{key}' expects {type_name(info.annotation) if info else 'a mapping'}, "
                f"got {type(got).__name__} {got!r}"
            )
            out += [line] if line not in out else []
    return out


def _choices(annotation: typing.Any) -> list[str]:
    """A literal's values in words; a union's members each as its values (a literal) or its type's name
    (``bool | Literal["auto"]``: bool, auto)."""
    tp = strip_annotated(annotation)
    if typing.get_origin(tp) is typing.Literal:
        return [str(a) for a in typing.get_args(tp)]
    out: list[str] = []
    for arg in typing.get_args(tp):
        literal = typing.get_origin(strip_annotated(arg)) is typing.Literal
        out += _choices(arg) if literal else ["null" if arg is type(None) else type_name(arg)]
    return out


def fail(errors: list[str]) -> typing.NoReturn:
    """Raise one ConfigError holding every line of ``errors``."""
    if len(errors) == 1:
        raise ConfigError(errors[0])
    raise ConfigError(f"{len(errors)} problems in the config:\n  - " + "\n  - ".join(errors))


def _assignment_error(err: ValidationError, prefix: tuple) -> ConfigError:
    """A failed assignment to a section's key as a ConfigError naming the key (source ``assignment``)."""
    lines = messages(err, lambda _key: "assignment", {}, prefix)
    return ConfigError(
        lines[0] if len(lines) == 1 else f"{len(lines)} problems in the config:\n  - " + "\n  - ".join(lines)
    )


schema.assignment_error = _assignment_error
