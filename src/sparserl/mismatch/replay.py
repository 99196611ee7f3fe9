"""Replay: the sampler re-run on the tokens it sampled, forced, so that its cache evolves exactly as it
did (the same tokens enter it, the compressor scores the same states and evicts the same slots, KV and
weight quantization round the same values, rows end at the same steps and the batch shrinks the same
way). Each step hands over the full next-token distribution the sampler drew from, which sampling did
not keep (a [B, T, V] tensor per step batch would not fit): Sparrow's exact acceptance α needs it
(:mod:`.measure`).

Exactness is checked, not assumed: the replayed log-probs of the sampled tokens must equal the
sampler's recorded ``sampler_logprobs`` (tests: every compressor, int8 KV, each weight quantization;
in training ``mismatch/replay_err`` logs the largest difference).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..rollout.engine import RolloutEngine, RolloutOutput, join_sequential
from ..rollout.sampling import SamplingParams

#: ``on_step(t, rows, logprobs)``: step ``t``'s distribution ``logprobs`` [len(rows), V] (the sampler's
#: tempered, filtered log-probs) of the responses ``rows`` (indices into the replayed list)
StepFn = Callable[[int, torch.Tensor, torch.Tensor], None]
#: ``on_decode(t, rows, cache)``: after decode step ``t`` (token ``t`` of the responses ``rows`` entered
#: ``cache`` and every layer attended), before any compression: what each layer read at this step
DecodeFn = Callable[[int, torch.Tensor, object], None]


@torch.inference_mode()
def replay(
    engine: RolloutEngine,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    params: SamplingParams,
    on_step: StepFn | None = None,
    on_decode: DecodeFn | None = None,
) -> RolloutOutput:
    """Re-run ``engine`` on ``prompt_ids[i]`` forced to ``response_ids[i]`` (one prompt per response, in
    the order they were sampled, with the sampling ``params`` they were sampled with: ``max_new_tokens``
    and ``tail_slack`` decisions depend on it). ``engine.max_batch`` splits the batch as sampling did (sized by
    the device's free memory: the sampling's own split, ``engine.last_batch_rows``)."""
    # on_step hands the distributions over, one step at a time: nothing to keep
    one = dataclasses.replace(params, n=1, keep_distributions=False, keep_hidden=False)
    chunk = engine.batch_rows(prompt_ids, params.max_new_tokens, len(prompt_ids))
    if engine.last_batch_rows is not None and callable(engine.max_batch):  # sized by free memory: as sampling did
        chunk = min(engine.last_batch_rows, len(prompt_ids))
    outs = []
    hook = engine.step_hook
    try:
        for start in range(0, len(prompt_ids), chunk):
            stop = min(len(prompt_ids), start + chunk)

            def capture(event, t=None, rows=None, logprobs=None, _start=start, **kw):
                if event == "sample" and on_step is not None:
                    on_step(t, rows + _start, logprobs)
                elif event == "after_decode" and on_decode is not None:
                    on_decode(t, rows + _start, kw["cache"])
                if hook is not None:
                    hook(event, t=t, rows=rows, logprobs=logprobs, **kw)

            engine.step_hook = capture
            outs.append(engine.generate([], one, prompt_ids=prompt_ids[start:stop], forced=response_ids[start:stop]))
    finally:
        engine.step_hook = hook
    out = join_sequential(outs)
    out.prompt_index = list(range(len(prompt_ids)))
    out.prompt_ids = [list(x) for x in prompt_ids]
    out.texts = [t for o in outs for t in o.texts] if len(outs) > 1 else out.texts
    return out
