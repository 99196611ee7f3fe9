"""Sparrow's dense fallback (``rollout.dense_fallback``): exactly the all-zero groups are re-sampled, densely, and
take the sparse groups' places; the metrics count them; bad combinations are refused."""

from __future__ import annotations

import dataclasses

import pytest

from sparserl.reward.weighted import RewardScores
from sparserl.rollout.output import KVStats, RolloutOutput
from sparserl.train.dense_fallback import all_zero_groups, dense_fallback, replace_groups


def _ro(tag: str, prompt_index: list[int]) -> RolloutOutput:
    n = len(prompt_index)
    return RolloutOutput(
        prompt_index=list(prompt_index),
        prompt_ids=[[p] for p in prompt_index],
        response_ids=[[i, i] for i in range(n)],
        sampler_logprobs=[[-1.0, -1.0]] * n,
        finish_reason=["stop"] * n,
        kv_tokens_kept=[5] * n,
        kv=KVStats(0, 0, 0, 0, 0),
        tokens_generated=2 * n,
        seconds=1.0,
        texts=[f"{tag}{i}" for i in range(n)],
    )


def test_only_groups_whose_every_reward_is_zero_count():
    rewards = [0, 0, 0, 1, 0, 0, -0.5, 0]
    assert all_zero_groups(rewards, [0, 0, 1, 1, 2, 2, 3, 3], 5) == [0, 2]  # 3 has a negative reward, 4 no row


def test_the_dense_groups_take_the_places_of_the_all_zero_ones_in_order():
    ro = _ro("s", [0, 0, 1, 1, 2, 2])
    scores = RewardScores([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], {"r": [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]}, 0)
    asked = []

    def resample(chosen):
        asked.extend(chosen)
        return _ro("d", [0, 0, 1, 1])  # the dense rollout of prompts 0 and 2, numbered 0 and 1

    def score(examples, out):
        return RewardScores([1.0, 0.0, 0.0, 0.0], {"r": [1.0, 0.0, 0.0, 0.0]}, 0)

    new_ro, new_scores, metrics = dense_fallback(["a", "b", "c"], ro, scores, resample, score)
    assert asked == ["a", "c"]
    assert new_ro.texts == ["d0", "d1", "s2", "s3", "d2", "d3"]
    assert new_ro.prompt_index == [0, 0, 1, 1, 2, 2]
    assert new_scores.total == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0] and new_scores.parts["r"] == new_scores.total
    assert metrics == {"sampling/dense_fallback_frac": 2 / 3, "sampling/dense_fallback_reward_mean": 0.25}
    # the step sampled both rollouts: 12 + 8 tokens in 1 + 1 s
    assert (new_ro.tokens_generated, new_ro.seconds) == (12 + 8, 2.0)


def test_no_all_zero_group_samples_nothing():
    ro = _ro("s", [0, 0, 1, 1])
    scores = RewardScores([1.0, 0.0, 0.0, 1.0], {}, 0)

    def resample(chosen):
        raise AssertionError("nothing to re-sample")

    out, same, metrics = dense_fallback(["a", "b"], ro, scores, resample, None)
    assert out is ro and same is scores and metrics == {"sampling/dense_fallback_frac": 0.0}


def test_a_replacement_with_more_responses_than_the_group_is_refused():
    ro = _ro("s", [0, 0])
    with pytest.raises(ValueError, match="more responses per prompt"):
        replace_groups(ro, RewardScores([0.0, 0.0], {}, 0), [0], _ro("d", [0, 0, 0]), RewardScores([0.0] * 3, {}, 0))
    fewer = dataclasses.replace(_ro("d", [0, 0]), hidden=None)
    with_hidden = dataclasses.replace(ro, hidden=[[1.0], [2.0]])
    with pytest.raises(ValueError, match="lacks a field"):
        replace_groups(with_hidden, RewardScores([0.0, 0.0], {}, 0), [0], fewer, RewardScores([0.0] * 2, {}, 0))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.compressor=none"], "dense already"),
        (["cluster.rollout_workers=1", "rollout.async=true"], "synchronous rollout"),
        (["algorithm.filter_groups=true"], "choose one"),
        (["mismatch.alpha_q=replay"], "mismatch.alpha_q=hidden or kept"),
    ],
)
def test_bad_combinations_are_refused(overrides, message):
    from sparserl.config import ConfigError, load_config, validate

    with pytest.raises(ConfigError, match=message):
        validate(load_config("default", ["rollout.dense_fallback=true", *overrides]))


def test_a_step_with_the_fallback_trains_on_dense_groups(tmp_path):
    """The tiny model on the sparse job: every reward is 0 (the reward pays for nothing), so every group is
    re-sampled densely: the batch's responses all kept their whole cache; the step trains and logs it."""
    from test_train import cfg_for

    from sparserl.train.trainer import build_trainer, train_step

    cfg = cfg_for(tmp_path, "train.steps=1", "rollout.dense_fallback=true", "reward.fn=test_dense_fallback:zero")
    metrics = train_step(build_trainer(cfg), 1)
    assert metrics["sampling/dense_fallback_frac"] == 1.0
    assert metrics["sampling/dense_fallback_reward_mean"] == 0.0
    assert metrics["kv/kept_frac_final"] == 1.0  # every response in the batch was drawn on a dense cache
    assert metrics["kv/alloc_reduction"] > 1.0  # the KV bytes stay the compressed rollout's


def zero(response: str, label: str) -> float:
    return 0.0


def test_the_memory_prediction_counts_a_dense_re_sample_of_every_row():
    from test_memory import SHAPE, cfg_of

    from sparserl.memory.predict import predict_peak

    plain = predict_peak(cfg_of("rollout.max_new_tokens=1024"), SHAPE, 100)
    fallback = predict_peak(cfg_of("rollout.max_new_tokens=1024", "rollout.dense_fallback=true"), SHAPE, 100)
    dense = fallback.stations["dense fallback"]["dense KV cache"]
    assert dense > 10 * plain.stations["rollout"]["KV cache"]  # 1,024 tokens a row against R-KV's budget
