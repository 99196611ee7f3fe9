"""No silent NaN in the update (:mod:`sparserl.train.update`, :mod:`sparserl.train.nonfinite`): an optimizer
step whose loss or gradient norm is not finite is not applied (every weight bit-identical, AdamW's state and
the LR schedule as they were), it is logged as ``train/skipped_nonfinite``, and ``train.max_nonfinite_steps``
such steps in a row stop the run with one error naming the step."""

import pytest
import torch
from test_train import cfg_for, toy_reward

from sparserl import runlog as names
from sparserl.runlog import read_metrics
from sparserl.train import update
from sparserl.train.nonfinite import NonfiniteTrainingError
from sparserl.train.trainer import (
    build_trainer,
    corrections_and_advantages,
    rollout,
    rollout_batch,
    train,
    train_step,
    update_policy,
)


def _state(trainer):
    return (
        {k: v.detach().clone() for k, v in trainer.learner.state_dict().items()},
        trainer.scheduler.last_epoch,
        len(trainer.optimizer.state),
    )


def _same(before, trainer):
    weights, epoch, moments = before
    now = trainer.learner.state_dict()
    return (
        all(torch.equal(weights[k], now[k]) for k in weights)
        and trainer.scheduler.last_epoch == epoch
        and len(trainer.optimizer.state) == moments
    )


def test_an_inf_advantage_leaves_every_weight_bit_identical(tmp_path):
    from sparserl.reward import score_responses

    cfg = cfg_for(tmp_path)
    trainer = build_trainer(cfg)
    examples, ro = rollout(trainer, 1)
    rewards, _ = score_responses(toy_reward, ro.texts, [examples[i].label for i in ro.prompt_index])
    batch = rollout_batch(trainer, ro, rewards)
    batch.old_logprobs = batch.sampler_logprobs.clone()
    corr = corrections_and_advantages(cfg, batch)
    batch.advantages[0] = float("inf")
    before = _state(trainer)
    out = update_policy(trainer, batch, corr)
    assert out[names.SKIPPED_NONFINITE] == 1 and out[names.OPTIMIZER_STEPS] == 0
    assert _same(before, trainer)
    assert all(p.grad is None for p in trainer.learner.parameters())  # gradients zeroed
    batch.advantages[0] = 0.0  # the same batch, finite: applied
    out = update_policy(trainer, batch, corr)
    assert out[names.SKIPPED_NONFINITE] == 0 and out[names.OPTIMIZER_STEPS] == 1
    assert not _same(before, trainer)


def test_a_nan_loss_is_skipped_logged_and_stops_the_run_after_the_limit(tmp_path, monkeypatch):
    real = update.policy_loss

    def nan_loss(*a, **k):
        loss, m = real(*a, **k)
        return loss * float("nan"), m

    trainer = build_trainer(cfg_for(tmp_path, "train.max_nonfinite_steps=2"))
    monkeypatch.setattr(update, "policy_loss", nan_loss)
    before = _state(trainer)
    metrics = train_step(trainer, 1)
    assert metrics[names.SKIPPED_NONFINITE] == 1 and trainer.nonfinite.in_a_row == 1
    assert _same(before, trainer)
    with pytest.raises(NonfiniteTrainingError, match=r"step 2: .*2 steps in a row.*train\.max_nonfinite_steps=2"):
        train_step(trainer, 2)
    assert _same(before, trainer)
    monkeypatch.setattr(update, "policy_loss", real)  # a finite step resets the count
    trainer.nonfinite.in_a_row = 1
    assert train_step(trainer, 3)[names.SKIPPED_NONFINITE] == 0 and trainer.nonfinite.in_a_row == 0


def test_a_run_logs_the_skipped_step_and_its_summary_says_so(tmp_path, monkeypatch):
    real = update.policy_loss
    calls = []

    def nan_once(*a, **k):  # step 1's micro-batches only
        loss, m = real(*a, **k)
        calls.append(1)
        return (loss * float("nan") if len(calls) <= 2 else loss), m

    monkeypatch.setattr(update, "policy_loss", nan_once)
    lines = []
    run = train(cfg_for(tmp_path, "train.steps=2", "checkpoint.every=0"), run_dir=tmp_path / "run", log=lines.append)
    rows = read_metrics(run)
    assert [r[names.SKIPPED_NONFINITE] for r in rows] == [1, 0]
    assert any("skipped" in line and names.SKIPPED_NONFINITE in line for line in lines)
