"""The rollout pool's side of ``rollout.join_rollouts`` (:mod:`sparserl.cluster.pool`): a joined rollout is started
once (no segment sent after a push) and taken at its collect; a worker that dies is replaced by one that runs the
calls again in the order sent, each start for the decode steps it ran the first time, and the take of a rollout
collected since as that many decode steps, so that the rollouts still in flight are sampled as they were. Tested
on the pool's bookkeeping with fake actors (no Ray processes)."""

from __future__ import annotations

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from sparserl.cluster import pool as pool_module  # noqa: E402  (only once ray imports: importorskip above)
from sparserl.cluster.pool import RolloutPool  # noqa: E402
from sparserl.rollout.sampling import SamplingParams  # noqa: E402

PARAMS = SamplingParams(n=2, max_new_tokens=24)


class Died(ray_exceptions.RayActorError):
    def __init__(self):
        Exception.__init__(self, "the actor died unexpectedly before finishing this task")


class Ref:
    def __init__(self, value=None, dies: bool = False):
        self.value, self.dies = value, dies


class Out:
    """A joined rollout's fake output: its name, and the decode steps its take ran."""

    seconds = 0.0

    def __init__(self, name, stream_steps: int):
        self.name, self.stream_steps = name, stream_steps


class Method:
    def __init__(self, fn):
        self.remote = fn


class FakeWorker:
    """Records every call as (actor, method, arguments); a start runs ``ran[key]`` decode steps (or ``steps`` when
    exact); a take runs ``take_steps[key]``; the first actor's calls named in ``doomed`` ((method, key)) die."""

    def __init__(self, log: list, actor: int, doomed: set, ran: dict, take_steps: dict):
        self.load_weights = Method(lambda weights, version: self._call(log, actor, doomed, ("load", version)))
        self.start = Method(
            lambda key, prompts, params, first, version, schedule, steps, read, exact: self._call(
                log, actor, doomed, ("start", key, version, steps, exact), steps if exact else ran[key]
            )
        )
        self.take = Method(
            lambda key, version: self._call(
                log, actor, doomed, ("take", key, version), Out(key, take_steps.get(key, 0))
            )
        )
        self.run = Method(
            lambda version, steps: self._call(
                log, actor, doomed, ("run", version, steps), steps if steps is not None else ran["run"]
            )
        )

    @staticmethod
    def _call(log, actor, doomed, call, value=None):
        log.append((actor, *call))
        return Ref(value, dies=actor == 0 and call[:2] in doomed)


def fake_get(ref, timeout=None):
    if ref.dies:
        raise Died()
    return ref.value


def _pool(monkeypatch, doomed: set, ran: dict, take_steps: dict) -> tuple[RolloutPool, list]:
    import ray

    monkeypatch.setattr(ray, "get", fake_get)
    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(pool_module, "stop_actors", lambda actors, shutdown_ray: None)
    monkeypatch.setattr(pool_module, "merge_shards", lambda outs, shards: outs)
    log: list = []
    actors = []
    pool = RolloutPool.__new__(RolloutPool)
    pool.cfg, pool.log = None, lambda line: None

    def new_actor(cfg, k):
        actors.append(k)
        return FakeWorker(log, len(actors) - 1, doomed, ran, take_steps)

    pool._actor = Method(new_actor)
    pool.workers = [pool._actor.remote(None, 0)]
    pool._start_bookkeeping(max_staleness=2, join=True)
    pool.update_weights({})
    return pool, log


def test_a_joined_rollout_is_started_once_and_taken_at_its_collect(monkeypatch):
    pool, log = _pool(monkeypatch, set(), {1: 12, 2: 12}, {})
    a = pool.submit(["p"], PARAMS, segments=2)
    pool.update_weights({}, wait=False)
    pool.continue_partial()  # nothing to send: the rollout goes on in the batch of the next one
    b = pool.submit(["q"], PARAMS, segments=2)
    assert [out.name for out in pool.collect(a)] == [1]
    assert [call[1:] for call in log] == [
        ("load", 1),
        ("start", 1, 1, 12, False),  # ⌈24 / 2⌉ decode steps at least
        ("load", 2),
        ("start", 2, 2, 12, False),
        ("take", 1, 2),
    ]
    assert b.joined and not b.continuations


def test_a_replacement_runs_each_start_for_its_steps_and_a_collected_take_as_decode_steps(monkeypatch):
    """Rollout 1 started with push 1 (12 steps), rollout 2 with push 2 (ran 15: until 1 ended), 1 taken (its take ran
    4 steps: the worker had it run beside 2), rollout 3 started with push 3; the worker dies in 2's take. Its
    replacement loads push 2, starts 2 for exactly 15 steps, loads push 3... in the order they were sent: 1's take
    as 4 decode steps with push 2 (2's rows ran them), 3's start, then 2's take again."""
    pool, log = _pool(monkeypatch, {("take", 2)}, {1: 12, 2: 15, 3: 12}, {1: 4})
    first = pool.submit(["p"], PARAMS, segments=2)
    pool.update_weights({}, wait=False)
    second = pool.submit(["q"], PARAMS, segments=2)
    assert [out.name for out in pool.collect(first)] == [1]
    pool.update_weights({}, wait=False)
    pool.submit(["r"], PARAMS, segments=2)
    out = pool.collect(second)
    assert pool.restarts == 1 and [o.name for o in out] == [2]
    replay = [call[1:] for call in log if call[0] == 1]
    assert replay == [
        ("load", 2),
        ("start", 2, 2, 15, True),  # the steps it ran, exactly
        ("run", 2, 4),  # rollout 1's take: collected, its decode steps run again for rollout 2's rows
        ("load", 3),
        ("start", 3, 3, 12, True),
        ("take", 2, 3),
        ("load", 3),
    ]


def test_with_no_start_after_them_the_joined_rollouts_run_to_their_end_and_a_replay_runs_as_many_steps(monkeypatch):
    """The run's last steps send no rollout: ``finish_joined`` has the worker run the rollouts in flight to their
    ends with the latest push (9 decode steps here), not at their collect; a replacement after a death in the take
    runs those 9 steps again, then takes."""
    pool, log = _pool(monkeypatch, {("take", 1)}, {1: 12, "run": 9}, {})
    first = pool.submit(["p"], PARAMS, segments=2)
    pool.update_weights({}, wait=False)
    pool.finish_joined()
    assert [out.name for out in pool.collect(first)] == [1]
    assert [call[1:] for call in log if call[0] == 0] == [
        ("load", 1),
        ("start", 1, 1, 12, False),
        ("load", 2),
        ("run", 2, None),  # every rollout in flight to its end
        ("take", 1, 2),
    ]
    assert [call[1:] for call in log if call[0] == 1] == [
        ("load", 1),
        ("start", 1, 1, 12, True),
        ("load", 2),
        ("run", 2, 9),
        ("take", 1, 2),
        ("load", 2),
    ]
    pool.finish_joined()  # nothing in flight: nothing sent
    assert len([call for call in log if call[1] == "run"]) == 2
