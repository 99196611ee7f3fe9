"""The shipped presets keep the meaning they were measured with.

``default`` is the recommended run: R-KV over the whole cache from 40 tokens with Sparse-RL's correction
and the online α-tail controller (threshold 0.86, ceiling 64, bins of 32), measured in
docs/results/compare_shipped/ (2.17x less KV allocated than dense, reward -0.07 [-0.37, +0.23] against
dense, 6 seeds paired). ``sparse_rl_fixed40`` is the same job at a fixed budget of 40, and the other presets
of the main job are that one with one thing changed. ``long`` is the default at 1,024 new tokens (its budgets,
bins, task prompt and eval size scaled to the length; docs/results/long_task_choice/). Each preset's resolved
keys that differ from the schema's defaults are pinned here, as the runs in docs/results/ ran them; a change to a
preset, or to a default a preset relies on, fails here and says which key moved.
"""

import pytest

from sparserl.config import Config, config_to_dict, list_presets, load_config, validate

#: the fixed-budget job: R-KV holding the whole cache to 40 tokens, Sparse-RL's correction
FIXED40 = {
    "checkpoint.every": 6,
    "checkpoint.keep_last": 1,
    "data.eval": "arith:seed=1000",
    "data.eval_limit": 32,
    "data.system_prompt": (
        "You are a careful math tutor. Read the problem, add or subtract the numbers it gives, "
        "and reply with one short sentence that ends with the final answer as a number in \\boxed{}."
    ),
    "rollout.compress_prompt": True,
    "rollout.dtype": "auto",
    "rollout.kv_budget": 40,
    "rollout.max_new_tokens": 48,
    "rollout.step_length": 2,
    "train.lr": 3e-05,
    "train.micro_batch_size": 32,
    "train.prompts_per_step": 4,
    "train.steps": 12,
}

#: every preset's keys that differ from the schema's defaults (``name`` aside)
EXPECTED = {
    "sparse_rl_fixed40": FIXED40,
    "default": {
        **FIXED40,
        "mismatch.alpha_bin": 32,
        "rollout.kv_controller": {
            "bin": None,
            "margin": 0.04,
            "max_budget": 64,
            "min_budget": 16,
            "patience": 2,
            "step": 8,
            "threshold": 0.86,
        },
    },
    "dense": {
        **FIXED40,
        "algorithm.correction": "none",
        "rollout.compressor": "none",
    },
    "sparse_naive": {
        **FIXED40,
        "algorithm.correction": "none",
    },
    "fp8rl": {
        **FIXED40,
        "algorithm.correction": "fp8rl",
        "rollout.compressor": "none",
        "rollout.kv_quant": "fp8",
        "rollout.quant": "fp8",
    },
    "qurl": {
        **FIXED40,
        "algorithm.correction": "qurl",
        "rollout.compressor": "none",
        "rollout.quant": "int8",
        "rollout.quant_scale": 1.5,
    },
    "qurl_group": {
        **FIXED40,
        "algorithm.correction": "qurl",
        "rollout.compressor": "none",
        "rollout.quant": "int8_group",
        "rollout.quant_group": 32,
        "rollout.quant_head": True,
        "rollout.quant_scale": 1.5,
        "rollout.quant_smooth": 0.5,
    },
    "rkv_int8": {
        **FIXED40,
        "rollout.kv_quant": "int8",
        "rollout.quant": "int8",
    },
    "long": {  # the default with rollout.step_length back at the schema's 32
        **{k: v for k, v in FIXED40.items() if k != "rollout.step_length"},
        "data.eval": "arith:difficulty=1,seed=1000",
        "data.eval_limit": 16,
        "data.system_prompt": (
            "You are a careful math tutor. Think step by step: write down the numbers the problem gives, work "
            "through each operation on its own line and show your work, check the result, then give the final "
            "answer as a number in \\boxed{}."
        ),
        "data.train": "arith:difficulty=1",
        "rollout.kv_budget": 256,
        "rollout.kv_controller": {
            "bin": None,
            "margin": 0.04,
            "max_budget": 512,
            "min_budget": 128,
            "patience": 2,
            "step": 32,
            "threshold": 0.86,
        },
        "rollout.max_new_tokens": 1024,
    },
    "sparse_rl_math": {
        "algorithm.kl_coef": 0.0001,
        "checkpoint.every": 20,
        "data.eval": "math500",
        "data.eval_limit": None,
        "data.train": "math_level3to5",
        "eval.compressor": "none",
        "eval.every": 20,
        "model.name": "/path/to/Qwen2.5-1.5B-Instruct",
        "rollout.compressor_options": {"lam": 0.1, "per_head": False},
        "rollout.kv_budget": 512,
        "rollout.max_new_tokens": 4096,
        "rollout.step_length": 128,
        "train.lr": 1e-06,
        "train.max_tokens_per_micro_batch": 18432,
        "train.micro_batch_size": 4,
        "train.prompts_per_step": 128,
        "train.steps": 100,
        "train.weight_decay": 0.1,
    },
}


def flat(d: dict, prefix: str = "") -> dict:
    """``section.key`` -> value (a sub-section such as rollout.kv_controller stays one mapping)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and not prefix and k != "name":
            out.update(flat(v, k + "."))
        else:
            out[prefix + k] = v
    return out


def non_default(cfg: Config) -> dict:
    """The keys a preset sets away from the schema's defaults (``train.max_tokens_per_micro_batch`` against what
    its ``auto`` gives for this preset's lengths)."""
    defaults = {**flat(config_to_dict(Config())), "train.max_tokens_per_micro_batch": cfg.auto_token_budget()}
    return {k: v for k, v in flat(config_to_dict(cfg)).items() if k != "name" and v != defaults.get(k)}


def test_every_shipped_preset_is_pinned():
    assert sorted(EXPECTED) == list_presets()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_resolves_to_what_was_measured(name):
    got, want = non_default(load_config(name)), EXPECTED[name]
    moved = {
        k: (want.get(k, "<default>"), got.get(k, "<default>"))
        for k in set(got) | set(want)
        if got.get(k, "<default>") != want.get(k, "<default>")
    }
    assert not moved, f"{name}: key: (expected, got): {moved}"


def test_default_is_the_controller_on_the_fixed_budget_job():
    """The default differs from sparse_rl_fixed40 only by the controller and the α bins it steers."""
    default, fixed = (
        flat(config_to_dict(load_config("default"))),
        flat(config_to_dict(load_config("sparse_rl_fixed40"))),
    )
    assert {k for k in default if default[k] != fixed[k]} == {"name", "rollout.kv_controller", "mismatch.alpha_bin"}
    kc = load_config(None).rollout.kv_controller
    assert (kc.threshold, kc.margin, kc.patience, kc.min_budget, kc.max_budget, kc.step) == (0.86, 0.04, 2, 16, 64, 8)


@pytest.mark.parametrize("name", ["default", "sparse_rl_fixed40", "long"])
def test_default_and_renamed_preset_validate(name):
    cfg = validate(load_config(name))
    assert cfg.name == name


def test_default_runs_one_step_on_the_tiny_model(tmp_path):
    """``sparserl train``'s preset trains a step on the tiny model, its controller reading the α tail."""
    import json

    from test_train import TINY

    from sparserl.train.trainer import train

    cfg = validate(
        load_config(
            "default",
            [
                *TINY,
                f"log.out_dir={tmp_path}",
                "train.steps=1",
                "rollout.kv_controller.min_budget=8",
                "mismatch.alpha_bin=16",
            ],
        )
    )
    assert cfg.rollout.kv_controller is not None
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert "mismatch/alpha_p5" in rows[0] and any(k.startswith("kv/budget_bin/") for k in rows[0])


def test_long_is_the_default_at_length():
    """``long`` keeps the default's sampler, correction, controller rule and learner; it changes only the lengths,
    the budgets scaled to them, the micro-batches' token budget, the task's prompt and the run's size."""
    long, default = flat(config_to_dict(load_config("long"))), flat(config_to_dict(load_config("default")))
    assert {k for k in long if long[k] != default[k]} == {
        "name",
        "rollout.max_new_tokens",
        "rollout.kv_budget",
        "rollout.step_length",
        "rollout.kv_controller",
        "mismatch.alpha_bin",
        "data.train",
        "data.eval",
        "data.system_prompt",
        "data.eval_limit",
        "train.max_tokens_per_micro_batch",
    }
    kc, dc = load_config("long").rollout.kv_controller, load_config("default").rollout.kv_controller
    assert (kc.threshold, kc.margin, kc.patience) == (dc.threshold, dc.margin, dc.patience)
    cfg = load_config("long")
    assert cfg.rollout.max_new_tokens >= 1024
    assert cfg.train.prompts_per_step * cfg.rollout.n == 32
    assert kc.min_budget <= cfg.rollout.kv_budget <= kc.max_budget
    assert cfg.mismatch.alpha_q == "hidden"  # exact α without a replay: a kept q would be 32 x 1,024 x V floats


def test_long_runs_one_step_on_the_tiny_model(tmp_path):
    """``sparserl train long`` trains a step on the tiny model with its lengths shortened, its controller
    reading the α tail of its length bins."""
    import json

    from test_train import TINY

    from sparserl.train.trainer import train

    cfg = validate(
        load_config(
            "long",
            [
                *TINY,
                f"log.out_dir={tmp_path}",
                "train.steps=1",
                "rollout.kv_controller.min_budget=8",
                "rollout.kv_controller.max_budget=16",
                "rollout.kv_controller.step=4",
                "mismatch.alpha_bin=16",
            ],
        )
    )
    assert cfg.name == "long" and cfg.data.train == "arith:difficulty=1"
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert "mismatch/alpha_p5" in rows[0] and any(k.startswith("kv/budget_bin/") for k in rows[0])
