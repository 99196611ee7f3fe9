"""Exact acceptance α (Sparrow; :mod:`.acceptance` has the formula) of a sampled batch: the one home of
the computation that training (``mismatch.alpha=exact``, :mod:`.measure`) and ``sparserl calibrate``
(:mod:`sparserl.calibrate.measure`) share.

- ``p``: the dense policy's next-token distribution at each response position, from its final hidden
  states (:func:`sparserl.score.hidden.dense_hidden`, one no-grad forward over ``[prompt | response]``,
  or :func:`~sparserl.score.hidden.dense_hidden_shared`, each distinct prompt forwarded once) through its
  LM head, at the sampling temperature (:func:`.acceptance.dense_logprobs`);
- ``q``: the sampler's whole distribution at the same positions, handed over step by step by a replay
  of the sampler forced on the responses (:mod:`.replay`: the same compressor decisions,
  KV and weight rounding);
- ``α_t = Σ_x min(p_t(x), q_t(x))`` over the whole vocabulary (:func:`exact_alpha`).

Three routes to ``q``, the same numbers (tested to 1e-6 on every compressor and quantization):

- :func:`hidden_alpha` (``mismatch.alpha_q=hidden``): the sampler kept, at each position it sampled from,
  its LM head's input (``SamplingParams.keep_hidden``: [T, hidden] a response, ~V/H times less than ``q``);
  ``q`` is recomputed from it by the sampler's own head (:meth:`~sparserl.rollout.engine.RolloutEngine.
  hidden_logits`: quantized or not, the prefill's for token 0 and the decode step's after) and the same
  tempering and top-k / top-p filtering as sampling (:func:`~sparserl.rollout.sampling.sampled_distribution`),
  ``DEFAULT_CHUNK`` positions at a time, so no [N, T, V] tensor exists. Exact because the sampler's
  logits are a function of that input alone (each row on its own, the head's weights unchanged since).
- :func:`recorded_alpha` (``kept``): ``q`` itself, kept while sampling (``SamplingParams.keep_distributions``).
- :func:`exact_alpha` (``replay``): the sampler replayed on its own tokens.

When the responses are the sampler's own (``recorded`` given: its ``sampler_logprobs``), the replay is
checked: the replayed log-prob of each sampled token must equal the recorded one, and the largest
difference comes back (0 when the replay reproduced the sampler).
"""

from __future__ import annotations

import torch

from ..rollout.sampling import sampled_distribution
from ..score.chunked_head import DEFAULT_CHUNK
from .acceptance import acceptance, dense_logprobs
from .replay import replay

__all__ = [
    "distributions_fit",
    "distributions_mib",
    "exact_alpha",
    "hidden_alpha",
    "hidden_alpha_by_push",
    "recorded_alpha",
]


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
def recorded_alpha(
    distributions: list[torch.Tensor], hidden: torch.Tensor, lm_weight: torch.Tensor, tau: float
) -> torch.Tensor:
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
def hidden_alpha(
    engine,
    kept: list[torch.Tensor],
    params,
    hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    tau: float,
    chunk: int = DEFAULT_CHUNK,
    only: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """α [N, T] float64 on the CPU from the sampler's kept head inputs (``kept[i]`` [T_i, hidden]:
    ``RolloutOutput.hidden``, ``SamplingParams.keep_hidden``): ``q = sampled_distribution(
    engine.hidden_logits(x), params)``, the distribution each token was drawn from, recomputed by the
    sampler's own head with the sampling ``params``; ``p`` from ``hidden`` [N, T, H] and ``lm_weight`` at
    temperature ``tau`` as in :func:`exact_alpha`. ``chunk`` positions at a time (across responses): at most
    a [chunk, V] block of each. 0 past each response's end, and where ``only`` (per response, bool [T_i]) is
    given, 0 at the positions it leaves out (:func:`hidden_alpha_by_push`)."""
    N, T = len(kept), hidden.shape[1]
    alpha = torch.zeros(N, T, dtype=torch.float64)
    lengths = [k.shape[0] for k in kept]
    for first in (True, False):  # token 0 came from the prefill's head, the others from the decode step's
        if first:
            rows = [i for i, n in enumerate(lengths) if n]
            cols = [0] * len(rows)
            x = torch.stack([kept[i][0] for i in rows]) if rows else None
        else:
            rows = [i for i, n in enumerate(lengths) for _ in range(n - 1)]
            cols = [t for n in lengths for t in range(1, n)]
            x = torch.cat([k[1:] for k in kept]) if rows else None
        rows, cols = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
        if only is not None and len(rows):
            picked = torch.stack([only[i][0] for i in rows.tolist()]) if first else torch.cat([o[1:] for o in only])
            rows, cols, x = rows[picked], cols[picked], x[picked.to(x.device)]
        for s in range(0, len(rows), chunk):
            r, c = rows[s : s + chunk], cols[s : s + chunk]
            logq = sampled_distribution(engine.hidden_logits(x[s : s + chunk], first), params)
            logp = dense_logprobs(hidden[r.to(hidden.device), c.to(hidden.device)], lm_weight, tau)
            alpha[r, c] = acceptance(logp, logq.to(logp.device)).double().cpu()
    return alpha


@torch.no_grad()
def hidden_alpha_by_push(
    sampler_at,
    kept: list[torch.Tensor],
    versions: list[list[int]] | None,
    params,
    hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    tau: float,
    version: int | None = None,
) -> torch.Tensor:
    """:func:`hidden_alpha` with each token's ``q`` from the head of the weight push that drew it:
    ``versions[i][t]`` (``RolloutOutput.token_versions``; a partial rollout's tokens carry several pushes,
    ``rollout.partial``), ``sampler_at(v)`` the sampler holding push ``v``'s weights. One pass per push
    present; one with ``sampler_at(version)`` where the tokens carry none or one."""
    pushes = sorted({v for vs in versions for v in vs}) if versions is not None else []
    if len(pushes) <= 1:
        return hidden_alpha(sampler_at(pushes[0] if pushes else version), kept, params, hidden, lm_weight, tau)
    alpha = torch.zeros(len(kept), hidden.shape[1], dtype=torch.float64)
    for v in pushes:
        only = [torch.tensor(vs, dtype=torch.long) == v for vs in versions]
        alpha += hidden_alpha(sampler_at(v), kept, params, hidden, lm_weight, tau, only=only)
    return alpha


@torch.no_grad()
def exact_alpha(
    engine,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    params,
    hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    tau: float,
    recorded: torch.Tensor | None = None,
    on_decode=None,
) -> tuple[torch.Tensor, float | None]:
    """(α [N, T] float64 on the CPU, replay error): ``engine`` replayed on ``prompt_ids[i]`` forced to
    ``response_ids[i]`` with the sampling ``params`` (:func:`.replay.replay`), each step's ``q`` against
    ``p`` from ``hidden`` [N, T, H] (:func:`sparserl.score.hidden.dense_hidden`) and ``lm_weight`` at
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
