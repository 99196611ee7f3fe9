"""The quantized KV cache (``rollout.kv_quant``: int8 / fp8 codes + one float32 scale per [token, KV
head]): round-trip bounds, real one-byte storage and byte accounting, attention over exactly the
dequantized kept keys for every compressor, scales that travel with their tokens through evictions
and batch shrinks, log-probs close to the float32 cache's (teacher-forced), the compiled step, errors."""

import math

import pytest
import torch

from sparserl.bench.mismatch import stepwise_logprobs
from sparserl.errors import SparserlError
from sparserl.rollout.cache import CompressedKVCache
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, get_compressor
from sparserl.rollout.kv_quant import available_kv_quants, get_kv_quantizer, kv_bytes_per_token
from sparserl.rollout.sampling import SamplingParams

QUANTS = ["int8", "fp8"]
PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name):
    if name == "blocktopk":  # 3 pages of 16 tokens read in the tiny model's layer 1 (its own kernel, blocktopk.c)
        return get_compressor(name, budget=48, dense_layers=1)
    return get_compressor(name, budget=12, step_length=6, **({"window": 4} if name == "snapkv" else {}))


def vectors(seed=0, shape=(3, 2, 40, 64)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g).mul(8)
    x[0, 0, 0] = 0.0  # an all-zero vector
    x[0, 0, 1, :5] = torch.tensor([1e-6, -3e-4, 2.0, 448.0 * 3, -1e3])  # a wide range inside one vector
    return x


def bound(name, x, scale):
    """The per-element error bound of the docstring of sparserl.rollout.kv_quant."""
    s = scale[..., None]
    if name == "int8":
        return s / 2
    return torch.maximum(x.abs() / 16, s * 2.0**-10)


# ---- the quantizers -----------------------------------------------------------------------------
def test_registry_names():
    assert available_kv_quants() == ["fp8", "int8", "none"]
    assert not get_kv_quantizer("none").quantized


@pytest.mark.parametrize("name", QUANTS)
def test_round_trip_bound(name):
    q = get_kv_quantizer(name)
    x = vectors()
    codes, scale = q.quantize(x)
    assert codes.dtype == q.storage and codes.element_size() == 1 and codes.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == x.shape[:-1]
    assert torch.allclose(scale, x.abs().amax(-1) / q.qmax)  # symmetric, one scale per vector
    back = q.dequantize(codes, scale)
    err = (x - back).abs()
    assert (err <= bound(name, x, scale) * (1 + 1e-6) + 1e-30).all()
    assert (back[0, 0, 0] == 0).all()
    if name == "int8":
        assert int(codes.abs().amax(-1)[1:].min()) == 127  # every non-zero vector uses the full range


def test_fp8_widen_is_exact():
    """The CPU bit-arithmetic widening equals torch's own float8 → float32 conversion on every code."""
    q = get_kv_quantizer("fp8")
    all_codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~all_codes.float().isnan()
    values, unit = q.widen(all_codes, torch.float32)
    assert torch.equal((values * unit)[finite], all_codes.float()[finite])


# ---- the cache: storage, bytes, moves -------------------------------------------------------------
def _cache(kv_quant, compressor="none", B=3, P=10, layers=2, hkv=2, D=64, capacity=30):
    g = torch.Generator().manual_seed(1)
    keys = [torch.randn(B, hkv, P, D, generator=g) for _ in range(layers)]
    values = [torch.randn(B, hkv, P, D, generator=g) for _ in range(layers)]
    valid = torch.ones(B, P, dtype=torch.bool)
    valid[0, :3] = False
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    c = CompressedKVCache(
        keys, values, valid, positions, capacity, get_compressor(compressor), n_heads=2 * hkv, kv_quant=kv_quant
    )
    return c, keys, values


@pytest.mark.parametrize("name", QUANTS)
def test_one_byte_storage_and_bytes(name):
    c, keys, _ = _cache(name)
    f, _, _ = _cache("none")
    assert c.keys.dtype == c.values.dtype == get_kv_quantizer(name).storage
    assert c.keys.element_size() == c.values.element_size() == 1
    assert c.k_scale.dtype == c.v_scale.dtype == torch.float32 and c.k_scale.shape == c.keys.shape[:-1]
    # head_dim 64: 64 code bytes + 4 scale bytes per vector instead of 256
    assert c.bytes_per_token() == kv_bytes_per_token(2, 2, 64, torch.float32, name) == 2 * 2 * 2 * 68
    assert c.bytes_allocated() == f.bytes_allocated() * 68 // 256 <= 0.3 * f.bytes_allocated()
    assert c.bytes_valid() == f.bytes_valid() * 68 // 256
    K, _ = c.dequantized(1, 10)
    assert ((K - keys[1]).abs() <= bound(name, keys[1], c.k_scale[1, :, :, :10]) * (1 + 1e-6)).all()


@pytest.mark.parametrize("name", QUANTS)
def test_batch_shrink_moves_scales(name):
    c, _, _ = _cache(name)
    before = [c.dequantized(layer) for layer in range(2)]
    rows = torch.tensor([2, 0])
    c.select(rows)
    assert c.keys.dtype == get_kv_quantizer(name).storage
    for layer in range(2):
        K, V = c.dequantized(layer)
        assert torch.equal(K, before[layer][0][rows]) and torch.equal(V, before[layer][1][rows])


@pytest.mark.parametrize("name", QUANTS)
def test_engine_kv_bytes(tiny, name):
    """Reported bytes: the float32 figures × (head_dim + 4) / (4 head_dim) (tiny: head_dim 16)."""
    D = tiny.model.config.head_dim
    p = SamplingParams(n=2, max_new_tokens=20, seed=0, ignore_eos=True)
    ref = RolloutEngine(tiny, make("rkv")).generate(PROMPTS, p)
    out = RolloutEngine(tiny, make("rkv"), kv_quant=name).generate(PROMPTS, p)
    assert out.kv.bytes_peak * 4 * D == ref.kv.bytes_peak * (D + 4)
    assert out.kv.bytes_theory * 4 * D == ref.kv.bytes_theory * (D + 4)
    assert out.kv.bytes_dense_alloc == ref.kv.bytes_dense_alloc  # the float dense engine, the reference


# ---- attention over the dequantized kept keys, for every compressor -------------------------------
def _layer0_kv(eng, ids):
    """Layer-0 keys / values of a token sequence at positions 0.. [Hkv, T, D] (they depend on the
    token and its position only: no attention below them)."""
    m = eng.model
    ids = torch.tensor(ids, device=m.embed.device)[None]
    h = torch.nn.functional.embedding(ids, m.embed)
    cos, sin = m.rope(torch.arange(ids.shape[1], device=ids.device)[None])
    _, k, v = m.qkv(m.layers[0], h, cos, sin)
    return k[0], v[0]


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("name", available_compressors())
def test_attention_over_dequantized_kept_keys(tiny, name, quant):
    """After compressions, the next decode step equals float32 attention (transformers' own modules)
    over exactly the dequantized kept keys/values (those each layer read: ``cache.attended``), the new
    token's included; and at the end every kept slot's codes and scales belong to the token at its
    stored position (layer 0, recomputed)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny.model
    comp = make(name)
    eng = RolloutEngine(tiny, comp, kv_quant=quant)
    snap, last = {}, {}

    def hook(event, t, cache, **kw):
        ready = cache.n_compressions > 0 if comp.evicts else t >= 20
        if event == "before_decode" and ready and "tokens" not in snap:
            snap.update(tokens=kw["tokens"].clone(), positions=kw["positions"].clone())
        elif event == "after_decode":
            if "tokens" in snap and "logits" not in snap:
                L = cache.max_len  # the new token is written (quantized) and attended
                snap.update(
                    logits=kw["logits"].clone(),
                    start=cache.start.clone(),
                    lens=cache.lens.clone(),
                    kv=[tuple(x.clone() for x in cache.dequantized(li, L)) for li in range(cache.n_layers)],
                    read=[cache.attended(li) for li in range(cache.n_layers)],
                )
            last.update(
                pos=cache.pos[0].clone(),
                start=cache.start.clone(),
                lens=cache.lens.clone(),
                kv=cache.dequantized(0),
                scales=(cache.k_scale[0].clone(), cache.v_scale[0].clone()),
            )

    eng.step_hook = hook
    out = eng.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=40, seed=2, ignore_eos=True))
    assert "logits" in snap
    B = snap["tokens"].shape[0]
    cfg = model.config
    hq, hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    with torch.no_grad():
        h = model.model.embed_tokens(snap["tokens"])[:, None]
        pos = snap["positions"][:, None]
        cos, sin = model.model.rotary_emb(h, pos)
        for li, layer in enumerate(model.model.layers):
            x = layer.input_layernorm(h)
            at = layer.self_attn
            q = at.q_proj(x).view(B, 1, hq, D).transpose(1, 2)
            k = at.k_proj(x).view(B, 1, hkv, D).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            Kq, Vq = snap["kv"][li]
            outs = []
            for b in range(B):
                s0, L = int(snap["start"][b]), int(snap["lens"][b])
                new_k = Kq[b, :, L - 1]  # the step's own key, as stored
                assert (new_k - k[b, :, 0]).abs().max() <= k[b, :, 0].abs().max() / 8
                heads = []
                for hh in range(hq):
                    g = hh // (hq // hkv)
                    read = snap["read"][li][b, g, s0:L]
                    a = torch.softmax(q[b, hh] @ Kq[b, g, s0:L][read].T / math.sqrt(D), -1)
                    heads.append(a @ Vq[b, g, s0:L][read])
                outs.append(torch.cat(heads, -1))
            h = h + at.o_proj(torch.stack(outs))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        ref = model.lm_head(model.model.norm(h))[:, 0].float()
    assert torch.allclose(ref, snap["logits"], atol=1e-4)

    # the kept scales belong to the kept tokens (after every compression and the final step)
    qz = get_kv_quantizer(quant)
    K, V = last["kv"]
    ks, vs = last["scales"]
    for b in range(B):
        seq = out.prompt_ids[b] + out.response_ids[b]
        k_true, v_true = _layer0_kv(eng, seq)
        s0, L = int(last["start"][b]), int(last["lens"][b])
        for g in range(hkv):
            p = last["pos"][b, g, s0:L].long()
            for got, scale, true in ((K, ks, k_true), (V, vs, v_true)):
                t = true[g, p]
                assert torch.allclose(scale[b, g, s0:L], t.abs().amax(-1) / qz.qmax, rtol=1e-4)
                assert ((got[b, g, s0:L] - t).abs() <= bound(quant, t, scale[b, g, s0:L]) * 1.01 + 1e-5).all()


# ---- log-probs against the float32 cache, teacher-forced ------------------------------------------
def teacher_forced_logprobs(engine, prompts, params, tokens=None):
    """(tokens [B, T], log-softmax of every step's logits [B, T, V]), ``tokens`` fed when given
    (:func:`sparserl.bench.mismatch.stepwise_logprobs`)."""
    out, steps = stepwise_logprobs(engine, prompts, params, tokens)
    return torch.tensor(out.response_ids, device=steps.device), steps


#: the largest gap between the quantized cache's teacher-forced log-probs and the float32 cache's, on the
#: peaked model (measured over every compressor: int8 0.011-0.014, fp8 0.06-0.10; the float32 cache with its
#: logits scaled by 0.7: 3.9)
KV_LOGPROB_ATOL = {"int8": 0.05, "fp8": 0.2}


@pytest.mark.parametrize("quant", [*QUANTS, "logits_x0.7"])
@pytest.mark.parametrize("name", available_compressors())
def test_logprobs_close_to_float_cache(peaked, name, quant):
    """On the peaked model (on the tiny model's nearly uniform distributions logits scaled by 0.7 move the
    log-probs by 0.12-0.15 only). ``logits_x0.7``: the float32 cache's own log-softmax of 0.7 z, the
    negative case, exceeds the loosest bound."""
    p = SamplingParams(n=2, max_new_tokens=30, seed=3, ignore_eos=True)
    ref_tokens, ref = teacher_forced_logprobs(RolloutEngine(peaked, make(name)), PROMPTS, p)
    if quant == "logits_x0.7":
        got = torch.log_softmax(0.7 * ref, -1)  # log_softmax(0.7 log_softmax(z)) = log_softmax(0.7 z)
    else:
        _, got = teacher_forced_logprobs(RolloutEngine(peaked, make(name), kv_quant=quant), PROMPTS, p, ref_tokens)
    nxt = ref_tokens[:, 1:, None]  # the token each step's logits scored
    diff = (ref.gather(-1, nxt) - got.gather(-1, nxt)).abs()
    if quant == "logits_x0.7":
        assert diff.max() > max(KV_LOGPROB_ATOL.values())
        return
    assert diff.max() <= KV_LOGPROB_ATOL[quant]
    assert diff.max() > 0  # really quantized


@pytest.mark.parametrize("quant", QUANTS)
def test_compiled_step_with_quantized_kv(tiny, quant):
    """The compiled decode step (aot_eager capture) quantizes on write like the eager one: on the eager
    run's tokens (replayed, so that a draw landing within float rounding of a token boundary cannot pick
    another token) the log-probs agree within 1e-4 and the bytes are the same; rows leave the batch along
    the way."""
    p = SamplingParams(n=3, max_new_tokens=30, seed=7, temperature=1.0)
    eager = RolloutEngine(tiny, make("rkv"), kv_quant=quant)
    compiled = RolloutEngine(tiny, make("rkv"), kv_quant=quant, compile="aot_eager")
    eager.eos_ids = compiled.eos_ids = set(range(0, len(tiny.tokenizer), 40))
    a = eager.generate(PROMPTS, p)
    b = compiled.generate(PROMPTS, p, forced=a.response_ids)
    assert a.response_ids == b.response_ids and "stop" in a.finish_reason
    assert len({len(r) for r in a.response_ids}) > 1  # rows ended at different steps
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert (torch.tensor(x) - torch.tensor(y)).abs().max().item() <= 1e-4
    assert (a.kv.bytes_peak, a.kv.compressions) == (b.kv.bytes_peak, b.kv.compressions)


# ---- errors ---------------------------------------------------------------------------------------
def test_unknown_name_is_a_clear_error(tiny):
    with pytest.raises(
        SparserlError, match=r"rollout\.kv_quant 'int9' \(did you mean 'int8'\?\); available: fp8, int8, none"
    ):
        RolloutEngine(tiny, make("none"), kv_quant="int9")
    with pytest.raises(ValueError, match="fp8"):
        _cache("fp16")
