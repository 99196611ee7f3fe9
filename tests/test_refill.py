"""Rows that end free their place for a waiting one (the eager engine's continuous batching,
``RolloutEngine._batch_steps(slots=...)``, used by partial rollouts through ``SegmentedRollout``): a rollout of 6
responses on 3 places samples what one batch of 6 samples, for every cache, never holds more than 3 rows, and
starts a waiting row while another still runs; the joined caches (``CompressedKVCache.append``) hold what one
cache of all the rows holds; a recomputed cache after a load serves rows of different lengths."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_segmented import LONG_PROMPTS, PARAMS, PROMPTS, _engine, _perturbed, _teacher_forced_logprobs

from sparserl.rollout.cache import CompressedKVCache
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.segmented import SegmentedRollout

# "k" ends most responses of the tiny random model before their 24th token, each at its own step
STOPPING = dataclasses.replace(PARAMS, stop=["k"])


def _live_rows(engine) -> list[list[int]]:
    """Records the rows each decode step runs (the engine's step hook)."""
    seen: list[list[int]] = []
    engine.step_hook = lambda event, rows, **_: seen.append(rows.tolist()) if event == "before_decode" else None
    return seen


@pytest.mark.parametrize(
    "name, kv_quant",
    [("none", "none"), ("rkv", "none"), ("snapkv", "none"), ("h2o", "none"), ("blocktopk", "none"), ("rkv", "int8")],
)
def test_three_places_sample_what_one_batch_of_six_samples(tiny, name, kv_quant):
    prompts = LONG_PROMPTS if name == "blocktopk" else PROMPTS
    whole = _engine(tiny, name, kv_quant=kv_quant).generate(prompts, STOPPING)
    engine = _engine(tiny, name, max_batch=3, kv_quant=kv_quant)
    seen = _live_rows(engine)
    rollout = SegmentedRollout(engine, prompts, STOPPING)
    while not rollout.advance(3):
        pass
    out = rollout.output()
    lengths = [len(r) for r in whole.response_ids]
    assert len(set(lengths)) > 1  # the rows end at different steps
    assert out.response_ids == whole.response_ids and out.finish_reason == whole.finish_reason
    for got, want in zip(out.sampler_logprobs, whole.sampler_logprobs):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)
    assert out.kv_tokens_kept == whole.kv_tokens_kept
    assert out.token_versions == [[1] * n for n in lengths]
    assert max(len(rows) for rows in seen) == 3  # never more rows than places
    assert all(sorted(set(rows)) == sorted(rows) for rows in seen)
    first = {}
    for step, rows in enumerate(seen):
        for row in rows:
            first.setdefault(row, step)
    # a waiting row started beside rows that started before it and still run: the batch stayed full
    assert any(len({first[row] for row in rows}) > 1 for rows in seen)
    assert set().union(*map(set, seen)) == set(range(6))
    assert out.kv.bytes_peak < whole.kv.bytes_peak  # 3 rows' buffers at a time, not 6


@pytest.mark.parametrize("name", ["none", "rkv"])
def test_a_recomputed_cache_serves_rows_of_different_lengths(tiny, name):
    """Three places, rows of different lengths live when push 2 is loaded (a row that joined late is shorter):
    under ``kv=recompute`` the first token each row draws after the load is push 2's forward over its own prompt
    and tokens so far (its log-prob equals a dense teacher-forced one under push 2); kept, some are not."""
    other = _perturbed(tiny, 1.5)
    fresh = _engine(tiny, "none")
    fresh.update_weights(other, version=2)
    gaps = {}
    for kv in ("keep", "recompute"):
        engine = _engine(tiny, name, max_batch=3)
        rollout = SegmentedRollout(engine, PROMPTS, STOPPING, kv=kv)
        seen = _live_rows(engine)
        rollout.advance(4)
        engine.update_weights(other, version=2)
        rollout.advance()
        out = rollout.output()
        first = []
        for prompt, response, logp, versions in zip(
            out.prompt_ids, out.response_ids, out.sampler_logprobs, out.token_versions
        ):
            if 1 in versions and 2 in versions:  # drawn across the load
                i = versions.index(2)
                first.append(float((_teacher_forced_logprobs(fresh, prompt, response)[i] - logp[i]).abs()))
        assert len(first) >= 2
        gaps[kv] = max(first)
        assert any(set(rows) - {0, 1, 2} for rows in seen[:4])  # a row joined before the load
    assert gaps["recompute"] < 1e-4
    assert gaps["keep"] > 1e-3


def _cache(engine, prompts: list[list[int]], width: int, compressor) -> CompressedKVCache:
    ids, valid, positions = engine.left_padded(prompts, width=width)
    _, keys, values, queries, _, _ = engine.model.prefill(ids, valid, positions, compressor.window)
    return CompressedKVCache(keys, values, valid, positions, width + 24, compressor, engine.model.n_heads, queries)


def test_appended_caches_hold_what_one_cache_of_all_the_rows_holds(tiny):
    engine = _engine(tiny, "none")
    snapkv = get_compressor("snapkv", budget=10, window=4)
    prompts = [engine.encode(p) for p in PROMPTS]
    width = max(map(len, prompts))
    joined = _cache(engine, prompts[:2], width, snapkv)
    joined.q_head = 3  # as after three decode steps: the appended rows' oldest query must sit there too
    joined.q_ring = joined.q_ring.roll(3, dims=3)
    joined.append(_cache(engine, prompts[2:], width, snapkv))
    whole = _cache(engine, prompts, width, snapkv)
    for name in ("keys", "values", "pos", "lens", "start"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    assert joined.batch == 3 and joined._uniform_len == width
    assert torch.equal(joined._ordered_queries(slice(0, 2), None), whole._ordered_queries(slice(0, 2), None))


def test_appending_a_cache_of_another_shape_is_refused(tiny):
    engine = _engine(tiny, "none")
    dense = get_compressor("none")
    prompts = [engine.encode(p) for p in PROMPTS]
    a = _cache(engine, prompts[:1], 12, dense)
    with pytest.raises(ValueError, match="capacity, region_start"):
        a.append(_cache(engine, prompts[1:], 16, dense))
