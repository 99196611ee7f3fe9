"""Sparrow's published setup (Zhou et al., 2026, arXiv 2606.08446; code: github.com/Infini-AI-Lab/Sparrow).

The sparse rollouts are block top-k attention (the Vortex ``block_sparse_attention`` module in SGLang):
pages of 16 tokens, layers 0 and 1 dense, the first page and the last 2 always read. The pages read
follow the cached length in 2,000-token steps: ``vortex_torch/indexer/utils_sglang.py`` gives, per model
and threshold, 20 page counts (lengths 0-2K, 2K-4K, ..., ≥ 38K), to which the planner adds the 3
reserved pages (``block_reserved_bos + block_reserved_eos``). At the 0.86 threshold Qwen3-1.7B reads 32
pages (512 tokens) below 2K up to 256 pages (4,096 tokens) from 18K; Qwen3-4B 32 up to 512 pages.

Their training runs: verl GRPO with TIS, 4 x H200, responses up to 37-40K tokens, rollout.n = 8 (the
example scripts), the old log-probs recomputed by the actor, a reference model scored (use_kl_loss with
coefficient 0), gradient checkpointing on, α from the sampler's top-20 log-probs.

Published (README Table 2, 4 x H200; the 0.86 threshold's schedule):

| model | dense tokens/s | sparse tokens/s | rollout speedup | one RL step speedup |
|---|---|---|---|---|
| Qwen3-1.7B | 2,561 | 5,662 | 2.21x | 1.97x |
| Qwen3-4B | 1,369 | 3,308 | 2.41x | 2.11x |
"""

from __future__ import annotations

__all__ = ["BIN", "PUBLISHED", "RESERVED_PAGES", "SCHEDULES", "pages_schedule"]

#: tokens per length step of the schedules
BIN = 2000
#: pages every step reads besides the top-k (the first page and the last two)
RESERVED_PAGES = 3

#: the top-k pages per 2,000-token length step at the 0.86 threshold (``_SCHEDULE_POLICY_VALUES``)
SCHEDULES: dict[str, list[int]] = {
    "qwen3-1.7b": [29, 61, 93, 93, 125, 157, 189, 221, 221, 253, 253, 253, 253, 253, 253, 253, 253, 253, 253, 253],
    "qwen3-4b": [29, 45, 61, 77, 93, 125, 157, 221, 253, 253, 317, 317, 317, 317, 381, 381, 381, 381, 509, 509],
}

#: README Table 2: (dense tokens/s, sparse tokens/s, rollout speedup, one RL step speedup), 4 x H200
PUBLISHED: dict[str, tuple[float, float, float, float]] = {
    "qwen3-1.7b": (2561.0, 5662.0, 2.21, 1.97),
    "qwen3-4b": (1369.0, 3308.0, 2.41, 2.11),
}


def pages_schedule(model: str) -> list[list[int]]:
    """Sparrow's schedule for ``model`` as :func:`~sparserl.cost.rollout_cost`'s ``blocktopk_pages``
    pairs ``[[length, pages], ...]``, the reserved pages included."""
    return [[i * BIN, k + RESERVED_PAGES] for i, k in enumerate(SCHEDULES[model])]
