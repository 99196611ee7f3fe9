"""A calibrated schedule's cost against dense: predicted by the cost model, and measured.

- :func:`predicted_cost`: the cost model's ratio (:mod:`sparserl.cost`, ``predicted_cost_vs_dense``;
  Sparrow's, after Kinetics: docs/algorithms.md §3), or None when it has no terms for the arguments.
- :func:`measured_speedup`: one dense generation and right after it one with the schedule, the same
  prompts and sampling settings: the ratio of their tokens/s. **One round**: machines drift, so it is
  an indication, not a benchmark (``sparserl bench rollout --repeat`` is).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import cost
from ..bench.machine import measure_rates
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..rollout.kv.base import KVCompressor
from ..rollout.sampling import SamplingParams

ROUNDS = 1  # generations per measured ratio: one dense, then one with the schedule


def predicted_cost(
    engine: RolloutEngine,
    model_config,
    compressor: str,
    budget_by_bin: list[list[int]],
    n: int,
    prompt_len: float,
    response_len: float,
    step_length: int,
    window: int | None,
    compress_prompt: bool,
    cache: dict | None = None,
    log: Callable[[str], None] = print,
) -> float | None:
    """The cost model's predicted time of sampling with the schedule ``budget_by_bin`` over dense
    (:func:`sparserl.cost.predicted_cost_vs_dense`; < 1: cheaper), for ``n`` sequences at once of
    ``response_len`` tokens after ``prompt_len`` (means, rounded) on ``engine``'s machine: the model's
    shape from ``model_config`` at the sampler's dtype, the machine's rates measured once (kept in
    ``cache``, about two seconds). None when the model refuses these arguments (said through ``log``,
    e.g. a compressor it has no terms for)."""
    cache = {} if cache is None else cache
    try:
        if "rates" not in cache:
            cache["rates"] = measure_rates(engine, rows=n)
        shape = cost.ModelShape.from_config(model_config, engine.dtype)
        value = cost.predicted_cost_vs_dense(
            shape,
            cache["rates"],
            n,
            max(1, round(prompt_len)),
            max(1, round(response_len)),
            schedule=budget_by_bin,
            compressor=compressor,
            step_length=step_length,
            window=window,
            compress_prompt=compress_prompt,
        )
    except ValueError as e:  # no terms for these arguments
        log(f"cost model: no prediction for {compressor} ({type(e).__name__}: {e}); predicted_cost_vs_dense null")
        return None
    return None if value is None else float(value)


def generate_timed(engine: RolloutEngine, prompt_ids: list[list[int]], params: SamplingParams) -> RolloutOutput:
    """One generation of ``params.n`` responses to each of ``prompt_ids`` (its ``tokens_per_s`` is the speed)."""
    return engine.generate([], params, prompt_ids=prompt_ids)


def measured_speedup(
    dense_engine: RolloutEngine, schedule_compressor: KVCompressor, prompt_ids: list[list[int]], params: SamplingParams
) -> dict:
    """``{"tokens_per_s", "dense_tokens_per_s", "measured_tokens_per_s_vs_dense"}``: one dense generation
    on ``dense_engine`` and, right after it (the two close in time: a shared machine drifts), one with
    ``schedule_compressor`` (its ``schedule`` set) over the same weights; the ratio of their tokens/s."""
    dense = generate_timed(dense_engine, prompt_ids, params)
    out = generate_timed(RolloutEngine.from_engine(dense_engine, schedule_compressor), prompt_ids, params)
    ratio = out.tokens_per_s / dense.tokens_per_s if dense.tokens_per_s > 0 else None
    return {
        "tokens_per_s": out.tokens_per_s,
        "dense_tokens_per_s": dense.tokens_per_s,
        "measured_tokens_per_s_vs_dense": ratio,
        "dense_tokens": dense.tokens_generated,
        "dense_responses": len(dense.response_ids),
    }
