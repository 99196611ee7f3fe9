"""Sparrow's acceptance α in training (``mismatch.alpha``): how far the sampler that ran is from the
dense old policy, token by token, and its tail by length bin (:mod:`.acceptance` has the formula).

- ``exact``: each step's whole distribution ``q``, from where ``mismatch.alpha_q`` says:

  - ``hidden`` (default): the sampler keeps the LM head's input at each position it sampled from
    (:func:`keeps_hidden`; [T, hidden] a response, rollout workers send theirs back), and ``q`` is recomputed
    from it by the sampler's own head and sampling transform, chunk by chunk
    (:func:`.exact_alpha.hidden_alpha`): no replay and no [N, T, V] tensor at any length;
  - ``kept``: ``q`` itself, kept while sampling when the step's fit in ``mismatch.alpha_record_mib``
    (:func:`keeps_distributions`, :func:`.exact_alpha.recorded_alpha`), else replayed;
  - ``replay``: handed over by a replay (:func:`.exact_alpha.exact_alpha`, shared with ``sparserl
    calibrate``: the sampler re-run on its own tokens, :mod:`.replay`: the same compressor decisions, KV
    and weight rounding, so the same ``q``).

  The replay stays where the hidden states do not suffice: DistillSparse (``algorithm.distill_sparse``: the
  replay records what the sampler read at each step, for φ's update, and replays θ alone for the ``_nophi``
  metrics), and any sampler whose logits are not a function of the head's input alone (none today: the
  sampler's head, quantized or not, is a per-row function of it, and its weights do not change between
  the rollout and α);
  the dense learner's hidden states give ``p`` at the same positions through its LM head. They are the
  old-policy scoring forward's (:func:`sparserl.score.score_logprobs_keep_hidden`, counted in
  ``time/score_s``); only where no scoring forward runs (the sampler's log-probs are the old policy's)
  does α make its own no-grad forward. Exact over the vocabulary. A replay costs about one more rollout,
  and ``mismatch/replay_err`` is then the largest difference between the replayed and the recorded
  log-probs of the sampled tokens (0 when the replay reproduced the sampler); kept distributions cost
  their memory and a copy a step.
- ``topk``: Sparrow's approximation from the sampler's top-k log-probs, recorded while sampling
  (``mismatch.alpha_topk``, 20): no replay; ``p`` as for ``exact``. Under ``rollout.async`` also its two
  parts, with ``q_w`` the sampler's weights (a step old) on a dense cache, read on the workers
  (:class:`.teacher_forced.DenseCacheReading`): the lag, α(p, q_w) over ``q_w``'s top-k,
  and the cache, α(q_w, q) over the sampler's top-k.
- ``off``: nothing measured.

Under ``rollout.async`` the rollout was sampled with the push before the latest: with ``alpha_q=hidden``
the workers keep their head inputs and send them back, and the sampler here loads that push's weights from
the pool before α (:func:`sparserl.train.sampler_sync.sampler_at`; a partial rollout's tokens, drawn by several
pushes, each by its own push's head: :func:`.exact_alpha.hidden_alpha_by_push`); with ``alpha_q=kept`` the exact α reads
the ``q`` the workers kept, which must fit (:func:`check_exact_alpha_under_async`). ``p`` is the learner's
weights, ``q`` the sampler's a step older on its sparse cache, so α is the whole mismatch, lag and cache
together.

With ``algorithm.distill_sparse`` (exact only), the replay also records what the sampler read at each step
(for φ's update, :mod:`sparserl.train.distill_sparse`), and the same sparse sampler on θ alone is replayed
too: ``mismatch/alpha_{mean,p5}_nophi``.

Runs before the update: the sampler and the learner still hold the weights that sampled. Under the
learner's mixed precision (``model.mixed_precision``) ``p``'s head product runs in bfloat16, as the
scoring forward's does.
"""

from __future__ import annotations

import math
import time

import torch

from .. import runlog as names
from ..batch import RolloutBatch
from ..models.mixed_precision import learner_autocast, learner_compute_dtype
from ..score import hidden as score_hidden
from ..score.shared_prompt import lm_head_weight
from . import exact_alpha as exact
from .acceptance import acceptance_topk, dense_logprobs, summary, tail_by_bin, token_seq_len

MODES = ("exact", "topk", "off")


def dense_hidden(
    model,
    batch: RolloutBatch,
    micro_batch_size: int = 16,
    shared_prompt: bool = False,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """[N, T, H]: the learner's final hidden state at each position that predicts a response token
    (:func:`sparserl.score.hidden.dense_hidden` on the batch's layout; ``shared_prompt``: each distinct prompt
    forwarded once, :func:`sparserl.score.hidden.dense_hidden_shared`), in micro-batches of at most
    ``micro_batch_size`` rows and ``max_tokens`` tokens (``train.max_tokens_per_micro_batch``)."""
    if shared_prompt:
        return score_hidden.dense_hidden_shared(model, batch, micro_batch_size, max_tokens)
    return score_hidden.dense_hidden(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.position_ids,
        batch.response_ids.shape[1],
        micro_batch_size,
        max_tokens,
    )


def replays(trainer) -> bool:
    """Whether the exact α must replay the sampler whatever ``mismatch.alpha_q`` says: DistillSparse (its
    replay records what the sampler read)."""
    return getattr(trainer, "distill", None) is not None


def keeps_hidden(trainer) -> bool:
    """Whether the step's sampler keeps the LM head's input at each sampled position
    (``SamplingParams.keep_hidden``), from which the exact α recomputes ``q``: ``mismatch.alpha=exact``,
    ``mismatch.alpha_q=hidden``, no DistillSparse. Rollout workers keep their shards' and send them back."""
    cfg = trainer.cfg
    return cfg.mismatch.alpha == "exact" and cfg.mismatch.alpha_q == "hidden" and not replays(trainer)


def keeps_distributions(trainer, batch_size: int) -> bool:
    """Whether the step's sampler keeps its distributions ``q`` while it samples, so that the exact α reads
    them instead of replaying it: ``mismatch.alpha=exact``, ``mismatch.alpha_q=kept``, no DistillSparse (its
    replay records what the sampler read), and ``batch_size`` responses × ``rollout.max_new_tokens`` × the
    vocabulary in float32 within ``mismatch.alpha_record_mib``. Rollout workers keep their shards' and send
    them back."""
    cfg = trainer.cfg
    if cfg.mismatch.alpha != "exact" or cfg.mismatch.alpha_q != "kept" or replays(trainer):
        return False
    return q_fits(cfg, trainer.learner, batch_size)


def q_fits(cfg, learner, batch_size: int) -> bool:
    """Whether ``batch_size`` responses' ``q`` (× ``rollout.max_new_tokens`` × the learner's vocabulary in
    float32) fit in ``mismatch.alpha_record_mib``."""
    vocab = lm_head_weight(learner).shape[0]
    return exact.distributions_fit(batch_size, cfg.rollout.max_new_tokens, vocab, cfg.mismatch.alpha_record_mib)


def check_exact_alpha_under_async(cfg, learner) -> None:
    """Under ``rollout.async`` with ``mismatch.alpha_q=kept`` the exact α reads the ``q`` the workers kept: a
    step's ``q`` must fit in ``mismatch.alpha_record_mib`` (``hidden`` needs no such room: the workers send
    their head inputs back). Raises :class:`~sparserl.config.ConfigError` naming the MiB it needs."""
    from ..config import ConfigError

    if not (cfg.rollout.async_ and cfg.mismatch.alpha == "exact" and cfg.mismatch.alpha_q == "kept"):
        return
    responses = cfg.train.prompts_per_step * cfg.rollout.n
    if not q_fits(cfg, learner, responses):
        vocab = lm_head_weight(learner).shape[0]
        need = math.ceil(exact.distributions_mib(responses, cfg.rollout.max_new_tokens, vocab))
        raise ConfigError(
            f"mismatch.alpha_record_mib={cfg.mismatch.alpha_record_mib} with rollout.async=true and "
            f"mismatch.alpha=exact: a step's q ({responses} responses x {cfg.rollout.max_new_tokens} "
            f"tokens x {vocab} vocabulary x 4 bytes) is {need} MiB, and under rollout.async "
            f"mismatch.alpha_q=kept reads the q the workers kept; set mismatch.alpha_record_mib >= {need}, or "
            f"mismatch.alpha_q=hidden (the workers keep their head inputs, {responses} x "
            f"{cfg.rollout.max_new_tokens} x the hidden size), or mismatch.alpha=topk"
        )


@torch.no_grad()
def measure_alpha(
    trainer,
    batch: RolloutBatch,
    ro,
    params,
    mode: str,
    bin_width: int,
    hidden: torch.Tensor | None = None,
    sampler_at=None,
) -> dict:
    """The step's α metrics (mean, 5th percentile, 5th percentile per length bin, time) in ``mode``.
    ``hidden`` [N, T, H]: the learner's final hidden states at the response positions when the scoring
    forward kept them (else one forward here). ``sampler_at(v)``: the sampler with weight push ``v``'s
    weights, for ``q`` from kept head inputs drawn by several pushes (a partial rollout); else the
    trainer's engine as it is."""
    if mode == "off":
        return {}
    start = time.perf_counter()
    tau = params.temperature if params.temperature > 0 else 1.0
    model_cfg = trainer.cfg.model
    if hidden is None:
        with learner_autocast(model_cfg, batch.response_ids.device):
            t = trainer.cfg.train
            hidden = dense_hidden(
                trainer.learner, batch, t.micro_batch_size, t.shared_prompt, t.max_tokens_per_micro_batch
            )
    dtype = learner_compute_dtype(model_cfg, trainer.learner)  # p's head product as the scoring forward's
    weight, hidden = lm_head_weight(trainer.learner).to(dtype), hidden.to(dtype)
    N, T = batch.response_ids.shape
    alpha = torch.zeros(N, T, dtype=torch.float64)
    metrics = {}
    if mode == "exact" and ro.hidden is not None:  # the sampler's head inputs kept: q recomputed, no replay
        at = sampler_at or (lambda version: trainer.engine)  # each token's push's head, or the engine's
        pushes = ro.token_versions
        alpha = exact.hidden_alpha_by_push(at, ro.hidden, pushes, params, hidden, weight, tau, ro.weights_version)
    elif mode == "exact" and ro.distributions is not None:  # q kept while sampling: nothing to replay
        alpha = exact.recorded_alpha(ro.distributions, hidden, weight, tau)
    elif mode == "exact":
        distill, engine = getattr(trainer, "distill", None), trainer.engine
        record = (
            distill.recorder(ro.prompt_ids, ro.response_ids, engine.model.n_layers, engine.model.n_kv)
            if distill is not None
            else None
        )  # DistillSparse replays what the sampler read, after the update
        alpha, err = exact.exact_alpha(
            engine,
            ro.prompt_ids,
            ro.response_ids,
            params,
            hidden,
            weight,
            tau,
            recorded=batch.sampler_logprobs,
            on_decode=record,
        )
        metrics[names.MISMATCH_REPLAY_ERR] = err
        if distill is not None:  # the same sparse sampler on θ alone: what φ buys
            engine.update_weights(distill.base_weights(trainer.learner))
            trainer.engine_stale = True
            plain, _ = exact.exact_alpha(engine, ro.prompt_ids, ro.response_ids, params, hidden, weight, tau)
            mask = batch.response_mask.cpu()
            metrics[names.MISMATCH_ALPHA_MEAN_NOPHI], metrics[names.MISMATCH_ALPHA_P5_NOPHI] = summary(plain, mask)
    elif mode == "topk":
        reading = ro.dense_cache if ro.dense_cache is not None and ro.dense_cache.top_logprobs is not None else None
        lag = torch.zeros(N, T, dtype=torch.float64) if reading is not None else None
        for i, (values, idx) in enumerate(zip(ro.top_logprobs, ro.top_indices)):
            n = len(values)
            logp = dense_logprobs(hidden[i, :n], weight, tau)
            alpha[i, :n] = acceptance_topk(logp, values.to(logp.device), idx.to(logp.device)).double().cpu()
            if reading is not None:  # the learner against the sampler's weights on a dense cache
                dev = logp.device
                lag[i, :n] = (
                    acceptance_topk(logp, reading.top_logprobs[i].to(dev), reading.top_indices[i].to(dev))
                    .double()
                    .cpu()
                )
        if reading is not None:
            mask = batch.response_mask.cpu()
            metrics[names.MISMATCH_ALPHA_LAG_MEAN], metrics[names.MISMATCH_ALPHA_LAG_P5] = summary(lag, mask)
            cache = batch.padded(reading.alpha).cpu().double()
            metrics[names.MISMATCH_ALPHA_CACHE_MEAN], metrics[names.MISMATCH_ALPHA_CACHE_P5] = summary(cache, mask)
    else:
        raise ValueError(f"mismatch.alpha={mode!r}; expected one of {', '.join(MODES)}")
    if mode == "exact":  # each position's α, for what reads it (the double-min correction's normaliser)
        batch.alpha = alpha.float().to(batch.response_ids.device)
    mask = batch.response_mask.cpu()
    seq_len = token_seq_len(ro.prompt_ids, T)
    mean, p5 = summary(alpha, mask)
    metrics.update({names.MISMATCH_ALPHA_MEAN: mean, names.MISMATCH_ALPHA_P5: p5})
    for bin_start, (p5_bin, _) in tail_by_bin(alpha, seq_len, mask, bin_width).items():
        metrics[f"{names.MISMATCH_ALPHA_P5_BIN}{bin_start}"] = p5_bin
    metrics[names.TIME_ALPHA] = time.perf_counter() - start
    return metrics
