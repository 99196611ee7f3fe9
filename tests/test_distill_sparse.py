"""DistillSparse (issue 32, item 3; Sparrow, docs/algorithms.md §3): the replay of what the sparse sampler read
reproduces its log-probs with gradients; φ's update leaves θ and the dense scorer untouched, moves φ, and
φ reaches the sampler; α is logged with and without φ; φ is saved and resumed with the run."""

from __future__ import annotations

import pytest
import torch

DISTILL = "algorithm.distill_sparse={rank: 4, lr: 0.01}"
PROMPTS = ["What is 2 + 3? Answer with one careful and rather long sentence.", "hello there, how are you today"]


def _cfg(tmp_path, *extra):
    from test_train import TINY

    from sparserl.config import load_config, validate

    return validate(
        load_config(
            "sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", "rollout.compress_prompt=true", DISTILL, *extra]
        )
    )


def _recorded(trainer, ro, params):
    """The sampler replayed on its own tokens, what each step read recorded (as the exact α records it)."""
    from sparserl.mismatch.replay import replay

    model = trainer.engine.model
    rec = trainer.distill.recorder(ro.prompt_ids, ro.response_ids, model.n_layers, model.n_kv)
    replay(trainer.engine, ro.prompt_ids, ro.response_ids, params, None, rec)
    return rec


def _max_err(log_q, ro) -> float:
    return max(abs(float(log_q[i, t]) - lp) for i, row in enumerate(ro.sampler_logprobs) for t, lp in enumerate(row))


@pytest.mark.parametrize(
    "compressor, extra",
    [
        ("rkv", []),
        ("snapkv", []),
        ("streaming", []),
        (
            "blocktopk",
            [
                "rollout.kv_budget=48",
                "rollout.max_new_tokens=40",
                "rollout.compress_prompt=false",
                "rollout.compressor_options={dense_layers: 0}",
            ],
        ),  # the tiny model's 2 layers both sparse
    ],
)
def test_the_replayed_attention_gives_the_samplers_logprobs(tmp_path, compressor, extra):
    """One forward with the recorded masks = the sparse sampler (per-head eviction, the prompt compressed,
    block top-k's pages), where the dense forward is far from it (the test can fail)."""
    from sparserl.batch import RolloutBatch
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score import score_logprobs
    from sparserl.train.trainer import build_trainer

    trainer = build_trainer(_cfg(tmp_path, f"rollout.compressor={compressor}", *extra))
    params = SamplingParams(n=4, max_new_tokens=trainer.cfg.rollout.max_new_tokens, seed=1)
    ro = trainer.engine.generate(PROMPTS, params)
    assert compressor == "blocktopk" or ro.kv.compressions > 0
    rec = _recorded(trainer, ro, params)
    assert all(m[:, :, t, len(p) + t].all() for m, p in zip(rec.masks, ro.prompt_ids) for t in range(m.shape[2]))
    with torch.no_grad():
        log_q = trainer.distill.logprobs(list(range(len(ro.response_ids))), max(map(len, ro.response_ids)))
    assert _max_err(log_q, ro) < 2e-5
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index)
    dense = score_logprobs(trainer.learner, batch, 4, 1.0, False)
    assert float(((dense - batch.sampler_logprobs) * batch.response_mask).abs().max()) > 0.05


def test_phi_moves_alone_and_reaches_the_sampler(tmp_path):
    """φ's step leaves the learner (θ) and the dense scorer's log-probs as they were, moves φ (B leaves zero),
    the sampler's weights become θ + (α/r) B A, and the sampler then samples from q_φ: its log-probs on
    forced tokens equal the replayed forward's with φ, and differ from θ's."""
    from sparserl.advantages import compute_advantages
    from sparserl.batch import RolloutBatch
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score import score_logprobs
    from sparserl.train.distill_sparse import REPLAY_ATTENTION
    from sparserl.train.lora import sampler_state
    from sparserl.train.trainer import build_trainer, push_weights

    trainer = build_trainer(_cfg(tmp_path))
    distill, learner = trainer.distill, trainer.learner
    assert learner.config is not distill.model.config and learner.config._attn_implementation != REPLAY_ATTENTION
    params = SamplingParams(n=4, max_new_tokens=16, seed=2)
    ro = trainer.engine.generate(PROMPTS, params)
    _recorded(trainer, ro, params)
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index)
    batch.rewards = torch.tensor([float(len(r) % 3 == 0) + 0.1 * i for i, r in enumerate(ro.response_ids)])
    batch.advantages = compute_advantages("grpo", batch.rewards, batch.group_ids)
    dense_before = score_logprobs(learner, batch, 4, 1.0, False)
    # the learner scores as a learner built without DistillSparse does (left-padded rows: padding masked)
    plain = build_trainer(_cfg(tmp_path, "algorithm.distill_sparse=null")).learner
    assert torch.equal(score_logprobs(plain, batch, 4, 1.0, False), dense_before)
    theta = {k: v.clone() for k, v in learner.state_dict().items()}
    phi_before = {n: p.clone() for n, p in distill.model.named_parameters() if ".lora_" in n}
    assert not {id(p) for p in learner.parameters()} & {id(p) for p in distill.phi}

    metrics = distill.step(learner, batch)
    assert all(torch.equal(v, theta[k]) for k, v in learner.state_dict().items())  # θ untouched
    assert torch.equal(score_logprobs(learner, batch, 4, 1.0, False), dense_before)  # the dense scorer too
    moved = [n for n, p in distill.model.named_parameters() if ".lora_" in n and not torch.equal(p, phi_before[n])]
    assert any(".lora_B." in n for n in moved)
    assert metrics["distill/k3_kl"] > 0 and metrics["distill/grad_norm"] > 0

    weights = distill.sampler_weights(learner)
    name = "model.layers.0.self_attn.q_proj"
    state = distill.model.state_dict()
    A, B = state[f"{name}.lora_A.default.weight"], state[f"{name}.lora_B.default.weight"]
    assert torch.allclose(weights[f"{name}.weight"], theta[f"{name}.weight"] + (16 / 4) * B @ A, atol=1e-6)
    assert float((B @ A).abs().max()) > 0

    push_weights(trainer)  # the sampler now holds θ + φ
    forced = trainer.engine.generate(PROMPTS, params, forced=ro.response_ids)
    _recorded(trainer, forced, params)
    with torch.no_grad():
        log_q = distill.logprobs(list(range(len(ro.response_ids))), max(map(len, ro.response_ids)))
    assert _max_err(log_q, forced) < 2e-5
    trainer.engine.update_weights(sampler_state(learner))  # θ alone: another distribution
    plain = trainer.engine.generate(PROMPTS, params, forced=ro.response_ids)
    assert max(abs(a - b) for x, y in zip(plain.sampler_logprobs, forced.sampler_logprobs) for a, b in zip(x, y)) > 1e-3


def test_alpha_with_and_without_phi_are_logged(tmp_path):
    """Step 1 samples with φ = 0 (B starts at zero): α with and without φ agree; after φ's first update they
    do not, and the step logs φ's loss."""
    from sparserl.train.trainer import build_trainer, train_step

    trainer = build_trainer(_cfg(tmp_path))
    first, second = train_step(trainer, 1), train_step(trainer, 2)
    assert first["mismatch/alpha_p5"] == first["mismatch/alpha_p5_nophi"]
    assert first["mismatch/alpha_mean"] == first["mismatch/alpha_mean_nophi"]
    assert second["mismatch/alpha_mean"] != second["mismatch/alpha_mean_nophi"]
    assert second["mismatch/replay_err"] < 1e-4  # the replay with φ reproduced the sampler with φ
    for key in ("distill/loss", "distill/pg_loss", "distill/k3_kl", "distill/grad_norm", "time/distill_s"):
        assert key in second


def test_phi_is_saved_and_resumed(tmp_path):
    """A run stopped after step 1 and resumed equals the run that went through: the same metrics (φ's too)
    and the same φ and optimizer state in the last checkpoint."""
    from safetensors.torch import load_file

    from sparserl.runlog import read_metrics
    from sparserl.train.checkpoint import latest_checkpoint
    from sparserl.train.trainer import train

    quiet = lambda *_: None  # noqa: E731  (a log function that drops every line)
    through = train(_cfg(tmp_path, "train.steps=2"), run_dir=tmp_path / "through", log=quiet)
    stopped = train(_cfg(tmp_path, "train.steps=1"), run_dir=tmp_path / "stopped", log=quiet)
    train(_cfg(tmp_path, "train.steps=2"), resume=True, run_dir=stopped, log=quiet)
    keys = ("distill/loss", "distill/k3_kl", "mismatch/alpha_p5", "mismatch/alpha_p5_nophi", "policy/loss")
    assert [[r[k] for k in keys] for r in read_metrics(stopped)] == [
        [r[k] for k in keys] for r in read_metrics(through)
    ]
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        a = load_file(str(latest_checkpoint(through) / "distill_sparse" / name))
        b = load_file(str(latest_checkpoint(stopped) / "distill_sparse" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (latest_checkpoint(through) / "distill_sparse" / "adapter_config.json").exists()
    report = (through / "report.md").read_text()  # which weights trained, and α without φ
    assert "DistillSparse's LoRA φ (rank 4" in report and "mismatch/alpha_p5_nophi" in report


def test_a_checkpoint_without_phi_is_refused_on_resume_with_distill(tmp_path):
    from sparserl.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
    from sparserl.train.trainer import build_trainer, train

    quiet = lambda *_: None  # noqa: E731  (a log function that drops every line)
    from test_train import TINY

    from sparserl.config import load_config, validate

    plain = validate(
        load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", "train.steps=1", "mismatch.alpha=off"])
    )
    run = train(plain, run_dir=tmp_path / "plain", log=quiet)
    trainer = build_trainer(_cfg(tmp_path))
    with pytest.raises(CheckpointError, match="no DistillSparse adapter"):
        load_checkpoint(latest_checkpoint(run), trainer.learner, sampler_adapter=trainer.distill)


def test_auto_sampler_dtype_is_float32_under_distill_sparse(tmp_path):
    """Its float32 replay reproduces what the sampler read, not a bf16 step's rounding: the trainer and
    every worker build from sampler_section, where auto is float32 with distill_sparse and untouched without."""
    from sparserl.config import load_config, validate
    from sparserl.rollout.build import sampler_section

    with_phi = _cfg(tmp_path, "rollout.dtype=auto")
    assert sampler_section(with_phi).dtype == "float32" and with_phi.rollout.dtype == "auto"
    from test_train import TINY

    plain = validate(load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", "rollout.dtype=auto"]))
    assert sampler_section(plain) is plain.rollout
