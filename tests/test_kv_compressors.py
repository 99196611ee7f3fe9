"""The shared test matrix every KV compressor runs through (kvpress-style).

A new compressor registered in ``sparserl.rollout.kv`` is picked up automatically; it must add a
hand-built case to ``HAND_CASES`` (the test fails until it does). ``none`` (the dense cache) runs
through the same matrix: it never compresses and its buffers hold ``prompt + max_new``; so does block
top-k (``blocktopk``), which keeps every token and reads chosen pages at each step (the matrix checks
its steps against attention over exactly the slots it read, ``cache.attended``).
"""

import math

import pytest
import torch

from sparserl.errors import SparserlError
from sparserl.registry import UnknownNameError
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import (
    COMPRESSORS,
    CompressorOptionError,
    KVCompressor,
    ScoreInputs,
    available_compressors,
    build_compressor,
    compressor_from_fields,
    get_compressor,
    register,
)
from sparserl.rollout.kv.rkv import redundancy
from sparserl.rollout.sampling import SamplingParams

ALL = available_compressors()
SPARSE = [n for n in ALL if get_compressor(n).compresses]
EVICTING = [n for n in ALL if get_compressor(n).evicts]
DENSE = get_compressor("none")
PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name, budget=16, step=8, **kw):
    if name in ("snapkv",):
        kw.setdefault("window", 4)
    if name == "blocktopk":  # whole pages of 16 tokens, at least the 3 always read; the tiny model's layer 1 sparse
        budget = max(48, -(-budget // 16) * 16)
        kw.setdefault("dense_layers", 1)
    return get_compressor(name, budget=budget, step_length=step, **kw)


def test_registry_has_the_published_methods():
    assert {"none", "rkv", "snapkv", "streaming", "h2o", "blocktopk"} <= set(ALL)
    assert SPARSE == [n for n in ALL if n != "none"]
    assert EVICTING == [n for n in SPARSE if n != "blocktopk"]
    dense = get_compressor("none")
    assert dense is not None and isinstance(dense, KVCompressor) and not dense.compresses
    assert all(COMPRESSORS.get(n).name == n for n in ALL)


def test_registry_duplicate_name_and_unknown_name():
    cls = COMPRESSORS.get("rkv")
    assert register("rkv")(cls) is cls  # the same class again: a no-op (re-import)

    class Other(KVCompressor):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register("rkv")(Other)
    assert COMPRESSORS.get("rkv") is cls
    with pytest.raises(UnknownNameError, match="did you mean 'snapkv'"):
        get_compressor("snapk")


@pytest.mark.parametrize("name", ALL)
def test_budget_respected_and_memory_bounded(tiny, name):
    B, step = 16, 8
    comp = make(name, B, step)
    eng = RolloutEngine(tiny, comp)
    caps = []
    eng.step_hook = lambda ev, cache=None, **kw: (
        caps.append((cache.k[0].shape[2], int(cache.region_len().max()), cache.region_start))
        if ev == "after_decode"
        else None
    )
    out = eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=60, seed=0, ignore_eos=True))
    P = max(len(p) for p in out.prompt_ids)
    per_tok = eng.model.kv_bytes_per_token()
    if not comp.evicts:  # dense, block top-k: never compresses, the buffer holds the whole sequence
        assert out.kv.compressions == 0
        assert {cap for cap, _, _ in caps} == {P + 60} == {comp.capacity(P, 60)}
        assert out.kv.bytes_peak == 4 * per_tok * (P + 60)
        assert all(k == len(p) + 59 for k, p in zip(out.kv_tokens_kept, out.prompt_ids))
        return
    assert out.kv.compressions > 0
    for cap, region, start in caps:
        assert cap == start + B + step == comp.capacity(P, 60)  # sized to budget + period, not to the length
        assert region <= B + step
    for kept, prompt in zip(out.kv_tokens_kept, out.prompt_ids):
        assert kept <= len(prompt) + B + step
    assert out.kv.bytes_peak == 4 * per_tok * (P + B + step)
    assert out.kv.bytes_theory <= out.kv.bytes_peak <= 1.1 * out.kv.bytes_theory + 4 * per_tok * P
    assert out.kv.bytes_dense > out.kv.bytes_peak


@pytest.mark.parametrize("name", ALL)
def test_budget_at_least_length_equals_dense(tiny, name):
    p = SamplingParams(n=2, max_new_tokens=30, seed=4, ignore_eos=True)
    dense = RolloutEngine(tiny, DENSE).generate(PROMPTS, p)
    # block top-k's budget covers the prompt too: whole pages of 16 tokens that hold the longest sequence
    longest = max(map(len, dense.prompt_ids)) + p.max_new_tokens  # 39 + 30 tokens with SmolLM2's tokenizer
    comp = make(name, budget=64 if name != "blocktopk" else 16 * -(-longest // 16), step=8)
    sparse = RolloutEngine(tiny, comp).generate(PROMPTS, p)
    assert sparse.kv.compressions == 0
    assert sparse.response_ids == dense.response_ids
    assert sparse.sampler_logprobs == dense.sampler_logprobs


@pytest.mark.parametrize("name", ALL)
def test_unequal_prompt_lengths_match_single_runs(tiny, name):
    p = SamplingParams(n=1, max_new_tokens=40, temperature=0.0, ignore_eos=True, logprobs_topk=3)
    comp = make(name, budget=12, step=6)
    eng = RolloutEngine(tiny, comp)
    both = eng.generate(PROMPTS, p)
    assert (both.kv.compressions > 0) == comp.evicts
    for i, prompt in enumerate(PROMPTS):
        alone = eng.generate([prompt], p)
        assert alone.response_ids[0] == both.response_ids[i]
        assert torch.allclose(alone.top_logprobs[0], both.top_logprobs[i], atol=1e-4)


@pytest.mark.parametrize("name", ALL)
def test_next_step_equals_attention_over_kept_keys(tiny, name):
    """After a compression, recompute the next decode step with transformers' own modules over exactly
    the kept keys/values (at their stored positions) and the new token at its true position; over the
    slots each layer read (``cache.attended``: block top-k's chosen pages)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny.model
    comp = make(name, budget=12, step=6)
    eng = RolloutEngine(tiny, comp)
    snap = {}

    def hook(event, t, cache, **kw):
        ready = cache.n_compressions > 0 if comp.evicts else t >= 20  # dense, block top-k: any late step
        if event == "before_decode" and ready and "k" not in snap:
            L = cache.max_len
            snap.update(
                t=t,
                tokens=kw["tokens"].clone(),
                positions=kw["positions"].clone(),
                k=[x[:, :, :L].clone() for x in cache.k],
                v=[x[:, :, :L].clone() for x in cache.v],
                pos=cache.pos[:, :, :, :L].clone(),
                start=cache.start.clone(),
                lens=cache.lens.clone(),
            )
        elif event == "after_decode" and "k" in snap and "logits" not in snap:
            snap["logits"] = kw["logits"].clone()
            snap["read"] = [cache.attended(li) for li in range(cache.n_layers)]  # [B, Hkv, L + 1] each

    eng.step_hook = hook
    eng.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=40, seed=2, ignore_eos=True))
    assert "logits" in snap
    if comp.selects_per_step:  # it really read fewer slots in its sparse layer, all in the dense one
        assert snap["read"][1].sum() < snap["read"][0].sum()
    # the true position continues from the length, not from the number of cached slots
    if comp.evicts:
        assert (snap["positions"] > snap["lens"] - snap["start"]).all()
    else:
        assert (snap["positions"] == snap["lens"] - snap["start"]).all()
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
                    read = snap["read"][li][b, g, s0 : L + 1]
                    K = torch.cat([snap["k"][li][b, g, s0:L], k[b, g]], 0)[read]
                    V = torch.cat([snap["v"][li][b, g, s0:L], v[b, g]], 0)[read]
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
    return ScoreInputs(
        keys=keys,
        region=slice(0, L),
        valid=torch.ones(1, L, dtype=torch.bool),
        queries=queries,
        positions=torch.arange(L)[None, None].expand(1, hkv, L),
        attn_acc=acc,
    )


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


def case_none():
    # the dense cache is never due, however long the region, and never asked to choose
    c = get_compressor("none", budget=2, step_length=1, trigger="newline")
    lens = torch.tensor([0, 3, 10_000])
    assert not c.due(lens, torch.ones(3, dtype=torch.bool)).any()
    assert not c.needs_newlines and not c.needs_queries and not c.needs_attention
    with pytest.raises(RuntimeError, match="never compresses"):
        c.select(_inputs(), 5)
    return c, None, None, None


def case_blocktopk():
    # 7 pages of 16 equal keys; 5 pages read: pages 0, 5, 6 always, and the 2 best of 1..4 by the max
    # over the GQA group of q_i · mean key. Query heads point at dims 0 and 1; page 2 (dim 0) and page 3
    # (dim 1, 0.9) win by the max, page 1 (both dims, 0.6 each) would win by the sum
    from sparserl.rollout.kv.blocktopk import choose_pages, page_scores

    c = get_compressor("blocktopk", pages=5)
    mean = torch.zeros(7, 4)
    mean[1, :2] = 0.6
    mean[2, 0], mean[3, 1], mean[4, 2] = 1.0, 0.9, 1.0
    q = torch.zeros(1, 2, 1, 4)
    q[0, 0, 0, 0] = q[0, 1, 0, 1] = 4.0
    n = torch.tensor([112])
    pages = choose_pages(page_scores(q, mean[None, None] * 16, n), n, c.pages_for(n))
    assert pages[0, 0].tolist() == [0, 2, 3, 5, 6]
    assert not c.due(torch.tensor([10_000])).any() and c.capacity(7, 5) == 12 and not c.evicts
    with pytest.raises(RuntimeError, match="never evicts"):
        c.select(_inputs(), 5)
    return c, None, None, None


HAND_CASES = {
    "streaming": case_streaming,
    "h2o": case_h2o,
    "snapkv": case_snapkv,
    "rkv": case_rkv,
    "none": case_none,
    "blocktopk": case_blocktopk,
}


@pytest.mark.parametrize("name", ALL)
def test_hand_built_case_keeps_the_right_tokens(name):
    assert name in HAND_CASES, f"add a hand-built case for compressor {name!r}"
    comp, inp, keep, expected = HAND_CASES[name]()
    if not comp.evicts:  # its case checked itself
        return
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
    out = RolloutEngine(tiny, comp).generate(
        [long_prompt, "short"], SamplingParams(n=1, max_new_tokens=12, seed=0, ignore_eos=True)
    )
    assert max(out.kv_tokens_kept) <= 10 + 4
    assert out.kv.bytes_peak == 2 * RolloutEngine(tiny, DENSE).model.kv_bytes_per_token() * (10 + 4)


def test_newline_trigger(tiny):
    comp = make("rkv", budget=12, step=20, trigger="newline")
    eng = RolloutEngine(tiny, comp)
    eng._newline_ids = torch.ones(len(tiny.tokenizer), dtype=torch.bool, device=eng.device)  # every token: a newline
    out = eng.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=30, seed=0, ignore_eos=True))
    P = len(out.prompt_ids[0])
    assert all(k <= P + 12 + 1 for k in out.kv_tokens_kept)  # compressed right after passing the budget
    assert out.kv.compressions >= 10


# ---- buffer capacity: one rule, on the compressor, used by the engine ---------------------------
@pytest.mark.parametrize("compress_prompt", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_capacity_rule(name, compress_prompt):
    B, step = 16, 8
    c = make(name, B, step, compress_prompt=compress_prompt)
    for P, max_new in [(5, 3), (5, 30), (40, 3), (40, 100)]:
        if not c.evicts:
            expect = P + max_new
        elif compress_prompt:
            expect = min(B + step, P + max_new)
        else:
            expect = P + min(max_new, B + step)
        assert c.capacity(P, max_new) == expect
        assert c.capacity(P, max_new) <= DENSE.capacity(P, max_new) == P + max_new


@pytest.mark.parametrize("extra", [-1, 0, 1])
@pytest.mark.parametrize("name", EVICTING)
def test_a_compressible_prompt_of_the_buffers_size_leaves_room(tiny, name, extra):
    """A compressible prompt of budget + step length tokens (the whole buffer) is compressed at prefill:
    the first response token has a slot (it used to be written one past the buffer's end)."""
    comp = make(name, budget=10, step=2, compress_prompt=True, **({"window": 4} if name == "rkv" else {}))
    eng = RolloutEngine(tiny, comp)
    ids = eng.encode("What is 3 + 5? " * 4)[: comp.capacity(10**6, 10**6) + extra]
    out = eng.generate(None, SamplingParams(n=2, max_new_tokens=7, seed=0, ignore_eos=True), prompt_ids=[ids])
    assert [len(r) for r in out.response_ids] == [7, 7] and max(out.kv_tokens_kept) <= 10 + 2
    assert out.kv.compressions >= 1


@pytest.mark.parametrize("compress_prompt", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_engine_buffers_follow_the_capacity_rule(tiny, name, compress_prompt):
    comp = make(name, budget=10, step=4, compress_prompt=compress_prompt)
    eng = RolloutEngine(tiny, comp)
    caps = []
    eng.step_hook = lambda ev, cache=None, **kw: caps.append(cache.capacity) if ev == "before_decode" else None
    prompts = [" ".join(["word"] * 30), "short"]
    out = eng.generate(prompts, SamplingParams(n=1, max_new_tokens=9, seed=0, ignore_eos=True))
    P = max(len(p) for p in out.prompt_ids)
    assert set(caps) == {comp.capacity(P, 9)}
    per_tok = eng.model.kv_bytes_per_token()
    assert out.kv.bytes_peak == 2 * per_tok * comp.capacity(P, 9)
    # what the dense engine allocates for the same batch: the same rule, for `none`
    assert out.kv.bytes_dense_alloc == 2 * per_tok * DENSE.capacity(P, 9) == 2 * per_tok * (P + 9)
    assert (
        out.kv.bytes_dense_alloc
        == RolloutEngine(tiny, DENSE)
        .generate(prompts, SamplingParams(n=1, max_new_tokens=9, seed=0, ignore_eos=True))
        .kv.bytes_peak
    )


# ---- the one builder ---------------------------------------------------------------------------
def test_builder_maps_common_and_method_options():
    c = build_compressor(
        "rkv",
        kv_budget=24,
        trigger="newline",
        step_length=5,
        window=3,
        compress_prompt=True,
        options={"lam": 0.3, "kernel": 3},
    )
    assert (c.budget, c.trigger, c.step_length, c.window, c.compress_prompt, c.lam, c.kernel) == (
        24,
        "newline",
        5,
        3,
        True,
        0.3,
        3,
    )
    assert build_compressor("rkv", kv_budget=24, options='{"lam": 0.2}').lam == 0.2  # JSON, as a CLI gives it
    assert build_compressor("snapkv", kv_budget=64).window == 32  # left out: the method's default
    dense = build_compressor("none", kv_budget=4, window=8)  # common options are ignored by dense
    assert not dense.compresses and dense.capacity(7, 5) == 12


def test_builder_rejects_unknown_option_with_hint():
    with pytest.raises(
        CompressorOptionError,
        match=r"compressor 'rkv': unknown option 'lamda' "
        r"\(did you mean 'lam'\?\); valid options: .*kernel.*lam",
    ) as e:
        build_compressor("rkv", kv_budget=16, options={"lamda": 0.1})
    assert isinstance(e.value, SparserlError) and isinstance(e.value, ValueError)
    with pytest.raises(CompressorOptionError, match="'sinks'"):
        build_compressor("h2o", kv_budget=16, options={"sinks": 2})
    with pytest.raises(CompressorOptionError, match="'none'.*unknown option 'lam'"):
        build_compressor("none", options={"lam": 0.1})
    with pytest.raises(CompressorOptionError, match="not valid JSON"):
        build_compressor("rkv", options="{lam: 0.1}")
    with pytest.raises(CompressorOptionError, match="observation window"):
        build_compressor("rkv", kv_budget=8, window=8)
    with pytest.raises(CompressorOptionError, match="streaming.*sinks"):
        build_compressor("streaming", kv_budget=8, options={"sinks": 9})
    with pytest.raises(UnknownNameError, match=r"unknown compressor 'rkvv' \(did you mean 'rkv'\?\)"):
        build_compressor("rkvv")


def test_compressor_from_fields_reads_config_and_command_options():
    from types import SimpleNamespace

    rollout = SimpleNamespace(
        compressor="streaming",
        kv_budget=20,
        trigger="step_length",
        step_length=6,
        window=2,
        compress_prompt=False,
        compressor_options={"sinks": 3},
    )
    c = compressor_from_fields(rollout)
    assert (c.name, c.budget, c.step_length, c.window, c.sinks) == ("streaming", 20, 6, 2, 3)
    # a name override (eval.compressor) keeps the common fields, and method options must fit it
    with pytest.raises(CompressorOptionError, match="'h2o'.*'sinks'"):
        compressor_from_fields(rollout, name="h2o")
    # parsed command options: no compress_prompt, window left out, options as a JSON string
    args = SimpleNamespace(
        compressor="rkv",
        kv_budget=12,
        step_length=4,
        trigger="step_length",
        window=None,
        compressor_options='{"lam": 0.5}',
    )
    c = compressor_from_fields(args)
    assert (c.name, c.budget, c.window, c.lam, c.compress_prompt) == ("rkv", 12, 8, 0.5, False)


# ---- the skip rule: no compression that frees slots no later token uses --------------------------
@pytest.mark.parametrize("trigger", ["step_length", "newline"])
def test_skip_rule_after_the_last_write(trigger):
    c = get_compressor("rkv", budget=16, step_length=8, trigger=trigger)
    full = torch.tensor([24, 24, 20])  # two rows fill budget + step_length, one does not
    nl = torch.tensor([False, False, True])
    due = c.due(full, nl)
    assert due.tolist() == [True, True, trigger == "newline"]
    assert torch.equal(c.due(full, nl, remaining=1), due)  # a token follows: compress as before
    assert not c.due(full, nl, remaining=0).any()  # nothing follows: skipped
    assert not get_compressor("none").due(full, nl, remaining=5).any()


@pytest.mark.parametrize("trigger", ["step_length", "newline"])
def test_tail_slack_skips_when_the_rest_fits(trigger):
    c = get_compressor("rkv", budget=16, step_length=8, trigger=trigger, tail_slack=5)
    full = torch.tensor([24, 24, 20])
    nl = torch.tensor([False, False, True])
    due = c.due(full, nl)
    assert torch.equal(c.due(full, nl, remaining=6), due)  # 6 tokens do not fit in 5 spare slots
    assert not c.due(full, nl, remaining=5).any()  # they fit: skipped
    assert not c.due(full + 4, nl, remaining=1).any()  # a skipped sequence stays skipped to the end


@pytest.mark.parametrize("compress_prompt", [False, True])
def test_tail_slack_widens_the_buffer_by_itself(compress_prompt):
    plain = get_compressor("rkv", budget=16, step_length=8, compress_prompt=compress_prompt)
    slack = get_compressor("rkv", budget=16, step_length=8, compress_prompt=compress_prompt, tail_slack=5)
    for prompt_len, max_new in ((10, 100), (10, 12), (40, 3)):
        dense = get_compressor("none").capacity(prompt_len, max_new)
        assert slack.capacity(prompt_len, max_new) == min(dense, plain.capacity(prompt_len, max_new) + 5)


def test_tail_slack_must_not_be_negative():
    with pytest.raises(CompressorOptionError, match="tail_slack"):
        get_compressor("rkv", budget=16, step_length=8, tail_slack=-1)


@pytest.mark.parametrize("name", EVICTING)
def test_tail_slack_in_the_engine(tiny, name):
    """A compression due with 8 tokens left is skipped with 8 spare slots: one fewer compression,
    the region within budget + step + slack, and the tokens up to that point the same as without
    the slack (the same seed, the same cache until then)."""
    B, step, slack = 16, 8, 8
    params = SamplingParams(n=2, max_new_tokens=41, seed=0, ignore_eos=True)
    outs, peaks = [], []
    for tail in (0, slack):
        eng = RolloutEngine(tiny, make(name, B, step, tail_slack=tail), dtype=torch.float32)
        regions = []
        eng.step_hook = lambda ev, cache=None, **kw: (
            regions.append(int(cache.region_len().max())) if ev == "after_decode" else None
        )
        outs.append(eng.generate(PROMPTS[:1], params))
        peaks.append(max(regions))
    # the region reaches 24 three times (decodes t = 23, 31, 39): 16, 8 and 0 tokens left. Without
    # slack the first two compress (the last is skipped: nothing follows); with 8 spare slots the
    # second is skipped too and the region grows to 32
    assert (outs[0].kv.compressions, outs[1].kv.compressions) == (2, 1)
    assert peaks == [B + step, B + step + slack]
    assert [r[:33] for r in outs[1].response_ids] == [r[:33] for r in outs[0].response_ids]


def test_skip_rule_in_the_engine_keeps_the_memory_promise(tiny):
    """With the period ending exactly at the last decode step, that compression is skipped: one
    fewer than the period count, the same tokens, and the region never exceeds budget + step."""
    B, step = 16, 8
    comp = make("rkv", B, step)
    eng = RolloutEngine(tiny, comp)
    regions = []
    eng.step_hook = lambda ev, cache=None, **kw: (
        regions.append(int(cache.region_len().max())) if ev == "after_decode" else None
    )
    # region = t + 1 after decoding token t; decodes run for t < max_new - 1; due at 24, 32, 40
    out = eng.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=41, seed=0, ignore_eos=True))
    assert out.kv.compressions == 2  # at 24 and 32; the one at 40 (last decode) is skipped
    assert max(regions) <= B + step
    assert all(k <= len(p) + B + step for k, p in zip(out.kv_tokens_kept, out.prompt_ids))
