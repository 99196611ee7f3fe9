"""Tests of sparserl.correct: every method against hand-computed values, shared invariants over
all registered corrections, composition and presets."""

from __future__ import annotations

import math

import pytest
import torch

from sparserl.correct import (
    CORRECTION_KEYS,
    MISMATCH_KEYS,
    PRESETS,
    apply_corrections,
    available_corrections,
    compose,
    get_correction,
    mismatch_metrics,
    resolve,
)

LN = math.log


def make(log_rhos, mask=None, base=-1.0):
    """sampler log q = base (per token), old log p = base + log ρ; returns (q, p, mask)."""
    lr = torch.tensor(log_rhos, dtype=torch.float32)
    q = torch.full_like(lr, base)
    p = q + lr
    m = torch.ones_like(lr) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return q, p, m


def close(a, b, tol=1e-5):
    a, b = float(torch.as_tensor(a).detach()), float(torch.as_tensor(b).detach())
    return abs(a - b) <= tol * max(1.0, abs(b))


# --------------------------------------------------------------------------- invariant matrix


def _inputs():
    g = torch.Generator().manual_seed(0)
    q = -torch.rand(4, 6, generator=g) * 3
    p = q + torch.randn(4, 6, generator=g) * 0.4
    m = torch.ones(4, 6)
    m[1, 4:] = 0
    m[3, 1:] = 0
    cases = {"random": (q, p, m)}
    cases["empty"] = (q.clone(), p.clone(), torch.zeros(4, 6))
    # overflow: |log p − log q| = 100 on some tokens, NaN/inf garbage on padding
    q2, p2, m2 = q.clone(), p.clone(), m.clone()
    p2[0, 0] = q2[0, 0] + 100.0
    p2[2, 3] = q2[2, 3] - 100.0
    q2[1, 5] = float("nan")
    p2[1, 4] = float("-inf")
    cases["overflow"] = (q2, p2, m2)
    cases["bool_mask"] = (q.clone(), p.clone(), m.bool())
    return cases


CASES = _inputs()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", available_corrections())
def test_shared_invariants(name, case):
    q, p, m = CASES[case]
    q0, p0, m0 = q.clone(), p.clone(), m.clone()
    c = get_correction(name)(q, p, m)
    # inputs untouched
    assert torch.equal(torch.nan_to_num(q), torch.nan_to_num(q0))
    assert torch.equal(torch.nan_to_num(p), torch.nan_to_num(p0))
    assert torch.equal(m, m0)
    assert c.weights.shape == q.shape and c.mask.shape == q.shape
    assert c.behaviour_logprobs.shape == q.shape
    assert c.mask.dtype == m.dtype
    assert not c.weights.requires_grad
    # mask ⊆ input mask
    assert not bool(((c.mask != 0) & (m == 0)).any())
    # weights finite, ≥ 0, zero outside the final mask
    assert torch.isfinite(c.weights).all()
    assert (c.weights >= 0).all()
    assert (c.weights[c.mask == 0] == 0).all()
    if c.clip_upper_scale is not None:
        assert torch.isfinite(c.clip_upper_scale).all()
        assert (c.clip_upper_scale >= 1).all()
    for k in MISMATCH_KEYS + CORRECTION_KEYS:
        assert k in c.metrics, k
    for k, v in c.metrics.items():
        assert isinstance(v, float) and math.isfinite(v), (k, v)
    if case == "empty":
        assert c.mask.sum() == 0 and c.weights.sum() == 0
        assert c.metrics["mismatch/ppl_sampler"] == 1.0 and c.metrics["mismatch/k3_kl"] == 0.0
        assert c.metrics["is/ess"] == 0.0 and c.metrics["rs/seq_vetoed_frac"] == 0.0


def test_unknown_name_lists_available():
    with pytest.raises(ValueError) as e:
        get_correction("does_not_exist")
    msg = str(e.value)
    for n in ("sparse_rl", "tis", "mis", "rejection", "bypass", "acr", "none"):
        assert n in msg
    with pytest.raises(ValueError, match="sparse_rl"):
        resolve("does_not_exist")
    with pytest.raises(ValueError, match="flashrl_tis"):
        resolve(["tis", ("nope", {})])


def test_all_methods_registered():
    assert set(available_corrections()) >= {"none", "sparse_rl", "tis", "mis", "rejection", "bypass", "acr"}


# --------------------------------------------------------------------------- metrics


def test_mismatch_metrics_hand_computed():
    # seq0: log ρ = [ln 2, −ln 2]; seq1: log ρ = [0, pad]
    q = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    lr = torch.tensor([[LN(2), -LN(2)], [0.0, 5.0]])
    p = q + lr
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    mm = mismatch_metrics(q, p, m)
    assert close(mm["mismatch/log_ratio_abs_mean"], 2 * LN(2) / 3)
    assert close(mm["mismatch/log_ratio_abs_max"], LN(2))
    assert close(mm["mismatch/kl"], 0.0, 1e-6)
    # k3: (2−1−ln2) + (0.5−1+ln2) + 0 = 0.5, over 3 tokens
    assert close(mm["mismatch/k3_kl"], 0.5 / 3)
    # chi2: mean(4, 0.25, 1) − 1
    assert close(mm["mismatch/chi2"], (4 + 0.25 + 1) / 3 - 1)
    # ppl: seq0 sampler mean log q = −1.5; seq1 −0.5 ; old: seq0 (−1+ln2 −2−ln2)/2 = −1.5
    assert close(mm["mismatch/ppl_sampler"], (math.exp(1.5) + math.exp(0.5)) / 2)
    assert close(mm["mismatch/ppl_old"], (math.exp(1.5) + math.exp(0.5)) / 2)
    # sequence ratio: seq0 2·0.5 = 1, seq1 1 → chi2_seq = 0
    assert close(mm["mismatch/chi2_seq"], 0.0, 1e-6)
    assert close(mm["mismatch/ratio_max"], 2.0) and close(mm["mismatch/ratio_min"], 0.5)
    assert mm["mismatch/valid_tokens"] == 3.0


# --------------------------------------------------------------------------- none / bypass


def test_none_and_bypass():
    q, p, m = make([[LN(3), 0.0, 0.2]], [[1, 1, 0]])
    c = get_correction("none")(q, p, m)
    assert torch.equal(c.weights, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.equal(c.mask, m)
    assert c.behaviour_logprobs is p
    assert c.clip_upper_scale is None
    assert c.metrics["is/ess"] == 1.0 and c.metrics["rs/masked_frac"] == 0.0
    b = get_correction("bypass")(q, p, m)
    assert b.behaviour_logprobs is q
    assert torch.equal(b.weights, c.weights) and torch.equal(b.mask, m)
    assert close(b.metrics["mismatch/ratio_max"], 3.0)


# --------------------------------------------------------------------------- sparse_rl


def sparse_case():
    log_rhos = [
        [LN(1.2), LN(0.4), 0.0],  # token 1 out of [0.5, 1.5]
        [LN(1.4), LN(1e-5), LN(0.9)],  # veto (1e-5 < 1e-4); token 1 also out of range
        [LN(0.7), LN(1.6), 0.0],  # token 1 out of range; token 2 padding
    ]
    return make(log_rhos, [[1, 1, 1], [1, 1, 1], [1, 1, 0]])


def test_sparse_rl_normalizes_over_valid_tokens_as_published():
    """slime mis.py: w = min(ρ, 1.5) on every valid token, divided by its mean over the loss mask
    *before* rejection (rejected and vetoed tokens included), then masked."""
    q, p, m = sparse_case()
    c = get_correction("sparse_rl")(q, p, m)
    assert torch.equal(c.mask, torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 0, 0]]))
    # valid tokens' truncated ρ: 1.2 0.4 1.0 | 1.4 1e-5 0.9 | 0.7 min(1.6, 1.5)
    mean = (1.2 + 0.4 + 1.0 + 1.4 + 1e-5 + 0.9 + 0.7 + 1.5) / 8
    exp_w = torch.tensor([[1.2 / mean, 0, 1.0 / mean], [0, 0, 0], [0.7 / mean, 0, 0]])
    assert torch.allclose(c.weights, exp_w, atol=1e-5)
    assert close(c.metrics["is/weight_mean"], (1.2 + 1.0 + 0.7) / 3 / mean)
    # differs from normalising over the kept tokens by ~11% on this batch
    kept = get_correction("sparse_rl")(q, p, m, normalize_over="kept")
    assert not torch.allclose(c.weights, kept.weights, atol=1e-2)
    # mask mode: a token above the cap weighs 0 in the mean's numerator, 1 in its denominator
    qm, pm, mm = make([[LN(2.0), 0.0, LN(0.6)]])
    k = get_correction("sparse_rl")(qm, pm, mm, is_mode="mask", token_high=3.0)
    assert torch.allclose(k.weights, torch.tensor([[0.0, 1.0 / (1.6 / 3), 0.6 / (1.6 / 3)]]), atol=1e-5)
    with pytest.raises(ValueError, match="normalize_over"):
        get_correction("sparse_rl")(q, p, m, normalize_over="bogus")


def test_sparse_rl_hand_computed():
    q, p, m = sparse_case()
    c = get_correction("sparse_rl")(q, p, m, normalize_over="kept")
    exp_mask = torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 0, 0]])
    assert torch.equal(c.mask, exp_mask)
    mean = (1.2 + 1.0 + 0.7) / 3
    exp_w = torch.tensor([[1.2 / mean, 0, 1.0 / mean], [0, 0, 0], [0.7 / mean, 0, 0]])
    assert torch.allclose(c.weights, exp_w, atol=1e-5)
    assert close(c.weights[c.mask != 0].mean(), 1.0)
    assert c.behaviour_logprobs is p
    assert close(c.metrics["rs/token_masked_frac"], 3 / 8)
    assert close(c.metrics["rs/seq_vetoed_frac"], 1 / 3)
    assert close(c.metrics["rs/masked_frac"], 5 / 8)
    assert c.metrics["is/clipped_frac"] == 0.0
    assert close(c.metrics["is/weight_mean"], 1.0)
    # ESS of kept weights (1.2, 1.0, 0.7)
    assert close(c.metrics["is/ess"], 2.9**2 / (3 * (1.44 + 1.0 + 0.49)))

    raw = get_correction("sparse_rl")(q, p, m, normalize=False)
    assert torch.allclose(raw.weights, torch.tensor([[1.2, 0, 1.0], [0, 0, 0], [0.7, 0, 0]]), atol=1e-5)


def test_sparse_rl_is_modes():
    # wide token window so that the IS step bites: ρ = [2.0, 1.0, 0.2]
    q, p, m = make([[LN(2.0), 0.0, LN(0.2)]])
    opts = dict(token_low=0.1, token_high=3.0, normalize=False)
    t = get_correction("sparse_rl")(q, p, m, is_mode="truncate", **opts)
    assert torch.allclose(t.weights, torch.tensor([[1.5, 1.0, 0.2]]), atol=1e-6)
    assert close(t.metrics["is/clipped_frac"], 1 / 3)
    c = get_correction("sparse_rl")(q, p, m, is_mode="clip", is_floor=0.5, **opts)
    assert torch.allclose(c.weights, torch.tensor([[1.5, 1.0, 0.5]]), atol=1e-6)
    assert close(c.metrics["is/clipped_frac"], 2 / 3)
    k = get_correction("sparse_rl")(q, p, m, is_mode="mask", **opts)
    assert torch.equal(k.mask, torch.tensor([[0.0, 1, 1]]))
    assert torch.allclose(k.weights, torch.tensor([[0.0, 1.0, 0.2]]), atol=1e-6)
    with pytest.raises(ValueError):
        get_correction("sparse_rl")(q, p, m, is_mode="bogus")


def test_sparse_rl_every_token_rejected():
    q, p, m = make([[LN(0.1), LN(3.0)], [LN(1e-6), 0.0]])
    c = get_correction("sparse_rl")(q, p, m)
    assert c.mask.sum() == 0 and c.weights.sum() == 0
    assert torch.isfinite(c.weights).all()
    assert all(math.isfinite(v) for v in c.metrics.values())
    assert c.metrics["rs/masked_frac"] == 1.0 and c.metrics["is/ess"] == 0.0


def test_overflow_log_ratio_clamped():
    q, p, m = make([[100.0, 0.0], [-100.0, 0.0]])
    for name in available_corrections():
        c = get_correction(name)(q, p, m)
        assert torch.isfinite(c.weights).all(), name
        assert close(c.metrics["mismatch/log_ratio_abs_max"], 20.0), name
    t = get_correction("tis")(q, p, m)
    assert close(t.weights[0, 0], 2.0) and close(t.weights[1, 0], math.exp(-20), 1e-3)
    a = get_correction("acr")(q, p, m)
    assert close(a.clip_upper_scale[0, 0], math.exp(20) / 2, 1e-4)
    s = get_correction("sparse_rl")(q, p, m)
    # row 0: token 0 masked (ρ = e^20 > 1.5); row 1 vetoed (ρ = e^-20 < 1e-4)
    assert torch.equal(s.mask, torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    assert close(s.metrics["rs/seq_vetoed_frac"], 0.5)


# --------------------------------------------------------------------------- tis / mis / acr


def test_tis_token_and_sequence():
    q, p, m = make([[LN(1.5), LN(1.5)], [LN(0.5), LN(1.2)]])
    t = get_correction("tis")(q, p, m)
    assert torch.allclose(t.weights, torch.tensor([[1.5, 1.5], [0.5, 1.2]]), atol=1e-6)
    assert t.metrics["is/clipped_frac"] == 0.0
    assert torch.equal(t.mask, m)
    t1 = get_correction("tis")(q, p, m, cap=1.4)
    assert torch.allclose(t1.weights, torch.tensor([[1.4, 1.4], [0.5, 1.2]]), atol=1e-6)
    assert close(t1.metrics["is/clipped_frac"], 0.5)
    s = get_correction("tis")(q, p, m, level="sequence")
    # seq0: 1.5·1.5 = 2.25 → 2.0 ; seq1: 0.5·1.2 = 0.6
    assert torch.allclose(s.weights, torch.tensor([[2.0, 2.0], [0.6, 0.6]]), atol=1e-5)
    assert close(s.metrics["is/clipped_frac"], 0.5)
    n = get_correction("tis")(q, p, m, level="sequence", normalize=True)
    assert torch.allclose(n.weights, torch.tensor([[2.0, 2.0], [0.6, 0.6]]) / 1.3, atol=1e-5)
    with pytest.raises(ValueError):
        get_correction("tis")(q, p, m, level="bogus")


def test_mis_token_and_sequence():
    q, p, m = make([[LN(3.0), LN(1.5)], [LN(0.5), LN(1.2)]])
    t = get_correction("mis")(q, p, m)
    assert torch.equal(t.mask, torch.tensor([[0.0, 1], [1, 1]]))
    assert torch.allclose(t.weights, torch.tensor([[0.0, 1.5], [0.5, 1.2]]), atol=1e-6)
    assert close(t.metrics["rs/token_masked_frac"], 0.25)
    s = get_correction("mis")(q, p, m, level="sequence")
    # seq0: 4.5 > 2 → rejected; seq1: 0.6 kept
    assert torch.equal(s.mask, torch.tensor([[0.0, 0], [1, 1]]))
    assert torch.allclose(s.weights, torch.tensor([[0.0, 0.0], [0.6, 0.6]]), atol=1e-5)
    assert close(s.metrics["rs/seq_vetoed_frac"], 0.5)


def test_trl_is_modes_as_trl_computes_them():
    """TRL's vllm_importance_sampling_mode on ratios [[4, 0.5], [0.1, 1.2]] (products 2 and 0.12), clip [0.2, 3]:
    truncation clamps from both sides; masking zeroes the weight (the token keeps its place in the loss)."""
    q, p, m = make([[LN(4.0), LN(0.5)], [LN(0.1), LN(1.2)]])
    fn = get_correction("trl_is")
    tt = fn(q, p, m, mode="token_truncate", clip_min=0.2, clip_max=3.0)
    assert torch.allclose(tt.weights, torch.tensor([[3.0, 0.5], [0.2, 1.2]]), atol=1e-6)
    assert close(tt.metrics["is/clipped_frac"], 0.5) and torch.equal(tt.mask, m)
    tm = fn(q, p, m, mode="token_mask", clip_min=0.2, clip_max=3.0)
    assert torch.allclose(tm.weights, torch.tensor([[0.0, 0.5], [0.0, 1.2]]), atol=1e-6)
    assert torch.equal(tm.mask, m)  # zero weight, not removed: TRL's masked_fill
    assert close(tm.metrics["rs/token_masked_frac"], 0.5) and close(tm.metrics["rs/masked_frac"], 0.5)  # no gradient
    st = fn(q, p, m, mode="sequence_truncate", clip_min=0.2, clip_max=3.0)
    assert torch.allclose(st.weights, torch.tensor([[2.0, 2.0], [0.2, 0.2]]), atol=1e-5)
    sm = fn(q, p, m)  # TRL's default: sequence_mask, clip_max 3, no lower bound
    assert torch.allclose(sm.weights, torch.tensor([[2.0, 2.0], [0.12, 0.12]]), atol=1e-5)
    sm1 = fn(q, p, m, clip_max=1.5)
    assert torch.allclose(sm1.weights, torch.tensor([[0.0, 0.0], [0.12, 0.12]]), atol=1e-5)
    with pytest.raises(ValueError, match="mode must be one of"):
        fn(q, p, m, mode="sequence")
    with pytest.raises(ValueError, match="clip_min < clip_max"):
        fn(q, p, m, clip_min=3.0, clip_max=2.0)


def test_icepop_zeroes_the_tokens_outside_its_band_and_weights_the_rest():
    """NeMo-RL / OpenRLHF icepop on ratios [6, 0.4, 5, 0.5, 1.3]: bounds inclusive, zeroed tokens kept in the loss."""
    q, p, m = make([[LN(6.0), LN(0.4), LN(5.0), LN(0.5), LN(1.3)]])
    c = get_correction("icepop")(q, p, m)
    assert torch.allclose(c.weights, torch.tensor([[0.0, 0.0, 5.0, 0.5, 1.3]]), atol=1e-5)
    assert torch.equal(c.mask, m) and close(c.metrics["rs/token_masked_frac"], 0.4)
    assert close(c.metrics["rs/masked_frac"], 0.4)  # weight 0 in the mask: counted as giving no gradient
    narrow = get_correction("icepop")(q, p, m, low=0.9, high=1.5)
    assert torch.allclose(narrow.weights, torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.3]]), atol=1e-5)
    with pytest.raises(ValueError, match="low <= high"):
        get_correction("icepop")(q, p, m, low=2.0, high=1.0)


def test_seq_mask_tis_zeroes_responses_by_their_geometric_mean_ratio():
    """Geometric means: row 0 sqrt(1.001 * 1.0008) inside [0.999, 1.002], row 1 sqrt(1.2 * 0.9) outside;
    the kept row's tokens take their own ratios; the padded token of row 2 does not count in its mean."""
    q, p, m = make([[LN(1.001), LN(1.0008)], [LN(1.2), LN(0.9)], [LN(1.0005), LN(50.0)]], mask=[[1, 1], [1, 1], [1, 0]])
    c = get_correction("seq_mask_tis")(q, p, m)
    assert torch.allclose(c.weights, torch.tensor([[1.001, 1.0008], [0.0, 0.0], [1.0005, 0.0]]), atol=1e-6)
    assert torch.equal(c.mask, m) and close(c.metrics["rs/seq_vetoed_frac"], 1 / 3)
    assert close(c.metrics["rs/masked_frac"], 2 / 5)  # the vetoed row's 2 of the 5 valid tokens
    wide = get_correction("seq_mask_tis")(q, p, m, low=0.5, high=2.0)
    assert torch.allclose(wide.weights[1], torch.tensor([1.2, 0.9]), atol=1e-6)


def test_double_min_accepts_by_min_one_p_over_q_and_reweights_by_the_overlap():
    """Sparrow's double-min on ratios [4, 0.5, 0.25, 1.5] with the seed's uniforms: accepted where u < min(1, ρ);
    w = Z · clip(ρ, 1, 3) with Z the given per-token α, or (none given) the share of tokens accepted."""
    q, p, m = make([[LN(4.0), LN(0.5), LN(0.25), LN(1.5)]])
    u = torch.rand((1, 4), generator=torch.Generator().manual_seed(7))
    accepted = u < torch.tensor([[1.0, 0.5, 0.25, 1.0]])
    z = torch.tensor([[0.9, 0.8, 0.7, 0.6]])
    c = get_correction("double_min")(q, p, m, overlap=z, seed=7)
    assert torch.equal(c.mask.bool(), accepted)
    want = torch.where(accepted, z * torch.tensor([[3.0, 1.0, 1.0, 1.5]]), torch.zeros(1, 4))
    assert torch.allclose(c.weights, want, atol=1e-6)
    assert close(c.metrics["rs/token_masked_frac"], float((~accepted).float().mean()))
    flat = get_correction("double_min")(q, p, m, seed=7)
    share = float(accepted.float().mean())
    assert torch.allclose(flat.weights, torch.where(accepted, share * torch.tensor([[3.0, 1.0, 1.0, 1.5]]), 0.0))
    again = get_correction("double_min")(q, p, m, overlap=z, seed=7)
    assert torch.equal(again.mask, c.mask)  # the same seed draws the same
    with pytest.raises(ValueError, match="upclip must be >= 1"):
        get_correction("double_min")(q, p, m, upclip=0.5)


def test_acr_weights_and_scale():
    q, p, m = make([[LN(4.0), 0.0, LN(0.5)]])
    a = get_correction("acr")(q, p, m)
    assert torch.allclose(a.weights, torch.tensor([[2.0, 1.0, 0.5]]), atol=1e-6)
    # 1/r_t = ρ / min(ρ, C)
    assert torch.allclose(a.clip_upper_scale, torch.tensor([[2.0, 1.0, 1.0]]), atol=1e-6)
    assert close(a.metrics["is/clipped_frac"], 1 / 3)


# --------------------------------------------------------------------------- rejection


def test_rejection_token_levels():
    q, p, m = make([[LN(0.4), 0.0, LN(2.5), LN(1.5)]])
    r = get_correction("rejection")(q, p, m)  # ratio in [0.5, 2.0]
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 1]]))
    assert torch.equal(r.weights, r.mask)
    assert close(r.metrics["rs/token_masked_frac"], 0.5)
    # only high given → low = 1/high
    r = get_correction("rejection")(q, p, m, high=1.6)
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 1]]))
    r = get_correction("rejection")(q, p, m, high=1.4)
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 0]]))
    # k2 = ½ (ln ρ)² ≤ 0.1 ⇔ |ln ρ| ≤ 0.447: keeps ρ = 1 only (ln 1.5 = 0.405 is kept too)
    r = get_correction("rejection")(q, p, m, metric="k2", high=0.1)
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 1]]))
    # k3 = ρ − 1 − ln ρ: 0.4 → 0.316, 2.5 → 0.584, 1.5 → 0.0945
    r = get_correction("rejection")(q, p, m, metric="k3", high=0.3)
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 1]]))
    r = get_correction("rejection")(q, p, m, metric="k3", high=0.09)
    assert torch.equal(r.mask, torch.tensor([[0.0, 1, 0, 0]]))
    # k1 = −ln ρ in [−0.5, 1.0]: ρ ∈ [e^-1, e^0.5] = [0.368, 1.649]
    r = get_correction("rejection")(q, p, m, metric="k1", low=-0.5, high=1.0)
    assert torch.equal(r.mask, torch.tensor([[1.0, 1, 0, 1]]))


def test_rejection_sequence_levels():
    q, p, m = make(
        [
            [LN(1.5), LN(1.5), 0.0],  # product 2.25, geo mean 2.25^(1/3) = 1.31
            [LN(1.2), LN(0.9), LN(0.95)],  # product 1.026
            [0.0005, 0.0, 0.0],  # geo mean exp(0.0005/2) (pad excluded) = 1.00025
        ],
        [[1, 1, 1], [1, 1, 1], [1, 1, 0]],
    )
    r = get_correction("rejection")(q, p, m, level="seq_sum")  # product in [0.5, 2]
    assert torch.equal(r.mask.sum(-1), torch.tensor([0.0, 3, 2]))
    assert close(r.metrics["rs/seq_vetoed_frac"], 1 / 3)
    assert r.metrics["rs/token_masked_frac"] == 0.0
    g = get_correction("rejection")(q, p, m, level="geometric")  # [0.999, 1.001]
    assert torch.equal(g.mask.sum(-1), torch.tensor([0.0, 0, 2]))
    g = get_correction("rejection")(q, p, m, level="seq_mean", metric="ratio", low=0.99, high=1.01)
    # seq1 geo mean = 1.026^(1/3) = 1.0086
    assert torch.equal(g.mask.sum(-1), torch.tensor([0.0, 3, 2]))
    # seq_max of k2 ≤ 0.05: |ln ρ| ≤ 0.316; ln 1.5 = 0.405 ✗, ln 1.2 = 0.182 ✓
    x = get_correction("rejection")(q, p, m, level="seq_max", metric="k2", high=0.05)
    assert torch.equal(x.mask.sum(-1), torch.tensor([0.0, 3, 2]))
    # seq_mean of k3: seq1 mean of (0.0177, 0.00536, 0.00129) = 0.00812 ≤ 0.01; seq0 0.0945·2/3
    k = get_correction("rejection")(q, p, m, level="seq_mean", metric="k3")
    assert torch.equal(k.mask.sum(-1), torch.tensor([0.0, 3, 2]))
    # veto: any token ρ < 0.95 rejects the response
    v = get_correction("rejection")(q, p, m, level="seq_sum", high=10.0, veto=0.95)
    assert torch.equal(v.mask.sum(-1), torch.tensor([3.0, 0, 2]))
    with pytest.raises(ValueError):
        get_correction("rejection")(q, p, m, level="bogus")
    with pytest.raises(ValueError):
        get_correction("rejection")(q, p, m, metric="bogus")


# --------------------------------------------------------------------------- composition


def test_composition_rule():
    q, p, m = make([[LN(1.2), LN(0.4), LN(1.4)], [LN(3.0), 0.0, LN(0.8)]])
    s = get_correction("sparse_rl")(q, p, m)
    t = get_correction("tis")(q, p, m, cap=1.3)
    c = compose("sparse_rl", ("tis", {"cap": 1.3}))(q, p, m)
    assert torch.equal(c.mask, s.mask * t.mask)
    assert torch.allclose(c.weights, s.weights * t.weights)
    assert c.behaviour_logprobs is p
    assert "sparse_rl/is/weight_mean" in c.metrics and "tis/is/clipped_frac" in c.metrics
    # order independence
    c2 = compose(("tis", {"cap": 1.3}), "sparse_rl")(q, p, m)
    assert torch.equal(c2.mask, c.mask) and torch.allclose(c2.weights, c.weights)
    # rs metrics recomputed on the union: sparse_rl masks 0.4 (row 0) and 3.0 (row 1)
    assert close(c.metrics["rs/token_masked_frac"], 2 / 6)
    # bypass wins the behaviour policy; ACR scales multiply
    b = apply_corrections([("bypass", {}), ("acr", {"cap": 2.0})], q, p, m)
    assert b.behaviour_logprobs is q
    assert torch.allclose(b.clip_upper_scale, torch.tensor([[1.0, 1.0, 1.0], [1.5, 1.0, 1.0]]))
    aa = apply_corrections([("acr", {"cap": 2.0}), ("acr", {"cap": 1.5})], q, p, m)
    assert close(aa.clip_upper_scale[1, 0], 1.5 * 2.0)
    # masked-out tokens of one part zero the product
    r = apply_corrections(["rejection", "tis"], q, p, m)
    assert (r.weights[r.mask == 0] == 0).all()


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_resolve_and_apply(preset):
    spec = resolve(preset)
    assert spec and all(isinstance(n, str) and isinstance(o, dict) for n, o in spec)
    q, p, m = CASES["random"]
    c = apply_corrections(preset, q, p, m)
    assert torch.isfinite(c.weights).all()
    assert all(math.isfinite(v) for v in c.metrics.values())


def test_resolve_forms():
    for name in ("sparse_rl", "flashrl_tis", "fp8rl", "qurl", "verl_seq_is", "verl_geo_rs", "naive"):
        assert name in PRESETS
    assert resolve("flashrl_tis") == [("tis", {"level": "token", "cap": 2.0})]
    assert resolve("qurl") == [("acr", {"cap": 2.0})]
    assert resolve("verl_seq_is") == [("tis", {"level": "sequence", "cap": 2.0})]
    assert resolve("naive") == [("none", {})]
    assert resolve("mis") == [("mis", {})]
    assert resolve(["tis", ("rejection", {"level": "geometric"})]) == [
        ("tis", {}),
        ("rejection", {"level": "geometric"}),
    ]
    # fresh copies: mutating the result does not change the preset
    spec = resolve("flashrl_tis")
    spec[0][1]["cap"] = 99.0
    assert PRESETS["flashrl_tis"][0][1]["cap"] == 2.0
    # options override the preset's defaults
    assert resolve("sparse_rl", {"token_low": 0.4}) == [("sparse_rl", {"token_low": 0.4})]
    assert resolve("verl_geo_rs_token_tis", {"cap": 3.0})[1] == ("tis", {"level": "token", "cap": 3.0})
    assert resolve("verl_seq_is_rs", {"rejection": {"high": 4.0}})[1][1]["high"] == 4.0
    with pytest.raises(ValueError, match="is_cap"):
        resolve("sparse_rl", {"bogus_option": 1})
    q, p, m = CASES["random"]
    o = apply_corrections("sparse_rl", q, p, m, options={"normalize": False})
    assert torch.equal(o.weights, get_correction("sparse_rl")(q, p, m, normalize=False).weights)
    a = apply_corrections("sparse_rl", q, p, m)
    b = get_correction("sparse_rl")(q, p, m)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.mask, b.mask)
