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

__all__ = ["check_fits", "gradient_checkpointing_on", "memory_line", "suggestions"]


def _fits(cfg: Config, shape: ModelShape, prompt_tokens: int, limit: float) -> MemoryPrediction | None:
    p = predict_peak(cfg, shape, prompt_tokens)
    return p if p.peak <= limit else None


def _with(cfg: Config, overrides: list[str]) -> Config | None:
    """A copy of ``cfg`` with ``overrides`` applied, or None when the result breaks a rule between keys."""
    try:
        return validate(apply_overrides(cfg.model_copy(deep=True), overrides))
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


def _knobs(cfg: Config, prompt_tokens: int) -> list[tuple[list[str], int, int, object]]:
    """The changes the refusal may suggest, least memory first: ``(fixed overrides, lowest, highest,
    key or None)``; a knob with a key takes an integer value in [lowest, highest] (larger = more memory)."""
    t, r = cfg.train, cfg.rollout
    knobs: list[tuple[list[str], int, int, object]] = []
    if t.gradient_checkpointing is not True:
        knobs.append((["train.gradient_checkpointing=true"], 0, 0, None))
    one_row = prompt_tokens + r.max_new_tokens
    top = (t.max_tokens_per_micro_batch or one_row * t.micro_batch_size) - 1
    if top >= one_row:
        knobs.append(([], one_row, top, "train.max_tokens_per_micro_batch"))
    if r.kv_controller is not None:
        knobs.append(
            ([], r.kv_controller.min_budget, r.kv_controller.max_budget - 1, "rollout.kv_controller.max_budget")
        )
    elif r.compressor in ("none", "blocktopk"):
        knobs.append((["rollout.compressor=rkv"], 16, one_row - 1, "rollout.kv_budget"))
    elif r.kv_budget > 1:
        knobs.append(([], 1, r.kv_budget - 1, "rollout.kv_budget"))
    c = cfg.cluster
    if c.rollout_workers and c.address is None:  # a local Ray's workers and pushes (predict.local_cluster_bytes)
        if r.async_ and r.max_staleness > 1:
            knobs.append(([], 1, r.max_staleness - 1, "rollout.max_staleness"))
        if c.rollout_workers > 1:
            knobs.append(([], 1, c.rollout_workers - 1, "cluster.rollout_workers"))
    if not t.lora_rank:
        knobs.append((["train.lora_rank=16"], 0, 0, None))
    knobs.append(([], 1, r.max_new_tokens - 1, "rollout.max_new_tokens"))
    knobs.append(([], 1, t.prompts_per_step - 1, "train.prompts_per_step"))
    return knobs


def _rounded(key: str, v: int, lowest: int) -> int:
    step = {"train.max_tokens_per_micro_batch": 256, "rollout.max_new_tokens": 64}.get(key, 16)
    return max(lowest, v - v % step) if v >= step else v


def suggestions(cfg: Config, shape: ModelShape, prompt_tokens: int, limit: float) -> list[tuple[str, float]]:
    """``(key=value [key=value ...], predicted bytes)`` for each single change that makes the prediction
    fit ``limit``: gradient checkpointing on, a smaller token budget of a micro-batch, a smaller KV budget (a
    compressor, for a dense sampler), on a local Ray fewer steps ahead or fewer rollout workers, LoRA (gradients
    and AdamW's moments for its adapters only), shorter responses, fewer prompts a step; each at the largest
    value that fits, rounded down. When no single one does, one combination: the changes applied in that order,
    each at its smallest value, until the next one fits at a larger value. Only changes that pass the rules
    between keys are suggested."""

    def trial(base: list[str], overrides: list[str]) -> MemoryPrediction | None:
        c = _with(cfg, base + overrides)
        return _fits(c, shape, prompt_tokens, limit) if c is not None else None

    def fitting(base: list[str], knob) -> list[str] | None:
        """The knob's overrides at the largest value that fits on top of ``base``, or None."""
        fixed, lo, hi, key = knob
        if key is None:
            return fixed if trial(base, fixed) is not None else None
        v = _largest(lo, hi, lambda v: trial(base, [*fixed, f"{key}={v}"]) is not None)
        if v is None:
            return None
        v = _rounded(key, v, lo)
        return [*fixed, f"{key}={v}"] if trial(base, [*fixed, f"{key}={v}"]) is not None else None

    def predicted(overrides: list[str]) -> float:
        return predict_peak(_with(cfg, overrides), shape, prompt_tokens).peak

    knobs = _knobs(cfg, prompt_tokens)
    out = [(" ".join(o), predicted(o)) for o in (fitting([], k) for k in knobs) if o is not None]
    if out:
        return out
    base: list[str] = []
    for knob in knobs:
        o = fitting(base, knob)
        if o is not None:
            return [(" ".join(base + o), predicted(base + o))]
        fixed, lo, _, key = knob
        step = fixed if key is None else [*fixed, f"{key}={lo}"]
        if _with(cfg, base + step) is not None:
            base = base + step
    return []


def check_fits(cfg: Config, shape: ModelShape, prompt_tokens: int) -> MemoryPrediction:
    """The prediction, when it fits :func:`~.limit.memory_limit`; else a :class:`ConfigError` in one line:
    the predicted peak and its largest parts, the limit and where it comes from, and the changes that fit."""
    limit, source = memory_limit(cfg)
    p = predict_peak(cfg, shape, prompt_tokens)
    if p.peak <= limit:
        return p
    fixes = suggestions(cfg, shape, prompt_tokens, limit)
    fix = (
        ("; fits with any one of: " if len(fixes) > 1 else "; fits with: ")
        + ", ".join(f"{o} ({b / GB:.2f} GB)" for o, b in fixes)
        if fixes
        else "; not even with gradient checkpointing, one response per micro-batch, a KV budget, LoRA, one "
        "token per response and one prompt per step"
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


def memory_line(cfg: Config, prediction: MemoryPrediction) -> str:
    """One line for ``sparserl config``: the predicted peak, its largest parts and the limit."""
    limit, source = memory_limit(cfg)
    ckpt = ", gradient checkpointing on" if prediction.checkpointing else ""
    return (
        f"memory: predicted peak {prediction.summary(4)}{ckpt}; limit {limit / GB:.2f} GB ({source}); "
        f"{'; '.join(prediction.notes)}"
    )
