"""The evaluation's pass@1 and pass@n (:func:`sparserl.eval.evaluate.evaluate`) where a problem's samples
pass and fail in mixed numbers: pass@k is the unbiased estimator of Chen et al. 2021 (Codex),
pass@k = mean over problems of 1 - C(n - c, k) / C(n, k) with c of the n samples passing, which for k = 1
is c / n and for k = n is 1 when any sample passes."""

from __future__ import annotations

from math import comb
from types import SimpleNamespace

import pytest

from sparserl.eval.evaluate import evaluate
from sparserl.rollout.sampling import SamplingParams

#: problem -> its n = 4 samples, "right" passing (reward 1) and "wrong" not (reward 0)
SAMPLES = {
    "one of four": ["wrong", "right", "wrong", "wrong"],
    "none": ["wrong"] * 4,
    "all": ["right"] * 4,
    "two of four": ["right", "wrong", "wrong", "right"],
}


class ScriptedEngine:
    """Returns each prompt's scripted samples in the engine's order (prompt by prompt, ``n`` each)."""

    def generate(self, prompts, params):
        texts = [t for p in prompts for t in SAMPLES[p][: params.n]]
        return SimpleNamespace(
            texts=texts,
            prompt_index=[i for i in range(len(prompts)) for _ in range(params.n)],
            tokens_generated=len(texts),
            kv=SimpleNamespace(bytes_peak=0, bytes_dense=0),
        )


def word_reward(response: str, label: str) -> float:
    return float(response == label)


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k): the chance that k of the n samples, drawn without replacement, hold a pass."""
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize("batch", [32, 8, 4])  # all four problems in one generate call, two a call, one a call
def test_pass_at_1_and_pass_at_n_with_mixed_outcomes_per_problem(batch):
    examples = [SimpleNamespace(prompt=p, prompt_text=p, label="right") for p in SAMPLES]
    res = evaluate(ScriptedEngine(), examples, SamplingParams(n=4), word_reward, batch=batch)
    passes = [s.count("right") for s in SAMPLES.values()]  # 1, 0, 4, 2
    assert res["problems"] == 4 and res["n"] == 4
    expect_1 = sum(unbiased_pass_at_k(4, c, 1) for c in passes) / 4  # (0.25 + 0 + 1 + 0.5) / 4
    expect_4 = sum(unbiased_pass_at_k(4, c, 4) for c in passes) / 4  # (1 + 0 + 1 + 1) / 4
    assert res["pass@1"] == pytest.approx(expect_1) == pytest.approx(7 / 16)
    assert res["pass@4"] == pytest.approx(expect_4) == pytest.approx(0.75)
    assert res["avg@4"] == pytest.approx(7 / 16)  # a 0/1 reward: the mean reward is pass@1


def test_one_right_sample_of_four_is_pass_at_1_a_quarter_and_pass_at_4_one():
    examples = [SimpleNamespace(prompt="one of four", prompt_text="one of four", label="right")]
    res = evaluate(ScriptedEngine(), examples, SamplingParams(n=4), word_reward)
    assert (res["pass@1"], res["pass@4"]) == (0.25, 1.0)
