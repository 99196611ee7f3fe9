"""The sampler side of a step: where the rollout runs (the engine here, or the rollout workers, up to
``rollout.max_staleness`` steps ahead under ``rollout.async``) and how the learner's new weights reach it.

The choice of sampler is made once, when the trainer is built (``trainer.pool`` is None or the workers);
these functions only follow it.
"""

from __future__ import annotations

import torch

from .. import runlog as names
from ..config import Config
from ..mismatch.measure import keeps_distributions, keeps_hidden
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..rollout.sampling import SamplingParams
from .due import checkpoint_due
from .lora import sampler_state


def sampling_params(
    cfg: Config, step: int, keep_distributions: bool = False, keep_hidden: bool = False
) -> SamplingParams:
    """Step ``step``'s sampling: ``rollout.*``, a seed of its own per step, the top-k log-probs the topk α
    reads, and whether the sampler keeps its whole distributions or its LM head's inputs (the exact α
    without a replay: ``mismatch.alpha_q`` kept or hidden)."""
    r = cfg.rollout
    return SamplingParams(
        n=r.oversample or r.n,  # rollout.oversample: more per prompt, rollout.n of them kept
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=r.max_new_tokens,
        stop=list(r.stop),
        seed=cfg.train.seed * 1_000_003 + step,
        logprobs_topk=cfg.mismatch.alpha_topk if cfg.mismatch.alpha == "topk" else 0,
        keep_distributions=keep_distributions,
        keep_hidden=keep_hidden,
    )


def rollout_params(trainer, step: int, examples: list) -> SamplingParams:
    """The sampling of step ``step``'s rollout of ``examples``: :func:`sampling_params`, keeping what the exact α
    reads (the whole ``q`` where it fits, else or by choice the head's inputs: no replay)."""
    r = trainer.cfg.rollout
    keep = keeps_distributions(trainer, len(examples) * (r.oversample or r.n))
    return sampling_params(trainer.cfg, step, keep, keeps_hidden(trainer))


def rollout(trainer, step: int) -> tuple[list, RolloutOutput]:
    """Step ``step``'s examples and their rollout: on the engine here, or on the rollout workers with the
    budgets the controller has reached (``cluster.rollout_workers``; the same samples either way).

    Asynchronous (``rollout.async``): the rollout sent during an earlier step is collected (sampled with the
    weights of that step, at most ``rollout.max_staleness`` pushes old), and the steps after it are sent up to
    ``rollout.max_staleness`` ahead (:func:`send_ahead`), to run during this step's scoring and update."""
    cfg = trainer.cfg
    if trainer.pool is None:
        examples = trainer.data.next_batch()
        return examples, trainer.engine.generate([e.prompt for e in examples], rollout_params(trainer, step, examples))
    if not trainer.pending:  # nothing sent ahead for this step: the first step, or the one after a checkpoint
        trainer.pending.append((step, *send_rollout(trainer, step)))
    sent_for, examples, pending = trainer.pending.popleft()
    assert sent_for == step, f"the rollout collected at step {step} was sent for step {sent_for}"
    ro = trainer.pool.collect(pending)
    if cfg.rollout.async_:
        send_ahead(trainer, step)
    return examples, ro


def send_ahead(trainer, step: int) -> None:
    """Under ``rollout.async``, during step ``step``: send the rollouts of the steps after the last one sent, up to
    ``step + rollout.max_staleness``, in order (their examples drawn in step order, so the same seed sends the same
    prompts with the same weights). None past the run's last step, nor past a checkpoint's step from ``step`` on:
    the step after a checkpoint samples with the weights the checkpoint holds, so that a run resumed there samples
    what the straight run did. Under ``rollout.join_rollouts``, a step that sends none has the workers run the
    rollouts in flight to their ends now (:meth:`~sparserl.cluster.pool.RolloutPool.finish_joined`)."""
    cfg = trainer.cfg
    last = trainer.pending[-1][0] if trainer.pending else step
    sent = False
    for ahead in range(last + 1, step + cfg.rollout.max_staleness + 1):
        if ahead > cfg.train.steps or any(checkpoint_due(cfg, s) for s in range(step, ahead)):
            break
        segments = ahead - step if cfg.rollout.partial else 1  # one per push before it is taken, but the last
        trainer.pending.append((ahead, *send_rollout(trainer, ahead, segments)))
        sent = True
    if not sent and cfg.rollout.join_rollouts:  # no start runs the joined rollouts in flight on: run them to the end
        trainer.pool.finish_joined()


def send_rollout(trainer, step: int, segments: int = 1) -> tuple[list, object]:
    """Draw step ``step``'s examples and send their rollout to the workers; under ``rollout.async`` they
    also read it on a dense cache with the weights that sampled (:func:`sparserl.mismatch.split.lag_split`,
    α's lag part; a partial rollout's with its last segment's). ``segments`` > 1: a partial rollout
    (``rollout.partial``), continued with the weights of each of the next ``segments`` - 1 pushes."""
    cfg = trainer.cfg
    examples = trainer.data.next_batch()
    read = (cfg.mismatch.alpha_topk if cfg.mismatch.alpha == "topk" else 0) if cfg.rollout.async_ else None
    params = rollout_params(trainer, step, examples)  # the workers send back q or their head's inputs
    prompts, schedule = [e.prompt for e in examples], trainer.engine.compressor.schedule
    return examples, trainer.pool.submit(prompts, params, schedule, read, segments)


def sampler_weights(trainer) -> dict[str, torch.Tensor]:
    """What the sampler runs: the learner's weights (with LoRA: merged), with DistillSparse's φ merged on top."""
    if trainer.distill is not None:
        return trainer.distill.sampler_weights(trainer.learner)
    return sampler_state(trainer.learner)


def push_weights(trainer) -> None:
    """The sampler's weights (:func:`sampler_weights`) into the sampler: the engine here, or every rollout
    worker (under ``rollout.async`` without waiting: they load them after sampling the next step), the engine
    here then loading them only when it is used (:func:`local_sampler`)."""
    weights = sampler_weights(trainer)
    if trainer.pool is None:
        trainer.engine.update_weights(weights)
        trainer.engine_stale = False
    else:
        trainer.pool.update_weights(weights, wait=not trainer.cfg.rollout.async_)
        trainer.pool.continue_partial()  # partial rollouts in flight: their next segment with these weights
        trainer.engine_stale = True


def local_sampler(trainer) -> RolloutEngine:
    """The sampler in this process with the learner's current weights, for what runs here whatever samples
    the rollouts: the exact α's replay, ``rollout.mismatch_split``, held-out evaluation."""
    if trainer.engine_stale:
        trainer.engine.update_weights(sampler_weights(trainer))
        trainer.engine_stale = False
    return trainer.engine


def sampler_of(trainer, ro: RolloutOutput) -> RolloutEngine:
    """The sampler in this process with the weights that sampled ``ro`` (:func:`sampler_at` its push)."""
    return sampler_at(trainer, ro.weights_version)


def sampler_at(trainer, version: int | None) -> RolloutEngine:
    """The sampler in this process with the weights of push ``version``: :func:`local_sampler` where that is the
    latest push (or None: sampled here), else that push's weights, loaded from the pool (one of the latest
    ``rollout.max_staleness`` + 1: under ``rollout.async`` the exact α's ``q`` from the workers' kept head inputs
    needs the head that made them, each token's own under ``rollout.partial``); the engine here is then stale
    again."""
    if trainer.pool is None or version in (None, trainer.pool.version):
        return local_sampler(trainer)
    if trainer.engine.weights_version != version or not trainer.engine_stale:
        trainer.engine.update_weights(trainer.pool.weights(version), version)
    trainer.engine_stale = True
    return trainer.engine


def pool_metrics(trainer, ro: RolloutOutput) -> dict:
    """Rollout workers replaced so far, the share of time they did not sample, and the policy lag of the step's
    rollout (weight pushes since the one it was sent with: up to ``rollout.max_staleness`` under ``rollout.async``,
    else 0), with its mean over the tokens and the share of responses drawn by more than one push (partial)."""
    if trainer.pool is None:
        return {}
    out = {
        names.CLUSTER_WORKER_RESTARTS: trainer.pool.restarts,
        names.CLUSTER_WORKER_IDLE: trainer.pool.idle_fraction,
        names.MISMATCH_POLICY_LAG: trainer.pool.version - ro.weights_version,
    }
    if ro.token_versions is not None:  # each token's own: a partial rollout's later segments are fresher
        lags = [trainer.pool.version - v for versions in ro.token_versions for v in versions]
        out[names.MISMATCH_POLICY_LAG_TOKENS] = sum(lags) / max(len(lags), 1)
        out[names.ROLLOUT_PARTIAL_FRAC] = sum(len(set(v)) > 1 for v in ro.token_versions) / max(
            len(ro.token_versions), 1
        )
    return out


def token_lag(trainer, ro: RolloutOutput) -> list[torch.Tensor] | None:
    """Per response, the weight pushes between the one that drew each token and the latest (the learner's), or
    None where the tokens carry no push (the sampler here)."""
    if trainer.pool is None or ro.token_versions is None:
        return None
    return [trainer.pool.version - torch.tensor(v, dtype=torch.float32) for v in ro.token_versions]
