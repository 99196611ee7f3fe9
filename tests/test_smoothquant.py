"""SmoothQuant in the quantized sampler (rollout.quant_smooth): the factors' formula, the smoothed
product equal to the plain one in full precision, less int8 error on inputs with an outlier channel,
the per-push calibration (deterministic: a resumed run quantizes the same), and its bad inputs."""

from __future__ import annotations

import pytest
import torch

from sparserl import cli
from sparserl.config import ConfigError, load_config, validate
from sparserl.errors import OptionError
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.model import QUANTIZED_FIELDS, SamplerModel
from sparserl.rollout.quant import build_quant
from sparserl.rollout.quant.smooth import ActivationObserver, SmoothedLinear, check_strength, smoothing_factors

ENGINE = dict(dtype=torch.float32)


def _outlier_input(rows=16, inp=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=g)
    x[:, 5] *= 80.0  # one outlier channel, as in SmolLM2's down-projection inputs
    w = torch.randn(48, inp, generator=g) * 0.05
    return x, w


def test_factors_follow_the_formula():
    x_amax = torch.tensor([4.0, 1.0, 0.0, 9.0])
    w = torch.tensor([[0.5, -2.0, 1.0, 0.0], [-1.0, 1.0, 0.5, 0.0]])
    s = smoothing_factors(x_amax, w, 0.5)
    assert s[:2].tolist() == pytest.approx([(4.0 / 1.0) ** 0.5, (1.0 / 2.0) ** 0.5])
    assert s[2] == pytest.approx((1e-5) ** 0.5 / 1.0)  # never-active channel: the floor, not 0
    assert torch.isfinite(s).all() and (s > 0).all()  # all-zero weight column: the floor, not inf
    assert smoothing_factors(x_amax, w, 0.0)[:2].tolist() == pytest.approx([1.0, 0.5])  # a = 0: 1 / max|W_j|


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0])
def test_strength_bounds(bad):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        check_strength(bad)


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_smoothing_is_exact_in_full_precision_and_cuts_int8_error(name):
    x, w = _outlier_input()
    s = smoothing_factors(x.abs().amax(0), w, 0.5)
    ref = x @ w.t()
    # exact rewrite: (x / s)(W s)^T == x W^T
    torch.testing.assert_close((x / s) @ (w * s).t(), ref, rtol=1e-5, atol=1e-5)
    qz = build_quant(name)
    plain = qz.quantize(w)(x)
    smoothed = SmoothedLinear(qz.quantize(w * s), 1.0 / s)
    out = smoothed(x)
    err_plain = (plain - ref).norm() / ref.norm()
    err_smooth = (out - ref).norm() / ref.norm()
    assert err_smooth < 0.5 * err_plain, (err_smooth, err_plain)
    # the effective weight, back in the original basis, is the weight up to rounding
    assert (smoothed.dequantize() - w).norm() / w.norm() < 0.05
    assert smoothed.nbytes() == qz.quantize(w).nbytes() + 4 * w.shape[1]


def test_observer_records_channel_maxima_and_multiplies_in_full_precision():
    x, w = _outlier_input()
    obs = ActivationObserver(w)
    torch.testing.assert_close(obs(x[:8]), x[:8] @ w.t())
    obs(x[8:])
    torch.testing.assert_close(obs.amax, x.abs().amax(0))


def test_sampler_calibrates_at_every_push_deterministically(tiny):
    engine = RolloutEngine(tiny, build_compressor("none"), quant="int8", quant_smooth=0.5, **ENGINE)
    m = engine.model
    assert m.calibration_ids is not None and m.calibration_ids.shape[0] == 1 and m.calibration_ids.shape[1] > 16
    lw = m.layers[0]
    assert all(isinstance(getattr(lw, f), SmoothedLinear) for f in QUANTIZED_FIELDS)
    dense = RolloutEngine(tiny, build_compressor("none"), **ENGINE).model
    ids = torch.tensor([[5, 9, 2, 7, 3, 11, 4, 8]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    pos = torch.arange(ids.shape[1])[None]
    logits = m.logits(m.hidden_states(ids, valid, pos))
    ref = dense.logits(dense.hidden_states(ids, valid, pos))
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()
    # same weights → same factors and quantized weights (a resumed run quantizes as an uninterrupted one)
    again = RolloutEngine(tiny, build_compressor("none"), quant="int8", quant_smooth=0.5, **ENGINE).model
    torch.testing.assert_close(again.layers[1].down.inv_s, m.layers[1].down.inv_s, rtol=0, atol=0)
    torch.testing.assert_close(again.logits(again.hidden_states(ids, valid, pos)), logits, rtol=0, atol=0)
    # a push of changed weights recalibrates: the factors follow the new weights
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    state["model.layers.0.mlp.down_proj.weight"] *= 3.0
    before = m.layers[0].down.inv_s.clone()
    m.load_weights(state)
    assert not torch.allclose(m.layers[0].down.inv_s, before)
    assert m.last_quantize_s > 0


def test_sampler_rejects_smoothing_without_activation_quant_or_calibration(tiny):
    with pytest.raises(ValueError, match="int8, int8_group or fp8"):
        RolloutEngine(tiny, build_compressor("none"), quant="int8_weight_only", quant_smooth=0.5, **ENGINE)
    with pytest.raises(ValueError, match="calibration_ids"):
        SamplerModel(tiny.model, torch.float32, quant="int8", quant_smooth=0.5)


def test_config_key_and_its_errors():
    cfg = validate(load_config("qurl", ["rollout.quant_smooth=0.5"]))
    assert cfg.rollout.quant_smooth == 0.5
    with pytest.raises(ConfigError, match=r"rollout.quant_smooth=0.5 needs rollout.quant int8, int8_group or fp8"):
        validate(load_config("sparse_rl_fixed40", ["rollout.quant_smooth=0.5"]))
    with pytest.raises(ConfigError, match="quant_smooth"):
        load_config("qurl", ["rollout.quant_smooth=1.0"])


@pytest.mark.parametrize("value", ["-0.5", "1.0"])
def test_bench_rejects_bad_strength(value):
    args = cli.build_parser().parse_args(
        ["bench", "rollout", "--model", "tiny", "--quant", "int8", "--quant-smooth", value]
    )
    with pytest.raises(OptionError, match="--quant-smooth"):
        args.fn(args)
