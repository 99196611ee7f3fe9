"""``sparse_rl``: Sparse-RL's sparsity-aware rejection sampling and importance reweighting."""

from __future__ import annotations

from torch import Tensor

from .base import Correction, batch_normalize, build_correction, log_ratio, register_correction

IS_MODES = ("truncate", "clip", "mask")
NORMALIZE_OVER = ("valid", "kept")


@register_correction("sparse_rl")
def sparse_rl(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    token_low: float = 0.5,
    token_high: float = 1.5,
    veto: float = 1e-4,
    is_cap: float = 1.5,
    is_floor: float = 0.0,
    is_mode: str = "truncate",
    normalize: bool = True,
    normalize_over: str = "valid",
) -> Correction:
    """Sparse-RL (Luo et al. 2026, arXiv 2601.10079; docs/algorithms.md §1).

    With ``ρ_t = exp(clamp(log p_t − log q_t, −20, 20))`` (p dense old policy, q sparse sampler):

    1. token mask: a valid token with ``ρ_t ∉ [token_low, token_high]`` (default [0.5, 1.5]) is
       removed (numerator and its response's denominator);
    2. sequence veto: a response with any valid token ``ρ_t < veto`` (default 1e-4: the sampler
       gave it ≥ 10⁴× the dense probability) is removed whole;
    3. reweighting of every valid token, by ``is_mode``:
       ``"truncate"`` (default) ``w_t = min(ρ_t, is_cap)``; ``"clip"`` ``w_t = clamp(ρ_t, is_floor,
       is_cap)``; ``"mask"`` ``w_t = ρ_t``, and tokens with ``ρ_t > is_cap`` get ``w_t = 0`` and are
       removed too;
    4. ``normalize=True``: ``w_t ← w_t / mean(w)``, the mean taken, by ``normalize_over``, over
       ``"valid"`` (default, as published: the batch's loss mask *before* rejection, rejected and
       vetoed tokens' weights included — slime ``examples/train_infer_mismatch_helper/mis.py``) or
       ``"kept"`` (over the tokens that survive steps 1-2: kept weights have mean exactly 1);
    5. the rejection mask and the veto apply last: ``w_t ← w_t · keep_t``.

    Every token rejected → weights 0 and mask 0 (no NaN).
    ``is/clipped_frac`` = kept tokens whose weight was changed by the truncation/clip.
    """
    if is_mode not in IS_MODES:
        raise ValueError(f"sparse_rl: is_mode must be one of {IS_MODES}, got {is_mode!r}")
    if normalize_over not in NORMALIZE_OVER:
        raise ValueError(f"sparse_rl: normalize_over must be one of {NORMALIZE_OVER}, got {normalize_over!r}")
    valid = mask != 0
    rho = log_ratio(sampler_logprobs, old_logprobs, mask).exp()
    token_bad = valid & ((rho < token_low) | (rho > token_high))
    seq_veto = (valid & (rho < veto)).any(-1)
    if is_mode == "truncate":
        w = rho.clamp(max=is_cap)
        clipped = rho > is_cap
    elif is_mode == "clip":
        w = rho.clamp(min=is_floor, max=is_cap)
        clipped = (rho > is_cap) | (rho < is_floor)
    else:  # mask
        w = rho * (rho <= is_cap)  # a masked token weighs 0 (but counts in the "valid" mean)
        clipped = None
        token_bad = token_bad | (valid & (rho > is_cap))
    keep = valid & ~token_bad & ~seq_veto[:, None]
    if normalize:
        w = batch_normalize(w, valid if normalize_over == "valid" else keep)
    w = w * keep
    return build_correction(
        sampler_logprobs,
        old_logprobs,
        mask,
        weights=w,
        keep=keep,
        token_rejected=token_bad,
        seq_rejected=seq_veto,
        clipped=clipped,
    )
