"""The rollouts in flight on one engine as one batch: the refill across rollouts of partial rollouts
(``rollout.join_rollouts``).

Under ``rollout.partial`` a rollout worker holds up to ``rollout.max_staleness`` rollouts at once, each sent a step
after the one before. Sampled one by one (:class:`~.segmented.SegmentedRollout`), each rollout is a batch of its
own, and the long tail of its responses runs with the rest of the batch's places empty. Here every rollout's rows
join one :class:`~.decode_batch.DecodeBatch` (vLLM's continuous batching, across the steps of an RL run): the rows of
the rollout sent last start beside the tail of the ones sent before, in the places that the ended rows freed.

The schedule of the decode steps is a function of the calls alone, so the same calls sample the same run:

- :meth:`start` adds a rollout's rows (prefilled with the weights the engine holds, the push it was sent with), then
  runs the batch until every rollout started before it has ended, and for a segment's decode steps at least
  (⌈max_new_tokens / j⌉ for a rollout sent j steps ahead, as :class:`~.segmented.SegmentedRollout`'s segments):
  each push (one rollout sent per step) ends the oldest rollout, and the rows of the others advance meanwhile,
  each token drawn with the weights loaded at the time (``RolloutOutput.token_versions``; under ``kv="recompute"``
  the live rows' cache recomputed first). In a steady run each push costs one segment's decode steps, run by the
  rows of two rollouts at once, instead of the older one's tail and then the newer one's first segment.
- :meth:`take` returns a rollout's output, running the batch until it has ended where it has not.
- :meth:`run` runs a given number of decode steps, or every rollout to its end (the last rollouts of a run, or those
  before a checkpoint: no start follows them): a replay of the calls on a new worker gives every run the
  length it had (the rollouts already taken are not there, so the rows sharing a step differ: the same tokens, up
  to the order of a BLAS's sums).

Every rollout shares the batch's sampling but its seed and ``n`` (one run's steps), and its compressor: a rollout
sent with other budgets (the online controller's) moves the rows still running to them. Prompts are left-padded
to the longest seen so far (the batch widens when a longer one comes, :meth:`~.decode_batch.DecodeBatch.widen`).
"""

from __future__ import annotations

from .decode_batch import DecodeBatch, same_sampling
from .engine import Prompt, RolloutEngine
from .output import RolloutOutput
from .sampling import SamplingParams

__all__ = ["RolloutStream"]


class RolloutStream:
    """Rollouts on ``engine`` sharing one batch of at most ``slots`` rows (None: every row of every rollout in
    flight); ``kv``: a live row's cache when the engine holds other weights at a run than at the one before
    (``keep`` or ``recompute``)."""

    KV = ("keep", "recompute")

    def __init__(self, engine: RolloutEngine, kv: str = "keep", slots: int | None = None):
        if kv not in self.KV:
            raise ValueError(f"kv must be one of {', '.join(self.KV)}, got {kv!r}")
        self.engine, self.kv, self.slots = engine, kv, slots
        self.batch: DecodeBatch | None = None
        self.params: SamplingParams | None = None
        self._expanded: dict = {}  # key -> (prompt index, prompt ids) of each row, for the output
        self._order: list = []  # keys in the batch, the oldest first
        self._weights_version = engine.weights_version  # the weights of the last decode step
        self.steps = 0  # decode steps run in all

    def start(
        self,
        key,
        prompts: list[Prompt],
        params: SamplingParams,
        first_prompt: int = 0,
        steps: int = 0,
        exact: bool = False,
    ) -> int:
        """``params.n`` responses to each of ``prompts`` (global prompts ``first_prompt`` on, as in
        :meth:`~.engine.RolloutEngine.generate`) joined to the batch, then the batch run until every rollout started
        before has ended and for ``steps`` decode steps at least (``exact``: ``steps`` exactly); returns the decode
        steps run."""
        engine = self.engine
        prompt_ids, expanded = engine.expand(prompts, params)
        if self.batch is None:
            self.params = params
            self.batch = DecodeBatch(engine, params, max(len(x) for x in prompt_ids), self.slots)
        elif not same_sampling(params, self.params):
            raise ValueError("a rollout joining the batch must sample as the others do, but for its seed and n")
        rows, _ = engine.split_rows(prompt_ids, expanded, params, first_prompt)
        self.batch.add(key, [e[1] for e in expanded], rows, params.seed)
        self._expanded[key] = expanded
        self._order.append(key)
        if exact:
            return self.run(steps)
        before = self._order[:-1]
        return self._run_while(lambda taken: taken < steps or not all(self.batch.done(k) for k in before))

    def keys(self) -> list:
        """The rollouts in the batch, in the order started."""
        return list(self._order)

    def done(self, key) -> bool:
        """Every response of rollout ``key`` has ended."""
        if key not in self._order:
            raise KeyError(f"no rollout {key!r} in the batch")
        return self.batch.done(key)

    def run(self, steps: int | None = None) -> int:
        """``steps`` decode steps (fewer where every row ends first; None: until every row has ended); returns the
        steps run."""
        if steps is not None and steps < 0:
            raise ValueError(f"steps must be >= 0 or None, got {steps}")
        if self.batch is None:
            return 0
        return self._run_while(lambda taken: steps is None or taken < steps)

    def _run_while(self, more) -> int:
        """Decode steps while rows run and ``more(steps run so far)``; returns the steps run."""
        taken = 0
        while self.batch.live and more(taken):
            self._before_step()
            self.batch.step()
            taken += 1
        self.steps += taken
        return taken

    def take(self, key) -> RolloutOutput:
        """Rollout ``key``'s output as :meth:`~.engine.RolloutEngine.generate` returns it, the batch first run until
        it has ended (its ``stream_steps``: the decode steps that took); its rows leave the batch."""
        taken = self._run_while(lambda _: not self.batch.done(key))
        out = self.engine._named(self.batch.take(key), self._expanded.pop(key))
        self._order.remove(key)
        if not self._order:  # nothing in flight: the next rollout starts a batch of its own width and buffers
            self.batch = None
        out.stream_steps = taken
        return out

    def _before_step(self) -> None:
        """Under ``kv="recompute"``: where other weights were loaded since the last step, the live rows' cache and
        next logits recomputed with them first."""
        version = self.engine.weights_version
        if self.kv == "recompute" and (version != self._weights_version or version is None) and self.batch.steps:
            self.batch.recompute()
        self._weights_version = version
