"""Outlier input channels in float32 (rollout.quant_outliers; LLM.int8's decomposition with the
channels fixed per push): the split is exact where it should be, cuts int8 error on inputs with
outlier channels, the channels are chosen on the calibration at every push (deterministically),
the native descriptor computes what the eager product does to the bit, the 8-bit weight grid
where the CPU's int8 products are exact, and the bad inputs."""

from __future__ import annotations

import pytest
import torch

from sparserl import cli
from sparserl.config import ConfigError, load_config, validate
from sparserl.rollout import native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.model import QUANTIZED_FIELDS
from sparserl.rollout.quant import build_quant
from sparserl.rollout.quant.int8 import QMAX, QMAX_FBGEMM, Int8Linear, cpu_weight_qmax, quantize_int8_per_channel
from sparserl.rollout.quant.outliers import OutlierLinear, check_outliers, outlier_channels
from sparserl.rollout.quant.smooth import SmoothedLinear

ENGINE = dict(dtype=torch.float32)


def _outlier_input(rows=16, inp=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=g)
    x[:, 5] *= 80.0  # outlier channels, as in SmolLM2's down-projection inputs
    x[:, 40] *= 30.0
    w = torch.randn(48, inp, generator=g) * 0.05
    return x, w


def test_channels_are_the_largest_ascending():
    amax = torch.tensor([1.0, 9.0, 0.5, 7.0, 3.0])
    assert outlier_channels(amax, 2).tolist() == [1, 3]
    assert outlier_channels(amax, 0).tolist() == []
    with pytest.raises(
        ValueError, match="rollout.quant_outliers=5: 5 outlier channels leave none of a linear's 5 inputs"
    ):
        outlier_channels(amax, 5)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_count_must_be_a_non_negative_integer(bad):
    with pytest.raises((ValueError, TypeError)):
        check_outliers(bad)


@pytest.mark.parametrize("name", ["int8", "int8_group", "fp8"])
def test_split_is_the_quantized_rest_plus_the_float_outliers(name):
    x, w = _outlier_input()
    qz = build_quant(name)
    idx = outlier_channels(x.abs().amax(0), 2)
    assert idx.tolist() == [5, 40]
    lin = OutlierLinear.quantize(qz, w, idx)
    # the outlier columns are held exactly; the rest is the quantizer's own weight of W with them zeroed
    deq = lin.dequantize()
    assert torch.equal(deq[:, idx], w[:, idx])
    rest_w = w.clone()
    rest_w[:, idx] = 0
    torch.testing.assert_close(deq, qz.quantize(rest_w).dequantize() + (w - rest_w), rtol=0, atol=0)
    # the product: the quantized product of the inputs with the outliers zeroed, plus theirs in float
    rest_x = x.clone()
    rest_x[:, idx] = 0
    expect = qz.quantize(rest_w)(rest_x) + x[:, idx] @ w[:, idx].t()
    torch.testing.assert_close(lin(x), expect, rtol=1e-5, atol=1e-5)
    # and it is closer to the float product than the plain quantized one
    ref = x @ w.t()
    err_plain = (qz.quantize(w)(x) - ref).norm() / ref.norm()
    err_split = (lin(x) - ref).norm() / ref.norm()
    assert err_split < 0.5 * err_plain, (err_split, err_plain)
    assert lin.nbytes() == qz.quantize(rest_w).nbytes() + 4 * 2 * w.shape[0] + 4 * 2


@pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")
@pytest.mark.parametrize(
    "name,smooth,accumulate,bias",
    [
        ("int8", False, 0, False),
        ("int8", True, 1, True),
        ("int8_group", True, 0, True),
        ("int8_group", False, 1, False),
    ],
)
def test_native_descriptor_is_the_eager_product(name, smooth, accumulate, bias):
    """decode_layer.c's sparserl_apply with outlier channels (and SmoothQuant, a bias, accumulating
    into the residual stream) gives the eager OutlierLinear's bits."""
    from sparserl.rollout.fused import weight_descriptor

    x, w = _outlier_input(rows=7, inp=96)
    b = torch.randn(w.shape[0]) if bias else None
    lin = OutlierLinear.quantize(build_quant(name), w, outlier_channels(x.abs().amax(0), 3))
    if smooth:
        lin = SmoothedLinear(lin, torch.rand(w.shape[1]) + 0.5)
    desc = weight_descriptor(lin, b)
    assert desc is not None and desc.n_outliers == 3
    h = torch.randn(7, w.shape[0])
    y = h.clone()
    assert native.library().sparserl_apply(desc, 7, x.data_ptr(), x.shape[1], y.data_ptr(), w.shape[0], accumulate) == 0
    eager = lin(x, b)
    assert torch.equal(y, h + eager if accumulate else eager)


@pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")
def test_native_descriptor_rejects_bad_outliers():
    lib = native.library()
    x, w = _outlier_input(rows=2, inp=64)
    lin = OutlierLinear.quantize(build_quant("int8"), w, torch.tensor([5]))
    from sparserl.rollout.fused import weight_descriptor

    desc = weight_descriptor(lin)
    y = torch.full((2, 48), 7.0)
    desc.n_outliers = -1
    assert lib.sparserl_apply(desc, 2, x.data_ptr(), 64, y.data_ptr(), 48, 0) == -1
    desc.n_outliers, desc.kind = 1, native.Weight.FLOAT32  # float weights have no outlier part
    assert lib.sparserl_apply(desc, 2, x.data_ptr(), 64, y.data_ptr(), 48, 0) == -1
    assert torch.equal(y, torch.full((2, 48), 7.0))
    # indices and panels come together, of matching size
    assert (
        native.Weight.of(
            native.Weight.INT8,
            lin.inner.native[0],
            48,
            64,
            colsum=lin.inner.native[1],
            scales=lin.inner.scales,
            outlier_idx=lin.idx32,
        )
        is None
    )


@pytest.mark.parametrize("smooth", [0.0, 0.5])
def test_sampler_chooses_channels_at_every_push(tiny, smooth):
    engine = RolloutEngine(
        tiny, build_compressor("none"), quant="int8", quant_outliers=3, quant_smooth=smooth, **ENGINE
    )
    m = engine.model
    for f in QUANTIZED_FIELDS:
        w = getattr(m.layers[0], f)
        if smooth:
            assert isinstance(w, SmoothedLinear)
            w = w.inner
        assert isinstance(w, OutlierLinear) and w.idx.numel() == 3
    again = RolloutEngine(
        tiny, build_compressor("none"), quant="int8", quant_outliers=3, quant_smooth=smooth, **ENGINE
    ).model

    def down(model):
        return model.layers[1].down.inner if smooth else model.layers[1].down

    assert torch.equal(down(again).idx, down(m).idx)  # the same weights choose the same channels
    ids = torch.tensor([[5, 9, 2, 7, 3, 11, 4, 8]])
    valid, pos = torch.ones_like(ids, dtype=torch.bool), torch.arange(8)[None]
    dense = RolloutEngine(tiny, build_compressor("none"), **ENGINE).model
    ref = dense.logits(dense.hidden_states(ids, valid, pos))
    out = m.logits(m.hidden_states(ids, valid, pos))
    plain = RolloutEngine(tiny, build_compressor("none"), quant="int8", quant_smooth=smooth, **ENGINE).model
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()
    assert (out - ref).norm() < (plain.logits(plain.hidden_states(ids, valid, pos)) - ref).norm()
    # a push with an input channel of layer 0's MLP made dominant: it becomes an outlier of down
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    hot = int(down(m).idx.max()) + 1 if int(down(m).idx.max()) + 1 < m.layers[0].down.shape[1] else 0
    while hot in down(m).idx.tolist():
        hot += 1
    state["model.layers.1.mlp.up_proj.weight"][hot] *= 200.0
    m.load_weights(state)
    assert hot in down(m).idx.tolist()


def test_needs_an_activation_quantizer(tiny):
    with pytest.raises(ValueError, match="quant_outliers needs a quantization of the activations"):
        RolloutEngine(tiny, build_compressor("none"), quant="int8_weight_only", quant_outliers=4, **ENGINE)


def test_config_key_and_its_errors():
    cfg = validate(load_config("qurl", ["rollout.quant_outliers=16"]))
    assert cfg.rollout.quant_outliers == 16
    with pytest.raises(ConfigError, match=r"rollout.quant_outliers=4 needs rollout.quant int8, int8_group or fp8"):
        validate(load_config("sparse_rl_fixed40", ["rollout.quant_outliers=4"]))
    with pytest.raises(ConfigError, match="quant_outliers"):
        load_config("qurl", ["rollout.quant_outliers=-1"])


def test_bench_option_is_checked(capsys):
    assert cli.main(["bench", "rollout", "--quant", "int8", "--quant-outliers", "-2"]) != 0
    assert "--quant-outliers -2: must be a whole number >= 0" in capsys.readouterr().err


@pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")
def test_weight_grid_is_full_where_the_products_are_exact():
    """With VNNI the native kernel adds u8 x s8 products in 32 bits: |Q| = 127 codes against extreme
    activations give the float64 product of the same integers (the AVX2 kernel would saturate)."""
    assert cpu_weight_qmax() == (QMAX if native.int8_full_range() else QMAX_FBGEMM)
    if not native.int8_full_range():
        pytest.skip("this CPU's int8 products saturate past |Q| = 64")
    gen = torch.Generator().manual_seed(3)
    q = torch.where(torch.rand(40, 96, generator=gen) < 0.5, 127, -127).to(torch.int8)
    s = torch.rand(40, generator=gen) + 0.5
    x = torch.randn(5, 96, generator=gen)
    x = x.sign() * x.abs().amax(-1, keepdim=True)  # every code at +-127: the largest pair sums
    a = x.abs().amax(-1, keepdim=True) / 127
    p = torch.round(x * (1.0 / a)).clamp(-127, 127)
    ref = (p.double() @ q.double().t()) * a.double() * s.double()
    y = native.linear_int8(x, native.pack_int8(q), s)
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))


@pytest.mark.skipif(native.library() is None, reason="native kernels unavailable")
@pytest.mark.parametrize("group", [None, 64])
def test_outlier_kernel_gives_the_same_bits_in_every_build(group, avx2_build):
    """The float32 part is a chain of fmaf per output, in the same order whatever the vector width:
    the native build (AVX512 + VNNI here) and the plain-AVX2 build agree bit for bit. N = 200 leaves
    a partial panel; the codes are on the grid both builds multiply exactly. With groups the native
    build runs int8_group's wide unsigned-code tile where it has one, the AVX2 build its signed
    tile: the same bits too."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(200, 576, generator=gen) * 0.05
    x = torch.randn(19, 576, generator=gen) * 3
    x[:, [5, 300]] *= 40
    idx = torch.tensor([5, 77, 300], dtype=torch.int32)
    rest = w.clone()
    rest[:, idx.long()] = 0
    w_o = w[:, idx.long()].contiguous()
    if group:  # int8_group: weight scales per group; the native build's wide tile where it has one
        from sparserl.rollout.quant.int8_group import quantize_int8_weight_groups

        q, g = quantize_int8_weight_groups(rest, group)
        s = torch.ones(200)
    else:
        q, s = quantize_int8_per_channel(rest, QMAX_FBGEMM)

    def group_kw(lib):
        if not group:
            return {}
        return dict(
            group_scales=native.pack_group_scales(g, lib=lib), group_colsum=native.pack_group_colsums(q, group, lib=lib)
        )

    outs = []
    for lib in (native.library(), avx2_build):
        outs.append(
            native.linear_int8_outliers(
                x,
                native.pack_int8(q, lib=lib),
                s,
                idx,
                native.pack_outliers(w_o, lib=lib),
                group=group,
                lib=lib,
                **group_kw(lib),
            )
        )
    assert outs[0] is not None and torch.equal(outs[0], outs[1])
    x_rest = x.clone()
    x_rest[:, idx.long()] = 0
    ref = native.linear_int8(x_rest, native.pack_int8(q), s, group=group, **group_kw(None)) + x[:, idx.long()] @ w_o.t()
    torch.testing.assert_close(outs[0], ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("smooth,outliers", [(0.0, 0), (0.5, 3)])
def test_quantized_head(tiny, smooth, outliers):
    """rollout.quant_head: the LM head quantized the same way (calibrated on the final norm's
    output), the embedding kept in float; the logits stay close to the dense sampler's."""
    kw = dict(quant="int8", quant_smooth=smooth, quant_outliers=outliers, **ENGINE)
    m = RolloutEngine(tiny, build_compressor("none"), quant_head=True, **kw).model
    float_head = RolloutEngine(tiny, build_compressor("none"), **kw).model
    dense = RolloutEngine(tiny, build_compressor("none"), **ENGINE).model
    head = m.lm_head.inner if smooth else m.lm_head
    assert isinstance(head, OutlierLinear if outliers else Int8Linear)
    assert isinstance(m.embed, torch.Tensor) and torch.equal(m.embed, dense.embed)
    assert m.decode_read_bytes() < float_head.decode_read_bytes()
    ids = torch.tensor([[5, 9, 2, 7, 3, 11, 4, 8]])
    valid, pos = torch.ones_like(ids, dtype=torch.bool), torch.arange(8)[None]
    ref = dense.logits(dense.hidden_states(ids, valid, pos))
    out = m.logits(m.hidden_states(ids, valid, pos))
    assert not torch.equal(out, float_head.logits(float_head.hidden_states(ids, valid, pos)))
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()


def test_quantized_head_needs_a_quantizer(tiny):
    with pytest.raises(ValueError, match="quant_head needs a weight quantization"):
        RolloutEngine(tiny, build_compressor("none"), quant_head=True, **ENGINE)
    with pytest.raises(ConfigError, match=r"rollout.quant_head=true needs a weight quantization"):
        validate(load_config("sparse_rl_fixed40", ["rollout.quant_head=true"]))
    assert validate(load_config("qurl", ["rollout.quant_head=true"])).rollout.quant_head is True
