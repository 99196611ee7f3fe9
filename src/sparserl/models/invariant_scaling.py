"""QuRL's invariant scaling (Li et al., 2026, arXiv 2602.13953): fold a factor ``s`` into the RMSNorms.

Every projection that reads an RMSNorm's output computes ``W X`` with ``X = g ⊙ x / rms(x)``. Once,
before training, rewrite it as

    W X = (W / s)(s X),   s X = (s g) ⊙ x / rms(x)

i.e. ``g ← s g`` for ``input_layernorm`` (read by q/k/v) and ``post_attention_layernorm`` (read by
gate/up), and ``W ← W / s`` for ``q_proj, k_proj, v_proj, gate_proj, up_proj``. In exact arithmetic
the function is unchanged (float32: logits move by rounding only); a bias is *not* divided, since
``(W/s)(s X) + b = W X + b`` (Qwen2's q/k/v bias). The learner trains, and the sampler quantizes,
``V = W / s``: a per-output-channel INT8 grid of ``V`` is ``s`` times finer in V's units, so a small
update crosses more rounding boundaries (:mod:`sparserl.train.update_visible`, which derives how many).

What is not touched: o_proj and down_proj (they read attention / the MLP product, not a norm), the
final ``model.norm`` and the LM head (the head is tied to the input embedding in SmolLM2, which
cannot be divided without changing the embedding), and Qwen3's ``q_norm``/``k_norm``: those act
*after* q_proj/k_proj on each head, whose output ``(W/s)(sX) = WX`` is what it was, so they are
unaffected.

Supported: decoders whose RMSNorm multiplies by its weight (``weight * x / rms(x)``): llama (SmolLM2),
qwen2, qwen3, mistral. ``s`` is recorded on the model (attribute ``sparserl_quant_scale``), so it is
folded in once; checkpoints store the original-form weights (:func:`unscaled_state_dict`), which load
into a plain model as they are, and after loading them into a scaled model the fold is re-applied
with :func:`refold_after_load`. In bfloat16 ``W/s`` rounds (relative 2^-9) unless ``s`` is a power of
two; in float32 the un-scaled weights equal the originals to ~1e-7 relative.
"""

from __future__ import annotations

import re

import torch

from ..errors import SparserlError

SCALE_ATTR = "sparserl_quant_scale"
OPTION = "rollout.quant_scale"
# model types whose RMSNorm is ``weight * x / rms(x)`` (Gemma's ``(1 + weight)`` would need another fold)
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# per decoder layer: the norm, and the projections that read its output
FOLDS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
)
SCALED_NORM_KEY = re.compile(r"(^|\.)layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight$")
DIVIDED_WEIGHT_KEY = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)\.weight$")


class InvariantScalingError(SparserlError, ValueError):
    """A scale that is not a positive finite number, or a model without the norm/projection layout."""


def check_scale(s: float) -> float:
    try:
        s = float(s)
    except (TypeError, ValueError):
        raise InvariantScalingError(
            f"{OPTION}={s!r} is not a number; expected a positive number (1.0 = off, QuRL's 1.5)"
        ) from None
    if not s > 0 or s == float("inf"):
        raise InvariantScalingError(f"{OPTION}={s} must be a positive finite number (1.0 = off, QuRL's 1.5)")
    return s


def applied_scale(model: torch.nn.Module) -> float:
    """The ``s`` folded into ``model`` (1.0 when none was)."""
    return float(getattr(model, SCALE_ATTR, 1.0))


def fold_groups(model: torch.nn.Module) -> list[tuple[str, list[str]]]:
    """``[(norm weight name, [projection weight names read from it]), ...]`` as ``model.state_dict()``
    names, after checking the layout; raises :class:`InvariantScalingError` naming what is missing."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InvariantScalingError(
            f"{OPTION}: invariant scaling needs a decoder of type {', '.join(SUPPORTED_MODEL_TYPES)} "
            f"(RMSNorm = weight * x / rms(x) before q/k/v and gate/up); this model's type is {model_type!r}; "
            f"use {OPTION}=1.0"
        )
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or len(layers) == 0:
        raise InvariantScalingError(
            f"{OPTION}: the {model_type} model has no decoder layers at model.layers; use {OPTION}=1.0"
        )
    groups = []
    for i, layer in enumerate(layers):
        for norm_name, proj_names in FOLDS:
            norm = _module(layer, norm_name)
            w = getattr(norm, "weight", None)
            if not isinstance(w, torch.Tensor) or w.dim() != 1 or getattr(norm, "bias", None) is not None:
                raise InvariantScalingError(
                    f"{OPTION}: model.layers.{i}.{norm_name} is not an RMSNorm with a "
                    f"1-D weight and no bias; use {OPTION}=1.0"
                )
            for p in proj_names:
                proj = _module(layer, p, i)
                pw = getattr(proj, "weight", None)
                if not isinstance(pw, torch.Tensor) or pw.dim() != 2 or pw.shape[1] != w.numel():
                    raise InvariantScalingError(
                        f"{OPTION}: model.layers.{i}.{p} is not a linear layer reading the "
                        f"{w.numel()} features of model.layers.{i}.{norm_name}; use {OPTION}=1.0"
                    )
            groups.append(
                (f"model.layers.{i}.{norm_name}.weight", [f"model.layers.{i}.{p}.weight" for p in proj_names])
            )
    return groups


def _module(layer: torch.nn.Module, dotted: str, i: int | None = None) -> torch.nn.Module:
    m = layer
    for part in dotted.split("."):
        m = getattr(m, part, None)
        if m is None:
            where = f"model.layers.{i}." if i is not None else "a decoder layer's "
            raise InvariantScalingError(
                f"{OPTION}: {where}{dotted} is missing; invariant scaling needs the "
                f"llama layout (input_layernorm, self_attn.q/k/v_proj, "
                f"post_attention_layernorm, mlp.gate/up_proj); use {OPTION}=1.0"
            )
    return m


@torch.no_grad()
def _fold(model: torch.nn.Module, s: float) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    for norm_name, proj_names in fold_groups(model):
        _scale_(params[norm_name], s)
        for p in proj_names:
            _scale_(params[p], 1.0 / s)


def _scale_(t: torch.Tensor, factor: float) -> None:
    t.copy_((t.float() * factor).to(t.dtype))


def apply_invariant_scaling(model: torch.nn.Module, s: float) -> torch.nn.Module:
    """Fold ``s`` into ``model`` in place (norm weights × s, q/k/v/gate/up weights ÷ s) and record it.

    Once only: applying the ``s`` already folded in is a no-op, another ``s`` raises (the model would
    be at ``s·s'``). ``s = 1`` changes nothing. Returns ``model``."""
    s = check_scale(s)
    have = applied_scale(model)
    if have != 1.0:
        if have == s:
            return model
        raise InvariantScalingError(
            f"{OPTION}={s}: this model already has s={have} folded in; un-scale it "
            "first (load unscaled_state_dict into a fresh model)"
        )
    if s == 1.0:
        return model
    _fold(model, s)
    setattr(model, SCALE_ATTR, s)
    return model


def refold_after_load(model: torch.nn.Module) -> torch.nn.Module:
    """Re-apply the model's recorded ``s`` after its weights were replaced by original-form weights
    (a checkpoint written from :func:`unscaled_state_dict` loaded in place). No-op at s = 1."""
    s = applied_scale(model)
    if s != 1.0:
        _fold(model, s)
    return model


def remove_invariant_scaling(state_dict: dict[str, torch.Tensor], s: float) -> dict[str, torch.Tensor]:
    """The original-form weights of a state dict scaled by ``s``: norm weights ÷ s, q/k/v/gate/up
    weights × s (new tensors; every other entry, biases included, is passed through as it is)."""
    s = check_scale(s)
    if s == 1.0:
        return dict(state_dict)
    out = {}
    for k, v in state_dict.items():
        if SCALED_NORM_KEY.search(k):
            out[k] = (v.detach().float() / s).to(v.dtype)
        elif DIVIDED_WEIGHT_KEY.search(k):
            out[k] = (v.detach().float() * s).to(v.dtype)
        else:
            out[k] = v
    return out


def unscaled_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` in original form (what a checkpoint saves): the model's recorded ``s``
    removed; the state dict itself when none was applied."""
    return remove_invariant_scaling(model.state_dict(), applied_scale(model))
