"""The rules that tie keys of a configuration together, one small function per concern.

Each rule takes the whole :class:`~sparserl.config.schema.Config` and returns the problems it finds,
one line each naming the keys involved and how to fix them; :func:`validate` runs them all and raises
one :class:`~sparserl.config.messages.ConfigError` listing every problem. A rule named ``unused_*``
refuses an option that would do nothing as configured (set to a value other than its default while
the key that enables it is off), naming that key. The rules are cheap (no model, no data): ``train``
runs them before anything heavy loads, and ``sparserl config`` runs the same.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ..messages import ConfigError
from ..schema import Config
from .advantage import group_for_advantage
from .cluster import cluster_shape, rollout_workers
from .controller import kv_controller
from .correction import correction_runs
from .distill_sparse import distill_sparse_sampler
from .dynamic_sampling import filter_groups, max_gen_batches_unused
from .lora import lora_unused
from .micro_batch import micro_batch_budget
from .more_rollout import dense_fallback_needs, oversample_needs
from .old_policy import compressor_builds_and_old_policy
from .optimizer import adamw_first_step, lr_schedule_unused, mini_batches
from .partial_rollout import partial_rollouts
from .precision import mixed_precision_weights
from .quantization import mismatch_split_needs_quant, quant_options, quant_scale_with_lora
from .reward import overlong_buffer_fits, reward_spec
from .rollout_async import async_rollouts
from .sampler import blocktopk_pages, kv_budget_above_window, kv_schedule, kv_schedule_unused
from .static_step import static_step_and_replay, unused_static_check_every
from .truncated_sampling import truncated_ratio_warning
from .unused import alpha_topk_unused, kl_kind_unused, kl_unbiased_unused

__all__ = ["RULES", "validate"]

Rule = Callable[[Config], list[str]]

#: every rule, in the order its problems are listed
RULES: tuple[Rule, ...] = (
    adamw_first_step,
    lr_schedule_unused,
    mini_batches,
    micro_batch_budget,
    mixed_precision_weights,
    kv_budget_above_window,
    kv_schedule,
    kv_schedule_unused,
    blocktopk_pages,
    static_step_and_replay,
    unused_static_check_every,
    kv_controller,
    overlong_buffer_fits,
    cluster_shape,
    rollout_workers,
    quant_scale_with_lora,
    lora_unused,
    distill_sparse_sampler,
    async_rollouts,
    partial_rollouts,
    dense_fallback_needs,
    oversample_needs,
    group_for_advantage,
    correction_runs,
    quant_options,
    filter_groups,
    max_gen_batches_unused,
    reward_spec,
    mismatch_split_needs_quant,
    kl_kind_unused,
    kl_unbiased_unused,
    alpha_topk_unused,
)
#: run only when every rule above passed: it builds the compressor, which a bad option above would fail
LAST: tuple[Rule, ...] = (compressor_builds_and_old_policy,)


def validate(cfg: Config) -> Config:
    """Check the rules that tie fields together, before anything heavy loads (each field's own type,
    range and name were checked as it was set). One ConfigError lists every problem; returns ``cfg``.
    """
    errors = [line for rule in RULES for line in rule(cfg)]
    if not errors:
        errors = [line for rule in LAST for line in rule(cfg)]
    if errors:
        raise ConfigError(f"invalid config '{cfg.name}':\n  - " + "\n  - ".join(errors))
    r = cfg.rollout
    if r.temperature == 0 and r.n > 1:
        warnings.warn(
            "rollout.temperature=0 (greedy): the n samples of a prompt are identical and group advantages are all zero",
            stacklevel=2,
        )
    truncated = truncated_ratio_warning(cfg)
    if truncated is not None:
        warnings.warn(truncated, stacklevel=2)
    return cfg
