"""The exact α's ``q`` recomputed from the sampler's kept head inputs (``mismatch.alpha_q=hidden``,
:func:`sparserl.mismatch.exact_alpha.hidden_alpha`) is the ``q`` the sampler drew from: α from kept hidden
states equals α from kept distributions and α from the replay (1e-6) for every compressor, each weight
and KV quantization, a bf16 sampler, top-k / top-p and greedy sampling; in training nothing is replayed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparserl.batch import RolloutBatch
from sparserl.mismatch.exact_alpha import exact_alpha, hidden_alpha, recorded_alpha
from sparserl.rollout import native
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, build_compressor
from sparserl.rollout.kv_quant import available_kv_quants
from sparserl.rollout.quant import available_quants
from sparserl.rollout.sampling import SamplingParams
from sparserl.score.hidden import dense_hidden
from sparserl.score.shared_prompt import lm_head_weight

PROMPTS = [
    [{"role": "user", "content": "What is 3 + 5? Think step by step."}],
    [{"role": "user", "content": "Name a prime number larger than ten, then another one."}],
]


def _compressor(name: str):
    if name == "blocktopk":  # 3 pages of 16 tokens read in the tiny model's layer 1
        return build_compressor(name, kv_budget=48, options={"dense_layers": 1})
    if name == "none":
        return build_compressor("none")
    return build_compressor(name, kv_budget=12, step_length=3, window=4)


def _dense_p(peaked, batch):
    """``p``'s hidden states and head: the peaked model's at half its logits' scale (a broader policy than the
    sampler's: α between 0.1 and 0.9, moved by any error in ``q``)."""
    T = batch.response_ids.shape[1]
    hidden = dense_hidden(peaked.model, batch.input_ids, batch.attention_mask, batch.position_ids, T, 8)
    return hidden * 0.5, lm_head_weight(peaked.model)


def _three_alphas(peaked, engine, params, chunk=5):
    """α of one sampled batch against :func:`_dense_p`, with ``q`` from the kept head inputs (in chunks of
    ``chunk`` positions across responses), from the kept distributions and from the replay."""
    out = engine.generate(PROMPTS, dataclasses.replace(params, keep_distributions=True, keep_hidden=True))
    assert [x.shape for x in out.hidden] == [(len(r), engine.model.hidden) for r in out.response_ids]
    assert all(x.dtype == engine.model.dtype for x in out.hidden)
    batch = RolloutBatch.from_rollout(out.prompt_ids, out.response_ids, out.sampler_logprobs, out.prompt_index)
    hidden, weight = _dense_p(peaked, batch)
    tau = params.temperature if params.temperature > 0 else 1.0
    from_hidden = hidden_alpha(engine, out.hidden, params, hidden, weight, tau, chunk=chunk)
    kept = recorded_alpha(out.distributions, hidden, weight, tau)
    recorded = batch.sampler_logprobs if params.temperature > 0 else None  # greedy: a point mass, log-prob 0
    replayed, err = exact_alpha(engine, out.prompt_ids, out.response_ids, params, hidden, weight, tau, recorded)
    assert err is None or err <= 1e-5
    mask = batch.response_mask.bool()
    assert 0.1 < float(kept[mask].mean()) < 0.9  # a mismatch to measure
    return from_hidden, kept, replayed


def _assert_same(peaked, engine, params, chunk=5):
    from_hidden, kept, replayed = _three_alphas(peaked, engine, params, chunk)
    torch.testing.assert_close(from_hidden, kept, atol=1e-6, rtol=0)
    torch.testing.assert_close(from_hidden, replayed, atol=1e-6, rtol=0)


def _params(**kw):
    return SamplingParams(**{"n": 2, "max_new_tokens": 16, "temperature": 1.0, "seed": 7, **kw})


@pytest.mark.parametrize("name", available_compressors())
def test_alpha_from_hidden_equals_kept_and_replay_for_every_compressor(peaked, name):
    engine = RolloutEngine(peaked, _compressor(name), dtype="float32", quant="int8")
    _assert_same(peaked, engine, _params())


@pytest.mark.parametrize("quant", available_quants())
def test_alpha_from_hidden_equals_kept_and_replay_with_each_weight_quantization(peaked, quant):
    engine = RolloutEngine(peaked, _compressor("snapkv"), dtype="float32", quant=quant)
    _assert_same(peaked, engine, _params())


@pytest.mark.parametrize("kv_quant", [q for q in available_kv_quants() if q != "none"])
def test_alpha_from_hidden_equals_kept_and_replay_with_each_kv_quantization(peaked, kv_quant):
    engine = RolloutEngine(peaked, _compressor("rkv"), dtype="float32", kv_quant=kv_quant, max_batch=4)
    _assert_same(peaked, engine, _params(top_k=50, top_p=0.9))  # rows split in batches of 4, filtered q


@pytest.mark.parametrize("name", ["none", "rkv"])
def test_alpha_from_hidden_equals_kept_and_replay_with_a_bf16_sampler(peaked, name):
    kernel = native.bf16_kernels()[0] if native.bf16_kernels() else None  # not measured here: either is exact
    engine = RolloutEngine(peaked, _compressor(name), dtype="bfloat16", bf16_kernel=kernel)
    _assert_same(peaked, engine, _params(top_p=0.95))


def test_alpha_from_hidden_under_greedy_sampling_and_the_quantized_head(peaked):
    engine = RolloutEngine(peaked, _compressor("h2o"), dtype="float32", quant="int8", quant_head=True)
    _assert_same(peaked, engine, _params(temperature=0.0), chunk=64)


def test_chunking_changes_nothing_and_a_wrong_row_is_seen(peaked):
    """The chunk size (across responses, past the decode step's row count too) does not change α; a ``q`` read
    from the wrong position would."""
    engine = RolloutEngine(peaked, _compressor("rkv"), dtype="float32")
    params = _params()
    from_hidden, kept, _ = _three_alphas(peaked, engine, params, chunk=1)
    out = engine.generate(PROMPTS, dataclasses.replace(params, keep_hidden=True))
    batch = RolloutBatch.from_rollout(out.prompt_ids, out.response_ids, out.sampler_logprobs, out.prompt_index)
    hidden, weight = _dense_p(peaked, batch)
    for chunk in (3, 256):
        torch.testing.assert_close(
            hidden_alpha(engine, out.hidden, params, hidden, weight, 1.0, chunk), kept, atol=1e-6, rtol=0
        )
    shifted = [x.roll(1, 0) for x in out.hidden]  # each response's head inputs one position late
    assert (hidden_alpha(engine, shifted, params, hidden, weight, 1.0) - kept).abs().max() > 1e-3


def _train_cfg(tmp_path, *extra):
    from test_train import TINY

    from sparserl.config import load_config, validate

    return validate(
        load_config(
            "sparse_rl_fixed40",
            [*TINY, f"log.out_dir={tmp_path}", "mismatch.alpha=exact", "rollout.max_new_tokens=24", *extra],
        )
    )


def test_a_train_step_with_alpha_q_hidden_replays_nothing(tmp_path, monkeypatch):
    """mismatch.alpha_q=hidden: the sampler keeps its head inputs (not q) and α is measured without a replay;
    alpha_q=replay replays with the same α (float rounding)."""
    from sparserl import runlog as names
    from sparserl.mismatch import exact_alpha as exact_module
    from sparserl.rollout import engine as engine_module
    from sparserl.train.trainer import build_trainer, train_step

    replays, kept = [], []
    real = exact_module.replay
    monkeypatch.setattr(exact_module, "replay", lambda *a, **k: replays.append(1) or real(*a, **k))
    generate = engine_module.RolloutEngine.generate

    def spy(self, prompts, params=None, *a, **k):
        if params is not None and k.get("forced") is None:
            kept.append((params.keep_hidden, params.keep_distributions))
        return generate(self, prompts, params, *a, **k)

    monkeypatch.setattr(engine_module.RolloutEngine, "generate", spy)
    m = train_step(build_trainer(_train_cfg(tmp_path / "hidden", "mismatch.alpha_q=hidden")), 1)
    assert replays == [] and kept == [(True, False)] and names.MISMATCH_REPLAY_ERR not in m
    kept.clear()
    r = train_step(build_trainer(_train_cfg(tmp_path / "replay", "mismatch.alpha_q=replay")), 1)
    assert replays == [1] and kept == [(False, False)] and r[names.MISMATCH_REPLAY_ERR] <= 1e-5
    assert m[names.MISMATCH_ALPHA_MEAN] == pytest.approx(r[names.MISMATCH_ALPHA_MEAN], abs=1e-6)
    assert m[names.MISMATCH_ALPHA_P5] == pytest.approx(r[names.MISMATCH_ALPHA_P5], abs=1e-6)
