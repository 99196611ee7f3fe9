"""Whether a key was given: set to a value other than its default."""

from __future__ import annotations

from pydantic import BaseModel


def given(section: BaseModel, key: str) -> bool:
    """``section.key`` holds a value other than the field's default.

    A file or override that writes a key at its default value changes nothing, so only a value other than
    the default counts as given (``model_fields_set`` would count a preset's ``kl_kind: low_var_kl``, and
    every key after :func:`~sparserl.config.apply_overrides`, which rebuilds the whole config).
    """
    info = type(section).model_fields[key]
    return getattr(section, key) != info.get_default(call_default_factory=True)
