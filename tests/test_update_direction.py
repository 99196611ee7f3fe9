"""One training step moves the policy the way its rewards say: after the update the dense policy's
log-probability of each response with a positive advantage rises and of each with a negative advantage
falls (summed over the response's tokens, before against after). The rewards come from a function of the
response text alone, so a step that flipped the advantage's sign or paired rewards with the wrong
responses fails here."""

from __future__ import annotations

import copy
import zlib

import torch
from test_train import cfg_for

from sparserl import runlog as names
from sparserl.batch import RolloutBatch
from sparserl.score import forward_response
from sparserl.train.trainer import build_trainer, train_step


def crc_parity_reward(response: str, label: str) -> float:
    """1 when the response text's CRC-32 is even, else 0: known from each response alone, and mixed within
    a group of random responses."""
    return float(zlib.crc32(response.encode()) % 2 == 0)


def sequence_logprobs(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """Σ_t log π(y_t | x, y_<t) of every response [N] under ``model``."""
    with torch.no_grad():
        lp, _ = forward_response(model, batch, slice(0, batch.response_ids.shape[0]), temperature=temperature)
    return (lp * batch.response_mask).sum(-1)


def test_one_update_raises_the_rewarded_responses_and_lowers_the_others(tmp_path):
    # a dense float32 sampler: no correction masks a response out of the loss; one optimizer step
    cfg = cfg_for(
        tmp_path,
        "rollout.compressor=none",
        "rollout.kv_controller=null",
        "reward.fn=test_update_direction:crc_parity_reward",
        "algorithm.correction=none",
        "train.prompts_per_step=3",
        "train.lr=1e-4",
        "train.ppo_epochs=1",
        "train.warmup_steps=0",
    )
    trainer = build_trainer(cfg)
    rollouts, generate = [], trainer.engine.generate

    def keep(*args, **kw):
        out = generate(*args, **kw)
        rollouts.append(out)
        return out

    trainer.engine.generate = keep
    before = copy.deepcopy(trainer.learner)
    metrics = train_step(trainer, 1)
    assert metrics[names.OPTIMIZER_STEPS] == 1
    (ro,) = rollouts
    rewards = torch.tensor([crc_parity_reward(t, "") for t in ro.texts])
    groups = torch.tensor(ro.prompt_index)
    advantage = torch.zeros_like(rewards)
    for g in groups.unique():  # the sign of GRPO's advantage: the reward against its group's mean
        advantage[groups == g] = rewards[groups == g] - rewards[groups == g].mean()
    assert (advantage > 0).sum() >= 2 and (advantage < 0).sum() >= 2, rewards  # the test's premise: mixed groups

    batch = RolloutBatch.from_rollout(
        ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index, pad_id=trainer.tokenizer.pad_token_id or 0
    ).to(trainer.device)
    temperature = cfg.rollout.temperature
    change = (
        sequence_logprobs(trainer.learner, batch, temperature) - sequence_logprobs(before, batch, temperature)
    ).cpu()
    moved = [(round(float(a), 3), round(float(c), 4)) for a, c in zip(advantage, change)]
    assert bool((change[advantage > 0] > 0).all()), moved  # the rewarded responses became more likely
    assert bool((change[advantage < 0] < 0).all()), moved  # the others less likely
