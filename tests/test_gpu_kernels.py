"""The Triton kernels of the compressed cache (sparserl.rollout.gpu) against their references, run by Triton's
interpreter on CPU tensors: decode attention over every valid slot and over block top-k's pages (float32,
bfloat16, int8 and fp8 caches; GQA groups 3 and 6; head dims 64 and 128; lengths that are not a multiple of the
block; left padding; a row with nothing to attend), and R-KV's redundancy without the [L, L] matrix. Outputs
are poisoned with NaN before each call, so a slot the kernel forgets to write fails the test.

The interpreter is chosen when Triton and the kernels are imported (``TRITON_INTERPRET``, set by conftest.py on a
CPU test run); the sm_90 compile test (``test_gpu_compile.py``) runs in a child process without it."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="Triton is the gpu extra, installed by install.sh")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("a CUDA run: the kernels run compiled (experiments/device/gpu_check.sh)", allow_module_level=True)

from sparserl.rollout.cache import attention  # noqa: E402
from sparserl.rollout.gpu.decode_attention import decode_attention, reference_decode_attention  # noqa: E402
from sparserl.rollout.gpu.rkv_redundancy import rkv_redundancy  # noqa: E402
from sparserl.rollout.kv.rkv import redundancy  # noqa: E402
from sparserl.rollout.kv_quant import get_kv_quantizer  # noqa: E402
from sparserl.rollout.page_attention import gathered_attention  # noqa: E402


def _case(seed: int, B: int, hkv: int, group: int, D: int, C: int, dtype: torch.dtype):
    """Random q, K, V and per-row (start, lens): left padding in row 0, a full row, a length that is not a
    multiple of the block, and (B > 3) a row with nothing valid."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hkv * group, D, generator=gen).to(dtype)
    K = torch.randn(B, hkv, C, D, generator=gen).to(dtype)
    V = torch.randn(B, hkv, C, D, generator=gen).to(dtype)
    start = torch.tensor([5, 0, 17, 9][:B], dtype=torch.int32)
    lens = torch.tensor([C - 3, C, 83, 9][:B], dtype=torch.int32)
    return q, K, V, start, lens


def _poisoned(q: torch.Tensor):
    return torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), dtype=torch.float32)


@pytest.mark.parametrize("group,D", [(3, 64), (6, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_the_float64_reference(group, D, dtype):
    q, K, V, start, lens = _case(1, 4, 2, group, D, 150, dtype)
    out, lse = _poisoned(q)
    decode_attention(q, K, V, start, lens, block_n=32, dot_f32=dtype != torch.float32, out=out, lse=lse)
    ref_out, ref_lse = reference_decode_attention(q, K, V, start, lens)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert torch.allclose(out.double(), ref_out, atol=tol, rtol=tol)
    assert torch.isneginf(lse[3]).all() and (out[3] == 0).all()  # nothing to attend: 0 and -inf, not NaN
    assert torch.allclose(lse[:3].double(), ref_lse[:3], atol=1e-4)


def test_the_reference_is_the_engines_attention():
    """The float64 reference computes what the engine's decode attention computes (bias -inf below ``start``
    and from ``lens`` on, L = the longest row)."""
    q, K, V, start, lens = _case(2, 3, 3, 3, 64, 120, torch.float32)
    L = int(lens.max())
    slot = torch.arange(L)
    bias = torch.where((slot >= start[:, None]) & (slot < lens[:, None]), 0.0, float("-inf"))[:, None, None, :]
    engine = attention(q[:, :, None, :], K, V, bias)[0].view_as(q)
    assert torch.allclose(engine.double(), reference_decode_attention(q, K, V, start, lens)[0], atol=1e-5)


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_decode_attention_over_a_quantized_cache(kv_quant):
    quant = get_kv_quantizer(kv_quant)
    q, K, V, start, lens = _case(3, 3, 2, 3, 64, 130, torch.float32)
    kc, ks = quant.quantize(K)
    vc, vs = quant.quantize(V)
    unit = (quant.widen(kc[:1, :1, :1], torch.float32)[1], quant.widen(vc[:1, :1, :1], torch.float32)[1])
    if kv_quant == "fp8":  # the interpreter reads fp8 through float16 bits as the CPU engine does: widen first
        kc, unit_k = quant.widen(kc, torch.float32)
        vc, unit_v = quant.widen(vc, torch.float32)
        unit = (unit_k, unit_v)
    out, lse = _poisoned(q)
    decode_attention(q, kc, vc, start, lens, k_scale=ks, v_scale=vs, unit=unit, block_n=32, out=out, lse=lse)
    ref_out, _ = reference_decode_attention(q, kc, vc, start, lens, k_scale=ks, v_scale=vs, unit=unit)
    assert torch.allclose(out.double(), ref_out, atol=1e-5)
    # and the engine's own quantized attention agrees
    L = int(lens.max())
    slot = torch.arange(L)
    bias = torch.where((slot >= start[:, None]) & (slot < lens[:, None]), 0.0, float("-inf"))[:, None, None, :]
    codes_k, codes_v = quant.quantize(K)[0], quant.quantize(V)[0]
    engine = attention(q[:, :, None, :], codes_k, codes_v, bias, ks, vs, quant)[0].view_as(q)
    assert torch.allclose(out, engine, atol=1e-4)


@pytest.mark.parametrize("group,D,page", [(3, 64, 16), (6, 128, 8)])
def test_page_attention_in_place_matches_the_gathered_copy(group, D, page):
    q, K, V, start, lens = _case(4, 3, 2, group, D, 160, torch.float32)
    gen = torch.Generator().manual_seed(5)
    k = 4
    pages = torch.full((3, 2, k), -1, dtype=torch.int32)
    for b in range(3):
        n_pages = -(-(int(lens[b]) - int(start[b])) // page)
        for h in range(2):  # ascending, the last page always read (block top-k's rule), -1 after
            chosen = torch.randperm(n_pages - 1, generator=gen)[: min(k, n_pages) - 1].sort().values.tolist()
            row = [*chosen, n_pages - 1]
            pages[b, h, : len(row)] = torch.tensor(row, dtype=torch.int32)
    out, lse = _poisoned(q)
    decode_attention(q, K, V, start, lens, pages=pages, page=page, out=out, lse=lse)
    ref_out, ref_lse = reference_decode_attention(q, K, V, start, lens, pages=pages, page=page)
    assert torch.allclose(out.double(), ref_out, atol=1e-5)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)
    gathered = gathered_attention(q[:, :, None, :], K, V, pages.long(), start.long(), lens.long(), page).view_as(q)
    assert torch.allclose(out, gathered, atol=1e-5)


def test_decode_attention_rejects_what_it_cannot_take():
    q, K, V, start, lens = _case(6, 2, 2, 3, 64, 40, torch.float32)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention(q[:, :5], K, V, start, lens)
    with pytest.raises(ValueError, match="both k_scale and v_scale"):
        decode_attention(q, K, V, start, lens, k_scale=torch.ones(2, 2, 40))
    with pytest.raises(ValueError, match="power of two"):
        decode_attention(q, K, V, start, lens, pages=torch.zeros(2, 2, 1, dtype=torch.int32), page=12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rkv_redundancy_without_the_matrix_matches_the_reference(dtype):
    gen = torch.Generator().manual_seed(7)
    n, H, L, D = 2, 3, 75, 64
    base = torch.randn(n, H, 6, D, generator=gen)  # repeated thoughts: keys near a few directions
    keys = base[:, :, torch.randint(0, 6, (L,), generator=gen)] + 0.6 * torch.randn(n, H, L, D, generator=gen)
    keys = keys.to(dtype)
    valid = torch.ones(n, L, dtype=torch.bool)
    valid[0, :9] = False  # left padding
    valid[1, 40] = False
    got = rkv_redundancy(keys, valid, 0.5, block=16)
    ref = redundancy(keys.float(), valid, 0.5)  # the engine's (its C kernel on CPU, tested equal to the torch path)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-4)
    assert (got[0, :, :9] == 0).all() and torch.allclose(got.sum(-1), torch.ones(n, H))


@pytest.mark.parametrize("group,w,D,reduce", [(3, 8, 64, "max"), (6, 32, 128, "mean"), (3, 5, 64, "mean")])
def test_window_scores_without_the_score_matrix_match_the_engine(group, w, D, reduce):
    from sparserl.rollout.gpu.window_scores import window_scores
    from sparserl.rollout.kv.base import ScoreInputs, window_attention

    gen = torch.Generator().manual_seed(9)
    n, hkv, L = 2, 2, 77
    queries = torch.randn(n, hkv * group, w, D, generator=gen)
    keys = torch.randn(n, hkv, L, D, generator=gen)
    valid = torch.ones(n, L, dtype=torch.bool)
    valid[0, :11] = False  # left padding
    valid[1, 30] = False
    got = window_scores(queries, keys, valid, reduce, block=16, dot_f32=True)
    inp = ScoreInputs(keys=keys, region=slice(0, L), valid=valid, queries=queries, positions=torch.zeros(n, hkv, L))
    ref = window_attention(inp, reduce_group=reduce)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-4)
    assert (got[0, :, :11] == 0).all()
