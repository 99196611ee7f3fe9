"""Scaling out on Ray (issue 31): the sharding rule, rollout workers that sample what one engine samples,
the weight push reaching every worker, a killed worker replaced with no sample lost, a training step on
workers equal to the single-process step, and the cluster options' bad inputs.

One local Ray for the module (num_cpus=2, the cores; each actor asks for half a CPU): the pools find it
running and leave it so."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import time

import pytest
import torch

from sparserl.cluster import shard_prompts

ray = pytest.importorskip("ray")

PROMPTS = ["hello there", "What is 3 + 4?", "one two three", "Tell me a story.", "What is 2 + 2?"]


def test_shards_are_contiguous_balanced_and_cover_every_prompt():
    for n_prompts in range(0, 12):
        for n_workers in range(1, 6):
            shards = shard_prompts(n_prompts, n_workers)
            assert len(shards) == n_workers
            assert [i for s in shards for i in s] == list(range(n_prompts))
            sizes = [len(s) for s in shards]
            assert max(sizes) - min(sizes) <= 1
    assert shard_prompts(5, 2) == [range(0, 2), range(2, 5)]
    with pytest.raises(ValueError, match="n_workers"):
        shard_prompts(4, 0)


def test_the_training_process_leaves_the_cores_of_the_actors_computing_beside_it(monkeypatch):
    from sparserl.cluster.pool import training_threads
    from sparserl.config import ClusterConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cluster = ClusterConfig(rollout_workers=2, worker_cpus=1.0, learners=3, learner_cpus=2.0)
    assert training_threads(cluster, async_rollouts=False, updating=False) is None  # workers wait for it
    assert training_threads(cluster, async_rollouts=True, updating=False) == 6  # workers sample beside it
    assert training_threads(cluster, async_rollouts=False, updating=True) == 4  # two other learners update
    assert training_threads(cluster, async_rollouts=True, updating=True) == 2
    assert training_threads(ClusterConfig(rollout_workers=9, worker_cpus=1.5), True, False) == 1
    assert training_threads(ClusterConfig(rollout_workers=2, address="auto"), True, True) is None  # elsewhere


def _cfg(tmp_path, *extra):
    from test_train import TINY

    from sparserl.config import load_config, validate

    return validate(load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", *HALF_CPU, *extra]))


HALF_CPU = ("cluster.worker_cpus=0.5", "cluster.learner_cpus=0.5")  # 2 workers and a second learner on 2 CPUs


def test_a_worker_without_ray_samples_its_shard_as_the_engine_does(tmp_path, tiny, monkeypatch):
    """The worker class itself: the trainer's builder, the pushed weights, the global rows of its shard."""
    from sparserl.cluster.worker import RolloutWorker, WorkerStateError
    from sparserl.rollout.build import engine_from_fields
    from sparserl.rollout.sampling import SamplingParams

    cfg = _cfg(tmp_path)
    worker = RolloutWorker(cfg, 0)
    params = SamplingParams(n=3, max_new_tokens=12, seed=5)
    with pytest.raises(WorkerStateError, match="push -1"):
        worker.generate(PROMPTS[2:], params, 2, version=1)
    worker.load_weights(tiny.model.state_dict(), 1)
    whole = engine_from_fields(tiny, cfg.rollout).generate(PROMPTS, params)
    shard = worker.generate(PROMPTS[2:], params, 2, version=1)
    assert shard.response_ids == whole.response_ids[6:]
    assert worker.info()["index"] == 0 and worker.info()["pid"] == os.getpid()
    # q kept for the exact α travels at its own size: the engine's per-response views of one buffer would
    # each pickle the whole buffer (9 responses: 9x; on the default job 32 x 288 MiB, which a node ran out of)
    kept = worker.generate(PROMPTS[2:], dataclasses.replace(params, keep_distributions=True), 2, version=1)
    assert kept.response_ids == shard.response_ids and len(kept.distributions) == 9
    nbytes = sum(d.numel() * d.element_size() for d in kept.distributions)
    assert len(pickle.dumps(kept.distributions)) < 1.1 * nbytes + 65536
    # the dense cache's reading keeps the learner's token bound per micro-batch (its logits: [rows, T, V] float32)
    import sparserl.mismatch.teacher_forced as teacher_forced

    bounds = []
    read = teacher_forced.read_dense_cache
    monkeypatch.setattr(teacher_forced, "read_dense_cache", lambda *a: bounds.append(a[-1]) or read(*a))
    worker.generate(PROMPTS[2:], params, 2, version=1, read_dense_cache=0)
    assert bounds == [cfg.train.max_tokens_per_micro_batch] and bounds[0] is not None


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def _same_samples(a, b, tol=1e-5):
    assert a.prompt_index == b.prompt_index and a.prompt_ids == b.prompt_ids
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert len(x) == len(y) and (not x or (torch.tensor(x) - torch.tensor(y)).abs().max() <= tol)


def test_workers_sample_what_one_engine_samples_and_get_every_push(tmp_path, tiny, local_ray):
    from sparserl.cluster.pool import RolloutPool
    from sparserl.rollout.build import engine_from_fields
    from sparserl.rollout.sampling import SamplingParams

    cfg = _cfg(tmp_path, "cluster.rollout_workers=2", "train.prompts_per_step=5")
    model = tiny.model
    engine = engine_from_fields(tiny, cfg.rollout)
    pool = RolloutPool(cfg, model, log=lambda *_: None)
    try:
        infos = pool.info()
        assert [i["index"] for i in infos] == [0, 1] and len({i["pid"] for i in infos}) == 2
        assert all(i["pid"] != os.getpid() for i in infos)
        params = SamplingParams(n=3, max_new_tokens=12, seed=9)
        ref = engine.generate(PROMPTS, params)
        got = pool.generate(PROMPTS, params)
        _same_samples(got, ref)
        assert got.kv.compressions == ref.kv.compressions and got.tokens_generated == ref.tokens_generated
        # the push reaches every worker: changed weights change their log-probs, to the engine's new ones
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["model.norm.weight"] *= 1.5  # sharper logits everywhere
        pool.update_weights(state)
        engine.update_weights(state)
        assert pool.version == 2
        forced = pool.generate(PROMPTS, params)
        _same_samples(forced, engine.generate(PROMPTS, params))
        assert forced.sampler_logprobs != got.sampler_logprobs
        # the controller's schedule travels with the step
        from sparserl.rollout.kv.schedule import KVSchedule

        schedule = KVSchedule.from_pairs([[0, 6], [16, 10]])
        engine.compressor.set_schedule(schedule)
        _same_samples(pool.generate(PROMPTS, params, schedule), engine.generate(PROMPTS, params))
    finally:
        pool.close()
    assert ray.is_initialized()  # the module's Ray: the pool did not start it, so it leaves it running


def test_a_killed_worker_is_replaced_and_its_prompts_run_again(tmp_path, tiny, local_ray):
    from sparserl.cluster.pool import RolloutPool
    from sparserl.rollout.build import engine_from_fields
    from sparserl.rollout.sampling import SamplingParams

    cfg = _cfg(tmp_path, "cluster.rollout_workers=2", "train.prompts_per_step=5")
    messages = []
    pool = RolloutPool(cfg, tiny.model, log=messages.append)
    try:
        params = SamplingParams(n=2, max_new_tokens=10, seed=4)
        ref = engine_from_fields(tiny, cfg.rollout).generate(PROMPTS, params)
        victim = pool.info()[1]["pid"]
        os.kill(victim, signal.SIGKILL)  # kill -9, between steps: the next step finds it dead
        _same_samples(pool.generate(PROMPTS, params), ref)
        assert pool.restarts == 1 and any("rollout worker 1 died" in m for m in messages)
        assert pool.info()[1]["pid"] != victim
        # and mid-step: killed while its shard is being sampled
        victim = pool.info()[0]["pid"]
        slow = SamplingParams(n=2, max_new_tokens=400, seed=4, ignore_eos=True)  # a shard takes well over 50 ms
        ref = engine_from_fields(tiny, cfg.rollout).generate(PROMPTS, slow)
        import threading

        threading.Timer(0.05, os.kill, (victim, signal.SIGKILL)).start()
        _same_samples(pool.generate(PROMPTS, slow), ref)
        assert pool.restarts == 2
    finally:
        pool.close()


def test_a_training_step_on_workers_and_learners_equals_the_single_process_step(tmp_path, local_ray):
    """cluster.rollout_workers=2, then also cluster.learners=2: the same first-step metrics and the same
    weights after the step as one process; the peer learner holds the same weights as the driver."""
    from sparserl import runlog as names
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    out, weights = {}, {}
    for label, extra in (
        ("one", ()),
        ("workers", ("cluster.rollout_workers=2",)),
        ("learners", ("cluster.rollout_workers=2", "cluster.learners=2")),
    ):
        cfg = _cfg(tmp_path / label, "mismatch.alpha=exact", *extra)
        trainer = build_trainer(cfg)
        try:
            out[label] = train_step(trainer, 1)
            assert names.MISMATCH_REPLAY_ERR not in out[label]  # q kept by the sampler(s): nothing replayed
            if label != "one":  # the workers sent q back: the sampler here never loaded the weights
                assert trainer.engine_stale
            weights[label] = {k: v.clone() for k, v in trainer.learner.state_dict().items()}
            if trainer.learners is not None:
                peer = ray.get(trainer.learners.peers[0].state.remote())
                assert all(torch.equal(peer[k], weights[label][k]) for k in peer)  # replicas stay equal
        finally:
            close_cluster(trainer)
    for label in ("workers", "learners"):
        for key in (
            names.REWARD_MEAN,
            names.LENGTH_MEAN,
            names.MISMATCH_K3,
            names.MISMATCH_ALPHA_MEAN,
            names.POLICY_LOSS,
            names.GRAD_NORM,
            names.ENTROPY,
        ):
            assert out[label][key] == pytest.approx(out["one"][key], rel=1e-4, abs=1e-6), (label, key)
        _same_weights(weights[label], weights["one"])
    assert out["workers"][names.CLUSTER_WORKER_RESTARTS] == 0 and names.CLUSTER_WORKER_RESTARTS not in out["one"]


def test_dynamic_sampling_on_workers_samples_what_one_process_samples(tmp_path, local_ray):
    """algorithm.filter_groups with cluster.rollout_workers=2: each further batch is one more call on the
    workers, and the step draws, keeps and trains on what one process does."""
    from sparserl import runlog as names
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    out = {}
    for label, extra in (("one", ()), ("workers", ("cluster.rollout_workers=2",))):
        cfg = _cfg(
            tmp_path / label,
            "algorithm.filter_groups=true",
            "algorithm.max_gen_batches=3",
            "rollout.n=2",
            "mismatch.alpha=off",
            *extra,
        )
        trainer = build_trainer(cfg)
        try:
            out[label] = train_step(trainer, 1)
        finally:
            close_cluster(trainer)
    assert out["one"][names.GEN_BATCHES] >= 2  # it did sample further batches
    for key in (
        names.GEN_BATCHES,
        names.INFORMATIVE_GROUPS,
        names.REWARD_MEAN,
        names.REWARD_MEAN_KEPT,
        names.LENGTH_MEAN,
        names.POLICY_LOSS,
        names.GRAD_NORM,
    ):
        assert out["workers"][key] == pytest.approx(out["one"][key], rel=1e-4, abs=1e-6), key


def test_oversampling_and_the_dense_fallback_on_workers_do_what_one_process_does(tmp_path, local_ray):
    """rollout.oversample=4 of rollout.n=2 and rollout.dense_fallback with a reward that pays nothing (every group
    falls back): on 2 workers the step samples, re-samples densely here, keeps and measures what one process does
    (the dense responses numbered with the workers' push, α from the kept head inputs)."""
    from sparserl import runlog as names
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    out = {}
    for label, extra in (("one", ()), ("workers", ("cluster.rollout_workers=2",))):
        cfg = _cfg(
            tmp_path / label,
            "rollout.n=2",
            "rollout.oversample=4",
            "rollout.dense_fallback=true",
            "reward.fn=test_dense_fallback:zero",
            "mismatch.alpha=exact",
            *extra,
        )
        trainer = build_trainer(cfg)
        try:
            out[label] = train_step(trainer, 1)
        finally:
            close_cluster(trainer)
    assert out["one"][names.DENSE_FALLBACK_FRAC] == 1.0
    for key in (
        names.DENSE_FALLBACK_FRAC,
        names.OVERSAMPLE_ACCEPT_KEPT,
        names.OVERSAMPLE_ACCEPT_DROPPED,
        names.LENGTH_MEAN,
        names.MISMATCH_ALPHA_MEAN,
        names.MISMATCH_K3,
    ):
        assert out["workers"][key] == pytest.approx(out["one"][key], rel=1e-4, abs=1e-6), key


def _same_weights(got: dict, ref: dict) -> None:
    """AdamW's first step moves each weight by lr·g/|g|: where a gradient is ~0, the float rounding of other
    batch shapes (or of a sum over learners) can flip its sign (3 of 6.4M weights with 2 workers). Every
    other weight is equal to 1e-6; other samples (another seed) would move most of them differently."""
    lr = 1e-3
    moved = sum(int(((got[k] - ref[k]).abs() > 1e-6).sum()) for k in ref)
    total = sum(v.numel() for v in ref.values())
    assert moved <= 1e-5 * total, (moved, total)
    for k in ref:
        assert (got[k] - ref[k]).abs().max() <= 2 * lr + 1e-6, k


def test_a_learner_that_dies_stops_the_step_with_an_error_naming_it(tmp_path, local_ray):
    from sparserl.train.data_parallel import LearnerError
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    trainer = build_trainer(_cfg(tmp_path, "cluster.learners=2", "mismatch.alpha=off"))
    try:
        os.kill(ray.get(trainer.learners.peers[0].pid.remote()), signal.SIGKILL)
        start = time.perf_counter()
        with pytest.raises(LearnerError, match="learner 1 of 2 died.*--resume"):
            train_step(trainer, 1)
        assert time.perf_counter() - start < 60
    finally:
        close_cluster(trainer)


def _record_collects(trainer) -> list:
    """Wraps the trainer's pool: each collected rollout recorded as (prompts, output) in the list returned."""
    collected, collect = [], trainer.pool.collect

    def collect_and_record(pending):
        collected.append((pending.prompts, collect(pending)))
        return collected[-1][1]

    trainer.pool.collect = collect_and_record
    return collected


def _kill_worker_0_once_step_2_is_sent(trainer) -> list:
    """:func:`_record_collects`, and worker 0 killed with SIGKILL right after the first rollout sent once step 1's
    is collected (step 2's)."""
    collected, victim, killed = _record_collects(trainer), trainer.pool.info()[0]["pid"], []
    submit = trainer.pool.submit

    def submit_then_kill(*args):
        pending = submit(*args)
        if len(collected) == 1 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
        return pending

    trainer.pool.submit = submit_then_kill
    return collected


def test_async_rollouts_lag_one_step_split_the_mismatch_and_survive_a_killed_worker(tmp_path, tiny, local_ray):
    """rollout.async: step 1 samples with the first weights (lag 0); step 2's rollout, sent before step 1's
    update, is what the first weights sample for step 2's prompts (lag 1), even though a worker is killed
    while it samples; the learner scores the old policy itself; the lag shows in k3 and α's lag parts."""
    from sparserl import runlog as names
    from sparserl.rollout.build import engine_from_fields
    from sparserl.train.trainer import build_trainer, close_cluster, sampling_params, train_step

    cfg = _cfg(
        tmp_path,
        "cluster.rollout_workers=2",
        "rollout.async=true",
        "mismatch.alpha=topk",
        "checkpoint.every=0",
        "train.steps=3",
        "rollout.max_new_tokens=48",
    )
    first = engine_from_fields(tiny, cfg.rollout)  # the weights before any update
    trainer = build_trainer(cfg)
    metrics, victim = [], trainer.pool.info()[0]["pid"]
    collected = _kill_worker_0_once_step_2_is_sent(trainer)
    try:
        assert trainer.old_policy.kind == "score"
        metrics.append(train_step(trainer, 1))
        assert [(step, p.version) for step, _, p in trainer.pending] == [(2, 1)]  # step 2's, sent before the update
        metrics.append(train_step(trainer, 2))
        metrics.append(train_step(trainer, 3))
        assert not trainer.pending  # nothing sent past the last step
        assert trainer.pool.restarts == 1 and trainer.pool.info()[0]["pid"] != victim
    finally:
        close_cluster(trainer)
    prompts, ro = collected[1]
    expected = first.generate(prompts, sampling_params(cfg, 2))
    _same_samples(ro, expected)
    assert [m[names.MISMATCH_POLICY_LAG] for m in metrics] == [0, 1, 1]
    assert [m[names.CLUSTER_WORKER_RESTARTS] for m in metrics] == [0, 1, 1]
    # step 1: the sampler's weights are the learner's (float32, a dense cache): no lag, the cache's k3 alone
    assert metrics[0][names.MISMATCH_K3_LAG] < 1e-6 < metrics[0][names.MISMATCH_K3_CACHE]
    for m in metrics[1:]:  # a step of lag (lr 1e-3 on a random model) is now most of it
        assert m[names.MISMATCH_K3_LAG] > 100 * metrics[0][names.MISMATCH_K3_LAG] + 1e-5
        assert m[names.MISMATCH_ALPHA_LAG_MEAN] < metrics[0][names.MISMATCH_ALPHA_LAG_MEAN]
    for m in metrics:
        assert 0 < m[names.MISMATCH_ALPHA_CACHE_P5] <= m[names.MISMATCH_ALPHA_CACHE_MEAN] <= 1
        assert m[names.TIME_GENERATE] > 0


def test_k_step_async_samples_k_steps_ahead_and_a_killed_worker_reruns_all_it_held(tmp_path, tiny, local_ray):
    """rollout.max_staleness=2: steps 2 and 3 are both sent during step 1, so the first weights sample steps 1-3
    (lags 0, 1, 2, then 2); worker 0 is killed while it holds both, and its replacement samples both again
    with the weights each was sent with: what the first weights sample for those steps' prompts."""
    from sparserl import runlog as names
    from sparserl.rollout.build import engine_from_fields
    from sparserl.train.trainer import build_trainer, close_cluster, sampling_params, train_step

    cfg = _cfg(
        tmp_path,
        "cluster.rollout_workers=2",
        "rollout.async=true",
        "rollout.max_staleness=2",
        "mismatch.alpha=topk",
        "checkpoint.every=0",
        "train.steps=4",
        "rollout.max_new_tokens=32",
    )
    first = engine_from_fields(tiny, cfg.rollout)  # the weights before any update
    trainer = build_trainer(cfg)
    metrics, victim = [], trainer.pool.info()[0]["pid"]
    collected = _kill_worker_0_once_step_2_is_sent(trainer)  # step 3's rollout then goes to the dead worker
    try:
        metrics.append(train_step(trainer, 1))
        assert [(step, p.version) for step, _, p in trainer.pending] == [(2, 1), (3, 1)]
        for step in (2, 3, 4):
            metrics.append(train_step(trainer, step))
            assert len(trainer.pending) <= 2
        assert not trainer.pending and trainer.pool.restarts == 1 and trainer.pool.info()[0]["pid"] != victim
    finally:
        close_cluster(trainer)
    for step in (2, 3):
        prompts, ro = collected[step - 1]
        _same_samples(ro, first.generate(prompts, sampling_params(cfg, step)))
    assert [m[names.MISMATCH_POLICY_LAG] for m in metrics] == [0, 1, 2, 2]
    assert all(0 <= m[names.CLUSTER_WORKER_IDLE] < 1 and m[names.RESPONSES_PER_S] > 0 for m in metrics)
    assert metrics[3][names.MISMATCH_K3_LAG] > metrics[1][names.MISMATCH_K3_LAG]  # two pushes of lag: more of it


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_worker_continues_a_partial_rollout_with_the_weights_loaded_between_segments(tmp_path, tiny, kv):
    """The worker's side of rollout.partial, without Ray: ``start`` samples 5 decode steps with push 1 and keeps
    the rollout; after push 2 loads, ``advance`` takes it to its end: tokens 0-5 drawn by push 1, the rest by push
    2 (rollout.partial_kv=recompute: token 5's logits recomputed with push 2 too); a call with a push the worker
    does not hold is refused."""
    from sparserl.cluster.worker import RolloutWorker, WorkerStateError
    from sparserl.rollout.sampling import SamplingParams

    cfg = _cfg(tmp_path, "cluster.rollout_workers=1", "rollout.async=true", "rollout.max_staleness=2")
    cfg.rollout.partial, cfg.rollout.partial_kv = True, kv
    worker = RolloutWorker(cfg, 0)
    worker.load_weights(tiny.model.state_dict(), 1)
    params = SamplingParams(n=2, max_new_tokens=16, seed=3, ignore_eos=True)
    assert worker.start("a", PROMPTS[:2], params, 0, 1, steps=5) is None
    with pytest.raises(WorkerStateError, match="push 1, asked to sample with push 2"):
        worker.advance("a", 2, None)
    worker.load_weights({k: v * 1.1 for k, v in tiny.model.state_dict().items()}, 2)
    assert worker._partial["a"][0].recomputes == 0
    out = worker.advance("a", 2, None)
    assert out.weights_version == 1 and len(out.response_ids) == 4  # the push it was started with
    first = 5 if kv == "recompute" else 6
    assert out.token_versions == [[1] * first + [2] * (16 - first)] * 4
    assert not worker._partial  # handed back: nothing kept


def test_a_worker_joins_the_rollouts_in_flight_in_one_batch(tmp_path, tiny):
    """rollout.join_rollouts on the worker, without Ray: "a" starts with push 1 and runs 5 decode steps (nothing
    started before it); "b" starts after push 2 and the batch runs until "a" has ended (11 more steps, tokens 6-15
    drawn by push 2); "a" is then read and kept until taken, numbered with the push it was started with; "b" is run
    to its end by its take (5 steps)."""
    import dataclasses

    from sparserl.cluster.worker import RolloutWorker
    from sparserl.rollout.sampling import SamplingParams

    cfg = _cfg(tmp_path, "cluster.rollout_workers=1", "rollout.async=true", "rollout.max_staleness=2")
    cfg.rollout.partial, cfg.rollout.join_rollouts = True, True
    worker = RolloutWorker(cfg, 0)
    worker.load_weights(tiny.model.state_dict(), 1)
    params = SamplingParams(n=2, max_new_tokens=16, seed=3, ignore_eos=True)
    assert worker.start("a", PROMPTS[:2], params, 0, 1, steps=5) == 5
    worker.load_weights({k: v * 1.1 for k, v in tiny.model.state_dict().items()}, 2)
    assert worker.start("b", PROMPTS[:2], dataclasses.replace(params, seed=4), 0, 2, steps=5) == 11
    assert list(worker._ended) == ["a"] and worker._stream.keys() == ["b"]
    a = worker.take("a", 2)
    assert a.weights_version == 1 and a.token_versions == [[1] * 6 + [2] * 10] * 4
    b = worker.take("b", 2)
    assert b.weights_version == 2 and b.token_versions == [[2] * 16] * 4 and b.stream_steps == 5
    assert not worker._ended and worker._stream.keys() == []


@pytest.mark.parametrize("join", [False, True])
def test_partial_rollouts_continue_across_pushes_and_a_killed_worker_samples_them_again_exactly(
    tmp_path, local_ray, join
):
    """rollout.partial with rollout.max_staleness=2: step 3's rollout, sent during step 1, samples its first 12
    decode steps with push 1 and the rest with push 2 (tokens 0-12 and 13-23), so its tokens' mean lag is under
    the batch's 2. Worker 0 killed while it holds that half-sampled rollout: its replacement samples it again, each
    segment with its push, and the run equals the run without the kill (weights and metrics). The same with the
    rollouts in flight joined in one batch (rollout.join_rollouts): step 3's last tokens run beside step 4's first
    (after push 2, until step 3's have ended), and the replay runs each start for the steps it ran."""
    from sparserl import runlog as names
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    extra = (
        f"rollout.join_rollouts={join}",
        "cluster.rollout_workers=2",
        "rollout.async=true",
        "rollout.max_staleness=2",
        "rollout.partial=true",
        "mismatch.alpha=exact",  # q from the workers' kept head inputs, each token by its own push's head
        "mismatch.alpha_q=hidden",
        "checkpoint.every=0",
        "train.steps=4",
        "rollout.max_new_tokens=24",
    )
    runs = {}
    for kill in (False, True):
        trainer = build_trainer(_cfg(tmp_path / str(kill), *extra))
        assert trainer.pool.join == join
        collected = (_kill_worker_0_once_step_2_is_sent if kill else _record_collects)(trainer)
        try:
            metrics = [train_step(trainer, step) for step in (1, 2, 3, 4)]
            assert trainer.pool.restarts == int(kill)
            weights = {k: v.clone() for k, v in trainer.learner.state_dict().items()}
        finally:
            close_cluster(trainer)
        runs[kill] = metrics, weights, collected
    (metrics, weights, collected), (metrics_k, weights_k, collected_k) = runs[False], runs[True]
    assert all(torch.equal(weights[k], weights_k[k]) for k in weights)
    for key in (names.REWARD_MEAN, names.POLICY_LOSS, names.MISMATCH_POLICY_LAG_TOKENS, names.MISMATCH_ALPHA_MEAN):
        assert [m[key] for m in metrics] == [m[key] for m in metrics_k], key
    for (_, a), (_, b) in zip(collected, collected_k):
        _same_samples(a, b, tol=0)
    step3 = collected[2][1]
    lengths = [len(r) for r in step3.response_ids]
    assert step3.token_versions == [[1] * min(n, 13) + [2] * max(0, n - 13) for n in lengths]
    assert max(lengths) > 13  # some responses did go on with push 2 (a random model rarely ends early)
    assert [m[names.MISMATCH_POLICY_LAG] for m in metrics] == [0, 1, 2, 2]
    assert metrics[0][names.ROLLOUT_PARTIAL_FRAC] == metrics[1][names.ROLLOUT_PARTIAL_FRAC] == 0
    assert metrics[2][names.ROLLOUT_PARTIAL_FRAC] == sum(n > 13 for n in lengths) / len(lengths)
    lags = [3 - v for versions in step3.token_versions for v in versions]  # push 3 is the learner's at step 3
    assert metrics[2][names.MISMATCH_POLICY_LAG_TOKENS] == pytest.approx(sum(lags) / len(lags))
    assert metrics[2][names.MISMATCH_POLICY_LAG_TOKENS] < 2


def test_partial_rollouts_without_staleness_equal_the_synchronous_run(tmp_path, local_ray, monkeypatch):
    """rollout.partial with rollout.max_staleness=0 on one worker: each step's rollout is sent when the step starts
    and no push falls inside it, so the run equals the synchronous one on that worker (weights and metrics). The
    training process keeps one torch thread in both (asynchronous runs leave the worker's core to it, and the
    learner's sums would round otherwise)."""
    from sparserl.cluster import pool
    from sparserl.train.trainer import train

    monkeypatch.setattr(pool, "training_threads", lambda *args, **kwargs: 1)

    base = ("cluster.rollout_workers=1", "mismatch.alpha=off", "train.steps=3", "rollout.max_new_tokens=24")
    partial = ("rollout.async=true", "rollout.max_staleness=0", "rollout.partial=true", "cluster.worker_cpus=1")
    sync = train(_cfg(tmp_path, *base, "cluster.worker_cpus=1"), run_dir=tmp_path / "sync", log=_quiet)
    segmented = train(_cfg(tmp_path, *base, *partial), run_dir=tmp_path / "partial", log=_quiet)
    _same_run(segmented, sync)


def test_async_rollouts_measure_the_exact_alpha_from_the_workers_q(tmp_path, local_ray, monkeypatch):
    """rollout.async with the exact α (the default): the workers keep q while they sample and send it back, so
    α is measured although the sampler here is a step ahead (nothing replayed, the weights never loaded
    here); a q larger than mismatch.alpha_record_mib is a config error naming the MiB it needs, before any
    worker starts."""
    from sparserl import runlog as names
    from sparserl.cluster import pool
    from sparserl.config import ConfigError
    from sparserl.train.trainer import build_trainer, close_cluster, train_step

    extra = ("cluster.rollout_workers=2", "rollout.async=true", "checkpoint.every=0", "train.steps=2")
    with monkeypatch.context() as patch:
        patch.setattr(pool, "RolloutPool", lambda *a, **k: pytest.fail("the workers started before the check"))
        with pytest.raises(ConfigError, match=r"mismatch.alpha_record_mib=1 with rollout.async=true .* is \d+ MiB"):
            build_trainer(
                _cfg(
                    tmp_path / "small",
                    *extra,
                    "mismatch.alpha_q=kept",
                    "mismatch.alpha_record_mib=1",
                    "rollout.max_new_tokens=512",
                )
            )
    trainer = build_trainer(_cfg(tmp_path / "run", *extra))
    try:
        metrics = [train_step(trainer, 1), train_step(trainer, 2)]
        assert trainer.engine_stale  # α read the workers' q: the sampler here never needed the weights
    finally:
        close_cluster(trainer)
    assert [m[names.MISMATCH_POLICY_LAG] for m in metrics] == [0, 1]
    for m in metrics:
        assert names.MISMATCH_REPLAY_ERR not in m
        assert 0 < m[names.MISMATCH_ALPHA_P5] <= m[names.MISMATCH_ALPHA_MEAN] < 1  # R-KV at budget 8 evicts


def test_async_resume_continues_exactly(tmp_path, local_ray):
    """rollout.async with a checkpoint every 2 steps: stopped at step 2 and resumed to 4, the run equals the run
    that went through (the step after a checkpoint samples with fresh weights in both: lags 0, 1, 0, 1)."""
    from sparserl import runlog as names
    from sparserl.train.trainer import train

    extra = ("cluster.rollout_workers=2", "rollout.async=true", "mismatch.alpha=off", "checkpoint.every=2")
    through = train(_cfg(tmp_path, "train.steps=4", *extra), run_dir=tmp_path / "through", log=_quiet)
    stopped = train(_cfg(tmp_path, "train.steps=2", *extra), run_dir=tmp_path / "stopped", log=_quiet)
    train(_cfg(tmp_path, "train.steps=4", *extra), resume=True, run_dir=stopped, log=_quiet)
    rows = _same_run(stopped, through, names.MISMATCH_K3_LAG)
    assert [r[names.MISMATCH_POLICY_LAG] for r in rows] == [0, 1, 0, 1]


@pytest.mark.parametrize("partial", [False, True, "join"])
def test_k_step_async_resume_continues_exactly(tmp_path, local_ray, partial):
    """rollout.max_staleness=2 with a checkpoint every 3 steps: stopped at step 3 and resumed to 6, the run equals
    the run that went through (nothing is sent past a checkpoint: lags 0, 1, 2, 0, 1, 2 in both), with partial
    rollouts too (none is in flight across a checkpoint), joined in one batch or not (the batch ends with the last
    rollout in flight: the next starts one of its own, as after a resume)."""
    from sparserl import runlog as names
    from sparserl.train.trainer import train

    extra = (
        "cluster.rollout_workers=2",
        "rollout.async=true",
        "rollout.max_staleness=2",
        f"rollout.partial={bool(partial)}",
        f"rollout.join_rollouts={partial == 'join'}",
        "mismatch.alpha=off",
        "checkpoint.every=3",
        "rollout.max_new_tokens=24",
    )
    through = train(_cfg(tmp_path, "train.steps=6", *extra), run_dir=tmp_path / "through", log=_quiet)
    stopped = train(_cfg(tmp_path, "train.steps=3", *extra), run_dir=tmp_path / "stopped", log=_quiet)
    train(_cfg(tmp_path, "train.steps=6", *extra), resume=True, run_dir=stopped, log=_quiet)
    rows = _same_run(stopped, through, names.MISMATCH_K3_LAG)
    assert [r[names.MISMATCH_POLICY_LAG] for r in rows] == [0, 1, 2, 0, 1, 2]


def _quiet(*_):
    pass


def _same_run(resumed, through, *keys) -> list[dict]:
    """The two runs end with byte-equal weights and log the same metrics at every step; returns the rows."""
    from safetensors.torch import load_file

    from sparserl import runlog as names
    from sparserl.runlog import read_metrics
    from sparserl.train.checkpoint import latest_checkpoint

    a, b = (
        load_file(str(next((latest_checkpoint(run) / "model").glob("*.safetensors")))) for run in (through, resumed)
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows_through, rows_resumed = read_metrics(through), read_metrics(resumed)
    assert [r["step"] for r in rows_resumed] == [r["step"] for r in rows_through]
    for key in (names.REWARD_MEAN, names.LENGTH_MEAN, names.POLICY_LOSS, names.GRAD_NORM, *keys):
        assert [r[key] for r in rows_resumed] == [r[key] for r in rows_through], key
    return rows_through


@pytest.mark.parametrize(
    "override,message",
    [
        ("cluster.rollout_workers=0", "cluster.rollout_workers=0: must be >= 1"),
        ("cluster.rollout_workers=3", "more than train.prompts_per_step=2"),
        ("cluster.address=auto", "needs cluster.rollout_workers"),
        ("cluster.learners=9", "more than the 8 samples per step"),
        ("cluster.learners=3", "more than the 2 micro-batches of an optimizer step"),
        ("cluster.worker_cpus=0", "cluster.worker_cpus=0"),
        ("rollout.async=true", "rollout.async=true needs cluster.rollout_workers"),
        (
            "cluster.rollout_workers=1 rollout.async=true mismatch.alpha_q=kept mismatch.alpha_record_mib=0",
            "mismatch.alpha_record_mib=0: under rollout.async the kept route reads the q the workers keep",
        ),
        (
            (
                "cluster.rollout_workers=1 rollout.async=true mismatch.alpha=off rollout.quant=int8 "
                "rollout.mismatch_split=true"
            ),
            "rollout.mismatch_split=true: the asynchronous split",
        ),
        (
            "cluster.rollout_workers=1 rollout.async=true mismatch.alpha=off algorithm.old_logprobs=sampler "
            "rollout.compressor=none",
            "rollout.async samples with the weights of the step before",
        ),
        ("rollout.asynch=true", "did you mean 'rollout.async'"),
    ],
)
def test_bad_cluster_options_fail_before_any_work(tmp_path, override, message):
    from sparserl.config import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(tmp_path, *override.split())


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on return: nothing listens there


def test_an_address_that_is_not_a_ray_head_fails_within_seconds(local_ray):
    """Refused, silent, or answering without gRPC (an HTTP server, a proxy): one error in seconds. The
    module's own Ray head passes."""
    import socket
    import threading

    from sparserl.cluster.pool import ClusterError, check_address

    start = time.perf_counter()
    with pytest.raises(ClusterError, match=r"127.0.0.1:\d+'?: no Ray head answers.*ray start --head"):
        check_address(f"127.0.0.1:{_closed_port()}", timeout_s=1.0)
    with socket.socket() as server:  # listens, then answers like an HTTP/1 server
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer():
            conn, _ = server.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(ClusterError, match="not a Ray head"):
            check_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=1.0)
    with socket.socket() as server:  # listens and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with pytest.raises(ClusterError, match="within 1 s"):
            check_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=1.0)
    with pytest.raises(ClusterError, match="expected auto or host:port"):
        check_address("nowhere")
    assert time.perf_counter() - start < 10
    check_address(ray.get_runtime_context().gcs_address)  # a real Ray head
    check_address(None)
    check_address("auto")


def test_a_learner_killed_mid_run_stops_it_and_resume_continues_exactly(tmp_path, local_ray, monkeypatch):
    """cluster.learners=2 with rollout workers: the other learner killed with SIGKILL before step 2 stops the run
    with an error naming it and --resume; resumed (a new learner), the run equals the run that went through."""
    from sparserl.train import loop as trainer_module
    from sparserl.train.data_parallel import LearnerError
    from sparserl.train.trainer import train

    extra = (
        "cluster.rollout_workers=2",
        "cluster.learners=2",
        "mismatch.alpha=off",
        "checkpoint.every=1",
        "train.steps=3",
    )
    through = train(_cfg(tmp_path, *extra), run_dir=tmp_path / "through", log=_quiet)
    step = trainer_module.train_step

    def kill_the_other_learner_before_step_2(trainer, k):
        if k == 2:
            os.kill(ray.get(trainer.learners.peers[0].pid.remote()), signal.SIGKILL)
        return step(trainer, k)

    monkeypatch.setattr(trainer_module, "train_step", kill_the_other_learner_before_step_2)
    with pytest.raises(LearnerError, match="learner 1 of 2 died.*--resume"):
        train(_cfg(tmp_path, *extra), run_dir=tmp_path / "killed", log=_quiet)
    monkeypatch.setattr(trainer_module, "train_step", step)
    train(_cfg(tmp_path, *extra), resume=True, run_dir=tmp_path / "killed", log=_quiet)
    _same_run(tmp_path / "killed", through)


def test_a_driver_killed_mid_run_resumes_exactly(tmp_path, local_ray):
    """`sparserl train` with rollout workers on this Ray (cluster.address), killed with SIGKILL once its first
    checkpoint is on disk: Ray stops its workers with it, and `sparserl train --resume` continues to the run that
    went through. All three are `sparserl train` processes, as a user runs them (a driver inside pytest is
    another process kind: on some CPUs its learner's float32 update is not the CLI's to the bit)."""
    import subprocess
    import sys

    from test_train import TINY

    from sparserl.train.checkpoint import latest_checkpoint

    steps = ("train.steps=6", "cluster.rollout_workers=2", "rollout.async=true", "mismatch.alpha=off")
    address = ray.get_runtime_context().gcs_address
    tests = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    config = ["sparse_rl_fixed40", *TINY, *HALF_CPU, *steps, f"cluster.address={address}"]

    def sparserl_train(name, *args):
        """A `sparserl train` process; its stderr goes to a file (a pipe nobody reads could fill and stop it)."""
        cmd = [sys.executable, "-m", "sparserl.cli", "train", *args]
        with open(tmp_path / f"{name}.err", "w") as err:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)

    def stderr_of(name):
        return (tmp_path / f"{name}.err").read_text()[-2000:]

    through, killed = tmp_path / "through", tmp_path / "killed"
    assert sparserl_train("through", *config, "--run-dir", str(through)).wait(timeout=400) == 0, stderr_of("through")
    driver = sparserl_train("killed", *config, "--run-dir", str(killed))
    deadline = time.monotonic() + 240
    while latest_checkpoint(killed) is None and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    driver.kill()  # SIGKILL: no finally, no close
    driver.wait()
    assert driver.returncode == -signal.SIGKILL, stderr_of("killed")  # killed, not finished or failed
    assert latest_checkpoint(killed).name != "step-000006"
    resumed = sparserl_train("resumed", "--resume", "--run-dir", str(killed), f"cluster.address={address}")
    assert resumed.wait(timeout=400) == 0, stderr_of("resumed")
    _same_run(killed, through)


def test_more_ray_resources_than_the_cluster_has_is_an_error_not_a_wait(tmp_path, tiny, local_ray):
    from sparserl.cluster.pool import ClusterError, RolloutPool

    cfg = _cfg(tmp_path, "cluster.rollout_workers=2", "cluster.worker_cpus=3")
    # what is free depends on the actors earlier tests left being released (asynchronously): 2 in all
    with pytest.raises(
        ClusterError, match=r"2 rollout workers need 6 Ray CPUs and the cluster has [0-2](\.5)? free \(2 in all\)"
    ):
        RolloutPool(cfg, tiny.model)  # after waiting up to 15 s for resources being released
