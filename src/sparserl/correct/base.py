"""Shared machinery of the corrections: the result record, the registry, the mismatch metrics.

A *correction* turns the three log-probabilities of a rollout batch into what the policy loss
needs: per-token importance weights, a loss mask with rejected tokens/responses removed, the
log-probs to use as the PPO "old" (behaviour) policy, and metrics. Notation (docs/algorithms.md):

- ``sampler_logprobs`` = log q_t (compressed sampler: sparse KV cache, quantized weights),
- ``old_logprobs``     = log p_t (dense old policy, same weights, full KV, full precision),
- ``ρ_t = p_t / q_t = exp(clamp(log p_t − log q_t, −20, 20))`` (Sparse-RL's safety clamp; verl
  uses the same bound).

All tensors are padded ``[B, T]`` with ``mask`` ``[B, T]`` (1 = real response token). Corrections
are pure functions: they never modify their inputs and hold no state.

Adding a method (the kvpress recipe): write ``correct/<name>.py`` with one function
``fn(sampler_logprobs, old_logprobs, mask, **options) -> Correction`` decorated with
``@register_correction("<name>")``, build its result with :func:`build_correction` (which computes
every shared metric), import the module in ``correct/__init__.py``; the parametrized test matrix in
``tests/test_correct.py`` then checks the shared invariants for it.

Conventions of every :class:`Correction`:

- ``weights`` are detached, finite, ≥ 0, and **0 wherever the final mask is 0** (so
  ``weights.sum()`` needs no mask);
- ``mask`` ⊆ the input mask (same dtype as the input mask);
- ``metrics`` always hold the keys of :data:`MISMATCH_KEYS` and :data:`CORRECTION_KEYS`, all finite
  Python floats, also for an empty batch (see :func:`mismatch_metrics` / :func:`weight_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import runlog as names
from ..registry import Registry
from ..runlog import correction_part_metric

__all__ = [
    "LOG_RATIO_CLAMP",
    "Correction",
    "CorrectionFn",
    "CORRECTIONS",
    "register_correction",
    "get_correction",
    "available_corrections",
    "log_ratio",
    "importance_ratio",
    "sequence_log_ratio",
    "masked_mean",
    "batch_normalize",
    "mismatch_metrics",
    "weight_metrics",
    "build_correction",
    "merge_corrections",
    "compose",
    "MISMATCH_KEYS",
    "CORRECTION_KEYS",
]

LOG_RATIO_CLAMP = 20.0
"""|log ρ| bound before exponentiation (Sparse-RL: clamp(log p − log q, −20, 20); verl: same)."""


@dataclass
class Correction:
    """What a correction returns.

    Attributes:
        weights: ``[B, T]`` importance weight per token, detached; 1 on kept tokens of a method that
            does not reweight; 0 wherever ``mask`` is 0.
        mask: ``[B, T]`` final loss mask: the input mask with rejected tokens/responses zeroed.
        behaviour_logprobs: ``[B, T]`` log-probs to use as the PPO "old" policy: ``old_logprobs``
            (three-policy / decoupled mode), or ``sampler_logprobs`` (bypass mode).
        metrics: name -> finite float (see module docstring).
        clip_upper_scale: ``[B, T]`` factor ``1/r_t ≥ 1`` widening the PPO upper clip bound
            (QuRL adaptive clipping range), else ``None``.
        token_rejected: ``[B, T]`` bool, valid tokens removed by a token-level criterion (kept so
            that composition can recompute the ``rs/*`` metrics exactly); ``None`` = none.
        seq_rejected: ``[B]`` bool, responses removed as a whole; ``None`` = none.
        clipped: ``[B, T]`` bool, tokens whose weight was truncated/clipped; ``None`` = none.
    """

    weights: Tensor
    mask: Tensor
    behaviour_logprobs: Tensor
    metrics: dict[str, float]
    clip_upper_scale: Tensor | None = None
    token_rejected: Tensor | None = None
    seq_rejected: Tensor | None = None
    clipped: Tensor | None = None


CorrectionFn = Callable[..., Correction]

CORRECTIONS: Registry[CorrectionFn] = Registry("correction")


def register_correction(name: str) -> Callable[[CorrectionFn], CorrectionFn]:
    """Decorator registering ``fn(sampler_logprobs, old_logprobs, mask, **options) -> Correction``
    in :data:`CORRECTIONS` (a different function under a taken name raises ``ValueError``)."""

    def deco(fn: CorrectionFn) -> CorrectionFn:
        CORRECTIONS.register(name)(fn)
        fn.correction_name = name  # type: ignore[attr-defined]
        return fn

    return deco


def available_corrections() -> list[str]:
    """Sorted names of the registered corrections."""
    return CORRECTIONS.names()


def get_correction(name: str) -> CorrectionFn:
    """The correction function registered as ``name``; ``UnknownNameError`` (a ``ValueError``)
    listing the names and the closest one otherwise."""
    return CORRECTIONS.get(name)


# --------------------------------------------------------------------------- tensor helpers


def _valid(mask: Tensor) -> Tensor:
    return mask.bool() if mask.dtype == torch.bool else mask != 0


def log_ratio(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``log ρ_t = clamp(log p_t − log q_t, −20, 20)`` in float32 (at least), 0 on padding.

    Detached: corrections never carry gradient.
    """
    dtype = torch.promote_types(old_logprobs.dtype, torch.float32)
    lr = old_logprobs.detach().to(dtype) - sampler_logprobs.detach().to(dtype)
    lr = lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(_valid(mask), lr, torch.zeros_like(lr))


def importance_ratio(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``ρ_t = exp(clamp(log p_t − log q_t, −20, 20))``; 1 on padding."""
    return log_ratio(sampler_logprobs, old_logprobs, mask).exp()


def sequence_log_ratio(log_rho: Tensor, mask: Tensor) -> Tensor:
    """``[B]``: ``clamp(Σ_t log ρ_t, −20, 20)`` over each response's valid tokens (verl's bound)."""
    return (log_rho * _valid(mask)).sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over ``mask`` (0 where the mask is empty)."""
    m = _valid(mask).to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def batch_normalize(weights: Tensor, keep: Tensor, per_sequence: bool = False) -> Tensor:
    """Divide ``weights`` by their mean over the kept tokens (Sparse-RL / verl batch normalisation).

    ``per_sequence=True`` (verl, sequence-level IS) takes the mean over responses of each kept
    response's (constant) weight instead of over tokens. Nothing kept (or zero mean) → zeros.
    """
    keep = _valid(keep)
    w = torch.where(keep, weights, torch.zeros_like(weights))
    if per_sequence:
        seq_keep = keep.any(-1)
        n = keep.sum(-1).clamp(min=1)
        seq_w = w.sum(-1) / n
        denom = seq_w[seq_keep].mean() if bool(seq_keep.any()) else w.new_zeros(())
    else:
        denom = w.sum() / keep.sum().clamp(min=1)
    if float(denom) <= 0.0:
        return torch.zeros_like(w)
    return w / denom


# --------------------------------------------------------------------------- metrics

MISMATCH_KEYS = (
    names.MISMATCH_LOG_RATIO,
    names.MISMATCH_LOG_RATIO_MAX,
    names.MISMATCH_KL,
    names.MISMATCH_K3,
    names.MISMATCH_PPL_SAMPLER,
    names.MISMATCH_PPL_OLD,
    names.MISMATCH_LOG_PPL_DIFF,
    names.MISMATCH_CHI2,
    names.MISMATCH_CHI2_SEQ,
    names.MISMATCH_RATIO_MEAN,
    names.MISMATCH_RATIO_MIN,
    names.MISMATCH_RATIO_MAX,
    names.MISMATCH_VALID_TOKENS,
)

CORRECTION_KEYS = (
    names.IS_WEIGHT_MEAN,
    names.IS_WEIGHT_STD,
    names.IS_WEIGHT_MIN,
    names.IS_WEIGHT_MAX,
    names.IS_ESS,
    names.IS_CLIPPED_FRAC,
    names.TOKEN_MASKED_FRAC,
    names.SEQ_VETOED_FRAC,
    names.MASKED_FRAC,
)


@torch.no_grad()
def mismatch_metrics(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Sampler-vs-dense mismatch statistics over the valid tokens (float64), verl-style.

    With ``log ρ_t = clamp(log p_t − log q_t, −20, 20)`` and ``ρ_t = exp(log ρ_t)``, token means
    over valid tokens, response means over responses with ≥ 1 valid token:

    - ``mismatch/log_ratio_abs_mean``, ``mismatch/log_ratio_abs_max``: mean / max of ``|log ρ_t|``
      (of the clamped value);
    - ``mismatch/kl``: mean of ``−log ρ_t`` (k1 estimate of KL(q‖p), tokens drawn from q);
    - ``mismatch/k3_kl``: mean of ``ρ_t − 1 − log ρ_t`` (k3 estimate of KL(q‖p), ≥ 0);
    - ``mismatch/ppl_sampler``, ``mismatch/ppl_old``: response mean of ``exp(−mean_t log q_t)`` /
      ``exp(−mean_t log p_t)`` (exponent capped at 80);
    - ``mismatch/log_ppl_diff``: response mean of ``mean_t (log q_t − log p_t)``
      (= log ppl_old − log ppl_sampler of each response);
    - ``mismatch/chi2``: ``mean ρ_t² − 1`` (token-level χ²(p‖q) estimate);
      ``mismatch/chi2_seq``: response mean of ``exp(2 clamp(Σ_t log ρ_t, ±20)) − 1``;
    - ``mismatch/ratio_mean|min|max`` of ``ρ_t``; ``mismatch/valid_tokens`` the count.

    Empty batch (no valid token): every value is 0 except those whose "no mismatch" value is 1
    (``ppl_*``, ``ratio_*``), which are 1. Never NaN for finite inputs.
    """
    valid = _valid(mask)
    n = int(valid.sum())
    lr = log_ratio(sampler_logprobs, old_logprobs, mask).double()
    if n == 0:
        out = {k: 0.0 for k in MISMATCH_KEYS}
        for k in (
            names.MISMATCH_PPL_SAMPLER,
            names.MISMATCH_PPL_OLD,
            names.MISMATCH_RATIO_MEAN,
            names.MISMATCH_RATIO_MIN,
            names.MISMATCH_RATIO_MAX,
        ):
            out[k] = 1.0
        return out
    vlr = lr[valid]
    rho = vlr.exp()
    n_b = valid.sum(-1)
    seq_ok = n_b > 0
    logq = torch.where(valid, sampler_logprobs.detach().double(), torch.zeros_like(lr))
    logp = torch.where(valid, old_logprobs.detach().double(), torch.zeros_like(lr))
    mean_logq = logq.sum(-1)[seq_ok] / n_b[seq_ok]
    mean_logp = logp.sum(-1)[seq_ok] / n_b[seq_ok]
    seq_lr = sequence_log_ratio(lr, mask)[seq_ok]
    out = {
        names.MISMATCH_LOG_RATIO: vlr.abs().mean(),
        names.MISMATCH_LOG_RATIO_MAX: vlr.abs().max(),
        names.MISMATCH_KL: (-vlr).mean(),
        names.MISMATCH_K3: (rho - 1 - vlr).mean(),
        names.MISMATCH_PPL_SAMPLER: (-mean_logq).clamp(max=80).exp().mean(),
        names.MISMATCH_PPL_OLD: (-mean_logp).clamp(max=80).exp().mean(),
        names.MISMATCH_LOG_PPL_DIFF: (mean_logq - mean_logp).mean(),
        names.MISMATCH_CHI2: (rho * rho).mean() - 1,
        names.MISMATCH_CHI2_SEQ: (2 * seq_lr).exp().mean() - 1,
        names.MISMATCH_RATIO_MEAN: rho.mean(),
        names.MISMATCH_RATIO_MIN: rho.min(),
        names.MISMATCH_RATIO_MAX: rho.max(),
    }
    res = {k: _finite(float(v)) for k, v in out.items()}
    res[names.MISMATCH_VALID_TOKENS] = float(n)
    return res


def _finite(x: float) -> float:
    if math.isnan(x):
        return 0.0
    if math.isinf(x):
        return math.copysign(torch.finfo(torch.float64).max, x)
    return x


@torch.no_grad()
def weight_metrics(
    weights: Tensor,
    final_mask: Tensor,
    input_mask: Tensor,
    *,
    token_rejected: Tensor | None = None,
    seq_rejected: Tensor | None = None,
    clipped: Tensor | None = None,
) -> dict[str, float]:
    """The ``is/*`` and ``rs/*`` metrics of one correction result.

    Over the kept (final-mask) tokens: ``is/weight_mean|std|min|max`` of the weights,
    ``is/ess = (Σw)² / (N Σw²)`` (effective-sample-size fraction, 1 for uniform weights) and
    ``is/clipped_frac`` (fraction of kept tokens whose weight was truncated/clipped).
    Over the input-valid tokens: ``rs/token_masked_frac`` (removed by a token-level criterion,
    whether or not their response was also vetoed) and ``rs/masked_frac`` (giving no gradient: absent from
    the final mask for any reason, or kept there with weight 0, as TRL's, IcePop's and NeMo-RL's masks do).
    Over responses with ≥ 1 input-valid token: ``rs/seq_vetoed_frac`` (removed as a whole by a sequence-level
    criterion).

    Empty sets give 0 (no kept token → weight stats 0 and ESS 0: no effective sample).
    """
    keep = _valid(final_mask)
    valid = _valid(input_mask)
    w = weights.detach().double()[keep]
    n = w.numel()
    out: dict[str, float] = {}
    if n:
        s1, s2 = w.sum(), (w * w).sum()
        out[names.IS_WEIGHT_MEAN] = float(w.mean())
        out[names.IS_WEIGHT_STD] = float(w.std(unbiased=False))
        out[names.IS_WEIGHT_MIN] = float(w.min())
        out[names.IS_WEIGHT_MAX] = float(w.max())
        out[names.IS_ESS] = float(s1 * s1 / (n * s2)) if float(s2) > 0 else 0.0
        out[names.IS_CLIPPED_FRAC] = float((clipped.bool() & keep).sum()) / n if clipped is not None else 0.0
    else:
        for k in (
            names.IS_WEIGHT_MEAN,
            names.IS_WEIGHT_STD,
            names.IS_WEIGHT_MIN,
            names.IS_WEIGHT_MAX,
            names.IS_ESS,
            names.IS_CLIPPED_FRAC,
        ):
            out[k] = 0.0
    n_valid = int(valid.sum())
    tr = 0 if token_rejected is None else int((token_rejected.bool() & valid).sum())
    out[names.TOKEN_MASKED_FRAC] = tr / n_valid if n_valid else 0.0
    silent = ~keep | (weights.detach() == 0)  # out of the mask, or in it with no weight: no gradient either way
    out[names.MASKED_FRAC] = int((valid & silent).sum()) / n_valid if n_valid else 0.0
    seq_valid = valid.any(-1)
    n_seq = int(seq_valid.sum())
    sr = 0 if seq_rejected is None else int((seq_rejected.bool() & seq_valid).sum())
    out[names.SEQ_VETOED_FRAC] = sr / n_seq if n_seq else 0.0
    return {k: _finite(v) for k, v in out.items()}


def build_correction(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    weights: Tensor | None = None,
    keep: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    token_rejected: Tensor | None = None,
    seq_rejected: Tensor | None = None,
    clipped: Tensor | None = None,
    clip_upper_scale: Tensor | None = None,
    extra_metrics: dict[str, float] | None = None,
) -> Correction:
    """Assemble a :class:`Correction` and compute all shared metrics.

    ``keep`` (bool ``[B, T]``, default all) is ANDed with the input mask; ``weights`` (default 1)
    are zeroed outside the final mask and detached; ``behaviour_logprobs`` defaults to
    ``old_logprobs``; ``clip_upper_scale`` is set to 1 outside the final mask.
    """
    valid = _valid(mask)
    final = valid if keep is None else valid & _valid(keep)
    if weights is None:
        weights = torch.ones(
            mask.shape, dtype=torch.promote_types(old_logprobs.dtype, torch.float32), device=mask.device
        )
    weights = weights.detach()
    weights = torch.where(final, weights, torch.zeros_like(weights))
    if clip_upper_scale is not None:
        clip_upper_scale = torch.where(final, clip_upper_scale.detach(), torch.ones_like(clip_upper_scale))
    metrics = mismatch_metrics(sampler_logprobs, old_logprobs, mask)
    metrics.update(
        weight_metrics(weights, final, mask, token_rejected=token_rejected, seq_rejected=seq_rejected, clipped=clipped)
    )
    if extra_metrics:
        metrics.update({k: _finite(float(v)) for k, v in extra_metrics.items()})
    return Correction(
        weights=weights,
        mask=final.to(mask.dtype),
        behaviour_logprobs=old_logprobs if behaviour_logprobs is None else behaviour_logprobs,
        metrics=metrics,
        clip_upper_scale=clip_upper_scale,
        token_rejected=None if token_rejected is None else token_rejected.bool() & valid,
        seq_rejected=None if seq_rejected is None else seq_rejected.bool() & valid.any(-1),
        clipped=None if clipped is None else clipped.bool() & valid,
    )


# --------------------------------------------------------------------------- composition


def merge_corrections(
    results: list[Correction] | tuple[Correction, ...],
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    names: list[str] | None = None,
) -> Correction:
    """Combine results computed **each on the same input mask** into one.

    The composition rule (order-independent):

    - ``mask``: AND of the masks (a token survives only if every correction keeps it);
    - ``weights``: product of the weights (then 0 outside the combined mask);
    - ``clip_upper_scale``: product of those given (``None`` counts as 1; ``None`` if none given);
    - ``behaviour_logprobs``: ``sampler_logprobs`` if any part uses it (bypass wins), else
      ``old_logprobs``;
    - ``token_rejected`` / ``seq_rejected`` / ``clipped``: OR; the shared ``is/*``, ``rs/*`` and
      ``mismatch/*`` metrics are recomputed on the combined result, and with more than one part
      each part's own ``is/*`` / ``rs/*`` metrics are kept as ``"<name>/is/..."``.

    A weight normalised to mean 1 by one part (e.g. ``sparse_rl``) is normalised over that
    part's kept tokens, so the product need not have mean 1 when other parts remove more tokens.
    """
    if not results:
        return build_correction(sampler_logprobs, old_logprobs, mask)
    if len(results) == 1:
        return results[0]
    valid = _valid(mask)
    keep = valid.clone()
    weights = None
    scale = None
    uses_sampler = False
    token_rej = seq_rej = clipped = None

    def _or(a: Tensor | None, b: Tensor | None) -> Tensor | None:
        if b is None:
            return a
        return b.bool() if a is None else a | b.bool()

    for r in results:
        keep = keep & _valid(r.mask)
        weights = r.weights if weights is None else weights * r.weights
        if r.clip_upper_scale is not None:
            scale = r.clip_upper_scale if scale is None else scale * r.clip_upper_scale
        if r.behaviour_logprobs is sampler_logprobs or (
            r.behaviour_logprobs is not old_logprobs and r.behaviour_logprobs.data_ptr() == sampler_logprobs.data_ptr()
        ):
            uses_sampler = True
        token_rej = _or(token_rej, r.token_rejected)
        seq_rej = _or(seq_rej, r.seq_rejected)
        clipped = _or(clipped, r.clipped)
    merged = build_correction(
        sampler_logprobs,
        old_logprobs,
        mask,
        weights=weights,
        keep=keep,
        behaviour_logprobs=sampler_logprobs if uses_sampler else old_logprobs,
        token_rejected=token_rej,
        seq_rejected=seq_rej,
        clipped=clipped,
        clip_upper_scale=scale,
    )
    names = names or [f"part{i}" for i in range(len(results))]
    seen: dict[str, int] = {}
    for name, r in zip(names, results):
        k = seen.get(name, 0)
        seen[name] = k + 1
        prefix = name if k == 0 else f"{name}{k}"
        for key in CORRECTION_KEYS:
            merged.metrics[correction_part_metric(prefix, key)] = r.metrics[key]
        for key, v in r.metrics.items():  # a user's correction's own extras, if any
            if not key.startswith(("mismatch/", "is/", "rs/")) and "/" in key:
                merged.metrics.setdefault(correction_part_metric(prefix, key), v)
    return merged


def compose(*parts: str | tuple[str, dict] | CorrectionFn) -> CorrectionFn:
    """A correction applying every part to the same input and merging them (rule:
    :func:`merge_corrections`). A part is a registered name, ``(name, options)``, or a function.

    >>> fn = compose(("sparse_rl", {}), ("tis", {"cap": 2.0}))
    >>> result = fn(sampler_logprobs, old_logprobs, mask)   # doctest: +SKIP
    """
    resolved: list[tuple[str, CorrectionFn, dict]] = []
    for p in parts:
        if isinstance(p, str):
            resolved.append((p, get_correction(p), {}))
        elif isinstance(p, tuple):
            name, opts = p
            resolved.append((name, get_correction(name), dict(opts or {})))
        elif callable(p):
            resolved.append((getattr(p, "correction_name", getattr(p, "__name__", "fn")), p, {}))
        else:
            raise TypeError(f"compose: cannot use {p!r} as a correction")

    def composed(sampler_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Correction:
        results = [fn(sampler_logprobs, old_logprobs, mask, **opts) for _, fn, opts in resolved]
        return merge_corrections(results, sampler_logprobs, old_logprobs, mask, names=[n for n, _, _ in resolved])

    composed.parts = [(n, o) for n, _, o in resolved]  # type: ignore[attr-defined]
    return composed
