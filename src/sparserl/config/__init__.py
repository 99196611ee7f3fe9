"""Typed configuration of a run: schema, loading, messages and the rules between keys.

- :mod:`~sparserl.config.schema`: the eleven pydantic sections (``model``, ``rollout``, ``data``,
  ``reward``, ``algorithm``, ``train``, ``log``, ``checkpoint``, ``eval``, ``mismatch``, ``cluster``),
  each field with its type, default, bounds and help text; imports no torch;
- :mod:`~sparserl.config.loading`: YAML files and presets (``base:`` chains), merging, dotted overrides,
  and writing the resolved config;
- :mod:`~sparserl.config.messages`: :class:`ConfigError` and one line per problem (file, key, value, what
  is valid);
- :mod:`~sparserl.config.rules`: the cross-key rules, one function per concern, run by :func:`validate`;
- :mod:`~sparserl.config.help`: ``sparserl config --keys``.

::

    cfg = load_config("default")                                # a preset in sparserl/configs/
    cfg = load_config("my_run.yaml", ["rollout.kv_budget=64", "rollout.compressor_options.lam=0.1"])
    validate(cfg)                                               # rules that tie fields together
    save_config(cfg, run_dir / "config.yaml")                   # the run records what it ran

Importing this package loads neither torch nor an implementation module; :func:`validate` loads the
rules (which build the compressor and run the correction once) on first use.
"""

from __future__ import annotations

from typing import Any

from .help import config_help
from .loading import (
    PRESET_DIR,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    config_yaml,
    list_presets,
    load_config,
    preset_path,
    save_config,
)
from .messages import ConfigError
from .schema import (
    FLOAT32_MAX,
    SECTIONS,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    DataConfig,
    DistillSparseConfig,
    EvalConfig,
    KVControllerConfig,
    LogConfig,
    MismatchConfig,
    ModelConfig,
    OverlongBufferConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    fields_of,
)

__all__ = [
    "ConfigError",
    "ModelConfig",
    "KVControllerConfig",
    "RolloutConfig",
    "DataConfig",
    "OverlongBufferConfig",
    "RewardConfig",
    "DistillSparseConfig",
    "AlgorithmConfig",
    "TrainConfig",
    "LogConfig",
    "CheckpointConfig",
    "EvalConfig",
    "MismatchConfig",
    "ClusterConfig",
    "Config",
    "SECTIONS",
    "FLOAT32_MAX",
    "load_config",
    "apply_overrides",
    "config_from_dict",
    "validate",
    "config_to_dict",
    "save_config",
    "list_presets",
    "preset_path",
    "PRESET_DIR",
    "config_help",
    "config_yaml",
    "fields_of",
]


def __getattr__(name: str) -> Any:
    """``validate`` on first use: the rules import torch and the plug-ins they ask."""
    if name == "validate":
        from .rules import validate

        return validate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
