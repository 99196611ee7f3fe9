"""QuRL's invariant scaling (sparserl.models.invariant_scaling) and the visible-update fraction
(sparserl.train.update_visible) on tiny seeded models."""

import copy

import pytest
import torch

from sparserl.errors import SparserlError
from sparserl.models.invariant_scaling import (
    InvariantScalingError,
    applied_scale,
    apply_invariant_scaling,
    fold_groups,
    refold_after_load,
    remove_invariant_scaling,
    unscaled_state_dict,
)
from sparserl.train.update_visible import is_sampler_quantized, quantized_weight_snapshot, update_visible_frac

SCALED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def int8_per_channel(w: torch.Tensor):
    """Test double of sparserl.rollout.quant.int8.quantize_int8_per_channel: symmetric, per row."""
    scales = (w.float().abs().amax(dim=1) / 127).clamp(min=1e-12)
    codes = torch.round(w.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


def qwen(kind: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(seed)
    if kind == "qwen2":  # q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False))
    else:  # per-head q_norm / k_norm after the projections
        model = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=16, attention_bias=True))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:  # non-trivial biases and norm gains
                p.add_(0.1 * torch.randn_like(p))
    return model.float().eval()


@pytest.fixture
def llama(tiny):
    return copy.deepcopy(tiny.model).eval()


def model_of(kind, tiny):
    return copy.deepcopy(tiny.model).eval() if kind == "llama" else qwen(kind)


def logits(model, seed: int = 1):
    ids = torch.randint(3, min(300, model.config.vocab_size), (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("s", [1.5, 2.0])
def test_full_precision_logits_unchanged(tiny, kind, s):
    model = model_of(kind, tiny)
    ref = logits(model)
    apply_invariant_scaling(model, s)
    assert applied_scale(model) == s
    assert (logits(model) - ref).abs().max().item() <= 1e-5


def test_which_weights_move(llama):
    orig = {k: v.clone() for k, v in llama.state_dict().items()}
    apply_invariant_scaling(llama, 1.5)
    now = llama.state_dict()
    for k, v in now.items():
        if k.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")) and ".layers." in k:
            torch.testing.assert_close(v, orig[k] * 1.5)
        elif any(f"{p}.weight" in k for p in SCALED):
            torch.testing.assert_close(v, orig[k] / 1.5)
        else:  # o/down, embeddings, the final norm, the (tied) head
            assert torch.equal(v, orig[k]), k
    assert llama.lm_head.weight.data_ptr() == llama.model.embed_tokens.weight.data_ptr()  # still tied


def test_biases_are_not_divided():
    model = qwen("qwen2")
    bias = model.model.layers[0].self_attn.q_proj.bias.detach().clone()
    apply_invariant_scaling(model, 2.0)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.bias, bias)


def test_s1_is_a_no_op(llama):
    orig = {k: v.clone() for k, v in llama.state_dict().items()}
    apply_invariant_scaling(llama, 1.0)
    assert applied_scale(llama) == 1.0
    assert all(torch.equal(v, orig[k]) for k, v in llama.state_dict().items())
    assert unscaled_state_dict(llama).keys() == orig.keys()


def test_applied_once(llama):
    apply_invariant_scaling(llama, 1.5)
    once = {k: v.clone() for k, v in llama.state_dict().items()}
    apply_invariant_scaling(llama, 1.5)  # the same s again: nothing happens
    assert all(torch.equal(v, once[k]) for k, v in llama.state_dict().items())
    with pytest.raises(InvariantScalingError, match="already has s=1.5"):
        apply_invariant_scaling(llama, 2.0)


def test_unscaled_state_dict_is_the_original_and_loads_as_it_is(tiny, llama, tmp_path):
    orig = {k: v.clone() for k, v in llama.state_dict().items()}
    ref = logits(llama)
    apply_invariant_scaling(llama, 1.5)
    back = unscaled_state_dict(llama)
    assert back.keys() == orig.keys()
    for k, v in back.items():
        assert ((v - orig[k]).abs().max() <= 1e-6 * orig[k].abs().max()).item(), k
    fresh = copy.deepcopy(tiny.model).eval()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(back)  # strict: same keys, same shapes
    assert applied_scale(fresh) == 1.0
    assert (logits(fresh) - ref).abs().max().item() <= 1e-5
    # as a checkpoint writes it (save_pretrained with the un-scaled state dict), read by a plain loader
    from transformers import AutoModelForCausalLM

    llama.save_pretrained(tmp_path, state_dict=back, safe_serialization=True)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert (logits(loaded) - ref).abs().max().item() <= 1e-5
    # the learner itself is still scaled
    assert applied_scale(llama) == 1.5
    torch.testing.assert_close(
        llama.model.layers[0].self_attn.q_proj.weight, orig["model.layers.0.self_attn.q_proj.weight"] / 1.5
    )


def test_remove_is_the_inverse_on_a_plain_state_dict(llama):
    orig = {k: v.clone() for k, v in llama.state_dict().items()}
    apply_invariant_scaling(llama, 2.0)
    back = remove_invariant_scaling(llama.state_dict(), 2.0)  # powers of two are exact
    assert all(torch.equal(v, orig[k]) for k, v in back.items())


def test_refold_after_loading_original_weights(llama):
    orig = {k: v.clone() for k, v in llama.state_dict().items()}
    apply_invariant_scaling(llama, 1.5)
    scaled = {k: v.clone() for k, v in llama.state_dict().items()}
    llama.load_state_dict(unscaled_state_dict(llama))  # what a resume does
    refold_after_load(llama)
    for k, v in llama.state_dict().items():
        torch.testing.assert_close(v, scaled[k], rtol=1e-6, atol=0)
    assert orig.keys() == scaled.keys()


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), "abc", None])
def test_bad_scale(llama, bad):
    with pytest.raises(SparserlError, match="rollout.quant_scale"):
        apply_invariant_scaling(llama, bad)
    with pytest.raises(InvariantScalingError):
        remove_invariant_scaling({}, bad)


def test_unsupported_models(llama):
    with pytest.raises(SparserlError, match="model of type|this model's type is None"):
        apply_invariant_scaling(torch.nn.Linear(4, 4), 1.5)
    gemma_like = copy.deepcopy(llama)
    gemma_like.config.model_type = "gemma"  # RMSNorm (1 + w): another fold
    with pytest.raises(InvariantScalingError, match="'gemma'"):
        apply_invariant_scaling(gemma_like, 1.5)
    del llama.model.layers[1].mlp.up_proj
    before = llama.model.layers[0].input_layernorm.weight.detach().clone()
    with pytest.raises(InvariantScalingError, match=r"model.layers.1.mlp.up_proj is missing"):
        apply_invariant_scaling(llama, 1.5)
    assert torch.equal(llama.model.layers[0].input_layernorm.weight, before)  # checked before any change
    assert applied_scale(llama) == 1.0


def test_fold_groups_name_the_state_dict_keys(llama):
    keys = set(llama.state_dict())
    groups = fold_groups(llama)
    assert len(groups) == 2 * llama.config.num_hidden_layers
    assert all(n in keys and all(p in keys for p in ps) for n, ps in groups)


# ---------------------------------------------------------------- visible-update fraction


def test_update_visible_frac_counts():
    g = torch.Generator().manual_seed(0)
    w = torch.sign(torch.randn(8, 32, generator=g)) * (0.5 + torch.rand(8, 32, generator=g))  # no zero code
    name, other = "model.layers.0.mlp.down_proj.weight", "model.norm.weight"
    before = {name: w, other: torch.ones(32)}
    assert update_visible_frac(before, {name: w.clone(), other: torch.zeros(32)}, int8_per_channel) == 0.0
    flipped = -w  # every non-zero code changes sign
    assert update_visible_frac(before, {name: flipped, other: torch.ones(32)}, int8_per_channel) == 1.0
    big = w + 0.5 * torch.sign(torch.randn_like(w))  # far beyond a grid step: nearly every code moves (not
    assert update_visible_frac(before, {name: big}, int8_per_channel) > 0.9  # each row's max: code ±127)
    tiny_step = w.clone()
    tiny_step[0, 0] += 1e-7  # one element moves, far below a step: its code stays
    assert update_visible_frac(before, {name: tiny_step}, int8_per_channel) == 0.0
    with pytest.raises(ValueError, match="no decoder linear weight"):
        update_visible_frac({other: torch.ones(3)}, {other: torch.ones(3)}, int8_per_channel)
    with pytest.raises(ValueError, match="not in `after`"):
        update_visible_frac(before, {other: torch.ones(32)}, int8_per_channel)


def test_sampler_quantized_names(llama):
    names = set(quantized_weight_snapshot(llama))
    assert len(names) == 7 * llama.config.num_hidden_layers
    assert not any("norm" in n or "embed" in n or "lm_head" in n or n.endswith("bias") for n in names)
    assert is_sampler_quantized("model.layers.3.self_attn.o_proj.weight")


def scaled_update_fracs(tiny, s: float, rule: str, lr: float) -> tuple[float, float]:
    """(fraction over the s-scaled q/k/v/gate/up weights, over every quantized weight) for one step of
    ``rule`` on the scaled parametrisation V = W/s, the same underlying gradient G = dL/dW each time."""
    model = copy.deepcopy(tiny.model)
    apply_invariant_scaling(model, s)
    before = quantized_weight_snapshot(model)
    after = {}
    for i, (n, v) in enumerate(sorted(before.items())):
        grad_w = torch.randn(v.shape, generator=torch.Generator().manual_seed(i))  # dL/dW, fixed
        scaled = any(f"{p}.weight" in n for p in SCALED)
        grad_v = grad_w * s if scaled else grad_w  # chain rule: dL/dV = s dL/dW for V = W/s
        step = lr * torch.sign(grad_v) if rule == "adam" else lr * grad_v
        after[n] = v - step
    just_scaled = {n: t for n, t in before.items() if any(f"{p}.weight" in n for p in SCALED)}
    return (
        update_visible_frac(just_scaled, after, int8_per_channel),
        update_visible_frac(before, after, int8_per_channel),
    )


@pytest.mark.parametrize("rule,expected", [("adam", 1.5), ("sgd", 1.5**2)])
def test_invariant_scaling_raises_the_visible_update_fraction(tiny, rule, expected):
    """Per-output-channel INT8 gives row r the step Δ_r = max_j|V_rj|/127. With V = W/s the step is
    Δ_r(W)/s. An update u (|u| < Δ) flips a code iff V/Δ and (V+u)/Δ straddle a rounding boundary: with
    V/Δ's fractional part uniform, probability |u|/Δ. Adam's step is ~lr·sign(g) whatever the
    parametrisation (the chain-rule factor s in dL/dV = s·dL/dW cancels in m/sqrt(v)), so
    P = lr·s/Δ_r(W): s times higher. SGD's step is lr·s·dL/dW, so P = lr·s²·|dL/dW|/Δ_r(W): s² times
    higher. (The row's own Δ moves when its largest element is updated; that shift is of the same order
    and scales the same way.) o_proj and down_proj are not rescaled, so the fraction over every
    quantized weight rises less than over the scaled ones. lr keeps |u| well below one grid step."""
    lr = 3e-5 if rule == "adam" else 1e-5
    base_scaled, base_all = scaled_update_fracs(tiny, 1.0, rule, lr)
    up_scaled, up_all = scaled_update_fracs(tiny, 1.5, rule, lr)
    assert 0.02 < base_scaled < 0.4  # a small update: most of it invisible at s = 1
    assert up_all > base_all
    assert up_scaled / base_scaled == pytest.approx(expected, rel=0.08)


def test_the_test_double_matches_the_sampler_quantizer():
    int8 = pytest.importorskip("sparserl.rollout.quant.int8")
    w = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))
    codes, scales = int8.quantize_int8_per_channel(w)
    ref_codes, ref_scales = int8_per_channel(w)
    assert codes.dtype == torch.int8 and tuple(codes.shape) == (48, 40) and tuple(scales.shape) == (48,)
    torch.testing.assert_close(scales.float(), ref_scales)
    assert (codes.int() - ref_codes.int()).abs().max() <= 1  # ties may round either way
