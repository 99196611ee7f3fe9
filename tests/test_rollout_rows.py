"""The rollout batch that grows with the KV saved (sparserl.memory.rollout_rows): one response's buffers at the
compressor's capacity, the rows that fit a device's free memory, and the engine splitting a rollout by it."""

from __future__ import annotations

import pytest

from sparserl.config import load_config
from sparserl.cost.shapes import model_shape
from sparserl.memory.predict import predict_peak, rollout_row_bytes
from sparserl.memory.rollout_rows import device_rows_that_fit, engine_row_bytes, rows_that_fit
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.sampling import SamplingParams


def test_rows_that_fit_is_the_free_memory_over_a_rows_buffers():
    assert rows_that_fit(1000, 100_000, margin=0.1) == 90
    assert rows_that_fit(10**9, 10, margin=0.1) == 1  # never 0: one row is what the batch can shrink to
    with pytest.raises(ValueError, match="row_bytes"):
        rows_that_fit(0, 100)


def test_a_bounded_cache_lets_more_rows_fit_at_length():
    """SmolLM2-135M in bfloat16 at 4,096 new tokens: a dense row holds its whole cache, an R-KV row (budget 256,
    step 32) 288 slots, so an H200's 139 GB holds several times more R-KV rows (what Sparse-RL's table promises)."""
    shape = model_shape("smollm2-135m", "bfloat16")
    dense = sum(rollout_row_bytes(shape, get_compressor("none"), 100, 4096, "bfloat16", "none").values())
    rkv = get_compressor("rkv", budget=256, step_length=32)
    bounded = sum(rollout_row_bytes(shape, rkv, 100, 4096, "bfloat16", "none").values())
    free = 139 * 10**9
    assert rows_that_fit(bounded, free) >= 4 * rows_that_fit(dense, free)
    int8 = sum(rollout_row_bytes(shape, rkv, 100, 4096, "bfloat16", "int8").values())
    assert rows_that_fit(int8, free) > rows_that_fit(bounded, free)


def test_the_row_is_the_memory_predictions_rollout_station_per_response():
    cfg = load_config("default", ["rollout.dtype=bfloat16"])
    shape = model_shape("smollm2-135m", "bfloat16")
    prediction = predict_peak(cfg, shape, 80)
    n = cfg.train.prompts_per_step * cfg.rollout.n
    station = prediction.stations["rollout"]
    for part in ("KV cache", "prefill layer", "sampling buffers"):
        assert part in station
    row = rollout_row_bytes(shape, get_compressor("none"), 80, cfg.rollout.max_new_tokens, "bfloat16", "none")
    assert row["sampling buffers"] * n == station["sampling buffers"]
    assert row["prefill layer"] * n == station["prefill layer"]


def test_the_engine_splits_a_rollout_into_the_rows_that_fit(tiny, monkeypatch):
    engine = RolloutEngine(tiny, get_compressor("rkv", budget=12, step_length=4))
    assert device_rows_that_fit(engine, 10, 32) is None  # a CPU engine: preflight's business
    assert engine_row_bytes(engine, 10, 32) > 0
    params = SamplingParams(n=4, max_new_tokens=12, seed=3)
    whole = engine.generate(["hello there", "one two three"], params)
    asked = []
    engine.max_batch = lambda longest, max_new: asked.append((longest, max_new)) or 3
    sizes = []
    original = engine._generate_batch

    def spy(prompts, *a, **k):
        sizes.append(len(prompts))
        return original(prompts, *a, **k)

    monkeypatch.setattr(engine, "_generate_batch", spy)
    split = engine.generate(["hello there", "one two three"], params)
    assert sizes == [3, 3, 2] and engine.last_batch_rows == 3
    assert asked == [(max(len(p) for p in whole.prompt_ids), 12)]
    assert split.response_ids == whole.response_ids  # each response's draws are its own: the split changes nothing
