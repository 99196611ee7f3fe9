"""The sampler's weight quantization and its options (SmoothQuant, outlier channels, the head, groups).

Each quantizer says what it does (``quantizes``, ``quantizes_activations``, ``takes_group``); an option
that acts on something the chosen quantizer does not quantize is refused.
"""

from __future__ import annotations

from ..schema import QUANT_GROUP, Config


def quant_options(cfg: Config) -> list[str]:
    """SmoothQuant and outlier channels act on quantized activations, quant_head on quantized weights,
    quant_group on int8_group's groups; fp32_head on a half-precision head that is not quantized."""
    from ...rollout.quant import build_quant

    r = cfg.rollout
    quant = build_quant(r.quant)
    errors: list[str] = []
    if r.quant_smooth and not quant.quantizes_activations:
        errors.append(
            f"rollout.quant_smooth={r.quant_smooth} needs rollout.quant int8, int8_group or fp8 "
            f"(SmoothQuant moves activation outliers into the weights; rollout.quant={r.quant!r} "
            f"quantizes no activations)"
        )
    if r.quant_outliers and not quant.quantizes_activations:
        errors.append(
            f"rollout.quant_outliers={r.quant_outliers} needs rollout.quant int8, int8_group or fp8 "
            f"(it keeps activation outlier channels out of the quantized product; rollout.quant="
            f"{r.quant!r} quantizes no activations)"
        )
    if r.quant_head and not quant.quantizes:
        errors.append(
            f"rollout.quant_head=true needs a weight quantization (rollout.quant int8, int8_group, fp8, "
            f"...; rollout.quant={r.quant!r})"
        )
    if r.fp32_head and r.quant_head:
        errors.append(
            "rollout.fp32_head=true with rollout.quant_head=true: one asks for a float32 head, the other for a "
            "quantized one; set one of them"
        )
    if r.fp32_head and r.dtype == "float32":
        errors.append("rollout.fp32_head=true with rollout.dtype=float32: the head is float32 already; leave it out")
    if r.quant_group % 4:
        errors.append(f"rollout.quant_group={r.quant_group} must be a multiple of 4 (the int8 kernel's 4-byte steps)")
    if r.quant_group != QUANT_GROUP and not quant.takes_group:
        errors.append(
            f"rollout.quant_group={r.quant_group} applies to rollout.quant=int8_group only "
            f"(rollout.quant={r.quant!r} has no activation groups)"
        )
    return errors


def quant_scale_with_lora(cfg: Config) -> list[str]:
    """QuRL's invariant scaling rewrites the base weights, which LoRA keeps frozen."""
    r, t = cfg.rollout, cfg.train
    if t.lora_rank and r.quant_scale != 1.0:
        return [
            f"train.lora_rank={t.lora_rank} with rollout.quant_scale={r.quant_scale}: QuRL's invariant "
            "scaling folds s into the frozen base weights, which LoRA does not train; use one or the other"
        ]
    return []


def mismatch_split_needs_quant(cfg: Config) -> list[str]:
    """The split of the mismatch into weights and cache needs quantized weights."""
    r = cfg.rollout
    if r.mismatch_split and r.quant == "none":
        return [
            "rollout.mismatch_split=true needs rollout.quant (int8, fp8, ...): with full-precision "
            "weights the whole mismatch is the cache's"
        ]
    return []
