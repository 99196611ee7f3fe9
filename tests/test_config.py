"""Config: presets, YAML + overrides with types, errors that name the key, validation, round trip."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from sparserl import advantages
from sparserl.config import (
    SECTIONS,
    AlgorithmConfig,
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    config_help,
    config_to_dict,
    list_presets,
    load_config,
    save_config,
    validate,
)
from sparserl.correct import available_corrections, available_presets, register_correction
from sparserl.errors import SparserlError
from sparserl.rollout import kv
from sparserl.train import losses

PRESETS = (
    "default",
    "sparse_rl_fixed40",
    "sparse_rl_math",
    "dense",
    "sparse_naive",
    "qurl",
    "qurl_group",
    "fp8rl",
    "rkv_int8",
)
REPO = Path(__file__).resolve().parents[1]


def test_defaults_are_valid_and_documented():
    cfg = Config()
    validate(cfg)
    assert cfg.rollout.compressor == "rkv" and cfg.rollout.n == 8
    assert cfg.algorithm.clip_eps_high is None and cfg.algorithm.clip_eps_upper == 0.2
    assert cfg.train.betas == (0.9, 0.98) and cfg.train.mini_batch_prompts is None
    assert set(SECTIONS) == set(Config.model_fields) - {"name"}
    for sec, cls in SECTIONS.items():
        for key, f in cls.model_fields.items():
            assert f.description, f"{sec}.{key} has no help text"
    text = config_help()
    assert "rollout.kv_budget (int, default 64)" in text
    assert "train.warmup_steps" in text and "optimizer updates" in text
    assert "checkpoint.every (int, default 10): Save every N steps (0 = only at the end)" in text
    assert issubclass(ConfigError, SparserlError) and issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("name", sorted(set(PRESETS) | set(list_presets())))  # and any preset added later
def test_presets_load_and_validate(name):
    assert name in list_presets()
    cfg = validate(load_config(name))
    assert cfg.name == name
    assert isinstance(cfg.train.lr, float) and isinstance(cfg.train.betas, tuple)


def test_default_preset_is_the_cpu_job():
    cfg = load_config(None)
    assert cfg.name == "default"
    assert cfg.model.name == "smollm2-135m"
    assert cfg.rollout.compressor == "rkv" and cfg.algorithm.correction == "sparse_rl"
    # compression bites in every step whatever the answers' length: the whole cache (prompt
    # included, 70-90 tokens with the system prompt) is held to budget + period tokens
    assert cfg.rollout.compress_prompt and cfg.data.system_prompt
    assert cfg.rollout.kv_budget + cfg.rollout.step_length <= 48
    assert cfg.train.lr == pytest.approx(3e-5) and cfg.model.dtype == "float32"
    # the online α-tail controller steers the budget per bin of 32 tokens, up to a ceiling of 64
    kc = cfg.rollout.kv_controller
    assert (kc.threshold, kc.max_budget, cfg.mismatch.alpha_bin) == (0.86, 64, 32)


def test_paper_preset_numbers():
    cfg = load_config("sparse_rl_math")
    assert (cfg.train.prompts_per_step, cfg.rollout.n, cfg.train.steps) == (128, 8, 100)
    assert cfg.rollout.max_new_tokens == 4096 and cfg.rollout.kv_budget == 512
    assert cfg.rollout.step_length == 128
    assert cfg.train.lr == pytest.approx(1e-6) and cfg.train.weight_decay == pytest.approx(0.1)
    assert cfg.algorithm.kl_coef == pytest.approx(1e-4) and cfg.algorithm.kl_kind == "low_var_kl"


def test_dense_and_naive_are_the_fixed_budget_job_with_one_change():
    default, dense, naive = load_config("sparse_rl_fixed40"), load_config("dense"), load_config("sparse_naive")
    assert dense.rollout.compressor == "none" and dense.algorithm.correction == "none"
    assert naive.rollout.compressor == default.rollout.compressor
    assert naive.algorithm.correction == "none"
    d, n = config_to_dict(default), config_to_dict(naive)
    d.pop("name"), n.pop("name")
    d["algorithm"].pop("correction"), n["algorithm"].pop("correction")
    assert d == n  # only the correction differs


def test_yaml_file_and_overrides_with_types(tmp_path):
    (tmp_path / "parent.yaml").write_text(
        "base: sparse_rl_fixed40\nrollout:\n  compressor_options: {lam: 0.3, kernel: 3}\n"
    )
    p = tmp_path / "mine.yaml"
    p.write_text(
        "base: parent.yaml\n"
        "rollout:\n  kv_budget: 48\n  compressor_options: {kernel: 5}\n"
        "train:\n  lr: 2e-5\n  betas: [0.8, 0.9]\n"
    )
    cfg = load_config(
        str(p),
        [
            "rollout.n=4",
            "train.lr=3e-6",
            'rollout.stop=["\\n\\n", "###"]',
            "algorithm.clip_eps_high=0.28",
            "rollout.compressor_options.lam=0.2",
            "data.limit=null",
            "data.train=arith:digits=2",
            "log.run_name=007",
            "rollout.compress_prompt=true",
        ],
    )
    assert cfg.name == "mine"
    assert cfg.rollout.kv_budget == 48 and isinstance(cfg.rollout.kv_budget, int)
    assert cfg.rollout.n == 4
    assert cfg.train.lr == 3e-6 and isinstance(cfg.train.lr, float)
    assert cfg.train.betas == (0.8, 0.9)
    assert cfg.rollout.stop == ["\n\n", "###"]
    assert cfg.algorithm.clip_eps_high == pytest.approx(0.28)
    # a sub-section's key, dotted: set on the preset's own sub-section, or on defaults where it was null
    controlled = load_config("default", ["rollout.kv_controller.threshold=0.7", "algorithm.distill_sparse.rank=8"])
    assert controlled.rollout.kv_controller.threshold == 0.7 and controlled.rollout.kv_controller.max_budget == 64
    assert controlled.algorithm.distill_sparse.rank == 8
    assert load_config("sparse_rl_fixed40", ["rollout.kv_controller.step=4"]).rollout.kv_controller.step == 4
    # the mapping merges key by key over the base's, then the override sets one entry
    assert cfg.rollout.compressor_options == {"lam": 0.2, "kernel": 5}
    assert load_config(str(p)).rollout.compressor_options == {"lam": 0.3, "kernel": 5}
    assert load_config(str(p)).rollout.max_new_tokens == load_config("sparse_rl_fixed40").rollout.max_new_tokens
    assert cfg.data.limit is None and cfg.data.train == "arith:digits=2"
    assert cfg.log.run_name == "007"
    assert cfg.rollout.compress_prompt is True
    # YAML 1.2 floats in files: 2e-5 would be a string under plain PyYAML
    assert load_config(str(p)).train.lr == pytest.approx(2e-5)
    assert load_config(str(p), ["algorithm.clip_eps_high=null"]).algorithm.clip_eps_high is None


def test_int_is_accepted_for_float_but_not_the_reverse():
    cfg = load_config("sparse_rl_fixed40", ["train.lr=1", "reward.timeout_s=3"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    with pytest.raises(ConfigError, match=r"rollout\.kv_budget.*int"):
        load_config("sparse_rl_fixed40", ["rollout.kv_budget=1.5"])


def test_unknown_key_in_yaml_names_file_key_and_suggestion(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("rollout:\n  kv_budgett: 64\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    msg = str(e.value)
    assert str(p) in msg and "rollout.kv_budgett" in msg and "rollout.kv_budget" in msg


def test_unknown_section_in_yaml(tmp_path):
    p = tmp_path / "sec.yaml"
    p.write_text("rolout:\n  n: 4\n")
    with pytest.raises(ConfigError, match=r"sec\.yaml.*'rolout'.*'rollout'"):
        load_config(str(p))


def test_unknown_override_key_and_section():
    with pytest.raises(ConfigError, match=r"override.*train\.lrr.*train\.lr"):
        load_config("sparse_rl_fixed40", ["train.lrr=1e-5"])
    with pytest.raises(ConfigError, match=r"override.*'trian'.*'train'"):
        load_config("sparse_rl_fixed40", ["trian.lr=1e-5"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config("sparse_rl_fixed40", ["train.lr"])
    with pytest.raises(ConfigError, match="not a mapping"):
        load_config("sparse_rl_fixed40", ["train.lr.x=1"])


def test_type_errors_name_key_and_type(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.n.*expects int.*str"):
        load_config("sparse_rl_fixed40", ["rollout.n=eight"])
    with pytest.raises(ConfigError, match=r"rollout\.stop.*list of str"):
        load_config("sparse_rl_fixed40", ["rollout.stop=7"])
    with pytest.raises(ConfigError, match=r"train\.betas"):
        load_config("sparse_rl_fixed40", ["train.betas=[0.9]"])
    with pytest.raises(ConfigError, match=r"log\.tensorboard.*bool"):
        load_config("sparse_rl_fixed40", ["log.tensorboard=yes"])  # YAML 1.2: 'yes' is a string
    p = tmp_path / "t.yaml"
    p.write_text("train:\n  steps: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"t\.yaml.*train\.steps.*int.*list"):
        load_config(str(p))


def test_unknown_preset():
    with pytest.raises(ConfigError, match="dense"):
        load_config("dence")


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (["rollout.kv_budget=8", "rollout.window=8"], r"kv_budget=8 must be larger than rollout\.window=8"),
        (["rollout.n=1"], r"rollout\.n=1.*n >= 2"),
        (["rollout.compressor=rkvv"], r"rollout\.compressor='rkvv'.*did you mean 'rkv'"),
        (["rollout.top_p=0"], r"top_p"),
        (["rollout.temperature=-1"], r"temperature"),
        (["train.prompts_per_step=8", "train.mini_batch_prompts=3"], r"divisible"),
        (["train.lr=0"], r"train\.lr"),
        (["algorithm.loss_agg=sum"], r"loss_agg"),
        (["algorithm.kl_kind=k4"], r"kl_kind"),
        (["algorithm.adv_estimator=ppo"], r"adv_estimator"),
    ],
)
def test_validation_errors(overrides, pattern):
    # a value's own type/range/name fails as it is loaded, a cross-field rule in validate
    with pytest.raises(ConfigError, match=pattern):
        validate(load_config("sparse_rl_fixed40", overrides))


def test_validation_accepts_dense_small_budget_and_lists_all_errors():
    validate(load_config("sparse_rl_fixed40", ["rollout.compressor=none", "rollout.kv_budget=4"]))
    with pytest.raises(ConfigError) as e:
        validate(load_config("sparse_rl_fixed40", ["rollout.n=1", "train.mini_batch_prompts=3"]))
    assert "rollout.n" in str(e.value) and "train.mini_batch_prompts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config("sparse_rl_fixed40", ["rollout.n=0", "train.lr=-1"])
    assert "rollout.n" in str(e.value) and "train.lr" in str(e.value)


def test_round_trip_save_load(tmp_path):
    cfg = load_config(
        "sparse_rl_math",
        [
            "rollout.stop=['\\n\\n']",
            "rollout.compressor_options.kernel=7",
            "algorithm.clip_eps_high=0.28",
            "train.mini_batch_prompts=32",
        ],
    )
    path = save_config(cfg, tmp_path / "run" / "config.yaml")
    back = load_config(str(path))
    assert back == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_apply_overrides_on_object_and_section_mapping():
    cfg = Config()
    apply_overrides(cfg, ["rollout={kv_budget: 40, n: 2}", "name=exp1"])
    assert (cfg.rollout.kv_budget, cfg.rollout.n, cfg.name) == (40, 2, "exp1")


def test_correction_checked_against_registry_when_present():
    with pytest.raises(ConfigError, match=r"algorithm\.correction='sparse_rll'.*did you mean 'sparse_rl'"):
        validate(load_config("sparse_rl_fixed40", ["algorithm.correction=sparse_rll"]))
    with pytest.raises(ConfigError, match=r"token_lo"):
        validate(load_config("sparse_rl_fixed40", ["algorithm.correction_options={token_lo: 0.4}"]))
    validate(load_config("sparse_rl_fixed40", ["algorithm.correction_options={token_low: 0.4}"]))
    cfg = validate(load_config("sparse_rl_fixed40", ["algorithm.correction=[tis, rejection]"]))
    assert cfg.algorithm.correction == ["tis", "rejection"]


def test_compressor_options_checked_when_compressors_present():
    validate(load_config("sparse_rl_math"))  # lam, per_head are R-KV options
    with pytest.raises(ConfigError, match=r"rollout\.compressor_options.*lamb"):
        validate(load_config("sparse_rl_fixed40", ["rollout.compressor_options.lamb=0.2"]))


def test_all_errors_of_a_file_in_one_message(tmp_path):
    p = tmp_path / "many.yaml"
    p.write_text(
        "rollout:\n  kv_budgett: 64\n  n: 0\n  trigger: often\n"
        "train:\n  lr: fast\n  betas: [0.9, 1.5]\nalgorithm:\n  clip_eps: -0.1\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(p), ["data.limit=0"])
    msg = str(e.value)
    assert msg.startswith("7 problems")
    for key in (
        "rollout.kv_budgett",
        "rollout.n=0",
        "rollout.trigger='often'",
        "'train.lr'",
        "train.betas[1]=1.5",
        "algorithm.clip_eps=-0.1",
    ):
        assert f"{p}: " in msg.split(key)[0].rsplit("\n", 1)[-1], key  # each line names the file
    assert "override: data.limit=0: must be >= 1" in msg
    assert "did you mean 'rollout.kv_budget'" in msg and "not one of step_length, newline" in msg
    assert "pydantic" not in msg and "Input should" not in msg  # no raw pydantic text


def test_field_constraint_names_key_and_bound():
    for ov, text in [
        ("rollout.top_p=0", "rollout.top_p=0: must be > 0"),
        ("rollout.top_p=2", "rollout.top_p=2: must be <= 1"),
        ("rollout.kv_budget=0", "rollout.kv_budget=0: must be >= 1"),
        ("train.betas=[0.9, 1.0]", "train.betas[1]=1.0: must be < 1"),
        ("eval.max_new_tokens=0", "eval.max_new_tokens=0: must be >= 1"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config("sparse_rl_fixed40", [ov])
        assert str(e.value) == f"override: {text}"
    cfg = Config()
    with pytest.raises(ConfigError, match=r"rollout\.kv_budget=0: must be >= 1"):
        cfg.rollout.kv_budget = 0  # assignment is checked too
    assert cfg.rollout.kv_budget == 64


@pytest.mark.parametrize(
    "key, bad, good, names",
    [
        ("rollout.compressor", "snapkvv", "snapkv", kv.available_compressors),
        ("eval.compressor", "stream", "streaming", kv.available_compressors),
        ("algorithm.correction", "tiss", "tis", available_corrections),
        ("algorithm.adv_estimator", "rlooo", "rloo", advantages.available_adv_ests),
    ],
)
def test_unknown_registry_name_lists_names_and_closest(key, bad, good, names):
    with pytest.raises(ConfigError) as e:
        load_config("sparse_rl_fixed40", [f"{key}={bad}"])
    msg = str(e.value)
    assert f"{key}={bad!r}" in msg and f"did you mean '{good}'" in msg
    for n in names():
        assert n in msg
    if key == "algorithm.correction":
        assert all(p in msg for p in available_presets())
    if key.endswith("compressor"):
        assert "none" in msg  # the dense cache is a valid name


needs_kv_registry = pytest.mark.skipif(not hasattr(kv, "COMPRESSORS"), reason="compressors not on Registry yet")


@needs_kv_registry
def test_a_newly_registered_compressor_is_accepted_without_touching_config():
    name = "test_dummy_kv"
    assert name not in kv.available_compressors()
    kv.register(name)(type("DummyKV", (kv.rkv.RKV,), {}))
    try:
        cfg = validate(load_config("sparse_rl_fixed40", [f"rollout.compressor={name}", f"eval.compressor={name}"]))
        assert cfg.rollout.compressor == name
        assert name in config_help()
    finally:
        kv.COMPRESSORS._entries.pop(name)  # no public unregister: tests only
    with pytest.raises(ConfigError, match=name):
        load_config("sparse_rl_fixed40", [f"rollout.compressor={name}"])


def test_group_rule_comes_from_the_estimator_registry():
    name = "test_mean_baseline"
    advantages.register_adv_est(name, needs_group=False)(lambda r, g=None, n=None: r - r.mean())
    try:
        validate(load_config("sparse_rl_fixed40", [f"algorithm.adv_estimator={name}", "rollout.n=1"]))
        with pytest.raises(ConfigError, match=r"needs rollout\.n >= 2"):
            validate(load_config("sparse_rl_fixed40", ["algorithm.adv_estimator=rloo", "rollout.n=1"]))
    finally:
        advantages.ADV_ESTIMATORS._entries.pop(name)


@needs_kv_registry
def test_registries_share_one_duplicate_rule():
    for register, taken in [(register_correction, "tis"), (advantages.register_adv_est, "grpo"), (kv.register, "rkv")]:
        with pytest.raises(ValueError, match="already registered"):
            register(taken)(lambda *a, **k: None)
    same = advantages.get_adv_est("grpo")
    assert advantages.register_adv_est("grpo")(same) is same  # the same object again: a no-op


def test_literal_choices_are_ones_the_losses_know():
    for field, known in [("loss_agg", losses.LOSS_AGGS), ("kl_kind", losses.KL_KINDS)]:
        assert set(typing.get_args(AlgorithmConfig.model_fields[field].annotation)) <= set(known)


def test_overrides_sections_and_mapping_entries():
    cfg = load_config(
        "sparse_rl_fixed40",
        [
            "rollout.compressor_options={lam: 0.1}",
            "rollout.compressor_options.kernel=3",
            "--train.seed=3",
            "algorithm.correction=[tis, [rejection, {high: 1.6}]]",
        ],
    )
    assert cfg.rollout.compressor_options == {"lam": 0.1, "kernel": 3} and cfg.train.seed == 3
    assert cfg.algorithm.correction == ["tis", ["rejection", {"high": 1.6}]]
    validate(cfg)
    with pytest.raises(ConfigError, match=r"'rollout' is a section"):
        load_config("sparse_rl_fixed40", ["rollout=5"])
    with pytest.raises(ConfigError, match=r"'data\.eval' is not a mapping"):
        load_config("sparse_rl_fixed40", ["data.eval.x=1"])
    with pytest.raises(ConfigError, match=r"'rollout\.compressor_options' expects mapping, got int 5"):
        load_config("sparse_rl_fixed40", ["rollout.compressor_options=5"])
    assert load_config("sparse_rl_fixed40", ["data.eval=12"]).data.eval == "12"


def test_config_command_prints_what_train_would_run_and_reads_back(tmp_path, capsys):
    """``sparserl config PRESET key=value``: the validated config as YAML that ``sparserl train FILE``
    reads back to the same config; ``--keys TEXT``: the help lines that hold TEXT, sub-section keys too."""
    from sparserl import cli

    assert cli.main(["config", "default", "rollout.kv_budget=48", "rollout.kv_controller.threshold=0.7"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Full resolved sparserl config (sparserl config).\n# sparserl config default ")
    (tmp_path / "c.yaml").write_text(text)
    expected = load_config("default", ["rollout.kv_budget=48", "rollout.kv_controller.threshold=0.7"])
    assert config_to_dict(load_config(str(tmp_path / "c.yaml"))) == config_to_dict(expected)
    assert cli.main(["config", "--keys", "kv_controller.thres"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rollout:") and len(lines) == 2
    assert lines[1].startswith("    rollout.kv_controller.threshold (float, default 0.86): ")
    assert "algorithm.distill_sparse.rank (int, default required)" in config_help()
    assert cli.main(["config", "--keys"]) == 0
    assert capsys.readouterr().out.strip() == config_help()


@pytest.mark.parametrize(
    "overrides, warned",
    [
        (("rollout.top_k=20",), "rollout.top_k=20 with algorithm.correction='sparse_rl'"),
        (("rollout.top_p=0.9", "algorithm.correction=tis"), "rollout.top_p=0.9 with algorithm.correction='tis'"),
        (
            ("rollout.top_p=0.9", "algorithm.correction=none", "algorithm.off_policy_mask_threshold=0.5"),
            "rollout.top_p=0.9 with algorithm.off_policy_mask_threshold=0.5",
        ),
        (("rollout.top_k=20", "algorithm.correction=none"), None),  # nothing reads p / q
        (("rollout.top_k=0", "rollout.top_p=1.0"), None),  # nothing truncated
    ],
)
def test_truncated_sampling_under_a_ratio_warns_of_the_kept_mass(overrides, warned):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate(load_config("default", overrides))
    texts = [str(w.message) for w in caught if "kept tokens" in str(w.message)]
    if warned is None:
        assert texts == []
    else:
        assert len(texts) == 1 and texts[0].startswith(warned), texts
        assert "Keep Sampling Mask" in texts[0] and "rollout.top_k=0 and rollout.top_p=1" in texts[0]
