"""The decode-step profiler (``python -m sparserl.rollout.profile``): its parts add up to the decode
time, a part called inside another counts once, for the outer one, and the quantized sampler is profiled when asked."""

import time

import pytest

from sparserl.rollout import profile as profile_mod


def test_nested_parts_count_once():
    acc, stack = {"outer": 0.0, "inner": 0.0}, []

    def inner():
        time.sleep(0.02)

    wrapped_inner = profile_mod._timed(inner, "inner", acc, stack, lambda: None)

    def outer():
        time.sleep(0.01)
        wrapped_inner()
        wrapped_inner()

    profile_mod._timed(outer, "outer", acc, stack, lambda: None)()
    assert acc["outer"] >= 0.05 and acc["inner"] == 0.0  # the inner calls count for the outer part
    wrapped_inner()
    assert acc["inner"] >= 0.02 and stack == []


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("fused", [True, False])
def test_profile_splits_the_decode_time(tiny, quant, fused):
    r = profile_mod.profile(
        batch=4,
        max_new_tokens=12,
        compressor="rkv",
        kv_budget=8,
        step_length=2,
        window=2,
        quant=quant,
        loaded=tiny,
        fused=fused,
    )
    parts = r["split_seconds"]
    # the fused step's layers are one part; the eager step's split into products and attention
    layer_parts = ("layers",) if fused else ("matmul", "attention")
    assert {*layer_parts, "lm_head", "compression", "sampling", "other"} <= set(parts)
    assert all(parts.get(k, 0.0) == 0.0 for k in {"matmul", "attention", "layers"} - set(layer_parts))
    decode = r["seconds"] - r["prefill_seconds"]
    assert sum(parts.values()) == pytest.approx(decode)
    assert all(parts[k] > 0 for k in (*layer_parts, "lm_head", "compression", "sampling"))
    assert r["quant"] == quant and r["compressions"] > 0 and r["decode_steps"] == 12 and r["fused"] == fused
    assert r["tokens"] == 4 * 12


def test_profile_cli_prints_the_split(tiny, monkeypatch, capsys):
    monkeypatch.setattr("sparserl.models.loading.load_model", lambda *a, **kw: tiny)
    assert profile_mod.main(["--model", "tiny", "--batch", "2", "--max-new-tokens", "4", "--quant", "int8"]) == 0
    out = capsys.readouterr().out
    assert "w:int8 kv:none" in out and "ms/step:" in out and "lm_head" in out
