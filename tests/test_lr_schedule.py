"""train.lr_scheduler: the warm-up then constant, linear or cosine, by hand; the trainer's optimizer follows it
over a run's updates, and a resumed run takes it up where it stopped."""

import json
import math

import pytest
from test_train import TINY, cfg_for

from sparserl.config import load_config, validate
from sparserl.train.lr_schedule import lr_factor, total_updates
from sparserl.train.trainer import train


def test_the_factors_by_hand():
    # W = 2 warm-up updates of N = 6: 1/2, 1, then p = 1/4, 2/4, 3/4, 1
    assert [lr_factor(u, 2, 6) for u in range(6)] == [0.5, 1, 1, 1, 1, 1]
    assert [lr_factor(u, 2, 6, "linear") for u in range(6)] == [0.5, 1, 0.75, 0.5, 0.25, 0.0]
    assert [lr_factor(u, 2, 6, "linear", 0.2) for u in range(6)] == pytest.approx([0.5, 1, 0.8, 0.6, 0.4, 0.2])
    cos = [lr_factor(u, 0, 4, "cosine", 0.1) for u in range(4)]
    assert cos == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in (0.25, 0.5, 0.75, 1.0)])
    assert cos[-1] == pytest.approx(0.1)
    assert lr_factor(9, 0, 4, "linear") == 0.0  # past the end (a resume that shortened the run): the floor
    with pytest.raises(ValueError, match="lr scheduler"):
        lr_factor(3, 0, 4, "step")


def test_total_updates_counts_epochs_and_mini_batches():
    cfg = validate(
        load_config(
            "sparse_rl_fixed40",
            [*TINY, "train.steps=5", "train.prompts_per_step=4", "train.mini_batch_prompts=2", "train.ppo_epochs=3"],
        )
    )
    assert total_updates(cfg) == 5 * 3 * 2


def test_a_run_follows_the_schedule_and_a_resume_continues_it(tmp_path):
    extra = (
        "train.lr_scheduler=linear",
        "train.min_lr_ratio=0.25",
        "train.lr=1e-3",
        "train.mini_batch_prompts=1",
        "checkpoint.every=1",
        "mismatch.alpha=off",
    )
    cfg = cfg_for(tmp_path, "train.steps=3", *extra)
    per_step = total_updates(cfg) // 3
    run = train(cfg, run_dir=tmp_path / "a", log=lambda *_: None)
    lrs = [json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    # the logged lr is the one after the step's updates, the next update's (as the HF Trainer logs it)
    want = [1e-3 * lr_factor(s * per_step, 0, 3 * per_step, "linear", 0.25) for s in (1, 2, 3)]
    assert lrs == pytest.approx(want) and lrs[-1] == pytest.approx(0.25e-3)
    train(cfg_for(tmp_path, "train.steps=2", *extra), run_dir=tmp_path / "b", log=lambda *_: None)
    resumed = train(
        cfg_for(tmp_path, "train.steps=3", *extra), run_dir=tmp_path / "b", resume=True, log=lambda *_: None
    )
    assert [json.loads(x)["lr"] for x in (resumed / "metrics.jsonl").read_text().splitlines()][-1] == lrs[-1]
