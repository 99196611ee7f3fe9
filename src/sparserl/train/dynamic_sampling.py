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
model's dropped groups are mostly all 0).
The extra prompts are drawn from the run's seeded sampler, so a resumed run draws
what it would have.
"""

from __future__ import annotations

import dataclasses

from .. import runlog as names
from ..reward.weighted import RewardScores
from ..rollout.engine import RolloutOutput, join_sequential

__all__ = ["informative_groups", "concat_rollouts", "select_groups", "filter_groups"]


def informative_groups(rewards: list[float], prompt_index: list[int], n_prompts: int) -> list[bool]:
    """Per prompt: whether its responses' rewards differ (a GRPO group with a nonzero advantage)."""
    seen: list[set] = [set() for _ in range(n_prompts)]
    for value, p in zip(rewards, prompt_index):
        seen[p].add(float(value))
    return [len(s) > 1 for s in seen]


def concat_rollouts(outs: list[RolloutOutput], prompt_counts: list[int]) -> RolloutOutput:
    """One output from several generations sampled one after another (``prompt_counts[k]`` prompts in
    ``outs[k]``): :func:`~sparserl.rollout.engine.join_sequential`, with the prompt indices offset."""
    offsets = [sum(prompt_counts[:k]) for k in range(len(outs))]
    prompt_index = [p + off for o, off in zip(outs, offsets) for p in o.prompt_index]
    prompt_ids = [x for o in outs for x in o.prompt_ids]
    texts = [x for o in outs for x in o.texts]
    out = join_sequential(outs)
    out.prompt_index, out.prompt_ids, out.texts = prompt_index, prompt_ids, texts
    out.weights_version = outs[-1].weights_version
    return out


def select_groups(ro: RolloutOutput, scores: RewardScores, prompts: list[int]) -> tuple[RolloutOutput, RewardScores]:
    """The responses of the groups ``prompts`` (indices into ``ro``'s prompts), in that order, their prompt
    indices renumbered 0, 1, ...; the KV and time figures stay those of everything sampled."""
    renumber = {p: k for k, p in enumerate(prompts)}
    rows = sorted(
        (i for i, p in enumerate(ro.prompt_index) if p in renumber), key=lambda i: (renumber[ro.prompt_index[i]], i)
    )

    def pick(values):
        return None if values is None else [values[i] for i in rows]

    chosen = dataclasses.replace(ro.select(rows), prompt_index=[renumber[ro.prompt_index[i]] for i in rows])
    return chosen, RewardScores(pick(scores.total), {k: pick(v) for k, v in scores.parts.items()}, scores.errors)


def filter_groups(sample, score, want: int, max_batches: int):
    """Dynamic sampling. ``sample()`` draws and samples one batch: ``(examples, RolloutOutput)``;
    ``score(examples, ro)`` gives its :class:`RewardScores`. Returns ``(examples, ro, scores, sampled, stats)``:
    the ``want`` groups kept (see the module docstring), the scores of everything sampled, and the step's
    ``sampling/*`` metrics."""
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
    merged = RewardScores(
        [x for s in all_scores for x in s.total],
        {k: [x for s in all_scores for x in s.parts[k]] for k in all_scores[0].parts},
        sum(s.errors for s in all_scores),
    )
    chosen = [p for p, ok in enumerate(flags) if ok][:want]
    chosen += [p for p, ok in enumerate(flags) if not ok][: want - len(chosen)]
    chosen.sort()  # the order they were drawn
    ro, kept = select_groups(ro, merged, chosen)
    stats = {
        names.GEN_BATCHES: len(outs),
        names.INFORMATIVE_GROUPS: sum(flags),
        names.KEPT_INFORMATIVE_FRAC: sum(flags[p] for p in chosen) / max(1, len(chosen)),
        names.REWARD_MEAN_KEPT: sum(kept.total) / max(1, len(kept.total)),
    }
    return [examples[p] for p in chosen], ro, kept, merged, stats
