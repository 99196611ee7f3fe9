"""The quantized sampler in training: presets, the QuRL step metrics, checkpoints in original form."""

import json

import pytest
import torch
from test_train import TINY

from sparserl import runlog as names
from sparserl.config import ConfigError, load_config, validate
from sparserl.models.invariant_scaling import applied_scale
from sparserl.train.checkpoint import latest_checkpoint, load_latest
from sparserl.train.trainer import build_trainer, train


def cfg_for(tmp_path, preset, *extra):
    return validate(load_config(preset, [*TINY, f"log.out_dir={tmp_path}", *extra]))


@pytest.mark.parametrize(
    "preset,expect",
    [
        ("qurl", {"compressor": "none", "quant": "int8", "kv_quant": "none", "quant_scale": 1.5, "correction": "qurl"}),
        ("fp8rl", {"compressor": "none", "quant": "fp8", "kv_quant": "fp8", "quant_scale": 1.0, "correction": "fp8rl"}),
        (
            "rkv_int8",
            {"compressor": "rkv", "quant": "int8", "kv_quant": "int8", "quant_scale": 1.0, "correction": "sparse_rl"},
        ),
        (
            "qurl_group",
            {
                "compressor": "none",
                "quant": "int8_group",
                "kv_quant": "none",
                "quant_scale": 1.5,
                "correction": "qurl",
                "quant_group": 32,
                "quant_smooth": 0.5,
                "quant_head": True,
            },
        ),
    ],
)
def test_quantized_presets_compose(preset, expect):
    """Each preset is the default job with its sampler and correction; overrides still apply on top."""
    cfg = validate(load_config(preset, ["rollout.quant_scale=2"] if preset == "rkv_int8" else []))
    r = cfg.rollout
    got = {
        "compressor": r.compressor,
        "quant": r.quant,
        "kv_quant": r.kv_quant,
        "quant_scale": r.quant_scale,
        "correction": cfg.algorithm.correction,
    }
    got.update({key: getattr(r, key) for key in ("quant_group", "quant_smooth", "quant_head") if key in expect})
    expect = {**expect, "quant_scale": 2.0} if preset == "rkv_int8" else expect
    assert got == expect
    assert cfg.train.steps == load_config("sparse_rl_fixed40").train.steps  # the rest is the default job


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("rollout.quant=int4", "rollout.quant"),
        ("rollout.kv_quant=int4", "rollout.kv_quant"),
        ("rollout.quant_scale=0", "rollout.quant_scale"),
    ],
)
def test_bad_quant_options_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        validate(load_config("sparse_rl_fixed40", [override]))


def test_asking_for_the_sampler_logprobs_of_a_quantized_sampler_is_an_error():
    """With quantized weights or KV the sampler is not the old policy, even dense and float32 (the
    trainer then scores: checked in the qurl run below)."""
    for extra in (["rollout.quant=int8"], ["rollout.kv_quant=int8"]):
        with pytest.raises(ConfigError, match="quantized"):
            validate(
                load_config(
                    "sparse_rl_fixed40",
                    [
                        *TINY,
                        "rollout.compressor=none",
                        "rollout.dtype=float32",
                        "algorithm.old_logprobs=sampler",
                        *extra,
                    ],
                )
            )


def test_quant_group_reaches_the_trainers_sampler(tmp_path):
    cfg = cfg_for(tmp_path, "default", "rollout.quant=int8_group", "rollout.quant_group=32")
    layer = build_trainer(cfg).engine.model.layers[0]
    assert {layer.qkv.group, layer.o.group, layer.gate_up.group, layer.down.group} == {32}


def test_an_int8_group_step_with_smoothquant_and_head(tmp_path):
    """The accurate INT8 sampler in the loop (int8_group: weight and activation scales per group,
    SmoothQuant, the LM head quantized): one step trains and logs the visible-update fraction on
    int8_group's own grid (the qurl_group preset)."""
    cfg = cfg_for(tmp_path, "qurl_group", "train.steps=1")
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    rows = [json.loads(line) for line in (run / names.METRICS_FILE).read_text().splitlines()]
    assert len(rows) == 1
    assert 0.0 < rows[0][names.QUANT_UPDATE_VISIBLE] <= 1.0 and rows[0][names.TIME_QUANTIZE] > 0


def test_a_qurl_step_logs_quant_metrics_and_saves_the_original_form(tmp_path):
    """A 1-step qurl run on the tiny model: the step logs quant/update_visible_frac and
    time/quantize_s; the learner trains the scaled parametrisation, the checkpoint holds the original
    form (loads into a plain model with the learner's logits), and a resume re-folds s."""
    cfg = cfg_for(tmp_path, "qurl", "train.steps=1")
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    rows = [json.loads(line) for line in (run / names.METRICS_FILE).read_text().splitlines()]
    assert len(rows) == 1
    for row in rows:
        assert 0.0 <= row[names.QUANT_UPDATE_VISIBLE] <= 1.0 and row[names.TIME_QUANTIZE] > 0
    assert rows[-1][names.QUANT_UPDATE_VISIBLE] > 0  # lr 1e-3 on a tiny model: codes move

    from transformers import AutoModelForCausalLM

    ck = latest_checkpoint(run)
    plain = AutoModelForCausalLM.from_pretrained(ck / "model").eval()
    trainer = build_trainer(cfg)
    assert applied_scale(trainer.learner) == 1.5
    assert trainer.old_policy.kind == "score"  # dense float32 sampler, but quantized weights
    load_latest(run, trainer.learner)
    from sparserl.models.invariant_scaling import refold_after_load

    refold_after_load(trainer.learner)
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        a = plain(ids).logits
        b = trainer.learner.eval()(ids).logits
    assert (a - b).abs().max().item() <= 1e-4
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.allclose(trainer.learner.state_dict()[norm], plain.state_dict()[norm] * 1.5)


def test_teacher_forced_logprobs_are_the_dense_samplers_own(tiny):
    """Scoring a dense float32 sampler's responses teacher-forced gives the log-probs it sampled with
    (the alignment of prompt, response and padding is right)."""
    from sparserl.batch import RolloutBatch
    from sparserl.mismatch.teacher_forced import teacher_forced_logprobs
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    engine = RolloutEngine(tiny, get_compressor("none"), dtype="float32")
    engine.eos_ids = set(range(0, len(tiny.tokenizer), 50))  # ragged responses: right padding
    ro = engine.generate(
        ["a b c", "one two three four five"], SamplingParams(n=3, max_new_tokens=12, seed=3, temperature=0.8)
    )
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index, pad_id=0)
    got = teacher_forced_logprobs(engine.model, batch, temperature=0.8, micro_batch_size=4)
    assert len({len(r) for r in ro.response_ids}) > 1
    assert (got - batch.sampler_logprobs * batch.response_mask).abs().max().item() <= 1e-4


def test_a_token_bound_splits_the_teacher_forced_reading_and_changes_nothing(tiny):
    """``max_tokens`` (train.max_tokens_per_micro_batch) bounds each micro-batch of the teacher-forced reading
    (the rollout workers' dense-cache reading, rollout.mismatch_split): its logits and their log-softmax are two
    float32 [rows, T, V] blocks, 15 GB for 32 rows of 1,200 tokens at SmolLM2's vocabulary. A bound of two and a
    half rows' tokens: 2 rows a forward instead of 6, the same log-probs."""
    from sparserl.batch import RolloutBatch
    from sparserl.mismatch.teacher_forced import read_dense_cache
    from sparserl.packing import micro_batch_rows
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    engine = RolloutEngine(tiny, get_compressor("none"), dtype="float32")
    ro = engine.generate(["a b c", "one two three"], SamplingParams(n=3, max_new_tokens=10, seed=3, ignore_eos=True))
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index, pad_id=0)
    row_tokens = batch.input_ids.shape[1]
    bound = row_tokens * 5 // 2
    assert micro_batch_rows(6, bound, row_tokens) == 2 and micro_batch_rows(6, None, 16) == 6
    assert micro_batch_rows(6, 3, row_tokens) == 1  # a row longer than the bound still reads, alone
    seen = []
    forward = engine.model.hidden_states
    engine.model.hidden_states = lambda ids, *a: seen.append(ids.shape[0]) or forward(ids, *a)
    whole = read_dense_cache(engine.model, ro, 1.0, micro_batch_size=6)
    bounded = read_dense_cache(engine.model, ro, 1.0, micro_batch_size=6, max_tokens=bound)
    assert seen == [6, 2, 2, 2]
    for a, b in zip(whole.logprobs, bounded.logprobs):
        assert torch.allclose(a, b, atol=1e-6)


def test_mismatch_split_logs_both_parts(tmp_path):
    """R-KV + int8: the weights part and the cache part are logged, both >= 0; asking for the split
    without quantized weights is a config error."""
    cfg = cfg_for(tmp_path, "rkv_int8", "train.steps=1", "checkpoint.every=0", "rollout.mismatch_split=true")
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    row = json.loads((run / names.METRICS_FILE).read_text().splitlines()[0])
    assert row[names.MISMATCH_K3_WEIGHTS] >= 0 and row[names.MISMATCH_K3_CACHE] > 0
    with pytest.raises(ConfigError, match=r"rollout\.mismatch_split"):
        validate(load_config("sparse_rl_fixed40", ["rollout.mismatch_split=true"]))
