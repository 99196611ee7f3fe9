"""Response log-probs with each distinct prompt forwarded once: the GRPO group's shared prefix.

The n samples of a GRPO group answer one prompt, and a causal model's states over the prompt do
not depend on what follows it. So instead of forwarding every ``[prompt | response]`` row whole
(:func:`sparserl.score.forward_response`), forward each distinct prompt of the rows once, expand its
per-layer keys/values to the rows that share it (an index, which carries the gradient back: the
prompt's gradient is the sum over its group's rows, exactly as in the full forward), and forward
only the responses with those keys/values as their cache (:mod:`sparserl.models.hf_cache`). The log-prob
of response token 0 comes from the prompt's last position, the others from the response positions. Tokens through the
model per group: ``P + n·T`` instead of ``n·(P + T)``; with a prompt of ~80 tokens (system prompt
included), responses of ~40 and n = 8, about 2.3x fewer.

Columns are trimmed to what the rows use: left padding that none of the rows' prompts needs, and
response columns beyond the longest response among the rows (those log-probs are returned as 0:
they sit under ``response_mask`` = 0). Positions come from ``batch.position_ids`` as in the full
forward. A micro-batch may split a group: its prompt is then forwarded once per part (the gradients
still add up to the full batch's). The LM head runs chunked (:mod:`.chunked_head`) unless
``chunk_size`` is None.
"""

from __future__ import annotations

import torch

from ..batch import RolloutBatch, distinct_prompts
from ..models.hf_cache import cache_argument, output_cache
from ..packing import used_columns
from .chunked_head import DEFAULT_CHUNK, head_logprobs, token_logprobs


def lm_head_weight(model) -> torch.Tensor:
    """The LM head's weight [V, H] of a *ForCausalLM whose logits are plain ``h Wᵀ`` (llama, qwen2,
    qwen3, mistral); anything else (a bias, soft-capping, a logit scale) is refused."""
    head = model.get_output_embeddings()
    cfg = model.config
    if (
        getattr(head, "bias", None) is not None
        or getattr(cfg, "final_logit_softcapping", None)
        or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0)
    ):
        raise ValueError(
            f"shared-prompt scoring: the LM head of model_type {cfg.model_type!r} is not a plain "
            "h @ W.T (bias, soft-capping or scaling); use forward_response"
        )
    return head.weight


def shares_prompt_with_grad(model, shared_prompt: bool) -> bool:
    """Whether a training forward with gradients (the update's) can forward each prompt once: under
    ``train.shared_prompt``, unless the model checkpoints its layers (``train.gradient_checkpointing``),
    whose grad-mode forward drops the KV cache the responses would read (transformers sets ``use_cache``
    off in checkpointed layers); such a forward runs every row whole."""
    return bool(shared_prompt) and not checkpoints_activations(model)


def checkpoints_activations(model) -> bool:
    """Whether ``model`` (a transformers model, or peft's wrapper of one) checkpoints its layers'
    activations: ``is_activation_checkpointing``, or ``is_gradient_checkpointing`` in transformers
    versions before that name."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def response_hidden_shared(model, batch: RolloutBatch, rows: slice | torch.Tensor) -> torch.Tensor:
    """[n, T_used, H]: the final hidden state at each position that predicts a response token of ``rows``,
    each distinct prompt forwarded once (see the module docstring); ``T_used`` is the rows' longest
    response. Runs with whatever grad mode the caller set."""
    ids, att, pos = batch.input_ids[rows], batch.attention_mask[rows], batch.position_ids[rows]
    T = batch.response_ids.shape[1]
    P = ids.shape[1] - T
    first_col, T_used = used_columns(att, T)  # from the first prompt column any row uses, to the longest response
    prompt_rows, group_of_row = distinct_prompts(ids[:, first_col:P], att[:, first_col:P])

    decoder = model.get_decoder()
    out = decoder(
        input_ids=ids[prompt_rows, first_col:P],
        attention_mask=att[prompt_rows, first_col:P],
        position_ids=pos[prompt_rows, first_col:P],
        use_cache=True,
    )
    cache = output_cache(out)
    hidden = out.last_hidden_state[:, -1:].index_select(0, group_of_row)  # predicts response token 0
    if T_used > 1:
        cache.batch_select_indices(group_of_row)  # [G, ...] -> [n, ...]; indexing keeps the gradient
        resp = decoder(
            input_ids=ids[:, P : P + T_used - 1],
            attention_mask=att[:, first_col : P + T_used - 1],
            position_ids=pos[:, P : P + T_used - 1],
            use_cache=True,
            **{cache_argument(decoder): cache},
        )
        hidden = torch.cat([hidden, resp.last_hidden_state], dim=1)  # [n, T_used, H]
    del cache
    return hidden


def forward_response_shared(
    model,
    batch: RolloutBatch,
    rows: slice | torch.Tensor,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    temperature: float = 1.0,
    chunk_size: int | None = DEFAULT_CHUNK,
    return_hidden: bool = False,
):
    """Per-token log-probs [n, T] (and entropies, and with ``return_hidden`` the detached final hidden
    states [n, T, H]) of the responses in ``rows``, as :func:`sparserl.score.forward_response` (same
    arguments, same values up to float rounding), with each distinct prompt forwarded once (see the
    module docstring). Positions past the rows' longest response hold 0. Runs with whatever grad mode
    the caller set."""
    targets_full = batch.response_ids[rows]
    T = targets_full.shape[1]
    hidden = response_hidden_shared(model, batch, rows)
    T_used = hidden.shape[1]
    targets = targets_full[:, :T_used]
    weight = lm_head_weight(model)
    if chunk_size is None:  # the plain head: every position's logits at once
        logits = (hidden @ weight.t()).float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        lp = token_logprobs(logits, targets)
        ent = None
        if return_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = torch.logsumexp(logits, -1) - (logits.softmax(-1) * logits).sum(-1)
    else:
        lp, ent = head_logprobs(
            hidden, weight, targets, temperature, chunk_size, with_entropy=return_entropy, entropy_grad=entropy_grad
        )
    if T_used < T:
        lp = torch.nn.functional.pad(lp, (0, T - T_used))
        ent = torch.nn.functional.pad(ent, (0, T - T_used)) if ent is not None else None
    if return_hidden:
        return lp, ent, torch.nn.functional.pad(hidden.detach(), (0, 0, 0, T - T_used))
    return lp, ent
