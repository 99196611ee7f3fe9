"""DAPO's soft overlong punishment (reward.overlong_buffer): the penalty's formula on hand-computed lengths, the
verifier staying the first part, a training step whose rewards carry it and whose accuracy does not, and
compare ranking arms by the verifier's reward."""

import pytest
from test_train import cfg_for

from sparserl.compare.aggregate import reward_curve, summarize_arm
from sparserl.reward.overlong import OVERLONG_PART, overlong_penalty, with_overlong_penalty
from sparserl.reward.weighted import RewardScores
from sparserl.train import step as trainer_module
from sparserl.train.trainer import build_trainer, train_step


def test_the_penalty_is_zero_before_the_buffer_and_falls_to_minus_the_factor_at_the_limit():
    # L_max 48, L_cache 12: 0 up to 36 tokens, (36 - n) / 12 after, -1 at 48
    assert overlong_penalty([1, 36, 37, 42, 48], 48, 12) == [0.0, 0.0, -1 / 12, -0.5, -1.0]
    assert overlong_penalty([42, 48], 48, 12, factor=0.5) == [-0.25, -0.5]
    assert overlong_penalty([0, 24, 48], 48, 48) == [0.0, -0.5, -1.0]  # the whole range is the buffer
    for bad in (0, 49):
        with pytest.raises(ValueError, match="overlong buffer"):
            overlong_penalty([1], 48, bad)


def test_the_verifier_stays_the_first_part():
    single = with_overlong_penalty(RewardScores([1.0, 0.0], {}, 1), "math", [-0.5, 0.0])
    assert single.total == [0.5, 0.0] and single.errors == 1
    assert single.parts == {"math": [1.0, 0.0], OVERLONG_PART: [-0.5, 0.0]}
    assert single.verified == [1.0, 0.0]
    weighted = RewardScores([1.1, 0.1], {"math": [1.0, 0.0], "my:fmt": [0.1, 0.1]})
    shaped = with_overlong_penalty(weighted, "ignored", [-1.0, -0.25])
    assert list(shaped.parts) == ["math", "my:fmt", OVERLONG_PART] and shaped.verified == [1.0, 0.0]
    assert shaped.total == pytest.approx([0.1, -0.15])
    with pytest.raises(ValueError, match="2 responses"):
        with_overlong_penalty(weighted, "math", [0.0])


def test_a_step_trains_on_the_shaped_reward_and_counts_passes_on_the_verifiers(tmp_path, monkeypatch):
    seen = []
    real = trainer_module.rollout_batch
    monkeypatch.setattr(
        trainer_module,
        "rollout_batch",
        lambda trainer, ro, rewards: seen.append((ro, list(rewards))) or real(trainer, ro, rewards),
    )
    # the tiny random model rarely stops: a buffer of all 8 tokens penalizes every response by its length
    trainer = build_trainer(
        cfg_for(
            tmp_path,
            "rollout.max_new_tokens=8",
            "reward.overlong_buffer.len=8",
            "reward.overlong_buffer.penalty_factor=0.5",
        )
    )
    metrics = train_step(trainer, 1)
    ((ro, rewards),) = seen
    lengths = [len(x) for x in ro.response_ids]
    penalties = [0.5 * min(0.0, (0 - n) / 8) for n in lengths]
    assert any(p < 0 for p in penalties)
    assert metrics["reward/part/overlong"] == pytest.approx(sum(penalties) / len(penalties))
    verified = [round(r - p, 6) for r, p in zip(rewards, penalties)]  # what the verifier gave
    assert metrics["reward/verifier_mean"] == pytest.approx(sum(verified) / len(verified))
    assert metrics[f"reward/part/{trainer.cfg.reward.fn}"] == metrics["reward/verifier_mean"]
    assert metrics["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert metrics["reward/accuracy"] == sum(v >= 1 for v in verified) / len(verified)


def test_a_step_without_the_buffer_has_no_overlong_part(tmp_path):
    metrics = train_step(build_trainer(cfg_for(tmp_path, "rollout.max_new_tokens=8")), 1)
    assert "reward/part/overlong" not in metrics
    assert metrics["reward/verifier_mean"] == metrics["reward/mean"]


def test_compare_ranks_arms_by_the_verifiers_reward():
    shaped = {"reward/mean": {1: -0.5, 2: -0.2}, "reward/verifier_mean": {1: 0.25, 2: 0.5}}
    old = {"reward/mean": {1: 0.25, 2: 0.5}}  # logged before reward/verifier_mean existed
    assert reward_curve(shaped) == reward_curve(old) == {1: 0.25, 2: 0.5}
    arm = summarize_arm({"a": shaped, "b": old}, k=1)
    assert arm["final_reward"]["per_seed"] == {"a": 0.5, "b": 0.5}
    assert arm["n_collapsed"] == 0
