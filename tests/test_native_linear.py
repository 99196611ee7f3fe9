"""The native weight-product kernel (sparserl.rollout.native, linear.c) against torch's, and the
sampler's choice of kernel (sparserl.rollout.model.linear)."""

import pytest
import torch
import torch.nn.functional as F

from sparserl.rollout import model as sampler_model
from sparserl.rollout import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path runs everywhere")

SHAPES = [  # rows M, out N, in K
    (16, 960, 576),  # SmolLM2's fused q/k/v at batch 16
    (1, 48, 64),  # one row
    (3, 25, 17),  # rows not a multiple of the 4-row tile, N one past a 24-column panel
    (6, 7, 5),  # N smaller than one panel
    (64, 24, 300),  # one full panel, the most rows a packed product takes
    (5, 100, 1),  # K = 1
]


def _relative_error(y, ref):
    return ((y - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_native_linear_equals_torch(shape, bias):
    M, N, K = shape
    gen = torch.Generator().manual_seed(M * N + K)
    w, x = torch.randn(N, K, generator=gen), torch.randn(M, K, generator=gen)
    b = torch.randn(N, generator=gen) if bias else None
    y = native.linear(x, native.pack_linear(w), b)
    assert y.shape == (M, N)
    assert _relative_error(y, F.linear(x.double(), w.double(), None if b is None else b.double()).float()) < 1e-5


def test_native_linear_takes_strided_and_batched_inputs():
    """x [B, 1, K] views (the decode step's shapes) and rows further apart than K."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(50, 40, generator=gen)
    wide = torch.randn(6, 1, 64, generator=gen)
    x = wide[..., 3:43]  # rows 64 apart
    y = native.linear(x, native.pack_linear(w))
    assert y.shape == (6, 1, 50)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_native_linear_declines_what_it_does_not_take():
    w = torch.randn(8, 4)
    packed = native.pack_linear(w)
    assert native.linear(torch.randn(2, 5), packed) is None  # wrong K
    assert native.linear(torch.randn(2, 4, dtype=torch.float64), packed) is None
    assert native.pack_linear(w.double()) is None and native.pack_linear(w.bfloat16()) is None
    with native.torch_only():
        assert native.linear(torch.randn(2, 4), packed) is None


def test_avx512_panels_give_the_avx2_bits(avx2_build):
    """Where the CPU has AVX512 the native build packs 32-column panels and runs a 4 x 32 tile; the
    AVX2 build 24-column panels and a 4 x 24 tile. Each output is the same FMAs in the same k order,
    so the same bits, with a bias and accumulating. Elsewhere both builds are the AVX2 code."""
    for M, N, K in [(16, 3072, 576), (5, 33, 18), (7, 100, 1537), (1, 24, 64)]:
        gen = torch.Generator().manual_seed(M + N + K)
        w, x, b = torch.randn(N, K, generator=gen), torch.randn(M, K, generator=gen), torch.randn(N, generator=gen)
        h = torch.randn(M, N, generator=gen)
        ys = [native.linear(x, native.pack_linear(w, lib=lib), b, lib=lib) for lib in (None, avx2_build)]
        assert torch.equal(ys[0], ys[1])
        hs = [h.clone(), h.clone()]
        for lib, out in zip((None, avx2_build), hs):
            native.linear(x, native.pack_linear(w, lib=lib), b, lib=lib, add_to=out)
        assert torch.equal(hs[0], hs[1])


def test_portable_build_equals_torch(tmp_path, monkeypatch):
    """The plain C loops (no -march: what a CPU without AVX2 runs) give the same products."""
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    portable = native.load(native.build(flags=native.flags_for("")))
    for M, N, K in SHAPES:
        gen = torch.Generator().manual_seed(M + N + K)
        w, x, b = torch.randn(N, K, generator=gen), torch.randn(M, K, generator=gen), torch.randn(N, generator=gen)
        y = native.linear(x, native.pack_linear(w, lib=portable), b, lib=portable)
        assert _relative_error(y, F.linear(x.double(), w.double(), b.double()).float()) < 1e-5
    x, w = torch.randn(5, 1, 13) * 3, torch.randn(13)  # the layer's small operators' plain loops
    torch.testing.assert_close(native.rms_norm(x, w, 1e-6, lib=portable), native.rms_norm(x, w, 1e-6))
    gu = torch.randn(5, 1, 22) * 4
    torch.testing.assert_close(native.silu_mul(gu, lib=portable), native.silu_mul(gu))
    q, cos, sin = torch.randn(5, 1, 3, 10), torch.randn(5, 1, 10), torch.randn(5, 1, 10)
    q2 = q.clone()
    assert native.rope_(q, 2, cos, sin, lib=portable) and native.rope_(q2, 2, cos, sin)
    torch.testing.assert_close(q, q2)


def test_sampler_linear_picks_the_kernel(monkeypatch):
    """Packed weights: the C kernel up to PACKED_MAX_ROWS rows, plain GEMM beyond, oneDNN's copy
    (made on first use) inside torch_only(); the same numbers each way."""
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(72, 48, generator=gen), torch.randn(72, generator=gen)
    sampler_model.pack_weight(w)
    assert hasattr(w, sampler_model.NATIVE_PACKED) and not hasattr(w, sampler_model.PACKED)
    calls = []
    real = native.linear
    monkeypatch.setattr(native, "linear", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    for rows in (1, 16, sampler_model.PACKED_MAX_ROWS, sampler_model.PACKED_MAX_ROWS + 1):
        x = torch.randn(rows, 48, generator=gen)
        calls.clear()
        y = sampler_model.linear(x, w, b)
        assert len(calls) == (1 if rows <= sampler_model.PACKED_MAX_ROWS else 0), rows
        torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert not hasattr(w, sampler_model.PACKED)  # no oneDNN copy: the C kernel took every packed product
    w2 = torch.randn(24, 48, generator=gen)
    sampler_model.pack_weight(w2)
    x = torch.randn(4, 48, generator=gen)
    with native.torch_only():
        y = sampler_model.linear(x, w2)
    assert hasattr(w2, sampler_model.PACKED)
    torch.testing.assert_close(y, F.linear(x, w2), rtol=1e-5, atol=1e-5)


def test_pack_weight_without_native_kernels_is_onednn():
    w = torch.randn(30, 20)
    with native.torch_only():
        sampler_model.pack_weight(w)
    assert hasattr(w, sampler_model.PACKED) and not hasattr(w, sampler_model.NATIVE_PACKED)


# --- the layer's small operators (layer_ops.c) ------------------------------------------------------
@pytest.mark.parametrize("rows,dim", [(16, 576), (3, 13), (1, 8), (300, 260)])  # 300 x 260: the threaded path
def test_native_rms_norm_equals_torch(rows, dim):
    gen = torch.Generator().manual_seed(rows + dim)
    x, w = torch.randn(rows, 1, dim, generator=gen) * 3, torch.randn(dim, generator=gen)
    y = native.rms_norm(x, w, 1e-5)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()).float()
    assert y.shape == x.shape
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert native.rms_norm(x, torch.randn(dim + 1), 1e-5) is None  # weight of the wrong size


@pytest.mark.parametrize("rows,inter", [(16, 1536), (5, 11), (200, 400)])
def test_native_silu_mul_equals_torch(rows, inter):
    gen = torch.Generator().manual_seed(rows + inter)
    gu = torch.randn(rows, 1, 2 * inter, generator=gen) * 4
    gu[0, 0, :3] = torch.tensor([-100.0, 100.0, 0.0])  # far tails of the sigmoid
    g, u = gu.chunk(2, dim=-1)
    y = native.silu_mul(gu)
    assert y.shape == (rows, 1, inter)
    torch.testing.assert_close(y, F.silu(g) * u, rtol=1e-5, atol=1e-6)
    assert native.silu_mul(torch.randn(2, 5)) is None  # odd width: no [g | u] split


@pytest.mark.parametrize("rows,heads,rotated,dim", [(16, 15, 12, 64), (3, 4, 3, 10), (130, 6, 6, 128)])
def test_native_rope_equals_torch(rows, heads, rotated, dim):
    """In place on the first ``rotated`` heads of [rows, 1, heads, D]; the others untouched."""
    gen = torch.Generator().manual_seed(rows + heads + dim)
    x = torch.randn(rows, 1, heads, dim, generator=gen)
    angles = torch.rand(rows, 1, dim // 2, generator=gen) * 50
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    ref = x.clone()
    ref[..., :rotated, :] = sampler_model.apply_rope(x[..., :rotated, :], cos.unsqueeze(-2), sin.unsqueeze(-2))
    assert native.rope_(x, rotated, cos, sin)
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-5)
    assert not native.rope_(x, rotated, cos[:-1], sin[:-1])  # a cos row short: declined, x untouched
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-5)


def test_linear_adds_into_the_residual_in_place():
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 30, generator=gen), torch.randn(5, 1, 30, generator=gen)
    sampler_model.pack_weight(w)
    h = torch.randn(5, 1, 40, generator=gen)
    expected = h + F.linear(x, w)
    assert sampler_model.linear(x, w, add_to=h) is h
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)
    h2 = h.clone()
    with native.torch_only():  # the torch path adds in place too
        assert sampler_model.linear(x, w, add_to=h2) is h2
    torch.testing.assert_close(h2, h + F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_native_arch_replaces_march_native(monkeypatch):
    """$SPARSERL_NATIVE_ARCH builds the library for fewer instruction sets than this CPU has (what a
    laptop's AVX2 + AVX-VNNI gets); unset or empty, -march=native."""
    from sparserl.bench.machine import machine_info

    monkeypatch.delenv("SPARSERL_NATIVE_ARCH", raising=False)
    assert native.default_flags() == native.FLAGS
    assert machine_info(1.0, 1.0, 16)["native_arch"] == "native"  # the bench JSON says which build ran
    monkeypatch.setenv("SPARSERL_NATIVE_ARCH", "")
    assert native.default_flags() == native.FLAGS
    monkeypatch.setenv("SPARSERL_NATIVE_ARCH", "-mavx2 -mfma  -mavxvnni")
    flags = native.default_flags()
    assert "-march=native" not in flags and flags[-3:] == ["-mavx2", "-mfma", "-mavxvnni"]
    assert set(native.FLAGS) - {"-march=native"} <= set(flags)
    assert machine_info(1.0, 1.0, 16)["native_arch"] == "-mavx2 -mfma  -mavxvnni"
    assert native.flags_for("") == [f for f in native.FLAGS if f != "-march=native"]
