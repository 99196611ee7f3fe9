"""A rollout worker: the run's sampler in a Ray actor (``cluster.rollout_workers``).

It loads the run's model and builds its sampler with the trainer's own builder
(:func:`sparserl.rollout.build.engine_from_fields`): the same compressor, schedule, dtype, weight and KV
quantization. The driver then pushes the learner's weights (one object in Ray's object store per
update, read by every worker); a quantized sampler quantizes them here, on the worker's side. Each
step the worker samples its shard of the prompts (:mod:`.shard`) with the budgets the driver's
controller has reached, and refuses to sample with weights other than the ones the driver pushed last.

The class is plain Python (Ray wraps it in :mod:`.pool`), so it runs and tests without Ray too.
"""

from __future__ import annotations

import os

from ..errors import SparserlError


class WorkerStateError(SparserlError, RuntimeError):
    """A worker asked to sample with weights other than the ones the driver pushed last."""


class RolloutWorker:
    """One sampler. ``cfg``: the run's validated config; ``index``: the worker's place in the pool."""

    def __init__(self, cfg, index: int):
        from ..models.loading import load_model
        from ..rollout.build import engine_from_fields, sampler_section

        self.index = index
        lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
        self.engine = engine_from_fields(lm, sampler_section(cfg))
        self.micro_batch_size = cfg.train.micro_batch_size  # and the tokens' bound: the dense cache's reading
        self.max_tokens = cfg.train.max_tokens_per_micro_batch
        self.partial_kv = cfg.rollout.partial_kv  # a partial rollout's cache after a load: kept or recomputed
        self.version = -1  # no weights pushed yet
        self._partial: dict = {}  # key -> SegmentedRollout: partial rollouts going on across pushes (rollout.partial)
        #: rollout.join_rollouts: the partial rollouts in flight as one batch (RolloutStream), and those of them
        #: that have ended, read and numbered, until the driver takes them
        self.join = bool(cfg.rollout.join_rollouts)
        self._stream = None
        self._ended: dict = {}
        self._sent_with: dict = {}  # key -> (the push it was started with, its params, read_dense_cache)

    def info(self) -> dict:
        """Where the worker runs: its process id, device, sampler dtype and the threads torch uses."""
        import torch

        return {
            "index": self.index,
            "pid": os.getpid(),
            "device": str(self.engine.device),
            "dtype": str(self.engine.model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
        }

    def load_weights(self, state: dict, version: int) -> int:
        """The learner's state dict (``version``: the driver's push count) into the sampler; a quantized
        sampler quantizes it here. Returns ``version``."""
        self.engine.update_weights(state, version)
        self.version = version
        return version

    def generate(
        self, prompts: list, params, first_prompt: int, version: int, schedule=None, read_dense_cache: int | None = None
    ):
        """Sample ``params.n`` responses for each of ``prompts`` (global prompts ``first_prompt`` on) with the
        weights of push ``version`` and, when given, the driver's current KV schedule (a
        :class:`~sparserl.rollout.kv.schedule.KVSchedule`). ``read_dense_cache`` (top-k, 0 for none): also
        read the responses with these weights on a dense cache
        (:func:`sparserl.mismatch.teacher_forced.read_dense_cache`), before newer weights arrive. With
        ``params.keep_distributions`` each response's ``q`` comes back in a tensor of its own (the engine's are
        views of one buffer, and serializing a view writes its whole buffer: the step's ``q`` once per response)."""
        self._check(version)
        self._set_schedule(schedule)
        out = self.engine.generate(prompts, params, first_prompt=first_prompt)
        return self._finish(out, params, version, read_dense_cache)

    def start(
        self,
        key,
        prompts: list,
        params,
        first_prompt: int,
        version: int,
        schedule=None,
        steps: int = 1,
        read_dense_cache: int | None = None,
        exact: bool = False,
    ):
        """A partial rollout (``rollout.partial``): :meth:`generate`'s rollout sampled for ``steps`` decode steps
        with the weights of push ``version`` and kept here under ``key``, to go on with the weights loaded
        later (:meth:`advance`; :class:`~sparserl.rollout.segmented.SegmentedRollout`). Returns None.

        Under ``rollout.join_rollouts`` the rollout's rows join the batch of the rollouts in flight here
        (:class:`~sparserl.rollout.stream.RolloutStream`), which then runs until every rollout started before this
        one has ended and for ``steps`` decode steps at least (``exact``: ``steps`` exactly, a replay); each rollout
        that has ended is read on a dense cache with these weights (``read_dense_cache``) and kept until
        :meth:`take`. Returns the decode steps run."""
        self._check(version)
        self._set_schedule(schedule)
        if self.join:
            from ..rollout.stream import RolloutStream

            if self._stream is None:
                self._stream = RolloutStream(self.engine, kv=self.partial_kv)
            self._sent_with[key] = version, params, read_dense_cache
            ran = self._stream.start(key, prompts, params, first_prompt, steps=steps, exact=exact)
            self._take_ended()
            return ran
        from ..rollout.segmented import SegmentedRollout

        rollout = SegmentedRollout(self.engine, prompts, params, first_prompt=first_prompt, kv=self.partial_kv)
        self._partial[key] = rollout, version
        rollout.advance(steps)

    def run(self, version: int, steps: int | None = None) -> int:
        """``steps`` decode steps of the rollouts in flight (``rollout.join_rollouts``; a replay of a run that ended
        a rollout the driver has taken since), or None: every rollout in flight to its end (no start will follow
        them), with the weights of push ``version``; returns the steps run."""
        self._check(version)
        ran = self._stream.run(steps) if self._stream is not None else 0
        self._take_ended()
        return ran

    def take(self, key, version: int):
        """The joined rollout ``key`` (``rollout.join_rollouts``), as :meth:`advance` returns a partial one: run to
        its end first where it has not ended (with the weights of push ``version``, the latest)."""
        self._check(version)
        if key not in self._ended:
            out = self._stream.take(key)
            self._ended[key] = self._numbered(key, out)
        self._take_ended()
        return self._ended.pop(key)

    def _take_ended(self) -> None:
        """The joined rollouts that have ended out of the batch, read (the dense cache, with the weights that drew
        their last tokens) and kept for :meth:`take`."""
        for key in [k for k in self._stream.keys() if self._stream.done(k)]:
            self._ended[key] = self._numbered(key, self._stream.take(key))

    def _numbered(self, key, out):
        sent_with, params, read = self._sent_with.pop(key)
        out = self._finish(out, params, self.version, read)
        out.weights_version = sent_with  # the oldest push that drew its tokens (each token's: token_versions)
        return out

    def advance(self, key, version: int, steps: int | None, read_dense_cache: int | None = None):
        """The partial rollout ``key`` sampled ``steps`` more decode steps with the weights of push ``version``
        (each token records its push: ``RolloutOutput.token_versions``); with ``steps`` None, to its end, and
        its output returned as :meth:`generate` returns one (the dense cache read with these weights), numbered
        with the push it was started with."""
        self._check(version)
        rollout, sent_with = self._partial[key]
        if not rollout.advance(steps) and steps is not None:
            return None
        del self._partial[key]
        out = self._finish(rollout.output(), rollout.params, version, read_dense_cache)
        out.weights_version = sent_with  # the oldest push that drew its tokens (each token's: token_versions)
        return out

    def _check(self, version: int) -> None:
        if version != self.version:
            raise WorkerStateError(
                f"rollout worker {self.index} holds weights of push {self.version}, asked to sample with push {version}"
            )

    def _set_schedule(self, schedule) -> None:
        if schedule is not None and schedule != self.engine.compressor.schedule:
            self.engine.compressor.set_schedule(schedule)

    def _finish(self, out, params, version: int, read_dense_cache: int | None):
        """``out`` as it goes back to the driver: numbered with the push, its kept tensors copied out of their
        shared buffers, and the dense cache read when asked."""
        from ..mismatch.teacher_forced import read_dense_cache as read

        out.weights_version = version
        if out.distributions is not None:  # views of one [B, T, V] buffer: each would carry all of it to the driver
            out.distributions = [d.clone() for d in out.distributions]
        if out.hidden is not None:  # the same for the head's inputs (params.keep_hidden)
            out.hidden = [x.clone() for x in out.hidden]
        if read_dense_cache is not None:
            out.dense_cache = read(
                self.engine.model,
                out,
                params.temperature,
                read_dense_cache,
                self.micro_batch_size,
                self.engine.tokenizer.pad_token_id or 0,
                self.max_tokens,
            )
        return out
