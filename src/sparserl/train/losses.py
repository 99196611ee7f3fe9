"""Policy loss (PPO-clip with importance weights and QuRL's adaptive clip), loss aggregation,
KL penalties and entropy.

Tensors are padded ``[B, T]`` with ``mask`` ``[B, T]`` (1 = a token that enters the loss: pass the
*final* mask of the correction, ``Correction.mask``). ``logprobs`` (log π, learner) carries the
gradient; everything else is treated as a constant (detached).

Loss aggregations (``loss_agg``), with ``ℓ_{b,t}`` the per-token loss and ``m_{b,t}`` the mask:

- ``"seq_mean_token_mean"`` (GRPO, Sparse-RL): ``(1/S) Σ_b (Σ_t ℓ m / Σ_t m)`` where the sum and
  ``S`` run over responses with ≥ 1 kept token: a fully rejected (vetoed) response contributes
  nothing and is not counted in the denominator (so a veto does not shrink the gradient of the
  other responses);
- ``"token_mean"`` (DAPO): ``Σ_{b,t} ℓ m / Σ_{b,t} m``;
- ``"seq_mean_token_sum_norm"`` (Dr.GRPO): ``Σ_{b,t} ℓ m / (S · L)`` with ``L = max_len`` (a
  constant, e.g. the maximum response length; defaults to ``T``) and ``S`` = all ``B`` responses
  (Dr.GRPO's constant normaliser; rejected responses count as zero-loss rows).

Every aggregation returns exactly 0 (with zero gradient) when no token is kept.

Gradient accumulation (micro-batches). Split the batch **along B** (whole responses) into
micro-batches. Compute the normalisers once from the FULL batch's final mask with
:func:`loss_normalizers` (``num_tokens_total = Σ m``, ``num_seqs_total`` = number of responses
with ≥ 1 kept token for ``seq_mean_token_mean`` or ``B`` for ``seq_mean_token_sum_norm``,
``max_len``), pass them unchanged to every micro-batch call, and ``backward()`` each micro-batch
loss **as is** (no division by the number of micro-batches). The micro-batch losses then sum to
the full-batch loss and the accumulated gradient equals the full-batch gradient exactly (up to
floating-point summation order). Without normalisers each call normalises by its own
micro-batch, which is the usual (biased) per-micro-batch mean.

The total objective is assembled by the caller or by :func:`total_loss`::

    pg, m = policy_loss(logprobs, corr.behaviour_logprobs, adv, corr.mask, corr.weights,
                        clip_upper_scale=corr.clip_upper_scale, **norms)
    kl = agg_loss(kl_penalty(logprobs, ref_logprobs, "low_var_kl"), corr.mask, **norms)
    loss = total_loss(pg, kl=kl, kl_coef=1e-4)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import runlog as names

__all__ = [
    "LOSS_AGGS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "off_policy_sequence_mask",
    "unbiased_kl_ratio",
    "KL_KINDS",
    "agg_loss",
    "loss_normalizers",
    "policy_loss",
    "kl_penalty",
    "entropy_from_logits",
    "total_loss",
]

LOSS_AGGS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3", "low_var_kl", "abs")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
_LOG_RATIO_CLAMP = 20.0


def _valid(mask: Tensor) -> Tensor:
    return mask != 0


def _denominator(value, fallback: Tensor) -> Tensor:
    if value is None:
        return fallback.to(torch.float32).clamp(min=1)
    return torch.as_tensor(float(value), device=fallback.device).clamp(min=1)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    loss_agg: str = "seq_mean_token_mean",
    *,
    max_len: int | None = None,
    num_seqs_total: int | float | None = None,
    num_tokens_total: int | float | None = None,
) -> Tensor:
    """Aggregate a per-token loss ``[B, T]`` to a scalar (see the module docstring for the
    formulas and for the global normalisers used in gradient accumulation).

    ``num_tokens_total`` replaces ``Σ m`` (``token_mean``); ``num_seqs_total`` replaces the
    response count ``S`` (``seq_mean_token_mean``, ``seq_mean_token_sum_norm``); ``max_len``
    replaces ``T`` (``seq_mean_token_sum_norm``). A denominator below 1 is raised to 1.
    """
    valid = _valid(mask)
    lm = torch.where(valid, loss_mat, torch.zeros_like(loss_mat))
    if loss_agg == "token_mean":
        return lm.sum() / _denominator(num_tokens_total, valid.sum())
    if loss_agg == "seq_mean_token_mean":
        n_b = valid.sum(-1)
        seq = lm.sum(-1) / n_b.clamp(min=1).to(lm.dtype)
        return seq.sum() / _denominator(num_seqs_total, (n_b > 0).sum())
    if loss_agg == "seq_mean_token_sum_norm":
        length = float(max_len if max_len is not None else mask.shape[-1])
        s = _denominator(num_seqs_total, torch.tensor(mask.shape[0], device=mask.device))
        return lm.sum() / (s * max(length, 1.0))
    raise ValueError(f"unknown loss_agg {loss_agg!r}; available: {', '.join(LOSS_AGGS)}")


def loss_normalizers(mask: Tensor, loss_agg: str = "seq_mean_token_mean", max_len: int | None = None) -> dict:
    """Normalisers of the FULL batch, to pass as ``**kwargs`` to :func:`policy_loss` /
    :func:`agg_loss` on every micro-batch so that the micro-batch losses sum to the full-batch
    loss. Returns ``{"loss_agg", "num_tokens_total", "num_seqs_total", "max_len"}``."""
    valid = _valid(mask)
    if loss_agg == "seq_mean_token_mean":
        n_seqs = int((valid.sum(-1) > 0).sum())
    elif loss_agg in LOSS_AGGS:
        n_seqs = int(mask.shape[0])
    else:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; available: {', '.join(LOSS_AGGS)}")
    return {
        "loss_agg": loss_agg,
        "num_tokens_total": int(valid.sum()),
        "num_seqs_total": n_seqs,
        "max_len": int(max_len if max_len is not None else mask.shape[-1]),
    }


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    clip_upper_scale: Tensor | None = None,
    loss_agg: str = "seq_mean_token_mean",
    *,
    dual_clip_c: float | None = None,
    importance_sampling_level: str = "token",
    max_len: int | None = None,
    num_seqs_total: int | float | None = None,
    num_tokens_total: int | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Importance-weighted PPO-clip loss (to minimise) and its metrics.

    Per token, with ``r_t = exp(clamp(log π_t − log μ_t, ±20))`` (μ = ``behaviour_logprobs``,
    the dense old policy p in three-policy mode, the sampler q in bypass mode):

        ``ℓ_t = w_t · max(−r_t A_t, −clip(r_t, 1 − ε, U_t) A_t)``,
        ``U_t = (1 + ε_high) · s_t``

    with ``ε = clip_eps`` (0.2), ``ε_high = clip_eps_high`` (default ``ε``; DAPO's clip-higher
    uses 0.28), ``s_t = clip_upper_scale`` (default 1; QuRL's adaptive clipping range gives
    ``s_t = 1/r_t = max(1, ρ_t/C)`` so ``U_t = (1+ε)/r_t``, Li et al. 2026 arXiv 2602.13953),
    ``w_t = weights`` (default 1; Sparse-RL / TIS importance weights). This is Sparse-RL's loss
    (Luo et al. 2026, arXiv 2601.10079) with ``w`` from ``correct.sparse_rl``. ``dual_clip_c``
    (optional, verl's ``clip_ratio_c``, e.g. 3.0) further bounds ``ℓ_t ≤ −c A_t · w_t`` for
    ``A_t < 0``. ``importance_sampling_level="sequence"`` is GSPO (Zheng et al., 2025, arXiv 2507.18071; TRL's
    ``importance_sampling_level="sequence"``, verl's ``loss_mode=gspo``): every token of response b takes
    the sequence's length-normalised ratio, in its GSPO-token form (the same value and, with a
    per-response advantage, the same gradient as GSPO's):

        ``log r_t = log π_t − sg[log π_t] + sg[(1/|y_b|) Σ_{t'} (log π_{t'} − log μ_{t'})]``

    over the tokens of ``mask`` (GSPO's published clip range is ε 3e-4, ε_high 4e-4).
    ``advantages`` is ``[B]`` (broadcast over tokens) or ``[B, T]``. Aggregated by
    :func:`agg_loss` (``loss_agg``, ``max_len``, ``num_seqs_total``, ``num_tokens_total``).

    Metrics (floats, over the tokens of ``mask`` in this call):
    ``policy/clip_frac_low`` (A < 0 and r < 1 − ε: clipped from below),
    ``policy/clip_frac_high`` (A > 0 and r > U), ``policy/clip_frac`` (their sum),
    ``policy/ratio_mean|min|max``, ``policy/approx_kl`` (mean of ``r − 1 − log r``: k3 estimate of
    KL(μ‖π)), ``policy/pg_loss``; ``policy/dual_clip_frac`` when ``dual_clip_c`` is set.
    Empty mask: loss 0 with zero gradient, ratio metrics 1, the rest 0.
    """
    valid = _valid(mask)
    lr = torch.where(valid, logprobs - behaviour_logprobs.detach(), torch.zeros_like(logprobs))
    if importance_sampling_level == "sequence":
        seq = lr.sum(-1) / valid.sum(-1).clamp(min=1).to(lr.dtype)
        lr = torch.where(valid, logprobs - logprobs.detach() + seq.detach()[:, None], torch.zeros_like(logprobs))
    elif importance_sampling_level != "token":
        raise ValueError(
            f"unknown importance_sampling_level {importance_sampling_level!r}; "
            f"available: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    lr = lr.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = lr.exp()
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(ratio)
    adv = torch.where(valid, adv.to(ratio.dtype), torch.zeros_like(ratio))
    w = (
        torch.ones_like(ratio)
        if weights is None
        else torch.where(valid, weights.detach().to(ratio.dtype), torch.zeros_like(ratio))
    )
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    lower = 1.0 - clip_eps
    if clip_upper_scale is None:
        upper = torch.full_like(ratio, 1.0 + eps_high)
    else:
        s = torch.where(valid, clip_upper_scale.detach().to(ratio.dtype), torch.ones_like(ratio))
        upper = (1.0 + eps_high) * s
    clipped_ratio = torch.minimum(ratio.clamp(min=lower), upper)
    pg1 = -adv * ratio
    pg2 = -adv * clipped_ratio
    pg = torch.maximum(pg1, pg2)
    if dual_clip_c is not None:
        pg3 = -adv * dual_clip_c
        dual = (adv < 0) & (pg > pg3)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    loss = agg_loss(
        w * pg, mask, loss_agg, max_len=max_len, num_seqs_total=num_seqs_total, num_tokens_total=num_tokens_total
    )

    with torch.no_grad():
        n = int(valid.sum())
        r = ratio.detach()
        if n:
            metrics = {
                names.POLICY_CLIP_FRAC_LOW: float((valid & (adv < 0) & (r < lower)).sum()) / n,
                names.POLICY_CLIP_FRAC_HIGH: float((valid & (adv > 0) & (r > upper)).sum()) / n,
                names.POLICY_RATIO_MEAN: float(r[valid].mean()),
                names.POLICY_RATIO_MIN: float(r[valid].min()),
                names.POLICY_RATIO_MAX: float(r[valid].max()),
                names.POLICY_APPROX_KL: float((r - 1 - lr.detach())[valid].mean()),
            }
            if dual_clip_c is not None:
                metrics[names.POLICY_DUAL_CLIP_FRAC] = float((valid & dual).sum()) / n
        else:
            metrics = {
                names.POLICY_CLIP_FRAC_LOW: 0.0,
                names.POLICY_CLIP_FRAC_HIGH: 0.0,
                names.POLICY_RATIO_MEAN: 1.0,
                names.POLICY_RATIO_MIN: 1.0,
                names.POLICY_RATIO_MAX: 1.0,
                names.POLICY_APPROX_KL: 0.0,
            }
            if dual_clip_c is not None:
                metrics[names.POLICY_DUAL_CLIP_FRAC] = 0.0
        metrics[names.POLICY_CLIP_FRAC] = metrics[names.POLICY_CLIP_FRAC_LOW] + metrics[names.POLICY_CLIP_FRAC_HIGH]
        metrics[names.POLICY_PG_LOSS] = float(loss.detach())
    return loss, metrics


@torch.no_grad()
def off_policy_sequence_mask(
    logprobs: Tensor, sampler_logprobs: Tensor, advantages: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (DeepSeek-AI, 2025, arXiv 2512.02556; TRL's
    ``get_off_policy_mask``): bool ``[B]``, False for a response to leave out of the policy loss,

        ``M_b = 0  iff  A_b < 0  and  (1/|y_b|) Σ_t (log q_t − log π_θ,t) > δ``

    with ``q`` the sampler's log-probs, ``π_θ`` the current policy's (``logprobs``, read detached), ``δ`` =
    ``threshold``: negative-advantage responses the current policy has drifted far from. ``advantages`` [B] or
    [B, T] (then their mean over the response's tokens)."""
    valid = _valid(mask)
    n = valid.sum(-1).clamp(min=1)
    drift = torch.where(valid, sampler_logprobs - logprobs.detach(), torch.zeros_like(logprobs)).sum(-1) / n
    adv = advantages if advantages.dim() == 1 else torch.where(valid, advantages, 0).sum(-1) / n
    return (adv >= 0) | (drift <= threshold)


def unbiased_kl_ratio(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """``π_θ / π_old`` per token ``[B, T]`` (gradient through ``logprobs``), the factor of DeepSeek-V3.2's
    unbiased KL estimate (arXiv 2512.02556; TRL's ``use_bias_correction_kl``): the tokens were drawn by the old
    policy, so the per-token estimate of KL(π_θ ‖ π_ref) is reweighted to the current one,

        ``KL_t = (π_θ,t / π_old,t) · (π_ref,t / π_θ,t − log(π_ref,t / π_θ,t) − 1)``

    ``level="sequence"`` (GSPO): the response's length-normalised ratio on each token, as TRL. 1 on padding;
    the log-ratio clamped to ±20 as the policy loss's."""
    valid = _valid(mask)
    lr = torch.where(valid, logprobs - behaviour_logprobs.detach(), torch.zeros_like(logprobs))
    if level == "sequence":
        lr = (lr.sum(-1) / valid.sum(-1).clamp(min=1).to(lr.dtype))[:, None].expand_as(lr)
    return lr.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate between the learner π and a reference policy (verl ``kl_penalty``).

    With ``d = log π − log π_ref`` (gradient through ``logprobs`` only):
    ``"k1"`` = ``d``; ``"abs"`` = ``|d|``; ``"k2"`` = ``½ d²``;
    ``"k3"`` = ``exp(−d) − 1 + d`` (Schulman's k3, ≥ 0, unbiased for KL(π‖π_ref) on π's samples;
    ``−d`` clamped to ±20 before ``exp``); ``"low_var_kl"`` = k3 clamped to ``[−10, 10]`` (verl).
    Not masked: aggregate with :func:`agg_loss`.
    """
    d = logprobs - ref_logprobs.detach()
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    if kind in ("k3", "low_var_kl"):
        kl = (-d).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        k3 = kl.exp() - kl - 1
        return k3.clamp(-10.0, 10.0) if kind == "low_var_kl" else k3
    raise ValueError(f"unknown kl kind {kind!r}; available: {', '.join(KL_KINDS)}")


def _entropy(logits: Tensor) -> Tensor:
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    lse = torch.logsumexp(x, dim=-1)
    p = torch.softmax(x, dim=-1)
    # Σ_v p_v x_v as a batched dot product: no [.., V] product tensor
    px = (p.unsqueeze(-2) @ x.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    return lse - px


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Per-position entropy ``H = logsumexp(x) − Σ_v softmax(x)_v x_v`` of logits ``[..., V]``
    (computed in float32 for half-precision inputs); returns ``[...]``.

    ``chunk_size`` processes that many positions at a time to bound peak memory (one extra
    ``[chunk, V]`` buffer); useful for metrics under ``torch.no_grad()`` (with autograd the saved
    tensors of every chunk are kept anyway).
    """
    if chunk_size is None:
        return _entropy(logits)
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    out = [_entropy(flat[i : i + chunk_size]) for i in range(0, flat.shape[0], chunk_size)]
    if not out:
        return logits.new_zeros(shape, dtype=torch.float32)
    return torch.cat(out).reshape(shape)


def total_loss(
    pg_loss: Tensor,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
) -> Tensor:
    """``pg_loss + kl_coef · kl − entropy_coef · entropy`` (scalars, each already aggregated with
    the same :func:`agg_loss` settings). Sparse-RL: ``kl`` = low_var_kl to the reference model,
    ``kl_coef = 1e-4``, no entropy bonus."""
    loss = pg_loss
    if kl is not None and kl_coef:
        loss = loss + kl_coef * kl
    if entropy is not None and entropy_coef:
        loss = loss - entropy_coef * entropy
    return loss
