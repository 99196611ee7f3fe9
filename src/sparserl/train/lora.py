"""LoRA training of the learner on peft (``train.lora_rank`` > 0; Hu et al., 2021, arXiv 2106.09685).

Each targeted linear layer ``W`` (``train.lora_target``: module names or peft's ``all-linear``) gets a
trainable low-rank update and ``W`` itself is frozen::

    W' = W + (α / r) · B A,    A ∈ R^{r×in} (random), B ∈ R^{out×r} (zeros: W' = W at the start)

with ``r`` = ``train.lora_rank``, ``α`` = ``train.lora_alpha`` and dropout ``train.lora_dropout`` on the
adapter's input. peft injects the layers into the Hugging Face model in place (:func:`apply_lora`), so the
learner stays the model the scorer and the update already use; AdamW then holds state for ``A`` and ``B``
only.

- **The sampler** never sees adapters: each push hands it the merged weights ``W + (α / r) B A`` under the
  base model's names (:func:`sampler_state`), so its fused kernels, compressors and weight quantization
  (which quantizes the merged weights) are unchanged.
- **Checkpoints** hold the adapter in peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
  keys ``base_model.model.<module>.lora_A.weight``), which ``PeftModel.from_pretrained(base_model, folder)``
  loads (:func:`save_adapter`, :func:`adapter_from_files`); the base weights are ``model.name``'s, unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ConfigError
from ..models.loading import linear_names

ADAPTER = "default"  # peft's adapter name
PEFT_PREFIX = "base_model.model."  # what PeftModel.save_pretrained puts before a module's name
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def apply_lora(
    model: torch.nn.Module, rank: int, alpha: int, dropout: float, target, key: str = "train.lora_target"
) -> torch.nn.Module:
    """``model`` with peft LoRA adapters on ``target`` (a list of module names, or ``all-linear``) and every
    other weight frozen; the same object (peft injects in place). A target that names no module of the
    model is a :class:`~sparserl.errors.ConfigError` naming ``key`` and the valid ones."""
    from peft import LoraConfig, get_peft_model

    names = linear_names(model)
    if target != "all-linear":
        missing = [t for t in target if t not in names]
        if missing:
            raise ConfigError(
                f"{key}={list(target)}: {', '.join(missing)} names no linear module of "
                f"this model; its linear modules: {', '.join(names)} (or all-linear)"
            )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        bias="none",
        target_modules=target if target == "all-linear" else list(target),
    )
    return get_peft_model(model, config, adapter_name=ADAPTER).get_base_model()


def has_lora(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "peft_config", None))


def trainable_summary(model: torch.nn.Module) -> dict:
    """What trains: ``{"mode": "lora" | "full", "trainable": n, "total": n, "rank", "alpha", "modules"}``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    if not has_lora(model):
        return {"mode": "full", "trainable": trainable, "total": total}
    config = model.peft_config[ADAPTER]
    modules = sorted(config.target_modules) if isinstance(config.target_modules, (set, list)) else config.target_modules
    return {
        "mode": "lora",
        "trainable": trainable,
        "total": total,
        "rank": config.r,
        "alpha": config.lora_alpha,
        "modules": modules,
    }


@torch.no_grad()
def sampler_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights the sampler loads: ``model.state_dict()``, or with LoRA the merged ``W + (α / r) B A`` of
    every adapted layer under the base model's names (the adapters' own tensors left out)."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    from peft.tuners.lora import LoraLayer

    merged = {k: v for k, v in state.items() if ".lora_" not in k and ".base_layer." not in k}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            base = module.get_base_layer()
            merged[f"{name}.weight"] = base.weight + module.get_delta_weight(ADAPTER).to(base.weight.dtype)
            if base.bias is not None:
                merged[f"{name}.bias"] = base.bias
    return merged


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors as peft saves them (``base_model.model.<module>.lora_A.weight``, ...)."""
    from peft import get_peft_model_state_dict

    return {
        PEFT_PREFIX + k: v.detach().contiguous()
        for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()
    }


def save_adapter(model: torch.nn.Module, folder: Path, save_tensors) -> None:
    """``folder/adapter_config.json`` and ``folder/adapter_model.safetensors`` (written by ``save_tensors``),
    as ``PeftModel.save_pretrained`` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(str(folder))
    save_tensors(adapter_state(model), folder / ADAPTER_WEIGHTS)


def load_adapter(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Put an adapter's tensors (:func:`adapter_state`'s keys, already checked) into ``model``."""
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, {k.removeprefix(PEFT_PREFIX): v for k, v in weights.items()}, adapter_name=ADAPTER)
