"""Dense scoring: one forward of a full-precision, full-KV model over finished sequences.

Gives the old-policy log-probs ``log p`` (and reference log-probs when a KL term is on) of each
response token; with ``return_entropy`` also the per-token entropy. Sequences are laid out as
``[left padding | prompt | response | right padding]`` so that every response starts at the same
column and only the response positions go through the LM head (``logits_to_keep``).
"""

from __future__ import annotations

import torch

from ..batch import RolloutBatch
from ..packing import RowLengths, pack_micro_batches, used_columns
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
    from them through the LM head in chunks (:func:`head_logprobs`; equal up to float rounding). With
    gradients on (the update) and a plain LM head the log-probs come through the chunked head too, whose
    backward recomputes each chunk's logits instead of keeping ``[n, T, V]`` float32 logits and their
    softmax for autograd (docs/results/micro_batch_tokens).

    The forward computes only the columns the rows use (:func:`sparserl.packing.used_columns`: the left
    padding none of their prompts needs and the columns past their longest response are cut); the
    outputs are padded back to T with 0 (under ``response_mask`` = 0)."""
    T = batch.response_ids.shape[1]
    ids, att, pos = batch.input_ids[rows], batch.attention_mask[rows], batch.position_ids[rows]
    first, T_used = used_columns(att, T)
    end = ids.shape[1] - T + T_used
    ids, att, pos = ids[:, first:end], att[:, first:end], pos[:, first:end]
    targets = batch.response_ids[rows][:, :T_used]
    if return_hidden or (torch.is_grad_enabled() and _plain_head(model)):  # the update: no [n, T, V] logits kept
        hidden = response_hidden(model, ids, att, pos, T_used)
        lp, ent = head_logprobs(
            hidden,
            lm_head_weight(model),
            targets,
            temperature,
            with_entropy=return_entropy,
            entropy_grad=entropy_grad,
        )
        if not return_hidden:
            return _pad_to(lp, T), _pad_to(ent, T)
        return _pad_to(lp, T), _pad_to(ent, T), _pad_to(hidden.detach(), T)
    out = model(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=T_used + 1, use_cache=False)
    logits = out.logits[:, :-1]  # position j predicts token j+1: the last T_used+1 logits → T_used predictions
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = token_logprobs(logits, targets)
    ent = None
    if return_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lf = logits.float()
            ent = torch.logsumexp(lf, -1) - (lf.softmax(-1) * lf).sum(-1)
    return _pad_to(lp, T), _pad_to(ent, T)


def _plain_head(model) -> bool:
    """Whether ``model``'s logits are a plain ``h Wᵀ`` that the chunked head computes (:func:`lm_head_weight`)."""
    try:
        lm_head_weight(model)
    except ValueError:
        return False
    return True


def _pad_to(x: torch.Tensor | None, T: int) -> torch.Tensor | None:
    """``x`` [n, T_used] or [n, T_used, H] padded with 0 to T response columns."""
    if x is None or x.shape[1] == T:
        return x
    pad = (0, T - x.shape[1]) if x.dim() == 2 else (0, 0, 0, T - x.shape[1])
    return torch.nn.functional.pad(x, pad)


def micro_batches(
    batch: RolloutBatch,
    micro_batch_size: int,
    max_tokens: int | None,
    shared_prompt: bool,
    rows: slice | None = None,
) -> list[torch.Tensor]:
    """The row index tensors (on the batch's device) of the micro-batches of ``rows`` (default: all) of
    ``batch``: at most ``micro_batch_size`` rows and ``max_tokens`` tokens each
    (``train.max_tokens_per_micro_batch``), as the forward computes them (``shared_prompt``: each prompt
    once), packed by length (:func:`sparserl.packing.pack_micro_batches`)."""
    parts = pack_micro_batches(
        RowLengths.of_batch(batch), rows, max_tokens=max_tokens, max_rows=micro_batch_size, shared_prompt=shared_prompt
    )
    return [r.to(batch.input_ids.device) for r in parts]


@torch.no_grad()
def score_logprobs(
    model,
    batch: RolloutBatch,
    micro_batch_size: int = 16,
    temperature: float = 1.0,
    shared_prompt: bool = False,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """log p of every response token under ``model`` (no grad), in micro-batches of at most
    ``micro_batch_size`` rows and ``max_tokens`` tokens (``train.max_tokens_per_micro_batch``; rows packed
    by length, :func:`micro_batches`). [N, T] float32. ``shared_prompt``: forward each distinct prompt
    once (:func:`forward_response_shared`)."""
    forward = forward_response_shared if shared_prompt else forward_response
    was_training = model.training
    model.eval()
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    try:
        for rows in micro_batches(batch, micro_batch_size, max_tokens, shared_prompt):
            lp, _ = forward(model, batch, rows, temperature=temperature)
            out[rows] = lp.float()
    finally:
        model.train(was_training)
    return out * batch.response_mask


@torch.no_grad()
def score_logprobs_keep_hidden(
    model,
    batch: RolloutBatch,
    micro_batch_size: int = 16,
    temperature: float = 1.0,
    shared_prompt: bool = False,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p [N, T], hidden [N, T, H]): :func:`score_logprobs`'s log-probs (equal up to float rounding),
    computed from the final hidden states at the response positions, which come back too, so that
    the exact acceptance α (:mod:`sparserl.mismatch.measure`) reads ``p`` from this forward instead of a
    second one. Positions past a micro-batch's longest response hold 0 in both."""
    forward = forward_response_shared if shared_prompt else forward_response
    was_training = model.training
    model.eval()
    lps = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    hiddens = None
    try:
        for rows in micro_batches(batch, micro_batch_size, max_tokens, shared_prompt):
            lp, _, hidden = forward(model, batch, rows, temperature=temperature, return_hidden=True)
            if hiddens is None:
                hiddens = hidden.new_zeros(*batch.response_ids.shape, hidden.shape[-1])
            lps[rows] = lp.float()
            hiddens[rows] = hidden
    finally:
        model.train(was_training)
    return lps * batch.response_mask, hiddens
