"""Corrections and α under truncated sampling (top-k / top-p): the sampler's log-probs are those of the processed
distribution it drew from (tempered, truncated, renormalised: vLLM's ``processed_logprobs``), checked against a
hand-built truncated pair, and α is Σ min(p, q) against that same distribution."""

from __future__ import annotations

import math

import torch

from sparserl.mismatch.acceptance import acceptance
from sparserl.rollout.sampling import SamplingParams, sampled_distribution


def test_top_k_and_top_p_give_the_renormalised_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    tau = 0.5
    e = [math.exp(x / tau) for x in logits[0].tolist()]
    # top_k = 3: the three largest, renormalised
    z3 = sum(e[:3])
    want_k = [math.log(x / z3) for x in e[:3]] + [-math.inf] * 3
    got_k = sampled_distribution(logits, SamplingParams(temperature=tau, top_k=3))[0].tolist()
    assert all(math.isclose(g, w, abs_tol=1e-5) if w > -math.inf else g == -math.inf for g, w in zip(got_k, want_k))
    # top_p = 0.9 over the tempered probabilities: keep while the mass before a token is under 0.9
    probs = [x / sum(e) for x in e]
    keep, before = [], 0.0
    for prob in probs:
        keep.append(before < 0.9)
        before += prob
    z = sum(x for x, k in zip(e, keep) if k)
    got_p = sampled_distribution(logits, SamplingParams(temperature=tau, top_p=0.9))[0].tolist()
    for g, x, k in zip(got_p, e, keep):
        assert math.isclose(g, math.log(x / z), abs_tol=1e-5) if k else g == -math.inf
    # α against a dense p: Σ_x min(p(x), q(x)) over the kept tokens only (q is 0 elsewhere)
    p = torch.log_softmax(torch.tensor([[1.5, 1.5, 0.0, 0.0, 0.0, 0.0]]), -1)
    q = torch.tensor([got_k])
    hand = sum(min(math.exp(a), math.exp(b)) for a, b in zip(p[0].tolist(), got_k) if b > -math.inf)
    assert math.isclose(float(acceptance(p, q)[0]), hand, rel_tol=1e-6)


def test_the_sampler_records_its_tokens_log_probs_under_the_truncated_distribution(tiny):
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor

    params = SamplingParams(n=2, temperature=0.8, top_k=5, top_p=0.8, max_new_tokens=8, seed=2, keep_hidden=True)
    engine = RolloutEngine(tiny, get_compressor("none"), fused=False)
    out = engine.generate(["hello there"], params)
    for x, tokens, recorded in zip(out.hidden, out.response_ids, out.sampler_logprobs):
        logits = torch.cat([engine.hidden_logits(x[:1], True), engine.hidden_logits(x[1:], False)])
        q = sampled_distribution(logits, params).cpu()
        assert (q > -math.inf).sum(-1).max() <= 5  # at most top_k tokens can be drawn
        lp = q.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert torch.allclose(lp, torch.tensor(recorded), atol=1e-5)
        full = torch.log_softmax(logits.cpu() / 0.8, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert (lp - full).min() > 0  # renormalised over the kept set: above the untruncated log-prob
