"""A JSON file of measured answers (``{machine key: answer}``), read leniently and written atomically:
the caches beside the native kernels (``dtype_auto.json``, ``mixed_precision_auto.json``). A missing or
unreadable file reads as empty (the answer is measured again and the file rewritten); a file that
cannot be written costs a re-measurement next time, nothing else."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(path: Path, data: dict, who: str) -> None:
    """``data`` into ``path`` through a temporary file and a rename; ``who`` names the writer in the
    message printed when that fails."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)
    except OSError as e:
        print(f"{who}: cannot cache the measurement in {path} ({e})")
