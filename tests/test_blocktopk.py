"""Block top-k sparse attention (``blocktopk``: Sparrow's Vortex engine, :mod:`sparserl.rollout.kv.blocktopk`):
the page choice on hand-built pages; attention equal to dense attention over exactly the chosen pages, on
the C kernel and on the torch path, neither reading any other row; dense when k covers every page; the
page sums kept up to date; layers 0 and 1 dense; the replay's log-probs; a schedule's k by length;
honest KV statistics; bad inputs. The shared matrix (tests/test_kv_compressors.py and the others that
parametrize over every compressor) runs it too."""

from __future__ import annotations

import math

import pytest
import torch

from sparserl.config import ConfigError, load_config, validate
from sparserl.mismatch.replay import replay
from sparserl.rollout import native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import CompressorOptionError, build_compressor, compressor_from_fields, get_compressor
from sparserl.rollout.kv.blocktopk import PAGE_TOKENS, choose_pages, page_scores
from sparserl.rollout.page_attention import gathered_attention
from sparserl.rollout.sampling import SamplingParams

PROMPTS = [[{"role": "user", "content": "Count from one to twenty, slowly please."}], "a b c"]
needs_native = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path runs everywhere")


@pytest.fixture(scope="module")
def tiny4(tiny):
    """The tiny model's family with 4 layers: layers 2 and 3 sparse under Sparrow's dense_layers=2."""
    from sparserl.models.loading import load_tiny

    return load_tiny(seed=0, num_layers=4)


# ---- references -----------------------------------------------------------------------------------
def reference_sums(K: torch.Tensor, start: torch.Tensor, lens: torch.Tensor, n_pages: int) -> torch.Tensor:
    """S_j = sum of the keys of page j (16 tokens from each row's first slot), one row and head at a time."""
    B, hkv, _, D = K.shape
    sums = torch.zeros(B, hkv, n_pages, D)
    for b in range(B):
        for s in range(int(start[b]), int(lens[b])):
            sums[b, :, (s - int(start[b])) // PAGE_TOKENS] += K[b, :, s]
    return sums


def attention_over(q, K, V, pages, start, lens):
    """softmax(q Kᵀ/√d) V over exactly the slots of ``pages`` [B, Hkv, k] (-1: none), in float64."""
    B, hq, _, D = q.shape
    hkv = K.shape[1]
    g = hq // hkv
    out = torch.zeros(B, hq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(hkv):
            slots = [
                s
                for j in pages[b, h].tolist()
                if j >= 0
                for s in range(
                    int(start[b]) + j * PAGE_TOKENS, min(int(start[b]) + (j + 1) * PAGE_TOKENS, int(lens[b]))
                )
            ]
            Ks, Vs = K[b, h, slots].double(), V[b, h, slots].double()
            for i in range(h * g, (h + 1) * g):
                out[b, i] = torch.softmax(q[b, i, 0].double() @ Ks.T / math.sqrt(D), -1) @ Vs
    return out.reshape(B, hq * D).float()


def torch_path(q, K, V, sums, start, lens, k_pages):
    """The torch path: page scores, the choice, a gather of the chosen pages and attention over them."""
    n_tokens = lens - start
    with native.torch_only():
        pages = choose_pages(page_scores(q, sums, n_tokens), n_tokens, k_pages)
        return gathered_attention(q, K, V, pages, start, lens, PAGE_TOKENS), pages


def native_path(q, K, V, sums, start, lens, k_pages, width=None, lib=None):
    chosen = torch.empty(K.shape[0], K.shape[1], width or int(k_pages.max()), dtype=torch.int32)
    out = native.blocktopk_attention(
        q, K, V, sums, start, lens, k_pages.to(torch.int32), PAGE_TOKENS, 1, 2, update=False, chosen=chosen, lib=lib
    )
    assert out is not None
    return out, chosen


# ---- the choice -----------------------------------------------------------------------------------
def hand_built(means: torch.Tensor, q_dims=(0, 1)):
    """One row, one KV head with 2 query heads pointing at ``q_dims``; page j's 16 keys all equal means[j]."""
    n, D = means.shape
    K = means.repeat_interleave(PAGE_TOKENS, 0)[None, None].contiguous()  # [1, 1, n * 16, D]
    V = torch.randn(K.shape, generator=torch.Generator().manual_seed(0))
    q = torch.zeros(1, 2, 1, D)
    for i, d in enumerate(q_dims):
        q[0, i, 0, d] = 4.0
    start, lens = torch.tensor([0]), torch.tensor([n * PAGE_TOKENS])
    return q, K, V, reference_sums(K, start, lens, n), start, lens


@pytest.mark.parametrize("path", ["torch", pytest.param("native", marks=needs_native)])
def test_hand_built_page_choice(path):
    """7 pages, 5 read: pages 0, 5, 6 always, and of 1..4 the two best by max over the GQA group of
    q_i · mean key. Page 2 (head 0's direction) and page 3 (head 1's, 0.9) win by the max; page 1
    (0.6 in both directions) would win by the sum; page 4 is orthogonal to both heads."""
    means = torch.zeros(7, 8)
    means[1, :2] = 0.6
    means[2, 0], means[3, 1], means[4, 2] = 1.0, 0.9, 1.0
    means[[0, 5, 6], 3] = -5.0  # the always-read pages score worst: kept anyway
    q, K, V, sums, start, lens = hand_built(means)
    run = torch_path if path == "torch" else native_path
    out, pages = run(q, K, V, sums, start, lens, torch.tensor([5]))
    assert pages[0, 0].tolist() == [0, 2, 3, 5, 6]
    torch.testing.assert_close(out, attention_over(q, K, V, pages, start, lens), atol=1e-5, rtol=1e-5)
    # a tie between pages 2 and 3 (the best) goes to the later page
    means[3] = means[2]
    q, K, V, sums, start, lens = hand_built(means)
    assert run(q, K, V, sums, start, lens, torch.tensor([4]))[1][0, 0].tolist() == [0, 3, 5, 6]
    # reading as many pages as there are: all of them
    assert run(q, K, V, sums, start, lens, torch.tensor([7]))[1][0, 0].tolist() == list(range(7))


def random_case(seed=0, hq=6, hkv=2, D=64, cap=100):
    """Rows with left padding and lengths of 7, 6 and 3 pages (the last partial), random q, K, V."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(3, 1, hq + 2 * hkv, D, generator=gen)
    q = qkv[..., :hq, :].transpose(-2, -3)  # [B, Hq, 1, D] strided, as the decode step makes it
    K = torch.randn(2, 3, hkv, cap, D, generator=gen)[1]  # a layer's view of a cache buffer
    V = torch.randn(2, 3, hkv, cap, D, generator=gen)[1]
    start, lens = torch.tensor([0, 5, 17]), torch.tensor([100, 100, 60])
    return q, K, V, reference_sums(K, start, lens, 7), start, lens


@needs_native
@pytest.mark.parametrize("k", [[4, 5, 3], [3, 3, 3], [7, 6, 3]])
def test_attention_is_dense_attention_over_exactly_the_chosen_pages(k):
    """The C kernel and the torch path choose the same pages (per KV head), and their outputs are dense
    attention over exactly those pages' tokens; k = every page reads them all (row 3 always: 3 pages)."""
    q, K, V, sums, start, lens = random_case()
    k_pages = torch.tensor(k)
    out_n, chosen = native_path(q, K, V, sums, start, lens, k_pages)
    out_t, pages = torch_path(q, K, V, sums, start, lens, k_pages)
    assert torch.equal(chosen.long(), pages)
    n_pages = ((lens - start + 15) // 16).tolist()
    for b in range(3):
        read = pages[b, :, : min(n_pages[b], k[b])]
        assert (read >= 0).all() and (pages[b, :, min(n_pages[b], k[b]) :] == -1).all()
        assert (read[:, 0] == 0).all() and (read[:, -2:] == torch.tensor([n_pages[b] - 2, n_pages[b] - 1])).all()
    if k == [4, 5, 3]:
        assert not torch.equal(pages[0, 0], pages[0, 1])  # each KV head its own pages
    ref = attention_over(q, K, V, pages, start, lens)
    torch.testing.assert_close(out_n, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_t, ref, atol=1e-5, rtol=1e-5)
    if k == [7, 6, 3]:  # every page: dense attention (the cache's own kernel)
        from sparserl.rollout.cache import attention

        bias = torch.zeros(3, 100)
        for b in range(3):
            bias[b, : int(start[b])] = bias[b, int(lens[b]) :] = float("-inf")
        dense = attention(q, K, V, bias[:, None, None, :])[0]
        torch.testing.assert_close(out_n, dense, atol=1e-6, rtol=1e-5)


@needs_native
@pytest.mark.parametrize("build", ["portable", "avx2"])
def test_other_builds_choose_and_attend_the_same(build, avx2_build, tmp_path, monkeypatch):
    """The plain C loops (no -march) and a plain AVX2 build: the same pages, the same attention."""
    if build == "portable":
        monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
        lib = native.load(native.build(flags=native.flags_for("")))
    else:
        lib = avx2_build
    for D in (64, 24):  # the vector paths, and a head size they leave to the loops
        q, K, V, sums, start, lens = random_case(seed=2, D=D)
        k_pages = torch.tensor([4, 5, 3])
        out, chosen = native_path(q, K, V, sums, start, lens, k_pages)
        out_b, chosen_b = native_path(q, K, V, sums, start, lens, k_pages, lib=lib)
        assert torch.equal(chosen, chosen_b)
        torch.testing.assert_close(out_b, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out_b, attention_over(q, K, V, chosen_b, start, lens), atol=1e-5, rtol=1e-5)


@needs_native
def test_only_the_chosen_pages_are_read():
    """NaN in every K and V row of the pages not chosen changes nothing: neither path reads them (the
    scores read the page sums only)."""
    q, K, V, sums, start, lens = random_case(seed=1)
    k_pages = torch.tensor([4, 3, 3])
    out_n, chosen = native_path(q, K, V, sums, start, lens, k_pages)
    out_t, pages = torch_path(q, K, V, sums, start, lens, k_pages)
    K2, V2 = K.clone(), V.clone()
    for b in range(3):
        for h in range(K.shape[1]):
            for j in set(range(7)) - set(pages[b, h].tolist()):
                at = slice(int(start[b]) + j * 16, int(start[b]) + (j + 1) * 16)
                K2[b, h, at] = V2[b, h, at] = float("nan")
    assert K2.isnan().any()
    again_n, chosen2 = native_path(q, K2, V2, sums, start, lens, k_pages)
    again_t, pages2 = torch_path(q, K2, V2, sums, start, lens, k_pages)
    assert torch.equal(chosen, chosen2) and torch.equal(pages, pages2)
    assert torch.equal(again_n, out_n) and torch.equal(again_t, out_t)


# ---- in the engine --------------------------------------------------------------------------------
def same(a, b):
    return a.response_ids == b.response_ids and a.sampler_logprobs == b.sampler_logprobs


def test_k_covering_every_page_is_the_dense_engine(tiny4):
    """Reading as many pages as the longest sequence has: the dense step, to the bit."""
    p = SamplingParams(n=2, max_new_tokens=40, seed=3, ignore_eos=True)
    dense = RolloutEngine(tiny4, get_compressor("none")).generate(PROMPTS, p)
    for comp in (
        get_compressor("blocktopk", budget=80),
        get_compressor("blocktopk", pages=5),
        get_compressor("blocktopk", budget=48, dense_layers=4),
    ):  # 39 + 40 tokens: 5 pages
        assert same(RolloutEngine(tiny4, comp).generate(PROMPTS, p), dense)
    sparse = RolloutEngine(tiny4, get_compressor("blocktopk", budget=48)).generate(PROMPTS, p)
    assert sparse.sampler_logprobs != dense.sampler_logprobs


@pytest.mark.parametrize("kernels", ["torch", pytest.param("native", marks=needs_native)])
def test_layers_0_and_1_dense_and_steps_equal_attention_over_the_read_slots(tiny4, kernels):
    """Sparrow's default (dense_layers=2) on a 4-layer model: layers 0 and 1 read every slot, 2 and 3
    three pages; the step's logits equal transformers' own modules over exactly the slots each layer read;
    the page sums equal the sums of the cached keys after every step."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny4.model
    eng = RolloutEngine(tiny4, get_compressor("blocktopk", budget=48))
    snap, sums_ok = {}, []

    def hook(event, t, cache, **kw):
        if event == "before_decode" and t == 30:
            L = cache.max_len
            snap.update(
                tokens=kw["tokens"].clone(),
                positions=kw["positions"].clone(),
                start=cache.start.clone(),
                lens=cache.lens.clone(),
                k=[x[:, :, :L].clone() for x in cache.k],
                v=[x[:, :, :L].clone() for x in cache.v],
            )
        elif event == "after_decode":
            sel = cache.selector
            if t == 30:
                snap.update(
                    logits=kw["logits"].clone(),
                    read=[cache.attended(li) for li in range(4)],
                    sparse=[sel.sparse(li) for li in range(4)],
                )
            if sel.sums is not None:
                for i in range(sel.n_sparse):
                    ref = reference_sums(cache.k[sel.first_sparse + i], cache.start, cache.lens, sel.max_pages)
                    sums_ok.append(torch.allclose(sel.sums[i], ref, atol=1e-5))

    eng.step_hook = hook
    with native.torch_only() if kernels == "torch" else torch.no_grad():
        eng.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=40, seed=2, ignore_eos=True))
    assert snap["sparse"] == [False, False, True, True]
    assert sums_ok and all(sums_ok)
    B, cfg = snap["tokens"].shape[0], model.config
    hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    valid = snap["read"][0]
    assert torch.equal(snap["read"][1], valid)  # layers 0 and 1: every valid slot
    n = int(valid[0, 0].sum())  # 70 tokens: 5 pages, of which 0, 3 and the partial 4 are read
    assert (snap["read"][2] & ~valid).sum() == 0 and snap["read"][2][0].sum(-1).tolist() == [n - 32] * 2
    with torch.no_grad():
        h = model.model.embed_tokens(snap["tokens"])[:, None]
        cos, sin = model.model.rotary_emb(h, snap["positions"][:, None])
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
                for i in range(hq):
                    g = i // (hq // hkv)
                    read = snap["read"][li][b, g, s0 : L + 1]
                    Ks = torch.cat([snap["k"][li][b, g, s0:L], k[b, g]])[read]
                    Vs = torch.cat([snap["v"][li][b, g, s0:L], v[b, g]])[read]
                    heads.append(torch.softmax(q[b, i] @ Ks.T / math.sqrt(D), -1) @ Vs)
                outs.append(torch.cat(heads, -1))
            h = h + at.o_proj(torch.stack(outs))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        ref = model.lm_head(model.model.norm(h))[:, 0].float()
    torch.testing.assert_close(snap["logits"], ref, atol=1e-4, rtol=1e-4)


@needs_native
def test_native_and_torch_paths_generate_the_same(tiny4):
    """Whole generations with page choices (4 of 5-6 pages) and rows leaving the batch: the same tokens,
    log-probs within 1e-4; the fused step and the eager one to the bit."""
    eng = RolloutEngine(tiny4, get_compressor("blocktopk", budget=64))
    eng.eos_ids = set(range(0, len(tiny4.tokenizer), 40))
    p = SamplingParams(n=3, max_new_tokens=50, seed=5, temperature=1.0)
    fused = eng.generate(PROMPTS, p)
    eng.fused = False
    eager = eng.generate(PROMPTS, p)
    with native.torch_only():
        torch_run = eng.generate(PROMPTS, p)
    assert same(fused, eager)
    assert fused.response_ids == torch_run.response_ids and "stop" in fused.finish_reason
    for a, b in zip(fused.sampler_logprobs, torch_run.sampler_logprobs):
        assert (torch.tensor(a) - torch.tensor(b)).abs().max() <= 1e-4


def test_replay_reproduces_the_sampler(tiny4):
    """The replay (exact α) re-runs block top-k on the sampled tokens: the same pages chosen at every
    step and layer, the same log-probs."""
    eng = RolloutEngine(tiny4, get_compressor("blocktopk", budget=64))
    chosen = []
    eng.step_hook = lambda event, cache=None, **kw: (
        chosen.append(
            None if cache.selector.chosen is None or not cache.selector.reading else cache.selector.chosen.clone()
        )
        if event == "after_decode"
        else None
    )
    p = SamplingParams(n=2, max_new_tokens=48, seed=7, temperature=1.0)
    out = eng.generate(PROMPTS, p)
    first, chosen[:] = list(chosen), []
    again = replay(eng, out.prompt_ids, out.response_ids, p)
    assert again.response_ids == out.response_ids
    for a, b in zip(out.sampler_logprobs, again.sampler_logprobs):
        assert (torch.tensor(a) - torch.tensor(b)).abs().max() <= 1e-5
    assert sum(c is not None for c in first) > 10
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(first, chosen))


def test_schedule_changes_k_with_length(tiny):
    """A schedule's budget at each row's own length: 3 pages under 64 tokens, 4 from 64, 5 from 80."""
    comp = compressor_from_fields(
        load_config(
            "sparse_rl_fixed40",
            [
                "rollout.compressor=blocktopk",
                "rollout.kv_schedule=[[0, 48], [64, 64], [80, 80]]",
                "rollout.compressor_options={dense_layers: 1}",
            ],
        ).rollout
    )
    assert comp.schedule is not None and comp.budget == 80
    eng = RolloutEngine(tiny, comp)
    seen = []

    def hook(event, cache=None, **kw):
        sel = cache.selector
        if event == "after_decode" and sel.reading:
            n = cache.lens - cache.start
            seen.append((n.tolist(), sel.k_pages.tolist(), (sel.chosen[0] >= 0).sum(-1)[:, 0].tolist()))

    eng.step_hook = hook
    eng.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=60, seed=0, ignore_eos=True))
    budget = {3: 0, 4: 64, 5: 80}
    for n_tokens, k, read in seen:
        for n, kb, r in zip(n_tokens, k, read):
            assert kb == (3 if n < 64 else 4 if n < 80 else 5) and n >= budget[kb]
            assert r == min(kb, -(-n // 16))  # pages read: k, or every page of a shorter row
    assert {kb for _, k, _ in seen for kb in k} == {3, 4, 5}
    assert any(len(set(k)) > 1 for _, k, _ in seen)  # rows of different lengths read different k


def test_kv_statistics_are_dense(tiny):
    """Nothing is evicted: the K/V bytes are the dense engine's, and every token stays cached."""
    p = SamplingParams(n=2, max_new_tokens=40, seed=1, ignore_eos=True)
    eng = RolloutEngine(tiny, get_compressor("blocktopk", budget=48, dense_layers=1))
    nbytes = []
    eng.step_hook = lambda event, cache=None, **kw: (
        nbytes.append((cache.selector.nbytes(), cache.keys[1].numel() * 4)) if event == "after_decode" else None
    )
    out = eng.generate(PROMPTS, p)
    dense = RolloutEngine(tiny, get_compressor("none")).generate(PROMPTS, p)
    assert out.kv == dense.kv and out.kv.compressions == 0 and out.kv.bytes_peak == out.kv.bytes_dense_alloc
    assert out.kv_tokens_kept == [len(a) + len(b) - 1 for a, b in zip(out.prompt_ids, out.response_ids)]
    sums, keys = nbytes[-1]  # the page sums of the sparse layer: 1/16 of its keys, beside the KV
    assert sums == pytest.approx(keys / PAGE_TOKENS, rel=0.05)


# ---- bad inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["rollout.kv_budget=40"],
            r"rollout\.kv_budget=40 is not a multiple of 16: block top-k reads whole pages of 16 "
            r"tokens; use 48",
        ),
        (["rollout.kv_budget=72"], r"rollout\.kv_budget=72 is not a multiple of 16.*use 64 or 80"),
        (["rollout.kv_budget=32"], r"rollout\.kv_budget=32 is 2 pages, fewer than the 3 block top-k always reads"),
        (
            ["rollout.blocktopk_pages=2"],
            r"rollout\.blocktopk_pages=2: block top-k reads at least the 3 pages it always "
            r"keeps \(the first and the last 2\); give 3 or more",
        ),
        (["rollout.kv_schedule=[[0, 48], [100, 72]]"], r"rollout\.kv_schedule budget 72 is not a multiple of 16"),
        (
            ["rollout.blocktopk_pages=4", "rollout.kv_schedule=[[0, 48]]"],
            r"rollout\.blocktopk_pages=4 and rollout\.kv_schedule both decide the pages",
        ),
        (["rollout.compile=true"], r"rollout\.compile=true with rollout\.compressor=blocktopk"),
    ],
)
def test_bad_blocktopk_config_is_one_clear_error(overrides, message):
    cfg = load_config("sparse_rl_fixed40", ["rollout.compressor=blocktopk", "rollout.kv_budget=64", *overrides])
    with pytest.raises(ConfigError, match=message) as e:
        validate(cfg)
    assert str(e.value).count("\n  - ") == 1  # one problem, one line


def test_blocktopk_options_with_another_compressor():
    with pytest.raises(
        ConfigError,
        match=r"rollout\.blocktopk_pages=8 is an option of rollout\.compressor=blocktopk, "
        r"not 'rkv'",
    ):
        validate(load_config("sparse_rl_fixed40", ["rollout.blocktopk_pages=8"]))
    with pytest.raises(CompressorOptionError, match="blocktopk_pages=8 is an option of blocktopk only"):
        build_compressor("rkv", blocktopk_pages=8)


def test_pages_win_over_the_budget():
    cfg = validate(
        load_config(
            "sparse_rl_fixed40", ["rollout.compressor=blocktopk", "rollout.kv_budget=50", "rollout.blocktopk_pages=6"]
        )
    )  # kv_budget is not read
    comp = compressor_from_fields(cfg.rollout)
    assert (comp.pages, comp.budget) == (6, 96)
    assert comp.pages_for(torch.tensor([10, 5000])).tolist() == [6, 6]
    assert build_compressor("blocktopk", kv_budget=128).pages_for(torch.tensor([7])).tolist() == [8]


def test_compressor_and_engine_errors(tiny):
    for options, message in [
        ({"budget": 40}, "budget=40 is not a multiple of 16"),
        ({"pages": 2}, "pages=2: block top-k reads at least the 3"),
        ({"schedule": [[0, 48], [64, 20]]}, "schedule budget 20 is not a multiple of 16"),
        ({"dense_layers": -1}, "dense_layers must be an integer >= 0"),
    ]:
        with pytest.raises(CompressorOptionError, match=message):
            get_compressor("blocktopk", **options)
    engine = RolloutEngine(tiny, get_compressor("blocktopk", budget=48), compile="aot_eager")
    with pytest.raises(ValueError, match="cannot choose pages per step"):
        engine.generate(["a b c"], SamplingParams(n=1, max_new_tokens=2))


# ---- bench rows -----------------------------------------------------------------------------------
def test_bench_rows(tiny4, monkeypatch):
    """``sparserl bench rollout --compressors rkv,blocktopk``: a block top-k row beside dense and R-KV,
    its K/V bytes the dense row's, the cost model's prediction on every row it has terms for."""
    from sparserl.bench import rollout
    from sparserl.cost import MachineRates, ModelShape, rollout_cost

    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny4)
    monkeypatch.setattr(rollout, "memory_bandwidth", lambda **kw: 20e9)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=60,
        kv_budget=48,
        step_length=8,
        compressors=["rkv", "blocktopk", "h2o"],
        dtype="float32",
        hf_baseline=False,
    )
    rows = {r["compressor"]: r for r in report["results"]}
    assert set(rows) == {"none", "rkv", "blocktopk", "h2o"}
    top, dense = rows["blocktopk"], rows["none"]
    assert top["kv_bytes_peak"] == dense["kv_bytes_peak"] and top["compressions"] == 0 and top["kv_budget"] == 48
    assert dense["predicted_ratio_vs_dense"] == 1.0 and rows["h2o"]["predicted_ratio_vs_dense"] is None
    m = report["machine"]
    shape, rates = ModelShape.from_config(tiny4.model.config, "float32"), MachineRates.from_machine_info(m)
    P = m["prompt_tokens"]
    expect = (
        rollout_cost(shape, rates, 2, P, 60).seconds
        / rollout_cost(shape, rates, 2, P, 60, blocktopk_pages=3, dense_layers=2).seconds
    )
    assert top["predicted_ratio_vs_dense"] == pytest.approx(expect) and expect > 1
    assert rows["rkv"]["predicted_ratio_vs_dense"] > 0  # R-KV's side of 1 depends on the measured GEMM rate
