"""The step's update: PPO-clip over mini-batches of whole groups and micro-batches with gradient
accumulation, here alone or with the other learners (:mod:`.data_parallel`) computing their share.

Per optimizer step::

    L = policy_loss(π_θ / π_behaviour, A, corrections' weights and mask)  [+ β·KL(π_θ ‖ π_ref)]  [- c·H(π_θ)]

summed over its micro-batches (each normalised by the whole mini-batch: :func:`.losses.loss_normalizers`),
gradients clipped to ``train.grad_clip``, then AdamW and the LR schedule. An optimizer step whose loss or
gradient norm is not finite is not applied (no ``optimizer.step``, gradients zeroed, the schedule does not
advance: :mod:`.nonfinite`) and is counted in ``train/skipped_nonfinite``.
"""

from __future__ import annotations

import torch

from .. import runlog as names
from ..batch import RolloutBatch
from ..memory.allocator import trim_freed_memory
from ..models.mixed_precision import learner_autocast
from ..score import forward_response, forward_response_shared
from ..score.dense import micro_batches
from ..score.shared_prompt import shares_prompt_with_grad
from .lora import sampler_state
from .losses import (
    agg_loss,
    kl_penalty,
    loss_normalizers,
    off_policy_sequence_mask,
    policy_loss,
    unbiased_kl_ratio,
)
from .nonfinite import NonfiniteSteps
from .update_forward import UpdateForward
from .update_visible import quantized_weight_snapshot, update_visible_frac


def update(trainer, batch: RolloutBatch, corr, update_forward: UpdateForward | None = None) -> dict:
    """The step's update: here alone, or with the other learners computing their share at the same time.
    ``update_forward``: its forward, already run (``algorithm.old_logprobs=update``; one learner only)."""
    if trainer.learners is None:
        return update_policy(trainer, batch, corr, update_forward)
    from ..cluster.pool import training_threads

    threads = torch.get_num_threads()
    beside = training_threads(trainer.cfg.cluster, trainer.cfg.rollout.async_, updating=True)
    peers = trainer.learners.start_update(batch, corr)
    try:
        torch.set_num_threads(min(threads, beside or threads))  # the other learners' cores stay theirs
        out = update_policy(trainer, batch, corr)
    except RuntimeError:  # a collective failed: name the learner that died, if one did
        trainer.learners.finish_update(peers)
        raise
    finally:
        torch.set_num_threads(threads)
    trainer.learners.finish_update(peers)
    return out


def update_policy(trainer, batch: RolloutBatch, corr, update_forward: UpdateForward | None = None) -> dict:
    """PPO-clip updates: mini-batches of whole groups (several optimizer steps when the mini-batch is
    smaller than the rollout batch), micro-batches with gradient accumulation, grad-norm clipping.
    ``trainer``: a :class:`.build.Trainer` or a data-parallel peer; with ``trainer.ranks``, this process
    computes its micro-batches only and the gradients and metric sums are summed over the learners (every
    learner then sees the same gradient norm, and skips the same non-finite steps).
    ``update_forward``: the forward of the step's one micro-batch, run before the corrections
    (:mod:`.update_forward`): its log-probs and entropies stand in for the loop's forward."""
    cfg, a, t = trainer.cfg, trainer.cfg.algorithm, trainer.cfg.train
    N, T = batch.response_ids.shape
    mini = (t.mini_batch_prompts or t.prompts_per_step) * cfg.rollout.n
    sums: dict[str, float] = {}
    count, grad_norms, skipped = 0, [], 0
    quantizer = trainer.engine.model.quantizer if trainer.engine is not None else None  # QuRL's metric's grid
    codes = quantizer.codes if quantizer is not None and quantizer.quantizes else None
    out_visible = None
    ranks = trainer.ranks
    trainer.learner.train()
    shared = shares_prompt_with_grad(trainer.learner, t.shared_prompt)
    for epoch in range(t.ppo_epochs):
        for ms in range(0, N, mini):
            rows = slice(ms, min(ms + mini, N))
            norms = loss_normalizers(corr.mask[rows], a.loss_agg, max_len=cfg.rollout.max_new_tokens)
            trainer.optimizer.zero_grad(set_to_none=True)
            losses = []
            if update_forward is not None:  # one optimizer step over one micro-batch: the rule's premise
                if (rows.start, rows.stop, t.ppo_epochs) != (0, N, 1):
                    raise RuntimeError(
                        f"update_forward covers rows 0-{N} once; this update's mini-batch is rows "
                        f"{rows.start}-{rows.stop} of epoch {epoch + 1}"
                    )
                parts = [torch.arange(N, device=batch.response_ids.device)]
            else:
                # micro-batches packed by length; the loss normalisers are the whole mini-batch's, so any split
                # of its rows gives the same gradient
                parts = micro_batches(batch, t.micro_batch_size, t.max_tokens_per_micro_batch, shared, rows)
            for i, r in enumerate(parts):
                if ranks is not None and not ranks.mine(i):
                    continue
                if update_forward is not None:
                    lp, ent, update_forward = update_forward.logprobs, update_forward.entropy, None
                    loss, m = micro_batch_loss(trainer, batch, corr, r, norms, lp, ent)
                else:
                    loss, m = micro_batch_loss(trainer, batch, corr, r, norms)
                loss.backward()
                if t.trim_heap:  # the micro-batch's activations, freed: back to the kernel, not left as holes
                    trim_freed_memory()
                losses.append(loss.detach())
                w = float(batch.response_mask[r].sum())
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v * (1.0 if k == names.POLICY_LOSS else w)
                count += w
            if ranks is not None:
                ranks.sum_grads(trainer.learner)
            gn = torch.nn.utils.clip_grad_norm_(trainer.learner.parameters(), t.grad_clip or float("inf"))
            finite = NonfiniteSteps.finite(torch.stack(losses) if losses else None, gn)
            if ranks is not None:  # one learner's non-finite loss skips the step on every learner
                finite = ranks.sum_floats([0.0 if finite else 1.0])[0] == 0.0
            grad_norms.append(float(gn))
            if not finite:  # not applied: the weights, AdamW's moments and the schedule stay as they were
                trainer.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            before = quantized_weight_snapshot(trainer.learner) if codes else None
            trainer.optimizer.step()
            if codes:  # QuRL: how much of this step the quantized sampler can see
                out_visible = update_visible_frac(before, sampler_state(trainer.learner), codes)
            trainer.scheduler.step()  # the schedule (warm-up) counts optimizer updates
    if ranks is not None:  # every learner's share (each computed at least one micro-batch: config check)
        keys = sorted(sums)
        *values, count = ranks.sum_floats([sums[k] for k in keys] + [count])
        sums = dict(zip(keys, values))
    # micro-batch losses add up to each optimizer step's loss; report the mean over optimizer steps
    out = {k: (v / max(1, len(grad_norms)) if k == names.POLICY_LOSS else v / max(count, 1.0)) for k, v in sums.items()}
    out.setdefault(names.KL_REF, 0.0)
    out[names.GRAD_NORM] = sum(grad_norms) / max(1, len(grad_norms))
    out[names.LR] = trainer.optimizer.param_groups[0]["lr"]
    out[names.OPTIMIZER_STEPS] = len(grad_norms) - skipped
    out[names.SKIPPED_NONFINITE] = skipped
    if out_visible is not None:
        out[names.QUANT_UPDATE_VISIBLE] = out_visible
    return out


def micro_batch_loss(trainer, batch: RolloutBatch, corr, r: torch.Tensor, norms: dict, lp=None, ent=None):
    """(loss, metrics) of the rows ``r`` (an index tensor): the clipped policy loss with the corrections'
    weights and mask, plus the reference's KL and minus the entropy bonus when configured. ``lp``, ``ent``: the rows'
    log-probs and entropies when the update's forward already ran (else one forward here)."""
    cfg, a = trainer.cfg, trainer.cfg.algorithm
    if lp is None:
        shared = shares_prompt_with_grad(trainer.learner, cfg.train.shared_prompt)
        forward = forward_response_shared if shared else forward_response
        with learner_autocast(cfg.model, batch.response_ids.device):
            lp, ent = forward(
                trainer.learner,
                batch,
                r,
                return_entropy=True,
                entropy_grad=bool(a.entropy_coef),
                temperature=cfg.rollout.temperature,
            )
    scale = corr.clip_upper_scale[r] if corr.clip_upper_scale is not None else None
    weights, off_policy = corr.weights[r], None
    if a.off_policy_mask_threshold is not None:  # against the current policy: in each micro-batch
        keep = off_policy_sequence_mask(
            lp, batch.sampler_logprobs[r], batch.advantages[r], corr.mask[r], a.off_policy_mask_threshold
        )
        weights, off_policy = weights * keep[:, None].to(weights.dtype), float((~keep).float().mean())
    loss, m = policy_loss(
        lp,
        corr.behaviour_logprobs[r],
        batch.advantages[r],
        corr.mask[r],
        weights,
        clip_eps=a.clip_eps,
        clip_eps_high=a.clip_eps_high,
        clip_upper_scale=scale,
        importance_sampling_level=a.importance_sampling_level,
        **norms,
    )
    mask = batch.response_mask[r]
    m[names.ENTROPY] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
    if off_policy is not None:
        m[names.OFF_POLICY_MASKED_FRAC] = off_policy
    if trainer.ref is not None:
        kl_tok = kl_penalty(lp, batch.ref_logprobs[r], a.kl_kind)
        if a.kl_unbiased:  # DeepSeek-V3.2's unbiased estimate: times pi_theta / pi_old, not detached
            level = a.importance_sampling_level
            kl_tok = kl_tok * unbiased_kl_ratio(lp, corr.behaviour_logprobs[r], corr.mask[r], level)
        loss = loss + a.kl_coef * agg_loss(kl_tok, corr.mask[r], **norms)
        m[names.KL_REF] = float((kl_tok.detach() * mask).sum() / mask.sum().clamp(min=1))
    if a.entropy_coef:  # entropy bonus (maximise entropy)
        loss = loss - a.entropy_coef * agg_loss(ent, corr.mask[r], **norms)
    m[names.POLICY_LOSS] = float(loss.detach())
    return loss, m
