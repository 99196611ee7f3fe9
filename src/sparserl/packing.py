"""Micro-batches by token budget: which rows of a batch go through one forward together, and which
columns of theirs that forward computes.

A micro-batch's forward computes its rows trimmed to what they use (:func:`used_columns`): from the
first column any of its prompts starts at to the end of its longest response, so its cost is

    tokens = n · (P_max + T_max)                       (every row whole), or
    tokens = G · P_max + n · T_max                     (``shared_prompt``: each of its G distinct prompts once)

with ``n`` its rows, ``P_max`` / ``T_max`` its longest prompt / response (:func:`micro_batch_tokens`; ``G``
counts the rows' GRPO groups, an upper bound on their distinct prompts). :func:`pack_micro_batches` sorts
the rows by length, longest first, so that similar lengths share a micro-batch (little padding), and fills
each micro-batch while it holds at most ``max_tokens`` tokens and ``max_rows`` rows (verl's
``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``; verl balances the partitions with Karmarkar-Karp,
here a greedy fill of the sorted rows). Every row lands in exactly one micro-batch; the result depends
only on the lengths (ties keep row order), so every learner of a data-parallel update computes the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import SparserlError

__all__ = [
    "BUDGET_KEY",
    "PROMPT_TOKENS_BOUND",
    "MicroBatchBudgetError",
    "RowLengths",
    "micro_batch_rows",
    "micro_batch_tokens",
    "pack_micro_batches",
    "used_columns",
    "worst_case_tokens",
]

BUDGET_KEY = "train.max_tokens_per_micro_batch"

#: the longest prompt (chat template and the default system prompt included) the config-time rules assume,
#: in tokens. The shipped data sets' prompts, SmolLM2's tokenizer: arith at most 91, svamp 147, GSM8K 260;
#: the competition sets' 99th percentiles 312 (AMC23) to 652 (OlympiadBench), MATH500's 486. A longer
#: prompt at run time is still handled: a step whose batch does not fit one micro-batch scores its old
#: policy instead (:mod:`sparserl.train.old_logprobs`), and the packer splits by the real lengths.
PROMPT_TOKENS_BOUND = 512


class MicroBatchBudgetError(SparserlError, ValueError):
    """A row longer than ``train.max_tokens_per_micro_batch``: no micro-batch can hold it."""


@dataclass(frozen=True)
class RowLengths:
    """Per row of a batch laid out ``[left pad | prompt | response | right pad]``: its prompt's and its
    response's token counts [N] and its GRPO group [N] (None: every row its own prompt)."""

    prompt: torch.Tensor
    response: torch.Tensor
    group: torch.Tensor | None = None

    @classmethod
    def of(cls, attention_mask: torch.Tensor, response_len: int, group_ids: torch.Tensor | None = None) -> RowLengths:
        """The lengths of rows whose last ``response_len`` columns are the response's."""
        att = attention_mask.detach().to("cpu", torch.long)
        P = att.shape[1] - response_len
        group = group_ids.detach().to("cpu") if group_ids is not None else None
        return cls(att[:, :P].sum(-1), att[:, P:].sum(-1), group)

    @classmethod
    def of_batch(cls, batch) -> RowLengths:
        """The lengths of a :class:`~sparserl.batch.RolloutBatch`'s rows."""
        return cls.of(batch.attention_mask, batch.response_ids.shape[1], batch.group_ids)


def micro_batch_tokens(lengths: RowLengths, rows: torch.Tensor, shared_prompt: bool = False) -> int:
    """Tokens the trimmed forward of ``rows`` computes: ``n·(P_max + T_max)``, or with ``shared_prompt``
    ``G·P_max + n·T_max`` (the module docstring). A response of 0 tokens still takes one column."""
    n = len(rows)
    if n == 0:
        return 0
    p = int(lengths.prompt[rows].max())
    t = max(1, int(lengths.response[rows].max()))
    if shared_prompt:
        g = len(torch.unique(lengths.group[rows])) if lengths.group is not None else n
        return g * p + n * t
    return n * (p + t)


def worst_case_tokens(rows: int, groups: int, prompt_tokens: int, response_tokens: int, shared_prompt: bool) -> int:
    """:func:`micro_batch_tokens` of ``rows`` rows in ``groups`` groups whose prompts and responses are as
    long as allowed: what one micro-batch holding a whole batch may have to compute."""
    if shared_prompt:
        return groups * prompt_tokens + rows * response_tokens
    return rows * (prompt_tokens + response_tokens)


def pack_micro_batches(
    lengths: RowLengths,
    rows: torch.Tensor | slice | None = None,
    *,
    max_tokens: int | None,
    max_rows: int,
    shared_prompt: bool = False,
) -> list[torch.Tensor]:
    """The micro-batches of ``rows`` (default: all), each a sorted int64 index tensor of at most
    ``max_rows`` rows whose :func:`micro_batch_tokens` is at most ``max_tokens`` (None: rows only, in
    their order, as plain consecutive chunks). Rows are taken longest first (prompt + response; ties in
    row order) and added to the current micro-batch while both limits hold. A row that alone exceeds
    ``max_tokens`` raises :class:`MicroBatchBudgetError` naming the key and the row's lengths."""
    N = len(lengths.prompt)
    if rows is None:
        rows = torch.arange(N)
    elif isinstance(rows, slice):
        rows = torch.arange(N)[rows]
    rows = rows.to("cpu", torch.long)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if max_tokens is None:
        return [rows[s : s + max_rows] for s in range(0, len(rows), max_rows)]
    total = lengths.prompt[rows] + lengths.response[rows].clamp(min=1)
    order = rows[torch.sort(total, descending=True, stable=True).indices]
    parts: list[torch.Tensor] = []
    current: list[int] = []
    for i in order.tolist():
        one = torch.tensor([i])
        if micro_batch_tokens(lengths, one, shared_prompt) > max_tokens:
            raise MicroBatchBudgetError(
                f"{BUDGET_KEY}={max_tokens} cannot hold row {i}: its prompt of {int(lengths.prompt[i])} tokens + "
                f"response of {int(lengths.response[i])} is longer; raise {BUDGET_KEY} to at least "
                f"{micro_batch_tokens(lengths, one, shared_prompt)} (or shorten the prompts)"
            )
        if current and (
            len(current) >= max_rows
            or micro_batch_tokens(lengths, torch.tensor(current + [i]), shared_prompt) > max_tokens
        ):
            parts.append(torch.tensor(sorted(current)))
            current = []
        current.append(i)
    if current:
        parts.append(torch.tensor(sorted(current)))
    return parts


def used_columns(attention_mask: torch.Tensor, response_len: int) -> tuple[int, int]:
    """(first column, response columns) that rows ``[left pad | prompt | response | right pad]`` use:
    the first prompt column any row starts at (at most the prompt's last column, so that the position
    predicting response token 0 stays) and the longest response (at least 1)."""
    P = attention_mask.shape[1] - response_len
    used = attention_mask[:, :P].bool().any(0).nonzero()
    first = min(int(used[0]) if len(used) else P - 1, P - 1)
    t_used = int(attention_mask[:, P:].sum(-1).max()) if attention_mask.shape[0] else 1
    return max(first, 0), max(1, t_used)


def micro_batch_rows(micro_batch_size: int, max_tokens: int | None, row_tokens: int) -> int:
    """Rows per micro-batch: ``micro_batch_size``, at most ``max_tokens`` // ``row_tokens`` (at least one) where
    ``max_tokens`` is given (``train.max_tokens_per_micro_batch``, the bound the learner's forward keeps)."""
    if max_tokens is None:
        return max(1, micro_batch_size)
    return max(1, min(micro_batch_size, max_tokens // max(row_tokens, 1)))
