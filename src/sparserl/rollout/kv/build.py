"""The one builder of a compressor from options: used by the trainer (the config's ``rollout``
section), ``sparserl rollout`` / ``sparserl eval`` (command options), eval and the benchmark.

    build_compressor("rkv", kv_budget=64, window=8, options={"lam": 0.1})
    build_compressor("rkv", kv_schedule=[[0, 32], [256, 64]])  # Sparrow's schedule (kv/schedule.py)
    build_compressor("blocktopk", blocktopk_pages=16)  # block top-k reading 16 pages (kv/blocktopk.py)
    compressor_from_fields(cfg.rollout)            # the config's rollout fields
    compressor_from_fields(args, name="snapkv")    # parsed command options, another method

The common options map onto every compressor's fields (``kv_budget`` → ``budget``); ``options``
holds the method-specific ones (a dict, or a JSON object as a command line gives it) and wins over
the common ones. A left-out (None) common option keeps the method's own default. ``blocktopk_pages``
(block top-k's k, its ``pages``) belongs to ``blocktopk`` alone: with another method it is an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .base import CompressorOptionError, KVCompressor, get_compressor

__all__ = ["build_compressor", "compressor_from_fields"]


def _parse_options(name: str, options: Mapping[str, Any] | str | None) -> dict:
    if options is None or options == "":
        return {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError as e:
            raise CompressorOptionError(f"compressor {name!r}: options {options!r} are not valid JSON: {e}") from None
    if not isinstance(options, Mapping):
        raise CompressorOptionError(
            f"compressor {name!r}: options must be a mapping of option names to values, got {options!r}"
        )
    return dict(options)


def build_compressor(
    name: str,
    *,
    kv_budget: int | None = None,
    trigger: str | None = None,
    step_length: int | None = None,
    window: int | None = None,
    compress_prompt: bool | None = None,
    tail_slack: int | None = None,
    kv_schedule: Any = None,
    blocktopk_pages: int | None = None,
    options: Mapping[str, Any] | str | None = None,
) -> KVCompressor:
    """A compressor by name (``none`` = dense) from the common options and the method's own.

    Raises :class:`~sparserl.registry.UnknownNameError` for an unknown name and
    :class:`CompressorOptionError` naming the compressor, the bad option and the valid ones."""
    if blocktopk_pages is not None and name != "blocktopk":
        raise CompressorOptionError(
            f"compressor {name!r}: blocktopk_pages={blocktopk_pages} is an option of "
            "blocktopk only; leave it out or use compressor 'blocktopk'"
        )
    common = dict(
        budget=kv_budget,
        trigger=trigger,
        step_length=step_length,
        window=window,
        compress_prompt=compress_prompt,
        tail_slack=tail_slack,
        schedule=kv_schedule,
        pages=blocktopk_pages,
    )
    kw = {k: v for k, v in common.items() if v is not None}
    kw.update(_parse_options(name, options))
    return get_compressor(name, **kw)


def compressor_from_fields(src: Any, name: str | None = None) -> KVCompressor:
    """:func:`build_compressor` from anything holding the rollout fields as attributes: the config's
    ``rollout`` section or a command's parsed options (``compressor``, ``kv_budget``, ``trigger``,
    ``step_length``, ``window``, ``compress_prompt``, ``tail_slack``, ``kv_schedule``, ``blocktopk_pages``,
    ``compressor_options``; missing ones keep the method's default). ``name`` overrides ``src.compressor``
    (``blocktopk_pages`` is then passed only to ``blocktopk``)."""
    return build_compressor(
        name or src.compressor,
        kv_budget=getattr(src, "kv_budget", None),
        trigger=getattr(src, "trigger", None),
        step_length=getattr(src, "step_length", None),
        window=getattr(src, "window", None),
        compress_prompt=getattr(src, "compress_prompt", None),
        tail_slack=getattr(src, "tail_slack", None),
        kv_schedule=getattr(src, "kv_schedule", None),
        blocktopk_pages=getattr(src, "blocktopk_pages", None) if (name or src.compressor) == "blocktopk" else None,
        options=getattr(src, "compressor_options", None),
    )
