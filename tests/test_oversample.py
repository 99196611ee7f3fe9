"""Sparrow's acceptance-aware oversampling (``rollout.oversample``): each response's mean acceptance against a
hand computation, the right n kept per prompt, the step trains on them, bad inputs refused."""

from __future__ import annotations

import math

import pytest
import torch

from sparserl.train.oversample import keep_top, response_acceptance


def test_mean_acceptance_is_the_mean_of_min_one_p_over_q():
    q = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.4, 1.0]]))
    p = torch.log(torch.tensor([[0.25, 1.0, 0.1], [0.2, 0.1, 0.3]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    a = response_acceptance(q, p, mask)
    assert torch.allclose(a, torch.tensor([(0.5 + 1.0) / 2, (1.0 + 0.25 + 0.3) / 3], dtype=torch.float64))
    c2 = response_acceptance(q, p, mask, c=2.0)  # Sparrow's threshold C: min(1, p / (C q))
    assert math.isclose(float(c2[0]), (0.25 + 1.0) / 2)


def test_each_group_keeps_its_n_best_in_sampling_order():
    values = [0.1, 0.9, 0.5, 0.5, 0.3, 0.2, 0.8, 0.8]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    assert keep_top(values, groups, 2) == [1, 2, 6, 7]  # group 0: 0.9 and the first 0.5
    assert keep_top(values, groups, 1) == [1, 6]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.oversample=8"], "must be more than rollout.n=8"),
        (["rollout.oversample=12", "cluster.rollout_workers=1", "rollout.async=true"], "synchronous"),
        (["rollout.oversample=12", "algorithm.filter_groups=true"], "choose one"),
        (["rollout.oversample_by=reward"], "without rollout.oversample"),
        (["rollout.oversample=12", "algorithm.old_logprobs=update"], "rollout.oversample keeps responses"),
    ],
)
def test_bad_inputs_are_refused(overrides, message):
    from sparserl.config import ConfigError, load_config, validate

    with pytest.raises((ConfigError, ValueError), match=message):
        cfg = validate(load_config("default", overrides))
        from sparserl.score import old_logprobs_source

        old_logprobs_source(cfg.algorithm.old_logprobs, why_not_update=cfg.why_update_forward_is_not_old_policy())


@pytest.mark.parametrize("by", ["acceptance", "reward"])
def test_a_step_samples_m_and_trains_on_the_n_chosen(tmp_path, monkeypatch, by):
    """rollout.n=2 of rollout.oversample=4 per prompt: the rollout samples 4 per prompt, the update sees 2 per
    prompt, those with the highest acceptance (or reward), and the metrics log both sides."""
    from test_train import cfg_for

    from sparserl import runlog as names
    from sparserl.train import oversample, step
    from sparserl.train.trainer import build_trainer, train_step

    seen = {}
    select = oversample.oversample_select

    def spy(cfg, batch, ro, old):
        out = select(cfg, batch, ro, old)
        key = (
            response_acceptance(batch.sampler_logprobs, batch.old_logprobs, batch.response_mask)
            if by == "acceptance"
            else batch.rewards.double()
        )
        seen.update(sampled=batch.size, kept=out[0].size, key=key, batch=batch, chosen=out[0], ro=out[1])
        return out

    monkeypatch.setattr(step, "oversample_select", spy)
    cfg = cfg_for(tmp_path, "train.steps=1", "rollout.n=2", "rollout.oversample=4", f"rollout.oversample_by={by}")
    metrics = train_step(build_trainer(cfg), 1)
    assert seen["sampled"] == 8 and seen["kept"] == 4
    batch, chosen = seen["batch"], seen["chosen"]
    expected = keep_top(seen["key"].tolist(), batch.group_ids.tolist(), 2)
    assert torch.equal(chosen.response_ids, batch.response_ids[expected])
    assert torch.equal(chosen.old_logprobs, batch.old_logprobs[expected])
    assert len(seen["ro"].response_ids) == 4 and chosen.group_ids.tolist() == [0, 0, 1, 1]
    assert metrics[names.OVERSAMPLE_ACCEPT_KEPT] >= metrics[names.OVERSAMPLE_ACCEPT_DROPPED] or by == "reward"
