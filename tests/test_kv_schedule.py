"""Sparrow's sparsity schedule (:mod:`sparserl.rollout.kv.schedule`): the budget follows the sequence
length, the cache's buffers hold the largest budget, each row is compressed to its own length's budget,
the replay reproduces a scheduled sampler, and bad schedules fail with one clear line."""

from __future__ import annotations

import json

import pytest
import torch

from sparserl.config import ConfigError, load_config, validate
from sparserl.mismatch.replay import replay
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.kv.base import CompressorOptionError
from sparserl.rollout.kv.schedule import KVSchedule, ScheduleError, load_schedule
from sparserl.rollout.sampling import SamplingParams


def test_budget_for_is_piecewise_constant():
    s = KVSchedule.from_pairs([[16, 8], [40, 24], [100, 32]])
    assert [s.budget_for(n) for n in (0, 15, 16, 39, 40, 99, 100, 5000)] == [8, 8, 8, 8, 24, 24, 32, 32]
    lengths = torch.tensor([0, 15, 16, 39, 40, 99, 100, 5000])
    assert s.budget_for(lengths).tolist() == [8, 8, 8, 8, 24, 24, 32, 32]
    assert (s.max_budget, s.min_budget, s.pairs) == (32, 8, [[16, 8], [40, 24], [100, 32]])


@pytest.mark.parametrize(
    "pairs, match",
    [
        ([], "non-empty"),
        ([[0, 8], [0, 16]], r"\[1\]: lengths must increase strictly"),
        ([[0, 8], [10, 0]], r"\[1\]: budget 0 must be >= 1"),
        ([[-1, 8]], "length -1 must be >= 0"),
        ([[0, 8, 3]], r"\[0\]: expected a pair"),
        ([[0, 8.5]], "pair of integers"),
        ("0:8", "list of"),
    ],
)
def test_bad_pairs_are_named(pairs, match):
    with pytest.raises(ScheduleError, match=match):
        KVSchedule.from_pairs(pairs)


def test_load_schedule_from_files(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("[[0, 16], [64, 32]]")
    assert load_schedule(str(plain)).pairs == [[0, 16], [64, 32]]
    calib = tmp_path / "calib.json"
    calib.write_text(
        json.dumps(
            {
                "rows": [],
                "schedules": [
                    {"compressor": "rkv", "threshold": 0.86, "budget_by_bin": [[0, 32], [128, 64]]},
                    {"compressor": "snapkv", "threshold": 0.86, "budget_by_bin": [[0, 64]]},
                ],
            }
        )
    )
    assert load_schedule(str(calib), "snapkv").pairs == [[0, 64]]
    with pytest.raises(ScheduleError, match="no schedule for compressor 'h2o'; it has: rkv, snapkv"):
        load_schedule(str(calib), "h2o")
    with pytest.raises(ScheduleError, match="2 schedules match"):
        load_schedule(str(calib))
    bad = tmp_path / "bad.json"
    bad.write_text("[[0, 16],\n [64 32]]")
    with pytest.raises(ScheduleError, match=r"bad\.json:2: not valid JSON"):
        load_schedule(str(bad))
    with pytest.raises(ScheduleError, match="not found"):
        load_schedule(str(tmp_path / "missing.json"))


def test_compressor_takes_a_schedule_and_sizes_buffers_to_its_largest():
    c = build_compressor("rkv", kv_schedule=[[0, 8], [50, 24]], step_length=4, window=2)
    assert c.budget == 24 and c.smallest_budget == 8
    assert c.capacity(30, 100) == 30 + 24 + 4  # prompt kept whole + largest budget + period
    region = torch.tensor([12, 12, 28, 27])
    seq_len = torch.tensor([40, 40, 60, 60])
    assert c.due(region, seq_len=seq_len).tolist() == [True, True, True, False]
    with pytest.raises(CompressorOptionError, match="must be larger than the observation window"):
        build_compressor("rkv", kv_schedule=[[0, 2], [50, 24]], window=2)
    h2o = build_compressor("h2o", kv_schedule=[[0, 8], [50, 24]])
    assert h2o.window == 4  # half the smallest budget


def _track(engine, schedule, step_length):
    """Record, before each decode step, every row's compressible-region length against its budget."""
    seen = []

    def hook(event, cache=None, positions=None, **_):
        if event == "before_decode":
            seen.append((cache.region_len().clone(), positions.clone()))

    engine.step_hook = hook
    return seen


def test_the_cache_follows_the_schedule_row_by_row(tiny):
    step_length = 3
    sched = KVSchedule.from_pairs([[0, 6], [40, 14]])
    comp = build_compressor("snapkv", kv_schedule=sched.pairs, step_length=step_length, window=2)
    engine = RolloutEngine(tiny, comp, dtype="float32")
    seen = _track(engine, sched, step_length)
    # prompts of different lengths: at one decode step the rows sit at different sequence lengths
    prompts = [list(range(5, 25)), list(range(5, 33))]
    params = SamplingParams(n=2, max_new_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    out = engine.generate([], params, prompt_ids=prompts)
    assert out.kv.compressions > 0
    region_budgets = set()
    for region, positions in seen:
        budget = sched.budget_for(positions)
        assert (region < budget + step_length).all()  # never past the row's own budget + period
        region_budgets.update(region[region == budget - 0].tolist())
    # rows were compressed down to both budgets: 6 below length 40, 14 from there on
    assert {6, 14} <= {int(r) for region, _ in seen for r in region}
    fixed = RolloutEngine(
        tiny, build_compressor("snapkv", kv_budget=14, step_length=step_length, window=2), dtype="float32"
    ).generate([], params, prompt_ids=prompts)
    # the same buffers as the largest fixed budget
    assert out.kv.bytes_peak == fixed.kv.bytes_peak
    assert out.kv.compressions > fixed.kv.compressions  # the small early budget fills sooner


def test_replay_reproduces_a_scheduled_sampler(tiny):
    comp = build_compressor("rkv", kv_schedule=[[0, 8], [30, 12]], step_length=3, window=4)
    engine = RolloutEngine(tiny, comp, dtype="float32")
    params = SamplingParams(n=3, max_new_tokens=24, temperature=1.0, seed=7)
    prompts = [list(range(5, 20)), list(range(7, 30))]
    out = engine.generate([], params, prompt_ids=prompts)
    again = replay(engine, out.prompt_ids, out.response_ids, params)
    assert again.kv_tokens_kept == out.kv_tokens_kept
    for a, b in zip(out.sampler_logprobs, again.sampler_logprobs):
        assert torch.tensor(a).sub(torch.tensor(b)).abs().max() <= 1e-5


def test_config_schedule_inline_and_from_file(tmp_path):
    cfg = validate(load_config("sparse_rl_fixed40", ["rollout.kv_schedule=[[0, 24], [96, 40]]"]))
    assert cfg.rollout.kv_schedule == [[0, 24], [96, 40]]
    f = tmp_path / "s.json"
    f.write_text('{"budget_by_bin": [[0, 24], [96, 40]]}')
    validate(load_config("sparse_rl_fixed40", [f"rollout.kv_schedule={f}"]))
    with pytest.raises(ConfigError, match=r"rollout.kv_schedule.*lengths must increase strictly; 96 follows 96"):
        load_config("sparse_rl_fixed40", ["rollout.kv_schedule=[[96, 24], [96, 40]]"])
    with pytest.raises(ConfigError, match=r"rollout.kv_schedule: file '.*nope.json' not found"):
        validate(load_config("sparse_rl_fixed40", [f"rollout.kv_schedule={tmp_path / 'nope.json'}"]))
    with pytest.raises(ConfigError, match="must be larger than the observation window"):
        validate(load_config("sparse_rl_fixed40", ["rollout.kv_schedule=[[0, 4], [96, 40]]"]))


def test_min_new_tokens_keeps_generating_past_eos(tiny):
    """``min_new_tokens`` (calibrate's long bins): EOS does not end a response shorter than it."""
    engine = RolloutEngine(tiny, build_compressor("none"), dtype="float32")
    greedy = SamplingParams(n=1, max_new_tokens=10, temperature=0.0)
    first = engine.generate([], greedy, prompt_ids=[list(range(5, 15))]).response_ids[0][0]
    engine.eos_ids = {first}  # the greedy first token ends the response at once
    assert engine.generate([], greedy, prompt_ids=[list(range(5, 15))]).response_ids[0] == [first]
    longer = SamplingParams(n=1, max_new_tokens=10, temperature=0.0, min_new_tokens=6)
    out = engine.generate([], longer, prompt_ids=[list(range(5, 15))])
    assert len(out.response_ids[0]) >= 6 and out.response_ids[0][0] == first
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5).validate()
