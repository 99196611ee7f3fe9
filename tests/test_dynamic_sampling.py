"""DAPO's dynamic sampling (algorithm.filter_groups): further batches until enough groups have rewards that
differ, the first ones kept in draw order, groups of equal rewards filling up when the batches run out; a run
with it trains, logs how many batches it sampled, and resumes exactly."""

import json

import pytest
import torch
from test_train import cfg_for

from sparserl.reward.weighted import RewardScores
from sparserl.rollout.output import KVStats, RolloutOutput
from sparserl.train.checkpoint import latest_checkpoint
from sparserl.train.dynamic_sampling import concat_rollouts, filter_groups, informative_groups
from sparserl.train.trainer import build_trainer, train, train_step


def fake_batch(tag: str, rewards_per_prompt: list[list[float]]):
    """A generation of len(rewards_per_prompt) prompts (examples named tag + index), each response's text its
    reward, so that ``score`` can read it back."""
    examples = [f"{tag}{p}" for p in range(len(rewards_per_prompt))]
    index = [p for p, group in enumerate(rewards_per_prompt) for _ in group]
    texts = [f"{tag}{p}:{r}" for p, group in enumerate(rewards_per_prompt) for r in group]
    ro = RolloutOutput(
        prompt_index=index,
        prompt_ids=[[ord(tag) * 10 + p] for p in index],
        response_ids=[[7, i] for i in range(len(index))],
        sampler_logprobs=[[-0.5, -0.5] for _ in index],
        finish_reason=["stop"] * len(index),
        kv_tokens_kept=[3] * len(index),
        kv=KVStats(bytes_peak=100 * len(examples), compressions=1),
        tokens_generated=2 * len(index),
        seconds=1.0,
        texts=texts,
        distributions=[torch.full((2, 4), float(i)) for i in range(len(index))],
    )
    return examples, ro


def score(examples, ro):
    """The reward read back from each text, with two parts as a weighted reward has them: the verifier (here 1
    minus the reward, so that it tells apart what reads it) and a part of zeros."""
    total = [float(t.split(":")[1]) for t in ro.texts]
    return RewardScores(total, {"verifier": [1.0 - x for x in total], "zero": [0.0] * len(total)}, 1)


def test_informative_groups_are_those_whose_rewards_differ():
    assert informative_groups([1, 0, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2], 3) == [True, False, False]


def test_the_first_informative_groups_are_kept_in_draw_order():
    batches = iter([fake_batch("a", [[1, 0], [0, 0]]), fake_batch("b", [[0, 1], [1, 0]]), fake_batch("c", [[1, 0]])])
    examples, ro, scores, sampled, stats = filter_groups(lambda: next(batches), score, want=2, max_batches=4)
    assert examples == ["a0", "b0"]  # b1 differs too, but two were enough; c was never sampled
    assert stats == {
        "sampling/gen_batches": 2,
        "sampling/informative_groups": 3,
        "sampling/kept_informative_frac": 1.0,
        "sampling/reward_mean_kept": 2 / 4,
    }
    # everything sampled, a1 and b1 too: its mean, and the verifier's passes (what reward/mean and accuracy read)
    assert sum(sampled.total) / len(sampled.total) == 3 / 8
    assert sum(x >= 1 for x in sampled.verified) / len(sampled.verified) == 5 / 8
    assert ro.prompt_index == [0, 0, 1, 1] and ro.texts == ["a0:1", "a0:0", "b0:0", "b0:1"]
    assert scores.total == [1.0, 0.0, 0.0, 1.0] and scores.errors == 2
    assert scores.parts == {"verifier": [0.0, 1.0, 1.0, 0.0], "zero": [0.0] * 4}
    assert [d[0, 0].item() for d in ro.distributions] == [0.0, 1.0, 0.0, 1.0]  # each response's own q
    assert ro.seconds == 2.0 and ro.tokens_generated == 16 and ro.kv.compressions == 2  # everything sampled
    assert ro.prompt_ids == [[970], [970], [980], [980]]  # each row's prompt follows its response


def test_short_of_informative_groups_the_step_fills_up_in_draw_order():
    batches = iter([fake_batch("a", [[0, 0], [1, 1], [1, 0]]), fake_batch("b", [[1, 1], [0, 0], [0, 0]])])
    examples, ro, scores, sampled, stats = filter_groups(lambda: next(batches), score, want=3, max_batches=2)
    assert examples == ["a0", "a1", "a2"]  # one informative (a2), two of equal rewards fill up, in order
    assert stats["sampling/gen_batches"] == 2 and stats["sampling/kept_informative_frac"] == pytest.approx(1 / 3)
    assert ro.prompt_index == [0, 0, 1, 1, 2, 2] and scores.total == [0, 0, 1, 1, 1, 0]


def test_concat_offsets_prompt_indices():
    (_, a), (_, b) = fake_batch("a", [[1], [0]]), fake_batch("b", [[1]])
    joined = concat_rollouts([a, b], [2, 1])
    assert joined.prompt_index == [0, 1, 2] and joined.kv.bytes_peak == 200


def test_a_run_with_dynamic_sampling_trains_and_resumes_exactly(tmp_path, monkeypatch):
    from sparserl.train import step

    seen = []
    real = step.filter_groups
    monkeypatch.setattr(step, "filter_groups", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    args = ("algorithm.filter_groups=true", "algorithm.max_gen_batches=3")
    # pairs of responses; the first seed whose step 1 drops groups that change the mean (seed 2 on the CPUs
    # measured: reward 0.75 over all sampled, 0.5 over the kept groups)
    for seed in range(8):
        seen.clear()
        metrics = train_step(build_trainer(cfg_for(tmp_path, *args, "rollout.n=2", f"train.seed={seed}")), 1)
        if metrics["reward/mean"] != metrics["sampling/reward_mean_kept"]:
            break
    assert 1 <= metrics["sampling/gen_batches"] <= 3 and metrics["sampling/kept_informative_frac"] > 0
    # the step's reward/mean is the mean over all that was sampled, not the trained batch's (the kept groups')
    ((_, _, scores, sampled, _),) = seen
    assert metrics["reward/mean"] == pytest.approx(sum(sampled.total) / len(sampled.total))
    assert metrics["reward/mean"] != sum(scores.total) / len(scores.total)
    assert metrics["reward/accuracy"] == sum(x >= 1 for x in sampled.verified) / len(sampled.verified)
    assert metrics["sampling/reward_mean_kept"] == sum(scores.total) / len(scores.total)
    monkeypatch.undo()
    full = train(cfg_for(tmp_path, "train.steps=3", *args), run_dir=tmp_path / "a", log=lambda *_: None)
    train(cfg_for(tmp_path, "train.steps=2", *args), run_dir=tmp_path / "b", log=lambda *_: None)
    resumed = train(cfg_for(tmp_path, "train.steps=3", *args), run_dir=tmp_path / "b", resume=True, log=lambda *_: None)
    ra = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["sampling/gen_batches"] for r in ra] == [r["sampling/gen_batches"] for r in rb]
    assert ra[2]["reward/mean"] == rb[2]["reward/mean"]
    wa = (latest_checkpoint(full) / "model" / "model.safetensors").read_bytes()
    assert wa == (latest_checkpoint(resumed) / "model" / "model.safetensors").read_bytes()


def test_the_step_line_says_how_many_batches_were_sampled():
    from sparserl.train.metrics import format_step_line

    assert (
        format_step_line(3, {"reward/mean": 0.5, "sampling/gen_batches": 2}, 12) == "step 3/12 reward 0.500 batches 2"
    )
    assert "batches" not in format_step_line(3, {"reward/mean": 0.5}, 12)
