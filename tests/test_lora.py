"""LoRA training on peft (issue 32, item 2): only the adapters move, the sampler receives the merged
weights, checkpoints hold the adapter in peft's format and load with PeftModel.from_pretrained, resume is
exact, and a target that names no module fails before any rollout."""

from __future__ import annotations

import pytest
import torch

LORA = ("train.lora_rank=4", "train.lora_alpha=8", "train.lr=1e-2")


def _cfg(tmp_path, *extra):
    from test_train import TINY

    from sparserl.config import load_config, validate

    return validate(load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", "mismatch.alpha=off", *extra]))


def test_only_the_adapters_move_and_the_sampler_gets_the_merged_weights(tmp_path):
    from sparserl.batch import RolloutBatch
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score import score_logprobs
    from sparserl.train.lora import sampler_state, trainable_summary
    from sparserl.train.trainer import build_trainer, train_step

    trainer = build_trainer(_cfg(tmp_path, *LORA, "rollout.compressor=none"))
    learner = trainer.learner
    summary = trainer_summary = trainable_summary(learner)
    assert summary["mode"] == "lora" and summary["rank"] == 4 and 0 < summary["trainable"] < summary["total"] / 10
    before = {k: v.clone() for k, v in learner.state_dict().items()}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in learner.named_parameters() if ".lora_" in n}
    train_step(trainer, 1)
    after = learner.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved and all(".lora_B." in k or ".lora_A." in k for k in moved), sorted(moved)[:5]
    assert any(".lora_B." in k for k in moved)  # B leaves zero: the adapters now change the function
    # merged = W + (alpha / r) B A, under the base model's names
    merged = sampler_state(learner)
    name = "model.layers.0.self_attn.q_proj"
    A, B = after[f"{name}.lora_A.default.weight"], after[f"{name}.lora_B.default.weight"]
    W = after[f"{name}.base_layer.weight"]
    assert torch.allclose(merged[f"{name}.weight"], W + (8 / 4) * B @ A, atol=1e-6)
    assert not any(".lora_" in k or "base_layer" in k for k in merged)
    assert trainer_summary["trainable"] == sum(p.numel() for p in learner.parameters() if p.requires_grad)
    # the sampler (dense, float32) samples from the learner's merged policy: its log-probs are the learner's
    ro = trainer.engine.generate(["What is 2 + 3?", "hello"], SamplingParams(n=2, max_new_tokens=12, seed=3))
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index)
    scored = score_logprobs(learner, batch, 4, 1.0, False)
    assert (scored - batch.sampler_logprobs).abs().max() < 1e-4
    # and a sampler left with the base weights would not be (the test can fail)
    from sparserl.models.loading import load_model
    from sparserl.rollout.build import engine_from_fields

    plain = engine_from_fields(load_model("tiny", dtype="float32", seed=0), trainer.cfg.rollout)
    other = plain.generate(
        ["What is 2 + 3?", "hello"], SamplingParams(n=2, max_new_tokens=12, seed=3), forced=ro.response_ids
    )
    assert max(abs(a - b) for x, y in zip(other.sampler_logprobs, ro.sampler_logprobs) for a, b in zip(x, y)) > 1e-3


def test_a_checkpoint_holds_a_peft_adapter_and_resume_is_exact(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    from sparserl.models.loading import load_model
    from sparserl.runlog import read_metrics
    from sparserl.train.checkpoint import latest_checkpoint
    from sparserl.train.trainer import build_learner, train

    quiet = lambda *_: None  # noqa: E731  (a log function that drops every line)
    through = train(_cfg(tmp_path, *LORA, "train.steps=2"), run_dir=tmp_path / "through", log=quiet)
    stopped = train(_cfg(tmp_path, *LORA, "train.steps=1"), run_dir=tmp_path / "stopped", log=quiet)
    train(_cfg(tmp_path, *LORA, "train.steps=2"), resume=True, run_dir=stopped, log=quiet)
    folder = latest_checkpoint(through) / "model"
    assert (folder / "adapter_config.json").exists() and not list(folder.glob("model*.safetensors"))
    a, b = (
        load_file(str(folder / "adapter_model.safetensors")),
        load_file(str(latest_checkpoint(stopped) / "model" / "adapter_model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(k.startswith("base_model.model.") and ".lora_" in k for k in a)
    assert [r["policy/loss"] for r in read_metrics(stopped)] == [r["policy/loss"] for r in read_metrics(through)]
    # peft loads it onto the base model: the same function as the trained learner
    peft_model = PeftModel.from_pretrained(load_model("tiny", dtype="float32", seed=0).model, str(folder)).eval()
    cfg = _cfg(tmp_path, *LORA)
    _, learner, _, _ = build_learner(cfg)
    from sparserl.train.checkpoint import load_checkpoint

    load_checkpoint(latest_checkpoint(through), learner)
    ids = torch.tensor([[1, 5, 9, 22, 7, 3]])
    learner.eval()
    with torch.no_grad():
        assert torch.allclose(peft_model(input_ids=ids).logits, learner(input_ids=ids).logits, atol=1e-5)
        plain = load_model("tiny", dtype="float32", seed=0).model(input_ids=ids).logits
        assert not torch.allclose(plain, learner(input_ids=ids).logits, atol=1e-4)
    assert "LoRA adapters only (peft): rank 4" in (through / "report.md").read_text()


def test_a_lora_target_that_names_no_module_fails_before_any_rollout(tmp_path):
    from sparserl.config import ConfigError
    from sparserl.train.trainer import build_trainer

    with pytest.raises(
        ConfigError,
        match=r"train.lora_target=\['q_proj', 'qkv'\]: qkv names no linear module.*"
        r"its linear modules: down_proj, gate_proj, .*q_proj",
    ):
        build_trainer(_cfg(tmp_path, *LORA, "train.lora_target=[q_proj,qkv]"))


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.lora_rank=-1", "train.lora_rank=-1: must be >= 0"),
        ("train.lora_target=[]", "expected all-linear or a non-empty list"),
        ("train.lora_dropout=1", "train.lora_dropout=1: must be <"),
        ("train.lora_rank=4 rollout.quant_scale=1.5", "QuRL's invariant scaling"),
    ],
)
def test_bad_lora_options(tmp_path, override, message):
    from sparserl.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, *override.split())


def test_a_quantized_sampler_quantizes_the_merged_weights(tmp_path):
    """rollout.quant=int8: after a LoRA step the sampler holds int8(W + (alpha / r) B A), the same sampler as one
    built from the merged weights, and QuRL's metric sees the adapters' change."""
    from sparserl import runlog as names
    from sparserl.models.loading import load_model
    from sparserl.rollout.build import engine_from_fields
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.train.lora import sampler_state
    from sparserl.train.trainer import build_trainer, train_step

    cfg = _cfg(tmp_path, *LORA, "rollout.quant=int8", "rollout.compressor=none")
    trainer = build_trainer(cfg)
    metrics = train_step(trainer, 1)
    assert metrics[names.QUANT_UPDATE_VISIBLE] > 0
    params = SamplingParams(n=2, max_new_tokens=10, seed=1)
    ro = trainer.engine.generate(["What is 2 + 3?"], params)
    fresh = engine_from_fields(load_model("tiny", dtype="float32", seed=0), cfg.rollout, sampler_state(trainer.learner))
    again = fresh.generate(["What is 2 + 3?"], params, forced=ro.response_ids)
    assert again.sampler_logprobs == ro.sampler_logprobs
    base = engine_from_fields(load_model("tiny", dtype="float32", seed=0), cfg.rollout)
    other = base.generate(["What is 2 + 3?"], params, forced=ro.response_ids)
    assert other.sampler_logprobs != ro.sampler_logprobs
