"""Sparrow's acceptance α in training (``mismatch.alpha``): how far the sampler that ran is from the
dense old policy, token by token, and its tail by length bin (:mod:`sparserl.score.acceptance` has the
formula).

- ``exact``: the sampler is replayed on its own tokens (:mod:`sparserl.rollout.replay`: the same
  compressor decisions, KV and weight rounding), handing over each step's whole distribution ``q``;
  the dense learner's hidden states (one no-grad forward) give ``p`` at the same positions through its
  LM head. Exact over the vocabulary; costs about one more rollout. ``mismatch/replay_err`` is the
  largest difference between the replayed and the recorded log-probs of the sampled tokens (0 when
  the replay reproduced the sampler).
- ``topk``: Sparrow's approximation from the sampler's top-k log-probs, recorded while sampling
  (``mismatch.alpha_topk``, 20): no replay, one no-grad forward of the learner.
- ``off``: nothing measured.

Runs before the update: the sampler and the learner still hold the weights that sampled.
"""
from __future__ import annotations

import time

import torch

from .. import runlog as names
from ..batch import RolloutBatch
from ..rollout.replay import replay
from ..score.acceptance import acceptance, acceptance_topk, summary, tail_by_bin
from ..score.shared_prompt import lm_head_weight

MODES = ("exact", "topk", "off")


@torch.no_grad()
def dense_hidden(model, batch: RolloutBatch, micro_batch_size: int = 16) -> torch.Tensor:
    """[N, T, H]: the learner's final hidden state at each position that predicts a response token."""
    T = batch.response_ids.shape[1]
    was_training = model.training
    model.eval()
    decoder = model.get_decoder()
    parts = []
    for s in range(0, batch.size, micro_batch_size):
        rows = slice(s, s + micro_batch_size)
        out = decoder(input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
                      position_ids=batch.position_ids[rows], use_cache=False)
        parts.append(out.last_hidden_state[:, -T - 1 : -1])  # position j predicts token j + 1
    model.train(was_training)
    return torch.cat(parts)


def _dense_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.log_softmax((hidden @ weight.t()).float() / tau, dim=-1)


@torch.no_grad()
def measure_alpha(trainer, batch: RolloutBatch, ro, params, mode: str, bin_width: int) -> dict:
    """The step's α metrics (mean, 5th percentile, 5th percentile per length bin, time) in ``mode``."""
    if mode == "off":
        return {}
    start = time.perf_counter()
    tau = params.temperature if params.temperature > 0 else 1.0
    hidden = dense_hidden(trainer.learner, batch, trainer.cfg.train.micro_batch_size)
    weight = lm_head_weight(trainer.learner)
    N, T = batch.response_ids.shape
    alpha = torch.zeros(N, T, dtype=torch.float64)
    metrics = {}
    if mode == "exact":
        recorded = batch.sampler_logprobs.cpu()
        err = [0.0]

        def on_step(t, rows, logq):
            rows = rows.cpu()
            logp = _dense_logprobs(hidden[rows.to(hidden.device), t], weight, tau).to(logq.device)
            alpha[rows, t] = acceptance(logp, logq).double().cpu()
            tok = batch.response_ids[rows.to(batch.response_ids.device), t].to(logq.device)
            replayed = logq.gather(-1, tok[:, None])[:, 0].float().cpu()
            err[0] = max(err[0], float((replayed - recorded[rows, t]).abs().max()))

        replay(trainer.engine, ro.prompt_ids, ro.response_ids, params, on_step)
        metrics[names.MISMATCH_REPLAY_ERR] = err[0]
    elif mode == "topk":
        for i, (values, idx) in enumerate(zip(ro.top_logprobs, ro.top_indices)):
            n = len(values)
            logp = _dense_logprobs(hidden[i, :n], weight, tau)
            alpha[i, :n] = acceptance_topk(logp, values.to(logp.device), idx.to(logp.device)).double().cpu()
    else:
        raise ValueError(f"mismatch.alpha={mode!r}; expected one of {', '.join(MODES)}")
    mask = batch.response_mask.cpu()
    seq_len = torch.tensor([len(p) for p in ro.prompt_ids])[:, None] + torch.arange(T)[None]
    mean, p5 = summary(alpha, mask)
    metrics.update({names.MISMATCH_ALPHA_MEAN: mean, names.MISMATCH_ALPHA_P5: p5})
    for bin_start, (p5_bin, _) in tail_by_bin(alpha, seq_len, mask, bin_width).items():
        metrics[f"{names.MISMATCH_ALPHA_P5_BIN}{bin_start}"] = p5_bin
    metrics[names.TIME_ALPHA] = time.perf_counter() - start
    return metrics
