"""Sparrow's acceptance α: exact on hand-built distributions, its top-k approximation a lower bound,
the tail by length bin; in training, the exact mode's replay reproduces the sampler and gives α = 1
when the sampler is the dense policy itself."""

from __future__ import annotations

import math

import pytest
import torch

from sparserl.mismatch.acceptance import acceptance, acceptance_topk, summary, tail_by_bin


def test_alpha_on_a_hand_built_pair():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.3, 0.4, 0.1])
    # min: 0.2 + 0.3 + 0.2 + 0 = 0.7 = 1 - TV, TV = (0.3 + 0 + 0.2 + 0.1) / 2 = 0.3
    assert float(acceptance(p.log(), q.log())) == pytest.approx(0.7)
    assert float(acceptance(q.log(), q.log())) == pytest.approx(1.0)
    disjoint = torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert float(acceptance(p.log(), disjoint.log())) == pytest.approx(0.0)
    # top-2 of q: tokens 2 and 1 -> min(0.2, 0.4) + min(0.3, 0.3) = 0.5 <= 0.7
    top_q, idx = q.log().topk(2)
    assert float(acceptance_topk(p.log(), top_q, idx)) == pytest.approx(0.5)
    top_q, idx = q.log().topk(4)
    assert float(acceptance_topk(p.log(), top_q, idx)) == pytest.approx(0.7)  # all of them: exact


def test_tail_by_bin_and_summary():
    alpha = torch.tensor([[1.0, 0.9, 0.5, 0.8], [0.95, 0.7, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    seq_len = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    bins = tail_by_bin(alpha, seq_len, mask, bin_width=12)
    assert set(bins) == {0, 12}
    assert bins[0][1] == 2 and bins[12][1] == 4  # 10, 11 | 12, 13, 20, 21
    assert bins[0][0] == pytest.approx(torch.quantile(torch.tensor([1.0, 0.9], dtype=torch.float64), 0.05).item())
    assert bins[12][0] == pytest.approx(
        torch.quantile(torch.tensor([0.5, 0.8, 0.95, 0.7], dtype=torch.float64), 0.05).item()
    )
    mean, p5 = summary(alpha, mask)
    assert mean == pytest.approx((1.0 + 0.9 + 0.5 + 0.8 + 0.95 + 0.7) / 6) and p5 < 0.6
    assert all(math.isnan(x) for x in summary(alpha, torch.zeros_like(mask)))


@pytest.mark.parametrize("mode", ["exact", "exact_replay", "topk"])
def test_alpha_in_training_is_logged_and_exact_replay_reproduces_the_sampler(tmp_path, monkeypatch, mode):
    from test_train import TINY

    from sparserl import runlog as names
    from sparserl.config import load_config, validate
    from sparserl.train import step as step_module
    from sparserl.train.trainer import build_trainer, train_step

    record = "mismatch.alpha_q=replay" if mode == "exact_replay" else "mismatch.alpha_q=hidden"
    cfg = validate(
        load_config(
            "sparse_rl_fixed40",
            [
                *TINY,
                f"log.out_dir={tmp_path}",
                f"mismatch.alpha={mode.split('_')[0]}",
                "mismatch.alpha_bin=64",
                "rollout.max_new_tokens=24",
                record,
            ],
        )
    )
    trainer = build_trainer(cfg)
    seen = []

    def both_ways(*args, **kwargs):  # α from the scoring forward's hidden states == α from a forward of its own
        shared, own = measure_alpha(*args, **kwargs), measure_alpha(*args[:-1], None, **kwargs)
        seen.append(args[-1])
        for key in shared.keys() - {names.TIME_ALPHA}:
            assert shared[key] == pytest.approx(own[key], abs=1e-6), key
        return shared

    measure_alpha = step_module.measure_alpha
    monkeypatch.setattr(step_module, "measure_alpha", both_ways)
    m = train_step(trainer, 1)
    assert seen and seen[0] is not None and seen[0].dim() == 3  # the scoring forward's hidden states were used
    assert 0.0 < m[names.MISMATCH_ALPHA_P5] <= m[names.MISMATCH_ALPHA_MEAN] <= 1.0 + 1e-6
    bins = {k: v for k, v in m.items() if k.startswith(names.MISMATCH_ALPHA_P5_BIN)}
    assert bins and all(int(k.rsplit("/", 1)[1]) % 64 == 0 for k in bins)
    assert m[names.TIME_ALPHA] > 0
    if mode == "exact_replay":
        assert m[names.MISMATCH_REPLAY_ERR] <= 1e-5  # the replay reproduced the sampler's log-probs
    else:  # the distributions kept while sampling: nothing replayed
        assert names.MISMATCH_REPLAY_ERR not in m


def test_exact_alpha_from_kept_distributions_equals_the_replay(tmp_path, monkeypatch):
    """mismatch.alpha_record_mib: the sampler keeps q while it samples (the 8 x 24 x 49,152 float32 of the tiny
    job: 36 MiB) and α reads it, without a replay; at 0, or when q would not fit, the replay runs. The α
    metrics agree to float rounding (the same q up to the replay's 1e-5)."""
    from test_train import TINY

    from sparserl import runlog as names
    from sparserl.config import load_config, validate
    from sparserl.mismatch import exact_alpha
    from sparserl.mismatch import replay as replay_module
    from sparserl.train.trainer import build_trainer, train_step

    replays = []
    real = replay_module.replay
    monkeypatch.setattr(exact_alpha, "replay", lambda *a, **k: replays.append(1) or real(*a, **k))
    out = {}
    for mib in (36, 35, 0):  # fits; one MiB short (replay); never
        cfg = validate(
            load_config(
                "sparse_rl_fixed40",
                [
                    *TINY,
                    f"log.out_dir={tmp_path}",
                    "mismatch.alpha=exact",
                    "rollout.max_new_tokens=24",
                    f"mismatch.alpha_record_mib={mib}",
                    "mismatch.alpha_q=kept",
                ],
            )
        )
        replays.clear()
        out[mib] = train_step(build_trainer(cfg), 1)
        assert len(replays) == (0 if mib == 36 else 1), mib
    for key in (names.MISMATCH_ALPHA_MEAN, names.MISMATCH_ALPHA_P5):
        assert out[36][key] == pytest.approx(out[0][key], abs=1e-5) and out[35][key] == out[0][key]
    assert out[36][names.MISMATCH_ALPHA_P5] < 0.999  # a compressed sampler: α measured something


def test_exact_alpha_is_one_when_the_sampler_is_the_dense_policy(tmp_path):
    """A dense float32 sampler of the learner's own weights: p = q at every token, α = 1."""
    from test_train import TINY

    from sparserl import runlog as names
    from sparserl.config import load_config, validate
    from sparserl.train.trainer import build_trainer, train_step

    cfg = validate(
        load_config(
            "sparse_rl_fixed40",
            [
                *TINY,
                f"log.out_dir={tmp_path}",
                "mismatch.alpha=exact",
                "rollout.compressor=none",
                "rollout.max_new_tokens=12",
            ],
        )
    )
    m = train_step(build_trainer(cfg), 1)
    assert m[names.MISMATCH_ALPHA_P5] == pytest.approx(1.0, abs=1e-4)
    assert m[names.MISMATCH_ALPHA_MEAN] == pytest.approx(1.0, abs=1e-5)


def test_dense_hidden_with_each_prompt_forwarded_once_equals_the_whole_rows(tiny):
    """p's hidden states from the shared-prompt forward (calibrate's, and training's α forward of its own) are
    the whole rows' up to float rounding, including micro-batches that split a group; the model's mode is
    left as it was."""
    from sparserl.batch import RolloutBatch
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score.hidden import dense_hidden, dense_hidden_shared

    engine = RolloutEngine(tiny, build_compressor("none"), dtype="float32")
    prompts = [[{"role": "user", "content": "What is 3 + 5?"}], [{"role": "user", "content": "Say hi, please."}]]
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=10, temperature=1.0, seed=4))
    batch = RolloutBatch.from_rollout(out.prompt_ids, out.response_ids, out.sampler_logprobs, out.prompt_index)
    batch = batch.to(tiny.model.device)  # where the learner's forward runs (CUDA under SPARSERL_TEST_DEVICE=cuda)
    T = batch.response_ids.shape[1]
    whole = dense_hidden(tiny.model, batch.input_ids, batch.attention_mask, batch.position_ids, T, 6)
    mask = batch.response_mask.bool()
    was_training = tiny.model.training
    tiny.model.train()  # a learner between updates: the forward runs in eval mode, then training mode again
    try:
        for micro in (6, 4):  # 4: the second group is split across two micro-batches
            shared = dense_hidden_shared(tiny.model, batch, micro)
            assert shared.shape == whole.shape
            assert torch.allclose(shared[mask], whole[mask], atol=1e-5, rtol=1e-4)
            assert tiny.model.training
    finally:
        tiny.model.train(was_training)
