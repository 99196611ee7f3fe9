"""The training entry points, where commands, benchmarks and experiments import them from: the run
(:mod:`.loop`), the trainer and its builder (:mod:`.build`), one step (:mod:`.step`), the update
(:mod:`.update`) and the sampler's side (:mod:`.sampler_sync`). Nothing inside ``sparserl.train``
imports this module."""

from .build import Trainer, build_trainer, close_cluster
from .learner import build_learner
from .loop import run_steps, train
from .run_folder import ResumeError
from .sampler_sync import push_weights, rollout, sampler_weights, sampling_params
from .step import corrections_and_advantages, rollout_batch, train_step
from .update import update_policy

__all__ = [
    "ResumeError",
    "Trainer",
    "build_learner",
    "build_trainer",
    "close_cluster",
    "corrections_and_advantages",
    "push_weights",
    "rollout",
    "rollout_batch",
    "run_steps",
    "sampler_weights",
    "sampling_params",
    "train",
    "train_step",
    "update_policy",
]
