"""Exact acceptance α (Sparrow; :mod:`.acceptance` has the formula) of a sampled batch: the one home of
the computation that training (``mismatch.alpha=exact``, :mod:`sparserl.train.alpha`) and ``sparserl
calibrate`` (:mod:`sparserl.calibrate.measure`) share.

- ``p``: the dense policy's next-token distribution at each response position, from its final hidden
  states (:func:`dense_hidden`, one no-grad forward over ``[prompt | response]``, or
  :func:`dense_hidden_shared`, each distinct prompt forwarded once) through its LM head, at the sampling
  temperature (:func:`dense_logprobs`);
- ``q``: the sampler's whole distribution at the same positions, handed over step by step by a replay
  of the sampler forced on the responses (:mod:`sparserl.rollout.replay`: the same compressor decisions,
  KV and weight rounding);
- ``α_t = Σ_x min(p_t(x), q_t(x))`` over the whole vocabulary (:func:`exact_alpha`).

When the sampler kept its distributions while it sampled (``SamplingParams.keep_distributions``),
:func:`recorded_alpha` reads ``q`` from them and nothing is replayed.

When the responses are the sampler's own (``recorded`` given: its ``sampler_logprobs``), the replay is
checked: the replayed log-prob of each sampled token must equal the recorded one, and the largest
difference comes back (0 when the replay reproduced the sampler).
"""
from __future__ import annotations

import torch

from ..rollout.replay import replay
from .acceptance import acceptance
from .shared_prompt import response_hidden_shared

__all__ = ["dense_hidden", "dense_hidden_shared", "dense_logprobs", "distributions_fit", "distributions_mib",
           "exact_alpha", "recorded_alpha", "response_hidden", "token_seq_len"]


def distributions_mib(responses: int, max_new_tokens: int, vocab: int) -> float:
    """MiB of the ``q`` a sampler keeps (``SamplingParams.keep_distributions``): ``responses`` ×
    ``max_new_tokens`` × ``vocab`` float32 log-probs."""
    return responses * max_new_tokens * vocab * 4 / 2**20


def distributions_fit(responses: int, max_new_tokens: int, vocab: int, record_mib: int) -> bool:
    """Whether :func:`distributions_mib` fits in ``record_mib`` MiB: the rule by which training
    (``mismatch.alpha_record_mib``) and ``sparserl calibrate`` (``--alpha-record-mib``) keep ``q`` rather
    than replay the sampler."""
    return distributions_mib(responses, max_new_tokens, vocab) <= record_mib


@torch.no_grad()
def dense_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 response_len: int, micro_batch_size: int = 16) -> torch.Tensor:
    """[N, T, H]: ``model``'s final hidden state at each position that predicts a response token, for
    rows laid out as ``[left pad | prompt | response | right pad]`` with the response's ``T =
    response_len`` columns last (:class:`sparserl.batch.RolloutBatch`). Eval mode for the forward."""
    was_training = model.training
    model.eval()
    parts = []
    try:
        for s in range(0, input_ids.shape[0], micro_batch_size):
            rows = slice(s, s + micro_batch_size)
            parts.append(response_hidden(model, input_ids[rows], attention_mask[rows], position_ids[rows],
                                         response_len))
    finally:
        model.train(was_training)
    return torch.cat(parts)


@torch.no_grad()
def dense_hidden_shared(model, batch, micro_batch_size: int = 16) -> torch.Tensor:
    """[N, T, H]: :func:`dense_hidden` of a :class:`~sparserl.batch.RolloutBatch` with each distinct prompt of
    a micro-batch forwarded once and only the responses after it
    (:func:`sparserl.score.shared_prompt.response_hidden_shared`): the same states up to float rounding, at
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


def response_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    response_len: int) -> torch.Tensor:
    """[n, T, H]: :func:`dense_hidden` for one micro-batch, in the caller's grad mode and training mode
    (the update's forward keeps its graph)."""
    out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False)
    return out.last_hidden_state[:, -response_len - 1 : -1]  # position j predicts token j + 1


def token_seq_len(prompt_ids: list[list[int]], response_len: int) -> torch.Tensor:
    """[N, T] long: the sequence length (prompt + tokens generated before it) at which response token
    ``t`` of row ``i`` was drawn, ``len(prompt_ids[i]) + t``: the axis of α's length bins and of a
    :class:`~sparserl.rollout.kv.schedule.KVSchedule`'s lengths."""
    return torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)[:, None] + torch.arange(response_len)[None]


def dense_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tau: float) -> torch.Tensor:
    """log p [..., V] (float32) at temperature ``tau`` from hidden states [..., H] and the LM head [V, H]."""
    return torch.log_softmax((hidden @ weight.t()).float() / tau, dim=-1)


@torch.no_grad()
def recorded_alpha(distributions: list[torch.Tensor], hidden: torch.Tensor, lm_weight: torch.Tensor,
                   tau: float) -> torch.Tensor:
    """α [N, T] float64 on the CPU from ``q`` recorded while sampling (``distributions[i]`` [T_i, V]: the
    log-probs response ``i``'s tokens were drawn from, ``SamplingParams.keep_distributions``) instead of a
    replay: the same ``q`` the replay hands over, so the same α, without re-running the sampler. ``p`` as
    in :func:`exact_alpha`; 0 past each response's end."""
    N, T = len(distributions), hidden.shape[1]
    alpha = torch.zeros(N, T, dtype=torch.float64)
    for i, logq in enumerate(distributions):
        n = logq.shape[0]
        if n:
            logp = dense_logprobs(hidden[i, :n], lm_weight, tau).to(logq.device)
            alpha[i, :n] = acceptance(logp, logq).double().cpu()
    return alpha


@torch.no_grad()
def exact_alpha(engine, prompt_ids: list[list[int]], response_ids: list[list[int]], params,
                hidden: torch.Tensor, lm_weight: torch.Tensor, tau: float,
                recorded: torch.Tensor | None = None, on_decode=None) -> tuple[torch.Tensor, float | None]:
    """(α [N, T] float64 on the CPU, replay error): ``engine`` replayed on ``prompt_ids[i]`` forced to
    ``response_ids[i]`` with the sampling ``params`` (:func:`~sparserl.rollout.replay.replay`), each
    step's ``q`` against ``p`` from ``hidden`` [N, T, H] (:func:`dense_hidden`) and ``lm_weight`` at
    temperature ``tau``. α is 0 past each response's end. ``recorded`` [N, T]: the sampler's log-probs of
    its tokens; the error is then the largest difference from the replayed ones, else None. ``on_decode``:
    handed to the replay (what each step attended: :class:`~sparserl.rollout.attended.AttendedPositions`)."""
    N = len(response_ids)
    T = max((len(r) for r in response_ids), default=0)
    alpha = torch.zeros(N, T, dtype=torch.float64)
    tokens = torch.zeros(N, T, dtype=torch.long)
    for i, r in enumerate(response_ids):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    recorded = recorded.detach().float().cpu() if recorded is not None else None
    err = [0.0]

    def on_step(t, rows, logq):
        rows = rows.cpu()
        logp = dense_logprobs(hidden[rows.to(hidden.device), t], lm_weight, tau).to(logq.device)
        alpha[rows, t] = acceptance(logp, logq).double().cpu()
        if recorded is not None:
            replayed = logq.gather(-1, tokens[rows, t].to(logq.device)[:, None])[:, 0].float().cpu()
            err[0] = max(err[0], float((replayed - recorded[rows, t]).abs().max()))

    replay(engine, prompt_ids, response_ids, params, on_step, on_decode)
    return alpha, (err[0] if recorded is not None else None)
