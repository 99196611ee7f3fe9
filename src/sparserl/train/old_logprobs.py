"""The old policy's log-probs of a step, from the one source chosen when the trainer is built
(``algorithm.old_logprobs``; the rules: :mod:`sparserl.score.old_policy`).

- ``sampler``: the sampler ran the old policy exactly (a dense float32 sampler of the full tempered
  distribution): its own log-probs, no forward;
- ``update``: the update's own forward, run now (one optimizer step over one micro-batch, no dropout in
  the learner, one learner): its graph waits for the loss (:mod:`.update_forward`); a step whose batch
  exceeds ``train.max_tokens_per_micro_batch`` in one micro-batch (prompts longer than the config's rule
  assumed) is scored instead;
- ``score``: a no-grad forward of the learner before the update (keeping its hidden states when the
  acceptance α reads ``p`` from them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import RolloutBatch
from ..models.mixed_precision import learner_compute_dtype
from ..packing import RowLengths, micro_batch_tokens
from ..score import model_dropout, old_logprobs_source, score_logprobs, score_logprobs_keep_hidden
from ..score.shared_prompt import shares_prompt_with_grad
from .update_forward import UpdateForward, run_update_forward


@dataclass
class OldLogprobs:
    """A step's old-policy log-probs [N, T] (0 past each response), the learner's final hidden states
    [N, T, H] when the forward kept them for α, and the update's forward when it gave them."""

    logprobs: torch.Tensor
    hidden: torch.Tensor | None = None
    update_forward: UpdateForward | None = None


@dataclass(frozen=True)
class OldPolicy:
    """Where a run's old-policy log-probs come from (``kind``: ``sampler``, ``update`` or ``score``),
    decided once (:meth:`choose`) and read every step (:meth:`logprobs`)."""

    kind: str
    temperature: float = 1.0
    micro_batch_size: int = 16
    shared_prompt: bool = False
    entropy_grad: bool = False  # the update's forward keeps the entropy's graph (algorithm.entropy_coef)
    keep_hidden: bool = False  # α reads p from the forward's hidden states (mismatch.alpha is not off)
    max_tokens: int | None = None  # train.max_tokens_per_micro_batch

    @classmethod
    def choose(cls, cfg, engine, learner, prompt_tokens: int | None = None) -> OldPolicy:
        """The source for ``cfg``'s sampler (``engine``) and ``learner``: the config's rules and the loaded
        model's own facts (its dropout, its compute dtype), so that a refused source, e.g. ``update`` on a
        model with dropout, fails here, before any rollout (:class:`~sparserl.score.old_policy.OldLogprobsError`).
        ``prompt_tokens``: the data's longest prompt as preflight bounded it (None: the rules' bound), which
        decides whether the update's forward over a whole batch fits ``train.max_tokens_per_micro_batch``."""
        r = cfg.rollout
        kind = old_logprobs_source(
            cfg.algorithm.old_logprobs,
            why_not_update=cfg.why_update_forward_is_not_old_policy(model_dropout(learner), prompt_tokens),
            compresses=engine.compressor.compresses,
            sampler_dtype=engine.dtype,
            learner_dtype=learner_compute_dtype(cfg.model, learner),
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            quantized=r.quantized,
            lagged=r.async_,
        )
        return cls(
            kind,
            temperature=r.temperature,
            micro_batch_size=cfg.train.micro_batch_size,
            shared_prompt=cfg.train.shared_prompt,
            entropy_grad=bool(cfg.algorithm.entropy_coef),
            keep_hidden=cfg.mismatch.alpha != "off",
            max_tokens=cfg.train.max_tokens_per_micro_batch,
        )

    def logprobs(self, learner, batch: RolloutBatch) -> OldLogprobs:
        """The old policy's log-probs of ``batch``'s responses. The caller sets the precision
        (``learner_autocast``)."""
        if self.kind == "sampler":
            return OldLogprobs(batch.sampler_logprobs * batch.response_mask)
        if self.kind == "update" and self.fits_one_micro_batch(learner, batch):
            forward = run_update_forward(
                learner,
                batch,
                shared_prompt=self.shared_prompt,
                temperature=self.temperature,
                entropy_grad=self.entropy_grad,
                keep_hidden=self.keep_hidden,
            )
            return OldLogprobs(forward.old_logprobs, forward.hidden, forward)
        args = (learner, batch, self.micro_batch_size, self.temperature, self.shared_prompt, self.max_tokens)
        if self.keep_hidden:
            return OldLogprobs(*score_logprobs_keep_hidden(*args))
        return OldLogprobs(score_logprobs(*args))

    def fits_one_micro_batch(self, learner, batch: RolloutBatch) -> bool:
        """Whether the update's forward over the whole of ``batch`` stays within
        ``train.max_tokens_per_micro_batch``. The config's rule assumed prompts of at most
        :data:`~sparserl.packing.PROMPT_TOKENS_BOUND` tokens; a step with longer ones scores its old policy
        instead (and its update packs its micro-batches), so the budget holds."""
        if self.max_tokens is None:
            return True
        shared = shares_prompt_with_grad(learner, self.shared_prompt)
        rows = torch.arange(batch.size)
        return micro_batch_tokens(RowLengths.of_batch(batch), rows, shared) <= self.max_tokens
