"""``rejection``: verl's rollout-correction rejection criteria (token / sequence / geometric)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Correction, build_correction, log_ratio, register_correction

METRICS = ("ratio", "k1", "k2", "k3")
LEVELS = ("token", "seq_sum", "seq_mean", "seq_max", "geometric")

# Default (low, high) bounds by (metric, level) when neither is given. Ratio bounds follow verl's
# presets: token/sequence ratio 0.5..2.0 (``rollout_is_threshold`` 2.0, lower = 1/upper;
# ``decoupled_seq_is_rs`` "0.5_2.0"), geometric/seq-mean ratio 0.999..1.001 (``decoupled_geo_rs``).
# k1 = −log ρ takes the same bounds in log space. k3 seq_mean 0.01 is verl's
# ``bypass_ppo_clip_k3_rs``; the other k2/k3 uppers (0.25 per token ≈ k2 at ρ = 2; 2.5 for a
# sequence sum, verl's test value) are untuned placeholders: set them for real runs.
_LOG2 = math.log(2.0)
_LOGG = math.log(1.001)
_DEFAULTS: dict[tuple[str, str], tuple[float, float]] = {
    ("ratio", "token"): (0.5, 2.0),
    ("ratio", "seq_sum"): (0.5, 2.0),
    ("ratio", "seq_mean"): (0.999, 1.001),
    ("ratio", "seq_max"): (0.5, 2.0),
    ("k1", "token"): (-_LOG2, _LOG2),
    ("k1", "seq_sum"): (-_LOG2, _LOG2),
    ("k1", "seq_mean"): (-_LOGG, _LOGG),
    ("k1", "seq_max"): (-_LOG2, _LOG2),
    ("k2", "token"): (-math.inf, 0.25),
    ("k2", "seq_sum"): (-math.inf, 2.5),
    ("k2", "seq_mean"): (-math.inf, 0.01),
    ("k2", "seq_max"): (-math.inf, 0.25),
    ("k3", "token"): (-math.inf, 0.25),
    ("k3", "seq_sum"): (-math.inf, 2.5),
    ("k3", "seq_mean"): (-math.inf, 0.01),
    ("k3", "seq_max"): (-math.inf, 0.25),
}


def _bounds(metric: str, level: str, low: float | None, high: float | None) -> tuple[float, float]:
    if level == "geometric":
        d_low, d_high = 0.999, 1.001
    else:
        d_low, d_high = _DEFAULTS[(metric, level)]
    if high is None:
        high = d_high
    if low is None:
        # verl: a ratio bound given alone implies the reciprocal lower bound.
        if metric == "ratio" or level == "geometric":
            low = 1.0 / high if high > 0 else 0.0
        elif metric == "k1":
            low = -high
        else:
            low = d_low
    return float(low), float(high)


@register_correction("rejection")
def rejection(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    metric: str = "ratio",
    level: str = "token",
    low: float | None = None,
    high: float | None = None,
    veto: float | None = None,
) -> Correction:
    """Rejection sampling on the sampler/dense mismatch (verl ``algorithm.rollout_correction``
    ``rollout_rs``; Liu, Li et al. 2025 "When Speed Kills Stability"). No reweighting (w = 1).

    Per token, with ``ℓ_t = log ρ_t = clamp(log p_t − log q_t, ±20)``, ``metric`` is one of
    ``"ratio"`` (ρ_t itself), ``"k1"`` (``−ℓ_t``), ``"k2"`` (``½ ℓ_t²``), ``"k3"``
    (``ρ_t − 1 − ℓ_t``, ≥ 0, mean = KL(q‖p)). ``level`` aggregates and decides what is removed:

    - ``"token"``: tokens whose value lies outside ``[low, high]`` are masked;
    - ``"seq_sum"`` / ``"seq_mean"``: a response whose sum / mean of the value over its valid
      tokens lies outside ``[low, high]`` is removed whole. For ``metric="ratio"`` the aggregate
      is taken in log space: ``exp(Σ ℓ_t)`` (the sequence ratio, verl ``seq_sum_k1``) and
      ``exp(mean ℓ_t)`` (the geometric mean, verl ``seq_mean_k1``);
    - ``"seq_max"``: a response is removed if any of its valid tokens lies outside
      ``[low, high]`` (for k2/k3 ≥ 0: ``max_t value > high``);
    - ``"geometric"``: keep a response iff ``exp(mean_t ℓ_t) ∈ [low, high]`` (default
      ``[0.999, 1.001]``, verl ``decoupled_geo_rs``); ``metric`` is ignored.

    Bounds: ``None`` takes the default of ``(metric, level)`` (table ``_DEFAULTS`` above: ratio
    0.5..2.0 per token / sequence, 0.999..1.001 for seq_mean; k1 the same in log space; k2/k3
    upper only, 0.01 for seq_mean). Given only ``high``, ``low`` = ``1/high`` for ratio bounds,
    ``−high`` for k1, −∞ for k2/k3 (verl's rule). ``veto`` (optional, verl
    ``rollout_token_veto_threshold``): also remove a response with any token ``ρ_t < veto``.
    Responses with no valid token are never counted as rejected.
    """
    if metric not in METRICS:
        raise ValueError(f"rejection: metric must be one of {METRICS}, got {metric!r}")
    if level not in LEVELS:
        raise ValueError(f"rejection: level must be one of {LEVELS}, got {level!r}")
    lo, hi = _bounds(metric, level, low, high)
    valid = mask != 0
    lr = log_ratio(sampler_logprobs, old_logprobs, mask).double()
    ratio_space = metric == "ratio" or level == "geometric"
    if ratio_space:
        # compare log ρ with log bounds: no overflow
        val = lr
        lo_c = math.log(lo) if lo > 0 else -math.inf
        hi_c = math.log(hi) if hi > 0 else -math.inf
    else:
        lo_c, hi_c = lo, hi
        if metric == "k1":
            val = -lr
        elif metric == "k2":
            val = 0.5 * lr * lr
        else:
            val = lr.exp() - 1 - lr

    def outside(x: Tensor) -> Tensor:
        return (x < lo_c) | (x > hi_c)

    token_rej = None
    seq_rej = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
    n_b = valid.sum(-1)
    if level == "token":
        token_rej = valid & outside(val)
        keep = ~token_rej
    else:
        vz = torch.where(valid, val, torch.zeros_like(val))
        if level == "seq_sum":
            agg = vz.sum(-1)
            seq_rej = outside(agg)
        elif level in ("seq_mean", "geometric"):
            agg = vz.sum(-1) / n_b.clamp(min=1)
            seq_rej = outside(agg)
        else:  # seq_max: any token out of bounds
            seq_rej = (valid & outside(val)).any(-1)
        seq_rej = seq_rej & (n_b > 0)
        keep = torch.ones_like(valid)
    if veto is not None:
        seq_rej = seq_rej | (valid & (lr.exp() < veto)).any(-1)
    keep = keep & ~seq_rej[:, None]
    return build_correction(
        sampler_logprobs, old_logprobs, mask, keep=keep, token_rejected=token_rej, seq_rejected=seq_rej
    )
