"""sparserl.preflight: a run's checks before its real work, with no weight loaded."""

import pytest

from sparserl.config import ConfigError, load_config
from sparserl.data import DataError
from sparserl.preflight import model_linear_names, preflight
from sparserl.reward import RewardSpecError

TINY = ["model.name=tiny", "data.eval=null"]


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights fails the test: every refusal must come before it."""
    import transformers

    from sparserl.models import loading

    def refuse(*_a, **_k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(loading, "load_tiny", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def test_a_reward_module_that_does_not_import_is_refused_naming_the_key(no_weights):
    with pytest.raises(RewardSpecError, match=r"reward\.fn='no_such_module_h2:score'.*no_such_module_h2"):
        preflight(load_config("sparse_rl_fixed40", [*TINY, "reward.fn=no_such_module_h2:score"]))
    with pytest.raises(RewardSpecError, match=r"reward\.fn=.*no attribute"):
        preflight(load_config("sparse_rl_fixed40", [*TINY, "reward.fn=[math, json:no_such_function]"]))


def test_a_lora_target_naming_no_module_is_refused_with_the_model_s_modules(no_weights):
    with pytest.raises(
        ConfigError,
        match=r"train\.lora_target=\['q_proj', 'qq_proj'\]: qq_proj names no linear "
        r"module of tiny; its linear modules: down_proj, .*v_proj",
    ):
        preflight(load_config("sparse_rl_fixed40", [*TINY, "train.lora_rank=4", "train.lora_target=[q_proj, qq_proj]"]))
    with pytest.raises(ConfigError, match=r"algorithm\.distill_sparse\.target"):
        preflight(
            load_config(
                "sparse_rl_fixed40",
                [*TINY, "algorithm.distill_sparse={rank: 4, target: [attn]}", "rollout.dtype=float32"],
            )
        )
    preflight(load_config("sparse_rl_fixed40", [*TINY, "train.lora_rank=4", "train.lora_target=[q_proj, v_proj]"]))


def test_the_embedded_model_s_modules_come_from_its_gguf_header(tmp_path, monkeypatch, no_weights):
    monkeypatch.setenv("SPARSERL_CACHE", str(tmp_path))  # no converted folder: the GGUF's header is read
    assert model_linear_names("smollm2-135m") == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "lm_head",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    assert not any(tmp_path.iterdir())  # nothing converted or written


def test_data_and_model_and_rules_are_checked(tmp_path, no_weights):
    with pytest.raises(DataError, match=r"data\.train='.*missing\.jsonl'"):
        preflight(load_config("sparse_rl_fixed40", [*TINY, f"data.train={tmp_path / 'missing.jsonl'}"]))
    with pytest.raises(DataError, match=r"data\.eval="):
        preflight(load_config("sparse_rl_fixed40", [*TINY, f"data.eval={tmp_path / 'missing.jsonl'}"]))
    with pytest.raises(Exception, match=r"model 'no/such/model' not found"):
        preflight(load_config("sparse_rl_fixed40", ["model.name=no/such/model"]))
    with pytest.raises(ConfigError, match=r"train\.min_lr_ratio"):
        preflight(load_config("sparse_rl_fixed40", [*TINY, "train.min_lr_ratio=0.1"]))


def test_the_shipped_default_passes(no_weights):
    preflight(load_config("default", ["model.name=tiny"]))
