"""What a rollout returns (:class:`RolloutOutput`) and its KV statistics (:class:`KVStats`): the eager engine
(:mod:`.engine`) and the static decode step (:mod:`.static_step`) both build it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

__all__ = ["KVStats", "RolloutOutput"]


@dataclass
class KVStats:
    bytes_peak: int = 0  # what the K/V buffers held at most
    bytes_theory: int = 0  # what the valid cached tokens needed at most
    bytes_dense: int = 0  # what a dense cache would have needed for the same tokens
    compressions: int = 0
    bytes_dense_alloc: int = 0  # what the dense engine's K/V buffers hold for the same batch


@dataclass
class RolloutOutput:
    """Plain lists per response (``N = len(prompts) * n``), in prompt-major order."""

    prompt_index: list[int]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    sampler_logprobs: list[list[float]]
    finish_reason: list[str]
    kv_tokens_kept: list[int]
    kv: KVStats
    tokens_generated: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    top_logprobs: list[torch.Tensor] | None = None  # per response [T, k] values
    top_indices: list[torch.Tensor] | None = None  # per response [T, k] token ids
    #: per response [T, V]: the log-probs each token was drawn from (``SamplingParams.keep_distributions``)
    distributions: list[torch.Tensor] | None = None
    #: per response [T, H]: the LM head's input at each position a token was drawn from, in the sampler's
    #: dtype (``SamplingParams.keep_hidden``); :meth:`RolloutEngine.hidden_logits` turns it back into the logits
    hidden: list[torch.Tensor] | None = None
    texts: list[str] = field(default_factory=list)
    #: the sampler's own weights on a dense cache, read where it sampled
    #: (:class:`~sparserl.mismatch.teacher_forced.DenseCacheReading`; rollout workers under rollout.async)
    dense_cache: object | None = None
    weights_version: int | None = None  # the weight push the sampler held (rollout workers), None: here
    #: per response, the push whose weights drew each token (numbered weights only: rollout workers); a response
    #: continued across pushes (:class:`~sparserl.rollout.segmented.SegmentedRollout`) has several
    token_versions: list[list[int]] | None = None
    #: the decode steps the batch of rollouts in flight ran to end this one when it was taken (``RolloutStream``)
    stream_steps: int | None = None

    #: the per-response fields (lists with one entry per response, or None)
    PER_RESPONSE = (
        "prompt_index",
        "prompt_ids",
        "response_ids",
        "sampler_logprobs",
        "finish_reason",
        "kv_tokens_kept",
        "top_logprobs",
        "top_indices",
        "distributions",
        "hidden",
        "texts",
        "token_versions",
    )

    def select(self, rows: list[int]) -> RolloutOutput:
        """The responses ``rows`` (indices, in that order): every per-response field picked, the prompt indices
        as they were; the KV, token and time figures stay those of everything sampled. A dense-cache reading
        (``dense_cache``) does not follow: it is dropped."""
        picked = {
            name: None if getattr(self, name) is None else [getattr(self, name)[i] for i in rows]
            for name in self.PER_RESPONSE
        }
        return dataclasses.replace(self, **picked, dense_cache=None)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_generated / self.seconds if self.seconds > 0 else 0.0

    def padded(self):
        """(response_ids [N, T] long, mask [N, T] bool, sampler_logprobs [N, T] float32)."""
        N = len(self.response_ids)
        T = max((len(r) for r in self.response_ids), default=0)
        ids = torch.zeros(N, T, dtype=torch.long)
        mask = torch.zeros(N, T, dtype=torch.bool)
        lp = torch.zeros(N, T, dtype=torch.float32)
        for i, (r, l_) in enumerate(zip(self.response_ids, self.sampler_logprobs)):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = True
            lp[i, : len(r)] = torch.tensor(l_, dtype=torch.float32)
        return ids, mask, lp
