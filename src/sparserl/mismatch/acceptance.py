"""Sparrow's per-token acceptance α between the dense policy ``p`` and the sampler ``q`` (Zhou et al.,
2026, arXiv 2606.08446, docs/algorithms.md §3), and its tail by length bin.

    α_t = Σ_x min(p_t(x), q_t(x)) = 1 − TV(p_t, q_t)        (1: the same distribution)

over the whole vocabulary, both at the sampling temperature. The mean hides a collapse; the 5th
percentile of α in each bin of sequence lengths predicts it (training stayed stable above ~0.86).

``topk`` is Sparrow's own approximation from the sampler's top-k log-probs (k = 20): the sum over the
sampler's k most likely tokens only, ``Σ_{x ∈ top_k(q)} min(p(x), q(x))``, a lower bound of α that
misses the overlap in the tail.
"""

from __future__ import annotations

import torch


def acceptance(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """α over the last dimension (the vocabulary) of two log-distributions: [..., V] -> [...]."""
    return torch.minimum(logp.float(), logq.float()).exp().sum(-1)


def acceptance_topk(logp: torch.Tensor, top_logq: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
    """α summed over the sampler's top-k tokens only: ``logp`` [..., V], ``top_logq`` / ``top_idx`` [..., k]."""
    return torch.minimum(logp.float().gather(-1, top_idx), top_logq.float()).exp().sum(-1)


def tail_by_bin(
    alpha: torch.Tensor, seq_len: torch.Tensor, mask: torch.Tensor, bin_width: int, q: float = 0.05
) -> dict[int, tuple[float, int]]:
    """{bin start: (q-quantile of α, tokens)} over the tokens where ``mask`` holds, binned by the
    sequence length at which each token was drawn (``seq_len``, same shape as ``alpha``)."""
    valid = mask.bool()
    a, lengths = alpha[valid].double(), seq_len[valid]
    out = {}
    for start in sorted(set((lengths // bin_width * bin_width).tolist())):
        sel = a[(lengths >= start) & (lengths < start + bin_width)]
        out[int(start)] = (float(torch.quantile(sel, q)), int(sel.numel()))
    return out


def summary(alpha: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(mean, 5th percentile) of α over the tokens where ``mask`` holds (nan, nan when there are none)."""
    a = alpha[mask.bool()].double()
    if a.numel() == 0:
        return float("nan"), float("nan")
    return float(a.mean()), float(torch.quantile(a, 0.05))


def token_seq_len(prompt_ids: list[list[int]], response_len: int) -> torch.Tensor:
    """[N, T] long: the sequence length (prompt + tokens generated before it) at which response token
    ``t`` of row ``i`` was drawn, ``len(prompt_ids[i]) + t``: the axis of α's length bins and of a
    :class:`~sparserl.rollout.kv.schedule.KVSchedule`'s lengths."""
    return torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)[:, None] + torch.arange(response_len)[None]


def dense_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tau: float) -> torch.Tensor:
    """log p [..., V] (float32) at temperature ``tau`` from hidden states [..., H] and the LM head [V, H]."""
    return torch.log_softmax((hidden @ weight.t()).float() / tau, dim=-1)
