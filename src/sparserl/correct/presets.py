"""Named combinations of corrections after the papers, and :func:`resolve` / :func:`apply_corrections`.

A spec is a list of ``(name, options)`` applied with the composition rule of
:func:`sparserl.correct.base.merge_corrections` (masks AND, weights multiply, bypass wins).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from torch import Tensor

from ..registry import UnknownNameError, did_you_mean
from .base import Correction, available_corrections, compose, get_correction

Spec = list[tuple[str, dict]]

PRESETS: dict[str, Spec] = {
    # no correction: sampler tokens treated as on-policy
    "naive": [("none", {})],
    # Sparse-RL (Luo et al. 2026): token mask [0.5, 1.5], veto 1e-4, min(ρ, 1.5), batch-normalised
    "sparse_rl": [("sparse_rl", {})],
    # FlashRL: token-level truncated IS, C = 2
    "flashrl_tis": [("tis", {"level": "token", "cap": 2.0})],
    # FP8-RL (2026): token-level TIS, C = 2
    "fp8rl": [("tis", {"level": "token", "cap": 2.0})],
    # QuRL (Li et al. 2026): TIS C = 2 with the adaptive clipping range
    "qurl": [("acr", {"cap": 2.0})],
    # verl presets
    "verl_token_is": [("tis", {"level": "token", "cap": 2.0})],
    "verl_seq_is": [("tis", {"level": "sequence", "cap": 2.0})],
    "verl_seq_mis": [("mis", {"level": "sequence", "cap": 2.0})],
    "verl_seq_is_rs": [
        ("tis", {"level": "sequence", "cap": 2.0}),
        ("rejection", {"metric": "ratio", "level": "seq_sum", "low": 0.5, "high": 2.0}),
    ],
    "verl_geo_rs": [("rejection", {"level": "geometric", "low": 0.999, "high": 1.001})],
    "verl_geo_rs_token_tis": [
        ("rejection", {"level": "geometric", "low": 0.999, "high": 1.001}),
        ("tis", {"level": "token", "cap": 2.0}),
    ],
    "verl_k3_rs": [("rejection", {"metric": "k3", "level": "seq_mean", "high": 0.01})],
    "verl_bypass": [("bypass", {})],
    # TRL's GRPOTrainer default: the response's ratio product, masked (weight 0) above 3
    "trl_sequence_mask": [("trl_is", {"mode": "sequence_mask", "clip_max": 3.0})],
}


def available_presets() -> list[str]:
    """Sorted preset names."""
    return sorted(PRESETS)


def _accepted_options(name: str) -> set[str]:
    params = inspect.signature(get_correction(name)).parameters.values()
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY}


def resolve(
    spec: str | Sequence[str | tuple[str, Mapping] | Sequence],
    options: Mapping | None = None,
) -> Spec:
    """Normalise a correction spec to ``[(name, options), ...]`` (fresh copies).

    ``spec``: a preset name (presets take precedence over method names of the same name), a
    registered method name, or a list whose items are method names or ``(name, options)`` pairs.

    ``options`` (e.g. ``algorithm.correction_options``) override the spec's options: a key that
    names a part of the spec with a dict value (``{"tis": {"cap": 3.0}}``) updates that part; any
    other key is set on every part whose function accepts it as a keyword
    (``{"token_low": 0.4}`` → the ``sparse_rl`` part). A key that no part accepts raises
    ``ValueError``; so do unknown names (the message lists the presets and methods).
    """

    def check(name: str) -> str:
        if name not in available_corrections():
            raise UnknownNameError(
                f"unknown correction {name!r}{did_you_mean(name, [*PRESETS, *available_corrections()])}; "
                f"presets: {', '.join(available_presets())}; "
                f"methods: {', '.join(available_corrections())}"
            )
        return name

    if isinstance(spec, str):
        if spec in PRESETS:
            out = [(n, dict(o)) for n, o in PRESETS[spec]]
        else:
            out = [(check(spec), {})]
    else:
        out = []
        for item in spec:
            if isinstance(item, str):
                out.append((check(item), {}))
            elif isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str):
                out.append((check(item[0]), dict(item[1] or {})))
            else:
                raise ValueError(f"bad correction spec item {item!r}: expected a name or (name, options)")
    for key, value in dict(options or {}).items():
        names = [n for n, _ in out]
        if key in names and isinstance(value, Mapping):
            for n, o in out:
                if n == key:
                    o.update(value)
            continue
        hit = False
        for n, o in out:
            if key in _accepted_options(n):
                o[key] = value
                hit = True
        if not hit:
            accepted = sorted(set().union(*(_accepted_options(n) for n in names)))
            raise ValueError(
                f"correction option {key!r} is not accepted by {', '.join(names)}; "
                f"accepted: {', '.join(accepted) or '(none)'}"
            )
    return out


def apply_corrections(
    spec: str | Sequence,
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    options: Mapping | None = None,
) -> Correction:
    """Resolve ``spec`` (with ``options`` overriding, see :func:`resolve`) and apply it: each part
    sees the input mask; results are merged (masks AND, weights multiply, clip scales multiply,
    bypass's behaviour wins)."""
    parts = resolve(spec, options)
    if len(parts) == 1:
        name, opts = parts[0]
        return get_correction(name)(sampler_logprobs, old_logprobs, mask, **opts)
    return compose(*parts)(sampler_logprobs, old_logprobs, mask)
