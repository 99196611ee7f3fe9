"""Sparrow's acceptance-aware oversampling (``rollout.oversample``; Sparrow's ``force_select_repeat`` with
``force_select_repeat_use_acceptance_rate``, Zhou et al., 2026, arXiv 2606.08446, ``verl/trainer/ppo/ray_trainer.py``).

The sampler draws ``m = rollout.oversample`` responses per prompt instead of ``n = rollout.n``; once the old
policy's log-probs are known, each prompt keeps the ``n`` responses the dense policy would most readily have drawn
itself, by their **mean acceptance**

    a_i = (1/|y_i|) Σ_t min(1, p_t / (C · q_t))

(``p`` the old policy's log-prob of the sampled token, ``q`` the sampler's; C = 1). Sparrow draws a Bernoulli per
token with that probability and keeps the responses with the highest share accepted; ``a_i`` is that share's
expectation given the tokens, so the choice carries no extra randomness. ``rollout.oversample_by=reward`` keeps
the ``n`` with the highest reward instead (Sparrow's default selection, ties in sampling order). The rest of the step
(α, corrections, advantages, the update) sees the kept ``n`` per prompt; ``reward/mean`` stays over all ``m``.
Logged: ``sampling/oversample_acceptance_kept`` and ``_dropped`` (the mean ``a_i`` of each side).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import runlog as names
from ..batch import RolloutBatch
from ..rollout.output import RolloutOutput

__all__ = ["keep_top", "oversample_select", "response_acceptance"]


@torch.no_grad()
def response_acceptance(
    sampler_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, c: float = 1.0
) -> torch.Tensor:
    """[N] float64: each response's mean over its tokens of ``min(1, p_t / (C q_t))`` (0 for an empty one)."""
    valid = mask != 0
    log_ratio = old_logprobs.double() - sampler_logprobs.double() - torch.log(torch.tensor(c, dtype=torch.float64))
    accept = torch.where(valid, log_ratio.clamp(max=0.0).exp(), torch.zeros_like(log_ratio))
    return accept.sum(-1) / valid.sum(-1).clamp(min=1)


def keep_top(values: list[float], groups: list[int], n: int) -> list[int]:
    """The rows to keep, in their order: per group the ``n`` with the highest value (ties: the earlier row)."""
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    kept = set()
    for rows in by_group.values():
        kept.update(sorted(rows, key=lambda i: (-values[i], i))[:n])
    return sorted(kept)


def oversample_select(cfg, batch: RolloutBatch, ro: RolloutOutput, old):
    """(batch, ro, old, metrics) with ``rollout.n`` of the ``rollout.oversample`` responses per prompt (the module
    docstring); ``old``: the step's :class:`~.old_logprobs.OldLogprobs` (its hidden states follow the rows)."""
    accept = response_acceptance(batch.sampler_logprobs, batch.old_logprobs, batch.response_mask)
    key = accept if cfg.rollout.oversample_by == "acceptance" else batch.rewards.double()
    rows = keep_top(key.tolist(), batch.group_ids.tolist(), cfg.rollout.n)
    dropped = sorted(set(range(batch.size)) - set(rows))
    metrics = {
        names.OVERSAMPLE_ACCEPT_KEPT: float(accept[rows].mean()),
        names.OVERSAMPLE_ACCEPT_DROPPED: float(accept[dropped].mean()) if dropped else 0.0,
    }
    hidden = None if old.hidden is None else old.hidden.index_select(0, torch.tensor(rows, device=old.hidden.device))
    return batch.select(rows), ro.select(rows), dataclasses.replace(old, hidden=hidden), metrics
