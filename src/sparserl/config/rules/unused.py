"""Options of a feature that is off, refused with the key that turns it on."""
from __future__ import annotations

from ..schema import Config
from .given import given


def kl_kind_unused(cfg: Config) -> list[str]:
    """algorithm.kl_kind picks the estimator of the KL penalty, which algorithm.kl_coef=0 turns off."""
    a = cfg.algorithm
    if a.kl_coef == 0 and given(a, "kl_kind"):
        return [f"algorithm.kl_kind={a.kl_kind} does nothing with algorithm.kl_coef=0 (no KL penalty, no reference "
                "model); set algorithm.kl_coef, or leave kl_kind out"]
    return []


def alpha_topk_unused(cfg: Config) -> list[str]:
    """mismatch.alpha_topk is the k of mismatch.alpha=topk."""
    m = cfg.mismatch
    if m.alpha != "topk" and given(m, "alpha_topk"):
        return [f"mismatch.alpha_topk={m.alpha_topk} does nothing with mismatch.alpha={m.alpha}; set "
                "mismatch.alpha=topk, or leave alpha_topk out"]
    return []


def cluster_resources_unused(cfg: Config) -> list[str]:
    """Ray resources of rollout workers and learner actors need those workers and actors."""
    c = cfg.cluster
    errors: list[str] = []
    keys = [k for k in ("worker_cpus", "worker_gpus") if given(c, k)]
    if c.rollout_workers is None and keys:
        errors.append(f"{', '.join(f'cluster.{k}={getattr(c, k)}' for k in keys)}: without "
                      "cluster.rollout_workers there is no rollout worker; set cluster.rollout_workers, or leave "
                      f"{'it' if len(keys) == 1 else 'them'} out")
    keys = [k for k in ("learner_cpus", "learner_gpus") if given(c, k)]
    if c.learners == 1 and keys:
        errors.append(f"{', '.join(f'cluster.{k}={getattr(c, k)}' for k in keys)}: with cluster.learners=1 there "
                      "is no learner actor (the training process learns); set cluster.learners > 1, or leave "
                      f"{'it' if len(keys) == 1 else 'them'} out")
    return errors
