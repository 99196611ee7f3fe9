"""The update's forward, run before the corrections, whose detached log-probs are the old policy's
(``algorithm.old_logprobs=update``; the rule and why it holds: :mod:`sparserl.score.old_policy`).

TRL's GRPOTrainer skips the old policy's forward when each generation batch gets one optimizer step
(``num_iterations=1``): ``old_per_token_logps = per_token_logps.detach()``. Here the corrections come
between the two (Sparse-RL's weights are normalised over the whole batch, α reads the forward's hidden
states), so the forward runs first, in training mode and with gradients, on the whole batch (one
micro-batch); its ``log p`` and hidden states go to the scoring's consumers, and its graph waits for the
loss in :func:`sparserl.train.update.update_policy`, which then runs no forward of its own. One forward a
step fewer than ``score``; the PPO ratio at the step is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import RolloutBatch
from ..score import forward_response, forward_response_shared
from ..score.shared_prompt import shares_prompt_with_grad


@dataclass
class UpdateForward:
    """One forward of the learner over the whole batch, its graph kept for the update's loss."""

    logprobs: torch.Tensor  # [N, T], with the graph
    entropy: torch.Tensor | None  # [N, T]; with a graph when the entropy bonus is on
    hidden: torch.Tensor | None  # [N, T, H], detached: α's p (None unless asked for)
    response_mask: torch.Tensor  # [N, T]

    @property
    def old_logprobs(self) -> torch.Tensor:
        """log p of the old policy: the forward's log-probs, detached, 0 past each response (as a scoring
        forward gives them)."""
        return self.logprobs.detach() * self.response_mask


def run_update_forward(
    learner, batch: RolloutBatch, *, shared_prompt: bool, temperature: float, entropy_grad: bool, keep_hidden: bool
) -> UpdateForward:
    """The update's forward over every row of ``batch`` (training mode, gradients on), as
    ``update_policy`` would run it for its one micro-batch; ``keep_hidden``: the final hidden states too
    (for the exact α). The caller sets the precision (``learner_autocast``)."""
    forward = forward_response_shared if shares_prompt_with_grad(learner, shared_prompt) else forward_response
    learner.train()
    with torch.enable_grad():
        out = forward(
            learner,
            batch,
            slice(0, batch.size),
            return_entropy=True,
            entropy_grad=entropy_grad,
            temperature=temperature,
            return_hidden=keep_hidden,
        )
    lp, ent, hidden = out if keep_hidden else (*out, None)
    return UpdateForward(lp, ent, hidden, batch.response_mask)
