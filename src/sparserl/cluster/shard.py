"""How a step's prompts are split across rollout workers, and how their outputs join again.

Worker ``k`` of ``N`` gets the contiguous prompts ``[k·P // N, (k+1)·P // N)`` of the step's ``P`` (the
first workers take no more than one prompt more than the last). Its engine samples them with
``first_prompt`` = the shard's start, so response ``j`` of global prompt ``i`` draws from row
``i·n + j``'s random stream (:func:`sparserl.rollout.sampling.row_uniforms`): the same seed gives the
same samples whatever ``N`` is, up to the float rounding of different batch shapes.
"""

from __future__ import annotations

from ..mismatch.teacher_forced import DenseCacheReading
from ..rollout.output import KVStats, RolloutOutput


def shard_prompts(n_prompts: int, n_workers: int) -> list[range]:
    """``n_workers`` contiguous ranges covering ``range(n_prompts)`` in order (some empty when there are
    fewer prompts than workers)."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    return [range(k * n_prompts // n_workers, (k + 1) * n_prompts // n_workers) for k in range(n_workers)]


def merge_shards(outs: list[RolloutOutput], shards: list[range]) -> RolloutOutput:
    """One output for the whole step from the workers' outputs (``outs[k]`` sampled ``shards[k]``),
    prompt-major as a single engine's. ``prompt_index`` becomes global. The workers ran side by side,
    so their KV bytes add up (each holds its own buffers at once) and the time is the slowest's. All
    must have sampled with the same weights (``weights_version``)."""
    if len(outs) != len(shards) or not outs:
        raise ValueError(f"{len(outs)} outputs for {len(shards)} shards")
    versions = {out.weights_version for out in outs}
    if len(versions) > 1:
        raise ValueError(f"shards sampled with different weight pushes {sorted(versions, key=str)}")
    kv = KVStats()
    merged = RolloutOutput(
        prompt_index=[], prompt_ids=[], response_ids=[], sampler_logprobs=[], finish_reason=[], kv_tokens_kept=[], kv=kv
    )
    topk = outs[0].top_logprobs is not None
    if topk:
        merged.top_logprobs, merged.top_indices = [], []
    for out, shard in zip(outs, shards):
        merged.prompt_index += [shard.start + i for i in out.prompt_index]
        for name in ("prompt_ids", "response_ids", "sampler_logprobs", "finish_reason", "kv_tokens_kept", "texts"):
            getattr(merged, name).extend(getattr(out, name))
        if topk:
            merged.top_logprobs += out.top_logprobs
            merged.top_indices += out.top_indices
        for name in ("bytes_peak", "bytes_theory", "bytes_dense", "compressions", "bytes_dense_alloc"):
            setattr(kv, name, getattr(kv, name) + getattr(out.kv, name))
        merged.tokens_generated += out.tokens_generated
        merged.seconds = max(merged.seconds, out.seconds)
        merged.prefill_seconds = max(merged.prefill_seconds, out.prefill_seconds)
    merged.weights_version = outs[0].weights_version
    if all(out.distributions is not None for out in outs):  # q kept on the workers (the exact α reads it)
        merged.distributions = [d for out in outs for d in out.distributions]
    if all(out.hidden is not None for out in outs):  # the head's inputs kept on the workers (q recomputed here)
        merged.hidden = [x for out in outs for x in out.hidden]
    if all(out.token_versions is not None for out in outs):  # the push that drew each token
        merged.token_versions = [v for out in outs for v in out.token_versions]
    if all(out.dense_cache is not None for out in outs):
        merged.dense_cache = DenseCacheReading.concat([out.dense_cache for out in outs])
    return merged
