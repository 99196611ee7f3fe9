"""Teacher-forced log-probs of given responses under the sampler's own weights with a dense,
full-precision cache (one forward over prompt + response): the "quantized-dense" sampler that splits
a quantized and compressed sampler's mismatch into its two sources (``rollout.mismatch_split``).

With ``p`` the dense learner (old policy), ``q_w`` the sampler's (quantized) weights on a dense
full-precision cache, and ``q`` the sampler as it ran (eviction and KV rounding on top)::

    log p/q = log p/q_w  (weights: quantization)  +  log q_w/q  (cache: eviction, KV quantization)

Each part's k3 (``ρ - 1 - log ρ``) is averaged over the sampled tokens. The tokens were drawn from
``q``, not ``q_w``, so the weights part is a sample estimate under ``q`` of a quantity defined for
``q_w``: a diagnostic of where the mismatch comes from, not an unbiased KL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import RolloutBatch
from ..packing import micro_batch_rows
from ..rollout.model import SamplerModel
from .acceptance import acceptance_topk


@torch.inference_mode()
def teacher_forced_logsoftmax(
    model: SamplerModel,
    batch: RolloutBatch,
    temperature: float = 1.0,
    micro_batch_size: int = 16,
    max_tokens: int | None = None,
):
    """Yields ``(rows, log_q)`` per micro-batch: ``log_q`` [n, T, V] float32 ``log softmax(logits / τ)`` of
    ``model`` at the positions that predict each response token, teacher forced on ``batch``
    (``[left pad | prompt | response | right pad]``), on the model's device. A micro-batch holds
    ``micro_batch_size`` rows, fewer where ``max_tokens`` bounds its tokens (prompt and response, padded): its
    logits and their log-softmax are two float32 [n, T, V] blocks, 15 GB for 32 rows of 1,200 tokens over
    SmolLM2's 49,152-token vocabulary."""
    N, T = batch.response_ids.shape
    P = batch.input_ids.shape[1] - T
    tau = temperature if temperature > 0 else 1.0
    dev = model.device
    step = micro_batch_rows(micro_batch_size, max_tokens, P + T)
    for s in range(0, N, step):
        rows = slice(s, min(N, s + step))
        h = model.hidden_states(
            batch.input_ids[rows].to(dev), batch.attention_mask[rows].to(dev).bool(), batch.position_ids[rows].to(dev)
        )
        logits = model.logits(h[:, P - 1 : P + T - 1]).float() / tau  # position t predicts token t + 1
        yield rows, torch.log_softmax(logits, dim=-1)


def teacher_forced_logprobs(
    model: SamplerModel,
    batch: RolloutBatch,
    temperature: float = 1.0,
    micro_batch_size: int = 16,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """[N, T] float32 log-prob of each response token under ``model`` (:func:`teacher_forced_logsoftmax`),
    0 where the response mask is 0."""
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    for rows, log_q in teacher_forced_logsoftmax(model, batch, temperature, micro_batch_size, max_tokens):
        lp = log_q.gather(-1, batch.response_ids[rows, :, None].to(log_q.device))[..., 0]
        out[rows] = lp.to(out.device) * batch.response_mask[rows]
    return out


@dataclass
class DenseCacheReading:
    """What a sampler's own weights say on a dense full-precision cache (``q_w``) about the responses it
    sampled, read where it sampled, before newer weights arrive (a rollout worker under ``rollout.async``).
    Per response, lists of length N: ``logprobs`` [T] of the sampled tokens; with top-k asked,
    ``top_logprobs`` / ``top_indices`` [T, k] (``q_w``'s own top-k) and ``alpha`` [T], Sparrow's acceptance
    of the sampler that ran against ``q_w`` over the sampler's recorded top-k
    (:func:`.acceptance.acceptance_topk`): the cache's part of α."""

    logprobs: list[torch.Tensor]
    top_logprobs: list[torch.Tensor] | None = None
    top_indices: list[torch.Tensor] | None = None
    alpha: list[torch.Tensor] | None = None

    @staticmethod
    def concat(readings: list[DenseCacheReading]) -> DenseCacheReading:
        """One reading of the responses of ``readings`` in order (the shards of a step)."""

        def joined(name):
            parts = [getattr(r, name) for r in readings]
            return None if any(p is None for p in parts) else [x for p in parts for x in p]

        return DenseCacheReading(*(joined(name) for name in ("logprobs", "top_logprobs", "top_indices", "alpha")))


def read_dense_cache(
    model: SamplerModel,
    ro,
    temperature: float,
    topk: int = 0,
    micro_batch_size: int = 16,
    pad_id: int = 0,
    max_tokens: int | None = None,
) -> DenseCacheReading:
    """The :class:`DenseCacheReading` of rollout ``ro`` (a :class:`~sparserl.rollout.engine.RolloutOutput`)
    under ``model``; ``topk`` > 0 also keeps ``q_w``'s top-k and, when ``ro`` recorded the sampler's
    top-k, α against it. ``micro_batch_size`` / ``max_tokens``: :func:`teacher_forced_logsoftmax`'s."""
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index, pad_id)
    lengths = [len(r) for r in ro.response_ids]
    with_alpha = topk > 0 and ro.top_logprobs is not None
    out = DenseCacheReading([], [] if topk else None, [] if topk else None, [] if with_alpha else None)
    for rows, log_q in teacher_forced_logsoftmax(model, batch, temperature, micro_batch_size, max_tokens):
        for j, i in enumerate(range(rows.start, rows.stop)):
            n, row = lengths[i], log_q[j, : lengths[i]]
            out.logprobs.append(row.gather(-1, batch.response_ids[i, :n, None].to(row.device))[:, 0].cpu())
            if topk:
                values, idx = row.topk(min(topk, row.shape[-1]), dim=-1)
                out.top_logprobs.append(values.cpu())
                out.top_indices.append(idx.cpu())
            if with_alpha:
                dev = row.device
                out.alpha.append(acceptance_topk(row, ro.top_logprobs[i].to(dev), ro.top_indices[i].to(dev)).cpu())
    return out
