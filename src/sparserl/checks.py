"""Checks of a command's options before any work starts: numbers in range, choices, output paths.

Every command runs these before it loads a model or generates anything, so a bad option never
throws work away. Each raises :class:`~sparserl.errors.OptionError` naming the option, the value
and what would be valid. The output-path checks create nothing that stays: a folder that does not
exist yet is checked through its nearest existing ancestor (which must be a folder one can write in).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .errors import OptionError

__all__ = [
    "check_choice",
    "check_int",
    "check_number",
    "check_output_dir",
    "check_output_file",
    "check_sampler_options",
]


def check_int(value, option: str, minimum: int = 1, *, allow_none: bool = False, what: str = "") -> None:
    """``value`` is a whole number >= ``minimum`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{option} {value!r}: must be a whole number >= {minimum}" + (f" ({what})" if what else ""))


def check_number(
    value, option: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None, what: str = ""
) -> None:
    """``value`` is a finite number within the given bounds."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (ge is None or value >= ge) and (gt is None or value > gt) and (le is None or value <= le)
    if not ok:
        bounds = [
            f">= {ge:g}" if ge is not None else "",
            f"> {gt:g}" if gt is not None else "",
            f"<= {le:g}" if le is not None else "",
        ]
        raise OptionError(
            f"{option} {value!r}: must be a finite number {' and '.join(b for b in bounds if b)}"
            + (f" ({what})" if what else "")
        )


def check_choice(value, option: str, choices: Iterable[str]) -> None:
    """``value`` is one of ``choices``."""
    from .registry import did_you_mean

    choices = list(choices)
    if value not in choices:
        raise OptionError(f"{option} {value!r}: not one of {', '.join(choices)}{did_you_mean(value, choices)}")


def _nearest_existing(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_can_create_in(folder: Path, option: str, path: Path) -> None:
    """``folder`` (an existing path) is a folder one can create files in."""
    if not folder.is_dir():
        raise OptionError(f"{option} {path}: {folder} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".sparserl-write-check-"):
            pass
    except OSError as e:
        raise OptionError(f"{option} {path}: cannot write in {folder} ({e.strerror or e})") from None


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """A file the command will write: not a folder, not under a regular file, and its folder (or the
    nearest existing ancestor, when the folder is still to be made) is writable. Returns the path."""
    p = Path(path).expanduser()
    if str(path).strip() == "":
        raise OptionError(f"{option}: empty path")
    if p.is_dir():
        raise OptionError(f"{option} {path}: is a folder; give a file path")
    if p.exists():
        try:
            with open(p, "a"):
                pass
        except OSError as e:
            raise OptionError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
        return p
    _check_can_create_in(_nearest_existing(p.parent), option, p)
    return p


def check_output_dir(path: str | os.PathLike, option: str) -> Path:
    """A folder the command will write into: not a regular file, not under one, and writable (or, when
    it does not exist yet, its nearest existing ancestor is). Returns the path."""
    p = Path(path).expanduser()
    if str(path).strip() == "":
        raise OptionError(f"{option}: empty path")
    if p.exists() and not p.is_dir():
        raise OptionError(f"{option} {path}: exists and is a file, not a folder")
    _check_can_create_in(p if p.exists() else _nearest_existing(p), option, p)
    return p


def check_sampler_options(args):
    """The sampler options of ``rollout`` / ``eval`` (``--compressor``, ``--kv-budget``, ``--step-length``,
    ``--window``, ``--compressor-options``): checked, then the compressor built (cheap, no model) and
    returned. An unknown compressor or option raises an error naming it and the valid ones."""
    import json

    from .rollout.kv import compressor_from_fields

    check_int(args.kv_budget, "--kv-budget", 1, what="KV tokens kept per sequence")
    check_int(args.step_length, "--step-length", 1, what="decode steps between compressions")
    check_int(args.window, "--window", 0, allow_none=True)
    check_int(getattr(args, "tail_slack", None), "--tail-slack", 0, allow_none=True)
    if args.compressor != "none" and args.window is not None and args.kv_budget <= args.window:
        raise OptionError(
            f"--kv-budget {args.kv_budget} must be larger than --window {args.window} (the window's "
            "tokens are always kept)"
        )
    text = getattr(args, "compressor_options", None)
    if text:
        try:
            options = json.loads(text)
        except json.JSONDecodeError as e:
            raise OptionError(
                f"--compressor-options {text!r}: not valid JSON ({e.msg} at column {e.colno}); "
                "expected an object such as '{\"lam\": 0.1}'"
            ) from None
        if not isinstance(options, dict):
            raise OptionError(
                f"--compressor-options {text!r}: expected a JSON object of option names to values, "
                "such as '{\"lam\": 0.1}'"
            )
    return compressor_from_fields(args)
