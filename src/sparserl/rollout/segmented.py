"""A rollout sampled in segments, with other weights loaded between them: the engine's side of partial
rollouts (AReaL's interruptible generation, verl's ``async_training.partial_rollout``, slime's
``--partial-rollout``).

:class:`SegmentedRollout` runs the eager engine's batches (:meth:`~.engine.RolloutEngine._batch_steps`) a given
number of decode steps at a time. Between two calls of :meth:`SegmentedRollout.advance` the caller may load new
weights into the engine (:meth:`~.engine.RolloutEngine.update_weights` with the push's number): the responses not
yet ended go on with them from where they are, **their KV cache kept as it is** (the K/V of the tokens before the
load were computed with the old weights; under a compressing cache, the tokens it kept were also chosen under
them). Each token records the push whose weights computed the logits it was drawn from
(``RolloutOutput.token_versions``), so the corrections and α can treat each token against the policy that drew
it. With the same weights throughout, the segments sample exactly what one :meth:`~.engine.RolloutEngine.generate`
call samples: the same random stream per row and step, the same cache.

The rollout's rows run as one batch of at most ``max_batch`` rows (:meth:`~.engine.RolloutEngine.batch_rows`):
when a response ends, the next waiting one takes its place (its prompt prefilled, its cache joined to the
batch's), so a group's long tail runs beside the rows still to start instead of alone; the batch's cache stays
resident between segments. The static step (``rollout.static_step``) is not used here.
"""

from __future__ import annotations

import time

from .engine import RECOMPUTE, Prompt, RolloutEngine
from .output import RolloutOutput
from .sampling import SamplingParams

__all__ = ["SegmentedRollout"]


class SegmentedRollout:
    """``params.n`` responses to each of ``prompts`` on ``engine``, sampled :meth:`advance` by :meth:`advance`;
    ``first_prompt`` as in :meth:`~.engine.RolloutEngine.generate` (a shard of a larger batch); ``kv``: what
    the live responses' cache does when the engine holds other weights at an :meth:`advance` than at the one
    before (``keep`` or ``recompute``)."""

    KV = ("keep", "recompute")

    def __init__(
        self,
        engine: RolloutEngine,
        prompts: list[Prompt],
        params: SamplingParams,
        first_prompt: int = 0,
        kv: str = "keep",
    ):

        if kv not in self.KV:
            raise ValueError(f"kv must be one of {', '.join(self.KV)}, got {kv!r}")
        self.engine, self.params, self.kv = engine, params, kv
        prompt_ids, self._expanded = engine.expand(prompts, params)
        rows, slots = engine.split_rows(prompt_ids, self._expanded, params, first_prompt)
        self._batch = engine._batch_steps([e[1] for e in self._expanded], params, rows, slots=slots)
        self._out: RolloutOutput | None = None  # the batch's output, once its last response has ended
        self._started = False  # the batch's prefill and first decode steps have run
        self._weights_version = engine.weights_version  # the weights of the last advance()
        self.seconds = 0.0  # time spent in advance(), without the pauses between segments
        self.segments = 0
        self.recomputes = 0  # advances that recomputed the cache (kv="recompute", other weights loaded)
        self._output: RolloutOutput | None = None

    @property
    def done(self) -> bool:
        """Every response has ended (EOS, a stop string or ``max_new_tokens``)."""
        return self._out is not None

    def advance(self, steps: int | None = None) -> bool:
        """Run the batch ``steps`` more decode steps (None: to its end), with the weights the engine holds now
        (under ``kv="recompute"``, where they are another push than at the last advance, or unnumbered, the
        started batch's cache recomputed with them first); returns :attr:`done`."""
        if steps is not None and steps < 1:
            raise ValueError(f"steps must be >= 1 or None, got {steps}")
        t0 = time.perf_counter()
        loaded = self.engine.weights_version != self._weights_version or self.engine.weights_version is None
        recompute = self.kv == "recompute" and loaded and self.segments > 0
        self.recomputes += recompute
        taken = 0
        while self._out is None and (steps is None or taken < steps):
            try:
                # the first step after a load recomputes the started batch's cache with the new weights
                self._batch.send(RECOMPUTE) if recompute and taken == 0 and self._started else next(self._batch)
                self._started = True
                taken += 1
            except StopIteration as end:
                self._out = end.value
        self.seconds += time.perf_counter() - t0
        self.segments += 1
        self._weights_version = self.engine.weights_version
        return self.done

    def output(self) -> RolloutOutput:
        """The whole rollout, as :meth:`~.engine.RolloutEngine.generate` returns it (``seconds``: the time spent
        sampling, pauses excluded); only once :attr:`done`."""
        if not self.done:
            raise RuntimeError("the rollout has responses still running: advance() it to the end first")
        if self._output is None:
            self._output = self.engine._named(self._out, self._expanded)
            self._output.seconds = self.seconds
        return self._output
