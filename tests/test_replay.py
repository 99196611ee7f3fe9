"""The replay (:mod:`sparserl.mismatch.replay`) re-runs the sampler on its own tokens, forced, and its
log-probs of those tokens equal the sampler's recorded ones: for every compressor (the cache evolves as
it did: same evictions), with int8 KV, and with each weight quantization. The distributions the sampler
keeps while it samples (``keep_distributions``, what the exact α reads instead of a replay) are the ones
the replay hands over."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, build_compressor
from sparserl.rollout.quant import available_quants
from sparserl.mismatch.replay import replay
from sparserl.rollout.sampling import SamplingParams

PROMPTS = [[{"role": "user", "content": "What is 3 + 5? Think step by step."}],
           [{"role": "user", "content": "Name a prime number larger than ten, then another one."}]]


def _params(**kw):
    return SamplingParams(n=3, max_new_tokens=24, temperature=1.0, seed=7, **kw)


def _check_replay(engine, params):
    out = engine.generate(PROMPTS, params)
    seen = {}

    def on_step(t, rows, logprobs):
        for r, lp in zip(rows.tolist(), logprobs):
            seen[(r, t)] = lp

    again = replay(engine, out.prompt_ids, out.response_ids, params, on_step)
    assert again.response_ids == out.response_ids and again.finish_reason == out.finish_reason
    assert again.kv_tokens_kept == out.kv_tokens_kept  # the cache evolved as it did
    for i, (a, b) in enumerate(zip(out.sampler_logprobs, again.sampler_logprobs)):
        assert torch.tensor(a).sub(torch.tensor(b)).abs().max() <= 1e-5, i
        for t, tok in enumerate(out.response_ids[i]):  # each step's whole distribution was handed over
            assert abs(float(seen[(i, t)][tok]) - a[t]) <= 1e-5
    assert len(seen) == sum(map(len, out.response_ids))
    kept = engine.generate(PROMPTS, dataclasses.replace(params, keep_distributions=True))
    assert kept.response_ids == out.response_ids and out.distributions is None  # keeping changes no draw
    assert [d.shape[0] for d in kept.distributions] == [len(r) for r in out.response_ids]
    for i, dists in enumerate(kept.distributions):
        for t in range(dists.shape[0]):
            torch.testing.assert_close(dists[t], seen[(i, t)].to(dists.dtype), atol=1e-5, rtol=0)
    return out


@pytest.mark.parametrize("name", available_compressors())
def test_replay_equals_the_sampler_for_every_compressor(tiny, name):
    if name == "blocktopk":  # 3 pages of 16 tokens read in the tiny model's layer 1
        comp = build_compressor(name, kv_budget=48, options={"dense_layers": 1})
    else:
        comp = build_compressor(name, kv_budget=12, step_length=3, window=4) if name != "none" else build_compressor("none")
    engine = RolloutEngine(tiny, comp, dtype="float32")
    reading = []
    engine.step_hook = lambda event, cache=None, **kw: reading.append(cache.selector.reading) if (
        event == "after_decode" and cache.selector is not None) else None
    out = _check_replay(engine, _params())
    if comp.evicts:
        assert out.kv.compressions > 0  # the replay had evictions to reproduce
    if comp.selects_per_step:
        assert any(reading) and not all(reading)  # pages were chosen (once the sequences outgrew 3 pages)


def test_replay_with_int8_kv_and_rows_ending_early_and_small_batches(tiny):
    engine = RolloutEngine(tiny, build_compressor("rkv", kv_budget=12, step_length=3, window=4), dtype="float32",
                           kv_quant="int8", max_batch=4)
    _check_replay(engine, _params(top_k=50))


@pytest.mark.parametrize("quant", [q for q in available_quants() if q != "none"])
def test_replay_equals_the_sampler_with_each_weight_quantization(tiny, quant):
    engine = RolloutEngine(tiny, build_compressor("snapkv", kv_budget=12, step_length=3, window=4), dtype="float32", quant=quant)
    _check_replay(engine, _params())


def test_forced_tokens_must_match_the_responses(tiny):
    engine = RolloutEngine(tiny, build_compressor("none"), dtype="float32")
    with pytest.raises(ValueError, match="forced: 1 token lists for 2 responses"):
        engine.generate([], SamplingParams(n=1, max_new_tokens=4), prompt_ids=[[1, 2], [3, 4]], forced=[[5]])
