"""The fused decode step (``sparserl.rollout.fused``: a layer in three native calls) against the
eager one, operator by operator: the same kernels in the same order, so the same tokens and
bit-identical log-probs, for every compressor, the weight quantizations it takes, SmoothQuant, outlier
channels in float32 and a quantized KV cache (which attends through the cache's own path)."""

import pytest
import torch

from sparserl.rollout import fused, native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, get_compressor
from sparserl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")

PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name):
    if name == "blocktopk":  # 3 pages of 16 tokens read in the tiny model's layer 1 (its own kernel, blocktopk.c)
        return get_compressor(name, budget=48, dense_layers=1)
    return get_compressor(name, budget=12, step_length=6, **({"window": 4} if name == "snapkv" else {}))


@pytest.fixture
def run_both(generate_fused):
    """``run_both(engine, params)``: (fused output, eager output) of the same engine and sampling; the fused
    step really ran."""
    return lambda engine, params: _run_both(generate_fused, engine, params)


def _run_both(generate_fused, engine, params):
    a = generate_fused(engine, PROMPTS, params)
    engine.fused = False
    b = engine.generate(PROMPTS, params)
    return a, b


def assert_same(a, b):
    assert a.response_ids == b.response_ids
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))
    assert (a.kv.compressions, a.kv.bytes_peak, a.kv_tokens_kept) == (
        b.kv.compressions,
        b.kv.bytes_peak,
        b.kv_tokens_kept,
    )


@pytest.mark.parametrize("name", available_compressors())
def test_fused_step_is_the_eager_step(tiny, name, run_both):
    """Every compressor (window queries, attention accumulators); rows leave the batch on EOS."""
    engine = RolloutEngine(tiny, make(name))
    engine.eos_ids = set(range(0, len(tiny.tokenizer), 40))  # rows stop at different steps
    a, b = run_both(engine, SamplingParams(n=3, max_new_tokens=30, seed=7, temperature=1.0))
    assert "stop" in a.finish_reason and len({len(r) for r in a.response_ids}) > 1
    assert_same(a, b)


@pytest.mark.parametrize(
    "quant,smooth,kv_quant,outliers",
    [
        ("int8", 0.0, "none", 0),
        ("int8_group", 0.0, "none", 0),
        ("int8", 0.5, "none", 0),
        ("int8_group", 0.5, "none", 0),
        ("none", 0.0, "int8", 0),
        ("int8", 0.0, "fp8", 0),
        ("int8", 0.0, "none", 4),
        ("int8", 0.5, "none", 4),
        ("int8_group", 0.5, "none", 2),
        ("int8", 0.5, "none", -4),
    ],
)
def test_fused_step_quantized(tiny, quant, smooth, kv_quant, outliers, run_both):
    """outliers < 0: that many outlier channels, and the LM head quantized too (rollout.quant_head)."""
    engine = RolloutEngine(
        tiny,
        make("rkv"),
        quant=quant,
        quant_smooth=smooth,
        kv_quant=kv_quant,
        quant_outliers=abs(outliers),
        quant_head=outliers < 0,
    )
    assert fused.available(engine.model)
    a, b = run_both(engine, SamplingParams(n=2, max_new_tokens=24, seed=3, temperature=1.0, ignore_eos=True))
    assert_same(a, b)


def test_fused_step_follows_a_weight_push(tiny, run_both):
    """A push (update_weights) re-describes the weights: the fused step uses the new ones."""
    engine = RolloutEngine(tiny, make("none"), quant="int8")
    p = SamplingParams(n=2, max_new_tokens=12, seed=1, temperature=1.0, ignore_eos=True)
    before = engine.generate(PROMPTS, p)
    state = {k: v * 1.5 if "mlp" in k else v for k, v in tiny.model.state_dict().items()}
    engine.update_weights(state)
    a, b = run_both(engine, p)
    assert_same(a, b)
    assert a.sampler_logprobs[0] != before.sampler_logprobs[0]


def test_weights_it_does_not_take_run_eager(tiny):
    """fp8 (emulated), int8_weight_only and native kernels off: no fused step, the eager one runs."""
    for quant in ("fp8", "int8_weight_only"):
        assert not fused.available(RolloutEngine(tiny, make("none"), quant=quant).model)
    engine = RolloutEngine(tiny, make("none"))
    assert fused.available(engine.model)
    with native.torch_only():
        assert not fused.available(engine.model)


def test_descriptor_rejects_what_the_kernels_do_not_take():
    panels = torch.zeros(24 * 8)
    assert native.Weight.of(native.Weight.FLOAT32, panels, 24, 8) is not None
    assert native.Weight.of(native.Weight.FLOAT32, panels, 24, 8, bias=torch.zeros(23)) is None  # wrong length
    assert native.Weight.of(native.Weight.FLOAT32, panels, 24, 8, bias=torch.zeros(24, dtype=torch.float64)) is None
    assert native.Weight.of(native.Weight.FLOAT32, panels, 24, 8, smooth=torch.zeros(16)[::2]) is None  # strided


def test_apply_bad_descriptor_is_an_error():
    """An unknown kernel kind or int8_group without a group: -1, nothing written."""
    lib = native.library()
    x, y = torch.ones(2, 8), torch.full((2, 16), 7.0)
    d = native.Weight.of(native.Weight.INT8_GROUP, torch.zeros(16 * 8, dtype=torch.int8), 16, 8, scales=torch.ones(16))
    assert lib.sparserl_apply(d, 2, x.data_ptr(), 8, y.data_ptr(), 16, 0) == -1
    d.kind = 9
    assert lib.sparserl_apply(d, 2, x.data_ptr(), 8, y.data_ptr(), 16, 0) == -1
    assert torch.equal(y, torch.full((2, 16), 7.0))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fused_step_other_families(tiny_family, family, run_both):
    """Qwen2's q/k/v bias runs inside the fused layer; Qwen3's per-head q/k norms keep the eager step."""
    engine = RolloutEngine(tiny_family(family), make("rkv"))
    assert fused.available(engine.model) == (family == "qwen2")
    if family == "qwen2":
        assert engine.model.layers[0].qkv_bias is not None
        a, b = run_both(engine, SamplingParams(n=2, max_new_tokens=16, seed=2, temperature=1.0, ignore_eos=True))
        assert_same(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_kv_is_written_and_read_inside_the_layer_calls(tiny, dtype, generate_fused, monkeypatch):
    """An int8 KV cache takes the direct path: the layer's C call quantizes k and v into the cache
    (kv_quant.py's formula, the same codes and scales) and the attention reads the codes there; the
    cache's own write and attention are not called. In float32 the tokens and log-probs are the eager
    step's bits; the codes and scales the cache holds at the end are the eager run's too."""
    from sparserl.rollout.cache import CompressedKVCache

    engine = RolloutEngine(tiny, make("rkv"), dtype=dtype, kv_quant="int8")
    params = SamplingParams(n=2, max_new_tokens=24, seed=3, temperature=1.0, ignore_eos=True)
    caches = []
    engine.step_hook = lambda event, cache=None, **kw: caches.append(cache) if event == "after_decode" else None
    eager_attend = CompressedKVCache.attend

    def refused(*args, **kw):
        raise AssertionError("the fused step went through the cache's attend")

    monkeypatch.setattr(CompressedKVCache, "attend", refused)
    a = generate_fused(engine, PROMPTS, params)
    held = caches[-1]
    codes, scales = held.keys.clone(), held.k_scale.clone()
    assert a.kv.compressions > 0 and codes.dtype == torch.int8
    if dtype == "float32":
        monkeypatch.setattr(CompressedKVCache, "attend", eager_attend)
        engine.fused = False
        b = engine.generate(PROMPTS, params)
        assert_same(a, b)
        assert torch.equal(caches[-1].keys, codes) and torch.equal(caches[-1].k_scale, scales)
