"""The shared test matrix every KV compressor runs through (kvpress-style).

A new compressor registered in ``sparserl.rollout.kv`` is picked up automatically; it must add a
hand-built case to ``HAND_CASES`` (the test fails until it does).
"""
import math

import pytest
import torch

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import ScoreInputs, available_compressors, get_compressor
from sparserl.rollout.kv.rkv import redundancy
from sparserl.rollout.sampling import SamplingParams

ALL = available_compressors()
PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name, budget=16, step=8, **kw):
    if name in ("snapkv",):
        kw.setdefault("window", 4)
    return get_compressor(name, budget=budget, step_length=step, **kw)


def test_registry_has_the_published_methods():
    assert {"rkv", "snapkv", "streaming", "h2o"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_budget_respected_and_memory_bounded(tiny, name):
    B, step = 16, 8
    eng = RolloutEngine(tiny, make(name, B, step))
    caps = []
    eng.step_hook = lambda ev, cache=None, **kw: caps.append((cache.k[0].shape[2], int(cache.region_len().max()), cache.region_start)) if ev == "after_decode" else None
    out = eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=60, seed=0, ignore_eos=True))
    assert out.kv.compressions > 0
    for cap, region, start in caps:
        assert cap == start + B + step  # the buffer is sized to budget + period, not to the length
        assert region <= B + step
    P = max(len(p) for p in out.prompt_ids)
    for kept, prompt in zip(out.kv_tokens_kept, out.prompt_ids):
        assert kept <= len(prompt) + B + step
    per_tok = eng.model.kv_bytes_per_token()
    assert out.kv.bytes_peak == 4 * per_tok * (P + B + step)
    assert out.kv.bytes_theory <= out.kv.bytes_peak <= 1.1 * out.kv.bytes_theory + 4 * per_tok * P
    assert out.kv.bytes_dense > out.kv.bytes_peak


@pytest.mark.parametrize("name", ALL)
def test_budget_at_least_length_equals_dense(tiny, name):
    p = SamplingParams(n=2, max_new_tokens=30, seed=4, ignore_eos=True)
    dense = RolloutEngine(tiny, None).generate(PROMPTS, p)
    comp = make(name, budget=64, step=8)
    sparse = RolloutEngine(tiny, comp).generate(PROMPTS, p)
    assert sparse.kv.compressions == 0
    assert sparse.response_ids == dense.response_ids
    assert sparse.sampler_logprobs == dense.sampler_logprobs


@pytest.mark.parametrize("name", ALL)
def test_unequal_prompt_lengths_match_single_runs(tiny, name):
    p = SamplingParams(n=1, max_new_tokens=40, temperature=0.0, ignore_eos=True, logprobs_topk=3)
    eng = RolloutEngine(tiny, make(name, budget=12, step=6))
    both = eng.generate(PROMPTS, p)
    assert both.kv.compressions > 0
    for i, prompt in enumerate(PROMPTS):
        alone = eng.generate([prompt], p)
        assert alone.response_ids[0] == both.response_ids[i]
        assert torch.allclose(alone.top_logprobs[0], both.top_logprobs[i], atol=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_next_step_equals_attention_over_kept_keys(tiny, name):
    """After a compression, recompute the next decode step with transformers' own modules over exactly
    the kept keys/values (at their stored positions) and the new token at its true position."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny.model
    eng = RolloutEngine(tiny, make(name, budget=12, step=6))
    snap = {}

    def hook(event, t, cache, **kw):
        if event == "before_decode" and cache.n_compressions > 0 and "k" not in snap:
            L = cache.max_len
            snap.update(t=t, tokens=kw["tokens"].clone(), positions=kw["positions"].clone(),
                        k=[x[:, :, :L].clone() for x in cache.k], v=[x[:, :, :L].clone() for x in cache.v],
                        pos=cache.pos[:, :, :, :L].clone(), start=cache.start.clone(), lens=cache.lens.clone())
        elif event == "after_decode" and "k" in snap and "logits" not in snap:
            snap["logits"] = kw["logits"].clone()

    eng.step_hook = hook
    eng.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=40, seed=2, ignore_eos=True))
    assert "logits" in snap
    # the true position continues from the length, not from the number of cached slots
    assert (snap["positions"] > snap["lens"] - snap["start"]).all()
    B = snap["tokens"].shape[0]
    cfg = model.config
    hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    with torch.no_grad():
        h = model.model.embed_tokens(snap["tokens"])[:, None]  # [B, 1, H]
        pos = snap["positions"][:, None]
        cos, sin = model.model.rotary_emb(h, pos)
        for li, layer in enumerate(model.model.layers):
            x = layer.input_layernorm(h)
            at = layer.self_attn
            q = at.q_proj(x).view(B, 1, hq, D).transpose(1, 2)
            k = at.k_proj(x).view(B, 1, hkv, D).transpose(1, 2)
            v = at.v_proj(x).view(B, 1, hkv, D).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs = []
            for b in range(B):
                s0, L = int(snap["start"][b]), int(snap["lens"][b])
                heads = []
                for hh in range(hq):
                    g = hh // (hq // hkv)
                    K = torch.cat([snap["k"][li][b, g, s0:L], k[b, g]], 0)
                    V = torch.cat([snap["v"][li][b, g, s0:L], v[b, g]], 0)
                    a = torch.softmax(q[b, hh] @ K.T / math.sqrt(D), -1)
                    heads.append(a @ V)
                outs.append(torch.cat(heads, -1))
            h = h + at.o_proj(torch.stack(outs))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        ref = model.lm_head(model.model.norm(h))[:, 0].float()
    assert torch.allclose(ref, snap["logits"], atol=1e-4)
    # kept slots are in position order, and distinct
    pos0 = snap["pos"][0, 0, 0, int(snap["start"][0]) : int(snap["lens"][0])]
    assert (pos0[1:] > pos0[:-1]).all()


# ---- hand-built cases: each method keeps the right tokens by its own definition ------------------
def _inputs(L=10, D=4, w=2, hq=2, hkv=1, keys=None, queries=None, acc=None):
    keys = keys if keys is not None else torch.randn(1, hkv, L, D, generator=torch.Generator().manual_seed(0))
    return ScoreInputs(keys=keys, region=slice(0, L), valid=torch.ones(1, L, dtype=torch.bool),
                       queries=queries, positions=torch.arange(L)[None, None].expand(1, hkv, L), attn_acc=acc)


def case_streaming():
    c = get_compressor("streaming", budget=5, sinks=2, step_length=4)
    return c, _inputs(), 5, [0, 1, 7, 8, 9]


def case_h2o():
    c = get_compressor("h2o", budget=5, window=2, step_length=4)
    acc = torch.zeros(1, 1, 10)
    acc[0, 0, [1, 4, 6]] = torch.tensor([5.0, 3.0, 4.0])
    return c, _inputs(acc=acc), 5, [1, 4, 6, 8, 9]


def _attention_case(name, **kw):
    # keys are one-hot directions; the window queries point at keys 2 and 5
    L, D = 10, 10
    keys = torch.eye(L)[None, None] * 0.1
    keys[0, 0, 2, 2] = keys[0, 0, 5, 5] = 1.0
    q = torch.zeros(1, 2, 2, D)
    q[:, :, :, 2] = 8.0
    q[:, :, :, 5] = 8.0
    c = get_compressor(name, budget=4, window=2, step_length=4, **kw)
    return c, _inputs(L=L, D=D, keys=keys, queries=q), 4, [2, 5, 8, 9]


def case_snapkv():
    return _attention_case("snapkv", kernel=1)


def case_rkv():
    # equal importance for keys 3 and 6 (both attended); key 3 has an identical twin at 4 → redundant,
    # key 6 is unique: R-KV keeps 6 (and 4, the most recent copy) over 3.
    L, D = 10, 8
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 1, L, D, generator=g)
    keys[0, 0, 4] = keys[0, 0, 3]
    q = torch.zeros(1, 2, 2, D)
    c = get_compressor("rkv", budget=4, window=2, step_length=4, kernel=1, lam=0.0)
    sel = c.select(_inputs(L=L, D=D, keys=keys, queries=q), 4)[0, 0].tolist()
    assert 3 not in sel  # the older of two identical keys is the redundant one
    # with λ=1 (importance only) and queries pointing at key 3, it is kept
    q[:, :, :, :] = keys[0, 0, 3] * 4
    c1 = get_compressor("rkv", budget=4, window=2, step_length=4, kernel=1, lam=1.0)
    sel1 = c1.select(_inputs(L=L, D=D, keys=keys, queries=q), 4)[0, 0].tolist()
    assert 3 in sel1
    return c, _inputs(L=L, D=D, keys=keys, queries=torch.zeros(1, 2, 2, D)), 4, sel


HAND_CASES = {"streaming": case_streaming, "h2o": case_h2o, "snapkv": case_snapkv, "rkv": case_rkv}


@pytest.mark.parametrize("name", ALL)
def test_hand_built_case_keeps_the_right_tokens(name):
    assert name in HAND_CASES, f"add a hand-built case for compressor {name!r}"
    comp, inp, keep, expected = HAND_CASES[name]()
    got = comp.select(inp, keep)[0, 0].tolist()
    assert got == sorted(expected)
    assert len(got) == keep and got[-comp.window :] == list(range(10 - comp.window, 10)) if comp.window else True


def test_rkv_redundancy_definition():
    keys = torch.tensor([[[[1.0, 0.0], [1.0, 0.01], [0.0, 1.0]]]])
    red = redundancy(keys, torch.ones(1, 3, dtype=torch.bool), threshold=0.5)
    # key 0 and key 1 are similar; for row 0 the most recent similar key (1) is retained, so only
    # row 1's similarity to key 0 counts: key 0 is the redundant one; key 2 is unique
    assert red[0, 0, 0] > red[0, 0, 1] and red[0, 0, 0] > red[0, 0, 2]
    assert torch.allclose(red.sum(-1), torch.ones(1, 1))


@pytest.mark.parametrize("name", ["rkv", "snapkv", "streaming", "h2o"])
def test_prompt_compression_bounds_the_prompt(tiny, name):
    comp = make(name, budget=10, step=4, compress_prompt=True)
    long_prompt = " ".join(["word"] * 40)
    out = RolloutEngine(tiny, comp).generate([long_prompt, "short"], SamplingParams(n=1, max_new_tokens=12, seed=0, ignore_eos=True))
    assert max(out.kv_tokens_kept) <= 10 + 4
    assert out.kv.bytes_peak == 2 * RolloutEngine(tiny, None).model.kv_bytes_per_token() * (10 + 4)


def test_newline_trigger(tiny):
    comp = make("rkv", budget=12, step=20, trigger="newline")
    eng = RolloutEngine(tiny, comp)
    eng._newline_ids = torch.ones(len(tiny.tokenizer), dtype=torch.bool)  # every token counts as a newline
    out = eng.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=30, seed=0, ignore_eos=True))
    P = len(out.prompt_ids[0])
    assert all(k <= P + 12 + 1 for k in out.kv_tokens_kept)  # compressed right after passing the budget
    assert out.kv.compressions >= 10
