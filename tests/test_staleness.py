"""k-step asynchronous rollouts (``rollout.max_staleness``), the driver's side without Ray: which steps are sent
during which step, with which weights, in which order; the lag of every batch; no rollout sent past a checkpoint
or the last step; and the config's refusals. The workers' side (Ray, a killed worker, resume) is in
tests/test_cluster.py."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from sparserl.config import ConfigError, load_config, validate
from sparserl.train import sampler_sync

WORKERS = ("cluster.rollout_workers=2", "rollout.async=true", "mismatch.alpha=off", "rollout.kv_controller=null")


class FakePool:
    """Records each submit (its step's seed and the push it samples with); a push after each update."""

    def __init__(self):
        self.version, self.sent, self.outstanding = 1, [], 0

    def submit(self, prompts, params, schedule, read):
        self.sent.append((params.seed, self.version, tuple(prompts)))
        self.outstanding += 1
        return SimpleNamespace(version=self.version, prompts=prompts)

    def collect(self, pending):
        self.outstanding -= 1
        return SimpleNamespace(weights_version=pending.version, prompts=pending.prompts)


def run(steps: int, *overrides: str) -> tuple[list[int], FakePool, list]:
    """The lag (pushes since the one that sampled) of each step's batch, the pool, and each step's prompts."""
    cfg = validate(load_config("default", [*WORKERS, f"train.steps={steps}", *overrides]))
    draws = iter(range(10**6))
    data = SimpleNamespace(next_batch=lambda: [SimpleNamespace(prompt=f"draw {next(draws)}")])
    engine = SimpleNamespace(compressor=SimpleNamespace(schedule=None))
    trainer = SimpleNamespace(cfg=cfg, pool=FakePool(), pending=deque(), data=data, engine=engine)
    lags, prompts = [], []
    for step in range(1, steps + 1):
        examples, ro = sampler_sync.rollout(trainer, step)
        assert ro.prompts == [e.prompt for e in examples]
        lags.append(trainer.pool.version - ro.weights_version)
        prompts.append(examples[0].prompt)
        assert len(trainer.pending) <= cfg.rollout.max_staleness
        trainer.pool.version += 1  # the update's push
    assert not trainer.pending and trainer.pool.outstanding == 0  # nothing sent past the last step
    return lags, trainer.pool, prompts


@pytest.mark.parametrize(
    "k, every, lags",
    [
        (0, 0, [0, 0, 0, 0, 0, 0, 0]),  # each step's rollout sent when it starts: synchronous
        (1, 0, [0, 1, 1, 1, 1, 1, 1]),  # one-step-off
        (2, 0, [0, 1, 2, 2, 2, 2, 2]),
        (3, 0, [0, 1, 2, 3, 3, 3, 3]),
        (2, 4, [0, 1, 2, 2, 0, 1, 2]),  # nothing sent past step 4's checkpoint: step 5 samples with its weights
        (3, 2, [0, 1, 0, 1, 0, 1, 0]),  # checkpoints closer than k bound the lag
    ],
)
def test_no_batch_is_older_than_max_staleness_and_none_crosses_a_checkpoint(k, every, lags):
    got, pool, prompts = run(7, f"rollout.max_staleness={k}", f"checkpoint.every={every}")
    assert got == lags and max(got) <= k
    # sent in step order with each step's own seed and the step's own prompts, drawn in step order
    seeds = [seed for seed, _, _ in pool.sent]
    assert seeds == sorted(seeds) and len(seeds) == 7
    assert prompts == [f"draw {i}" for i in range(7)]


def test_the_same_seed_sends_the_same_prompts_with_the_same_weights():
    first, second = run(6, "rollout.max_staleness=2")[1], run(6, "rollout.max_staleness=2")[1]
    assert first.sent == second.sent


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("rollout.max_staleness=-1",), r"rollout.max_staleness=-1: must be >= 0"),
        (("rollout.max_staleness=2",), r"rollout.max_staleness=2 needs rollout.async=true"),
        (("rollout.max_staleness=2", "cluster.rollout_workers=2"), r"rollout.max_staleness=2 needs rollout.async"),
        (("rollout.async=true", "rollout.max_staleness=2"), r"rollout.async=true needs cluster.rollout_workers"),
    ],
)
def test_bad_staleness_is_refused_before_any_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config("default", list(overrides)))


def test_the_workers_idle_fraction_is_their_unsampled_share_of_the_wall_clock_between_collects(monkeypatch):
    """cluster/worker_idle_frac: 2 workers sent a rollout at t = 0 and sampled 5 s each by its collect at t = 10
    (idle 0.5); the next, 18 s of sampling in all, collected at t = 30 (1 - 18 / (2 x 20) = 0.55)."""
    from sparserl.cluster import pool as pool_module
    from sparserl.cluster.pool import PendingRollout, RolloutPool

    clock = iter([0.0, 10.0, 12.0, 30.0])
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: next(clock))
    pool = object.__new__(RolloutPool)  # the accounting alone: no Ray, no workers
    pool._collected_at, pool.idle_fraction = None, 0.0
    shards = [(0, range(0, 1)), (1, range(1, 2))]
    first = PendingRollout([], None, None, None, 1, shards)  # sent at t = 0
    pool._account_idle(first, 10.0)
    assert pool.idle_fraction == pytest.approx(0.5)
    second = PendingRollout([], None, None, None, 1, shards)  # sent at t = 12; the window starts at the last collect
    pool._account_idle(second, 18.0)
    assert pool.idle_fraction == pytest.approx(0.55)
