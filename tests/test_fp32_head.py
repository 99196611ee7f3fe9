"""The sampler's LM head in float32 under a bfloat16 sampler (``rollout.fp32_head``; prime-rl's
``enable_fp32_lm_head``): its logits are the float32 product of the final norm's output, so the distribution it
samples from equals a float32 learner head's on the same input within float32 rounding, where a bfloat16 head
rounds; it survives a weight push; bad combinations are refused."""

from __future__ import annotations

import pytest
import torch

from sparserl.mismatch.acceptance import dense_logprobs
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.sampling import SamplingParams, sampled_distribution

PARAMS = SamplingParams(n=2, temperature=0.7, max_new_tokens=10, seed=3, keep_hidden=True)


def _head_gap(tiny, fp32_head: bool, state=None) -> tuple[float, RolloutEngine]:
    """The largest gap between the sampler's log-probs (from its kept head inputs) and a float32 head's on the
    same inputs, and the engine."""
    engine = RolloutEngine(tiny, get_compressor("rkv", budget=12, step_length=2), dtype="bfloat16", fp32_head=fp32_head)
    if state is not None:
        engine.update_weights(state)
    out = engine.generate(["hello there", "2 + 3 ="], PARAMS)
    weight = (state or tiny.model.state_dict())["lm_head.weight"].float()
    gap = 0.0
    for x in out.hidden:
        for first, rows in ((True, x[:1]), (False, x[1:])):
            q = sampled_distribution(engine.hidden_logits(rows, first), PARAMS)
            p = dense_logprobs(rows.float(), weight, PARAMS.temperature)
            gap = max(gap, float((q - p).abs().max()))
        # the tokens' own log-probs are the kept distribution's
    return gap, engine


def test_a_float32_head_gives_a_float32_learner_heads_log_probs(tiny):
    gap32, engine = _head_gap(tiny, True)
    assert engine.model.lm_head.dtype == torch.float32 and engine.model.embed.dtype == torch.bfloat16
    assert gap32 < 1e-5  # float32 rounding
    gap16, engine16 = _head_gap(tiny, False)
    assert engine16.model.lm_head.dtype == torch.bfloat16
    assert gap16 > 1e-4  # the bfloat16 head's rounding, 10x and more above


def test_the_float32_head_survives_a_weight_push(tiny):
    pushed = {k: v * 1.1 if v.dim() == 2 else v for k, v in tiny.model.state_dict().items()}
    gap, engine = _head_gap(tiny, True, pushed)
    assert engine.model.lm_head.dtype == torch.float32 and gap < 1e-5


def test_the_sampled_tokens_log_probs_come_from_the_float32_head(tiny):
    engine = RolloutEngine(tiny, get_compressor("none"), dtype="bfloat16", fp32_head=True)
    out = engine.generate(["hello there"], PARAMS)
    x, tokens = out.hidden[0], torch.tensor(out.response_ids[0])
    logq = torch.cat(
        [sampled_distribution(engine.hidden_logits(x[:1], True), PARAMS),
         sampled_distribution(engine.hidden_logits(x[1:], False), PARAMS)]
    ).cpu()  # fmt: skip
    recorded = torch.tensor(out.sampler_logprobs[0])
    assert torch.allclose(logq.gather(-1, tokens[:, None])[:, 0], recorded, atol=1e-5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.fp32_head=true", "rollout.quant=int8", "rollout.quant_head=true"], "one asks for a float32 head"),
        (["rollout.fp32_head=true", "rollout.dtype=float32"], "the head is float32 already"),
    ],
)
def test_bad_combinations_are_refused_with_one_line(overrides, message):
    from sparserl.config import ConfigError, load_config, validate

    with pytest.raises(ConfigError, match=message):
        validate(load_config("default", overrides))


def test_the_memory_prediction_counts_the_float32_copy():
    from test_memory import SHAPE, cfg_of

    from sparserl.memory.predict import predict_peak

    half = predict_peak(cfg_of("rollout.dtype=bfloat16"), SHAPE, 100).resident["sampler weights"]
    full = predict_peak(cfg_of("rollout.dtype=bfloat16", "rollout.fp32_head=true"), SHAPE, 100)
    assert full.resident["sampler weights"] - half == 8 * SHAPE.vocab * SHAPE.hidden  # the copy and its panels
