"""The rollout pool's fault rule (:mod:`sparserl.cluster.pool`): a shard whose worker dies is run again on
a new worker; :data:`~sparserl.cluster.pool.MAX_ATTEMPTS` (3) deaths in a row for one piece of work stop
the run with a :class:`~sparserl.cluster.pool.ClusterError` naming the worker, and fewer deaths followed by
a success do not. Tested on the pool's bookkeeping with fake actors (no Ray processes): ``ray.get`` of a
dead actor's call raises Ray's own ``RayActorError``, as it does when a worker is killed."""

from __future__ import annotations

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from sparserl.cluster import pool as pool_module  # noqa: E402  (only once ray imports: importorskip above)
from sparserl.cluster.pool import MAX_ATTEMPTS, ClusterError, RolloutPool  # noqa: E402  (only once ray imports: importorskip above)


class Died(ray_exceptions.RayActorError):
    """What ``ray.get`` raises for a call whose actor died."""

    def __init__(self):
        Exception.__init__(self, "the actor died unexpectedly before finishing this task")


class Out(str):
    """A shard's fake output: its text, and the seconds it sampled (the pool's idle accounting reads them)."""

    seconds = 0.0


class Ref:
    """A fake object ref: ``ray.get`` raises :class:`Died` when its call is scripted to die, else returns ``value``."""

    def __init__(self, dies: bool, value=None):
        self.dies, self.value = dies, value


class Script:
    """How many of worker 0's ``generate`` calls die before one succeeds (counted over the actors that take
    its place); the other workers' calls succeed."""

    def __init__(self, deaths: int):
        self.deaths, self.calls, self.actors = deaths, [], 0

    def dies(self, k: int) -> bool:
        return k == 0 and sum(1 for w, *_ in self.calls if w == 0) < self.deaths


class Method:
    def __init__(self, fn):
        self.remote = fn


class FakeWorker:
    """A rollout worker's two methods the pool calls: ``load_weights`` always succeeds; ``generate`` dies
    while the script has deaths left."""

    def __init__(self, script: Script, k: int):
        script.actors += 1
        self.k = k

        def generate(prompts, params, first, version, schedule, read_dense_cache):
            dies = script.dies(self.k)
            script.calls.append((self.k, first, version, dies))
            return Ref(dies, value=Out(f"worker {self.k}: prompts {first}-{first + len(prompts) - 1}"))

        self.generate = Method(generate)
        self.load_weights = Method(lambda weights, version: Ref(False))


def fake_get(ref):
    if ref.dies:
        raise Died()
    return ref.value


def fake_pool(script: Script, workers: int, monkeypatch) -> RolloutPool:
    """A RolloutPool with ``workers`` fake actors and one weight push made (no Ray)."""
    import ray

    monkeypatch.setattr(ray, "get", fake_get)
    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(pool_module, "stop_actors", lambda actors, shutdown_ray: None)
    monkeypatch.setattr(pool_module, "merge_shards", lambda outs, shards: outs)
    pool = RolloutPool.__new__(RolloutPool)
    pool.cfg, pool.log, pool.logged = None, None, []
    pool.log = pool.logged.append
    pool._actor = Method(lambda cfg, k: FakeWorker(script, k))
    pool.workers = [pool._actor.remote(None, k) for k in range(workers)]
    pool._start_bookkeeping(max_staleness=1)
    pool.update_weights({})
    return pool


def test_three_deaths_in_a_row_stop_the_run_with_the_pools_error(monkeypatch):
    script = Script(deaths=MAX_ATTEMPTS)
    pool = fake_pool(script, workers=1, monkeypatch=monkeypatch)
    with pytest.raises(ClusterError, match=rf"rollout worker 0 died {MAX_ATTEMPTS} times in a row \(prompts 0-3\)"):
        pool.generate(["a", "b", "c", "d"], params=None)
    assert [dies for *_, dies in script.calls] == [True] * MAX_ATTEMPTS  # no fourth try
    assert pool.restarts == MAX_ATTEMPTS - 1 and script.actors == MAX_ATTEMPTS


@pytest.mark.parametrize("deaths", range(MAX_ATTEMPTS))
def test_fewer_deaths_then_a_success_do_not_stop_it(monkeypatch, deaths):
    script = Script(deaths=deaths)
    pool = fake_pool(script, workers=2, monkeypatch=monkeypatch)
    outs = pool.generate(["a", "b", "c", "d"], params=None)
    assert outs == ["worker 0: prompts 0-1", "worker 1: prompts 2-3"]  # every shard's output, in order
    assert pool.restarts == deaths and script.actors == 2 + deaths
    assert [k for k, _, _, dies in script.calls if dies] == [0] * deaths  # worker 0's shard, run again
    assert len(pool.logged) == deaths and all("rollout worker 0 died" in line for line in pool.logged)


def test_the_count_is_per_piece_of_work_not_per_run(monkeypatch):
    """Two deaths in one step, then two in the next: neither step reaches three in a row, the run goes on."""
    script = Script(deaths=2)
    pool = fake_pool(script, workers=1, monkeypatch=monkeypatch)
    assert pool.generate(["a"], params=None) == ["worker 0: prompts 0-0"]
    script.deaths = len(script.calls) + 2  # the next two calls die
    assert pool.generate(["a"], params=None) == ["worker 0: prompts 0-0"]
    assert pool.restarts == 4
