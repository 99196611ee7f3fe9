"""``quant/update_visible_frac``: how much of an optimizer step a quantized sampler can see (QuRL).

Of the weight elements the last optimizer step changed (``after != before``), the fraction whose
INT8 code changed too:

    update_visible_frac = #{ changed  and  q(after) != q(before) } / #{ changed }

over the weights the sampler quantizes (the decoder's linear weights: q/k/v/o, gate/up/down; the
sampler fuses q/k/v and gate/up, but the scales are per row (``int8``) or per row and group of inputs
(``int8_group``), so the codes of the fused matrix are those of its parts).
Codes, not dequantized values, are compared: the row's largest
element is updated too, so its scale moves a little at nearly every step and *every* dequantized value
of the row would count as changed by ~lr/max|w| of itself.

Why invariant scaling (:mod:`sparserl.models.invariant_scaling`) raises it. Per-output-channel
symmetric INT8 gives row ``r`` the step ``Δ_r = max_j |V_rj| / 127`` and the code ``round(V / Δ_r)``.
The learner trains ``V = W / s`` (the scaled model is its parametrisation), so ``Δ_r(V) = Δ_r(W) / s``.
An update ``u`` with ``|u| < Δ`` changes a code iff ``V/Δ`` and ``(V+u)/Δ`` straddle a rounding
boundary; with ``V/Δ``'s fractional part uniform that happens with probability ``|u| / Δ``. (The row's
largest element moves too, and with it ``Δ``: that shifts ``V/Δ`` by at most ``(|V|/max|V|)·|u_max|/Δ``,
the same order and the same dependence on ``s``, so it changes the constant, not the scaling.)

- Adam(W)-like step: ``|u| ≈ lr`` whatever the parametrisation (Adam divides the gradient by its own
  RMS, so the chain-rule factor in ``∂L/∂V = s ∂L/∂W`` cancels): ``P = lr · s / Δ_r(W)``, ``s`` times
  higher. (The same step is ``s · lr`` in W's units: the scaled weights also learn ``s`` times faster.)
- SGD step: ``u = -lr · s · ∂L/∂W``: ``P = lr · s² · |∂L/∂W| / Δ_r(W)``, ``s²`` higher (QuRL's "noise
  shrinks by s, updates grow by s").

Both saturate at 1 once ``|u| ≥ Δ``. With SmoothQuant on (``rollout.quant_smooth``) the sampler
quantizes ``W diag(s_smooth)``, whose per-channel grid differs from ``W``'s; the metric still reads
``W``'s grid (the smoothing factors are recalibrated at every push, so there is no fixed grid to
compare on), an approximation of what that sampler sees. So with outlier channels in float32
(``rollout.quant_outliers``): the metric counts their columns on the int8 grid, though the sampler
sees every change there (k of the layer's inputs, re-chosen at every push).
The trainer measures it on the learner's (scaled) weights:
snapshot them with :func:`quantized_weight_snapshot` before ``optimizer.step()``, then call
:func:`update_visible_frac` with the model's parameters after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch

# the decoder's linear weights: what the sampler quantizes
SAMPLER_QUANTIZED_KEY = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")

Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def is_sampler_quantized(name: str) -> bool:
    return SAMPLER_QUANTIZED_KEY.search(name) is not None


def default_quantizer() -> Quantizer:
    """The sampler's INT8 weight quantizer: symmetric, per output channel."""
    from ..rollout.quant.int8 import quantize_int8_per_channel

    return quantize_int8_per_channel


@torch.no_grad()
def quantized_weight_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the weights the sampler quantizes (``before`` of :func:`update_visible_frac`), as the sampler
    receives them (:func:`sparserl.train.lora.sampler_state`: merged with LoRA)."""
    from .lora import sampler_state

    return {n: p.detach().clone() for n, p in sampler_state(model).items() if is_sampler_quantized(n)}


@torch.no_grad()
def update_visible_frac(
    before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor], quantize: Quantizer | None = None
) -> float:
    """Of the sampler-quantized weight elements that differ between ``before`` and ``after``, the
    fraction whose quantized code differs too (0.0 when no element changed). ``quantize(w) -> (codes,
    scales)``, by default :func:`sparserl.rollout.quant.int8.quantize_int8_per_channel`. Only names
    of ``before`` that the sampler quantizes are compared; each must be in ``after`` with its shape.
    One vectorised pass per tensor; a single host sync at the end."""
    quantize = quantize or default_quantizer()
    names = [n for n in before if is_sampler_quantized(n)]
    if not names:
        raise ValueError(
            "update_visible_frac: `before` holds no decoder linear weight "
            "(names like model.layers.0.self_attn.q_proj.weight)"
        )
    changed = visible = None
    for n in names:
        if n not in after:
            raise ValueError(f"update_visible_frac: {n} is in `before` but not in `after`")
        b, a = before[n].detach(), after[n].detach()
        if a.shape != b.shape:
            raise ValueError(f"update_visible_frac: {n} has shape {tuple(b.shape)} before, {tuple(a.shape)} after")
        moved = a != b
        c = torch.count_nonzero(moved)
        v = torch.count_nonzero(moved.logical_and_(quantize(a)[0] != quantize(b)[0]))
        changed = c if changed is None else changed + c
        visible = v if visible is None else visible + v
    n_changed = int(changed)
    return float(visible) / n_changed if n_changed else 0.0
