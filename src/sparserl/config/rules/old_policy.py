"""The compressor with its options, and where the old policy's log-probs come from."""

from __future__ import annotations

from ...errors import SparserlError
from ..schema import Config


def compressor_builds_and_old_policy(cfg: Config) -> list[str]:
    """The compressor builds from rollout.* with its options (it checks them itself); algorithm.old_logprobs
    names a source that runs the old policy for this sampler and update
    (:func:`sparserl.score.old_policy.old_logprobs_source`)."""
    from ...models.mixed_precision import learner_compute_dtype
    from ...rollout.dtype_auto import resolve_dtype
    from ...rollout.kv import compressor_from_fields
    from ...score.old_policy import old_logprobs_source

    r, a = cfg.rollout, cfg.algorithm
    try:
        compressor = compressor_from_fields(r)
    except (TypeError, ValueError) as e:
        return [
            f"rollout.compressor={r.compressor!r} with rollout.compressor_options={dict(r.compressor_options)}: "
            f"{e} (options are method-specific; clear them with rollout.compressor_options={{}})"
        ]
    try:
        old_logprobs_source(
            a.old_logprobs,
            why_not_update=cfg.why_update_forward_is_not_old_policy(),
            compresses=compressor.compresses,
            sampler_dtype=resolve_dtype(r.dtype, cfg.model.device),
            learner_dtype=learner_compute_dtype(cfg.model),
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            quantized=r.quantized,
            lagged=r.async_,
        )
    except SparserlError as e:
        return [str(e)]
    return []
