"""The learner and its optimizer, built alike in the training process (:mod:`.build`) and in every
data-parallel peer (:mod:`.data_parallel`)."""

from __future__ import annotations

import torch

from ..config import Config
from ..models.invariant_scaling import apply_invariant_scaling
from ..models.loading import load_model
from .lora import apply_lora
from .lr_schedule import build_scheduler


def build_learner(cfg: Config):
    """(loaded model, learner, AdamW, warm-up schedule): the one builder of a learner, the training
    process's and every data-parallel peer's (:mod:`.data_parallel`)."""
    t = cfg.train
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
    learner = apply_invariant_scaling(lm.model, cfg.rollout.quant_scale).train()  # QuRL: before the sampler copies it
    if t.lora_rank:  # peft adapters on the learner; the sampler keeps the merged weights (sampler_state)
        learner = apply_lora(learner, t.lora_rank, t.lora_alpha, t.lora_dropout, t.lora_target).train()
    trained = [p for p in learner.parameters() if p.requires_grad]
    fused = trained[0].device.type in ("cpu", "cuda")  # torch's one-kernel AdamW (the HF Trainer's default)
    opt = torch.optim.AdamW(
        trained, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay, fused=fused or None
    )
    return lm, learner, opt, build_scheduler(opt, cfg)
