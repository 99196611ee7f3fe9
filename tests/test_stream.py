"""The rollouts in flight as one batch (``sparserl.rollout.stream``, ``rollout.join_rollouts``): rollouts that share
the batch sample what each samples alone, for every cache, the later one's rows starting beside the tail of the
earlier one; a wider prompt widens the batch; each token records the push that drew it; and a replay of the calls
with the decode steps each run took samples the same tokens, even without the rollouts taken since."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_refill import STOPPING, _live_rows
from test_segmented import LONG_PROMPTS, PROMPTS, _engine, _perturbed

from sparserl.rollout.stream import RolloutStream

OTHER = ["Write a list: a b c", "hi", "Add 5 and 6 then say the sum"]


def _same(got, want, exact: bool = False) -> None:
    assert got.response_ids == want.response_ids and got.finish_reason == want.finish_reason
    for a, b in zip(got.sampler_logprobs, want.sampler_logprobs):
        if exact:
            assert a == b
        else:
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name, kv_quant",
    [("none", "none"), ("rkv", "none"), ("snapkv", "none"), ("h2o", "none"), ("blocktopk", "none"), ("rkv", "int8")],
)
def test_rollouts_sharing_a_batch_sample_what_each_samples_alone(tiny, name, kv_quant):
    prompts = LONG_PROMPTS if name == "blocktopk" else PROMPTS
    other = [p + " " + "and then some more words to read " * 8 for p in OTHER] if name == "blocktopk" else OTHER
    second = dataclasses.replace(STOPPING, seed=8)
    alone = _engine(tiny, name, kv_quant=kv_quant)
    want = alone.generate(prompts, STOPPING), alone.generate(other, second)
    engine = _engine(tiny, name, kv_quant=kv_quant)
    stream = RolloutStream(engine)
    seen = _live_rows(engine)
    assert stream.start("a", prompts, STOPPING, steps=5) == 5  # nothing started before: 5 decode steps exactly
    ran = stream.start("b", other, second, steps=5)  # until "a" has ended, 5 steps at least
    assert ran >= 5 and stream.done("a")
    got = stream.take("a"), stream.take("b")
    for g, w in zip(got, want):
        _same(g, w)
        assert g.kv_tokens_kept == w.kv_tokens_kept
    assert got[0].stream_steps == 0 < got[1].stream_steps  # "a" had ended; "b" ran its tail in take
    # a step ran rows of both rollouts (rows 6-11 are "b"'s), and one of them started while "a"'s tail still ran
    assert any(min(rows) < 6 <= max(rows) for rows in seen)
    assert stream.steps == 5 + ran + got[1].stream_steps
    assert stream.keys() == [] and stream.batch is None  # both out: the next rollout starts a batch of its own


@pytest.mark.parametrize("name", ["none", "rkv"])
def test_a_rollout_of_wider_prompts_widens_the_batch(tiny, name):
    """The second rollout's prompts are 60+ tokens, the first's under 15: the running rows' padding and cache grow
    in front (``CompressedKVCache.pad_front``) and every rollout samples what it samples alone."""
    engine, alone = _engine(tiny, name), _engine(tiny, name)
    second = dataclasses.replace(STOPPING, seed=8)
    want = alone.generate(PROMPTS, STOPPING), alone.generate(LONG_PROMPTS, second)
    stream = RolloutStream(engine)
    stream.start("a", PROMPTS, STOPPING, steps=3)
    narrow = stream.batch.P
    stream.start("b", LONG_PROMPTS, second, steps=3)
    assert stream.batch.P > narrow
    _same(stream.take("a"), want[0])
    _same(stream.take("b"), want[1])


def test_each_token_records_its_push_and_a_replay_of_the_runs_samples_the_same(tiny):
    """ "a" runs 6 decode steps with push 1 (tokens 0-6: the 6th step computed token 6's logits); push 2 loads and
    "b" joins, running until "a" has ended (10 more steps): "a"'s tokens 7-15 and all of "b"'s are push 2's. A new
    engine replaying the calls with those step counts samples the same bits; without "a" (taken before a fault),
    "b" samples the same tokens."""
    params = dataclasses.replace(STOPPING, stop=[], ignore_eos=True, max_new_tokens=16)
    second = dataclasses.replace(params, seed=8)
    pushed = _perturbed(tiny, 1.5)

    def run(with_a: bool):
        engine = _engine(tiny, "rkv")
        stream = RolloutStream(engine)
        if with_a:
            assert stream.start("a", PROMPTS, params, steps=6, exact=True) == 6
        engine.update_weights(pushed, version=2)
        ran = stream.start("b", OTHER, second, steps=10, exact=not with_a)
        return stream, ran

    stream, ran = run(with_a=True)
    assert ran == 10
    a, b = stream.take("a"), stream.take("b")
    assert a.token_versions == [[1] * 7 + [2] * 9] * 6 and b.token_versions == [[2] * 16] * 6
    assert stream.steps == 6 + 10 + 6  # "b" took its last 6 steps alone
    replay, _ = run(with_a=True)
    _same(replay.take("a"), a, exact=True)
    _same(replay.take("b"), b, exact=True)
    alone, ran = run(with_a=False)
    assert ran == 10
    out = alone.take("b")
    _same(out, b)
    assert out.token_versions == b.token_versions


def test_rollouts_that_sample_differently_cannot_share_a_batch(tiny):
    stream = RolloutStream(_engine(tiny, "none"))
    stream.start("a", PROMPTS, STOPPING, steps=2)
    with pytest.raises(ValueError, match="must sample as the others do"):
        stream.start("b", PROMPTS, dataclasses.replace(STOPPING, temperature=0.5), steps=2)
    with pytest.raises(ValueError, match="kv must be one of keep, recompute"):
        RolloutStream(_engine(tiny, "none"), kv="drop")


def test_a_run_without_steps_takes_every_rollout_to_its_end(tiny):
    """What a worker does when no rollout is sent after the ones in flight (``RolloutPool.finish_joined``)."""
    params = dataclasses.replace(STOPPING, stop=[], ignore_eos=True, max_new_tokens=16)
    stream = RolloutStream(_engine(tiny, "none"))
    assert stream.start("a", PROMPTS, params, steps=3, exact=True) == 3
    assert not stream.done("a")
    assert stream.run() == 13 and stream.done("a")  # 16 tokens: 16 decode steps in all
    assert stream.run() == 0 and stream.take("a").stream_steps == 0
