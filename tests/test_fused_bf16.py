"""The bfloat16 sampler's fused decode step (``sparserl.rollout.fused`` on bf16 weights):
bf16 weight panels (``linear_bf16.c``), a bf16 KV cache read by the C attention, float32 everywhere
else. Checked against exact references where the arithmetic is exact (a bf16 cache reads as its
float32 values), and against the float32 policy where it is not (closer than the eager bf16 step)."""

import pytest
import torch

from sparserl.mismatch.replay import replay
from sparserl.models.loading import load_model
from sparserl.rollout import fused, native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.model import NATIVE_BF16
from sparserl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")

PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


@pytest.fixture(scope="module")
def tiny_bf16_rounded():
    """The tiny model with weights already bf16 values (held in float32): the float32 policy a bf16
    sampler approximates, without the weights' own rounding in the comparison."""
    loaded = load_model("tiny", dtype="float32", seed=0)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.copy_(p.bfloat16().float())
    return loaded


def make(name):
    if name == "none":
        return get_compressor("none")
    return get_compressor(name, budget=12, step_length=6, **({"window": 4} if name == "snapkv" else {}))


@pytest.mark.parametrize("D", [16, 64, 24])
def test_block_topk_over_a_bf16_cache_is_the_float32_kernel_on_its_values(D):
    """The same pages, the same page sums and the same bits as float32 K/V holding the same values."""
    gen = torch.Generator().manual_seed(D)
    B, hq, hkv, cap, page = 2, 6, 2, 100, 16
    lens = torch.tensor([97, 70], dtype=torch.int64)
    start = torch.tensor([0, 5], dtype=torch.int64)
    q = torch.randn(B, hq, 1, D, generator=gen)
    K = torch.randn(B, hkv, cap, D, generator=gen).bfloat16()
    V = torch.randn(B, hkv, cap, D, generator=gen).bfloat16()
    pages = -(-cap // page)
    outs = []
    for k_, v_ in ((K, V), (K.float(), V.float())):
        sums = torch.zeros(B, hkv, pages, D)
        for b in range(B):  # the sums of every key but the last, which the call adds
            for t in range(int(lens[b] - start[b]) - 1):
                sums[b, :, t // page] += k_[b, :, int(start[b]) + t].float()
        chosen = torch.empty(B, hkv, 4, dtype=torch.int32)
        out = native.blocktopk_attention(
            q, k_, v_, sums, start, lens, torch.full((B,), 4, dtype=torch.int32), page, 1, 2, chosen=chosen
        )
        outs.append((out, sums, chosen))
    assert outs[0][0] is not None
    for a, b in zip(outs[0], outs[1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("D", [16, 64, 24])
def test_attention_over_a_bf16_cache_is_the_float32_kernel_on_its_values(D):
    """Widening a bf16 is exact and the sums run in the same order: the same bits as float32 K/V
    holding the same values, strided views of a larger cache included."""
    gen = torch.Generator().manual_seed(D)
    B, hq, hkv, cap, L = 3, 6, 2, 40, 33
    q = torch.randn(B, hq, 1, D, generator=gen)
    K = torch.randn(B, hkv, cap + 5, D, generator=gen).bfloat16()[:, :, 5:]
    V = torch.randn(B, hkv, cap + 5, D, generator=gen).bfloat16()[:, :, 5:]
    bias = torch.zeros(B, 1, 1, L)
    bias[0, ..., :4] = float("-inf")
    got = native.decode_attention(q, K, V, bias)
    want = native.decode_attention(q, K.float(), V.float(), bias)
    assert got is not None
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert native.decode_attention(q, K, V, bias, K[..., 0].float(), V[..., 0].float()) is None  # no scales


def test_bf16_weight_descriptors():
    w = torch.randn(40, 24)
    panels = native.pack_linear_bf16(w)
    d = native.Weight.of(native.Weight.BF16, panels, 40, 24, bias=torch.zeros(40))
    assert d is not None and (d.panel_width, d.k_pad) == (panels.panel_width, panels.k_pad)
    assert native.Weight.of(native.Weight.FLOAT32, panels, 40, 24) is None  # bf16 panels, float32 kind
    assert native.Weight.of(native.Weight.BF16, native.pack_linear(w), 40, 24) is None
    assert native.Weight.of(native.Weight.BF16, panels, 40, 24, smooth=torch.ones(24)) is None


def _engines(loaded, name):
    bf16 = RolloutEngine(loaded, make(name), dtype="bfloat16")
    f32 = RolloutEngine(loaded, make(name), dtype="float32")
    return bf16, f32


@pytest.mark.parametrize("name", ["none", "rkv", "snapkv", "h2o", "streaming"])
def test_fused_bf16_step_runs_with_a_bf16_cache_and_replays_exactly(tiny_bf16_rounded, name, generate_fused):
    """Every weight on bf16 panels, the cache in bf16 (half the float32 bytes), the compressors scoring
    on it; the replay (exact α) gives the sampler's own log-probs to the bit."""
    bf16, f32 = _engines(tiny_bf16_rounded, name)
    m = bf16.model
    assert all(hasattr(w, NATIVE_BF16) for lw in m.layers for w in (lw.qkv, lw.o, lw.gate_up, lw.down))
    assert fused.available(m)
    params = SamplingParams(n=2, max_new_tokens=24, seed=3, temperature=1.0, ignore_eos=True)
    out = generate_fused(bf16, PROMPTS, params)
    dense = f32.generate(PROMPTS, params)
    assert out.kv.bytes_dense * 2 == dense.kv.bytes_dense
    if name != "none":
        assert out.kv.compressions > 0
    again = replay(bf16, out.prompt_ids, out.response_ids, params)
    for x, y in zip(out.sampler_logprobs, again.sampler_logprobs):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_fused_bf16_is_closer_to_the_float32_policy_than_the_eager_bf16_step(tiny_bf16_rounded, generate_fused):
    """On the same tokens, the fused step's log-probs (float32 sums, residual, norms, softmax) sit
    closer to the float32 sampler's than the eager bf16 step's (which rounds every intermediate)."""
    bf16, f32 = _engines(tiny_bf16_rounded, "none")
    params = SamplingParams(n=4, max_new_tokens=32, seed=1, temperature=1.0, ignore_eos=True)
    sampled = generate_fused(bf16, PROMPTS, params)
    ref = replay(f32, sampled.prompt_ids, sampled.response_ids, params)
    bf16.fused = False
    eager = replay(bf16, sampled.prompt_ids, sampled.response_ids, params)

    def gap(out):  # mean |Δ log-prob| over the decoded tokens (the first comes from the prefill, eager in both)
        return float(
            torch.cat(
                [
                    (torch.as_tensor(a) - torch.as_tensor(b)).abs()[1:]
                    for a, b in zip(out.sampler_logprobs, ref.sampler_logprobs)
                ]
            ).mean()
        )

    fused_gap, eager_gap = gap(sampled), gap(eager)
    assert 0 < fused_gap < 0.7 * eager_gap, (fused_gap, eager_gap)  # measured: 2.9e-4 against 5.6e-4


def test_blocktopk_and_a_quantized_cache_in_the_bf16_step(tiny_bf16_rounded, generate_fused):
    """Block top-k reads its pages of the bf16 cache in its own kernel, int8 KV codes go through the
    cache's attention between the native calls; the step runs fused and replays exactly."""
    for compressor, kv_quant in (
        (get_compressor("blocktopk", budget=48, dense_layers=1), "none"),
        (make("rkv"), "int8"),
    ):
        engine = RolloutEngine(tiny_bf16_rounded, compressor, dtype="bfloat16", kv_quant=kv_quant)
        params = SamplingParams(n=2, max_new_tokens=40, seed=5, temperature=1.0, ignore_eos=True)
        out = generate_fused(engine, PROMPTS, params)
        again = replay(engine, out.prompt_ids, out.response_ids, params)
        for x, y in zip(out.sampler_logprobs, again.sampler_logprobs):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_without_native_kernels_the_bf16_sampler_runs_eager(tiny_bf16_rounded):
    with native.torch_only():
        engine = RolloutEngine(tiny_bf16_rounded, make("none"), dtype="bfloat16")
        assert not any(hasattr(lw.qkv, NATIVE_BF16) for lw in engine.model.layers)
        assert not fused.available(engine.model)
        out = engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=8, seed=0))
    assert all(len(r) > 0 for r in out.response_ids)


def test_auto_keeps_float32_where_the_bf16_step_is_not_fused():
    from sparserl.rollout.dtype_auto import AutoChoice, for_sampler

    bf16 = AutoChoice("bfloat16", "measured: bf16 1.6x", "key")
    assert for_sampler(bf16) is bf16
    kept = for_sampler(bf16, "int8")
    assert kept.dtype == "float32" and "no fused bfloat16 step" in kept.reason and kept.key == "key"
    f32 = AutoChoice("float32", "measured", "key")
    assert for_sampler(f32, "int8") is f32


def test_the_fused_bf16_step_on_emulated_amx_tiles(tiny_bf16_rounded, generate_fused, monkeypatch):
    """The bf16 sampler as an AMX CPU runs it, the tile instructions emulated in C (the
    ``-DSPARSERL_AMX_EMULATE`` build of tests/test_native_bf16.py): the weights packed in the AMX
    layout when the model is attached, every decode step fused, the replay exact, and the log-probs
    of the same tokens within float32 summation's reach of this CPU's own bf16 kernel."""
    emulated = native.load(native.build(flags=native.flags_for("-march=native -DSPARSERL_AMX_EMULATE")))
    params = SamplingParams(n=2, max_new_tokens=24, seed=3, temperature=1.0, ignore_eos=True)
    here = RolloutEngine(tiny_bf16_rounded, make("rkv"), dtype="bfloat16")
    monkeypatch.setattr(native.compiler, "_LIB", [emulated])  # every wrapper and caller loads this build
    amx = RolloutEngine(tiny_bf16_rounded, make("rkv"), dtype="bfloat16", bf16_kernel="amx")  # not measured
    panels = getattr(amx.model.layers[0].qkv, NATIVE_BF16)
    assert (panels.panel_width, panels.k_pad) == (16, 32) and native.bf16_kernel(emulated) == "amx"
    out = generate_fused(amx, PROMPTS, params)
    assert out.kv.compressions > 0
    again = replay(amx, out.prompt_ids, out.response_ids, params)
    for x, y in zip(out.sampler_logprobs, again.sampler_logprobs):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))
    monkeypatch.undo()
    ours = replay(here, out.prompt_ids, out.response_ids, params)
    gap = max(
        float((torch.as_tensor(x) - torch.as_tensor(y)).abs().max())
        for x, y in zip(out.sampler_logprobs, ours.sampler_logprobs)
    )
    assert gap < 1e-3, gap  # only the order of the float32 sums differs
