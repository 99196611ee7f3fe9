"""The micro-batches' token budget holds at least one row."""

from __future__ import annotations

from ..schema import Config


def micro_batch_budget(cfg: Config) -> list[str]:
    """``train.max_tokens_per_micro_batch`` fits one response of ``rollout.max_new_tokens`` tokens after a
    prompt of at least one token (:mod:`sparserl.packing`); a longer prompt than the budget leaves room for
    is refused when its batch is packed, naming the key and the row's length."""
    t, r = cfg.train, cfg.rollout
    need = r.max_new_tokens + 1
    if t.max_tokens_per_micro_batch is not None and t.max_tokens_per_micro_batch < need:
        return [
            f"train.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch} cannot hold one response of "
            f"rollout.max_new_tokens={r.max_new_tokens} tokens and its prompt: set it to at least {need} "
            "(plus the longest prompt's tokens), or null for no token budget"
        ]
    return []
