"""The learner's log-prob paths agree with the plain one: the chunked LM head (values and gradients),
the shared-prompt forward (values and gradients, on tiny models of every sampler family), and the rule
that lets the sampler's log-probs stand in for the old policy's."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from sparserl.batch import RolloutBatch
from sparserl.score import (
    forward_response,
    forward_response_shared,
    head_logprobs,
    model_dropout,
    old_logprobs_source,
    sampler_is_old_policy,
    score_logprobs,
    why_update_forward_is_not_old_policy,
)
from sparserl.score.old_policy import OldLogprobsError


# --------------------------------------------------------------------------- chunked LM head
def plain_head(hidden, weight, targets, temperature):
    logits = (hidden @ weight.t()).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, -1)
    ent = torch.logsumexp(logits, -1) - (logits.softmax(-1) * logits).sum(-1)
    return lp, ent


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [5, 4, 1000])  # 5 does not divide the 21 positions
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_head_equals_plain_values_and_gradients(temperature, chunk, entropy_grad):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g)
    weight = torch.randn(50, 16, generator=g) * 0.5
    targets = torch.randint(0, 50, (3, 7), generator=g)
    up_lp, up_ent = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)

    def run(fn):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fn(h, w)
        loss = (up_lp * lp).sum() + ((up_ent * ent).sum() if entropy_grad else 0.0)
        loss.backward()
        return lp.detach(), ent.detach(), h.grad, w.grad

    lp, ent, gh, gw = run(
        lambda h, w: head_logprobs(h, w, targets, temperature, chunk, with_entropy=True, entropy_grad=entropy_grad)
    )
    lp0, ent0, gh0, gw0 = run(lambda h, w: plain_head(h, w, targets, temperature))
    assert torch.allclose(lp, lp0, atol=1e-5) and torch.allclose(ent, ent0, atol=1e-5)
    if not entropy_grad:  # the reference's loss used only log p
        assert torch.allclose(gh, gh0, atol=1e-5) and torch.allclose(gw, gw0, atol=1e-5)
    else:
        assert torch.allclose(gh, gh0, atol=1e-5) and torch.allclose(gw, gw0, atol=1e-5)
        assert gh.abs().max() > 1e-3  # the check is not vacuous


def test_chunked_head_without_entropy_and_under_no_grad():
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(10, 8, generator=g), torch.randn(30, 8, generator=g)
    targets = torch.randint(0, 30, (10,), generator=g)
    lp, ent = head_logprobs(hidden, weight, targets, 1.0, 3)
    assert ent is None and torch.allclose(lp, plain_head(hidden, weight, targets, 1.0)[0], atol=1e-5)
    with torch.no_grad():
        lp2, _ = head_logprobs(hidden.requires_grad_(), weight, targets, 1.0, 3)
    assert not lp2.requires_grad and torch.equal(lp, lp2)
    with pytest.raises(ValueError, match="chunk_size"):
        head_logprobs(hidden, weight, targets, chunk_size=0)


# --------------------------------------------------------------------------- shared-prompt forward
def tiny_family(family: str):
    """A 2-layer random model of a sampler family with a 97-token vocabulary (seeded)."""
    import transformers as tf

    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        tie_word_embeddings=family == "llama",
    )
    cfg = {
        "llama": lambda: tf.LlamaConfig(**common),
        "qwen2": lambda: tf.Qwen2Config(**common),
        "qwen3": lambda: tf.Qwen3Config(head_dim=8, **common),
        "mistral": lambda: tf.MistralConfig(**common),
    }[family]()
    torch.manual_seed(0)
    cls = {
        "llama": tf.LlamaForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
        "qwen3": tf.Qwen3ForCausalLM,
        "mistral": tf.MistralForCausalLM,
    }[family]
    model = cls(cfg).float()
    if family == "qwen2":  # non-zero q/k/v biases, so that they are exercised
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.1)
    return model.train()


def grouped_batch(prompt_lengths=(5, 9, 3), n=4, max_resp=7, seed=0) -> RolloutBatch:
    """Groups of ``n`` responses (lengths 0..max_resp) to prompts of different lengths, layout as the trainer's."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, groups = [], [], []
    for gi, plen in enumerate(prompt_lengths):
        p = torch.randint(1, 97, (plen,), generator=g).tolist()
        for k in range(n):
            length = [max_resp, 0, 1, 4, 6, 2][(gi + k) % 6]
            prompts.append(p)
            responses.append(torch.randint(1, 97, (length,), generator=g).tolist())
            groups.append(gi)
    return RolloutBatch.from_rollout(prompts, responses, [[0.0] * len(r) for r in responses], groups)


def grads_of(model, batch, forward, micro, temperature, entropy=True):
    """Per-token log-probs, entropies and parameter gradients of a fixed weighted loss, accumulated over
    micro-batches of ``micro`` rows."""
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(3)
    w_lp = torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask
    w_ent = torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask
    lps, ents = [], []
    for s in range(0, batch.size, micro):
        r = slice(s, s + micro)
        lp, ent = forward(model, batch, r, return_entropy=True, entropy_grad=entropy, temperature=temperature)
        loss = (lp * w_lp[r]).sum() + (ent * w_ent[r]).sum()
        loss.backward()
        lps.append(lp.detach())
        ents.append(ent.detach())
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return torch.cat(lps) * batch.response_mask, torch.cat(ents) * batch.response_mask, grads


def assert_same_grads(a: dict, b: dict, rel=1e-4):
    assert a.keys() == b.keys() and a
    for k in a:
        scale = b[k].abs().max().clamp(min=1e-6)
        assert (a[k] - b[k]).abs().max() <= rel * scale + 1e-7, k


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_shared_prompt_forward_equals_full_forward(family):
    model = tiny_family(family)
    batch = grouped_batch()
    for temperature in (1.0, 0.7):
        lp0, ent0, g0 = grads_of(model, batch, forward_response, 12, temperature)
        # micro-batches of 5 rows split every group of 4 (prompts forwarded once per part)
        for micro in (12, 5):
            lp, ent, g = grads_of(model, batch, forward_response_shared, micro, temperature)
            assert (lp - lp0).abs().max() <= 1e-5 and (ent - ent0).abs().max() <= 1e-5
            assert_same_grads(g, g0)
    # the plain (unchunked) head of the shared path too
    fwd = lambda *a, **k: forward_response_shared(*a, chunk_size=None, **k)  # noqa: E731  (the shared path, unchunked)
    lp, ent, g = grads_of(model, batch, fwd, 8, 0.7)
    lp0, ent0, g0 = grads_of(model, batch, forward_response, 8, 0.7)
    assert (lp - lp0).abs().max() <= 1e-5 and (ent - ent0).abs().max() <= 1e-5
    assert_same_grads(g, g0)


def test_shared_prompt_scoring_on_the_tiny_default_model(tiny):
    """score_logprobs(shared_prompt=True) == score_logprobs on the 'tiny' model (SmolLM2's 49k vocabulary),
    with the default layout's shape: a common system prompt, groups of 8 sharing a question."""
    model = tiny.model
    batch = grouped_batch(prompt_lengths=(12, 15), n=8, max_resp=9, seed=1).to(model.device)
    for temperature in (1.0, 0.7):
        ref = score_logprobs(model, batch, 16, temperature)
        got = score_logprobs(model, batch, 16, temperature, shared_prompt=True)
        assert (got - ref).abs().max() <= 1e-5


def test_shared_prompt_forward_names_the_cache_as_the_installed_transformers_does(tiny):
    """The response forward passes the prompt's keys/values under the name the decoder's forward takes
    (``cache`` in transformers 5.24, ``past_key_values`` before): no deprecation warning, and the helpers
    read either spelling."""
    import types
    import warnings

    from sparserl.models.hf_cache import cache_argument, output_cache

    model = tiny.model
    batch = grouped_batch(prompt_lengths=(12, 15), n=8, max_resp=9, seed=1).to(model.device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        score_logprobs(model, batch, 16, 1.0, shared_prompt=True)

    class OldDecoder(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return input_ids

    import inspect

    takes = inspect.signature(type(model.get_decoder()).forward).parameters
    assert cache_argument(model.get_decoder()) == ("cache" if "cache" in takes else "past_key_values")
    assert cache_argument(OldDecoder()) == "past_key_values"
    assert output_cache(types.SimpleNamespace(past_key_values="kv")) == "kv"
    assert output_cache(types.SimpleNamespace()) is None


@pytest.mark.parametrize("shared", [False, True])
def test_scoring_that_keeps_the_hidden_states_for_alpha(shared):
    """score_logprobs_keep_hidden: the old-policy log-probs of score_logprobs and the hidden states α's own
    forward (score.hidden.dense_hidden) would make, from one forward."""
    from sparserl.score import score_logprobs_keep_hidden
    from sparserl.score.hidden import dense_hidden

    model = tiny_family("llama")
    batch = grouped_batch()
    for temperature in (1.0, 0.7):
        lp, hidden = score_logprobs_keep_hidden(model, batch, 5, temperature, shared_prompt=shared)
        assert (lp - score_logprobs(model, batch, 5, temperature)).abs().max() <= 1e-5
        ref = dense_hidden(
            model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_ids.shape[1]
        )
        assert hidden.shape == ref.shape
        mask = batch.response_mask.bool()
        assert (hidden[mask] - ref[mask]).abs().max() <= 1e-5
    assert model.training  # the caller's mode is given back


def test_identical_prompts_in_different_groups_share_one_forward():
    from sparserl.score.shared_prompt import distinct_prompts

    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [9, 5, 6]])
    att = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])  # row 4: another pad id
    first, group = distinct_prompts(ids, att)
    assert first.tolist() == [0, 2] and group.tolist() == [0, 0, 1, 0, 0]
    att[4, 0] = 1  # now row 4 is the three-token prompt [9, 5, 6]
    first, group = distinct_prompts(ids, att)
    assert first.tolist() == [0, 2, 4] and group.tolist() == [0, 0, 1, 0, 2]


# --------------------------------------------------------------------------- sampler = old policy
DENSE_F32 = dict(
    compresses=False, sampler_dtype=torch.float32, learner_dtype="float32", temperature=1.0, top_p=1.0, top_k=0
)


@pytest.mark.parametrize(
    "change, holds",
    [
        ({}, True),
        ({"temperature": 0.7}, True),
        ({"compresses": True}, False),
        ({"temperature": 0.0}, False),
        ({"top_p": 0.95}, False),
        ({"top_k": 50}, False),
        ({"quantized": True}, False),
        ({"sampler_dtype": torch.bfloat16}, False),
        ({"sampler_dtype": "bfloat16", "learner_dtype": torch.bfloat16}, False),
    ],
)
def test_the_sampler_is_the_old_policy_rule(change, holds):
    facts = {**DENSE_F32, **change}
    assert sampler_is_old_policy(**facts) is holds
    no_update = "the batch takes 2 micro-batches"
    assert old_logprobs_source("auto", why_not_update=no_update, **facts) == ("sampler" if holds else "score")
    assert old_logprobs_source("auto", why_not_update=None, **facts) == ("sampler" if holds else "update")
    assert old_logprobs_source("score", why_not_update=None, **facts) == "score"
    if holds:
        assert old_logprobs_source("sampler", why_not_update=no_update, **facts) == "sampler"
    else:
        with pytest.raises(OldLogprobsError, match="algorithm.old_logprobs=sampler"):
            old_logprobs_source("sampler", why_not_update=None, **facts)
    assert (
        old_logprobs_source("update", why_not_update=None, **facts) == "update"
    )  # asked for, even where sampler holds
    with pytest.raises(OldLogprobsError, match="algorithm.old_logprobs=update.*2 micro-batches"):
        old_logprobs_source("update", why_not_update=no_update, **facts)
    with pytest.raises(OldLogprobsError, match="expected one of auto, score, sampler, update"):
        old_logprobs_source("sometimes", why_not_update=None, **facts)


@pytest.mark.parametrize(
    "facts, phrase",
    [
        ({}, None),
        ({"optimizer_steps": 2}, "2 optimizer steps"),
        ({"micro_batches": 3}, "3 micro-batches.*train.micro_batch_size"),
        ({"learners": 2}, "cluster.learners=2"),
        ({"dropout": 0.1}, "dropout 0.1"),
    ],
)
def test_the_update_forward_is_the_old_policy_rule(facts, phrase):
    why = why_update_forward_is_not_old_policy(**{"optimizer_steps": 1, "micro_batches": 1, **facts})
    if phrase is None:
        assert why is None
    else:
        assert re.search(phrase, why)


def test_model_dropout_reads_modules_and_config(tiny):
    """0 for the tiny Llama (no dropout module, attention_dropout 0); a module's p and a config field count."""
    model = copy.deepcopy(tiny.model)
    assert model_dropout(model) == 0.0
    model.config.attention_dropout = 0.25
    assert model_dropout(model) == 0.25
    model.config.attention_dropout = 0.0
    model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.05))
    assert model_dropout(model) == 0.05


def test_where_the_rule_holds_sampler_logprobs_equal_the_scored_ones(tiny):
    """The rule's premise on the real engine: a dense float32 sampler at τ = 0.8 reports the dense
    learner's log-probs (what the rule lets the trainer reuse), shared-prompt scoring included."""
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    engine = RolloutEngine(tiny, get_compressor("none"), dtype="float32")
    assert sampler_is_old_policy(
        compresses=engine.compressor.compresses,
        sampler_dtype=engine.dtype,
        learner_dtype=next(tiny.model.parameters()).dtype,
        temperature=0.8,
        top_p=1.0,
        top_k=0,
    )
    ro = engine.generate(["1 + 2 =", "hello there"], SamplingParams(n=3, max_new_tokens=10, temperature=0.8, seed=0))
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index).to(
        tiny.model.device
    )
    for shared in (False, True):
        old = score_logprobs(tiny.model, batch, 4, temperature=0.8, shared_prompt=shared)
        assert (old - batch.sampler_logprobs).abs().max() <= 1e-4
