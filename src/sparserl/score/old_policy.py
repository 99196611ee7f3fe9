"""Where a step's old-policy log-probs come from, so that a scoring forward is run only when needed.

Three sources (``algorithm.old_logprobs``): ``score``, a no-grad forward of the learner before the
update; ``sampler``, the sampler's own log-probs, when it runs the old policy exactly (below); and
``update``, the update's own forward, detached, when that forward runs the old policy's weights on the
whole batch at once (the second half of this docstring). ``auto`` takes the sampler, else the update's
forward, else a scoring forward.

**The sampler.** When the sampler's log-probs *are* the old policy's, the scoring forward can be skipped.

The old policy p of a PPO step is the learner's weights before the step's first update, and the
sampler runs exactly those weights (the trainer pushes them into the sampler after every update and
on resume). The sampler's ``log q`` of each sampled token is ``log softmax(logits / τ)`` after top-k
and top-p filtering (:mod:`sparserl.rollout.sampling`); the scorer's ``log p`` is
``log softmax(logits / τ)`` of the dense learner (:func:`sparserl.score.forward_response`). They are
the same number, up to float32 rounding (~1e-6 in log p), when

1. the sampler keeps a dense KV cache (no compressor evicts anything);
2. it samples from the full tempered distribution: ``temperature > 0`` (greedy reports log q = 0),
   ``top_p = 1`` and ``top_k = 0`` (a filter renormalises q over fewer tokens);
3. neither its weights nor its KV cache are quantized, and it holds the learner's current weights
   (not those of a step before: ``rollout.async``);
4. sampler and learner both compute in float32. In 16-bit the sampler's fused kernels and the
   learner's forward round differently (log p differs by ~1e-2 per token): that difference is the
   training-inference mismatch the corrections of :mod:`sparserl.correct` exist for, so it is scored.

Then ``old_logprobs = sampler_logprobs`` and the correction sees no mismatch, which is the truth.

**The update's forward** (TRL's GRPOTrainer with ``num_iterations=1``: ``old_per_token_logps =
per_token_logps.detach()``). The update's first forward runs the old policy's weights, so its log-probs,
detached, are ``log p``: the PPO ratio π/p is exactly 1 at the step, as after a scoring forward in the
same precision. The trainer runs that forward before the corrections and keeps its graph until the loss
(:mod:`sparserl.train.update_forward`). That is one forward fewer, when

1. the step makes one optimizer step (``train.ppo_epochs=1``, ``train.mini_batch_prompts`` null or the
   whole batch): the old policy of a second optimizer step is no longer the weights its forward runs;
2. one micro-batch holds the whole batch (``train.micro_batch_size`` ≥ ``train.prompts_per_step`` ×
   ``rollout.n``, and its tokens at their longest within ``train.max_tokens_per_micro_batch``): the
   corrections (Sparse-RL's batch-normalised weights) and the loss normalisers read
   every sequence's ``log p`` before the first backward, and two micro-batches' graphs at once would
   hold the memory the micro-batch size exists to bound;
3. one learner computes it (``cluster.learners=1``), and its forward is deterministic in training mode
   (no dropout: a dropped unit would make the update's forward a sample, not ``log p``).
"""

from __future__ import annotations

import torch

from ..errors import SparserlError

OLD_LOGPROBS_SOURCES = ("auto", "score", "sampler", "update")


class OldLogprobsError(SparserlError, ValueError):
    """``algorithm.old_logprobs=sampler`` on a sampler whose log-probs are not the old policy's, or
    ``update`` on a step whose update's forward is not the old policy's."""


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype)


def why_sampler_is_not_old_policy(
    *,
    compresses: bool,
    sampler_dtype,
    learner_dtype,
    temperature: float,
    top_p: float,
    top_k: int,
    quantized: bool = False,
    lagged: bool = False,
) -> str | None:
    """The first reason (a phrase naming the option) why the sampler's log-probs are not the old
    policy's, or None when they are (see the module docstring). Dtypes as torch dtypes or names;
    ``lagged``: the sampler holds the weights of a step before (``rollout.async``)."""
    if lagged:
        return "rollout.async samples with the weights of the step before (the learner scores the old policy)"
    if compresses:
        return "the sampler compresses its KV cache (rollout.compressor is not none)"
    if temperature <= 0:
        return "greedy sampling (rollout.temperature=0) reports log q = 0"
    if top_p < 1.0:
        return f"rollout.top_p={top_p} truncates the sampled distribution"
    if top_k:
        return f"rollout.top_k={top_k} truncates the sampled distribution"
    if quantized:
        return "the sampler's weights or KV cache are quantized (rollout.quant / rollout.kv_quant)"
    s, l_ = _dtype_name(sampler_dtype), _dtype_name(learner_dtype)
    if s != "float32" or l_ != "float32":
        return (
            f"sampler dtype {s} (rollout.dtype) and learner compute dtype {l_} (model.dtype, model.mixed_precision) "
            f"are not both float32: "
            "their log-probs differ by the rounding of 16-bit kernels"
        )
    return None


def sampler_is_old_policy(**facts) -> bool:
    """True when the sampler's per-token log-probs are the old policy's (arguments of
    :func:`why_sampler_is_not_old_policy`)."""
    return why_sampler_is_not_old_policy(**facts) is None


def why_update_forward_is_not_old_policy(
    *,
    optimizer_steps: int,
    micro_batches: int,
    learners: int = 1,
    dropout: float = 0.0,
    tokens: int | None = None,
    max_tokens: int | None = None,
) -> str | None:
    """The first reason (a phrase naming the option) why the update's own forward cannot give the old
    policy's log-probs, or None when it can (see the module docstring). ``optimizer_steps``: per rollout
    batch (``ppo_epochs`` × mini-batches); ``micro_batches``: per optimizer step (by rows); ``tokens``: the
    most a forward over the whole batch may compute (:meth:`sparserl.config.Config.update_forward_tokens`),
    against the token budget ``max_tokens`` (``train.max_tokens_per_micro_batch``; None = none);
    ``dropout``: the largest dropout probability active in the learner's training-mode forward."""
    if optimizer_steps != 1:
        return (
            f"the step makes {optimizer_steps} optimizer steps (train.ppo_epochs, train.mini_batch_prompts): "
            "after the first, the update's forward no longer runs the old policy"
        )
    if micro_batches != 1:
        return (
            f"the batch takes {micro_batches} micro-batches (train.micro_batch_size): the corrections need every "
            "sequence's log p before the first backward; set train.micro_batch_size to the whole batch"
        )
    if tokens is not None and max_tokens is not None and tokens > max_tokens:
        return (
            f"the batch takes {-(-tokens // max_tokens)} micro-batches by tokens: up to {tokens} tokens in one "
            f"forward (its responses at rollout.max_new_tokens) exceed train.max_tokens_per_micro_batch={max_tokens}"
        )
    if learners != 1:
        return f"cluster.learners={learners} splits the update's forward across learners"
    if dropout > 0:
        return f"dropout {dropout:g} in the learner's training-mode forward (train.lora_dropout, the model's config)"
    return None


def model_dropout(model) -> float:
    """The largest dropout probability ``model``'s training-mode forward applies: its ``nn.Dropout``
    modules (peft's LoRA dropout among them) and the ``*dropout*`` / ``*pdrop`` fields of its config
    (transformers' attention applies ``config.attention_dropout`` functionally)."""
    p = max((m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)), default=0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in config.to_dict().items():
            if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
                p = max(p, value)
    return float(p)


def old_logprobs_source(mode: str, *, why_not_update: str | None, **facts) -> str:
    """Where a step's old-policy log-probs come from: ``"sampler"`` (reuse ``sampler_logprobs``),
    ``"update"`` (the update's own forward, detached) or ``"score"`` (a no-grad forward of the learner).
    ``mode`` (``algorithm.old_logprobs``): ``auto`` = the sampler when :func:`sampler_is_old_policy` holds,
    else the update's forward when ``why_not_update`` (:func:`why_update_forward_is_not_old_policy`) is
    None, else score; ``score``; ``sampler`` / ``update`` = that source, an :class:`OldLogprobsError`
    naming the reason when its rule does not hold."""
    if mode not in OLD_LOGPROBS_SOURCES:
        raise OldLogprobsError(f"algorithm.old_logprobs={mode!r}: expected one of {', '.join(OLD_LOGPROBS_SOURCES)}")
    if mode == "score":
        return "score"
    if mode == "update":
        if why_not_update is not None:
            raise OldLogprobsError(
                f"algorithm.old_logprobs=update: the update's forward is not the old policy's: "
                f"{why_not_update}; use auto or score"
            )
        return "update"
    why = why_sampler_is_not_old_policy(**facts)
    if why is None:
        return "sampler"
    if mode == "sampler":
        raise OldLogprobsError(
            f"algorithm.old_logprobs=sampler: the sampler's log-probs are not the old policy's: "
            f"{why}; use auto or score"
        )
    return "update" if why_not_update is None else "score"
