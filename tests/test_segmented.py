"""A rollout sampled in segments with weights loaded between them (``sparserl.rollout.segmented``, the engine's
side of partial rollouts): the same weights throughout sample exactly what one ``generate`` call samples, for
every cache; a load between segments is what the responses go on with, and each token records the push whose
weights computed the logits it was drawn from."""

from __future__ import annotations

import pytest
import torch

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.sampling import SamplingParams
from sparserl.rollout.segmented import SegmentedRollout

PROMPTS = ["hello there", "What is 3 + 4? Answer with a number.", "Count: one two"]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=7)
LONG_PROMPTS = [p + " " + "and then some more words to read " * 8 for p in PROMPTS]  # 60+ tokens: pages to choose


def _engine(tiny, name: str, max_batch=None, kv_quant="none") -> RolloutEngine:
    options = {"window": 4} if name == "snapkv" else {}
    if name == "blocktopk":  # 3 of the 16-token pages read per step past the first layer (LONG_PROMPTS: > 3 pages)
        comp = get_compressor("blocktopk", pages=3, dense_layers=1)
    else:
        comp = get_compressor(name, budget=10, step_length=4, **options) if name != "none" else get_compressor("none")
    engine = RolloutEngine(tiny, comp, fused=False, max_batch=max_batch, kv_quant=kv_quant)
    engine.update_weights(tiny.model, version=1)
    return engine


@pytest.mark.parametrize("name, max_batch", [("none", None), ("rkv", None), ("snapkv", 4), ("h2o", 2)])
def test_segments_with_the_same_weights_sample_what_one_generate_samples(tiny, name, max_batch):
    engine = _engine(tiny, name, max_batch)
    whole = engine.generate(PROMPTS, PARAMS)
    rollout = SegmentedRollout(_engine(tiny, name, max_batch), PROMPTS, PARAMS)
    assert rollout.engine.last_batch_rows == engine.last_batch_rows == (max_batch or 6)  # split as generate splits
    while not rollout.advance(5):
        pass
    out = rollout.output()
    # 24 decode steps at most, 5 at a time; split by max_batch, the rows past it start as earlier ones end
    assert rollout.segments == 5 if max_batch is None else rollout.segments > 5
    assert out.response_ids == whole.response_ids and out.finish_reason == whole.finish_reason
    if max_batch is None:  # bit-identical: the same steps in the same order
        assert out.sampler_logprobs == whole.sampler_logprobs
    else:  # a row that joined attends beside rows of other lengths (masked slots): sums in another order
        for got, want in zip(out.sampler_logprobs, whole.sampler_logprobs):
            assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)
    assert out.kv_tokens_kept == whole.kv_tokens_kept and out.kv.compressions == whole.kv.compressions
    assert out.token_versions == [[1] * len(r) for r in out.response_ids]


def _perturbed(tiny, scale: float) -> dict:
    return {k: v * scale if v.dim() == 2 else v for k, v in tiny.model.state_dict().items()}


@pytest.mark.parametrize("name", ["none", "rkv"])
def test_weights_loaded_between_segments_draw_the_tokens_after_and_each_token_records_its_push(tiny, name):
    """Segment 1 runs 6 decode steps with push 1: tokens 0-6 come from its logits (the 6th step computed token
    6's); the responses then go on with push 2's weights. The same load of push 1's own weights under a new number
    changes no token, only the numbers recorded; other weights change the tokens after the load and none before."""
    engine = _engine(tiny, name)
    reference = engine.generate(PROMPTS, PARAMS)
    for state, same in ((tiny.model.state_dict(), True), (_perturbed(tiny, 1.5), False)):
        engine = _engine(tiny, name)
        rollout = SegmentedRollout(engine, PROMPTS, PARAMS)
        assert not rollout.advance(6)
        engine.update_weights(state, version=2)
        assert rollout.advance()
        out = rollout.output()
        for r, versions in enumerate(out.token_versions):
            n = len(out.response_ids[r])
            assert versions == [1] * min(n, 7) + [2] * max(0, n - 7), r
        for got, ref in zip(out.response_ids, reference.response_ids):
            assert got[:7] == ref[:7]
        if same:
            assert out.response_ids == reference.response_ids and out.sampler_logprobs == reference.sampler_logprobs
        else:
            long_rows = [r for r, ids in enumerate(reference.response_ids) if len(ids) > 8]
            assert long_rows and any(out.response_ids[r][7:] != reference.response_ids[r][7:] for r in long_rows)


def test_unnumbered_weights_record_no_versions_and_bad_calls_are_refused(tiny):
    engine = RolloutEngine(tiny, get_compressor("none"), fused=False)
    assert engine.generate(PROMPTS, PARAMS).token_versions is None
    rollout = SegmentedRollout(engine, PROMPTS, PARAMS)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        rollout.advance(0)
    rollout.advance(2)
    with pytest.raises(RuntimeError, match="still running"):
        rollout.output()
    with pytest.raises(ValueError, match="no prompts given"):
        SegmentedRollout(engine, [], PARAMS)


def test_alpha_from_kept_head_inputs_reads_each_token_with_the_head_of_the_push_that_drew_it(tiny):
    """A partial rollout drawn by pushes 1 and 2 with its head inputs and its q kept: q recomputed from the head
    inputs, each token by its own push's head (``hidden_alpha_by_push``), gives the α of the q the sampler drew
    from (``recorded_alpha``); one head for every token does not."""
    import dataclasses

    import torch

    from sparserl.mismatch.exact_alpha import hidden_alpha, hidden_alpha_by_push, recorded_alpha

    params = dataclasses.replace(PARAMS, keep_hidden=True, keep_distributions=True)
    engine = _engine(tiny, "rkv")
    rollout = SegmentedRollout(engine, PROMPTS, params)
    rollout.advance(6)
    other = _perturbed(tiny, 1.5)
    engine.update_weights(other, version=2)
    rollout.advance()
    out = rollout.output()
    assert {v for vs in out.token_versions for v in vs} == {1, 2}
    heads = {1: _engine(tiny, "rkv"), 2: _engine(tiny, "rkv")}
    heads[2].update_weights(other, version=2)
    g = torch.Generator().manual_seed(0)
    N, T = len(out.response_ids), max(len(r) for r in out.response_ids)
    hidden = torch.randn(N, T, out.hidden[0].shape[-1], generator=g)  # any p will do: both sides read the same
    weight = torch.randn(out.distributions[0].shape[-1], hidden.shape[-1], generator=g) * 0.2
    want = recorded_alpha(out.distributions, hidden, weight, 1.0)
    got = hidden_alpha_by_push(heads.__getitem__, out.hidden, out.token_versions, params, hidden, weight, 1.0)
    assert torch.allclose(got, want, atol=1e-5)
    one_head = hidden_alpha(heads[1], out.hidden, params, hidden, weight, 1.0)
    assert torch.allclose(one_head[:, :7], want[:, :7], atol=1e-5)  # tokens 0-6: push 1 drew them
    assert (one_head - want)[:, 7:].abs().max() > 1e-3  # the tokens after the load need push 2's head


def _teacher_forced_logprobs(engine: RolloutEngine, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Log-probs [len(response)] of each response token under ``engine``'s weights, one dense forward over
    prompt + response (temperature 1, as PARAMS)."""
    ids = torch.tensor([prompt + response])
    valid = torch.ones_like(ids, dtype=torch.bool)
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        h = engine.model.hidden_states(ids, valid, positions)
        logp = torch.log_softmax(engine.model.logits(h).float()[0], -1)
    P = len(prompt)
    return logp[P - 1 : P - 1 + len(response)].gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize(
    "name, kv_quant",
    [("none", "none"), ("rkv", "none"), ("snapkv", "none"), ("h2o", "none"), ("blocktopk", "none"), ("rkv", "int8")],
)
def test_a_recomputed_cache_continues_with_the_new_weights_over_the_whole_sequence(tiny, name, kv_quant):
    """rollout.partial_kv=recompute: after 6 decode steps with push 1 (tokens 0-5 drawn, token 6's logits
    computed), push 2's weights recompute the live responses' cache and token 6's logits: token 6 is drawn from
    push 2's forward over prompt + tokens 0-5, for every cache (its log-prob equals a dense teacher-forced one
    under push 2, and it records push 2); on a dense cache every later token is too (the cache holds push 2's
    K/V of every token, as if push 2 had sampled from the start). Kept instead (the default), token 6 is push
    1's."""
    other = _perturbed(tiny, 1.5)
    fresh = _engine(tiny, "none")
    fresh.update_weights(other, version=2)
    gaps = {}
    prompts = LONG_PROMPTS if name == "blocktopk" else PROMPTS
    for kv in ("keep", "recompute"):
        engine = _engine(tiny, name, kv_quant=kv_quant)
        rollout = SegmentedRollout(engine, prompts, PARAMS, kv=kv)
        rollout.advance(6)
        engine.update_weights(other, version=2)
        rollout.advance()
        out = rollout.output()
        assert rollout.recomputes == (kv == "recompute")
        first, later = [], []
        for prompt, response, logp, versions in zip(
            out.prompt_ids, out.response_ids, out.sampler_logprobs, out.token_versions
        ):
            if len(response) > 7:
                drawn_by_1 = 6 if kv == "recompute" else 7
                assert versions == [1] * drawn_by_1 + [2] * (len(response) - drawn_by_1)
                forced = _teacher_forced_logprobs(fresh, prompt, response)
                gap = (forced - torch.tensor(logp)).abs()
                first.append(float(gap[6]))
                later.append(float(gap[6:].max()))
        assert len(first) >= 4  # responses that went on after the load
        gaps[kv] = max(first), max(later)
    assert gaps["recompute"][0] < 1e-4
    assert gaps["keep"][0] > 1e-3
    if name == "none":
        assert gaps["recompute"][1] < 1e-4


def test_rewritten_rows_keep_their_tokens_with_the_new_keys_and_values(tiny):
    """``CompressedKVCache.rewrite_rows``: a SnapKV cache that chose 10 of each sequence's 30-odd tokens under push
    1, rewritten from push 2's forward over the same sequences: every slot keeps its position (the token it
    chose) and holds push 2's K/V at it; the observation window holds push 2's last queries."""
    from sparserl.rollout.cache import CompressedKVCache

    engine = _engine(tiny, "none")
    ids, valid, _ = engine.left_padded([engine.encode(p) for p in PROMPTS])
    more = torch.randint(5, 100, (ids.shape[0], 20), generator=torch.Generator().manual_seed(1))
    ids, valid = torch.cat([ids, more], 1), torch.cat([valid, torch.ones_like(more, dtype=torch.bool)], 1)
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    snapkv = get_compressor("snapkv", budget=10, window=4)
    _, keys, values, queries, _, _ = engine.model.prefill(ids, valid, positions, 4)
    cache = CompressedKVCache(keys, values, valid, positions, 16, snapkv, engine.model.n_heads, queries)
    assert int(cache.lens[0] - cache.start[0]) == 10 and cache.pos.max() > 20  # 10 of the 31+ positions kept
    pos_before = cache.pos.clone()
    engine.update_weights(_perturbed(tiny, 1.5), version=2)
    _, keys2, values2, queries2, _, _ = engine.model.prefill(ids, valid, positions, 4)
    offset = (~valid).sum(1)
    cache.rewrite_rows(slice(0, ids.shape[0]), keys2, values2, offset, queries2)
    assert torch.equal(cache.pos, pos_before)
    for layer in range(cache.n_layers):
        assert torch.equal(cache._ordered_queries(slice(layer, layer + 1), None), queries2[layer])
        for b in range(ids.shape[0]):
            for slot in range(int(cache.start[b]), int(cache.lens[b])):
                for h in range(cache.n_kv):
                    column = int(offset[b]) + int(cache.pos[layer, b, h, slot])
                    assert torch.equal(cache.keys[layer, b, h, slot], keys2[layer][b, h, column])
                    assert torch.equal(cache.values[layer, b, h, slot], values2[layer][b, h, column])
