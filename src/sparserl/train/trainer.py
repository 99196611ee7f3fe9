"""GRPO on compressed rollouts: the loop that strings the stations together.

    prompts → rollout (compressed sampler) → reward → score (dense old policy, reference)
            → correct (rejection, reweighting) → advantages → PPO-clip update → new weights into
            the sampler → metrics → checkpoint

``train_step`` is the whole step in one screen; each station is a function of its own module.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import runlog as names
from ..runlog import read_metrics
from ..config import Config, config_to_dict
from ..correct import apply_corrections, log_ratio
from ..data import PromptSampler, load_dataset
from ..models.loading import check_model, load_model
from ..models.mixed_precision import choose as choose_mixed_precision, learner_autocast, learner_compute_dtype
from ..reward.overlong import overlong_penalty, with_overlong_penalty
from ..reward.weighted import RewardScores, load_rewards, score_rewards, verifier
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..eval.evaluate import evaluate, write_eval_record
from ..eval.report import make_report
from ..models.invariant_scaling import apply_invariant_scaling, refold_after_load
from ..rollout.build import engine_from_fields, sampler_section
from ..rollout.kv import compressor_from_fields, get_compressor
from ..rollout.sampling import SamplingParams
from ..rollout.teacher_forced import teacher_forced_logprobs
from ..score import (forward_response, forward_response_shared, model_dropout, old_logprobs_source,
                     score_logprobs, score_logprobs_keep_hidden)
from ..advantages import compute_advantages, frac_zero_std_groups
from ..batch import RolloutBatch
from .checkpoint import latest_checkpoint, load_latest, remove_debris, save_checkpoint, set_rng_state
from .update_forward import UpdateForward, run_update_forward
from .update_visible import quantized_weight_snapshot, update_visible_frac
from .losses import agg_loss, kl_penalty, loss_normalizers, policy_loss
from .lr_schedule import build_scheduler
from .metrics import MetricsLogger
from .alpha import check_exact_alpha_under_async, keeps_distributions, measure_alpha
from .kv_controller import KVController
from .determinism import (deterministic_state, naming_nondeterministic_ops, restore_deterministic_state,
                          use_deterministic_kernels)
from .distill_sparse import DistillSparse
from .dynamic_sampling import filter_groups
from .eval_set import load_eval_set
from .lora import apply_lora, sampler_state
from .run_folder import (CONFIG_FILE, ResumeError, check_resume_config, checkpoint_step, find_resume_folder,
                         holds_run, naming_data_key, preflight, record_config, resolve_run_dir)


@dataclass
class Trainer:
    """What lives across steps: the learner, its optimizer, the sampler, the data, the reference."""

    cfg: Config
    learner: torch.nn.Module
    tokenizer: object
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: PromptSampler
    reward_fn: object
    ref: torch.nn.Module | None = None
    kv_controller: KVController | None = None
    pool: object | None = None  # sparserl.cluster.pool.RolloutPool: the rollout workers, when there are
    learners: object | None = None  # .data_parallel.LearnerGroup: the other learners, when cluster.learners > 1
    pending: tuple | None = None  # (examples, PendingRollout): the next step's rollout, sent before this step's update
    threads_before: int | None = None  # torch's threads before the cluster's actors took cores beside this process
    engine_stale: bool = False  # ``engine`` does not hold the sampler's current weights (rollout workers, α without φ)
    distill: object | None = None  # .distill_sparse.DistillSparse: φ on the sampler (algorithm.distill_sparse)

    @property
    def ranks(self):
        """This process's :class:`.data_parallel.Ranks` among the learners (None: it is the only one)."""
        return self.learners.ranks if self.learners is not None else None

    @property
    def device(self) -> torch.device:
        """Where the learner lives (``model.device``): the batch moves there to be scored and trained."""
        return next(self.learner.parameters()).device


def build_learner(cfg: Config):
    """(loaded model, learner, AdamW, warm-up schedule): the one builder of a learner, the training
    process's and every data-parallel peer's (:mod:`.data_parallel`)."""
    t = cfg.train
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
    learner = apply_invariant_scaling(lm.model, cfg.rollout.quant_scale).train()  # QuRL: before the sampler copies it
    if t.lora_rank:  # peft adapters on the learner; the sampler keeps the merged weights (sampler_state)
        learner = apply_lora(learner, t.lora_rank, t.lora_alpha, t.lora_dropout, t.lora_target).train()
    trained = [p for p in learner.parameters() if p.requires_grad]
    fused = trained[0].device.type in ("cpu", "cuda")  # torch's one-kernel AdamW (the HF Trainer's default)
    opt = torch.optim.AdamW(trained, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay,
                            fused=fused or None)
    return lm, learner, opt, build_scheduler(opt, cfg)


def build_trainer(cfg: Config) -> Trainer:
    """The learner, sampler, optimizer, data and reward of a config. The cheap parts come first (data,
    the model's path, the reward spec), so a bad input fails before any weights load."""
    torch.manual_seed(cfg.train.seed)
    d = cfg.data
    with naming_data_key("data.train", d.train):
        data = load_dataset(d.train, prompt_key=d.prompt_key, label_key=d.label_key, template=d.template,
                            key_options=("data.prompt_key", "data.label_key"),
                            system_prompt=d.system_prompt, limit=d.limit,
                            skip_bad_rows=d.skip_bad_rows if d.skip_bad_rows else None)
    if data.skipped:
        print(f"data: {len(data)} examples from {data.source}, {data.skipped} bad rows skipped")
    check_model(cfg.model.name)
    reward_fn = load_rewards(cfg.reward.fn, cfg.reward.weights, timeout_s=cfg.reward.timeout_s)
    if cfg.cluster.rollout_workers is not None or cfg.cluster.learners > 1:  # Ray there, its address answering
        from ..cluster.pool import preflight as cluster_preflight

        cluster_preflight(cfg.cluster)
    r, t = sampler_section(cfg), cfg.train
    if t.deterministic:  # before the model reaches a GPU: cuBLAS reads its workspace setting as it starts
        use_deterministic_kernels(cfg.model.device)
    lm, learner, opt, sched = build_learner(cfg)
    engine = engine_from_fields(lm, r, sampler_state(learner))
    old_logprobs_of(cfg, engine, learner)  # the model's own facts (its dropout): a refused source fails here
    check_exact_alpha_under_async(cfg, learner)  # the vocabulary's size: before any worker starts
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(learner).eval().requires_grad_(False)
    controller = None
    if r.kv_controller is not None:  # it starts from the configured schedule or budget
        controller = KVController.from_config(r.kv_controller, cfg.mismatch.alpha_bin,
                                              engine.compressor.schedule or r.kv_budget)
        engine.compressor.set_schedule(controller.schedule())
    pool = None
    if cfg.cluster.rollout_workers is not None:  # Ray imported only here
        from ..cluster.pool import RolloutPool

        pool = RolloutPool(cfg, sampler_state(learner))
    trainer = Trainer(cfg, learner, lm.tokenizer, engine, opt, sched,
                      PromptSampler(list(data), t.prompts_per_step, seed=t.seed), reward_fn, ref, controller, pool)
    if cfg.algorithm.distill_sparse is not None:
        trainer.distill = DistillSparse(cfg, learner)
    if cfg.cluster.learners > 1:
        from .data_parallel import LearnerGroup

        trainer.learners = LearnerGroup(cfg, trainer)
    if pool is not None:
        from ..cluster.pool import training_threads

        threads = training_threads(cfg.cluster, r.async_, updating=False)
        if threads is not None and threads < torch.get_num_threads():
            print(f"cluster: {threads} torch thread(s) for the training process, the other cores for the rollout "
                  "workers sampling beside it")
            trainer.threads_before = torch.get_num_threads()
            torch.set_num_threads(threads)
    return trainer


def close_cluster(trainer: Trainer) -> None:
    """Stop the rollout workers and the other learners (and a Ray started for the run)."""
    if trainer.learners is not None:
        trainer.learners.close()
    if trainer.pool is not None:
        trainer.pool.close()
    if trainer.threads_before is not None:
        torch.set_num_threads(trainer.threads_before)
        trainer.threads_before = None


def rollout(trainer: Trainer, step: int) -> tuple[list, RolloutOutput]:
    """Step ``step``'s examples and their rollout: on the engine here, or on the rollout workers with the
    budgets the controller has reached (``cluster.rollout_workers``; the same samples either way).

    One-step-asynchronous (``rollout.async``): the rollout sent during the step before is collected (sampled
    with the weights before that step's update), and the next step's is sent now, to run during this step's
    update. Not after a checkpoint's step, so that a run resumed there samples what it would have (and
    not past the last step)."""
    cfg = trainer.cfg
    if trainer.pool is None:
        examples = trainer.data.next_batch()
        keep = keeps_distributions(trainer, len(examples) * cfg.rollout.n)  # the exact α reads them: no replay
        return examples, trainer.engine.generate([e.prompt for e in examples], sampling_params(cfg, step, keep))
    examples, pending = trainer.pending or send_rollout(trainer, step)
    trainer.pending = None
    ro = trainer.pool.collect(pending)
    if cfg.rollout.async_ and not checkpoint_due(cfg, step):
        trainer.pending = send_rollout(trainer, step + 1)
    return examples, ro


def send_rollout(trainer: Trainer, step: int) -> tuple[list, object]:
    """Draw step ``step``'s examples and send their rollout to the workers; under ``rollout.async`` they
    also read it on a dense cache with the weights that sampled (:func:`lag_split`, α's lag part)."""
    cfg = trainer.cfg
    examples = trainer.data.next_batch()
    read = (cfg.mismatch.alpha_topk if cfg.mismatch.alpha == "topk" else 0) if cfg.rollout.async_ else None
    keep = keeps_distributions(trainer, len(examples) * cfg.rollout.n)  # the workers send q back: no replay here
    return examples, trainer.pool.submit([e.prompt for e in examples], sampling_params(cfg, step, keep),
                                         trainer.engine.compressor.schedule, read)


def checkpoint_due(cfg: Config, step: int) -> bool:
    """Step ``step`` ends with a checkpoint (``checkpoint.every``; 0 = the last step only)."""
    every = cfg.checkpoint.every
    return bool(every and step % every == 0) or step == cfg.train.steps


def sampler_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """What the sampler runs: the learner's weights (with LoRA: merged), with DistillSparse's φ merged on top."""
    if trainer.distill is not None:
        return trainer.distill.sampler_weights(trainer.learner)
    return sampler_state(trainer.learner)


def push_weights(trainer: Trainer) -> None:
    """The sampler's weights (:func:`sampler_weights`) into the sampler: the engine here, or every rollout
    worker (under ``rollout.async`` without waiting: they load them after sampling the next step), the engine
    here then loading them only when it is used (:func:`local_sampler`)."""
    weights = sampler_weights(trainer)
    if trainer.pool is None:
        trainer.engine.update_weights(weights)
        trainer.engine_stale = False
    else:
        trainer.pool.update_weights(weights, wait=not trainer.cfg.rollout.async_)
        trainer.engine_stale = True


def local_sampler(trainer: Trainer) -> RolloutEngine:
    """The sampler in this process with the learner's current weights, for what runs here whatever samples
    the rollouts: the exact α's replay, ``rollout.mismatch_split``, held-out evaluation."""
    if trainer.engine_stale:
        trainer.engine.update_weights(sampler_weights(trainer))
        trainer.engine_stale = False
    return trainer.engine


def pool_metrics(trainer: Trainer, ro: RolloutOutput) -> dict:
    """Rollout workers replaced so far and the policy lag of the step's rollout (weight pushes since the
    one it sampled with: 1 under ``rollout.async``, else 0)."""
    if trainer.pool is None:
        return {}
    return {names.CLUSTER_WORKER_RESTARTS: trainer.pool.restarts,
            names.MISMATCH_POLICY_LAG: trainer.pool.version - ro.weights_version}


def sampling_params(cfg: Config, step: int, keep_distributions: bool = False) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=list(r.stop), seed=cfg.train.seed * 1_000_003 + step,
                          logprobs_topk=cfg.mismatch.alpha_topk if cfg.mismatch.alpha == "topk" else 0,
                          keep_distributions=keep_distributions)


def train_step(trainer: Trainer, step: int) -> dict:
    """One RL step. Returns its metrics."""
    cfg, times = trainer.cfg, {}
    clock = started = time.perf_counter()

    def lap(key):
        nonlocal clock
        now = time.perf_counter()
        times[key] = now - clock
        clock = now

    examples, ro, scores, sampled, sampling = sample_and_score(trainer, step)  # the rollout and reward stations
    lag = pool_metrics(trainer, ro)  # before this step's push
    clock = time.perf_counter()
    batch = rollout_batch(trainer, ro, scores.total)
    temp, shared, hidden, micro = cfg.rollout.temperature, cfg.train.shared_prompt, None, cfg.train.micro_batch_size
    source, update_forward = old_logprobs_from(trainer), None
    with learner_autocast(cfg.model, trainer.device):
        if source == "sampler":  # the sampler ran the old policy exactly: no scoring forward
            batch.old_logprobs = batch.sampler_logprobs * batch.response_mask
        elif source == "update":  # the update's own forward, now: its graph waits for the loss
            update_forward = run_update_forward(trainer.learner, batch, shared_prompt=shared, temperature=temp,
                                                entropy_grad=bool(cfg.algorithm.entropy_coef),
                                                keep_hidden=cfg.mismatch.alpha != "off")
            batch.old_logprobs, hidden = update_forward.old_logprobs, update_forward.hidden
        elif cfg.mismatch.alpha == "off":
            batch.old_logprobs = score_logprobs(trainer.learner, batch, micro, temp, shared)
        else:  # α reads p from this forward's hidden states
            batch.old_logprobs, hidden = score_logprobs_keep_hidden(trainer.learner, batch, micro, temp, shared)
        if trainer.ref is not None:
            batch.ref_logprobs = score_logprobs(trainer.ref, batch, micro, temp, shared)
    split = (mismatch_split(local_sampler(trainer), batch, cfg) if cfg.rollout.mismatch_split else
             lag_split(batch, ro.dense_cache) if ro.dense_cache is not None else {})
    lap(names.TIME_SCORE)
    if cfg.mismatch.alpha == "exact" and ro.distributions is None:  # it replays the sampler here
        local_sampler(trainer)
    alpha = measure_alpha(trainer, batch, ro, sampling_params(cfg, step), cfg.mismatch.alpha, cfg.mismatch.alpha_bin,
                          hidden)
    ro.distributions = None  # the sampler's q, read: freed before the update
    if trainer.kv_controller is not None:  # the next rollout's budgets, from this step's α tail
        alpha.update(trainer.kv_controller.steer(trainer.engine.compressor, alpha))
    clock = time.perf_counter()  # time/alpha_s is its own, not the next station's
    corr = corrections_and_advantages(cfg, batch)
    update_metrics = update(trainer, batch, corr, update_forward)
    if trainer.distill is not None:  # DistillSparse: φ on the sampler, θ frozen
        update_metrics.update(trainer.distill.step(trainer.learner, batch))
    pushed = time.perf_counter()
    push_weights(trainer)
    update_metrics[names.TIME_PUSH] = time.perf_counter() - pushed
    if trainer.engine.model.quantizer.quantizes and trainer.pool is None:  # the workers quantize on their side
        update_metrics[names.TIME_QUANTIZE] = trainer.engine.model.last_quantize_s
    lap(names.TIME_UPDATE)
    return {**rollout_metrics(ro, batch, sampled, cfg), **corr.metrics, **split, **alpha, **update_metrics,
            **times, **sampling, **lag, names.TIME_GENERATE: ro.seconds, names.TIME_STEP: time.perf_counter() - started,
            names.ROLLOUT_TOKENS_PER_S: ro.tokens_generated / max(ro.seconds, 1e-9)}


def sample_and_score(trainer: Trainer, step: int) -> tuple[list, RolloutOutput, RewardScores, RewardScores, dict]:
    """Step ``step``'s examples, their rollout, its rewards, the rewards of everything the step sampled (the same
    but under ``algorithm.filter_groups``, DAPO's dynamic sampling: :mod:`.dynamic_sampling`), and the two
    stations' times with the sampling's metrics."""
    spent = {names.TIME_ROLLOUT: 0.0, names.TIME_REWARD: 0.0}

    def timed(key, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        spent[key] += time.perf_counter() - start
        return out

    def sample():
        return timed(names.TIME_ROLLOUT, rollout, trainer, step)

    def score(examples, ro):
        asked = [examples[i] for i in ro.prompt_index]
        scores = timed(names.TIME_REWARD, score_rewards, trainer.reward_fn, ro.texts, [e.label for e in asked],
                       [e.prompt_text for e in asked])
        return shape_length(trainer.cfg, ro, scores)

    a = trainer.cfg.algorithm
    if not a.filter_groups:
        examples, ro = sample()
        scores = score(examples, ro)
        return examples, ro, scores, scores, spent
    examples, ro, scores, sampled, stats = filter_groups(sample, score, trainer.cfg.train.prompts_per_step,
                                                         a.max_gen_batches)
    return examples, ro, scores, sampled, {**spent, **stats}


def shape_length(cfg: Config, ro: RolloutOutput, scores: RewardScores) -> RewardScores:
    """``scores`` with DAPO's soft overlong punishment added (``reward.overlong_buffer``; :mod:`..reward.overlong`)."""
    buffer = cfg.reward.overlong_buffer
    if buffer is None:
        return scores
    penalties = overlong_penalty([len(x) for x in ro.response_ids], cfg.rollout.max_new_tokens, buffer.len,
                                 buffer.penalty_factor)
    fn = cfg.reward.fn
    return with_overlong_penalty(scores, fn if isinstance(fn, str) else fn[0], penalties)


def rollout_batch(trainer: Trainer, ro: RolloutOutput, rewards: list[float]) -> RolloutBatch:
    """A rollout and its rewards as the learner's padded batch, on the learner's device."""
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index,
                                      pad_id=trainer.tokenizer.pad_token_id or 0).to(trainer.device)
    batch.rewards = torch.tensor(rewards, dtype=torch.float32, device=trainer.device)
    batch.truncated = torch.tensor([reason == "length" for reason in ro.finish_reason], device=trainer.device)
    return batch


def corrections_and_advantages(cfg: Config, batch: RolloutBatch):
    """The step's corrections (``algorithm.correction``, from the sampler's and the old policy's log-probs),
    returned, and its advantages, set on ``batch``. With ``algorithm.mask_truncated`` the responses cut at
    ``rollout.max_new_tokens`` enter the corrections and the loss with an empty mask (TRL's
    ``mask_truncated_completions``, DAPO's overlong filtering); their rewards still count in their group's
    advantages."""
    a = cfg.algorithm
    mask = batch.response_mask
    if a.mask_truncated:
        mask = mask * (~batch.truncated).to(mask.dtype)[:, None]
    corr = apply_corrections(a.correction, batch.sampler_logprobs, batch.old_logprobs, mask,
                             a.correction_options or None)
    adv_options = {"scale_rewards": a.scale_rewards} if a.adv_estimator == "grpo" else {}
    batch.advantages = compute_advantages(a.adv_estimator, batch.rewards, batch.group_ids, **adv_options)
    return corr


def mismatch_split(engine: RolloutEngine, batch: RolloutBatch, cfg: Config) -> dict:
    """The mismatch's two parts (:mod:`sparserl.rollout.teacher_forced`): k3 of the dense learner
    against the sampler's quantized weights on a dense cache (``engine``'s, holding the weights that
    sampled), and of those against the sampler."""
    q_weights = teacher_forced_logprobs(engine.model, batch, cfg.rollout.temperature,
                                        cfg.train.micro_batch_size).to(batch.old_logprobs.device)
    return {names.MISMATCH_K3_WEIGHTS: k3_mean(q_weights, batch.old_logprobs, batch.response_mask),
            names.MISMATCH_K3_CACHE: k3_mean(batch.sampler_logprobs, q_weights, batch.response_mask)}


def lag_split(batch: RolloutBatch, reading) -> dict:
    """The mismatch's two parts under ``rollout.async``, with ``q_w`` the sampler's weights of a step before
    on a dense cache (``reading``, a :class:`~sparserl.rollout.teacher_forced.DenseCacheReading` made on the
    workers): k3 of the learner against ``q_w`` (the lag, and the sampler's weight rounding when it
    rounds) and of ``q_w`` against the sampler that ran (the cache)."""
    q_weights = batch.padded(reading.logprobs)
    return {names.MISMATCH_K3_LAG: k3_mean(q_weights, batch.old_logprobs, batch.response_mask),
            names.MISMATCH_K3_CACHE: k3_mean(batch.sampler_logprobs, q_weights, batch.response_mask)}


def k3_mean(log_q: torch.Tensor, log_p: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean k3 = ρ - 1 - log ρ, ρ = p / q, over the tokens where ``mask`` holds (0 when none)."""
    lr = log_ratio(log_q, log_p, mask).double()[mask.bool()]
    return float((lr.exp() - 1 - lr).mean()) if lr.numel() else 0.0


def old_logprobs_from(trainer: Trainer) -> str:
    """Where the step's old-policy log-probs come from (``algorithm.old_logprobs``,
    :func:`sparserl.score.old_logprobs_source`): ``"sampler"`` (a dense float32 sampler of the full tempered
    distribution), ``"update"`` (the update's own forward: one optimizer step over one micro-batch, no
    dropout in the learner) or ``"score"``."""
    return old_logprobs_of(trainer.cfg, trainer.engine, trainer.learner)


def old_logprobs_of(cfg: Config, engine: RolloutEngine, learner) -> str:
    """:func:`old_logprobs_from` for a config's sampler and learner (``build_trainer`` asks once, so that a
    source the loaded model cannot give, e.g. ``update`` on a model with dropout, fails before any rollout)."""
    r = cfg.rollout
    return old_logprobs_source(cfg.algorithm.old_logprobs,
                               why_not_update=cfg.why_update_forward_is_not_old_policy(model_dropout(learner)),
                               compresses=engine.compressor.compresses, sampler_dtype=engine.dtype,
                               learner_dtype=learner_compute_dtype(cfg.model, learner), temperature=r.temperature,
                               top_p=r.top_p, top_k=r.top_k, quantized=r.quantized, lagged=r.async_)


def update(trainer: Trainer, batch: RolloutBatch, corr, update_forward: UpdateForward | None = None) -> dict:
    """The step's update: here alone, or with the other learners computing their share at the same time.
    ``update_forward``: its forward, already run (``algorithm.old_logprobs=update``; one learner only)."""
    if trainer.learners is None:
        return update_policy(trainer, batch, corr, update_forward)
    from ..cluster.pool import training_threads

    threads = torch.get_num_threads()
    beside = training_threads(trainer.cfg.cluster, trainer.cfg.rollout.async_, updating=True)
    peers = trainer.learners.start_update(batch, corr)
    try:
        torch.set_num_threads(min(threads, beside or threads))  # the other learners' cores stay theirs
        out = update_policy(trainer, batch, corr)
    except RuntimeError:  # a collective failed: name the learner that died, if one did
        trainer.learners.finish_update(peers)
        raise
    finally:
        torch.set_num_threads(threads)
    trainer.learners.finish_update(peers)
    return out


def update_policy(trainer, batch: RolloutBatch, corr, update_forward: UpdateForward | None = None) -> dict:
    """PPO-clip updates: mini-batches of whole groups (several optimizer steps when the mini-batch is
    smaller than the rollout batch), micro-batches with gradient accumulation, grad-norm clipping.
    ``trainer``: a :class:`Trainer` or a data-parallel peer; with ``trainer.ranks``, this process computes
    its micro-batches only and the gradients and metric sums are summed over the learners.
    ``update_forward``: the forward of the step's one micro-batch, run before the corrections
    (:mod:`.update_forward`): its log-probs and entropies stand in for the loop's forward."""
    cfg, a, t = trainer.cfg, trainer.cfg.algorithm, trainer.cfg.train
    N, T = batch.response_ids.shape
    mini = (t.mini_batch_prompts or t.prompts_per_step) * cfg.rollout.n
    adv = batch.advantages
    sums: dict[str, float] = {}
    count, grad_norms = 0, []
    forward = forward_response_shared if t.shared_prompt else forward_response
    quantizer = trainer.engine.model.quantizer if trainer.engine is not None else None  # QuRL's metric's grid
    codes = quantizer.codes if quantizer is not None and quantizer.quantizes else None
    ranks = trainer.ranks
    trainer.learner.train()
    for _epoch in range(t.ppo_epochs):
        for ms in range(0, N, mini):
            rows = slice(ms, min(ms + mini, N))
            norms = loss_normalizers(corr.mask[rows], a.loss_agg, max_len=cfg.rollout.max_new_tokens)
            trainer.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(range(rows.start, rows.stop, t.micro_batch_size)):
                if ranks is not None and not ranks.mine(i):
                    continue
                r = slice(mb, min(mb + t.micro_batch_size, rows.stop))
                if update_forward is not None:  # one optimizer step over one micro-batch: the rule's premise
                    if (r.start, r.stop, t.ppo_epochs) != (0, N, 1):
                        raise RuntimeError(f"update_forward covers rows 0-{N} once; this update's micro-batch is rows "
                                           f"{r.start}-{r.stop} of epoch {_epoch + 1}")
                    lp, ent, update_forward = update_forward.logprobs, update_forward.entropy, None
                else:
                    with learner_autocast(cfg.model, batch.response_ids.device):
                        lp, ent = forward(trainer.learner, batch, r, return_entropy=True,
                                          entropy_grad=bool(a.entropy_coef), temperature=cfg.rollout.temperature)
                scale = corr.clip_upper_scale[r] if corr.clip_upper_scale is not None else None
                loss, m = policy_loss(lp, corr.behaviour_logprobs[r], adv[r], corr.mask[r], corr.weights[r],
                                      clip_eps=a.clip_eps, clip_eps_high=a.clip_eps_high, clip_upper_scale=scale,
                                      importance_sampling_level=a.importance_sampling_level, **norms)
                mask = batch.response_mask[r]
                m[names.ENTROPY] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
                if trainer.ref is not None:
                    kl_tok = kl_penalty(lp, batch.ref_logprobs[r], a.kl_kind)
                    loss = loss + a.kl_coef * agg_loss(kl_tok, corr.mask[r], **norms)
                    m[names.KL_REF] = float((kl_tok.detach() * mask).sum() / mask.sum().clamp(min=1))
                if a.entropy_coef:  # entropy bonus (maximise entropy)
                    loss = loss - a.entropy_coef * agg_loss(ent, corr.mask[r], **norms)
                loss.backward()
                m[names.POLICY_LOSS] = float(loss.detach())
                w = float(mask.sum())
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v * (1.0 if k == names.POLICY_LOSS else w)
                count += w
            if ranks is not None:
                ranks.sum_grads(trainer.learner)
            gn = torch.nn.utils.clip_grad_norm_(trainer.learner.parameters(), t.grad_clip or float("inf"))
            grad_norms.append(float(gn))
            before = quantized_weight_snapshot(trainer.learner) if codes else None
            trainer.optimizer.step()
            if codes:  # QuRL: how much of this step the quantized sampler can see
                out_visible = update_visible_frac(before, sampler_state(trainer.learner), codes)
            trainer.scheduler.step()  # the schedule (warm-up) counts optimizer updates
    if ranks is not None:  # every learner's share (each computed at least one micro-batch: config check)
        keys = sorted(sums)
        *values, count = ranks.sum_floats([sums[k] for k in keys] + [count])
        sums = dict(zip(keys, values))
    # micro-batch losses add up to each optimizer step's loss; report the mean over optimizer steps
    out = {k: (v / max(1, len(grad_norms)) if k == names.POLICY_LOSS else v / max(count, 1.0))
           for k, v in sums.items()}
    out.setdefault(names.KL_REF, 0.0)
    out[names.GRAD_NORM] = sum(grad_norms) / max(1, len(grad_norms))
    out[names.LR] = trainer.optimizer.param_groups[0]["lr"]
    out[names.OPTIMIZER_STEPS] = len(grad_norms)
    if codes:
        out[names.QUANT_UPDATE_VISIBLE] = out_visible
    return out


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


def train(cfg: Config, resume: bool = False, run_dir: str | Path | None = None, log=print,
          allow_config_change: bool = False) -> Path:
    """Run (or resume) a training run; returns its folder.

    ``resume``: continue the run in ``run_dir`` (see :func:`find_resume_folder` without it) from its
    newest complete checkpoint; it must exist, and ``cfg`` may differ from the config the run ran with
    only in :data:`RESUME_FREE_KEYS` unless ``allow_config_change``. Every config the run runs with is
    kept (:func:`recorded_configs`). Without ``resume`` the folder must not hold a run already.
    Everything that can be checked cheaply is checked before the model loads.
    """
    option = "--run-dir" if run_dir else "log.out_dir"
    changes: list = []
    if resume:
        run = find_resume_folder(cfg, run_dir, log)
        changes = check_resume_config(run, cfg, allow_config_change)
        have = checkpoint_step(latest_checkpoint(run))
        if have is not None and have > cfg.train.steps:
            raise ResumeError(f"--resume: {run} is at step {have} already, more than train.steps="
                              f"{cfg.train.steps}: give train.steps={have} or more")
    else:
        run = resolve_run_dir(cfg, str(run_dir) if run_dir else None)
        if holds_run(run):
            raise ResumeError(f"{option} {run} already holds a run ({names.METRICS_FILE} or checkpoints/): "
                              "continue it with --resume, or choose another run folder")
    preflight(cfg, run, option)
    kernels = deterministic_state()
    trainer = build_trainer(cfg)
    try:
        return run_steps(trainer, run, resume, changes, log)
    finally:  # the rollout workers, the other learners and a Ray started for the run stop with it
        close_cluster(trainer)
        restore_deterministic_state(kernels)  # train.deterministic's kernels for the run only


def run_steps(trainer: Trainer, run: Path, resume: bool, changes: list, log=print) -> Path:
    """:func:`train` once the trainer is built: resume from the newest checkpoint, then step, evaluate,
    log and checkpoint to the end; returns the run folder."""
    cfg = trainer.cfg
    if resume:
        remove_debris(run)
    run.mkdir(parents=True, exist_ok=True)
    start = 0
    found = (load_latest(run, trainer.learner, trainer.optimizer, trainer.scheduler, log=log,
                         sampler_adapter=trainer.distill) if resume else None)
    if resume and found is None and (run / names.METRICS_FILE).exists():
        log(f"no complete checkpoint in {run}: starting from step 0")
    if found is not None:
        ckpt, state = found
        try:
            trainer.data.load_state_dict(state["data"])
        except (ValueError, KeyError, TypeError) as e:
            raise ResumeError(f"{ckpt / 'trainer.json'}: the saved data position does not fit data.train="
                              f"{cfg.data.train!r} ({e})") from None
        set_rng_state(state["rng"])
        if trainer.kv_controller is not None and "kv_controller" in state:
            trainer.kv_controller.load_state_dict(state["kv_controller"])
            trainer.engine.compressor.set_schedule(trainer.kv_controller.schedule())
        refold_after_load(trainer.learner)  # checkpoints hold the original form (QuRL's s taken out)
        push_weights(trainer)
        if trainer.learners is not None:
            trainer.learners.sync(trainer)
        start = int(state["step"])
        log(f"resumed from {ckpt} (step {start})")
    choice = trainer.engine.dtype_choice
    notes = [f"rollout.dtype: auto -> {choice.dtype} on this machine: {choice.reason} [{choice.key}]"] if choice else []
    if cfg.model.mixed_precision == "auto" and cfg.model.dtype == "float32":  # what `auto` measured here
        precision = choose_mixed_precision(trainer.device)
        notes.append(f"model.mixed_precision: auto -> {precision.mode} on this machine: {precision.reason} "
                     f"[{precision.key}]")
    for note in notes:
        log(note)
    saved = record_config(run, cfg, start, changes, resume, notes)
    if resume and saved is not None and saved.name != CONFIG_FILE:
        log(f"config changed on resume ({', '.join(k for k, *_ in changes)}): kept as {saved}")
    logger = MetricsLogger(run, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                           config_dict=config_to_dict(cfg), progress=cfg.log.progress, total_steps=cfg.train.steps)
    if resume:
        logger.truncate_after(start)  # steps logged after the checkpoint are redone: each step once
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            with naming_nondeterministic_ops():  # train.deterministic on CUDA: an op without such a kernel, named
                metrics = train_step(trainer, step)
            ev = cfg.eval.every  # 0 = only at the end
            if cfg.data.eval and ((ev and step % ev == 0) or step == cfg.train.steps):
                metrics.update(held_out_eval(trainer, step, run, log=logger.message))
            logger.log(step, metrics)
            if checkpoint_due(cfg, step):
                save_checkpoint(run, step, trainer.learner, trainer.tokenizer, trainer.optimizer, trainer.scheduler,
                                trainer_state(trainer), keep_last=cfg.checkpoint.keep_last,
                                sampler_adapter=trainer.distill)
    finally:
        logger.close()
    report = make_report(run)
    last = latest_checkpoint(run)
    log(run_summary(read_metrics(run), run, report, last))
    return run


def trainer_state(trainer: Trainer) -> dict:
    """What a checkpoint keeps besides the weights and optimizer: the data position, the controller's state."""
    state = {"data": trainer.data.state_dict()}
    if trainer.kv_controller is not None:
        state["kv_controller"] = trainer.kv_controller.state_dict()
    return state


def held_out_eval(trainer: Trainer, step: int, run: Path, log=print) -> dict:
    """Held-out pass@1 (avg@n, pass@n) of the current weights under dense and under the run's
    sparse inference (or ``eval.compressor``); written to ``eval-step<N>.json``, returned as the
    step's ``eval/<mode>/<stat>`` metrics."""
    cfg, e = trainer.cfg, trainer.cfg.eval
    examples = list(load_eval_set(cfg.data))  # the same prompt form as training
    params = SamplingParams(n=e.n, temperature=e.temperature, seed=cfg.train.seed,
                            max_new_tokens=e.max_new_tokens or cfg.rollout.max_new_tokens)
    sparse = compressor_from_fields(cfg.rollout, name=e.compressor)
    if trainer.kv_controller is not None and sparse.name == cfg.rollout.compressor:
        sparse.set_schedule(trainer.engine.compressor.schedule)  # the budgets training has reached
    results = {}
    for mode, compressor in (("dense", get_compressor("none")), ("sparse", sparse)):
        if mode == "sparse" and not compressor.compresses:
            continue
        sampler = local_sampler(trainer)
        if mode == "dense" and trainer.distill is not None:  # the dense policy is θ's: φ is the sparse sampler's
            sampler.update_weights(sampler_state(trainer.learner))
            trainer.engine_stale = True  # the sparse mode reloads θ + φ
        engine = RolloutEngine.from_engine(sampler, compressor)
        results[mode] = evaluate(engine, examples, params, verifier(trainer.reward_fn))
        log(f"eval step {step} {mode}: pass@1 {results[mode]['pass@1']:.3f} on {len(examples)} problems "
            f"of {cfg.data.eval}")
    write_eval_record(run, step, cfg.data.eval, results)
    return {names.eval_metric(mode, stat): v for mode, res in results.items() for stat, v in res.items()
            if stat.startswith(("pass@", "avg@"))}


def run_summary(rows: list[dict], run: Path, report: Path, checkpoint: Path | None) -> str:
    """What a person reads at the end of a run: reward first → last, KV saved (like with like),
    mismatch, fraction masked, held-out accuracy, and where everything is."""
    def series(key):
        return [r[key] for r in rows if isinstance(r.get(key), (int, float))]

    def mean(key):
        xs = series(key)
        return sum(xs) / len(xs) if xs else float("nan")

    reward = series(names.REWARD_MEAN)
    seconds = [x for x in map(names.step_seconds, rows) if x is not None]
    lines = [f"run finished: {len(rows)} steps in {sum(seconds) / 60:.1f} min"]
    if reward:
        k = min(3, len(reward))
        lines.append(f"  reward      {reward[0]:.2f} (step 1) -> {reward[-1]:.2f} (last); mean of first {k} "
                     f"{sum(reward[:k]) / k:.2f}, of last {k} {sum(reward[-k:]) / k:.2f}")
    kept = series(names.KV_KEPT_FRAC)
    if kept:
        lines.append(f"  KV tokens   the sampler held {mean(names.KV_KEPT_FRAC):.0%} of a dense cache's tokens at "
                     f"each response's end ({1 / mean(names.KV_KEPT_FRAC):.1f}x fewer; worst step {max(kept):.0%})")
        lines.append(f"  KV bytes    allocated {mean(names.KV_SAMPLER_ALLOC) / 2**20:.1f} MiB vs "
                     f"{mean(names.KV_DENSE_ALLOC) / 2**20:.1f} MiB for the dense engine on the same batches "
                     f"({mean(names.KV_ALLOC_REDUCTION):.1f}x less)")
    if series(names.MISMATCH_K3):
        lines.append(f"  mismatch    k3 KL(sampler, dense) mean {mean(names.MISMATCH_K3):.3f}, max "
                     f"{max(series(names.MISMATCH_K3)):.3f}; tokens masked by the correction "
                     f"{mean(names.MASKED_FRAC):.1%}")
    for mode in names.EVAL_MODES:
        ev = series(names.eval_metric(mode))
        if ev:
            lines.append(f"  held-out    pass@1 {ev[-1]:.3f} with {mode} inference")
    lines += [f"  run folder  {run}", f"  metrics     {run / names.METRICS_FILE} (TensorBoard: {run / 'tb'})",
              f"  checkpoint  {checkpoint / 'model' if checkpoint else None}", f"  report      {report}"]
    return "\n".join(lines)
