"""Where a CPU runs two bf16 kernels (AMX tiles and AVX512-BF16 on an AMX Xeon), the bf16 sampler runs
the one measured faster on its decode step, not the one the library would guess: the
measurement (median of per-round ratios, cached per machine), the engine packing its weights for the
chosen kernel, an explicit kernel, and a CPU with one kernel measuring nothing. The second kernel is the
``-DSPARSERL_AMX_EMULATE`` build's AMX path (tests/test_native_bf16.py) where this CPU has no AMX."""

from __future__ import annotations

import json

import pytest
import torch

from sparserl.models.loading import load_model
from sparserl.rollout import bf16_kernel_choice, dtype_auto, dtype_choice, native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.model import NATIVE_BF16
from sparserl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")

QUIET = dict(log=lambda *a: None)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    path = tmp_path / "dtype_auto.json"
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: path)
    return path


@pytest.fixture(scope="module")
def emulated():
    """A build whose AMX path runs (its tile instructions in C) beside this CPU's own bf16 kernel."""
    return native.load(native.build(flags=native.flags_for("-march=native -DSPARSERL_AMX_EMULATE")))


def timer_of(seconds: dict, calls: list):
    def timer(kernel):
        calls.append(kernel)
        return seconds[kernel]

    return timer


def test_each_listed_kernel_is_the_one_that_runs_its_layout(emulated):
    w = torch.randn(40, 72, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 72, generator=torch.Generator().manual_seed(1))
    ref = x.bfloat16().double() @ w.bfloat16().double().T
    for lib in (native.library(), emulated):
        kernels = native.bf16_kernels(lib)
        assert kernels and "c" not in kernels[1:] and len(set(kernels)) == len(kernels)
        for kernel in kernels:
            packed = native.pack_linear_bf16(w, native.BF16_KERNEL_LAYOUT[kernel], lib=lib)
            assert native.bf16_kernel_of(packed, lib) == kernel
            y = native.linear_bf16(x, packed, lib=lib)
            assert (y.double() - ref).abs().max() < 1e-4 * ref.abs().max()
    assert "amx" not in native.bf16_kernels() or native.bf16_kernel() == "amx"
    assert native.bf16_kernels(emulated)[0] == "amx"


@pytest.mark.parametrize("fast", ["amx", "avx512_bf16"])
def test_the_faster_kernel_by_the_median_of_per_round_ratios_is_chosen_and_cached(cache, fast):
    kernels = ("amx", "avx512_bf16")
    calls = []
    slow = "avx512_bf16" if fast == "amx" else "amx"
    choice = bf16_kernel_choice.choose("cpu", timer_of({fast: 0.010, slow: 0.013}, calls), kernels=kernels, **QUIET)
    assert choice.kernel == fast and not choice.cached
    assert f"on {fast} is 1.30x one on {slow}" in choice.reason and "median of 3" in choice.reason
    assert calls[:2] == ["amx", "avx512_bf16"] and calls[2:4] == ["avx512_bf16", "amx"]  # alternating order
    assert len(calls) == 2 * dtype_choice.ROUNDS
    again = bf16_kernel_choice.choose("cpu", timer_of({}, calls), kernels=kernels, **QUIET)
    assert again.cached and again.kernel == fast and len(calls) == 2 * dtype_choice.ROUNDS  # read back
    stored = json.loads(cache.read_text())
    assert stored[bf16_kernel_choice.cache_key(torch.device("cpu"))]["kernel"] == fast
    # beside dtype auto's answer, under its own key: dtype auto still measures (and keeps this one)
    dtype_auto.choose("cpu", timer=lambda name: 1.0 if name == "float32" else 0.5, log=lambda *a: None)
    assert len(json.loads(cache.read_text())) == 2


def test_one_slow_round_does_not_decide(cache):
    times = iter([1.0, 3.0, 0.8, 1.0, 1.0, 0.8])  # amx, avx | avx, amx | amx, avx: ratios 3.0, 0.8, 0.8
    choice = bf16_kernel_choice.choose("cpu", lambda k: next(times), kernels=("amx", "avx512_bf16"), **QUIET)
    assert choice.kernel == "avx512_bf16" and choice.ratio_rounds == [3.0, 0.8, 0.8]


def test_one_kernel_is_not_measured(cache):
    choice = bf16_kernel_choice.choose("cpu", timer_of({}, []), kernels=("avx2",), **QUIET)
    assert choice.kernel == "avx2" and "the only bf16 kernel" in choice.reason and not cache.exists()
    with pytest.raises(ValueError, match="one or two"):
        bf16_kernel_choice.choose("cpu", kernels=("amx", "avx512_bf16", "avx2"), **QUIET)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32", seed=0)


@pytest.mark.parametrize("fast", ["amx", "vector"])
def test_the_engine_packs_for_the_measured_kernel_not_the_librarys_default(cache, tiny, emulated, monkeypatch, fast):
    """The emulated build's default is AMX (as an AMX Xeon's would be); the measurement decides."""
    monkeypatch.setattr(native.compiler, "_LIB", [emulated])  # every wrapper and caller loads this build
    kernels = native.bf16_kernels()
    assert kernels[0] == "amx" == native.bf16_kernel() and len(kernels) == 2
    winner = kernels[0] if fast == "amx" else kernels[1]
    bf16_kernel_choice.choose("cpu", lambda k: 1.0 if k == winner else 2.0, **QUIET)  # measured once, cached
    engine = RolloutEngine(tiny, get_compressor("none"), dtype="bfloat16")
    assert engine.bf16_kernel_choice.kernel == winner and engine.bf16_kernel_choice.cached
    panels = getattr(engine.model.layers[0].qkv, NATIVE_BF16)
    assert engine.model.bf16_kernel == winner == native.bf16_kernel_of(panels)
    assert (panels.panel_width, panels.k_pad) == (
        (16, 32) if winner == "amx" else (emulated.sparserl_bf16_panel_width(), 2)
    )
    out = engine.generate(["a b c"], SamplingParams(n=2, max_new_tokens=6, seed=0, ignore_eos=True))
    assert all(len(r) == 6 for r in out.response_ids)
    engine.update_weights(tiny.model)  # a push packs for the same kernel
    assert native.bf16_kernel_of(getattr(engine.model.layers[0].qkv, NATIVE_BF16)) == winner


def test_an_explicit_kernel_runs_without_measuring_and_a_missing_one_is_named(cache, tiny):
    here = native.bf16_kernels()
    engine = RolloutEngine(tiny, get_compressor("none"), dtype="bfloat16", bf16_kernel=here[-1])
    assert engine.bf16_kernel_choice is None and engine.model.bf16_kernel == here[-1] and not cache.exists()
    missing = next(k for k in native.BF16_KERNEL_LAYOUT if k not in here)
    with pytest.raises(ValueError, match=f"bf16_kernel='{missing}' does not run on this machine; it runs {here[0]}"):
        RolloutEngine(tiny, get_compressor("none"), dtype="bfloat16", bf16_kernel=missing)
    f32 = RolloutEngine(tiny, get_compressor("none"), dtype="float32")
    assert f32.bf16_kernel_choice is None and f32.model.bf16_kernel is None
