"""The record that moves between stations (score, correct, train): one rollout batch as tensors; and
:func:`distinct_prompts`, which the sampler's prefill and the learner's shared-prompt forward both use.

It lives outside every station so that each imports it without importing another station."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """N responses laid out as ``[left pad | prompt | response | right pad]``.

    input_ids/attention_mask/position_ids: [N, P + T]; response_ids/response_mask/sampler_logprobs:
    [N, T] (the response starts at column P for every row); group_ids: [N] (the prompt each response
    answers: a GRPO group); rewards/advantages/truncated: [N]; old/ref log-probs filled by the score station.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor | None = None
    truncated: torch.Tensor | None = None  # [N] bool: the response was cut at max_new_tokens
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    #: [N, T] float32: weight pushes between the one that drew each token and the learner's (rollout workers)
    token_lag: torch.Tensor | None = None
    #: [N, T] float32: the exact acceptance α of each token's position (mismatch.alpha=exact), set by the α station
    alpha: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with every tensor on ``device`` (the learner's)."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: list[int]) -> RolloutBatch:
        """The responses ``rows`` (indices, in that order) as a batch of their own: every per-response tensor
        indexed, the padded widths kept."""
        index = torch.tensor(rows, dtype=torch.long, device=self.input_ids.device)
        values = {k: v.index_select(0, index) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return type(self)(**values)

    def padded(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """[N, T] float32 on the batch's device from one 1-D tensor per response (its tokens' values), 0 on padding."""
        out = torch.zeros(self.response_ids.shape, dtype=torch.float32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row.float()
        return out.to(self.response_ids.device)

    @classmethod
    def from_rollout(
        cls,
        prompt_ids: list[list[int]],
        response_ids: list[list[int]],
        sampler_logprobs: list[list[float]],
        group_ids: list[int],
        pad_id: int = 0,
    ) -> RolloutBatch:
        N = len(prompt_ids)
        P = max(len(p) for p in prompt_ids)
        T = max(1, max(len(r) for r in response_ids))
        ids = torch.full((N, P + T), pad_id, dtype=torch.long)
        att = torch.zeros(N, P + T, dtype=torch.long)
        resp = torch.full((N, T), pad_id, dtype=torch.long)
        rmask = torch.zeros(N, T, dtype=torch.float32)
        slp = torch.zeros(N, T, dtype=torch.float32)
        for i, (p, r, lp) in enumerate(zip(prompt_ids, response_ids, sampler_logprobs)):
            ids[i, P - len(p) : P] = torch.tensor(p)
            att[i, P - len(p) : P] = 1
            if r:
                ids[i, P : P + len(r)] = torch.tensor(r)
                att[i, P : P + len(r)] = 1
                resp[i, : len(r)] = torch.tensor(r)
                rmask[i, : len(r)] = 1.0
                slp[i, : len(r)] = torch.tensor(lp, dtype=torch.float32)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        return cls(ids, att, pos, resp, rmask, slp, torch.tensor(group_ids, dtype=torch.long))


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of the first occurrence of each distinct prompt [G], the distinct prompt of each row [n]).
    Two rows share a prompt when their prompt columns hold the same tokens under the same padding."""
    key = torch.where(prompt_mask.bool(), prompt_ids, torch.full_like(prompt_ids, -1))
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    n = prompt_ids.shape[0]
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=prompt_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=prompt_ids.device), reduce="amin")
    # number the distinct prompts in the order they first appear (the batch's group order)
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[inverse]
