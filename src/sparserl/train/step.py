"""One GRPO step on compressed rollouts, station by station (:func:`train_step`).

    prompts → rollout (compressed sampler) → reward → old-policy log-probs (dense) → mismatch (α,
    controller) → corrections and advantages → PPO-clip update → new weights into the sampler

Each station is a function of its own module; what a run chooses once (the sampler, where the old
log-probs come from) is on the trainer (:mod:`.build`), and the time per station is kept by
:class:`.laps.Laps`, outside the stations' code.
"""

from __future__ import annotations

from functools import partial

import torch

from .. import runlog as names
from ..advantages import compute_advantages, frac_zero_std_groups
from ..batch import RolloutBatch
from ..config import Config
from ..correct import apply_corrections, resolve
from ..memory import peak_resident_bytes
from ..memory.allocator import trim_freed_memory
from ..mismatch.measure import measure_alpha
from ..mismatch.split import lag_split, mismatch_split
from ..models.mixed_precision import learner_autocast
from ..reward.overlong import overlong_penalty, with_overlong_penalty
from ..reward.weighted import RewardScores, score_rewards
from ..rollout.engine import RolloutOutput
from ..score import score_logprobs
from .dense_fallback import dense_fallback, dense_sampler
from .dynamic_sampling import filter_groups
from .laps import Laps
from .oversample import oversample_select
from .sampler_sync import (
    local_sampler,
    pool_metrics,
    push_weights,
    rollout,
    rollout_params,
    sampler_at,
    sampler_of,
    sampling_params,
    token_lag,
)
from .update import update


def train_step(trainer, step: int) -> dict:
    """One RL step. Returns its metrics."""
    cfg, laps = trainer.cfg, Laps()
    # 1) rollout and 2) reward (under algorithm.filter_groups, DAPO's dynamic sampling, several rounds of both)
    examples, ro, scores, sampled, sampling = sample_and_score(trainer, step, laps)
    if cfg.train.trim_heap:  # the rollout's transient buffers, freed: their pages back to the kernel
        trim_freed_memory()
    lag = pool_metrics(trainer, ro)  # before this step's push
    with laps(names.TIME_SCORE):
        batch = rollout_batch(trainer, ro, scores.total)
        # 3) old-policy log-probs, from the source chosen when the trainer was built; the reference's
        with learner_autocast(cfg.model, trainer.device):
            old = trainer.old_policy.logprobs(trainer.learner, batch)
            batch.old_logprobs = old.logprobs
            if trainer.ref is not None:
                batch.ref_logprobs = score_logprobs(
                    trainer.ref,
                    batch,
                    cfg.train.micro_batch_size,
                    cfg.rollout.temperature,
                    cfg.train.shared_prompt,
                    cfg.train.max_tokens_per_micro_batch,
                )
        if cfg.rollout.oversample:  # Sparrow's oversampling: rollout.n of each prompt's responses kept
            batch, ro, old, oversampled = oversample_select(cfg, batch, ro, old)
            sampling.update(oversampled)
        # 4a) the mismatch split by source: weights and cache, or lag and cache
        split = (
            mismatch_split(
                local_sampler(trainer).model,
                batch,
                cfg.rollout.temperature,
                cfg.train.micro_batch_size,
                cfg.train.max_tokens_per_micro_batch,
            )
            if cfg.rollout.mismatch_split
            else lag_split(batch, ro.dense_cache)
            if ro.dense_cache is not None
            else {}
        )
    # 4b) the acceptance α (times itself: time/alpha_s), and the controller's next budgets from its tail
    if cfg.mismatch.alpha == "exact" and ro.distributions is None:  # the sampler here replays, or reads ro.hidden
        sampler_of(trainer, ro)
    params, bin_width = sampling_params(cfg, step), cfg.mismatch.alpha_bin
    at = partial(sampler_at, trainer)  # each token's own push's head (partial rollouts are drawn by several)
    alpha = measure_alpha(trainer, batch, ro, params, cfg.mismatch.alpha, bin_width, old.hidden, sampler_at=at)
    ro.distributions = ro.hidden = None  # the sampler's q or its head's inputs, read: freed before the update
    if cfg.train.trim_heap:  # scoring's and α's transients, freed: their pages back before the update
        trim_freed_memory()
    if trainer.kv_controller is not None:
        alpha.update(trainer.kv_controller.steer(trainer.engine.compressor, alpha))
    with laps(names.TIME_UPDATE):
        # 5) corrections and advantages
        corr = corrections_and_advantages(cfg, batch, step)
        # 6) update (a non-finite one is skipped; train.max_nonfinite_steps in a row stop the run)
        learned = update(trainer, batch, corr, old.update_forward)
        trainer.nonfinite.record(step, learned[names.SKIPPED_NONFINITE] == 0)
        if trainer.distill is not None:  # DistillSparse: φ on the sampler, θ frozen
            learned.update(trainer.distill.step(trainer.learner, batch))
        # 7) push the new weights into the sampler
        with laps(names.TIME_PUSH):
            push_weights(trainer)
        if trainer.engine.model.quantizer.quantizes and trainer.pool is None:  # the workers quantize on their side
            learned[names.TIME_QUANTIZE] = trainer.engine.model.last_quantize_s
    return {
        **rollout_metrics(ro, batch, sampled, cfg),
        **corr.metrics,
        **split,
        **alpha,
        **learned,
        **sampling,
        **lag,
        **laps.seconds,
        names.TIME_GENERATE: ro.seconds,
        names.TIME_STEP: laps.total(),
        names.ROLLOUT_TOKENS_PER_S: ro.tokens_generated / max(ro.seconds, 1e-9),
        names.RESPONSES_PER_S: len(ro.response_ids) / max(laps.total(), 1e-9),
        **memory_metrics(trainer),
    }


def memory_metrics(trainer) -> dict:
    """The process's resident peak so far, beside the peak preflight predicted for this config."""
    out = {names.MEMORY_RSS_PEAK: peak_resident_bytes()}
    if trainer.memory is not None:
        out[names.MEMORY_PREDICTED_PEAK] = trainer.memory.peak
    return out


def sample_and_score(trainer, step: int, laps: Laps) -> tuple[list, RolloutOutput, RewardScores, RewardScores, dict]:
    """Step ``step``'s examples, their rollout, its rewards, the rewards of everything the step sampled (the same
    but under ``algorithm.filter_groups``, DAPO's dynamic sampling: :mod:`.dynamic_sampling`), and the
    sampling's metrics; the two stations' times go to ``laps``."""
    laps.seconds.setdefault(names.TIME_ROLLOUT, 0.0)
    laps.seconds.setdefault(names.TIME_REWARD, 0.0)

    def sample():
        with laps(names.TIME_ROLLOUT):
            return rollout(trainer, step)

    def score(examples, ro):
        asked = [examples[i] for i in ro.prompt_index]
        with laps(names.TIME_REWARD):
            scores = score_rewards(
                trainer.reward_fn, ro.texts, [e.label for e in asked], [e.prompt_text for e in asked]
            )
        return shape_length(trainer.cfg, ro, scores)

    a = trainer.cfg.algorithm
    if a.filter_groups:
        return filter_groups(sample, score, trainer.cfg.train.prompts_per_step, a.max_gen_batches)
    examples, ro = sample()
    sampled = scores = score(examples, ro)
    if not trainer.cfg.rollout.dense_fallback:
        return examples, ro, scores, sampled, {}

    def resample(chosen):  # Sparrow's dense fallback: the step's sampling on the same weights, a dense cache
        with laps(names.TIME_ROLLOUT):
            params = rollout_params(trainer, step, examples)
            out = dense_sampler(local_sampler(trainer)).generate(
                [e.prompt for e in chosen], params, first_prompt=len(examples)
            )
        if ro.token_versions is not None:  # the workers' latest push: the weights the sampler here holds
            out.token_versions = [[trainer.pool.version] * len(r) for r in out.response_ids]
        return out

    ro, scores, fallback = dense_fallback(examples, ro, scores, resample, score)
    return examples, ro, scores, sampled, fallback


def shape_length(cfg: Config, ro: RolloutOutput, scores: RewardScores) -> RewardScores:
    """``scores`` with DAPO's soft overlong punishment added (``reward.overlong_buffer``; :mod:`..reward.overlong`)."""
    buffer = cfg.reward.overlong_buffer
    if buffer is None:
        return scores
    penalties = overlong_penalty(
        [len(x) for x in ro.response_ids], cfg.rollout.max_new_tokens, buffer.len, buffer.penalty_factor
    )
    fn = cfg.reward.fn
    return with_overlong_penalty(scores, fn if isinstance(fn, str) else fn[0], penalties)


def rollout_batch(trainer, ro: RolloutOutput, rewards: list[float]) -> RolloutBatch:
    """A rollout and its rewards as the learner's padded batch, on the learner's device."""
    batch = RolloutBatch.from_rollout(
        ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index, pad_id=trainer.tokenizer.pad_token_id or 0
    ).to(trainer.device)
    batch.rewards = torch.tensor(rewards, dtype=torch.float32, device=trainer.device)
    batch.truncated = torch.tensor([reason == "length" for reason in ro.finish_reason], device=trainer.device)
    lags = token_lag(trainer, ro)
    if lags is not None:
        batch.token_lag = batch.padded(lags)
    return batch


def corrections_and_advantages(cfg: Config, batch: RolloutBatch, step: int = 0):
    """The step's corrections (``algorithm.correction``, from the sampler's and the old policy's log-probs),
    returned, and its advantages, set on ``batch``. With ``algorithm.mask_truncated`` the responses cut at
    ``rollout.max_new_tokens`` enter the corrections and the loss with an empty mask (TRL's
    ``mask_truncated_completions``, DAPO's overlong filtering); their rewards still count in their group's
    advantages. With ``rollout.partial_max_lag`` the tokens drawn more pushes ago than it are masked likewise."""
    a = cfg.algorithm
    mask = batch.response_mask
    if a.mask_truncated:
        mask = mask * (~batch.truncated).to(mask.dtype)[:, None]
    stale = None
    if cfg.rollout.partial_max_lag is not None and batch.token_lag is not None:  # slime's off-policy token mask
        fresh = (batch.token_lag <= cfg.rollout.partial_max_lag).to(mask.dtype)
        stale = float((batch.response_mask * (1 - fresh)).sum() / batch.response_mask.sum().clamp(min=1))
        mask = mask * fresh
    options = dict(a.correction_options or {})
    if "double_min" in (name for name, _ in resolve(a.correction, options)):  # Sparrow's: the step's own draws
        options.update(overlap=batch.alpha, seed=cfg.train.seed * 1_000_003 + step)  # and α as its normaliser
    corr = apply_corrections(a.correction, batch.sampler_logprobs, batch.old_logprobs, mask, options or None)
    adv_options = {"scale_rewards": a.scale_rewards} if a.adv_estimator == "grpo" else {}
    batch.advantages = compute_advantages(a.adv_estimator, batch.rewards, batch.group_ids, **adv_options)
    if stale is not None:
        corr.metrics[names.ROLLOUT_STALE_MASKED] = stale
    return corr


def rollout_metrics(ro: RolloutOutput, batch: RolloutBatch, sampled: RewardScores, cfg: Config) -> dict:
    """Reward, length and KV figures of a rollout batch (KV like with like: see ``sparserl.runlog``). The reward's
    mean, spread, accuracy and parts are over ``sampled``, everything the step sampled (under dynamic sampling,
    more than the batch: a figure that compares with a run without it)."""
    r = torch.tensor(sampled.total, dtype=torch.float32)
    lengths = batch.response_mask.sum(-1)
    # per response: tokens its cache held at its end vs a dense cache then (prompt + response - 1:
    # the last sampled token never enters the cache)
    dense_tokens = [len(p) + len(x) - 1 for p, x in zip(ro.prompt_ids, ro.response_ids)]
    n = max(1, len(dense_tokens))
    return {
        names.REWARD_MEAN: float(r.mean()),
        names.REWARD_STD: float(r.std()) if r.numel() > 1 else 0.0,
        names.REWARD_VERIFIER_MEAN: sum(sampled.verified) / max(1, len(sampled.verified)),
        names.ACCURACY: sum(x >= 1.0 for x in sampled.verified) / max(1, len(sampled.verified)),
        names.REWARD_ERRORS: sampled.errors,
        **{names.reward_part_metric(spec): sum(values) / max(1, len(values)) for spec, values in sampled.parts.items()},
        names.FRAC_ZERO_STD_GROUPS: frac_zero_std_groups(batch.rewards, batch.group_ids),  # in the trained batch
        names.LENGTH_MEAN: float(lengths.mean()),
        names.LENGTH_MAX: float(lengths.max()),
        names.CLIPPED_FRAC: sum(f == "length" for f in ro.finish_reason) / len(ro.finish_reason),
        names.KV_SAMPLER_ALLOC: ro.kv.bytes_peak,
        names.KV_DENSE_ALLOC: ro.kv.bytes_dense_alloc,
        names.KV_ALLOC_REDUCTION: ro.kv.bytes_dense_alloc / max(ro.kv.bytes_peak, 1),
        names.KV_KEPT_FRAC: sum(k / max(1, d) for k, d in zip(ro.kv_tokens_kept, dense_tokens)) / n,
        names.KV_KEPT_TOKENS: sum(ro.kv_tokens_kept) / n,
        names.KV_DENSE_TOKENS: sum(dense_tokens) / n,
        names.KV_COMPRESSIONS: ro.kv.compressions,
    }
