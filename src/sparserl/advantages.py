"""Outcome advantage estimators, registered by name (verl ``core_algos`` style).

Every estimator has the signature::

    fn(rewards: Tensor[B], group_ids: Tensor[B] | None = None, group_size: int | None = None,
       **options) -> Tensor[B]

A *group* is the set of responses sampled for one prompt. Groups are given either by
``group_ids`` (any integer labels, any order) or by ``group_size`` ``n`` (consecutive blocks of
``n``: ``group_ids = arange(B) // n``). Returns one advantage per response (float32 at least);
:func:`broadcast_to_tokens` spreads it over the response tokens.

Conventions shared by all estimators:

- a group whose rewards are all equal (zero spread) gets advantage exactly 0 (no learning
  signal), also in floating point;
- a singleton group follows verl: its mean is taken as 0 and its std as 1, so its advantage is
  its raw reward (``grpo`` with ``scale_rewards="group"``, ``dr_grpo``, ``rloo``). It is not
  treated as zero-spread by the estimators; :func:`frac_zero_std_groups` does count it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .registry import Registry

__all__ = [
    "ADV_ESTIMATORS",
    "register_adv_est",
    "get_adv_est",
    "available_adv_ests",
    "compute_advantages",
    "group_index",
    "grpo",
    "dr_grpo",
    "rloo",
    "frac_zero_std_groups",
    "broadcast_to_tokens",
]

AdvEstFn = Callable[..., Tensor]
ADV_ESTIMATORS: Registry[AdvEstFn] = Registry("advantage estimator")


def register_adv_est(name: str, *, needs_group: bool = True) -> Callable[[AdvEstFn], AdvEstFn]:
    """Decorator registering an advantage estimator under ``name`` in :data:`ADV_ESTIMATORS` (a
    different function under a taken name raises ``ValueError``). ``needs_group``: it compares the
    responses of a prompt with each other, so the config requires ``rollout.n >= 2``."""

    def deco(fn: AdvEstFn) -> AdvEstFn:
        ADV_ESTIMATORS.register(name)(fn)
        fn.needs_group = needs_group  # type: ignore[attr-defined]
        return fn

    return deco


def available_adv_ests() -> list[str]:
    return ADV_ESTIMATORS.names()


def get_adv_est(name: str) -> AdvEstFn:
    """The estimator registered as ``name``; ``UnknownNameError`` (a ``ValueError``) listing the
    names and the closest one otherwise."""
    return ADV_ESTIMATORS.get(name)


def compute_advantages(
    name: str, rewards: Tensor, group_ids: Tensor | None = None, group_size: int | None = None, **options
) -> Tensor:
    """``get_adv_est(name)(rewards, group_ids, group_size, **options)``."""
    return get_adv_est(name)(rewards, group_ids, group_size, **options)


# --------------------------------------------------------------------------- group helpers


def group_index(rewards: Tensor, group_ids: Tensor | None, group_size: int | None) -> tuple[Tensor, int]:
    """``(index [B] in 0..G-1, G)`` from ``group_ids`` or consecutive blocks of ``group_size``."""
    b = rewards.shape[0]
    if group_ids is not None:
        group_ids = torch.as_tensor(group_ids, device=rewards.device)
        if group_ids.shape != (b,):
            raise ValueError(f"group_ids must have shape ({b},), got {tuple(group_ids.shape)}")
        _, idx = torch.unique(group_ids, return_inverse=True)
        return idx, int(idx.max()) + 1 if b else 0
    if group_size is None:
        raise ValueError("give group_ids or group_size")
    if group_size <= 0 or b % group_size:
        raise ValueError(f"batch of {b} is not a whole number of groups of {group_size}")
    return torch.arange(b, device=rewards.device) // group_size, b // group_size


def _group_stats(r: Tensor, idx: Tensor, g: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per response: group mean, unbiased group std, group count, zero-spread flag."""
    cnt = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, idx, torch.ones_like(r))
    s = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, idx, r)
    mean = s / cnt
    dev2 = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, idx, (r - mean[idx]) ** 2)
    std = (dev2 / (cnt - 1).clamp(min=1)).sqrt()
    gmax = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, reduce="amax")
    gmin = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, reduce="amin")
    flat = gmax == gmin
    return mean[idx], std[idx], cnt[idx], flat[idx]


def _as_float(rewards: Tensor) -> Tensor:
    rewards = torch.as_tensor(rewards)
    return rewards.to(torch.promote_types(rewards.dtype, torch.float32)).detach()


def _centered(rewards: Tensor, group_ids, group_size) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r = _as_float(rewards)
    idx, g = group_index(r, group_ids, group_size)
    mean, std, cnt, flat = _group_stats(r, idx, g)
    single = cnt == 1
    # verl: a singleton group has mean 0 and std 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    flat = flat & ~single
    return r, mean, std, flat


# --------------------------------------------------------------------------- estimators


@register_adv_est("grpo")
def grpo(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    group_size: int | None = None,
    *,
    eps: float = 1e-6,
    scale_rewards: str = "group",
) -> Tensor:
    """GRPO (Shao et al. 2024): ``A_i = (R_i − mean_group R) / (std_group R + eps)``.

    ``std`` is the **unbiased** (Bessel-corrected, ``torch.std`` default) standard deviation, as
    in verl; ``eps = 1e-6`` (Sparse-RL). ``scale_rewards`` (TRL): ``"group"`` divides by the
    group std (default), ``"batch"`` by the std of all rewards in the batch (unbiased),
    ``"none"`` not at all (= Dr.GRPO). Zero-spread groups get exactly 0.
    """
    r, mean, std, flat = _centered(rewards, group_ids, group_size)
    centered = r - mean
    if scale_rewards == "group":
        adv = centered / (std + eps)
    elif scale_rewards == "batch":
        bstd = r.std() if r.numel() > 1 else r.new_ones(())
        adv = centered / (bstd + eps)
    elif scale_rewards == "none":
        adv = centered
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    return torch.where(flat, torch.zeros_like(adv), adv)


@register_adv_est("dr_grpo")
def dr_grpo(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    group_size: int | None = None,
) -> Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): ``A_i = R_i − mean_group R``
    (no std division; pair with the ``seq_mean_token_sum_norm`` loss aggregation)."""
    return grpo(rewards, group_ids, group_size, scale_rewards="none")


@register_adv_est("rloo")
def rloo(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    group_size: int | None = None,
) -> Tensor:
    """RLOO (Ahmadian et al. 2024): ``A_i = R_i − mean_{j≠i} R_j = n/(n−1) · (R_i − mean_group R)``
    for a group of n ≥ 2; a singleton group keeps its raw reward (verl)."""
    r, mean, _, flat = _centered(rewards, group_ids, group_size)
    idx, g = group_index(r, group_ids, group_size)
    cnt = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, idx, torch.ones_like(r))[idx]
    factor = torch.where(cnt > 1, cnt / (cnt - 1).clamp(min=1), torch.ones_like(cnt))
    adv = (r - mean) * factor
    return torch.where(flat, torch.zeros_like(adv), adv)


# --------------------------------------------------------------------------- helpers


def frac_zero_std_groups(rewards: Tensor, group_ids: Tensor | None = None, group_size: int | None = None) -> float:
    """Fraction of groups whose rewards are all equal (singletons included): the share of
    prompts that give no GRPO learning signal. 0.0 for an empty batch."""
    r = _as_float(rewards)
    if r.numel() == 0:
        return 0.0
    idx, g = group_index(r, group_ids, group_size)
    gmax = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, reduce="amax")
    gmin = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, reduce="amin")
    return float((gmax == gmin).float().mean())


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` per-response advantages → ``[B, T]`` (0 on padding)."""
    adv = advantages[:, None].expand(mask.shape)
    return torch.where(mask != 0, adv, torch.zeros_like(adv))
