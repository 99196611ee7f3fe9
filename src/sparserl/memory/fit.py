"""Whether a run fits its memory, decided before any weight loads: :func:`check_fits` refuses one that
does not with one line naming the keys that would make it fit, each with a value the prediction says
fits (:func:`suggestions`, each found by re-running :func:`~.predict.predict_peak`);
:func:`gradient_checkpointing_on` answers ``train.gradient_checkpointing: auto``.
"""

from __future__ import annotations

from ..config import Config, ConfigError, apply_overrides, validate
from ..cost import ModelShape
from ..packing import PROMPT_TOKENS_BOUND
from .limit import GB, memory_limit
from .predict import MemoryPrediction, predict_peak

__all__ = ["check_fits", "gradient_checkpointing_on", "suggestions"]


def _fits(cfg: Config, shape: ModelShape, prompt_tokens: int, limit: float) -> MemoryPrediction | None:
    p = predict_peak(cfg, shape, prompt_tokens)
    return p if p.peak <= limit else None


def _with(cfg: Config, overrides: list[str]) -> Config | None:
    """``cfg`` with ``overrides`` applied, or None when the result breaks a rule between keys."""
    try:
        return validate(apply_overrides(cfg, overrides))
    except ConfigError:
        return None


def _largest(lo: int, hi: int, fits) -> int | None:
    """The largest integer in [lo, hi] for which ``fits`` holds (it holds for all smaller ones), or None."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _round_down(v: int, step: int = 64) -> int:
    return v - v % step if v >= step else v


def suggestions(cfg: Config, shape: ModelShape, prompt_tokens: int, limit: float) -> list[tuple[str, float]]:
    """``(key=value [key=value], predicted bytes)`` for each single change that makes the prediction fit
    ``limit``: gradient checkpointing on, a smaller token budget of a micro-batch, shorter responses, fewer
    prompts a step, a smaller KV budget (a compressor, for a dense sampler). Only changes that pass the
    rules between keys."""
    out: list[tuple[str, float]] = []

    def trial(overrides: list[str]) -> MemoryPrediction | None:
        c = _with(cfg, overrides)
        return _fits(c, shape, prompt_tokens, limit) if c is not None else None

    def add(overrides: list[str]) -> None:
        p = trial(overrides)
        if p is not None:
            out.append((" ".join(overrides), p.peak))

    t, r = cfg.train, cfg.rollout
    if t.gradient_checkpointing is not True:
        add(["train.gradient_checkpointing=true"])
    one_row = prompt_tokens + r.max_new_tokens
    top = (t.max_tokens_per_micro_batch or one_row * t.micro_batch_size) - 1
    if top >= one_row:
        v = _largest(one_row, top, lambda v: trial([f"train.max_tokens_per_micro_batch={v}"]) is not None)
        if v is not None:
            add([f"train.max_tokens_per_micro_batch={max(one_row, _round_down(v, 256))}"])
    v = _largest(1, r.max_new_tokens - 1, lambda v: trial([f"rollout.max_new_tokens={v}"]) is not None)
    if v is not None:
        add([f"rollout.max_new_tokens={_round_down(v)}"])
    v = _largest(1, t.prompts_per_step - 1, lambda v: trial([f"train.prompts_per_step={v}"]) is not None)
    if v is not None:
        add([f"train.prompts_per_step={v}"])
    if r.kv_controller is not None:
        key, top = "rollout.kv_controller.max_budget", r.kv_controller.max_budget - 1
        lo = r.kv_controller.min_budget
    elif r.compressor in ("none", "blocktopk"):
        key, top, lo = "rollout.kv_budget", prompt_tokens + r.max_new_tokens - 1, 16
    else:
        key, top, lo = "rollout.kv_budget", r.kv_budget - 1, 1
    extra = ["rollout.compressor=rkv"] if r.compressor in ("none", "blocktopk") else []
    v = _largest(lo, top, lambda v: trial([*extra, f"{key}={v}"]) is not None)
    if v is not None:
        add([*extra, f"{key}={_round_down(v, 16)}"])
    return out


def check_fits(cfg: Config, shape: ModelShape, prompt_tokens: int) -> MemoryPrediction:
    """The prediction, when it fits :func:`~.limit.memory_limit`; else a :class:`ConfigError` in one line:
    the predicted peak and its largest parts, the limit and where it comes from, and the changes that fit."""
    limit, source = memory_limit(cfg)
    p = predict_peak(cfg, shape, prompt_tokens)
    if p.peak <= limit:
        return p
    fixes = suggestions(cfg, shape, prompt_tokens, limit)
    fix = (
        "; fits with any one of: " + ", ".join(f"{o} ({b / GB:.2f} GB)" for o, b in fixes)
        if fixes
        else "; no single change of train.gradient_checkpointing, train.max_tokens_per_micro_batch, "
        "rollout.max_new_tokens, train.prompts_per_step or the KV budget fits it"
    )
    key = "train.max_memory_gb" if cfg.train.max_memory_gb is not None else "memory"
    value = f"={cfg.train.max_memory_gb:g}" if cfg.train.max_memory_gb is not None else ""
    raise ConfigError(
        f"{key}{value}: the run's predicted peak memory is {p.summary()}, over the limit of {limit / GB:.2f} GB "
        f"({source}; prompts of at most {prompt_tokens} tokens assumed){fix}"
    )


def gradient_checkpointing_on(cfg: Config, learner, prompt_tokens: int = PROMPT_TOKENS_BOUND) -> bool:
    """``train.gradient_checkpointing: auto``'s answer for ``learner`` (its ``config`` gives the shape):
    True when the predicted peak without checkpointing exceeds :func:`~.limit.memory_limit` and with it
    does not; False otherwise (also when neither fits: the refusal is preflight's). Explicit true / false
    are the caller's."""
    shape = ModelShape.from_config(learner.config)
    limit, _ = memory_limit(cfg)
    off = _with(cfg, ["train.gradient_checkpointing=false"]) or cfg
    on = _with(cfg, ["train.gradient_checkpointing=true"]) or cfg
    if predict_peak(off, shape, prompt_tokens).peak <= limit:
        return False
    return predict_peak(on, shape, prompt_tokens).peak <= limit
