"""``trl_is``: TRL's importance sampling of vLLM rollouts (``GRPOConfig.vllm_importance_sampling_mode``)."""

from __future__ import annotations

from torch import Tensor

from .base import Correction, build_correction, log_ratio, register_correction, sequence_log_ratio

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@register_correction("trl_is")
def trl_is(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Correction:
    """TRL's correction of the sampler's tokens (``GRPOTrainer``, ``vllm_importance_sampling_mode``,
    ``vllm_importance_sampling_clip_min`` / ``_clip_max``; defaults ``sequence_mask``, None, 3.0 as TRL's).

    The ratio is token-level ``ρ_t = p_t / q_t`` (``token_*``) or the response's product
    ``ρ_seq = exp(Σ_t log ρ_t)`` broadcast to its tokens (``sequence_*``; ``log ρ`` clamped to ±20, as every
    correction here). Then, with ``[a, b]`` = ``[clip_min, clip_max]`` (None: unbounded):

    - ``*_truncate``: ``w = clamp(ρ, a, b)`` (from below too, where ``clip_min`` is given);
    - ``*_mask``: ``w = ρ`` inside ``[a, b]``, else 0. As in TRL (``masked_fill(..., 0)``) a masked token keeps
      its place in the loss's normalisation (and its KL term): its weight is 0, its mask is not (counted in
      ``rs/token_masked_frac`` and ``rs/masked_frac``, the tokens giving no gradient).

    ``is/clipped_frac``: tokens whose ratio was truncated (``*_truncate``).
    """
    if mode not in MODES:
        raise ValueError(f"trl_is: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if clip_min is not None and clip_max is not None and not 0 <= clip_min < clip_max:
        raise ValueError(f"trl_is: need 0 <= clip_min < clip_max, got clip_min={clip_min}, clip_max={clip_max}")
    if clip_max is not None and clip_max <= 0:
        raise ValueError(f"trl_is: clip_max must be > 0, got {clip_max}")
    lr = log_ratio(sampler_logprobs, old_logprobs, mask)
    if mode.startswith("sequence"):
        lr = sequence_log_ratio(lr, mask)[:, None].expand_as(lr)
    rho = lr.exp()
    low = rho < clip_min if clip_min is not None else rho < 0
    high = rho > clip_max if clip_max is not None else rho < 0
    if mode.endswith("truncate"):
        w = rho.clamp(min=clip_min, max=clip_max)
        return build_correction(sampler_logprobs, old_logprobs, mask, weights=w, clipped=low | high)
    out = low | high
    w = rho.masked_fill(out, 0.0)
    return build_correction(sampler_logprobs, old_logprobs, mask, weights=w, token_rejected=out)
