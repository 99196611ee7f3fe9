"""What a sparse sampler's attention read, step by step, as masks over true positions.

A compressed sampler's next-token distribution at response step t + 1 is the model's with each layer's
query at position ``P + t`` (P prompt tokens; the input is response token t) attending only to the
tokens its cache held, or for block top-k the pages it chose, per KV head. Recorded during a replay
(:func:`sparserl.mismatch.replay.replay`'s ``on_decode``, after each decode step's attention and before
any compression), these sets turn the sequential sparse decode into one teacher-forced forward with a
mask per layer and KV head (:func:`replay_masks`): every token's keys and values are computed from its
hidden state as the sampler computed them, so the forward reproduces the sampler's log-probs up to
float rounding, with gradients (DistillSparse, :mod:`sparserl.train.distill_sparse`). The prompt's rows
are causal: the prefill attends to the whole prompt, and response token 0 comes from it.
"""

from __future__ import annotations

import torch

__all__ = ["AttendedPositions", "replay_masks"]


class AttendedPositions:
    """``on_decode`` recorder: ``masks[i]`` bool [n_layers, Hkv, R_i - 1, P_i + R_i - 1] for response i
    (P_i prompt tokens, R_i response tokens): at decode step t, the positions layer l's KV head h read."""

    def __init__(self, prompt_ids: list[list[int]], response_ids: list[list[int]], n_layers: int, n_kv: int):
        self.prompt_ids, self.response_ids = prompt_ids, response_ids
        self.masks = [
            torch.zeros(n_layers, n_kv, max(len(r) - 1, 0), len(p) + len(r) - 1, dtype=torch.bool)
            for p, r in zip(prompt_ids, response_ids)
        ]
        self.width = max((m.shape[-1] for m in self.masks), default=0)

    def __call__(self, t: int, rows: torch.Tensor, cache) -> None:
        L = cache.max_len
        read = torch.stack([cache.attended(layer) for layer in range(cache.n_layers)]).cpu()  # [n_layers, B, Hkv, L]
        pos = torch.where(read, cache.pos[:, :, :, :L].cpu().long(), self.width)  # unread slots → a spare column
        nl, B, hkv, _ = read.shape
        at = torch.zeros(nl, B, hkv, self.width + 1, dtype=torch.bool).scatter_(-1, pos, True)
        for b, i in enumerate(rows.tolist()):
            mask = self.masks[i]
            if t < mask.shape[2]:  # the last token of a response is never decoded
                mask[:, :, t] = at[:, b, :, : mask.shape[3]]


def replay_masks(recorded: AttendedPositions, rows: list[int]) -> torch.Tensor:
    """bool [n, n_layers, Hkv, S, S] (S: the longest ``prompt + response[:-1]`` of ``rows``) for a forward
    over ``prompt_ids[i] + response_ids[i][:-1]``, right-padded: the prompt's rows causal, response step t's
    row (position P_i + t) what the sampler read then, a padding row its own position only."""
    masks = [recorded.masks[i] for i in rows]
    nl, hkv = masks[0].shape[:2]
    S = max(m.shape[-1] for m in masks)
    out = torch.zeros(len(rows), nl, hkv, S, S, dtype=torch.bool)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for n, (i, mask) in enumerate(zip(rows, masks)):
        P, width = len(recorded.prompt_ids[i]), mask.shape[-1]
        out[n, :, :, :P, :P] = causal[:P, :P]
        out[n, :, :, P:width, :width] = mask
        pad = torch.arange(width, S)
        out[n, :, :, pad, pad] = True
    return out
