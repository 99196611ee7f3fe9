"""Where the shipped presets live and their names: light enough for the command line's help (the config
models themselves, in :mod:`sparserl.config`, import torch)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["PRESET_DIR", "list_presets"]

PRESET_DIR = Path(__file__).resolve().parent / "configs"


def list_presets() -> list[str]:
    """Names of the presets shipped in ``sparserl/configs/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
