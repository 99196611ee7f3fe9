"""The trainer: everything a run chooses once, built from its config before the first step: the learner
and its optimizer, the sampler (the engine here, or the rollout workers), the data, the reward, the
reference, the KV controller, the other learners, and where the old policy's log-probs come from.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from functools import partial

import torch

from ..config import Config
from ..data import PromptSampler
from ..memory import MemoryPrediction
from ..memory.rollout_rows import device_rows_that_fit
from ..mismatch.measure import check_exact_alpha_under_async
from ..preflight import preflight
from ..reward.weighted import load_rewards
from ..rollout.build import engine_from_fields, sampler_section
from ..rollout.engine import RolloutEngine
from .determinism import use_deterministic_kernels
from .distill_sparse import DistillSparse
from .gradient_checkpointing import gradient_checkpointing_wanted, use_gradient_checkpointing
from .kv_controller import KVController
from .learner import build_learner
from .lora import sampler_state
from .nonfinite import NonfiniteSteps
from .old_logprobs import OldPolicy
from .run_folder import naming_data_key
from .train_set import load_train_set


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
    old_policy: OldPolicy  # where each step's old-policy log-probs come from
    ref: torch.nn.Module | None = None
    kv_controller: KVController | None = None
    pool: object | None = None  # sparserl.cluster.pool.RolloutPool: the rollout workers, when there are
    learners: object | None = None  # .data_parallel.LearnerGroup: the other learners, when cluster.learners > 1
    pending: deque = field(default_factory=deque)  # (step, examples, PendingRollout): rollouts sent ahead (async)
    threads_before: int | None = None  # torch's threads before the cluster's actors took cores beside this process
    engine_stale: bool = False  # ``engine`` does not hold the sampler's current weights (rollout workers, α without φ)
    distill: object | None = None  # .distill_sparse.DistillSparse: φ on the sampler (algorithm.distill_sparse)
    nonfinite: NonfiniteSteps = field(default_factory=NonfiniteSteps)  # skipped non-finite steps in a row
    memory: MemoryPrediction | None = None  # preflight's prediction of the step's peak memory

    @property
    def ranks(self):
        """This process's :class:`.data_parallel.Ranks` among the learners (None: it is the only one)."""
        return self.learners.ranks if self.learners is not None else None

    @property
    def device(self) -> torch.device:
        """Where the learner lives (``model.device``): the batch moves there to be scored and trained."""
        return next(self.learner.parameters()).device


def build_trainer(cfg: Config) -> Trainer:
    """The learner, sampler, optimizer, data and reward of a config. Every check that loads no weight
    comes first (:func:`sparserl.preflight.preflight`: the rules, the model's path and device, the reward
    modules, the LoRA targets, the data), so a bad input fails before any weights load."""
    memory = preflight(cfg)  # the step's predicted peak memory: a run that would not fit stops here
    torch.manual_seed(cfg.train.seed)
    with naming_data_key("data.train", cfg.data.train):
        data = load_train_set(cfg.data)
    if data.skipped:
        print(f"data: {len(data)} examples from {data.source}, {data.skipped} bad rows skipped")
    reward_fn = load_rewards(cfg.reward.fn, cfg.reward.weights, timeout_s=cfg.reward.timeout_s)
    if cfg.cluster.rollout_workers is not None or cfg.cluster.learners > 1:  # Ray there, its address answering
        from ..cluster.pool import preflight as cluster_preflight

        cluster_preflight(cfg.cluster)
    r, t = sampler_section(cfg), cfg.train
    if t.deterministic:  # before the model reaches a GPU: cuBLAS reads its workspace setting as it starts
        use_deterministic_kernels(cfg.model.device)
    lm, learner, opt, sched = build_learner(cfg)
    use_gradient_checkpointing(learner, gradient_checkpointing_wanted(cfg, learner, memory.checkpointing))
    engine = engine_from_fields(lm, r, sampler_state(learner))
    if engine.device.type == "cuda":  # as many rows at once as the free device memory holds at this cache's size
        engine.max_batch = partial(device_rows_that_fit, engine)
    # the model's facts (its dropout) and the data's prompt bound: a refused source fails here
    old_policy = OldPolicy.choose(cfg, engine, learner, memory.prompt_tokens)
    check_exact_alpha_under_async(cfg, learner)  # the vocabulary's size: before any worker starts
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(learner).eval().requires_grad_(False)
    controller = None
    if r.kv_controller is not None:  # it starts from the configured schedule or budget
        controller = KVController.from_config(
            r.kv_controller, cfg.mismatch.alpha_bin, engine.compressor.schedule or r.kv_budget
        )
        engine.compressor.set_schedule(controller.schedule())
    pool = None
    if cfg.cluster.rollout_workers is not None:  # Ray imported only here
        from ..cluster.pool import RolloutPool

        pool = RolloutPool(cfg, sampler_state(learner))
    trainer = Trainer(
        cfg,
        learner,
        lm.tokenizer,
        engine,
        opt,
        sched,
        PromptSampler(list(data), t.prompts_per_step, seed=t.seed),
        reward_fn,
        old_policy,
        ref,
        controller,
        pool,
        nonfinite=NonfiniteSteps.from_config(cfg),
        memory=memory,
    )
    if cfg.algorithm.distill_sparse is not None:
        trainer.distill = DistillSparse(cfg, learner)
    if cfg.cluster.learners > 1:
        from .data_parallel import LearnerGroup

        trainer.learners = LearnerGroup(cfg, trainer)
    if pool is not None:
        from ..cluster.pool import training_threads

        threads = training_threads(cfg.cluster, r.async_, updating=False)
        if threads is not None and threads < torch.get_num_threads():
            print(
                f"cluster: {threads} torch thread(s) for the training process, the other cores for the rollout "
                "workers sampling beside it"
            )
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
