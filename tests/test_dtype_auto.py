"""``dtype: auto`` is measured: the faster of float32 and bfloat16 in a timed decode step, cached per
machine (CPU model and instruction sets, device, torch version, kernels) and measured again when one
of them changes; the engine, the bench's JSON and the run's config record what it chose and why."""

from __future__ import annotations

import json

import pytest
import torch

from sparserl.models import machine
from sparserl.models.loading import ModelLoadError, parse_dtype
from sparserl.rollout import dtype_auto, dtype_choice


@pytest.fixture
def cache(monkeypatch, tmp_path):
    path = tmp_path / "dtype_auto.json"
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: path)
    return path


def fake_timer(seconds: dict, calls: list):
    def timer(name):
        calls.append(name)
        return seconds[name]

    return timer


@pytest.mark.parametrize("fast", ["float32", "bfloat16"])
def test_a_faked_timing_picks_the_faster(cache, fast):
    slow = "bfloat16" if fast == "float32" else "float32"
    calls = []
    choice = dtype_auto.choose("cpu", timer=fake_timer({fast: 0.010, slow: 0.015}, calls), log=lambda *a: None)
    assert choice.dtype == fast and not choice.cached
    assert f"{fast} decode step is 1.50x {slow}'s" in choice.reason and "median of 3" in choice.reason
    assert sorted(calls) == sorted(["float32", "bfloat16"] * dtype_choice.ROUNDS)
    assert calls[:2] == ["float32", "bfloat16"] and calls[2:4] == ["bfloat16", "float32"]  # alternating order


def test_the_median_of_per_round_ratios_decides_not_one_slow_round(cache):
    """Round 1 of bfloat16 ran at a third of its speed (a busy machine); per-round ratios 3.0, 0.8, 0.8."""
    times = iter([1.0, 3.0, 0.8, 1.0, 1.0, 0.8])  # f32, bf16 | bf16, f32 | f32, bf16
    choice = dtype_auto.choose("cpu", timer=lambda name: next(times), log=lambda *a: None)
    assert choice.dtype == "bfloat16" and choice.ratio_rounds == [3.0, 0.8, 0.8]


def test_the_answer_is_cached_and_measured_again_when_the_cpu_or_torch_changes(cache, monkeypatch):
    calls = []
    timer = fake_timer({"float32": 1.0, "bfloat16": 2.0}, calls)
    first = dtype_auto.choose("cpu", timer=timer, log=lambda *a: None)
    assert first.dtype == "float32" and len(calls) == 6
    again = dtype_auto.choose("cpu", timer=timer, log=lambda *a: None)
    assert again.cached and again.dtype == "float32" and len(calls) == 6  # read back, not re-measured
    assert json.loads(cache.read_text())[first.key]["reason"] == first.reason

    monkeypatch.setattr(machine, "cpu_name", lambda: "Intel(R) Xeon(R) Platinum 8480+")  # another CPU
    other = dtype_auto.choose("cpu", timer=fake_timer({"float32": 2.0, "bfloat16": 1.0}, calls), log=lambda *a: None)
    assert other.dtype == "bfloat16" and not other.cached and len(calls) == 12 and other.key != first.key
    monkeypatch.undo()
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: cache)
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")  # another torch
    assert not dtype_auto.choose("cpu", timer=timer, log=lambda *a: None).cached and len(calls) == 18
    assert len(json.loads(cache.read_text())) == 3  # one answer per machine key, all kept


def test_the_key_names_the_cpu_its_instruction_sets_torch_and_kernels(monkeypatch):
    monkeypatch.setattr(machine, "cpu_name", lambda: "Some CPU")
    monkeypatch.setattr(machine, "isa", lambda: ["avx2", "amx_bf16"])
    key = dtype_auto.machine_key(torch.device("cpu"))
    assert key.startswith("cpu:Some CPU [avx2 amx_bf16]") and f"torch {torch.__version__}" in key
    monkeypatch.setenv("SPARSERL_NATIVE", "0")
    assert "kernels torch" in dtype_auto.machine_key(torch.device("cpu")) != key


def test_an_unreadable_cache_is_measured_again(cache):
    cache.write_text("{not json")
    choice = dtype_auto.choose("cpu", timer=fake_timer({"float32": 1.0, "bfloat16": 2.0}, []), log=lambda *a: None)
    assert choice.dtype == "float32" and json.loads(cache.read_text())[choice.key]["dtype"] == "float32"


def test_engine_resolves_auto_and_records_why(tiny, cache):
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor

    dtype_auto.choose("cpu", timer=fake_timer({"float32": 2.0, "bfloat16": 1.0}, []), log=lambda *a: None)
    engine = RolloutEngine(tiny, build_compressor("none"), dtype="auto")
    assert engine.dtype == torch.bfloat16 and engine.dtype_choice.cached and engine.dtype_choice.dtype == "bfloat16"
    assert RolloutEngine(tiny, build_compressor("none"), dtype="float32").dtype_choice is None
    assert dtype_auto.resolve_dtype("auto", "cpu") == torch.bfloat16
    with pytest.raises(ModelLoadError, match="resolve_dtype"):
        parse_dtype("auto")  # the learner's dtype has no auto: it is its own option


def test_the_real_measurement_times_both_dtypes(cache, monkeypatch):
    """The engine's own decode step on the probe model, cut to 1 round of 2 steps (a few seconds): timed in
    this process, where the cut applies (a run times in a child process: tests/test_memory_main_job.py)."""
    monkeypatch.setattr(dtype_choice, "ROUNDS", 1)
    monkeypatch.setattr(dtype_choice, "STEPS", 2)
    monkeypatch.setattr(dtype_choice, "run_apart", lambda fn, *args: fn(*args))
    choice = dtype_auto.choose("cpu", log=lambda *a: None)
    assert choice.dtype in ("float32", "bfloat16")
    assert all(s > 0 for s in choice.seconds_per_step.values()) and len(choice.ratio_rounds) == 1


def test_the_run_config_records_what_auto_chose(cache, tmp_path):
    from test_train import TINY

    from sparserl.config import load_config, validate
    from sparserl.train.trainer import train

    dtype_auto.choose("cpu", timer=fake_timer({"float32": 1.0, "bfloat16": 3.0}, []), log=lambda *a: None)
    overrides = [o for o in TINY if not o.startswith("rollout.dtype=")]
    cfg = validate(
        load_config(
            "sparse_rl_fixed40",
            [*overrides, "rollout.dtype=auto", "train.steps=1", "checkpoint.every=0", f"log.out_dir={tmp_path}"],
        )
    )
    lines = []
    run = train(cfg, run_dir=tmp_path / "run", log=lines.append)
    text = (run / "config.yaml").read_text()
    assert "# rollout.dtype: auto -> float32 on this machine: measured: a float32 decode step is 3.00x" in text
    assert any("auto -> float32" in str(line) for line in lines)
    assert validate(load_config(str(run / "config.yaml"))).rollout.dtype == "auto"  # the comment reads back as one
