"""Dense scoring: one forward of a full-precision, full-KV model over finished sequences.

Gives the old-policy log-probs ``log p`` (and reference log-probs when a KL term is on) of each
response token; with ``return_entropy`` also the per-token entropy. Sequences are laid out as
``[left padding | prompt | response | right padding]`` so that every response starts at the same
column and only the response positions go through the LM head (``logits_to_keep``).
"""

from __future__ import annotations

import torch

from ..batch import RolloutBatch
from .chunked_head import head_logprobs, token_logprobs
from .hidden import response_hidden
from .shared_prompt import forward_response_shared, lm_head_weight


def forward_response(
    model,
    batch: RolloutBatch,
    rows: slice | torch.Tensor,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    temperature: float = 1.0,
    return_hidden: bool = False,
):
    """Per-token log-probs [n, T] (and entropies) of the responses in ``rows`` under ``model``, of the
    distribution softmax(logits / temperature) -- the sampler's temperature, as verl does, so that
    sampler and dense log-probs describe the same distribution. Runs with whatever grad mode the
    caller set (no_grad for scoring, grad for the update). ``return_hidden``: a third value, the final
    hidden states [n, T, H] (detached) that predict the response tokens, the log-probs then computed
    from them through the LM head in chunks (:func:`head_logprobs`; equal up to float rounding)."""
    ids = batch.input_ids[rows]
    T = batch.response_ids.shape[1]
    if return_hidden:
        hidden = response_hidden(model, ids, batch.attention_mask[rows], batch.position_ids[rows], T)
        lp, ent = head_logprobs(
            hidden,
            lm_head_weight(model),
            batch.response_ids[rows],
            temperature,
            with_entropy=return_entropy,
            entropy_grad=entropy_grad,
        )
        return lp, ent, hidden.detach()
    out = model(
        input_ids=ids,
        attention_mask=batch.attention_mask[rows],
        position_ids=batch.position_ids[rows],
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1]  # position j predicts token j+1: the last T+1 logits → T predictions
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = token_logprobs(logits, batch.response_ids[rows])
    ent = None
    if return_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lf = logits.float()
            ent = torch.logsumexp(lf, -1) - (lf.softmax(-1) * lf).sum(-1)
    return lp, ent


@torch.no_grad()
def score_logprobs(
    model, batch: RolloutBatch, micro_batch_size: int = 16, temperature: float = 1.0, shared_prompt: bool = False
) -> torch.Tensor:
    """log p of every response token under ``model`` (no grad), micro-batched. [N, T] float32.
    ``shared_prompt``: forward each distinct prompt once (:func:`forward_response_shared`)."""
    forward = forward_response_shared if shared_prompt else forward_response
    was_training = model.training
    model.eval()
    parts = []
    for s in range(0, batch.size, micro_batch_size):
        lp, _ = forward(model, batch, slice(s, s + micro_batch_size), temperature=temperature)
        parts.append(lp)
    model.train(was_training)
    return torch.cat(parts) * batch.response_mask


@torch.no_grad()
def score_logprobs_keep_hidden(
    model, batch: RolloutBatch, micro_batch_size: int = 16, temperature: float = 1.0, shared_prompt: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p [N, T], hidden [N, T, H]): :func:`score_logprobs`'s log-probs (equal up to float rounding),
    computed from the final hidden states at the response positions, which come back too, so that
    the exact acceptance α (:mod:`sparserl.mismatch.measure`) reads ``p`` from this forward instead of a
    second one. Positions past a micro-batch's longest response hold 0 in both (shared prompt)."""
    forward = forward_response_shared if shared_prompt else forward_response
    was_training = model.training
    model.eval()
    lps, hiddens = [], []
    try:
        for s in range(0, batch.size, micro_batch_size):
            lp, _, hidden = forward(
                model, batch, slice(s, s + micro_batch_size), temperature=temperature, return_hidden=True
            )
            lps.append(lp)
            hiddens.append(hidden)
    finally:
        model.train(was_training)
    return torch.cat(lps) * batch.response_mask, torch.cat(hiddens)
