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
        self.version, self.sent, self.outstanding, self.segments = 1, [], 0, []

    def submit(self, prompts, params, schedule, read, segments=1):
        self.sent.append((params.seed, self.version, tuple(prompts)))
        self.segments.append(segments)
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
    trainer = SimpleNamespace(cfg=cfg, pool=FakePool(), pending=deque(), data=data, engine=engine, learner=None)
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
    "k, every, lags",  # rollout.partial off: every rollout in one segment
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
    assert seeds == sorted(seeds) and len(seeds) == 7 and set(pool.segments) == {1}
    assert prompts == [f"draw {i}" for i in range(7)]


@pytest.mark.parametrize(
    "k, every, segments",
    [
        (0, 0, [1] * 7),  # no rollout spans a push: partial rollouts change nothing
        (1, 0, [1] * 7),
        (2, 0, [1, 1, 2, 2, 2, 2, 2]),  # sent two steps ahead: a segment before the push between, one after
        (3, 0, [1, 1, 2, 3, 3, 3, 3]),
        (3, 4, [1, 1, 2, 3, 1, 1, 2]),  # in sending order; step 5 (after the checkpoint) is sent when it starts
    ],
)
def test_a_partial_rollout_has_one_segment_per_push_it_spans(k, every, segments):
    """rollout.partial: a rollout sent j steps ahead is cut into j segments (one with the weights it was sent
    with, one after each push before the step that takes it, but the last push's); lags as without it."""
    extra = ("rollout.partial=true", "mismatch.alpha_q=kept")
    lags, pool, _ = run(7, f"rollout.max_staleness={k}", f"checkpoint.every={every}", *extra)
    assert pool.segments == segments
    assert lags == run(7, f"rollout.max_staleness={k}", f"checkpoint.every={every}")[0]


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
    pool._start_bookkeeping(max_staleness=1)
    shards = [(0, range(0, 1)), (1, range(1, 2))]
    first = PendingRollout([], None, None, None, 1, shards)  # sent at t = 0
    pool._account_idle(first, 10.0)
    assert pool.idle_fraction == pytest.approx(0.5)
    second = PendingRollout([], None, None, None, 1, shards)  # sent at t = 12; the window starts at the last collect
    pool._account_idle(second, 18.0)
    assert pool.idle_fraction == pytest.approx(0.55)


def test_tokens_older_than_partial_max_lag_leave_the_loss_and_are_counted():
    """rollout.partial_max_lag=1: of 2 responses (5 and 3 tokens), the tokens drawn 2 pushes before the update are
    masked out of the corrections' mask (the loss's) and counted: 3 of 8."""
    import torch

    from sparserl import runlog as names
    from sparserl.batch import RolloutBatch
    from sparserl.train.step import corrections_and_advantages

    cfg = validate(
        load_config(
            "default",
            [
                *WORKERS,
                "rollout.partial=true",
                "rollout.max_staleness=2",
                "rollout.partial_max_lag=1",
                "algorithm.correction=none",
                "rollout.n=2",
            ],  # fmt: skip
        )
    )
    batch = RolloutBatch.from_rollout([[5, 6], [5, 6]], [[1, 2, 3, 4, 5], [1, 2, 3]], [[-1.0] * 5, [-1.0] * 3], [0, 0])
    batch.rewards, batch.truncated = torch.tensor([1.0, 0.0]), torch.tensor([False, False])
    batch.old_logprobs = batch.sampler_logprobs.clone()
    batch.token_lag = torch.tensor([[2.0, 2.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, 0.0, 0.0]])
    corr = corrections_and_advantages(cfg, batch)
    assert corr.mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert corr.metrics[names.ROLLOUT_STALE_MASKED] == pytest.approx(3 / 8)
    cfg.rollout.partial_max_lag = None
    assert corrections_and_advantages(cfg, batch).mask.tolist() == batch.response_mask.tolist()


def test_a_worker_killed_by_rays_memory_monitor_stops_the_step_with_the_keys_that_lower_memory(monkeypatch):
    """Ray's memory monitor killed a worker (the machine's memory nearly full): no replacement (it would fill the
    same memory), one error naming the keys that hold memory on the workers."""
    import ray
    from ray.exceptions import OutOfMemoryError

    from sparserl.cluster.pool import ClusterError, RolloutPool

    def full(ref):
        raise OutOfMemoryError("node memory 95%")

    monkeypatch.setattr(ray, "get", full)
    pool = object.__new__(RolloutPool)
    pool._start_bookkeeping(max_staleness=2)
    pool._replace = lambda k: pytest.fail("a worker killed for memory is not replaced")
    with pytest.raises(ClusterError, match="memory monitor .*rollout.max_staleness.*rollout.partial=false"):
        pool._get(0, lambda: object(), "prompts 0-3")
