"""The compressors' score kernels (sparserl.rollout.native, kv_scores.c) against their torch
references: R-KV's redundancy term and the observation-window attention, and that R-KV / SnapKV
select the same slots on either path."""

import pytest
import torch

from sparserl.rollout import native
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.kv.base import ScoreInputs, window_attention
from sparserl.rollout.kv.rkv import redundancy

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path runs everywhere")


def _keys(n, h, length, dim=64, seed=0, repeat=True):
    """Random keys where the second half repeats the first with noise (so that the threshold and
    the retention of the newest copy both matter)."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, h, length, dim, generator=gen)
    if repeat and length > 1:
        half = length // 2
        keys[:, :, half:] = keys[:, :, : length - half] + 0.3 * torch.randn(n, h, length - half, dim, generator=gen)
    return keys


def _valid(n, length, pad=(3, 0)):
    valid = torch.ones(n, length, dtype=torch.bool)
    for row, p in enumerate(pad[:n]):
        valid[row, :p] = False  # left padding
    return valid


@pytest.mark.parametrize("threshold", [0.5, 0.0, -0.2])
@pytest.mark.parametrize("shape", [(2, 3, 37), (3, 2, 16), (1, 1, 1), (2, 3, 100), (1, 2, 5)])
def test_redundancy_equals_torch(shape, threshold):
    n, h, length = shape
    keys, valid = _keys(n, h, length), _valid(n, length, pad=(min(3, length - 1), 0))
    fast = redundancy(keys, valid, threshold)
    with native.torch_only():
        ref = redundancy(keys, valid, threshold)
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=1e-5)
    raw = native.rkv_redundancy(keys, valid, threshold)
    assert raw is not None and raw.shape == (n, h, length)


@pytest.mark.parametrize("length", [16, 37, 100, 288])
def test_redundancy_gives_the_avx2_bits_on_avx512(length, avx2_build):
    """With AVX512 the cosines run two panels at once (a 4 x 32 tile; past L the second is the zero
    pad panel, computed and not kept); the AVX2 build one. The same FMAs per cosine and the same
    epilogue, so the same means, bit for bit, with left padding and repeated keys (many kept
    similarities). Elsewhere both builds are the AVX2 code."""
    keys, valid = _keys(3, 2, length), _valid(3, length, pad=(3, 0, 7))
    for threshold in (0.5, 0.0):
        native_out = native.rkv_redundancy(keys, valid, threshold)
        avx2_out = native.rkv_redundancy(keys, valid, threshold, lib=avx2_build)
        assert torch.equal(native_out, avx2_out)


def test_redundancy_counts_repeats_and_keeps_the_newest_copy():
    """Three copies of one key and one unrelated key: the two older copies are redundant (each is
    similar to a newer copy), the newest is not counted by the row that retains it."""
    base = torch.zeros(1, 1, 4, 8)
    base[0, 0, 0, 0] = base[0, 0, 1, 0] = base[0, 0, 3, 0] = 1.0
    base[0, 0, 2, 1] = 1.0
    valid = torch.ones(1, 4, dtype=torch.bool)
    mean = native.rkv_redundancy(base, valid, 0.5)[0, 0]
    # S has ones between slots 0, 1, 3. Row 0: last similar = 3 > 0, S_03 dropped -> S_01 = 1.
    # Row 1: last = 3, S_13 dropped -> S_10 = 1. Row 3: last = 1 < 3, nothing dropped -> S_30 = S_31 = 1.
    # Column sums: [2, 2, 0, 0] / 4 valid.
    torch.testing.assert_close(mean, torch.tensor([0.5, 0.5, 0.0, 0.0]))


def test_redundancy_reads_strided_buffers():
    """The cache hands the kernel a slice of its buffers: slots beyond L and a region offset."""
    buf = _keys(2, 3, 50)
    keys = buf[:, :, 7:40]  # rows further apart per pair than L * D
    valid = _valid(2, 33)
    fast = native.rkv_redundancy(keys, valid, 0.5)
    with native.torch_only():
        ref = redundancy(keys.contiguous(), valid)
    torch.testing.assert_close(fast.masked_fill(~valid[:, None], float("-inf")).softmax(-1), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reduce_group", ["max", "mean"])
@pytest.mark.parametrize(
    "shape", [(2, 9, 3, 8, 40), (2, 4, 2, 3, 5), (1, 2, 2, 1, 1), (3, 6, 3, 4, 4), (2, 3, 1, 8, 27)]
)
def test_window_attention_equals_torch(shape, reduce_group):
    n, hq, hkv, w, length = shape
    gen = torch.Generator().manual_seed(length)
    keys = torch.randn(n, hkv, length, 64, generator=gen) * 2
    queries = torch.randn(n, hq, w, 64, generator=gen) * 2
    valid = _valid(n, length, pad=(min(2, length - 1), 0))
    inp = ScoreInputs(keys=keys, region=slice(0, length), valid=valid, queries=queries, positions=None)
    fast = native.window_attention(queries, keys, valid, reduce_group)
    assert fast is not None
    with native.torch_only():
        ref = window_attention(inp, reduce_group)
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=1e-5)


def test_window_attention_with_no_visible_key_is_zero():
    keys, queries = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 2, 8)
    valid = torch.tensor([[False, False, False, True]])  # query 0 (slot 2) sees no valid key
    fast = native.window_attention(queries, keys, valid, "mean")
    inp = ScoreInputs(keys=keys, region=slice(0, 4), valid=valid, queries=queries, positions=None)
    with native.torch_only():
        ref = window_attention(inp, "mean")
    torch.testing.assert_close(fast, ref)
    assert fast[0, 0, 3] == pytest.approx(0.5)  # only query 1 sees slot 3, weight 1 / w


@pytest.mark.parametrize("D", [64, 24])
def test_bf16_keys_give_the_float32_kernels_bits_on_their_values(D):
    """The bf16 sampler's cache: both kernels read bf16 keys (strided, as a slice of the cache) widened
    exactly, so the scores are the float32 kernel's bits on the same values; bf16 queries likewise."""
    buf = _keys(2, 3, 50, dim=D).bfloat16()
    keys, valid = buf[:, :, 7:40], _valid(2, 33)
    assert torch.equal(native.rkv_redundancy(keys, valid, 0.5), native.rkv_redundancy(keys.float(), valid, 0.5))
    queries = (torch.randn(2, 9, 4, D, generator=torch.Generator().manual_seed(D)) * 2).bfloat16()
    for reduce_group in ("max", "mean"):
        got = native.window_attention(queries, keys, valid, reduce_group)
        assert got is not None
        assert torch.equal(got, native.window_attention(queries.float(), keys.float(), valid, reduce_group))


def test_kernels_decline_what_they_do_not_take():
    keys, valid = torch.randn(1, 1, 4, 8), torch.ones(1, 4, dtype=torch.bool)
    assert native.rkv_redundancy(keys.double(), valid, 0.5) is None
    assert native.rkv_redundancy(keys.half(), valid, 0.5) is None  # float32 and bfloat16 only
    assert native.rkv_redundancy(keys.transpose(-1, -2), valid, 0.5) is None  # D not unit stride
    assert native.rkv_redundancy(keys, valid[:, :3], 0.5) is None
    q = torch.randn(1, 2, 2, 8)
    assert native.window_attention(q, keys, valid, "sum") is None
    assert native.window_attention(torch.randn(1, 3, 2, 8), torch.randn(1, 2, 4, 8), valid, "max") is None  # 3 % 2
    with native.torch_only():
        assert native.rkv_redundancy(keys, valid, 0.5) is None


def test_portable_build_equals_torch():
    portable = native.load(native.build(flags=native.flags_for("")))
    keys, valid = _keys(2, 3, 37), _valid(2, 37)
    torch.testing.assert_close(
        native.rkv_redundancy(keys, valid, 0.5, lib=portable),
        native.rkv_redundancy(keys, valid, 0.5),
        atol=1e-6,
        rtol=1e-5,
    )
    queries = torch.randn(2, 9, 8, 64)
    torch.testing.assert_close(
        native.window_attention(queries, keys, valid, "max", lib=portable),
        native.window_attention(queries, keys, valid, "max"),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", ["rkv", "snapkv"])
def test_compressors_select_the_same_slots_on_either_path(name):
    n, hq, hkv, length = 4, 6, 2, 60
    keys = _keys(n, hkv, length, dim=32, seed=3)
    queries = torch.randn(n, hq, 8, 32, generator=torch.Generator().manual_seed(4))
    inp = ScoreInputs(
        keys=keys,
        region=slice(10, length),
        valid=_valid(n, length),
        queries=queries,
        positions=torch.arange(length).expand(n, hkv, length),
    )
    comp = get_compressor(name, budget=24, step_length=26, window=8)
    fast = comp.select(inp, 24)
    with native.torch_only():
        ref = comp.select(inp, 24)
    assert torch.equal(fast, ref)
