"""A rollout sampled in segments with weights loaded between them (``sparserl.rollout.segmented``, the engine's
side of partial rollouts): the same weights throughout sample exactly what one ``generate`` call samples, for
every cache; a load between segments is what the responses go on with, and each token records the push whose
weights computed the logits it was drawn from."""

from __future__ import annotations

import pytest

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.sampling import SamplingParams
from sparserl.rollout.segmented import SegmentedRollout

PROMPTS = ["hello there", "What is 3 + 4? Answer with a number.", "Count: one two"]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=7)


def _engine(tiny, name: str, max_batch=None) -> RolloutEngine:
    options = {"window": 4} if name == "snapkv" else {}
    comp = get_compressor(name, budget=10, step_length=4, **options) if name != "none" else get_compressor("none")
    engine = RolloutEngine(tiny, comp, fused=False, max_batch=max_batch)
    engine.update_weights(tiny.model, version=1)
    return engine


@pytest.mark.parametrize("name, max_batch", [("none", None), ("rkv", None), ("snapkv", 4), ("h2o", 2)])
def test_segments_with_the_same_weights_sample_what_one_generate_samples(tiny, name, max_batch):
    whole = _engine(tiny, name, max_batch).generate(PROMPTS, PARAMS)
    rollout = SegmentedRollout(_engine(tiny, name, max_batch), PROMPTS, PARAMS)
    while not rollout.advance(5):
        pass
    out = rollout.output()
    assert rollout.segments == 5  # 24 decode steps at most, 5 at a time
    assert out.response_ids == whole.response_ids and out.finish_reason == whole.finish_reason
    assert out.sampler_logprobs == whole.sampler_logprobs  # bit-identical: the same steps in the same order
    assert out.kv_tokens_kept == whole.kv_tokens_kept and out.kv.compressions == whole.kv.compressions
    assert out.token_versions == [[1] * len(r) for r in out.response_ids]


def _perturbed(tiny, scale: float) -> dict:
    return {k: v * scale if v.dim() == 2 else v for k, v in tiny.model.state_dict().items()}


@pytest.mark.parametrize("name", ["none", "rkv"])
def test_weights_loaded_between_segments_draw_the_tokens_after_and_each_token_records_its_push(tiny, name):
    """Segment 1 runs 6 decode steps with push 1: tokens 0-6 come from its logits (the 6th step computed token
    6's); the responses then go on with push 2's weights. The same load of push 1's own weights under a new number
    changes no token, only the numbers recorded; other weights change the tokens after the load and none before."""
    engine = _engine(tiny, name)
    reference = engine.generate(PROMPTS, PARAMS)
    for state, same in ((tiny.model.state_dict(), True), (_perturbed(tiny, 1.5), False)):
        engine = _engine(tiny, name)
        rollout = SegmentedRollout(engine, PROMPTS, PARAMS)
        assert not rollout.advance(6)
        engine.update_weights(state, version=2)
        assert rollout.advance()
        out = rollout.output()
        for r, versions in enumerate(out.token_versions):
            n = len(out.response_ids[r])
            assert versions == [1] * min(n, 7) + [2] * max(0, n - 7), r
        for got, ref in zip(out.response_ids, reference.response_ids):
            assert got[:7] == ref[:7]
        if same:
            assert out.response_ids == reference.response_ids and out.sampler_logprobs == reference.sampler_logprobs
        else:
            long_rows = [r for r, ids in enumerate(reference.response_ids) if len(ids) > 8]
            assert long_rows and any(out.response_ids[r][7:] != reference.response_ids[r][7:] for r in long_rows)


def test_unnumbered_weights_record_no_versions_and_bad_calls_are_refused(tiny):
    engine = RolloutEngine(tiny, get_compressor("none"), fused=False)
    assert engine.generate(PROMPTS, PARAMS).token_versions is None
    rollout = SegmentedRollout(engine, PROMPTS, PARAMS)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        rollout.advance(0)
    rollout.advance(2)
    with pytest.raises(RuntimeError, match="still running"):
        rollout.output()
    with pytest.raises(ValueError, match="no prompts given"):
        SegmentedRollout(engine, [], PARAMS)


def test_alpha_from_kept_head_inputs_reads_each_token_with_the_head_of_the_push_that_drew_it(tiny):
    """A partial rollout drawn by pushes 1 and 2 with its head inputs and its q kept: q recomputed from the head
    inputs, each token by its own push's head (``hidden_alpha_by_push``), gives the α of the q the sampler drew
    from (``recorded_alpha``); one head for every token does not."""
    import dataclasses

    import torch

    from sparserl.mismatch.exact_alpha import hidden_alpha, hidden_alpha_by_push, recorded_alpha

    params = dataclasses.replace(PARAMS, keep_hidden=True, keep_distributions=True)
    engine = _engine(tiny, "rkv")
    rollout = SegmentedRollout(engine, PROMPTS, params)
    rollout.advance(6)
    other = _perturbed(tiny, 1.5)
    engine.update_weights(other, version=2)
    rollout.advance()
    out = rollout.output()
    assert {v for vs in out.token_versions for v in vs} == {1, 2}
    heads = {1: _engine(tiny, "rkv"), 2: _engine(tiny, "rkv")}
    heads[2].update_weights(other, version=2)
    g = torch.Generator().manual_seed(0)
    N, T = len(out.response_ids), max(len(r) for r in out.response_ids)
    hidden = torch.randn(N, T, out.hidden[0].shape[-1], generator=g)  # any p will do: both sides read the same
    weight = torch.randn(out.distributions[0].shape[-1], hidden.shape[-1], generator=g) * 0.2
    want = recorded_alpha(out.distributions, hidden, weight, 1.0)
    got = hidden_alpha_by_push(heads.__getitem__, out.hidden, out.token_versions, params, hidden, weight, 1.0)
    assert torch.allclose(got, want, atol=1e-5)
    one_head = hidden_alpha(heads[1], out.hidden, params, hidden, weight, 1.0)
    assert torch.allclose(one_head[:, :7], want[:, :7], atol=1e-5)  # tokens 0-6: push 1 drew them
    assert (one_head - want)[:, 7:].abs().max() > 1e-3  # the tokens after the load need push 2's head
