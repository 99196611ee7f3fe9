"""The online budget controller (:mod:`sparserl.train.kv_controller`): its rule on constructed α tails
(raise, hold, lower after patience, bounds, new bins), its schedule, and a training run that steers,
logs kv/budget_bin/<start> and resumes exactly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sparserl.config import ConfigError, load_config, validate
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.kv.schedule import KVSchedule
from sparserl.train.checkpoint import latest_checkpoint
from sparserl.train.kv_controller import KVController, alpha_tail_by_bin
from sparserl.train.trainer import train

KC = SimpleNamespace(threshold=0.86, margin=0.04, patience=2, bin=None, min_budget=16, max_budget=64, step=8)


def controller(initial=32, **kw):
    return KVController.from_config(SimpleNamespace(**{**vars(KC), **kw}), 32, initial)


def test_raise_at_once_hold_in_between_lower_after_patience():
    c = controller()
    assert c.update({0: 0.80, 32: 0.88, 64: 0.95}) == {0: "raise", 32: "hold", 64: "hold"}
    assert (c.budgets, c.streaks) == ({0: 40, 32: 32, 64: 32}, {0: 0, 32: 0, 64: 1})
    assert c.update({0: 0.89, 32: 0.95, 64: 0.99}) == {0: "hold", 32: "hold", 64: "lower"}
    assert c.budgets == {0: 40, 32: 32, 64: 24}
    assert c.update({32: 0.97, 64: 0.91}) == {32: "lower", 64: "hold"}  # bin 0 unmeasured: held
    assert c.budgets == {0: 40, 32: 24, 64: 24} and c.streaks[64] == 1
    assert c.schedule().pairs == [[0, 40], [32, 24]]
    assert c.metrics() == {"kv/budget_bin/0": 40, "kv/budget_bin/32": 24}


def test_bounds_and_new_bins_start_from_the_initial_schedule():
    c = controller(initial=KVSchedule.from_pairs([[0, 20], [96, 60]]))
    for _ in range(6):
        c.update({0: 0.5, 96: 0.5})
    assert c.budgets == {0: 64, 96: 64}  # raised up to max_budget
    for _ in range(20):
        c.update({0: 0.999, 96: 0.999})
    assert c.budgets == {0: 16, 96: 16}  # lowered down to min_budget
    c2 = controller(initial=KVSchedule.from_pairs([[0, 20], [96, 60]]))
    c2.update({128: 0.9})  # a bin first seen: the initial schedule's budget there
    assert c2.budgets == {128: 60}
    assert c2.schedule().pairs == [[0, 20], [96, 60]]


def test_hysteresis_a_streak_broken_by_a_middle_value_restarts():
    c = controller()
    c.update({0: 0.95})
    c.update({0: 0.88})  # between threshold and threshold + margin: streak reset
    assert c.update({0: 0.95}) == {0: "hold"}
    assert c.update({0: 0.95}) == {0: "lower"}


def test_state_round_trip_and_steer_sets_the_compressor():
    c = controller()
    c.update({0: 0.5, 32: 0.99})
    again = controller()
    again.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert (again.budgets, again.streaks) == (c.budgets, c.streaks)
    comp = build_compressor("rkv", kv_budget=32, window=4)
    ran = c.steer(comp, {"mismatch/alpha_p5_bin/0": 0.5, "mismatch/alpha_p5": 0.5, "mismatch/alpha_mean": 0.9})
    assert ran == {"kv/budget_bin/0": 40, "kv/budget_bin/32": 32}  # the budgets this step ran with
    assert comp.schedule.pairs == [[0, 48], [32, 32]] and comp.budget == 48
    assert alpha_tail_by_bin({"mismatch/alpha_p5_bin/128": 0.7, "x": 1}) == {128: 0.7}


def test_controller_config_errors():
    with pytest.raises(ConfigError) as e:
        validate(
            load_config(
                "sparse_rl_fixed40",
                ["mismatch.alpha=off", "rollout.kv_controller={bin: 64, min_budget: 80, max_budget: 40}"],
            )
        )
    msg = str(e.value)
    assert "set mismatch.alpha to exact or topk" in msg
    assert "rollout.kv_controller.bin=64 must equal mismatch.alpha_bin=128" in msg
    assert "min_budget=80 is above max_budget=40" in msg
    with pytest.raises(ConfigError, match="threshold"):
        load_config("sparse_rl_fixed40", ["rollout.kv_controller={threshold: 1.5}"])


TINY = [
    "model.name=tiny",
    "rollout.dtype=float32",
    "train.prompts_per_step=2",
    "rollout.n=4",
    "rollout.max_new_tokens=16",
    "rollout.kv_budget=8",
    "rollout.step_length=4",
    "rollout.window=2",
    "train.micro_batch_size=4",
    "log.tensorboard=false",
    "log.progress=plain",
    "checkpoint.every=1",
    "checkpoint.keep_last=0",
    "train.lr=1e-3",
    "reward.fn=test_train:toy_reward",
    "data.eval=null",
    "data.system_prompt=null",
    "rollout.compress_prompt=false",
    "mismatch.alpha_bin=8",
    "rollout.kv_controller={threshold: 0.999, min_budget: 4, max_budget: 24, step: 4}",
]


def test_training_steers_logs_budgets_and_resumes_exactly(tmp_path):
    def cfg(steps):
        return validate(load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", f"train.steps={steps}"]))

    full = train(cfg(3), run_dir=tmp_path / "a", log=lambda *_: None)
    rows = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    budgets = [{k: v for k, v in r.items() if k.startswith("kv/budget_bin/")} for r in rows]
    assert budgets[0] == {"kv/budget_bin/0": 8}  # step 1 ran with kv_budget in every bin
    assert budgets[2] != budgets[0]  # a random model's α tail is far below 0.999: budgets were raised
    assert max(v for b in budgets for v in b.values()) <= 24
    train(cfg(2), run_dir=tmp_path / "b", log=lambda *_: None)
    resumed = train(cfg(3), run_dir=tmp_path / "b", resume=True, log=lambda *_: None)
    again = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert {k: v for k, v in again[2].items() if k.startswith("kv/")} == {
        k: v for k, v in rows[2].items() if k.startswith("kv/")
    }
    assert again[2]["reward/mean"] == pytest.approx(rows[2]["reward/mean"])
    wa = (latest_checkpoint(full) / "model" / "model.safetensors").read_bytes()
    wb = (latest_checkpoint(resumed) / "model" / "model.safetensors").read_bytes()
    assert wa == wb


def test_the_held_out_sparse_eval_runs_the_controllers_budgets_and_names_them(tmp_path):
    """With the online controller the held-out sparse evaluation runs the per-bin budgets the controller
    has reached, not rollout.kv_budget, and its record names the sampler it ran."""
    from sparserl.train.held_out import held_out_eval
    from sparserl.train.trainer import build_trainer, train_step

    cfg = validate(
        load_config(
            "sparse_rl_fixed40",
            [
                *TINY,
                f"log.out_dir={tmp_path}",
                "data.eval=arith:seed=7",
                "data.eval_limit=1",
                "eval.max_new_tokens=4",
                "reward.fn=math",
            ],
        )
    )
    trainer = build_trainer(cfg)
    for step in (1, 2):
        train_step(trainer, step)
    pairs = trainer.kv_controller.schedule().pairs
    assert pairs != [[0, 8]]  # a random model's α tail is far below 0.999: budgets were raised
    lines = []
    metrics = held_out_eval(trainer, 2, tmp_path, log=lines.append)
    record = json.loads((tmp_path / "eval-step00002.json").read_text())
    sampler = record["sparse"]["sampler"]
    assert sampler.startswith(f"{cfg.rollout.compressor}, per-bin budgets ") and "KV controller" in sampler
    assert all(f"{length}:{budget}" in sampler for length, budget in pairs)
    assert record["dense"]["sampler"].startswith("dense")
    assert any("sparse" in k and k.endswith("pass@1") for k in metrics) and any(sampler in x for x in lines)
