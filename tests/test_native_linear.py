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
    (1, 48, 64),     # one row
    (3, 25, 17),     # rows not a multiple of the 4-row tile, N one past a 24-column panel
    (6, 7, 5),       # N smaller than one panel
    (64, 24, 300),   # one full panel, the most rows a packed product takes
    (5, 100, 1),     # K = 1
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


def test_portable_build_equals_torch(tmp_path, monkeypatch):
    """The plain C loops (no -march: what a CPU without AVX2 runs) give the same products."""
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    portable = native.load(native.build(flags=[f for f in native.FLAGS if not f.startswith("-march")]))
    for M, N, K in SHAPES:
        gen = torch.Generator().manual_seed(M + N + K)
        w, x, b = torch.randn(N, K, generator=gen), torch.randn(M, K, generator=gen), torch.randn(N, generator=gen)
        y = native.linear(x, native.pack_linear(w, lib=portable), b, lib=portable)
        assert _relative_error(y, F.linear(x.double(), w.double(), b.double()).float()) < 1e-5


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
