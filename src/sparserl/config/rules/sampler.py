"""The sampler's KV cache: budget, window, schedule and block top-k's pages."""

from __future__ import annotations

from ..schema import Config
from .given import given


def kv_budget_above_window(cfg: Config) -> list[str]:
    """A compressor keeps the observation window always, so its budget must exceed the window."""
    r = cfg.rollout
    if r.compressor not in ("none", "blocktopk") and r.kv_budget <= r.window and r.kv_schedule is None:
        return [
            f"rollout.kv_budget={r.kv_budget} must be larger than rollout.window={r.window} "
            "(the window's tokens are always kept)"
        ]
    return []


def kv_schedule(cfg: Config) -> list[str]:
    """A schedule given as a file reads as a schedule of rollout.compressor."""
    from ...rollout.kv.schedule import ScheduleError, load_schedule

    r = cfg.rollout
    if isinstance(r.kv_schedule, str):
        try:
            load_schedule(r.kv_schedule, r.compressor)
        except ScheduleError as e:
            return [str(e) if str(e).startswith("rollout.kv_schedule") else f"rollout.kv_schedule: {e}"]
    return []


def kv_schedule_unused(cfg: Config) -> list[str]:
    """A budget schedule steers a compressor; the dense sampler keeps every token."""
    r = cfg.rollout
    if r.compressor == "none" and given(r, "kv_schedule"):
        return [
            "rollout.kv_schedule does nothing with rollout.compressor=none (the dense sampler keeps every "
            "token); set rollout.compressor (e.g. rkv), or leave kv_schedule out"
        ]
    return []


def blocktopk_pages(cfg: Config) -> list[str]:
    """Block top-k reads whole pages, at least the 3 it always reads; its pages are its own option."""
    from ...rollout.kv.blocktopk import PAGE_TOKENS, k_problems
    from ...rollout.kv.schedule import ScheduleError, load_schedule

    r = cfg.rollout
    errors: list[str] = []
    if r.blocktopk_pages is not None and r.compressor != "blocktopk":
        errors.append(
            f"rollout.blocktopk_pages={r.blocktopk_pages} is an option of rollout.compressor=blocktopk, "
            f"not {r.compressor!r}; leave it out (null) or set rollout.compressor=blocktopk"
        )
    if r.compressor != "blocktopk":
        return errors
    try:
        budgets = None if r.kv_schedule is None else list(load_schedule(r.kv_schedule, r.compressor).budgets)
    except ScheduleError:
        budgets = None  # reported by kv_schedule
    errors += k_problems(
        r.kv_budget if budgets is None else None,
        r.blocktopk_pages,
        budgets,
        budget_key="rollout.kv_budget",
        pages_key="rollout.blocktopk_pages",
        schedule_key="rollout.kv_schedule",
    )
    if r.compile:
        errors.append(
            "rollout.compile=true with rollout.compressor=blocktopk: the compiled decode step reads the "
            "whole cache and cannot choose pages per step; set rollout.compile=false"
        )
    if (kc := r.kv_controller) is not None:
        if r.blocktopk_pages is not None:
            errors.append(
                f"rollout.blocktopk_pages={r.blocktopk_pages} and rollout.kv_controller both decide "
                "the pages block top-k reads; give one"
            )
        bad = [
            f"{key}={v}"
            for key, v in (("min_budget", kc.min_budget), ("max_budget", kc.max_budget), ("step", kc.step))
            if v % PAGE_TOKENS
        ]
        if bad or kc.min_budget < 3 * PAGE_TOKENS:
            errors.append(
                f"rollout.kv_controller ({', '.join(bad) or f'min_budget={kc.min_budget}'}): with "
                f"rollout.compressor=blocktopk the budgets move in whole pages: min_budget, max_budget "
                f"and step multiples of {PAGE_TOKENS}, min_budget >= {3 * PAGE_TOKENS} (3 pages)"
            )
    return errors
