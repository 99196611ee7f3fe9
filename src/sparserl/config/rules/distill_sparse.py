"""DistillSparse (Sparrow): φ is trained through a replay of what the sparse sampler attended."""

from __future__ import annotations

from ..schema import Config


def distill_sparse_sampler(cfg: Config) -> list[str]:
    """DistillSparse needs a full-precision sparse sampler sampling from its whole tempered distribution,
    and the exact α's replay."""
    r, a = cfg.rollout, cfg.algorithm
    if a.distill_sparse is None:
        return []
    errors: list[str] = []
    if r.compressor == "none":
        errors.append(
            "algorithm.distill_sparse needs a sparse sampler: with rollout.compressor=none the sampler is "
            "the dense policy and φ has nothing to distill; set rollout.compressor (e.g. rkv) and "
            "rollout.kv_budget, or leave distill_sparse out"
        )
    if r.quantized or r.quant_scale != 1.0:
        errors.append(
            f"algorithm.distill_sparse with rollout.quant={r.quant!r}, kv_quant={r.kv_quant!r}, "
            f"quant_scale={r.quant_scale}: its replay reproduces which tokens the sampler attended, "
            "not the rounding of quantized weights or KV; use a full-precision sparse sampler"
        )
    if r.dtype in ("bfloat16", "float16"):
        errors.append(
            f"algorithm.distill_sparse with rollout.dtype={r.dtype}: its replay runs in float32 and "
            "reproduces which tokens the sampler attended, not a half-precision step's rounding; use "
            "rollout.dtype=float32 or auto (float32 with distill_sparse)"
        )
    if cfg.mismatch.alpha != "exact":
        errors.append(
            f"algorithm.distill_sparse with mismatch.alpha={cfg.mismatch.alpha!r}: it records what the "
            "sampler attended during the exact α's replay and logs mismatch/alpha_p5_nophi from it; "
            "set mismatch.alpha=exact"
        )
    if r.top_p < 1.0 or r.top_k > 0 or r.temperature <= 0:
        errors.append(
            f"algorithm.distill_sparse with rollout.temperature={r.temperature}, top_p={r.top_p}, "
            f"top_k={r.top_k}: φ's loss uses the sampler's full tempered distribution; use temperature "
            "> 0, top_p=1 and top_k=0"
        )
    return errors
