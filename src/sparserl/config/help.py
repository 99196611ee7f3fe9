"""``sparserl config --keys``: every key of the schema with its type, default and help text."""

from __future__ import annotations

from typing import Any

import yaml

from .loading import config_to_dict
from .schema import SECTIONS, Config, Registered, fields_of, subsection, type_name

__all__ = ["config_help"]


def config_help(match: str | None = None) -> str:
    """Every field as ``section.key (type, default): help``, one per line, grouped by section, with the
    keys of a sub-section (``rollout.kv_controller.threshold``) after the field that holds it; a field
    checked against a registry also lists the registry's names. ``match``: only the lines whose text
    holds it (case-insensitive), under their section's line."""
    lines, defaults = [], config_to_dict(Config())

    def line(key: str, f: Any, default: Any, indent: str) -> str:
        if f.is_required():
            dflt = "required"
        else:
            dflt = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        names = [m.func.names() for m in f.metadata if isinstance(getattr(m, "func", None), Registered)]
        extra = f" Registered: {', '.join(names[0])}." if names else ""
        return f"{indent}{key} ({type_name(f.annotation)}, default {dflt}): {f.description}{extra}"

    needle = (match or "").lower()
    for sec, cls in SECTIONS.items():
        section = []
        for key, f in fields_of(cls).items():
            section.append(line(f"{sec}.{key}", f, defaults[sec][key], "  "))
            sub = subsection(f)
            if sub is not None:
                sub_defaults = defaults[sec][key] or {}
                section += [
                    line(f"{sec}.{key}.{k}", g, sub_defaults.get(k, g.get_default(call_default_factory=True)), "    ")
                    for k, g in fields_of(sub).items()
                ]
        section = [x for x in section if needle in x.lower()]
        if section or not needle:
            lines += [f"{sec}:  {(cls.__doc__ or '').strip()}", *section]
    return "\n".join(lines)
