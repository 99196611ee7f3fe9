"""``mis``: masked importance sampling (verl "MIS", TRL ``*_mask`` IS modes)."""

from __future__ import annotations

from torch import Tensor

from .base import (
    Correction,
    batch_normalize,
    build_correction,
    log_ratio,
    register_correction,
    sequence_log_ratio,
)


@register_correction("mis")
def mis(
    sampler_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    cap: float = 2.0,
    lower: float = 0.0,
    normalize: bool = False,
) -> Correction:
    """Masked IS: drop what would be truncated, reweight the rest by the untruncated ratio.

    - ``level="token"``: a token with ``ρ_t > C`` (or ``ρ_t < lower``) is masked; the others get
      ``w_t = ρ_t``;
    - ``level="sequence"``: with ``ρ_seq = exp(clamp(Σ_t log ρ_t, ±20))``, a response with
      ``ρ_seq > C`` (or ``< lower``) is masked whole; the others get ``w_t = ρ_seq``.

    ``ρ_t = exp(clamp(log p_t − log q_t, −20, 20))``, ``C = cap`` (default 2.0, verl's threshold),
    ``lower`` default 0 (no lower bound). ``normalize=True``: weights divided by their batch mean
    over kept tokens (``token``) or kept responses (``sequence``). Nothing is truncated, so
    ``is/clipped_frac`` is 0; removals are counted in ``rs/token_masked_frac`` (token level) or
    ``rs/seq_vetoed_frac`` (sequence level).
    """
    lr = log_ratio(sampler_logprobs, old_logprobs, mask)
    if level == "token":
        rho = lr.exp()
        bad = (rho > cap) | (rho < lower)
        keep, token_rej, seq_rej = ~bad, bad, None
    elif level == "sequence":
        rho_seq = sequence_log_ratio(lr, mask).exp()
        bad_seq = (rho_seq > cap) | (rho_seq < lower)
        rho = rho_seq[:, None].expand_as(lr)
        keep, token_rej, seq_rej = ~bad_seq[:, None].expand_as(lr), None, bad_seq
    else:
        raise ValueError(f"mis: level must be 'token' or 'sequence', got {level!r}")
    w = rho
    if normalize:
        w = batch_normalize(w, keep & (mask != 0), per_sequence=level == "sequence")
    return build_correction(
        sampler_logprobs, old_logprobs, mask, weights=w, keep=keep, token_rejected=token_rej, seq_rejected=seq_rej
    )
