"""The mismatch correction: each correction method checks its own options by running once."""

from __future__ import annotations

from ..schema import Config


def correction_runs(cfg: Config) -> list[str]:
    """The correction resolves with its options and runs on a one-token batch (cheap, no model): bad option
    names and values fail now, in the method's own words."""
    import torch

    from ...correct.presets import apply_corrections, resolve

    a = cfg.algorithm
    if isinstance(a.correction, list) and a.correction_options:
        return [
            "algorithm.correction_options apply to a single named correction; with a list, give options per "
            "method as [name, {options}]"
        ]
    try:
        resolve(a.correction, dict(a.correction_options))
        one = torch.zeros(1, 1)
        apply_corrections(a.correction, one, one, torch.ones(1, 1), dict(a.correction_options) or None)
    except (ValueError, TypeError) as e:
        return [
            f"algorithm.correction={a.correction!r} (algorithm.correction_options={dict(a.correction_options)}): {e}"
        ]
    return []
