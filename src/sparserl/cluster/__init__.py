"""Scaling out on Ray (``cluster`` section): rollout workers as Ray actors, each holding a sampler
built exactly as the trainer's (:func:`sparserl.rollout.build.engine_from_fields`).

- :mod:`.shard`: how a step's prompts are split across workers (deterministic, contiguous);
- :mod:`.worker`: one sampler in an actor (load pushed weights, generate a shard);
- :mod:`.pool`: the driver's side (start or join Ray, push weights once through the object store,
  scatter a step, gather one :class:`~sparserl.rollout.engine.RolloutOutput`, restart a dead worker
  and re-run its prompts).

Ray is imported only when a pool starts: a run without ``cluster.rollout_workers`` never needs it.
"""

from __future__ import annotations

from .shard import merge_shards, shard_prompts

__all__ = ["merge_shards", "shard_prompts"]
