"""The dense policy's final hidden states at the positions that predict each response token: what the
acceptance α (:mod:`sparserl.mismatch`) reads ``p`` from through the LM head, and what the update's own
forward (:mod:`sparserl.train.update_forward`) keeps for it.
"""

from __future__ import annotations

import torch

from .shared_prompt import response_hidden_shared


@torch.no_grad()
def dense_hidden(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    micro_batch_size: int = 16,
) -> torch.Tensor:
    """[N, T, H]: ``model``'s final hidden state at each position that predicts a response token, for
    rows laid out as ``[left pad | prompt | response | right pad]`` with the response's ``T =
    response_len`` columns last (:class:`sparserl.batch.RolloutBatch`). Eval mode for the forward."""
    was_training = model.training
    model.eval()
    parts = []
    try:
        for s in range(0, input_ids.shape[0], micro_batch_size):
            rows = slice(s, s + micro_batch_size)
            parts.append(
                response_hidden(model, input_ids[rows], attention_mask[rows], position_ids[rows], response_len)
            )
    finally:
        model.train(was_training)
    return torch.cat(parts)


@torch.no_grad()
def dense_hidden_shared(model, batch, micro_batch_size: int = 16) -> torch.Tensor:
    """[N, T, H]: :func:`dense_hidden` of a :class:`~sparserl.batch.RolloutBatch` with each distinct prompt of
    a micro-batch forwarded once and only the responses after it
    (:func:`.shared_prompt.response_hidden_shared`): the same states up to float rounding, at
    ``P + n·T`` tokens through the model per group of ``n`` instead of ``n·(P + T)``; 0 past each
    micro-batch's longest response. Eval mode for the forward."""
    was_training = model.training
    model.eval()
    N, T = batch.response_ids.shape
    hidden = None
    try:
        for s in range(0, N, micro_batch_size):
            rows = slice(s, min(N, s + micro_batch_size))
            part = response_hidden_shared(model, batch, rows)
            if hidden is None:
                hidden = part.new_zeros(N, T, part.shape[-1])
            hidden[rows, : part.shape[1]] = part
    finally:
        model.train(was_training)
    return hidden


def response_hidden(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_len: int
) -> torch.Tensor:
    """[n, T, H]: :func:`dense_hidden` for one micro-batch, in the caller's grad mode and training mode
    (the update's forward keeps its graph)."""
    out = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    return out.last_hidden_state[:, -response_len - 1 : -1]  # position j predicts token j + 1
