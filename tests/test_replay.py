"""The replay (:mod:`sparserl.mismatch.replay`) re-runs the sampler on its own tokens, forced, and its
log-probs of those tokens equal the sampler's recorded ones: for every compressor (the cache evolves as
it did: same evictions), with int8 KV, and with each weight quantization. The distributions the sampler
keeps while it samples (``keep_distributions``, what the exact α reads instead of a replay) are the ones
the replay hands over."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparserl.mismatch.replay import replay
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, build_compressor
from sparserl.rollout.quant import available_quants
from sparserl.rollout.sampling import SamplingParams

PROMPTS = [
    [{"role": "user", "content": "What is 3 + 5? Think step by step."}],
    [{"role": "user", "content": "Name a prime number larger than ten, then another one."}],
]


def _params(**kw):
    return SamplingParams(n=3, max_new_tokens=24, temperature=1.0, seed=7, **kw)


#: the replay's seed differs from the sampler's: forced tokens make the draws irrelevant, so the replay must
#: not depend on them (with the sampler's own seed, a replay that sampled afresh would redraw the same tokens)
REPLAY_SEED = 12345


def _replay_logprobs(engine, out, params) -> tuple[object, dict]:
    """Replay ``out`` (sampled with ``params``) with another seed; returns its output and, for every step it
    ran, the log-prob its distribution gives the recorded token: {(response, step): log-prob}."""
    seen = {}

    def on_step(t, rows, logprobs):
        for r, lp in zip(rows.tolist(), logprobs):
            if t < len(out.response_ids[r]):
                seen[(r, t)] = float(lp[out.response_ids[r][t]])

    again = replay(engine, out.prompt_ids, out.response_ids, dataclasses.replace(params, seed=REPLAY_SEED), on_step)
    return again, seen


def _worst_gap(out, seen) -> float:
    """The largest |replayed - recorded| log-prob of a recorded token (inf when a token was never scored)."""
    if len(seen) != sum(map(len, out.response_ids)):
        return float("inf")
    return max(abs(lp - out.sampler_logprobs[i][t]) for (i, t), lp in seen.items())


def _check_replay(engine, params):
    out = engine.generate(PROMPTS, params)
    seen = {}

    def on_step(t, rows, logprobs):
        for r, lp in zip(rows.tolist(), logprobs):
            seen[(r, t)] = lp

    again = replay(engine, out.prompt_ids, out.response_ids, dataclasses.replace(params, seed=REPLAY_SEED), on_step)
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
    if name == "blocktopk":  # the longest prompt's pages and one more, read in layer 1 (16 tokens a page)
        longest = max(len(RolloutEngine(tiny, build_compressor("none")).encode(p)) for p in PROMPTS)
        budget = 16 * (longest // 16 + 1)  # 48 with SmolLM2's tokenizer, more with the byte-level one
        assert longest + _params().max_new_tokens > budget  # the sequences outgrow it while they decode
        comp = build_compressor(name, kv_budget=budget, options={"dense_layers": 1})
    else:
        comp = (
            build_compressor(name, kv_budget=12, step_length=3, window=4)
            if name != "none"
            else build_compressor("none")
        )
    engine = RolloutEngine(tiny, comp, dtype="float32")
    reading = []
    engine.step_hook = lambda event, cache=None, **kw: (
        reading.append(cache.selector.reading) if (event == "after_decode" and cache.selector is not None) else None
    )
    out = _check_replay(engine, _params())
    if comp.evicts:
        assert out.kv.compressions > 0  # the replay had evictions to reproduce
    if comp.selects_per_step:
        assert any(reading) and not all(reading)  # pages were chosen (once the sequences outgrew the budget)


def test_replay_with_int8_kv_and_rows_ending_early_and_small_batches(tiny):
    engine = RolloutEngine(
        tiny,
        build_compressor("rkv", kv_budget=12, step_length=3, window=4),
        dtype="float32",
        kv_quant="int8",
        max_batch=4,
    )
    _check_replay(engine, _params(top_k=50))


@pytest.mark.parametrize("quant", [q for q in available_quants() if q != "none"])
def test_replay_equals_the_sampler_with_each_weight_quantization(tiny, quant):
    engine = RolloutEngine(
        tiny, build_compressor("snapkv", kv_budget=12, step_length=3, window=4), dtype="float32", quant=quant
    )
    _check_replay(engine, _params())


def test_forced_tokens_must_match_the_responses(tiny):
    engine = RolloutEngine(tiny, build_compressor("none"), dtype="float32")
    with pytest.raises(ValueError, match="forced: 1 token lists for 2 responses"):
        engine.generate([], SamplingParams(n=1, max_new_tokens=4), prompt_ids=[[1, 2], [3, 4]], forced=[[5]])


def test_a_replay_that_ignores_the_forced_tokens_fails_the_check(tiny, monkeypatch):
    """The check has teeth: an engine that drops ``forced`` samples afresh with the replay's seed, and the
    log-probs its distributions give the recorded tokens differ from the sampler's (beyond the first step,
    conditioned on other prefixes), where the real replay matches them within 1e-5."""
    engine = RolloutEngine(tiny, build_compressor("rkv", kv_budget=12, step_length=3, window=4), dtype="float32")
    params = _params()
    out = engine.generate(PROMPTS, params)
    again, seen = _replay_logprobs(engine, out, params)
    assert again.response_ids == out.response_ids and _worst_gap(out, seen) <= 1e-5
    generate = engine.generate
    monkeypatch.setattr(engine, "generate", lambda *a, forced=None, **kw: generate(*a, **kw))
    ignored, seen = _replay_logprobs(engine, out, params)
    assert ignored.response_ids != out.response_ids
    assert _worst_gap(out, seen) > 0.1
