"""Tests of sparserl.train.losses and sparserl.advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from sparserl.advantages import (
    available_adv_ests,
    broadcast_to_tokens,
    compute_advantages,
    dr_grpo,
    frac_zero_std_groups,
    get_adv_est,
    grpo,
    rloo,
)
from sparserl.correct import get_correction
from sparserl.train.losses import (
    LOSS_AGGS,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    loss_normalizers,
    policy_loss,
    total_loss,
)

LN = math.log


def close(a, b, tol=1e-5):
    a, b = float(torch.as_tensor(a).detach()), float(torch.as_tensor(b).detach())
    return abs(a - b) <= tol * max(1.0, abs(b))


def lp(ratios):
    """learner log-probs whose ratio to a zero behaviour is ``ratios``."""
    return torch.tensor([[LN(r) for r in row] for row in ratios], requires_grad=True)


# --------------------------------------------------------------------------- policy loss values


def test_ppo_clip_positive_advantage():
    x = lp([[1.5, 0.5, 1.0]])
    beh = torch.zeros(1, 3)
    m = torch.ones(1, 3)
    loss, met = policy_loss(x, beh, torch.tensor([1.0]), m)
    # ℓ = max(−r, −clip(r, 0.8, 1.2)) = [−1.2, −0.5, −1.0]
    assert close(loss, -2.7 / 3)
    loss.backward()
    # token 0 clipped (no grad); d(−r)/dlog r = −r
    assert torch.allclose(x.grad, torch.tensor([[0.0, -0.5 / 3, -1.0 / 3]]), atol=1e-6)
    assert close(met["policy/clip_frac_high"], 1 / 3)
    assert met["policy/clip_frac_low"] == 0.0
    assert close(met["policy/ratio_mean"], 1.0)
    k3 = ((1.5 - 1 - LN(1.5)) + (0.5 - 1 - LN(0.5)) + 0.0) / 3
    assert close(met["policy/approx_kl"], k3)
    assert close(met["policy/pg_loss"], -0.9)


def test_ppo_clip_negative_advantage_and_weights():
    x = lp([[1.5, 0.5, 1.0]])
    beh = torch.zeros(1, 3)
    m = torch.ones(1, 3)
    loss, met = policy_loss(x, beh, torch.tensor([-1.0]), m)
    # ℓ = max(r, clip(r)) = [1.5, 0.8, 1.0]
    assert close(loss, 3.3 / 3)
    assert close(met["policy/clip_frac_low"], 1 / 3)
    assert met["policy/clip_frac_high"] == 0.0
    w = torch.tensor([[2.0, 1.0, 0.5]])
    loss, _ = policy_loss(x, beh, torch.tensor([1.0]), m, weights=w)
    assert close(loss, (-2.4 - 0.5 - 0.5) / 3)
    # clip-higher: ε_high = 0.6 → upper 1.6, token 0 unclipped
    loss, met = policy_loss(x, beh, torch.tensor([1.0]), m, clip_eps_high=0.6)
    assert close(loss, (-1.5 - 0.5 - 1.0) / 3)
    assert met["policy/clip_frac_high"] == 0.0
    # advantages given per token
    loss, _ = policy_loss(x, beh, torch.tensor([[1.0, -1.0, 2.0]]), m)
    assert close(loss, (-1.2 + 0.8 - 2.0) / 3)


def test_dual_clip():
    x = lp([[5.0]])
    loss, met = policy_loss(x, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), dual_clip_c=3.0)
    assert close(loss, 3.0)
    assert met["policy/dual_clip_frac"] == 1.0


def aggregation_case():
    x = torch.zeros(3, 3, requires_grad=True)  # r = 1 everywhere: ℓ = −w·A
    beh = torch.zeros(3, 3)
    adv = torch.tensor([1.0, 4.0, 5.0])
    w = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])  # row 2 fully rejected
    return x, beh, adv, w, m


@pytest.mark.parametrize(
    "agg,expected,kw",
    [
        # row means −2 and −4; the empty row is not counted
        ("seq_mean_token_mean", (-2.0 - 4.0) / 2, {}),
        # (−1 −2 −3 −4) / 4 kept tokens
        ("token_mean", -10.0 / 4, {}),
        # Σ ℓ / (B · max_len) = −10 / (3 · 4)
        ("seq_mean_token_sum_norm", -10.0 / 12, {"max_len": 4}),
        ("seq_mean_token_sum_norm", -10.0 / 9, {}),  # max_len defaults to T = 3
    ],
)
def test_aggregations(agg, expected, kw):
    x, beh, adv, w, m = aggregation_case()
    loss, _ = policy_loss(x, beh, adv, m, weights=w, loss_agg=agg, **kw)
    assert close(loss, expected)


def test_unknown_aggregation():
    x, beh, adv, w, m = aggregation_case()
    with pytest.raises(ValueError, match="token_mean"):
        policy_loss(x, beh, adv, m, loss_agg="bogus")


@pytest.mark.parametrize("agg", LOSS_AGGS)
def test_all_rejected_zero_loss_zero_grad(agg):
    x = torch.tensor([[float("nan"), float("-inf"), 0.3], [1.0, 2.0, float("inf")]], requires_grad=True)
    beh = torch.tensor([[0.0, float("nan"), -1.0], [float("-inf"), 0.0, 0.0]])
    adv = torch.tensor([float("nan"), 1.0])
    m = torch.zeros(2, 3)
    loss, met = policy_loss(
        x, beh, adv, m, weights=torch.full((2, 3), float("nan")), clip_upper_scale=torch.ones(2, 3), loss_agg=agg
    )
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in met.values())


@pytest.mark.parametrize("agg", LOSS_AGGS)
def test_micro_batch_accumulation_equals_full_batch(agg):
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    base = -torch.rand(B, T, generator=g) * 2
    beh = base + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    w = torch.rand(B, T, generator=g) + 0.5
    scale = 1 + torch.rand(B, T, generator=g)
    m = (torch.rand(B, T, generator=g) > 0.3).float()
    m[2] = 0  # a vetoed response
    m[4] = 1
    norms = loss_normalizers(m, agg, max_len=7)

    full_x = base.clone().requires_grad_(True)
    full, _ = policy_loss(full_x, beh, adv, m, weights=w, clip_upper_scale=scale, **norms)
    full.backward()

    acc_x = base.clone().requires_grad_(True)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part, _ = policy_loss(acc_x[sl], beh[sl], adv[sl], m[sl], weights=w[sl], clip_upper_scale=scale[sl], **norms)
        part.backward()
        total += part.item()
    assert close(total, full.item(), 1e-5)
    assert torch.allclose(acc_x.grad, full_x.grad, atol=1e-6)
    assert full_x.grad.abs().sum() > 0

    # and without the global normalisers the full-batch call is unchanged
    plain, _ = policy_loss(base, beh, adv, m, weights=w, clip_upper_scale=scale, loss_agg=agg, max_len=7)
    assert close(plain, full, 1e-6)
    if agg == "token_mean":  # whereas per-micro-batch means differ
        parts = [
            policy_loss(base[s], beh[s], adv[s], m[s], weights=w[s], loss_agg=agg)[0]
            for s in (slice(0, 2), slice(3, 6))
        ]
        assert not close(sum(parts) / 2, full, 1e-3)


def test_loss_normalizers_values():
    m = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_normalizers(m, "token_mean")["num_tokens_total"] == 3
    assert loss_normalizers(m, "seq_mean_token_mean")["num_seqs_total"] == 2
    n = loss_normalizers(m, "seq_mean_token_sum_norm", max_len=10)
    assert n["num_seqs_total"] == 3 and n["max_len"] == 10


# --------------------------------------------------------------------------- ACR


def test_acr_widens_upper_bound_only_for_positive_advantage_where_truncated():
    # sampler/dense ρ = [4, 1] (C = 2 truncates token 0 only); learner ratio r = 1.5 on both
    q = torch.full((1, 2), -1.0)
    p = q + torch.tensor([[LN(4.0), 0.0]])
    m = torch.ones(1, 2)
    corr = get_correction("acr")(q, p, m)
    assert torch.allclose(corr.clip_upper_scale, torch.tensor([[2.0, 1.0]]))

    def run(adv, scale):
        x = (p + LN(1.5)).clone().requires_grad_(True)
        loss, met = policy_loss(
            x, corr.behaviour_logprobs, torch.tensor([adv]), corr.mask, weights=corr.weights, clip_upper_scale=scale
        )
        loss.backward()
        return loss.item(), x.grad, met

    # A > 0: without ACR both tokens clipped at 1.2; with ACR token 0's bound is 2.4 (unclipped)
    l0, g0, m0 = run(1.0, None)
    l1, g1, m1 = run(1.0, corr.clip_upper_scale)
    assert close(l0, (-2.0 * 1.2 - 1.0 * 1.2) / 2)
    assert close(l1, (-2.0 * 1.5 - 1.0 * 1.2) / 2)
    assert torch.allclose(g0, torch.zeros(1, 2))
    assert torch.allclose(g1, torch.tensor([[-2.0 * 1.5 / 2, 0.0]]))
    assert m0["policy/clip_frac_high"] == 1.0 and m1["policy/clip_frac_high"] == 0.5
    # A < 0: the upper bound never binds; ACR changes nothing
    l2, g2, _ = run(-1.0, None)
    l3, g3, _ = run(-1.0, corr.clip_upper_scale)
    assert close(l2, l3) and torch.allclose(g2, g3)
    assert close(l2, (2.0 * 1.5 + 1.0 * 1.5) / 2)


def test_sparse_rl_correction_feeds_loss():
    q = torch.full((2, 2), -1.0)
    p = q + torch.tensor([[0.0, 0.0], [LN(1e-5), 0.0]])  # row 1 vetoed
    corr = get_correction("sparse_rl")(q, p, torch.ones(2, 2))
    x = p.clone().requires_grad_(True)
    loss, _ = policy_loss(x, corr.behaviour_logprobs, torch.tensor([1.0, 1.0]), corr.mask, weights=corr.weights)
    # only row 0 counts; its weights are 1 / mean over all 4 valid tokens (vetoed row included,
    # as published): w = 1 / ((1 + 1 + 1e-5 + 1) / 4)
    assert close(loss, -4 / (3 + 1e-5))
    loss.backward()
    assert torch.equal(x.grad[1], torch.zeros(2))


# --------------------------------------------------------------------------- KL, entropy, total


def test_kl_penalty_values():
    x = torch.tensor([0.5, -1.0, -30.0], requires_grad=True)
    ref = torch.zeros(3)
    assert torch.allclose(kl_penalty(x, ref, "k1"), torch.tensor([0.5, -1.0, -30.0]))
    assert torch.allclose(kl_penalty(x, ref, "abs"), torch.tensor([0.5, 1.0, 30.0]))
    assert torch.allclose(kl_penalty(x, ref, "k2"), torch.tensor([0.125, 0.5, 450.0]))
    k3 = kl_penalty(x, ref, "k3")
    assert close(k3[0], math.exp(-0.5) - 1 + 0.5)
    assert close(k3[1], math.exp(1.0) - 1 - 1.0)
    assert close(k3[2], math.exp(20.0) - 20.0 - 1, 1e-5)  # −d clamped to 20
    lv = kl_penalty(x, ref, "low_var_kl")
    assert close(lv[0], k3[0]) and close(lv[2], 10.0)
    lv[0].backward()
    assert close(x.grad[0], 1 - math.exp(-0.5))
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(x, ref, "bogus")


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, LN(2), LN(3)], [1.0, 1.0, 1.0]])
    h = entropy_from_logits(logits)
    ps = [1 / 6, 2 / 6, 3 / 6]
    assert close(h[0], -sum(p * LN(p) for p in ps))
    assert close(h[1], LN(3))
    g = torch.Generator().manual_seed(0)
    big = torch.randn(2, 5, 11, generator=g) * 3
    ref = -(big.softmax(-1) * big.log_softmax(-1)).sum(-1)
    assert torch.allclose(entropy_from_logits(big), ref, atol=1e-5)
    assert torch.allclose(entropy_from_logits(big, chunk_size=3), ref, atol=1e-5)
    hb = entropy_from_logits(big.bfloat16())
    assert hb.dtype == torch.float32 and torch.allclose(hb, ref, atol=0.1)
    x = big.clone().requires_grad_(True)
    entropy_from_logits(x).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_total_loss_and_agg_of_kl():
    pg = torch.tensor(1.0)
    assert close(total_loss(pg), 1.0)
    assert close(total_loss(pg, kl=torch.tensor(2.0), kl_coef=0.5), 2.0)
    assert close(total_loss(pg, entropy=torch.tensor(3.0), entropy_coef=0.1), 0.7)
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kl = agg_loss(torch.tensor([[1.0, 3.0], [5.0, 100.0]]), m, "seq_mean_token_mean")
    assert close(kl, (2.0 + 5.0) / 2)


# --------------------------------------------------------------------------- advantages


def test_grpo_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    a = grpo(r, group_size=4)
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    exp = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6)] * 1
    assert torch.allclose(a[:4], torch.tensor([exp[0], exp[1], exp[1], exp[0]]), atol=1e-6)
    assert torch.equal(a[4:], torch.zeros(4))  # zero spread → exactly 0
    # float32 mean of (0.9, 0.9, 0.9) is not 0.9: without the zero-spread rule A ≈ ±0.05
    assert torch.equal(grpo(torch.tensor([0.9, 0.9, 0.9]), group_size=3), torch.zeros(3))
    assert torch.equal(dr_grpo(torch.tensor([0.9, 0.9, 0.9]), group_size=3), torch.zeros(3))
    assert torch.equal(rloo(torch.tensor([0.9, 0.9, 0.9]), group_size=3), torch.zeros(3))
    assert torch.equal(compute_advantages("grpo", r, group_size=4), a)


def test_grpo_group_ids_and_singletons():
    a = grpo(torch.tensor([1.0, 2.0, 0.0, 2.0]), group_ids=torch.tensor([7, 3, 7, 3]))
    s = math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([0.5 / (s + 1e-6), 0.0, -0.5 / (s + 1e-6), 0.0]), atol=1e-6)
    # singleton group (verl): mean 0, std 1
    a = grpo(torch.tensor([0.7, 1.0, 0.0]), group_ids=torch.tensor([0, 1, 1]))
    assert close(a[0], 0.7 / (1 + 1e-6))


def test_dr_grpo_rloo_batch_scaling():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.allclose(dr_grpo(r, group_size=4), torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.allclose(grpo(r, group_size=4, scale_rewards="none"), dr_grpo(r, group_size=4))
    assert torch.allclose(rloo(torch.tensor([1.0, 0.0, 0.0]), group_size=3), torch.tensor([1.0, -0.5, -0.5]))
    r8 = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    bstd = math.sqrt(2 / 7)
    a = grpo(r8, group_size=4, scale_rewards="batch")
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -0.5, -0.5]) / (bstd + 1e-6), atol=1e-6)
    with pytest.raises(ValueError):
        grpo(r8, group_size=4, scale_rewards="bogus")


def test_advantage_helpers_and_errors():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert frac_zero_std_groups(r, group_size=4) == 0.5
    assert frac_zero_std_groups(torch.tensor([1.0, 0.0, 3.0]), group_ids=torch.tensor([0, 0, 1])) == 0.5
    tok = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(tok, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        grpo(r, group_size=3)
    with pytest.raises(ValueError):
        grpo(r)
    with pytest.raises(ValueError, match="grpo"):
        get_adv_est("bogus")
    assert {"grpo", "dr_grpo", "rloo"} <= set(available_adv_ests())


def test_gspo_gives_every_token_its_responses_length_normalised_ratio_and_gspos_gradient():
    """GSPO (importance_sampling_level="sequence"): s_b = exp(mean over the kept tokens of log π − log μ) on
    every kept token; with one advantage per response, seq_mean_token_mean's loss and gradient are GSPO's
    (1/B) Σ_b max(−A_b s_b, −A_b clip(s_b, 1 − ε, 1 + ε_high))."""
    torch.manual_seed(0)
    old = -torch.rand(3, 5) - 0.1
    new = (old + 0.3 * torch.randn(3, 5)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 2.0])
    loss, m = policy_loss(new, old, adv, mask, clip_eps=0.05, clip_eps_high=0.1, importance_sampling_level="sequence")
    (grad,) = torch.autograd.grad(loss, new)

    ref_new = new.detach().clone().requires_grad_(True)
    log_s = ((ref_new - old) * mask).sum(-1) / mask.sum(-1)
    s = log_s.exp()
    ref = torch.maximum(-adv * s, -adv * s.clamp(0.95, 1.1)).mean()
    (ref_grad,) = torch.autograd.grad(ref, ref_new)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert torch.all(grad[mask == 0] == 0)
    s = s.detach()
    assert m["policy/ratio_min"] == pytest.approx(float(s.min())) and m["policy/ratio_max"] == pytest.approx(
        float(s.max())
    )
    # the token level differs wherever a response's tokens have different ratios
    token_loss, _ = policy_loss(new, old, adv, mask, clip_eps=0.05, clip_eps_high=0.1)
    assert float(token_loss.detach()) != pytest.approx(float(loss.detach()), rel=1e-3)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        policy_loss(new, old, adv, mask, importance_sampling_level="seq")


def test_gspo_equals_the_token_level_where_a_responses_ratios_are_equal():
    old = torch.zeros(2, 4)
    new = torch.tensor([[0.1] * 4, [-0.2] * 4], requires_grad=True)
    mask = torch.ones(2, 4)
    adv = torch.tensor([1.0, -1.0])
    a, _ = policy_loss(new, old, adv, mask, importance_sampling_level="sequence")
    b, _ = policy_loss(new, old, adv, mask)
    assert torch.allclose(a, b)
    assert torch.allclose(torch.autograd.grad(a, new)[0], torch.autograd.grad(b, new)[0])


def test_off_policy_sequence_mask_drops_negative_advantage_responses_that_drifted():
    """DeepSeek-V3.2 / TRL: mean_t (log q − log π) per response against δ = 0.5, only where A < 0. Drifts:
    row 0 1.0 (A −1: dropped), row 1 1.0 (A +1: kept), row 2 0.25 (A −1: kept), row 3 (padding ignored) 0.75
    over its one token (A −1, token advantages: dropped)."""
    from sparserl.train.losses import off_policy_sequence_mask

    logp = torch.tensor([[-2.0, -2.0], [-2.0, -2.0], [-1.0, -1.5], [-3.0, 0.0]])
    q = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-2.25, 9.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]])
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0])
    assert off_policy_sequence_mask(logp, q, adv, mask, 0.5).tolist() == [False, True, True, False]
    assert off_policy_sequence_mask(logp, q, adv[:, None].expand(4, 2), mask, 0.5).tolist() == [
        False,
        True,
        True,
        False,
    ]
    assert off_policy_sequence_mask(logp, q, adv, mask, 1.0).all()  # no drift above 1 nat


def test_unbiased_kl_ratio_is_the_current_over_the_old_policy_with_its_gradient():
    from sparserl.train.losses import unbiased_kl_ratio

    logp = torch.tensor([[-1.0, -2.0], [-1.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0], [-1.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    r = unbiased_kl_ratio(logp, old, mask)
    assert torch.allclose(r, torch.tensor([[math.exp(0.5), 1.0], [1.0, 1.0]]))
    r.sum().backward()  # d exp(lp - old) / d lp = the ratio itself on valid tokens, 0 on padding
    assert torch.allclose(logp.grad, torch.tensor([[math.exp(0.5), 1.0], [1.0, 0.0]]))
    seq = unbiased_kl_ratio(logp.detach(), old, mask, "sequence")
    assert torch.allclose(seq, torch.tensor([[math.exp(0.25)] * 2, [1.0, 1.0]]))
