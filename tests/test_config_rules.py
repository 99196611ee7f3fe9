"""The configuration package's shape and its rules between keys (sparserl.config.rules)."""

import subprocess
import sys

import pytest

from sparserl.config import ConfigError, load_config, validate
from sparserl.config.rules import LAST, RULES


def test_the_schema_and_the_package_import_no_torch():
    code = (
        "import sys, sparserl.config.schema; assert 'torch' not in sys.modules, 'schema'\n"
        "import sparserl.config; assert 'torch' not in sys.modules, 'package'\n"
        "bad = sorted(m for m in sys.modules if m.startswith('sparserl.') and not m.startswith("
        "('sparserl.config', 'sparserl.errors', 'sparserl.registry')))\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_quant_group_default_is_the_kernel_s():
    from sparserl.config.schema import QUANT_GROUP
    from sparserl.rollout.quant.int8_group import GROUP

    assert QUANT_GROUP == GROUP


def test_every_rule_is_a_named_function_with_a_docstring():
    for rule in (*RULES, *LAST):
        assert rule.__doc__ and rule.__module__.startswith("sparserl.config.rules.")


def test_max_nonfinite_steps():
    assert load_config("default").train.max_nonfinite_steps == 3
    with pytest.raises(ConfigError, match=r"train\.max_nonfinite_steps=0: must be >= 1"):
        load_config("default", ["train.max_nonfinite_steps=0"])


# an option that does nothing as configured: (overrides, the key refused, the key that would enable it)
UNUSED = [
    (["train.lora_target=[q_proj]"], "train.lora_target", "train.lora_rank"),
    (["train.lora_alpha=32"], "train.lora_alpha", "train.lora_rank"),
    (["train.lora_dropout=0.1"], "train.lora_dropout", "train.lora_rank"),
    (
        ["rollout.compressor=none", "rollout.kv_controller=null", "rollout.kv_schedule=[[0, 32]]"],
        "rollout.kv_schedule",
        "rollout.compressor",
    ),
    (["algorithm.max_gen_batches=8"], "algorithm.max_gen_batches", "algorithm.filter_groups"),
    (["train.min_lr_ratio=0.1"], "train.min_lr_ratio", "train.lr_scheduler"),
    (["algorithm.kl_kind=k3"], "algorithm.kl_kind", "algorithm.kl_coef"),
    (["mismatch.alpha_topk=10"], "mismatch.alpha_topk", "mismatch.alpha=topk"),
]


@pytest.mark.parametrize("overrides, key, enabler", UNUSED, ids=[u[1] for u in UNUSED])
def test_an_option_that_does_nothing_is_refused_naming_what_enables_it(overrides, key, enabler):
    with pytest.raises(ConfigError) as e:
        validate(load_config("default", overrides))
    line = next(x for x in str(e.value).splitlines() if key in x)
    assert enabler in line


ENABLED = [
    ["train.lora_rank=4", "train.lora_target=[q_proj]", "train.lora_alpha=32", "train.lora_dropout=0.1"],
    ["rollout.kv_schedule=[[0, 32]]", "rollout.kv_controller=null"],
    ["algorithm.filter_groups=true", "algorithm.max_gen_batches=8"],
    ["train.lr_scheduler=cosine", "train.min_lr_ratio=0.1"],
    ["algorithm.kl_coef=0.001", "algorithm.kl_kind=k3"],
    ["mismatch.alpha=topk", "mismatch.alpha_topk=10"],
]


@pytest.mark.parametrize("overrides", ENABLED, ids=[o[0] for o in ENABLED])
def test_the_same_option_with_its_feature_on_is_accepted(overrides):
    validate(load_config("default", overrides))


def test_a_key_given_at_its_default_counts_as_not_given(tmp_path):
    """A preset or override that writes a key at its default value (kl_kind: low_var_kl, lora_target:
    all-linear, max_gen_batches: 4) changes nothing and is not refused; a value set in a file that bases on
    a preset and then overridden back to the default is accepted too."""
    validate(
        load_config(
            "default",
            [
                "algorithm.kl_kind=low_var_kl",
                "train.lora_target=all-linear",
                "algorithm.max_gen_batches=4",
                "train.min_lr_ratio=0",
            ],
        )
    )
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: default\ntrain:\n  lora_target: [q_proj, v_proj]\n")
    with pytest.raises(
        ConfigError,
        match=r"train\.lora_target=\['q_proj', 'v_proj'\] does nothing with "
        r"train\.lora_rank=0",
    ):
        validate(load_config(str(mine)))
    validate(load_config(str(mine), ["train.lora_target=all-linear"]))
    validate(load_config(str(mine), ["train.lora_rank=8"]))
