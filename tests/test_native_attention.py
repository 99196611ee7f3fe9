"""The native decode-attention kernel (sparserl.rollout.native) against the torch path it replaces."""

import warnings

import pytest
import torch

from sparserl.rollout import native
from sparserl.rollout.cache import attention
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, get_compressor
from sparserl.rollout.kv_quant import get_kv_quantizer
from sparserl.rollout.sampling import SamplingParams

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path runs everywhere")

SHAPES = [  # B, Hq, Hkv, D, capacity, L
    (16, 9, 3, 64, 80, 70),  # SmolLM2's heads
    (3, 4, 2, 128, 50, 37),  # head_dim 128 (Qwen)
    (2, 6, 6, 64, 20, 9),  # no GQA
    (4, 8, 2, 32, 30, 17),  # another head size (the generic loop)
    (2, 4, 1, 24, 12, 12),  # D not a multiple of 16, L = capacity
    (1, 20, 1, 64, 16, 13),  # many query heads per KV head
]


def _inputs(B, hq, hkv, D, cap, L, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, 1, hq + 2 * hkv, D, generator=gen)
    q = qkv[..., :hq, :].transpose(-2, -3)  # [B, Hq, 1, D], strided as the decode step makes it
    K = torch.randn(2, B, hkv, cap, D, generator=gen)[1]  # a layer's view of the cache buffer
    V = torch.randn(2, B, hkv, cap, D, generator=gen)[1]
    bias = torch.zeros(B, L)
    for b in range(B):  # left padding of different lengths
        bias[b, : (b * 3) % (L // 2 + 1)] = float("-inf")
    return q, K, V, bias[:, None, None, :]


@pytest.mark.parametrize("shape", SHAPES)
def test_native_equals_torch_float32(shape):
    q, K, V, bias = _inputs(*shape)
    with native.torch_only():
        ref_out, ref_p = attention(q, K, V, bias)
    out, p = native.decode_attention(q, K, V, bias)
    assert out.shape == ref_out.shape and p.shape == ref_p.shape
    assert (out - ref_out).abs().max().item() < 1e-5
    assert (p - ref_p).abs().max().item() < 1e-6
    assert (p[bias[:, 0, 0, :].isinf()[:, None, None, :].expand_as(p)] == 0).all()  # masked: exactly 0
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_native_equals_torch_quantized_kv(shape, kv_quant):
    """Over the codes and their per-token scales, as the torch path reads them (fp8: E4M3 decoded
    by the float16 bit trick, F16C, exact)."""
    q, K, V, bias = _inputs(*shape, seed=1)
    quant = get_kv_quantizer(kv_quant)
    (kc, ks), (vc, vs) = quant.quantize(K), quant.quantize(V)
    with native.torch_only():
        ref_out, ref_p = attention(q, kc, vc, bias, ks, vs, quant)
    out, p = native.decode_attention(q, kc, vc, bias, ks, vs)
    assert (out - ref_out).abs().max().item() < 1e-5
    assert (p - ref_p).abs().max().item() < 1e-6


def test_cache_attention_runs_the_kernel():
    """On CPU, float32 K/V and int8 / fp8 codes go through the kernel, and a bf16 cache under a float32
    query (the fused bf16 step's); a bfloat16 query (the eager bf16 step) stays on torch."""
    q, K, V, bias = _inputs(*SHAPES[0])
    assert native.kernels("cpu", torch.float32) == "native"
    assert native.kernels("cpu", torch.bfloat16) == "native"
    assert native.kernels("cpu", torch.float16) == "torch"
    out, _ = attention(q, K, V, bias)
    assert torch.equal(out, native.decode_attention(q, K, V, bias)[0])
    assert native.decode_attention(q.bfloat16(), K.bfloat16(), V.bfloat16(), bias) is None
    assert native.decode_attention(q, K.to(torch.float8_e4m3fn), V.to(torch.float8_e4m3fn), bias) is None  # no scales
    with native.torch_only():
        assert native.kernels("cpu", torch.float32) == "torch"
        assert native.decode_attention(q, K, V, bias) is None


KV_CASES = [(name, "none") for name in available_compressors()] + [("rkv", "int8"), ("h2o", "int8"), ("snapkv", "fp8")]


@pytest.mark.parametrize("name,kv_quant", KV_CASES)
def test_engine_native_matches_torch(tiny, name, kv_quant):
    """Whole generations: same tokens, log-probs within 1e-4, same KV figures, every compressor."""
    options = {"window": 4} if name == "snapkv" else {"budget": 48, "dense_layers": 1} if name == "blocktopk" else {}
    comp = lambda: get_compressor(name, **{"budget": 12, "step_length": 6, **options})  # noqa: E731  (a fresh compressor per call)
    p = SamplingParams(n=3, max_new_tokens=30, seed=3, temperature=1.0)
    prompts = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]
    eng = RolloutEngine(tiny, comp(), kv_quant=kv_quant)
    eng.eos_ids = set(range(0, len(tiny.tokenizer), 40))  # rows leave the batch along the way
    a = eng.generate(prompts, p)
    with native.torch_only():
        b = eng.generate(prompts, p)
    assert a.response_ids == b.response_ids
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert (torch.tensor(x) - torch.tensor(y)).abs().max().item() <= 1e-4
    assert (a.kv.compressions, a.kv.bytes_peak) == (b.kv.compressions, b.kv.bytes_peak)


def test_disabled_and_failed_builds_fall_back(monkeypatch, tmp_path):
    """SPARSERL_NATIVE=0: torch, silently. A compiler that fails: torch, with one warning naming it."""
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    try:
        monkeypatch.setenv("SPARSERL_NATIVE", "0")
        native.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native.library() is None
        assert native.kernels("cpu", torch.float32) == "torch"
        monkeypatch.setenv("SPARSERL_NATIVE", "1")
        monkeypatch.setenv("CC", "/bin/false")
        native.reset()
        with pytest.warns(RuntimeWarning, match="native kernels unavailable"):
            assert native.library() is None
        with pytest.raises(RuntimeError, match="false"):
            native.build("/bin/false")
    finally:
        monkeypatch.undo()
        native.reset()
    assert native.library() is not None


def test_build_is_cached_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    first = native.build()
    mtime = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


@pytest.mark.parametrize("kv_quant", ["none", "int8", "fp8"])
def test_portable_build_equals_torch(tmp_path, monkeypatch, kv_quant):
    """The plain C loops (no -march: what a CPU without AVX2 runs) give the same numbers."""
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    portable = native.load(native.build(flags=native.flags_for("")))
    for shape in SHAPES:
        q, K, V, bias = _inputs(*shape, seed=2)
        scales = ()
        if kv_quant != "none":
            quant = get_kv_quantizer(kv_quant)
            (K, ks), (V, vs) = quant.quantize(K), quant.quantize(V)
            scales = (ks, vs, quant)
        with native.torch_only():
            ref_out, ref_p = attention(q, K, V, bias, *scales)
        out, p = native.decode_attention(q, K, V, bias, *scales[:2], lib=portable)
        assert (out - ref_out).abs().max().item() < 1e-5 and (p - ref_p).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    "shape", [(16, 9, 3, 64, 80, 70), (3, 10, 2, 64, 40, 33), (1, 20, 1, 64, 16, 13), (2, 8, 1, 128, 30, 29)]
)
@pytest.mark.parametrize("kv_quant", ["none", "int8"])
def test_each_query_head_gets_the_bits_it_gets_alone(shape, kv_quant):
    """The kernel reads each key and value row once for up to 4 query heads of a KV head (g = 3, 5 =
    4 + 1, 20 = 5 x 4, 8 = 2 x 4): every head's sums still run in the same order, so each head's
    output and probabilities equal, bit for bit, a run with that head alone (g = 1)."""
    q, K, V, bias = _inputs(*shape, seed=2)
    ks = vs = None
    if kv_quant != "none":
        quant = get_kv_quantizer(kv_quant)
        (K, ks), (V, vs) = quant.quantize(K), quant.quantize(V)
    B, hq, hkv, D = shape[0], shape[1], shape[2], shape[3]
    g = hq // hkv
    out, p = native.decode_attention(q, K, V, bias, ks, vs)
    for i in range(g):
        heads = [h * g + i for h in range(hkv)]
        alone_out, alone_p = native.decode_attention(q[:, heads], K, V, bias, ks, vs)
        assert torch.equal(out.view(B, hkv, g, D)[:, :, i], alone_out.view(B, hkv, D))
        assert torch.equal(p[:, :, i], alone_p[:, :, 0])


@pytest.mark.parametrize("kv_quant", ["none", "int8", "fp8"])
def test_attention_gives_the_avx2_bits_on_avx512(avx2_build, kv_quant):
    """With AVX512 the value pass keeps 64 output columns of 3 heads in registers, with AVX2 32:
    the same sums in the same order, so the same bits."""
    for shape in SHAPES:
        q, K, V, bias = _inputs(*shape, seed=3)
        ks = vs = None
        if kv_quant != "none":
            quant = get_kv_quantizer(kv_quant)
            (K, ks), (V, vs) = quant.quantize(K), quant.quantize(V)
        native_out, native_p = native.decode_attention(q, K, V, bias, ks, vs)
        avx2_out, avx2_p = native.decode_attention(q, K, V, bias, ks, vs, lib=avx2_build)
        assert torch.equal(native_out, avx2_out) and torch.equal(native_p, avx2_p), shape
