"""The driver's side of the rollout workers (``cluster.rollout_workers``): a pool of Ray actors that
samples a step as one engine would.

- **Ray**: ``cluster.address`` unset starts a local Ray for the run (its logical CPUs at least the
  workers' ``cluster.worker_cpus`` in all) and shuts it down after; ``auto`` or ``host:port`` joins a
  running cluster (an address that does not answer fails within seconds, before Ray is asked). A Ray
  already initialised in the process (a test, a user's script) is used as it is and left running.
- **Weights**: :meth:`RolloutPool.update_weights` puts the learner's state dict into the object store
  once and every worker loads it (quantized samplers quantize on their side); pushes are numbered and
  a worker refuses to sample with an older one.
- **A step**: :meth:`RolloutPool.submit` splits the prompts (:func:`.shard.shard_prompts`) and sends each
  shard with the driver's current KV schedule; :meth:`RolloutPool.collect` joins the outputs
  (:func:`.shard.merge_shards`). Between the two the driver is free: asynchronous training (``rollout.async``)
  updates on step t while the workers sample steps t + 1 … t + k (``rollout.max_staleness``) with the weights
  before that update, and pushes the new weights without waiting. A worker runs its calls in the order sent, so
  each rollout samples with the push sent before it and each push loads after the rollouts sent before it; the
  pool keeps the latest k + 1 pushes.
- **Partial rollouts** (``rollout.partial``): a rollout sent k steps ahead is sampled in segments, the first with
  the weights it was sent with and each of the others after one of the next pushes, with that push's weights;
  the worker keeps the responses and their KV cache between segments
  (:class:`~sparserl.rollout.segmented.SegmentedRollout`), and each token records its push. Under
  ``rollout.join_rollouts`` the rollouts in flight on a worker are one batch
  (:class:`~sparserl.rollout.stream.RolloutStream`): a rollout is started once, runs on in the starts of the ones
  sent after it (or in :meth:`RolloutPool.finish_joined` where none follows), and is taken at its collect.
- **Faults**: a worker that dies (``kill -9``, a lost node) is replaced by a new actor that runs again, in the order
  they were sent, every shard of the dead one's not yet collected (each segment after loading the push it was sent
  with, so a partial rollout is sampled again exactly as it was), then loads the latest push; ``restarts`` counts
  them (``cluster/worker_restarts``). A piece of work that kills :data:`MAX_ATTEMPTS` workers in a row stops the run
  with an error naming it: a step never goes on without a sample.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field

from ..errors import SparserlError
from .shard import merge_shards, shard_prompts
from .worker import RolloutWorker

MAX_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 3.0


class ClusterError(SparserlError, RuntimeError):
    """Ray could not be reached or a rollout worker could not be kept alive."""


#: an HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS) answers
#: with a SETTINGS frame of its own (RFC 9113 §3.4)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_address(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """``cluster.address`` ``host:port`` answers like a Ray head within ``timeout_s``: it accepts a TCP
    connection and speaks gRPC (HTTP/2 SETTINGS in reply to a client preface). Ray's own client waits
    far longer on an address that does not answer, and a proxy in the way accepts any connection.
    Unset and ``auto`` pass (Ray finds or starts its own)."""
    if address in (None, "auto"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"cluster.address={address!r}: expected auto or host:port (e.g. 10.0.0.5:6379)")
    hint = "start one with `ray start --head` on that machine, or leave cluster.address unset for a local Ray"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(_H2_PREFACE)
            reply = sock.recv(9)
    except OSError as e:
        raise ClusterError(
            f"cluster.address={address!r}: no Ray head answers there within {timeout_s:g} s ({e}); {hint}"
        ) from None
    if len(reply) < 4 or reply[3] != 4:
        raise ClusterError(
            f"cluster.address={address!r}: something answers there, but not a Ray head (no gRPC "
            f"reply: {reply[:16]!r}); {hint}"
        )


def preflight(cluster) -> None:
    """What a run with rollout workers needs, checked before any weights load: Ray installed, and
    ``cluster.address`` answering (a ``cluster`` config section)."""
    try:
        import ray  # noqa: F401  (the import is the check)
    except ImportError:
        raise ClusterError(
            f"cluster.rollout_workers={cluster.rollout_workers} needs Ray: pip install 'sparserl[ray]' "
            "(./install.sh installs it)"
        ) from None
    check_address(cluster.address)


def resources_needed(cluster) -> dict[str, float]:
    """Ray CPUs and GPUs the run's actors take: the rollout workers and the learners beyond the first."""
    workers, peers = cluster.rollout_workers or 0, cluster.learners - 1
    return {
        "CPU": workers * cluster.worker_cpus + peers * cluster.learner_cpus,
        "GPU": workers * cluster.worker_gpus + peers * cluster.learner_gpus,
    }


def training_threads(cluster, async_rollouts: bool, updating: bool) -> int | None:
    """torch threads for the training process when its Ray actors share this machine with it (a local Ray:
    ``cluster.address`` unset): the cores the actors computing at the same time as it do not take, at least
    1. Those are, under ``rollout.async``, the rollout workers (they sample while it scores and updates), and
    while it updates (``updating``), the other learners; more threads than cores slow every process down
    many times. None: nothing computes beside it, or the actors are elsewhere."""
    if cluster.address is not None:
        return None
    beside = (cluster.learners - 1) * cluster.learner_cpus if updating else 0.0
    if async_rollouts and cluster.rollout_workers:
        beside += cluster.rollout_workers * cluster.worker_cpus
    return max(1, (os.cpu_count() or 1) - math.ceil(beside)) if beside else None


def require_resources(needed: dict[str, float], what: str, wait_s: float = 15.0) -> None:
    """Ray has ``needed`` free (within ``wait_s``: actors just stopped release theirs asynchronously); an
    actor asking for more would wait forever, so say so instead."""
    import ray

    def short(free):
        return [kind for kind, amount in needed.items() if amount > 0 and free.get(kind, 0.0) + 1e-9 < amount]

    deadline = time.monotonic() + wait_s
    free = ray.available_resources()
    while short(free) and time.monotonic() < deadline:
        time.sleep(0.5)
        free = ray.available_resources()
    for kind, amount in needed.items():
        if kind in short(free):
            raise ClusterError(
                f"{what} need {amount:g} Ray {kind}s and the cluster has {free.get(kind, 0.0):g} free "
                f"({ray.cluster_resources().get(kind, 0.0):g} in all): lower cluster.worker_cpus / "
                "learner_cpus (or the GPU options), or add machines"
            )


def connect(address: str | None, cpus_needed: float) -> bool:
    """Initialise Ray for a run; True when this call started it (and the run shuts it down after)."""
    import ray

    if ray.is_initialized():
        return False
    check_address(address)
    try:
        if address is None:
            ray.init(
                num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)),
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except ConnectionError as e:
        raise ClusterError(f"cluster.address={address!r}: {e}") from None
    return True


@dataclass
class PendingRollout:
    """A step's rollout sent to the workers and not yet collected (:meth:`RolloutPool.submit`)."""

    prompts: list
    params: object
    schedule: object
    read_dense_cache: int | None
    version: int  # the weight push it samples with
    shards: list  # (worker, range of prompts) for each busy worker
    refs: dict = field(default_factory=dict)  # worker -> the ref of its output (the latest, after a re-run)
    sent_at: float = field(default_factory=lambda: time.monotonic())  # when submitted
    #: a partial rollout (``rollout.partial``): (push, decode steps or None = to the end) of each segment sent so
    #: far, in order; empty for a rollout sampled in one call
    segments: list = field(default_factory=list)
    continuations: int = 0  # segments still to send, one after each push; the last runs to the end
    segment_steps: int | None = None  # decode steps of each segment but the last
    key: int = 0  # the partial rollout's name on the workers
    joined: bool = False  # rollout.join_rollouts: its rows join the batch of the rollouts in flight on each worker


@dataclass
class Sent:
    """A call sent to rollout worker ``worker`` for ``pending``, in the order sent (:meth:`RolloutPool._replace` runs
    them again in that order): ``kind`` ``generate``, ``segment`` (number ``segment`` of a partial rollout),
    ``start`` (a joined rollout's rows in), ``take`` (a joined rollout out) or ``run``; ``version``: the push it ran
    with; ``ref``: its result; ``steps``: the decode steps a joined rollout's batch ran in it, once known."""

    pending: PendingRollout
    worker: int
    kind: str
    version: int
    ref: object
    segment: int = 0
    steps: int | None = None


class RolloutPool:
    """``cfg.cluster.rollout_workers`` rollout workers, started with ``learner``'s weights."""

    def __init__(self, cfg, learner, log=print):
        import ray

        c = cfg.cluster
        self.cfg, self.log = cfg, log
        self.started_ray = connect(c.address, resources_needed(c)["CPU"])
        require_resources(
            {"CPU": c.rollout_workers * c.worker_cpus, "GPU": c.rollout_workers * c.worker_gpus},
            f"{c.rollout_workers} rollout workers",
        )
        self._actor = ray.remote(RolloutWorker).options(num_cpus=c.worker_cpus, num_gpus=c.worker_gpus, max_restarts=0)
        self.workers = [self._actor.remote(cfg, k) for k in range(c.rollout_workers)]
        self._start_bookkeeping(cfg.rollout.max_staleness, cfg.rollout.join_rollouts)
        self.update_weights(learner)

    def _start_bookkeeping(self, max_staleness: int, join: bool = False) -> None:
        """The counts and records of a pool that has pushed nothing and sent nothing yet; ``join``:
        ``rollout.join_rollouts``, the partial rollouts in flight share one batch on each worker."""
        self.join = join
        self.restarts = 0
        self.version = 0
        self.keep = max(2, max_staleness + 1)  # pushes kept: the oldest a rollout in flight samples with
        self._weights: dict[int, object] = {}  # push -> its object in the store (the latest ``keep``)
        self._loads: dict[int, object] = {}  # worker -> its call loading the latest push, not yet waited for
        self._outstanding: list[PendingRollout] = []  # submitted and not yet collected, in the order sent
        self._collected_at = None  # time.monotonic() of the last collect (None: none yet)
        self._keys = 0  # partial rollouts named so far
        self._sent: list[Sent] = []  # calls since the oldest one a rollout not yet collected needs, in the order sent
        self.idle_fraction = 0.0  # the workers' share of the wall clock not sampling, at the last collect

    # --- weights ---------------------------------------------------------------------------------
    def update_weights(self, source, wait: bool = True) -> None:
        """The learner's weights (a model or a state dict) to every worker, through one object. Each
        worker loads them after the work sent to it before; ``wait=False`` returns at once (the loads
        are waited for before the next :meth:`submit`)."""
        import ray

        state = source.state_dict() if hasattr(source, "state_dict") else source
        self.version += 1
        self._weights[self.version] = ray.put({k: v.detach().cpu() for k, v in state.items()})
        self._weights.pop(self.version - self.keep, None)  # a rollout in flight samples with a newer one
        self._loads = {
            k: w.load_weights.remote(self._weights[self.version], self.version) for k, w in enumerate(self.workers)
        }
        if wait:
            self._settle_loads()

    def weights(self, version: int) -> dict:
        """The state dict of push ``version`` (one of the latest :attr:`keep`) as the workers loaded it: what sampled a
        rollout of that version (the exact α's ``q`` from the workers' kept head inputs, under ``rollout.async``)."""
        import ray

        return ray.get(self._weights[version])

    def _settle_loads(self) -> None:
        """Wait for the workers' loading of the latest push (a dead worker is replaced: its successor loads it)."""
        for k in list(self._loads):
            self._get(k, lambda k=k: self._loads[k], what="loading weights")
        self._loads = {}

    # --- a step ----------------------------------------------------------------------------------
    def submit(
        self, prompts: list, params, schedule=None, read_dense_cache: int | None = None, segments: int = 1
    ) -> PendingRollout:
        """Send every prompt's ``params.n`` responses to the workers with the latest weights and return at once;
        ``schedule``: the driver's current KV schedule (the online controller's budgets); ``read_dense_cache``:
        see :meth:`.worker.RolloutWorker.generate`. With rollouts still in flight the latest push's loads are not
        waited for: each worker runs them before this rollout, after the ones sent before.

        ``segments`` > 1 (``rollout.partial``): the rollout is sampled in that many segments, the first now with
        the latest weights for ⌈``params.max_new_tokens`` / segments⌉ decode steps, each of the others after one of
        the next pushes (:meth:`continue_partial`) with its weights, the last to the end."""
        if not self._outstanding:
            self._settle_loads()
        busy = [(k, s) for k, s in enumerate(shard_prompts(len(prompts), len(self.workers))) if len(s)]
        pending = PendingRollout(prompts, params, schedule, read_dense_cache, self.version, busy)
        if segments > 1:
            self._keys += 1
            pending.key, pending.continuations = self._keys, segments - 1
            pending.segment_steps = -(-params.max_new_tokens // segments)
            pending.segments = [(self.version, pending.segment_steps)]
            if self.join:  # the other segments run in the batch of the rollouts sent after it: none to send
                pending.joined, pending.continuations = True, 0
        for k, s in busy:
            self._send(pending, k, s, 0)
        self._outstanding.append(pending)
        return pending

    def continue_partial(self) -> None:
        """After a push: every partial rollout in flight with segments still to send samples its next one with the
        pushed weights (the last to the end), sent after the push's loads."""
        for pending in self._outstanding:
            if pending.continuations:
                pending.continuations -= 1
                pending.segments.append((self.version, pending.segment_steps if pending.continuations else None))
                for k, s in pending.shards:
                    self._send(pending, k, s, len(pending.segments) - 1)

    def finish_joined(self) -> None:
        """``rollout.join_rollouts``, when no rollout is sent after the ones in flight (the run's last steps, or a
        checkpoint's): each worker runs them to their ends now, with the latest push (their last segment's), instead
        of at their collects (a start would have run them beside its own rows)."""
        joined = [p for p in self._outstanding if p.joined]
        if not joined:
            return
        for k in sorted({k for p in joined for k, _ in p.shards}):
            ref = self.workers[k].run.remote(self.version, None)
            self._sent.append(Sent(joined[-1], k, "run", self.version, ref))

    def collect(self, pending: PendingRollout):
        """The output of a :meth:`submit`, as one engine's ``generate`` would give it: waits for every shard,
        running again on a new worker any shard whose worker died."""
        if pending.continuations:
            raise ClusterError(f"a partial rollout collected with {pending.continuations} segment(s) not yet sent")
        if pending.joined:  # out of each worker's batch (run to its end there where it has not ended)
            for k, s in pending.shards:
                self._send(pending, k, s, 0, kind="take")
        outs = [
            self._get(k, lambda k=k: pending.refs[k], what=f"prompts {s.start}-{s.stop - 1}") for k, s in pending.shards
        ]
        for sent in self._sent:
            if sent.pending is pending and sent.kind == "take":  # its steps: a replay runs them for the rollouts after
                sent.steps = outs[[k for k, _ in pending.shards].index(sent.worker)].stream_steps
            if sent.pending is pending and sent.kind != "run":  # its output leaves the object store once taken
                sent.ref = None
        self._outstanding.remove(pending)
        self._forget_sent()
        self._account_idle(pending, sum(out.seconds for out in outs))
        return merge_shards(outs, [s for _, s in pending.shards])

    def _account_idle(self, pending: PendingRollout, sampling_s: float) -> None:
        """:attr:`idle_fraction`: 1 - ``sampling_s`` (the collected rollout's sampling, summed over its workers) /
        (its workers x the wall clock since the previous collect, or since it was sent for the first). One rollout
        is sampled between two collects in a steady run, so this is the workers' idle share of a step."""
        now = time.monotonic()
        since = self._collected_at if self._collected_at is not None else pending.sent_at
        self._collected_at = now
        self.idle_fraction = max(0.0, 1.0 - sampling_s / max(len(pending.shards) * (now - since), 1e-9))

    def generate(self, prompts: list, params, schedule=None, read_dense_cache: int | None = None):
        """:meth:`submit` then :meth:`collect`."""
        return self.collect(self.submit(prompts, params, schedule, read_dense_cache))

    def _send(self, pending: PendingRollout, k: int, s: range, segment: int, kind: str | None = None, steps=None):
        """Worker ``k``'s call sampling its shard ``s`` of ``pending``: the whole rollout, or its segment number
        ``segment`` of a partial one (the last returns the output, the others None); of a joined one
        (``pending.joined``), its start (``steps``: the decode steps it ran the first time, for a replay) or its
        ``take``. Logged (:attr:`_sent`); the call that returns the output is ``pending.refs[k]``."""
        worker, shard = self.workers[k], pending.prompts[s.start : s.stop]
        if kind == "take":
            ref = worker.take.remote(pending.key, self.version)
            sent = Sent(pending, k, "take", self.version, ref)
        elif not pending.segments:
            ref = worker.generate.remote(
                shard, pending.params, s.start, pending.version, pending.schedule, pending.read_dense_cache
            )
            sent = Sent(pending, k, "generate", pending.version, ref)
        else:
            version, segment_steps = pending.segments[segment]
            if segment == 0:
                read = pending.read_dense_cache if pending.joined else None
                exact = steps is not None
                ref = worker.start.remote(
                    pending.key, shard, pending.params, s.start, version, pending.schedule,
                    steps if exact else segment_steps, read, exact,
                )  # fmt: skip
                kind = "start" if pending.joined else "segment"
            else:
                read = pending.read_dense_cache if segment_steps is None else None
                ref = worker.advance.remote(pending.key, version, segment_steps, read)
                kind = "segment"
            sent = Sent(pending, k, kind, version, ref, segment, steps)
        self._sent.append(sent)
        if kind != "start":
            pending.refs[k] = ref
        return ref

    def _forget_sent(self) -> None:
        """The calls no replay needs any more out of :attr:`_sent`: those before the first call for a rollout not yet
        collected (every call after it may have shaped a joined rollout's batch)."""
        first = next((i for i, sent in enumerate(self._sent) if sent.pending in self._outstanding), len(self._sent))
        del self._sent[:first]

    def _get(self, k: int, ref_of, what: str):
        """``ray.get(ref_of())`` of worker ``k``. When the worker has died, a new actor in its place runs its work
        again (:meth:`_replace`) and ``ref_of()`` then names the new call; at most :data:`MAX_ATTEMPTS` workers for
        one piece of work."""
        import ray
        from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return ray.get(ref_of())
            except OutOfMemoryError:  # a replacement would fill the same memory again
                raise ClusterError(
                    f"rollout worker {k} was killed by Ray's memory monitor ({what}): the machine's memory was nearly "
                    "full; each rollout in flight holds its responses and cache on the workers, and Ray's object "
                    "store the last rollout.max_staleness + 1 pushes: lower rollout.max_staleness, set "
                    "rollout.partial=false, lower train.prompts_per_step or rollout.max_new_tokens, or give the "
                    "workers machines of their own (cluster.address)"
                ) from None
            except (RayActorError, WorkerCrashedError) as e:
                if attempt == MAX_ATTEMPTS:
                    raise ClusterError(
                        f"rollout worker {k} died {MAX_ATTEMPTS} times in a row ({what}): "
                        f"{type(e).__name__}; the step cannot complete"
                    ) from None
                self.log(f"cluster: rollout worker {k} died ({what}); restarting it and running its work again")
                self._replace(k)
        raise AssertionError("unreachable")

    def _replace(self, k: int) -> None:
        """A new worker ``k`` in place of a dead one. It runs again, in the order they were sent, its calls for every
        rollout not yet collected, each after loading the push it ran with (a partial rollout's segments: each with
        its own; actor calls run in the order sent), then loads the latest push (waited for by the next
        :meth:`_settle_loads`). Joined rollouts (``rollout.join_rollouts``): each start runs the decode steps it ran
        the first time where it had finished, and the takes of rollouts collected since are run again as that many
        decode steps, so each token is drawn with the push that drew it the first time."""
        import ray

        stop_actors([self.workers[k]], shutdown_ray=False)
        worker = self.workers[k] = self._actor.remote(self.cfg, k)
        self.restarts += 1
        loaded = None
        replay, self._sent = self._sent, []
        for sent in replay:
            if sent.worker != k:
                self._sent.append(sent)
                continue
            if sent.kind in ("start", "run") and sent.steps is None:  # the decode steps it ran, where it finished
                try:
                    sent.steps = ray.get(sent.ref, timeout=0)
                except Exception:  # it had not: it runs as it was sent
                    pass
            outstanding = sent.pending in self._outstanding
            if not outstanding and not (sent.kind in ("take", "run") and sent.steps):
                continue
            if loaded != sent.version:
                worker.load_weights.remote(self._weights[sent.version], sent.version)
                loaded = sent.version
            if sent.kind == "run" or not outstanding:  # a run, or a collected rollout's take: its decode steps
                ref = worker.run.remote(sent.version, sent.steps)
                self._sent.append(Sent(sent.pending, k, "run", sent.version, ref, steps=sent.steps))
                continue
            shard = dict(sent.pending.shards)[k]
            if sent.kind == "take":
                ref = sent.pending.refs[k] = worker.take.remote(sent.pending.key, sent.version)
                self._sent.append(Sent(sent.pending, k, "take", sent.version, ref))
            else:
                self._send(sent.pending, k, shard, sent.segment, steps=sent.steps if sent.kind == "start" else None)
        self._loads[k] = worker.load_weights.remote(self._weights[self.version], self.version)

    # --- the end ---------------------------------------------------------------------------------
    def info(self) -> list[dict]:
        """Each worker's process id, device, dtype and threads."""
        import ray

        return ray.get([w.info.remote() for w in self.workers])

    def close(self) -> None:
        """Stop the workers, and Ray when the pool started it."""
        stop_actors(self.workers, self.started_ray)
        self.workers = []


def stop_actors(actors: list, shutdown_ray: bool) -> None:
    """Kill ``actors`` (dead ones are skipped), then shut Ray down when the caller started it."""
    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # gone already
            pass
    if shutdown_ray and ray.is_initialized():
        ray.shutdown()
