"""The dense policy's final hidden states at the positions that predict each response token: what the
acceptance α (:mod:`sparserl.mismatch`) reads ``p`` from through the LM head, and what the update's own
forward (:mod:`sparserl.train.update_forward`) keeps for it.
"""

from __future__ import annotations

import torch

from ..packing import RowLengths, pack_micro_batches, used_columns
from .shared_prompt import response_hidden_shared


@torch.no_grad()
def dense_hidden(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    micro_batch_size: int = 16,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """[N, T, H]: ``model``'s final hidden state at each position that predicts a response token, for
    rows laid out as ``[left pad | prompt | response | right pad]`` with the response's ``T =
    response_len`` columns last (:class:`sparserl.batch.RolloutBatch`); 0 past each micro-batch's longest
    response. Micro-batches of at most ``micro_batch_size`` rows and ``max_tokens`` tokens
    (``train.max_tokens_per_micro_batch``; :func:`sparserl.packing.pack_micro_batches`), each forward
    trimmed to the columns its rows use. Eval mode for the forward."""
    was_training = model.training
    model.eval()
    lengths = RowLengths.of(attention_mask, response_len)
    hidden = None
    try:
        for rows in pack_micro_batches(lengths, max_tokens=max_tokens, max_rows=micro_batch_size):
            rows = rows.to(input_ids.device)
            att = attention_mask[rows]
            first, T_used = used_columns(att, response_len)
            end = att.shape[1] - response_len + T_used
            part = response_hidden(
                model, input_ids[rows, first:end], att[:, first:end], position_ids[rows, first:end], T_used
            )
            if hidden is None:
                hidden = part.new_zeros(input_ids.shape[0], response_len, part.shape[-1])
            hidden[rows, :T_used] = part
    finally:
        model.train(was_training)
    return hidden


@torch.no_grad()
def dense_hidden_shared(model, batch, micro_batch_size: int = 16, max_tokens: int | None = None) -> torch.Tensor:
    """[N, T, H]: :func:`dense_hidden` of a :class:`~sparserl.batch.RolloutBatch` with each distinct prompt of
    a micro-batch forwarded once and only the responses after it
    (:func:`.shared_prompt.response_hidden_shared`): the same states up to float rounding, at
    ``P + n·T`` tokens through the model per group of ``n`` instead of ``n·(P + T)``; 0 past each
    micro-batch's longest response. Micro-batches as :func:`dense_hidden`'s. Eval mode for the forward."""
    was_training = model.training
    model.eval()
    N, T = batch.response_ids.shape
    lengths = RowLengths.of_batch(batch)
    hidden = None
    try:
        for rows in pack_micro_batches(lengths, max_tokens=max_tokens, max_rows=micro_batch_size, shared_prompt=True):
            rows = rows.to(batch.input_ids.device)
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
