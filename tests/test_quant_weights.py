"""Quantized sampler weights (rollout.quant, issue 8 item 1): round trips, the int8 product against a
float reference of the same quantized values, the quantized sampler on the tiny model, re-quantization
at every push, bad names."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from sparserl.errors import SparserlError
from sparserl.rollout import native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.model import SamplerModel
from sparserl.rollout.quant import QuantizedLinear, available_quants, build_quant
from sparserl.rollout.quant.fp8 import E4M3, quantize_fp8_per_channel, quantize_fp8_per_token
from sparserl.rollout.quant.int8 import (
    QMAX_FBGEMM,
    Int8Linear,
    cpu_weight_qmax,
    dequantize_int8_per_channel,
    fbgemm_available,
    int8_matmul_per_token,
    quantize_int8_per_channel,
    quantize_int8_per_token,
)
from sparserl.rollout.sampling import SamplingParams

QUANTIZED = [q for q in available_quants() if q != "none"]


def _weight(out=48, inp=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * 0.05
    w[3] = 0.0  # an all-zero row: scale 1, no division by zero
    w[5, 7] = 1.0  # an outlier channel
    return w


def test_names_and_bad_name():
    assert available_quants() == ["fp8", "int8", "int8_group", "int8_weight_only", "none"]
    with pytest.raises(SparserlError, match=r"rollout.quant 'int9' \(did you mean 'int8'\?\)"):
        build_quant("int9")
    with pytest.raises(SparserlError, match="did you mean 'fp8'"):
        RolloutEngine.__init__  # noqa: B018  (the engine passes the name through to SamplerModel)
        build_quant("fp9")


@pytest.mark.parametrize("qmax", [127, QMAX_FBGEMM])
def test_int8_per_channel_round_trip(qmax):
    w = _weight()
    q, s = quantize_int8_per_channel(w, qmax)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (w.shape[0],)
    assert int(q.abs().max()) == qmax  # the row's max lands on the grid's end
    d = dequantize_int8_per_channel(q, s)
    assert ((w - d).abs() <= s[:, None] / 2 * (1 + 1e-6)).all()
    assert s[3] == 1.0 and (q[3] == 0).all()


def test_fp8_per_channel_round_trip():
    w = _weight()
    q, s = quantize_fp8_per_channel(w)
    assert q.dtype == E4M3
    d = q.float() * s[:, None]
    # E4M3 has 3 mantissa bits: relative error <= 2^-4 above the subnormals (2^-6 · s absolute below)
    assert ((w - d).abs() <= torch.maximum(w.abs() / 16, s[:, None] * 2.0**-9) * (1 + 1e-6)).all()
    p, a = quantize_fp8_per_token(torch.randn(5, 40))
    assert p.dtype == E4M3 and a.shape == (5, 1)


def test_int_mm_product_equals_reference_of_the_same_quantized_values():
    w, x = _weight(), torch.randn(7, 40)
    q, s = quantize_int8_per_channel(w)
    p, a = quantize_int8_per_token(x)
    ref = (p.double() @ q.double().t()) * a.double() * s.double()
    y = int8_matmul_per_token(x, q.t(), s)
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rows", [1, 5, 16, 17])
def test_the_int_mm_paths_run_on_cpu_as_on_cuda(rows, monkeypatch):
    """The CUDA paths of int8 / int8_group (torch._int_mm, per group for int8_group), run through
    torch's CPU _int_mm with cuBLASLt's rules checked (an H100 refused anything else): Qᵀ column-major,
    over 16 rows, every size a multiple of 8. The padding changes nothing, and int8_group's per-group
    _int_mm gives the float path's bits (both sums are exact integers)."""
    from sparserl.rollout.quant.int8 import int_mm
    from sparserl.rollout.quant.int8_group import int8_matmul_per_group, quantize_int8_weight_groups, transposed_groups

    real = torch._int_mm

    def cublaslt_int_mm(a, b):
        assert a.shape[0] > 16 and a.shape[0] % 8 == 0 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0, (
            a.shape,
            b.shape,
        )
        assert b.stride(0) == 1, b.stride()  # column-major
        return real(a, b)

    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 80, generator=gen) * torch.logspace(-3, -1, 48)[:, None]
    x = torch.randn(rows, 80, generator=gen)
    q, s = quantize_int8_per_channel(w)
    p, _ = quantize_int8_per_token(x)
    unpadded = int_mm(p, q.t(), pad=False)
    monkeypatch.setattr(torch, "_int_mm", cublaslt_int_mm)
    padded = int_mm(p, q.t(), pad=True)
    assert padded.shape == (rows, 48) and padded.dtype == torch.int32
    assert torch.equal(padded, unpadded)
    assert torch.equal(padded.long(), p.long() @ q.long().t())
    odd_p, odd_q = p[:, :36], q[:44, :36]  # 36 inputs, 44 outputs: padded to multiples of 8 as on CUDA
    assert torch.equal(int_mm(odd_p, odd_q.t(), pad=True).long(), odd_p.long() @ odd_q.long().t())
    assert torch.equal(int_mm(p, q.t().contiguous(), pad=True), padded)  # a row-major Qᵀ is laid out anew
    monkeypatch.setattr(torch, "_int_mm", real)  # int8_group's products below are not padded on CPU
    qg, g = quantize_int8_weight_groups(w, 32)  # groups of 32, 32 and a last one of 16
    floats = int8_matmul_per_group(x, qg, g, 32, use_int_mm=False)
    assert torch.equal(int8_matmul_per_group(x, qg, g, 32, use_int_mm=True), floats)
    # as Int8GroupLinear holds the weight on CUDA: each group's Qᵀ, made once
    groups = transposed_groups(qg, 32)
    assert [t.shape for t in groups] == [(32, 48), (32, 48), (16, 48)] and all(t.t().is_contiguous() for t in groups)
    assert torch.equal(torch.cat([t.t() for t in groups], dim=1), qg)  # Int8GroupLinear.codes() from them
    assert torch.equal(int8_matmul_per_group(x, None, g, 32, q_t_groups=groups), floats)


@pytest.mark.skipif(not fbgemm_available("cpu"), reason="fbgemm (x86 CPU) only")
def test_fbgemm_int8_linear_equals_reference_of_the_same_quantized_values():
    """fbgemm's per-tensor uint8 activation grid on rows scaled to max |x| = 1 (per-token scales),
    7-bit weights without VNNI (no AVX2 saturation), 8-bit with it:
    the float64 product of exactly those integers, within float32
    rounding; and the weight is held once, packed (no float copy, no int8 copy besides fbgemm's)."""
    torch.manual_seed(0)
    w, x = _weight(96, 64), torch.randn(9, 64) * torch.logspace(-2, 1, 9)[:, None]  # rows of very different size
    with native.torch_only():  # else the native kernel runs (test_native_int8_linear_...)
        lin = build_quant("int8").quantize(w)
    assert isinstance(lin, Int8Linear) and lin.kernel == "fbgemm" and lin.q is None
    q, s = quantize_int8_per_channel(w, cpu_weight_qmax())
    assert torch.equal(lin.dequantize(), dequantize_int8_per_channel(q, s))
    m = x.abs().amax(-1, keepdim=True)
    xn = x / m
    scale, zp = torch._choose_qparams_per_tensor(xn, False)
    xq = torch.quantize_per_tensor(xn, scale, zp, torch.quint8).int_repr().double()
    ref = ((xq - zp) @ q.double().t()) * scale * s.double() * m.double()
    with native.torch_only():
        y = lin(x)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()))
    # per token: the small rows are quantized on their own grid (relative error like the big rows')
    err = (y - x @ w.t()).norm(dim=-1) / (x @ w.t()).norm(dim=-1)
    assert float(err.max()) < 0.05


@pytest.mark.skipif(native.library() is None, reason="no C compiler: no native kernels")
@pytest.mark.parametrize("rows,out_features,in_features", [(16, 96, 64), (5, 33, 18), (1, 16, 4), (64, 40, 1537)])
def test_native_int8_linear_equals_reference_of_the_same_quantized_values(rows, out_features, in_features):
    """The AVX2 kernel (linear_int8.c): symmetric per-token 8-bit activations P = round(x / a),
    7-bit weights (8-bit with VNNI); the float64 product of exactly those integers, within float32 rounding. Row
    counts off the 4-row tile, N off the 16-column panel, K off the 4-byte group."""
    gen = torch.Generator().manual_seed(rows + in_features)
    w = torch.randn(out_features, in_features, generator=gen) * 0.05
    x = torch.randn(rows, in_features, generator=gen) * torch.logspace(-2, 1, rows)[:, None]
    b = torch.randn(out_features, generator=gen)
    lin = build_quant("int8").quantize(w)
    assert lin.kernel == "native" and build_quant("int8").kernel_on("cpu") == "native"
    assert lin.q is None  # the panels are the only copy of the codes
    q, s = quantize_int8_per_channel(w, cpu_weight_qmax())
    assert torch.equal(lin.dequantize(), dequantize_int8_per_channel(q, s))
    a = torch.where(x.abs().amax(-1, keepdim=True) > 0, x.abs().amax(-1, keepdim=True) / 127, torch.ones(1))
    p = torch.round(x * (1.0 / a)).clamp(-127, 127)  # the kernel multiplies by 1/a
    ref = (p.double() @ q.double().t()) * a.double() * s.double() + b.double()
    y = lin(x, b)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    portable = native.load(native.build(flags=native.flags_for("")))
    y2 = native.linear_int8(x, native.pack_int8(q, lib=portable), s, b, lib=portable)
    assert torch.allclose(y2.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    with native.torch_only():  # fbgemm's copy, made on first use: the same weight, its own activation grid
        y3 = lin(x, b)
    assert float((y3 - y).norm() / y.norm()) < 0.02


def _group_reference(x, q, g, b, group):
    """float64 ``Σ_j a_tj g_nj Σ_{k ∈ j} P_tk Q_nk + b`` with a_tj = max |x| of group j / 127."""
    rows, k = x.shape
    out = torch.zeros(rows, q.shape[0], dtype=torch.float64)
    for j in range(-(-k // group)):
        cols = slice(j * group, min(k, (j + 1) * group))
        m = x[:, cols].abs().amax(-1, keepdim=True)
        a = torch.where(m > 0, m / 127, torch.ones(1))
        p = torch.round(x[:, cols] * (1.0 / a)).clamp(-127, 127)  # the kernel multiplies by 1/a
        out += (p.double() @ q[:, cols].double().t()) * a.double() * g[:, j].double()[None, :]
    return out + b.double()


@pytest.mark.parametrize(
    "rows,out_features,in_features,group",
    [(16, 96, 128, 64), (5, 33, 150, 64), (1, 16, 4, 4), (64, 40, 1537, 64), (3, 20, 96, 32)],
)
def test_int8_group_linear_equals_reference_of_the_same_quantized_values(rows, out_features, in_features, group):
    """int8_group: 8-bit weights (|Q| ≤ 127) with a scale per output and group of G inputs,
    activations per token and group; every kernel (the AVX2 one, its portable build, the torch
    path) equals the float64 product of exactly those integers within float32 rounding. Shapes off
    the tile, the panel, the 4-byte group and with a last shorter group; activations with an
    outlier channel, weights with an outlier column and rows of very different sizes."""
    from sparserl.rollout.quant.int8_group import Int8GroupLinear, int8_matmul_per_group, quantize_int8_weight_groups

    gen = torch.Generator().manual_seed(rows + in_features)
    w = torch.randn(out_features, in_features, generator=gen) * torch.logspace(-3, -1, out_features)[:, None]
    w[:, -1] *= 40  # an outlier weight column: it sets the scale of its group only
    x = torch.randn(rows, in_features, generator=gen) * torch.logspace(-2, 1, rows)[:, None]
    x[:, 0] *= 50  # an outlier channel: it sets the scale of its group only
    b = torch.randn(out_features, generator=gen)
    q, g = quantize_int8_weight_groups(w, group)
    assert g.shape == (out_features, -(-in_features // group))
    assert int(q.abs().max()) == 127  # the full grid
    if in_features > group:  # the scales differ along a row: not one per channel
        assert bool((g.amax(1) > g.amin(1) * 1.5).any())
    ref = _group_reference(x, q, g, b, group)
    tol = dict(rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    torch.testing.assert_close((int8_matmul_per_group(x, q, g, group) + b).double(), ref, **tol)
    if native.library() is not None:
        lin = Int8GroupLinear(q, g, group)
        assert lin.kernel == "native" and lin.q is None and torch.equal(lin.codes(), q)
        torch.testing.assert_close(lin(x, b).double(), ref, **tol)
        portable = native.load(native.build(flags=native.flags_for("")))
        y2 = native.linear_int8(
            x,
            native.pack_int8(q, lib=portable),
            torch.ones(out_features),
            b,
            group=group,
            group_scales=native.pack_group_scales(g, lib=portable),
            lib=portable,
        )
        torch.testing.assert_close(y2.double(), ref, **tol)
        with native.torch_only():
            torch.testing.assert_close(lin(x, b).double(), ref, **tol)


@pytest.mark.skipif(not native.int8_group_u8(), reason="the unsigned-code group tile needs an AVX512 VNNI build")
@pytest.mark.parametrize(
    "rows,out_features,in_features,group",
    [(16, 96, 128, 64), (5, 33, 150, 64), (1, 16, 4, 4), (7, 40, 1537, 64), (3, 70, 96, 32)],
)
def test_int8_group_wide_tile_gives_the_signed_tiles_bits(rows, out_features, in_features, group):
    """With the group column sums, int8_group runs on the per-token kernel's unsigned codes (P + 128)
    and 512-bit tile: sum U Q - 128 cs = sum P Q exactly, then the same float operations, so the
    same bits as the signed tile, with and without outlier channels."""
    from sparserl.rollout.quant.int8_group import Int8GroupLinear, quantize_int8_weight_groups

    gen = torch.Generator().manual_seed(rows * in_features)
    w = torch.randn(out_features, in_features, generator=gen) * torch.logspace(-3, -1, out_features)[:, None]
    x = torch.randn(rows, in_features, generator=gen)
    x[:, 0] *= 50
    b = torch.randn(out_features, generator=gen)
    lin = Int8GroupLinear(*quantize_int8_weight_groups(w, group), group)
    ones, packed, sums = lin.kernel_scales
    assert sums is not None and sums.dtype == torch.int32
    wide = native.linear_int8(x, lin.native, ones, b, group=group, group_scales=packed, group_colsum=sums)
    signed = native.linear_int8(x, lin.native, ones, b, group=group, group_scales=packed)
    assert torch.equal(wide, signed)
    if in_features > 8:
        idx = torch.tensor([0, in_features // 2], dtype=torch.int32)
        panels = native.pack_outliers(w[:, idx.long()].contiguous())
        args = (x, lin.native, ones, idx, panels)
        assert torch.equal(
            native.linear_int8_outliers(*args, group=group, group_scales=packed, group_colsum=sums),
            native.linear_int8_outliers(*args, group=group, group_scales=packed),
        )


@pytest.mark.skipif(native.library() is None, reason="no C compiler: no native kernels")
@pytest.mark.parametrize("group", [None, 8])
def test_native_activation_codes_round_half_to_even_as_torch(group):
    """The kernels' vectorised quantization (8 lanes, then a scalar tail) gives torch.round's codes,
    ties to even included: every row's max is 127 (scale 1), the other inputs are k + 0.5, and one
    weight column per input reads each code back exactly."""
    k = 37 if group is None else 40  # a tail past the 8-lane loop; group: 5 groups of 8
    x = torch.arange(k, dtype=torch.float32)[None].repeat(3, 1) % 9 - 4.5  # -4.5 .. 3.5
    x[0] *= -1
    x[:, 0] = 127.0  # max |x| = 127 → a = 1 (per token, and per group for group 0)
    if group is not None:
        x[:, ::group] = 127.0  # every group's max is 127
    q = torch.zeros(k, k, dtype=torch.int8)
    q.fill_diagonal_(1)  # output n = code of input n
    s = torch.ones(k)
    packed = native.pack_int8(q)
    y = native.linear_int8(x, packed, s, group=group)
    assert torch.equal(y, torch.round(x))  # 2.5 → 2, -3.5 → -4, 0.5 → 0


def test_int8_group_size_reaches_the_kernel_and_bad_sizes_are_refused(tiny):
    """rollout.quant_group → the quantizer → every linear of the sampler; 32 differs from 64 in its
    products; sizes the kernel cannot take are refused by name."""
    from sparserl.rollout.quant import build_quant as build

    assert build("int8_group").group == 64 and build("int8_group", group=32).group == 32
    assert not hasattr(build("int8", group=32), "group")  # quantizers without groups ignore it
    for bad in (6, 0, -4, 2.0, True):
        with pytest.raises(ValueError, match="int8_group: group must be a positive multiple of 4"):
            build("int8_group", group=bad)
    m32 = SamplerModel(tiny.model, torch.float32, quant="int8_group", quant_group=32)
    m64 = SamplerModel(tiny.model, torch.float32, quant="int8_group")
    assert {lw.qkv.group for lw in m32.layers} == {32} and {lw.down.group for lw in m64.layers} == {64}
    x = torch.randn(3, m32.layers[0].qkv.in_features, device=m32.device)
    x[:, 1] *= 30
    assert not torch.equal(m32.layers[0].qkv(x), m64.layers[0].qkv(x))


def test_int8_group_is_closer_than_per_token_on_outlier_channels():
    """Why the group scales: one outlier input channel spoils a per-token scale for every channel,
    a group scale only for its own group. (The error halves or better where ``int8`` has the 7-bit
    weight grid; with VNNI both have the 8-bit one and only the activation grids differ.)"""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=gen) * 0.05
    x = torch.randn(8, 256, generator=gen)
    x[:, 3] *= 100
    ref = x @ w.t()
    err = {name: float((build_quant(name).quantize(w)(x) - ref).norm() / ref.norm()) for name in ("int8", "int8_group")}
    assert err["int8_group"] < 0.6 * err["int8"]


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_linear_close_to_float_and_shapes(name):
    w, b, x = _weight(), torch.randn(48), torch.randn(2, 3, 40)
    lin = build_quant(name).quantize(w)
    assert isinstance(lin, QuantizedLinear) and lin.shape == w.shape
    # 1 byte a weight + one float32 scale a row; int8_group (40 inputs: one group) also the group's
    # column sums where its wide tile reads them
    wide = name == "int8_group" and native.int8_group_u8()
    assert lin.nbytes() == w.numel() + 4 * w.shape[0] * (2 if wide else 1)
    y = lin(x, b)
    ref = torch.nn.functional.linear(x, w, b)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert float((y - ref).norm() / ref.norm()) < 0.06
    assert float((y - ref).norm() / ref.norm()) > 0  # it is quantized


def test_fp8_is_labelled_emulated_without_scaled_mm():
    q = build_quant("fp8")
    lin = q.quantize(_weight())
    assert lin.emulated and lin.kernel == "emulated" and q.emulated_on("cpu")
    assert not build_quant("int8").emulated_on("cpu")


def _cpu_scaled_mm() -> bool:
    try:
        e4m3 = torch.zeros(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(e4m3, e4m3.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


@pytest.mark.skipif(not _cpu_scaled_mm(), reason="this torch has no row-wise torch._scaled_mm on CPU")
@pytest.mark.parametrize("rows", [1, 5, 16, 33])
def test_fp8_scaled_mm_branch_equals_the_emulation(rows):
    """The GPU branch of Fp8Linear (torch._scaled_mm with row-wise scales, bfloat16 out), run through
    torch's CPU implementation of the same call (~30x slower than float32 here, so never chosen on
    a CPU): the emulation's numbers up to the bfloat16 output's rounding. It checks the call itself
    (operand layout, scale shapes, output dtype), which no GPU has run in this project yet."""
    gen = torch.Generator().manual_seed(rows)
    lin = build_quant("fp8").quantize(torch.randn(48, 64, generator=gen) * torch.logspace(-3, -1, 48)[:, None])
    x = torch.randn(rows, 64, generator=gen) * 2
    emulated = lin.matmul(x)
    lin.emulated = False
    kernel = lin.matmul(x)
    assert kernel.dtype == torch.float32 and kernel.shape == emulated.shape
    torch.testing.assert_close(kernel, emulated, rtol=2**-8, atol=1e-6 * float(emulated.abs().max()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("name", QUANTIZED)
def test_cuda_kernels_match_their_float_reference(name):
    """On CUDA (torch._int_mm, torch._scaled_mm), shapes cuBLASLt does not take as they are included:
    5 rows, 40 inputs (not multiples of 8 or 16)."""
    w, x = _weight().cuda(), torch.randn(5, 40, device="cuda")
    lin = build_quant(name).quantize(w)
    ref = x.double() @ lin.dequantize().double().t()
    assert float((lin(x).double() - ref).norm() / ref.norm()) < 0.05


# --- the sampler ------------------------------------------------------------------------------------
def _prefill_logprobs(model: SamplerModel, ids: torch.Tensor, logit_scale: float = 1.0) -> torch.Tensor:
    ids = ids.to(model.device)
    valid = torch.ones_like(ids, dtype=torch.bool)
    pos = torch.arange(ids.shape[1], device=ids.device)[None].expand_as(ids)
    return torch.log_softmax(logit_scale * model.logits(model.hidden_states(ids, valid, pos)).float(), -1).cpu()


ALPHA_IDS = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))


def _entropy(lp: torch.Tensor) -> torch.Tensor:
    return -(lp.exp() * lp).sum(-1)


def _acceptance(lp: torch.Tensor, lq: torch.Tensor) -> tuple[float, float]:
    """Mean and minimum over positions of the acceptance α = Σ_x min(p(x), q(x)) of q against p."""
    alpha = torch.minimum(lp, lq).exp().sum(-1)
    return float(alpha.mean()), float(alpha.min())


def _close_to_dense(lp: torch.Tensor, lq: torch.Tensor) -> bool:
    """The criterion a quantized sampler meets on the peaked model: mean α > 0.97, every position > 0.85."""
    mean, low = _acceptance(lp, lq)
    return mean > 0.97 and low > 0.85


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_sampler_weights_bytes_and_logprobs(peaked, name):
    dense = SamplerModel(peaked.model, torch.float32, quant="none")
    qm = SamplerModel(peaked.model, torch.float32, quant=name)
    assert qm.quant == name and qm.last_quantize_s > 0 and dense.last_quantize_s == 0
    for lw in qm.layers:  # every layer linear quantized; no float copy kept
        assert all(isinstance(w, QuantizedLinear) for w in (lw.qkv, lw.o, lw.gate_up, lw.down))
    assert isinstance(qm.lm_head, torch.Tensor) and qm.lm_head.dtype == torch.float32  # head stays float
    layer_float = sum(w.numel() * 4 for lw in dense.layers for w in (lw.qkv, lw.o, lw.gate_up, lw.down))
    assert dense.weight_bytes() - qm.weight_bytes() > 0.7 * layer_float  # ~3/4 of the layers' bytes gone
    lp, lq = _prefill_logprobs(dense, ALPHA_IDS), _prefill_logprobs(qm, ALPHA_IDS)
    assert float(_entropy(lp).mean()) < 2.0  # peaked: α can tell samplers apart
    assert _close_to_dense(lp, lq), _acceptance(lp, lq)
    assert float((lp - lq).abs().max()) > 0  # it is quantized


def test_the_acceptance_criterion_fails_a_sampler_with_logits_shrunk_to_70_percent(tiny, peaked):
    dense = SamplerModel(peaked.model, torch.float32, quant="none")
    lp, shrunk = _prefill_logprobs(dense, ALPHA_IDS), _prefill_logprobs(dense, ALPHA_IDS, logit_scale=0.7)
    assert not _close_to_dense(lp, shrunk), _acceptance(lp, shrunk)
    # on the nearly uniform tiny model itself the same distortion passes: why the test needs `peaked`
    flat = SamplerModel(tiny.model, torch.float32, quant="none")
    lp, shrunk = _prefill_logprobs(flat, ALPHA_IDS), _prefill_logprobs(flat, ALPHA_IDS, logit_scale=0.7)
    assert float(_entropy(lp).mean()) > 10.0 and _close_to_dense(lp, shrunk)


#: the largest gap between a quantized sampler's log-probs and the dense forward's on its own tokens, on the
#: peaked model (measured: int8 0.006, fp8 0.15; a dense sampler with logits scaled by 0.7: 1.8 and more)
ENGINE_LOGPROB_ATOL = {"int8": 0.05, "fp8": 0.3}


@pytest.mark.parametrize("name,logit_scale", [("int8", 1.0), ("fp8", 1.0), ("none", 0.7)])
def test_quantized_engine_generates_with_close_logprobs(peaked, name, logit_scale):
    """The dense sampler scores the quantized sampler's tokens: log-probs within ENGINE_LOGPROB_ATOL, on the
    peaked model. The bound has teeth: an unquantized sampler with logits x0.7 (temperature 1/0.7) exceeds
    even the loosest one (on the nearly uniform tiny model it stays within 0.13)."""
    params = SamplingParams(n=2, max_new_tokens=6, ignore_eos=True, seed=0, temperature=1.0 / logit_scale)
    q_engine = RolloutEngine(peaked, build_compressor("none"), quant=name)
    out = q_engine.generate(["Once upon a time"], params)
    assert [len(r) for r in out.response_ids] == [6, 6]
    dense = RolloutEngine(peaked, build_compressor("none")).model
    gaps = []
    for prompt, resp, lq in zip(out.prompt_ids, out.response_ids, out.sampler_logprobs):
        ids = torch.tensor([prompt + resp])
        lp = _prefill_logprobs(dense, ids)[0, len(prompt) - 1 : -1].gather(-1, torch.tensor(resp)[:, None])[:, 0]
        gaps.append(float((lp - torch.tensor(lq)).abs().max()))
    if logit_scale == 1.0:
        assert max(gaps) <= ENGINE_LOGPROB_ATOL[name], gaps
        assert max(gaps) > 0  # it is quantized
    else:
        assert min(gaps) > max(ENGINE_LOGPROB_ATOL.values()), gaps


def test_update_weights_requantizes(tiny):
    engine = RolloutEngine(tiny, build_compressor("none"), quant="int8")
    before = engine.model.layers[0].qkv.dequantize().clone()
    state = copy.deepcopy(tiny.model.state_dict())
    engine.update_weights(state)  # same weights: same quantized values
    assert torch.equal(engine.model.layers[0].qkv.dequantize(), before)
    state["model.layers.0.self_attn.q_proj.weight"] = state["model.layers.0.self_attn.q_proj.weight"] * 1.5 + 0.01
    engine.update_weights(state)
    after = engine.model.layers[0].qkv.dequantize()
    assert not torch.equal(after, before)
    assert engine.model.last_quantize_s > 0
    q_rows = (
        tiny.model.config.num_attention_heads * tiny.model.config.head_dim
        if hasattr(tiny.model.config, "head_dim")
        else None
    )
    ref = dequantize_int8_per_channel(
        *quantize_int8_per_channel(
            torch.cat([state[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"]),
            cpu_weight_qmax() if fbgemm_available("cpu") else 127,
        )
    )
    assert torch.equal(after, ref)  # exactly the new weights' quantization
    assert q_rows is None or q_rows <= after.shape[0]


def test_quant_with_compiled_decode_matches_eager(tiny):
    """The compiled decode step runs the quantized linears too (aot_eager: the same capture)."""
    params = SamplingParams(n=2, max_new_tokens=4, ignore_eos=True, seed=0)
    eager = RolloutEngine(tiny, build_compressor("none"), quant="int8").generate(["hi there"], params)
    comp = RolloutEngine(tiny, build_compressor("none"), quant="int8", compile="aot_eager").generate(
        ["hi there"], params
    )
    assert comp.response_ids == eager.response_ids
    assert torch.allclose(torch.tensor(comp.sampler_logprobs), torch.tensor(eager.sampler_logprobs), atol=1e-5)


def test_bad_quant_name_on_engine(tiny):
    with pytest.raises(SparserlError, match="did you mean 'int8'"):
        RolloutEngine(tiny, build_compressor("none"), quant="int08")


@pytest.mark.parametrize("in_features", [576, 150])
def test_int8_group_runs_the_unsigned_tile_on_256_bit_vnni(in_features, avx2_build, avx_vnni_build):
    """An AVX-VNNI build without AVX512 (16-column panels, vpdpbusd on 32 bytes) runs int8_group on
    the per-token kernel's unsigned-code tile, and per-token int8 on the full grid: the same bits as
    the plain AVX2 build's signed group tile, with group weight scales, a last shorter group
    (K = 150), a partial panel (N = 200) and outlier channels."""
    from sparserl.rollout.quant.int8_group import quantize_int8_weight_groups

    vnni, avx2 = avx_vnni_build, avx2_build
    assert native.int8_group_u8(vnni) and native.int8_full_range(vnni)
    assert not native.int8_group_u8(avx2) and vnni.sparserl_int8_panel_width() == 16
    gen = torch.Generator().manual_seed(in_features)
    w = torch.randn(200, in_features, generator=gen) * torch.logspace(-3, -1, 200)[:, None]
    x = torch.randn(19, in_features, generator=gen) * 3
    x[:, 5] *= 40
    b = torch.randn(200, generator=gen)
    q, g = quantize_int8_weight_groups(w, 64)
    ones = torch.ones(200)
    sums = native.pack_group_colsums(q, 64, lib=vnni)
    assert sums is not None and native.pack_group_colsums(q, 64, lib=avx2) is None

    def product(lib, **kw):
        return native.linear_int8(
            x,
            native.pack_int8(q, lib=lib),
            ones,
            b,
            group=64,
            group_scales=native.pack_group_scales(g, lib=lib),
            lib=lib,
            **kw,
        )

    signed = product(avx2)
    assert torch.equal(product(vnni, group_colsum=sums), signed)
    idx = torch.tensor([5, 77], dtype=torch.int32)
    outliers = [
        native.linear_int8_outliers(
            x,
            native.pack_int8(q, lib=lib),
            ones,
            idx,
            native.pack_outliers(w[:, idx.long()].contiguous(), lib=lib),
            group=64,
            group_scales=native.pack_group_scales(g, lib=lib),
            group_colsum=native.pack_group_colsums(q, 64, lib=lib),
            lib=lib,
        )
        for lib in (vnni, avx2)
    ]
    assert outliers[0] is not None and torch.equal(outliers[0], outliers[1])
    qt, st = quantize_int8_per_channel(w, 127)  # per token on the full grid: exact with VNNI
    per_token = [
        native.linear_int8(x, native.pack_int8(qt, lib=lib), st, b, lib=lib) for lib in (vnni, native.library())
    ]
    assert torch.equal(per_token[0], per_token[1])


@pytest.mark.parametrize("group", [None, 64])
def test_int8_kernels_give_the_same_bits_with_and_without_vnni(group, avx2_build):
    """On a VNNI CPU the native build multiplies with vpdpbusd, the AVX2 build with vpmaddubsw +
    vpmaddwd; with AVX512 the panels are 32 columns wide (16 without). The same int32 sums (no pair
    sum can saturate on either grid), so the same outputs, bit for bit; N = 200 leaves a partial
    panel in both layouts. Elsewhere both builds run the AVX2 code and the test still holds."""
    avx2 = avx2_build
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(200, 576, generator=gen) * 0.05
    x = torch.randn(19, 576, generator=gen) * 3
    x[:, 5] *= 40  # an outlier channel
    b = torch.randn(200, generator=gen)
    q, s = quantize_int8_per_channel(w, 127 if group else QMAX_FBGEMM)
    y_native = native.linear_int8(x, native.pack_int8(q), s, b, group=group)
    y_avx2 = native.linear_int8(x, native.pack_int8(q, lib=avx2), s, b, group=group, lib=avx2)
    assert torch.equal(y_native, y_avx2)
    if " avx512bw" in Path("/proc/cpuinfo").read_text():  # 32-column panels without VNNI: vpmaddubsw on 64 bytes
        bw = native.load(native.build(flags=native.flags_for("-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl")))
        assert torch.equal(native.linear_int8(x, native.pack_int8(q, lib=bw), s, b, group=group, lib=bw), y_avx2)


def test_fp8_weights_are_laid_out_as_cuda_scaled_mm_takes_them(monkeypatch):
    """``torch._scaled_mm`` on CUDA takes inputs and outputs in multiples of 16 only, Qᵀ column-major
    (an H100 refused 40 inputs). Run here through torch's CPU ``_scaled_mm`` with those rules checked:
    a 44 x 40 weight is held padded to 48 x 48 and gives the emulation's product (bf16 output)."""
    from sparserl.rollout.quant import fp8

    calls = []

    def strict_scaled_mm(a, b, **kw):
        assert a.shape[1] % 16 == 0 and b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0, (a.shape, b.shape)
        assert b.stride(0) == 1  # column-major
        calls.append(b.shape)
        return real(a, b, **kw)

    real = torch._scaled_mm
    try:  # torch's CPU _scaled_mm took per-tensor scales only before 2.13 (the GPU machine's torch 2.11)
        real(torch.zeros(16, 16, dtype=torch.float8_e4m3fn), torch.zeros(16, 16, dtype=torch.float8_e4m3fn).t(),
             scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)  # fmt: skip
    except RuntimeError as err:
        if "per-tensor scaling" not in str(err):
            raise
        pytest.skip("this torch's CPU _scaled_mm takes per-tensor scales only")
    w, x = _weight(out=44, inp=40), torch.randn(5, 40)
    emulated = build_quant("fp8").quantize(w)
    monkeypatch.setattr(fp8, "scaled_mm_available", lambda device: True)
    monkeypatch.setattr(torch, "_scaled_mm", strict_scaled_mm)
    kernel = build_quant("fp8").quantize(w)
    assert kernel.kernel == "_scaled_mm" and kernel.q.shape == (48, 48)
    assert torch.equal(kernel.dequantize(), emulated.dequantize())  # the padding is outside the weight
    got, want = kernel(x), emulated(x)
    assert calls == [(48, 48)] and got.shape == (5, 44)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7 * float(want.abs().max()))
