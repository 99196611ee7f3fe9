"""DAPO's dynamic sampling (Yu et al., 2025, arXiv 2503.14476; verl's ``algorithm.filter_groups``).

A GRPO group whose responses all got the same reward has advantage 0 on every token: it adds nothing to
the policy gradient but still costs its share of the learner's forward and backward (the main job on the
embedded model: half its groups, `reward/frac_zero_std_groups`). With ``algorithm.filter_groups``, a step
keeps sampling batches of ``train.prompts_per_step`` new prompts until it holds that many groups whose
rewards differ (std > 0), at most ``algorithm.max_gen_batches`` batches, and trains on the first ones
(in the order they were drawn). Where the batches run out first, the step fills up with the groups of
equal rewards it drew, in order, so that every step trains on ``prompts_per_step`` groups (verl stops the
run there instead). ``reward/mean`` and ``reward/accuracy`` stay over all that the step sampled, comparable
with a run without it; ``sampling/reward_mean_kept`` is the kept groups' mean, which the selection raises (a weak
model's dropped groups are mostly all 0). The extra prompts are drawn from the run's seeded sampler, so a resumed run draws
what it would have.
"""
from __future__ import annotations

import dataclasses

from .. import runlog as names
from ..reward.weighted import RewardScores
from ..rollout.engine import KVStats, RolloutOutput

__all__ = ["informative_groups", "concat_rollouts", "select_groups", "filter_groups"]


def informative_groups(rewards: list[float], prompt_index: list[int], n_prompts: int) -> list[bool]:
    """Per prompt: whether its responses' rewards differ (a GRPO group with a nonzero advantage)."""
    seen: list[set] = [set() for _ in range(n_prompts)]
    for value, p in zip(rewards, prompt_index):
        seen[p].add(float(value))
    return [len(s) > 1 for s in seen]


def concat_rollouts(outs: list[RolloutOutput], prompt_counts: list[int]) -> RolloutOutput:
    """One output from several generations (``prompt_counts[k]`` prompts in ``outs[k]``): the responses one
    after the other, prompt indices offset, times and tokens summed, KV peaks the largest."""
    offsets = [sum(prompt_counts[:k]) for k in range(len(outs))]

    def joined(name):
        values = [getattr(o, name) for o in outs]
        return None if any(v is None for v in values) else [x for v in values for x in v]

    kv = KVStats(bytes_peak=max(o.kv.bytes_peak for o in outs), bytes_theory=max(o.kv.bytes_theory for o in outs),
                 bytes_dense=max(o.kv.bytes_dense for o in outs), compressions=sum(o.kv.compressions for o in outs),
                 bytes_dense_alloc=max(o.kv.bytes_dense_alloc for o in outs))
    return RolloutOutput(
        prompt_index=[p + off for o, off in zip(outs, offsets) for p in o.prompt_index],
        prompt_ids=joined("prompt_ids"), response_ids=joined("response_ids"),
        sampler_logprobs=joined("sampler_logprobs"), finish_reason=joined("finish_reason"),
        kv_tokens_kept=joined("kv_tokens_kept"), kv=kv,
        tokens_generated=sum(o.tokens_generated for o in outs), seconds=sum(o.seconds for o in outs),
        prefill_seconds=sum(o.prefill_seconds for o in outs), top_logprobs=joined("top_logprobs"),
        top_indices=joined("top_indices"), distributions=joined("distributions"), texts=joined("texts"),
        weights_version=outs[-1].weights_version)


def select_groups(ro: RolloutOutput, scores: RewardScores, prompts: list[int]) -> tuple[RolloutOutput, RewardScores]:
    """The responses of the groups ``prompts`` (indices into ``ro``'s prompts), in that order, their prompt
    indices renumbered 0, 1, ...; the KV and time figures stay those of everything sampled."""
    renumber = {p: k for k, p in enumerate(prompts)}
    rows = sorted((i for i, p in enumerate(ro.prompt_index) if p in renumber),
                  key=lambda i: (renumber[ro.prompt_index[i]], i))

    def pick(values):
        return None if values is None else [values[i] for i in rows]

    chosen = dataclasses.replace(
        ro, prompt_index=[renumber[ro.prompt_index[i]] for i in rows], prompt_ids=pick(ro.prompt_ids),
        response_ids=pick(ro.response_ids), sampler_logprobs=pick(ro.sampler_logprobs),
        finish_reason=pick(ro.finish_reason), kv_tokens_kept=pick(ro.kv_tokens_kept),
        top_logprobs=pick(ro.top_logprobs), top_indices=pick(ro.top_indices),
        distributions=pick(ro.distributions), texts=pick(ro.texts))
    return chosen, RewardScores(pick(scores.total), {k: pick(v) for k, v in scores.parts.items()}, scores.errors)


def filter_groups(sample, score, want: int, max_batches: int):
    """Dynamic sampling. ``sample()`` draws and samples one batch: ``(examples, RolloutOutput)``;
    ``score(examples, ro)`` gives its :class:`RewardScores`. Returns ``(examples, ro, scores, stats)`` for the
    ``want`` groups kept (see the module docstring) and the step's ``sampling/*`` metrics."""
    examples, outs, counts, all_scores, flags = [], [], [], [], []
    while True:
        batch_examples, ro = sample()
        scores = score(batch_examples, ro)
        examples += batch_examples
        outs.append(ro)
        counts.append(len(batch_examples))
        all_scores.append(scores)
        flags += informative_groups(scores.total, ro.prompt_index, len(batch_examples))
        if sum(flags) >= want or len(outs) >= max_batches:
            break
    ro = concat_rollouts(outs, counts)
    merged = RewardScores([x for s in all_scores for x in s.total],
                          {k: [x for s in all_scores for x in s.parts[k]] for k in all_scores[0].parts},
                          sum(s.errors for s in all_scores))
    every = merged.total
    verified = next(iter(merged.parts.values())) if merged.parts else every  # a weighted reward's verifier
    chosen = [p for p, ok in enumerate(flags) if ok][:want]
    chosen += [p for p, ok in enumerate(flags) if not ok][: want - len(chosen)]
    chosen.sort()  # the order they were drawn
    ro, merged = select_groups(ro, merged, chosen)
    stats = {names.GEN_BATCHES: len(outs), names.INFORMATIVE_GROUPS: sum(flags),
             names.KEPT_INFORMATIVE_FRAC: sum(flags[p] for p in chosen) / max(1, len(chosen)),
             # over all sampled, as a run without dynamic sampling logs them (runlog)
             names.REWARD_MEAN: sum(every) / max(1, len(every)),
             names.ACCURACY: sum(x >= 1.0 for x in verified) / max(1, len(verified)),
             names.REWARD_MEAN_KEPT: sum(merged.total) / max(1, len(merged.total))}
    return [examples[p] for p in chosen], ro, merged, stats
