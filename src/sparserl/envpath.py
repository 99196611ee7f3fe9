"""Folders named by environment variables (``SPARSERL_CACHE``, ``SPARSERL_NATIVE_CACHE``,
``SPARSERL_DATA_DIR``), checked where they are read: one that is a file, or cannot be created, is an
:class:`EnvPathError` naming the variable and the path, not an ``OSError`` deep inside a command."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SparserlError

__all__ = ["EnvPathError", "env_dir"]


class EnvPathError(SparserlError):
    """An environment variable (or its default) names a folder that cannot be one: the path or a
    folder above it is a file, or the folder cannot be created."""


def env_dir(var: str, default: str | os.PathLike | None = None, *, create: bool = True) -> Path | None:
    """The folder ``$var`` names (``~`` expanded), else ``default`` when it is unset or blank; None
    when neither is there.

    ``create``: make the folder (and its parents) when it is missing; else a missing folder is
    returned as it is (the caller says what it looked for there). Raises :class:`EnvPathError`
    naming ``var`` and the path when the path, or a folder above it, exists and is not a folder, or
    when the folder cannot be created.
    """
    value = os.environ.get(var, "").strip()
    if not value and default is None:
        return None
    path = Path(value).expanduser() if value else Path(default)
    where = f"{var}={value!r}" if value else f"{path} (the default when {var} is unset)"
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "it" if existing == path else str(existing)
        kind = "a file, not a folder" if existing.is_file() else "not a folder"
        raise EnvPathError(f"{where}: {what} is {kind}; set {var} to a folder")
    if create and existing != path:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EnvPathError(
                f"{where}: cannot create the folder {path} ({e.strerror or e}); set {var} to "
                "a folder that can be written"
            ) from None
    return path
