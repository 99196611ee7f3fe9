"""Typed configuration: dataclasses with documented fields, loaded from YAML, dotted overrides.

One ``Config`` holds nine sections, one per concern (``model``, ``rollout``, ``data``, ``reward``,
``algorithm``, ``train``, ``log``, ``checkpoint``, ``eval``). Every field carries its own help text
in ``metadata["help"]`` (the TRL ``GRPOConfig`` habit); ``config_help()`` prints them all.

Loading::

    cfg = load_config("default")                                # a preset in sparserl/configs/
    cfg = load_config("my_run.yaml", ["rollout.kv_budget=64",   # a file, plus overrides
                                      "train.lr=1e-5",
                                      'rollout.stop=["\\n\\n"]',
                                      "rollout.compressor_options.lam=0.1"])
    validate(cfg)                                               # ranges and cross-field rules
    save_config(cfg, run_dir / "config.yaml")                   # the run records what it ran

A YAML file may start with ``base: <preset name or path>``: the base is loaded first and the file's
keys are merged over it (mappings merge key by key, everything else replaces). Values follow YAML
rules, with two YAML 1.2 fixes: ``1e-5`` is a float (PyYAML would read a string) and only
``true``/``false`` are booleans (``yes``/``no``/``on``/``off`` stay strings).

Unknown sections or keys and values of the wrong type raise ``ConfigError`` (a ``ValueError``)
naming where the value came from (the file, or ``override``), the dotted key, and the closest
valid names.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import yaml

__all__ = [
    "ConfigError",
    "ModelConfig",
    "RolloutConfig",
    "DataConfig",
    "RewardConfig",
    "AlgorithmConfig",
    "TrainConfig",
    "LogConfig",
    "CheckpointConfig",
    "EvalConfig",
    "Config",
    "load_config",
    "apply_overrides",
    "validate",
    "config_to_dict",
    "save_config",
    "list_presets",
    "preset_path",
    "config_help",
    "COMPRESSORS",
    "TRIGGERS",
    "DTYPES",
    "ADV_ESTIMATORS",
    "GROUP_ADV_ESTIMATORS",
    "SCALE_REWARDS",
    "LOSS_AGGS",
    "KL_KINDS",
    "PROGRESS_MODES",
]

PRESET_DIR = Path(__file__).resolve().parent / "configs"

# Known names. Each station owns its registry; these sets are the names the config accepts when that
# station's registry cannot be imported (and the union with it when it can).
COMPRESSORS = ("none", "streaming", "snapkv", "rkv", "h2o")
TRIGGERS = ("step_length", "newline")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ADV_ESTIMATORS = ("grpo", "dr_grpo")
GROUP_ADV_ESTIMATORS = ("grpo", "dr_grpo", "rloo")  # need n >= 2 samples per prompt
SCALE_REWARDS = ("group", "batch", "none")
LOSS_AGGS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
PROGRESS_MODES = ("auto", "rich", "plain", "none")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


def _f(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None) -> Any:
    """A dataclass field with its help text in ``metadata["help"]``."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """Which policy to train, and in what precision."""

    name: str = _f("smollm2-135m", "Model: a built-in name ('smollm2-135m', the embedded default; "
                   "'tiny', a small random model for tests), a local Hugging Face folder, or a .gguf file.")
    dtype: str = _f("float32", "Learner (trained weights) dtype: float32 | bfloat16. The dense scorer "
                    "uses the same dtype.")
    seed: int = _f(0, "Seed of the random initialisation of a 'tiny' model (ignored for real models).")
    device: str = _f("auto", "Device: auto (cuda if available, else cpu) | cpu | cuda | cuda:N.")


@dataclass
class RolloutConfig:
    """The sampler: how responses are generated and how its KV cache is compressed."""

    compressor: str = _f("rkv", "KV-cache compressor of the sampler: none (dense) | streaming | "
                         "snapkv | rkv | h2o.")
    kv_budget: int = _f(64, "KV budget B in tokens per sequence (per layer) kept by the compressor.")
    trigger: str = _f("step_length", "When to compress: step_length (every `step_length` decode "
                      "steps once the cache exceeds the budget) | newline (after a newline token).")
    step_length: int = _f(32, "Decode steps between two compressions (R-KV / Sparse-RL: 128).")
    window: int = _f(8, "Observation window w: the last w tokens are always kept and their queries "
                     "score the others (R-KV: 8).")
    compress_prompt: bool = _f(False, "Also compress the prompt's KV (R-KV leaves it whole).")
    compressor_options: dict = _f(help="Method-specific options, passed to the compressor as keyword "
                                  "arguments: e.g. lam, kernel, threshold, per_head, sinks.", factory=dict)
    n: int = _f(8, "Samples (responses) per prompt; GRPO needs n >= 2.")
    temperature: float = _f(1.0, "Sampling temperature (0 = greedy).")
    top_p: float = _f(1.0, "Nucleus sampling: keep the smallest set of tokens with this mass (1 = off).")
    top_k: int = _f(0, "Keep only the k most likely tokens (0 = off).")
    max_new_tokens: int = _f(96, "Maximum response length in tokens.")
    dtype: str = _f("bfloat16", "Sampler dtype: float32 | bfloat16 | float16.")
    stop: list[str] = _f(help="Stop strings: generation of a response ends after any of them "
                         "(EOS always stops).", factory=list)


@dataclass
class DataConfig:
    """Prompts and labels for training and evaluation."""

    train: str = _f("arith", "Training set: a built-in task name ('arith', options as "
                    "'arith:digits=1,terms=2'), a data set name, or a local .jsonl/.json/.parquet path.")
    eval: Optional[str] = _f(None, "Evaluation set (same forms as `train`); None = no evaluation.")
    prompt_key: Optional[str] = _f(None, "Column holding the prompt (None = guess: problem, question, prompt...).")
    label_key: Optional[str] = _f(None, "Column holding the reference answer (None = guess: answer, solution...).")
    template: Optional[str] = _f(None, "Prompt template with {prompt} (None = the model's chat template "
                                 "when it has one, else the task's default).")
    system_prompt: Optional[str] = _f(None, "System message prepended when a chat template is used.")
    skip_bad_rows: bool = _f(False, "Skip rows without prompt or label instead of failing.")
    limit: Optional[int] = _f(None, "Use only the first `limit` training rows (None = all).")
    eval_limit: Optional[int] = _f(64, "Use only the first `eval_limit` evaluation rows (None = all).")


@dataclass
class RewardConfig:
    """The verifier."""

    fn: str = _f("math", "Reward function: a built-in name ('math': 1 if the final / boxed answer "
                 "equals the label, else 0) or 'module:function' taking (prompt, response, label).")
    timeout_s: float = _f(5.0, "Seconds allowed to verify one response before it scores 0.")


@dataclass
class AlgorithmConfig:
    """Advantages, policy loss and the correction of the sampler/dense mismatch."""

    adv_estimator: str = _f("grpo", "Advantage estimator: grpo ((R - mean) / std within the group) | "
                            "dr_grpo (R - mean, no std).")
    scale_rewards: str = _f("group", "Std used to scale advantages: group | batch | none.")
    loss_agg: str = _f("seq_mean_token_mean", "Loss aggregation: seq_mean_token_mean (mean over a "
                       "response's tokens, then over responses) | token_mean (over all tokens) | "
                       "seq_mean_token_sum_norm (token sum / max length, Dr. GRPO).")
    clip_eps: float = _f(0.2, "PPO clip range epsilon: the ratio pi/p is clipped to [1-eps, 1+eps_high].")
    clip_eps_high: Optional[float] = _f(None, "Upper clip epsilon (DAPO 'clip higher'); None = clip_eps.")
    kl_coef: float = _f(0.0, "Coefficient of the KL penalty to the reference (initial) model; 0 = no "
                        "reference model is kept (Sparse-RL: 1e-4).")
    kl_kind: str = _f("low_var_kl", "KL estimator: k1 | k2 | k3 | low_var_kl (k3, clamped).")
    entropy_coef: float = _f(0.0, "Coefficient of the entropy bonus (0 = off).")
    correction: Union[str, list] = _f("sparse_rl", "Mismatch correction: a preset or method name "
                                      "from sparserl.correct (e.g. sparse_rl, naive, none, tis, mis, "
                                      "qurl), or a list of method names / [name, {options}] pairs.")
    correction_options: dict = _f(help="Options of the correction overriding the preset's defaults "
                                  "(e.g. token_low, token_high, veto, is_cap).", factory=dict)

    @property
    def clip_eps_upper(self) -> float:
        """The effective upper clip epsilon (clip_eps_high, or clip_eps when unset)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


@dataclass
class TrainConfig:
    """The RL loop and the optimizer."""

    steps: int = _f(20, "RL steps (one rollout batch each).")
    prompts_per_step: int = _f(8, "Prompts per rollout batch (each sampled rollout.n times).")
    mini_batch_prompts: Optional[int] = _f(None, "Prompts per optimizer update; None = all: one update "
                                           "per rollout batch (on-policy); smaller = several updates.")
    ppo_epochs: int = _f(1, "Passes over each rollout batch.")
    micro_batch_size: int = _f(8, "Sequences per forward/backward (gradient accumulation inside a "
                               "mini-batch); lower it to save memory.")
    lr: float = _f(1e-5, "Learning rate (AdamW).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    betas: tuple[float, float] = _f((0.9, 0.98), "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    grad_clip: Optional[float] = _f(1.0, "Clip the gradient's global norm to this (None or 0 = no clipping).")
    warmup_steps: int = _f(0, "Linear learning-rate warm-up over this many optimizer updates; constant after.")
    seed: int = _f(0, "Seed of data order and sampling.")
    lora_rank: int = _f(0, "LoRA rank; 0 = train all weights.")
    lora_alpha: int = _f(16, "LoRA alpha (scale = alpha / rank).")


@dataclass
class LogConfig:
    """Where and how a run records itself."""

    out_dir: str = _f("runs", "Folder that holds run folders.")
    run_name: Optional[str] = _f(None, "Run folder name; None = timestamp + config name.")
    tensorboard: bool = _f(True, "Write TensorBoard scalars to <run>/tb/.")
    wandb: bool = _f(False, "Log to Weights & Biases (if installed).")
    wandb_project: str = _f("sparserl", "W&B project name.")
    progress: str = _f("auto", "Progress display: auto (live when stdout is a terminal, else one line "
                       "per step) | rich | plain | none.")


@dataclass
class CheckpointConfig:
    """Checkpoints of the learner and optimizer (to resume)."""

    every: int = _f(10, "Save every N steps (0 = only at the end).")
    keep_last: int = _f(2, "Keep the N most recent checkpoints (0 = keep all).")


@dataclass
class EvalConfig:
    """Periodic evaluation on data.eval."""

    every: int = _f(0, "Evaluate every N steps (0 = only at the end, if data.eval is set).")
    n: int = _f(1, "Samples per evaluation prompt.")
    temperature: float = _f(0.0, "Evaluation temperature (0 = greedy).")
    max_new_tokens: Optional[int] = _f(None, "Maximum response length; None = rollout.max_new_tokens.")
    compressor: Optional[str] = _f(None, "KV compressor during evaluation; None = same as rollout "
                                   "(budget and trigger too), 'none' = dense.")


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "algorithm": AlgorithmConfig,
    "train": TrainConfig,
    "log": LogConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
}


@dataclass
class Config:
    """The whole configuration of a run."""

    name: str = _f("default", "Config name (the preset or file stem unless set); used in run names.")
    model: ModelConfig = _f(help="Model.", factory=ModelConfig)
    rollout: RolloutConfig = _f(help="Sampler.", factory=RolloutConfig)
    data: DataConfig = _f(help="Data.", factory=DataConfig)
    reward: RewardConfig = _f(help="Reward.", factory=RewardConfig)
    algorithm: AlgorithmConfig = _f(help="Algorithm.", factory=AlgorithmConfig)
    train: TrainConfig = _f(help="Training loop and optimizer.", factory=TrainConfig)
    log: LogConfig = _f(help="Logging.", factory=LogConfig)
    checkpoint: CheckpointConfig = _f(help="Checkpoints.", factory=CheckpointConfig)
    eval: EvalConfig = _f(help="Evaluation.", factory=EvalConfig)

    @classmethod
    def from_dict(cls, data: dict | None, source: str = "dict") -> "Config":
        """Build a Config from a nested mapping; missing keys keep their defaults.

        Raises ConfigError (naming ``source``) on unknown keys or wrongly typed values.
        """
        data = dict(data or {})
        data.pop("base", None)
        cfg = cls()
        if "name" in data:
            cfg.name = _coerce(data.pop("name"), str, "name", source)
        for sec_name, sec_val in data.items():
            if sec_name not in SECTIONS:
                raise _unknown(source, sec_name, ["name", *SECTIONS])
            if sec_val is None:
                continue
            if not isinstance(sec_val, dict):
                raise ConfigError(f"{source}: '{sec_name}' must be a mapping of keys to values, "
                                  f"got {type(sec_val).__name__}")
            section = getattr(cfg, sec_name)
            for key, val in sec_val.items():
                _set_field(section, sec_name, str(key), val, source)
        return cfg

    def to_dict(self) -> dict:
        """The config as plain nested dicts/lists/scalars (YAML- and JSON-ready)."""
        return config_to_dict(self)

    def override(self, overrides: Iterable[str]) -> "Config":
        """Apply dotted ``section.key=value`` overrides in place; returns self."""
        return apply_overrides(self, overrides)


# ---------------------------------------------------------------------------------------------
# YAML with YAML-1.2 floats and booleans
# ---------------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader where ``1e-5`` is a float and only true/false are booleans."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _ch, _resolvers in _Loader.yaml_implicit_resolvers.items():
    _Loader.yaml_implicit_resolvers[_ch] = [
        (tag, rx) for tag, rx in _resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")]
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# ---------------------------------------------------------------------------------------------
# Types: check and coerce one value against a field's annotation
# ---------------------------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        names = [_type_name(a) for a in args if a is not type(None)]
        s = " | ".join(names)
        return s + " | null" if type(None) in args else s
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(arg)}"
    if origin is tuple:
        return "list of " + ", ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _bad_type(value: Any, tp: Any, key: str, source: str) -> ConfigError:
    return ConfigError(f"{source}: '{key}' expects {_type_name(tp)}, got {type(value).__name__} "
                       f"{value!r}")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Return ``value`` converted to annotation ``tp`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _bad_type(value, tp, key, source)
        non_none = [a for a in args if a is not type(None)]
        last_err: ConfigError | None = None
        for a in non_none:
            try:
                return _coerce(value, a, key, source)
            except ConfigError as e:
                last_err = e
        raise _bad_type(value, tp, key, source) from last_err
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _bad_type(value, tp, key, source)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _bad_type(value, tp, key, source)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _bad_type(value, tp, key, source)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. run_name: 2024
        raise _bad_type(value, tp, key, source)
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        raise _bad_type(value, tp, key, source)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        if isinstance(value, (list, tuple)):
            return [_coerce(v, arg, f"{key}[{i}]", source) for i, v in enumerate(value)]
        raise _bad_type(value, tp, key, source)
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            return tuple(_coerce(v, a, f"{key}[{i}]", source) for i, (v, a) in enumerate(zip(value, args)))
        raise _bad_type(value, tp, key, source)
    if isinstance(value, tp):
        return value
    raise _bad_type(value, tp, key, source)


def _unknown(source: str, key: str, valid: Iterable[str], prefix: str = "") -> ConfigError:
    valid = list(valid)
    last = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(last, valid, n=3, cutoff=0.5)
    full = f"{prefix}{key}"
    if close:
        hint = "did you mean " + " or ".join(f"'{prefix}{c}'" for c in close) + "?"
    else:
        hint = "valid keys: " + ", ".join(f"{prefix}{v}" for v in valid)
    return ConfigError(f"{source}: unknown key '{full}'; {hint}")


def _set_field(section: Any, sec_name: str, key: str, value: Any, source: str) -> None:
    names = [f.name for f in dataclasses.fields(section)]
    if key not in names:
        raise _unknown(source, key, names, prefix=f"{sec_name}.")
    tp = _hints(type(section))[key]
    setattr(section, key, _coerce(value, tp, f"{sec_name}.{key}", source))


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def list_presets() -> list[str]:
    """Names of the presets shipped in ``sparserl/configs/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """Path of the preset ``name`` (with or without ``.yaml``); ConfigError if there is none."""
    stem = name[:-5] if name.endswith(".yaml") else name
    p = PRESET_DIR / f"{stem}.yaml"
    if p.is_file():
        return p
    presets = list_presets()
    close = difflib.get_close_matches(stem, presets, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(f"no config file or preset named '{name}'; {hint}presets: {', '.join(presets)}")


def _find(path_or_name: str | Path, relative_to: Path | None = None) -> Path:
    p = Path(path_or_name).expanduser()
    candidates = [p] if p.is_absolute() else ([relative_to / p] if relative_to else []) + [p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    return preset_path(str(path_or_name))


def _merge(base: dict, over: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"{path}: circular 'base' chain: {chain}")
    try:
        data = _yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' expects a preset name or a path, got {base!r}")
        base_raw = _load_raw(_find(base, path.parent), (*seen, path))
        base_raw.pop("name", None)  # the name is the leaf file's
        data = _merge(base_raw, data)
    return data


def load_config(path_or_name: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config from a YAML file or a preset name, then apply dotted overrides.

    ``path_or_name``: a path to a YAML file, a preset name (``default``, ``sparse_rl_math``,
    ``dense``, ``sparse_naive``; see ``list_presets()``), or None for ``default``.
    ``overrides``: strings ``section.key=value`` (value read with YAML rules), e.g.
    ``rollout.kv_budget=64``, ``algorithm.clip_eps_high=null``, ``rollout.compressor_options.lam=0.1``.

    Does not call ``validate``: the caller does, once every override is in.
    """
    path = _find(path_or_name if path_or_name is not None else "default")
    raw = _load_raw(path)
    raw.setdefault("name", path.stem)
    cfg = Config.from_dict(raw, source=str(path))
    return apply_overrides(cfg, overrides)


def _parse_override(item: str) -> tuple[list[str], Any, str]:
    if "=" not in item:
        raise ConfigError(f"override: '{item}' is not of the form section.key=value")
    key, text = item.split("=", 1)
    key = key.strip()
    if key.startswith("--"):
        key = key[2:]
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"override: '{item}' has an empty key")
    try:
        value = _yaml_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text  # e.g. "a: b: c" is not YAML: keep the text
    return parts, value, text


def _is_str_field(tp: Any) -> bool:
    if tp is str:
        return True
    return typing.get_origin(tp) in (Union, types.UnionType) and str in typing.get_args(tp)


def apply_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """Apply ``section.key=value`` strings to ``cfg`` in place (and return it).

    A key under a mapping field (``rollout.compressor_options.lam=0.1``) sets that entry;
    ``section={...}`` merges a mapping into a section; ``name=...`` renames the config.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    for item in overrides:
        parts, value, text = _parse_override(item)
        top = parts[0]
        if len(parts) == 1:
            if top == "name":
                cfg.name = str(text.strip()) if value is not None else cfg.name
                continue
            if top in SECTIONS:
                if not isinstance(value, dict):
                    raise ConfigError(f"override: '{top}' is a section; set one key as '{top}.key=value'")
                section = getattr(cfg, top)
                for k, v in value.items():
                    _set_field(section, top, str(k), v, "override")
                continue
            raise _unknown("override", top, ["name", *SECTIONS])
        if top not in SECTIONS:
            raise _unknown("override", top, ["name", *SECTIONS])
        section = getattr(cfg, top)
        key = parts[1]
        names = [f.name for f in dataclasses.fields(section)]
        if key not in names:
            raise _unknown("override", key, names, prefix=f"{top}.")
        tp = _hints(type(section))[key]
        dotted = ".".join(parts)
        if len(parts) > 2:
            if not (tp is dict or typing.get_origin(tp) is dict):
                raise ConfigError(f"override: '{top}.{key}' is not a mapping; cannot set '{dotted}'")
            new = dict(getattr(section, key))
            node = new
            for p in parts[2:-1]:
                child = node.get(p)
                node[p] = dict(child) if isinstance(child, dict) else {}
                node = node[p]
            node[parts[-1]] = value
            setattr(section, key, new)
            continue
        # A string field given something YAML reads as a number/bool (e.g. run_name=007): keep the text.
        if _is_str_field(tp) and isinstance(value, (bool, int, float)):
            value = text.strip()
        setattr(section, key, _coerce(value, tp, dotted, "override"))
    return cfg


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------
def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def config_to_dict(cfg: Config) -> dict:
    """The config as nested plain dicts (tuples become lists): ``Config.from_dict`` reads it back."""
    return _plain(cfg)


def save_config(cfg: Config, path: str | Path) -> Path:
    """Write the full resolved config as YAML (``load_config(path)`` reads it back unchanged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None,
                          allow_unicode=True, width=100)
    path.write_text("# Full resolved sparserl config (written by save_config).\n" + text)
    return path


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _registry_names(module: str, attrs: tuple[str, ...]) -> set[str]:
    """Names in another station's registry, if it exists yet (empty set otherwise)."""
    try:
        mod = __import__(module, fromlist=["_"])
    except Exception:  # noqa: BLE001 - a station not written yet, or failing to import
        return set()
    for a in attrs:
        reg = getattr(mod, a, None)
        if callable(reg) and not isinstance(reg, type):
            try:
                reg = reg()
            except Exception:  # noqa: BLE001
                continue
        if isinstance(reg, dict):
            return {str(k) for k in reg}
        if isinstance(reg, (list, tuple, set, frozenset)):
            return {str(k) for k in reg}
    return set()


def _check_correction(cfg: Config, errors: list[str]) -> None:
    try:
        from sparserl.correct.presets import resolve  # type: ignore[import-not-found]
    except ImportError:
        return  # the correction station is not there: the trainer will check
    name, opts = cfg.algorithm.correction, dict(cfg.algorithm.correction_options)
    try:
        params = list(inspect.signature(resolve).parameters.values())
    except (TypeError, ValueError):
        params = []
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    try:
        if not opts:
            resolve(name)
        elif takes_kwargs:
            resolve(name, **opts)
        elif len(positional) >= 2:
            resolve(name, opts)
        else:
            resolve(name)
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if e.args else str(e)
        errors.append(f"algorithm.correction={name!r} (options {opts}): {msg}")


def _check_compressor(cfg: Config, errors: list[str]) -> None:
    """Build the compressor once (cheap, no model) so bad options fail now, not after loading."""
    r = cfg.rollout
    if r.compressor == "none":
        return
    try:
        from sparserl.rollout.kv import available_compressors, get_compressor  # type: ignore
    except ImportError:
        return
    if r.compressor not in available_compressors():
        return  # reported by the name check
    kwargs = dict(budget=r.kv_budget, trigger=r.trigger, step_length=r.step_length, window=r.window,
                  compress_prompt=r.compress_prompt)
    kwargs.update(r.compressor_options)
    try:
        get_compressor(r.compressor, **kwargs)
    except (TypeError, ValueError) as e:
        errors.append(f"rollout.compressor={r.compressor!r} with rollout.compressor_options="
                      f"{dict(r.compressor_options)}: {e} (options are method-specific; clear them "
                      f"with rollout.compressor_options={{}})")


def validate(cfg: Config) -> Config:
    """Check value ranges and cross-field rules before anything heavy loads.

    Raises one ConfigError listing every problem found; returns ``cfg`` when all is well.
    """
    errors: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    def one_of(key: str, value: Any, allowed: Iterable[str]) -> None:
        allowed = list(dict.fromkeys(allowed))
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            errors.append(f"{key}={value!r} is not one of {', '.join(allowed)}{hint}")

    m, r, d, rw, a, t, lg, ck, ev = (cfg.model, cfg.rollout, cfg.data, cfg.reward, cfg.algorithm,
                                     cfg.train, cfg.log, cfg.checkpoint, cfg.eval)
    compressors = set(COMPRESSORS) | _registry_names(
        "sparserl.rollout.kv", ("available_compressors", "COMPRESSORS", "REGISTRY"))

    # model
    need(bool(m.name), "model.name must not be empty")
    one_of("model.dtype", m.dtype, ("float32", "bfloat16"))
    need(m.device == "auto" or m.device == "cpu" or re.fullmatch(r"cuda(:\d+)?|mps", m.device) is not None,
         f"model.device={m.device!r} is not auto, cpu, cuda or cuda:N")

    # rollout
    one_of("rollout.compressor", r.compressor, sorted(compressors))
    one_of("rollout.trigger", r.trigger, TRIGGERS)
    one_of("rollout.dtype", r.dtype, DTYPES)
    need(r.kv_budget >= 1, f"rollout.kv_budget={r.kv_budget} must be >= 1")
    need(r.window >= 0, f"rollout.window={r.window} must be >= 0")
    if r.compressor != "none":
        need(r.kv_budget > r.window, f"rollout.kv_budget={r.kv_budget} must be larger than "
             f"rollout.window={r.window} (the window's tokens are always kept)")
    need(r.step_length >= 1, f"rollout.step_length={r.step_length} must be >= 1")
    need(r.n >= 1, f"rollout.n={r.n} must be >= 1")
    need(r.temperature >= 0, f"rollout.temperature={r.temperature} must be >= 0")
    need(0 < r.top_p <= 1, f"rollout.top_p={r.top_p} must be in (0, 1]")
    need(r.top_k >= 0, f"rollout.top_k={r.top_k} must be >= 0")
    need(r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens} must be >= 1")
    need(all(s for s in r.stop), "rollout.stop must not contain empty strings")
    if not errors:
        _check_compressor(cfg, errors)

    # data / reward
    need(bool(d.train), "data.train must not be empty")
    need(d.limit is None or d.limit >= 1, f"data.limit={d.limit} must be >= 1 or null")
    need(d.eval_limit is None or d.eval_limit >= 1, f"data.eval_limit={d.eval_limit} must be >= 1 or null")
    need(bool(rw.fn), "reward.fn must not be empty")
    need(rw.timeout_s > 0, f"reward.timeout_s={rw.timeout_s} must be > 0")

    # algorithm
    one_of("algorithm.adv_estimator", a.adv_estimator, (*ADV_ESTIMATORS, *_registry_names(
        "sparserl.train.advantages", ("available_adv_ests", "ADV_ESTIMATORS", "REGISTRY"))))
    one_of("algorithm.scale_rewards", a.scale_rewards, SCALE_REWARDS)
    one_of("algorithm.loss_agg", a.loss_agg, LOSS_AGGS)
    one_of("algorithm.kl_kind", a.kl_kind, KL_KINDS)
    if a.adv_estimator in GROUP_ADV_ESTIMATORS:
        need(r.n >= 2, f"rollout.n={r.n}: algorithm.adv_estimator={a.adv_estimator!r} compares the "
             "samples of a prompt with each other and needs rollout.n >= 2")
    need(a.clip_eps > 0, f"algorithm.clip_eps={a.clip_eps} must be > 0")
    need(a.clip_eps_high is None or a.clip_eps_high > 0,
         f"algorithm.clip_eps_high={a.clip_eps_high} must be > 0 or null")
    need(a.kl_coef >= 0, f"algorithm.kl_coef={a.kl_coef} must be >= 0")
    need(a.entropy_coef >= 0, f"algorithm.entropy_coef={a.entropy_coef} must be >= 0")
    need(bool(a.correction), "algorithm.correction must not be empty (use 'none')")
    if isinstance(a.correction, list) and a.correction_options:
        errors.append("algorithm.correction_options apply to a single named correction; with a list, "
                      "give options per method as [name, {options}]")
    _check_correction(cfg, errors)

    # train
    need(t.steps >= 1, f"train.steps={t.steps} must be >= 1")
    need(t.prompts_per_step >= 1, f"train.prompts_per_step={t.prompts_per_step} must be >= 1")
    if t.mini_batch_prompts is not None:
        need(t.mini_batch_prompts >= 1, f"train.mini_batch_prompts={t.mini_batch_prompts} must be >= 1")
        need(t.mini_batch_prompts >= 1 and t.prompts_per_step % t.mini_batch_prompts == 0,
             f"train.prompts_per_step={t.prompts_per_step} must be divisible by "
             f"train.mini_batch_prompts={t.mini_batch_prompts}")
    need(t.ppo_epochs >= 1, f"train.ppo_epochs={t.ppo_epochs} must be >= 1")
    need(t.micro_batch_size >= 1, f"train.micro_batch_size={t.micro_batch_size} must be >= 1")
    need(t.lr > 0, f"train.lr={t.lr} must be > 0")
    need(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay} must be >= 0")
    need(all(0 <= b < 1 for b in t.betas), f"train.betas={list(t.betas)} must lie in [0, 1)")
    need(t.eps > 0, f"train.eps={t.eps} must be > 0")
    need(t.grad_clip is None or t.grad_clip >= 0, f"train.grad_clip={t.grad_clip} must be >= 0 or null")
    need(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    need(t.lora_rank == 0, f"train.lora_rank={t.lora_rank}: LoRA training is not implemented yet; use 0 (full fine-tuning)")
    need(t.lora_alpha > 0, f"train.lora_alpha={t.lora_alpha} must be > 0")

    # log / checkpoint / eval
    one_of("log.progress", lg.progress, PROGRESS_MODES)
    need(bool(lg.out_dir), "log.out_dir must not be empty")
    need(lg.run_name is None or ("/" not in lg.run_name and lg.run_name not in ("", ".", "..")),
         f"log.run_name={lg.run_name!r} must be a plain folder name")
    need(ck.every >= 0, f"checkpoint.every={ck.every} must be >= 0")
    need(ck.keep_last >= 0, f"checkpoint.keep_last={ck.keep_last} must be >= 0")
    need(ev.every >= 0, f"eval.every={ev.every} must be >= 0")
    need(ev.n >= 1, f"eval.n={ev.n} must be >= 1")
    need(ev.temperature >= 0, f"eval.temperature={ev.temperature} must be >= 0")
    need(ev.max_new_tokens is None or ev.max_new_tokens >= 1,
         f"eval.max_new_tokens={ev.max_new_tokens} must be >= 1 or null")
    if ev.compressor is not None:
        one_of("eval.compressor", ev.compressor, sorted(compressors))

    if errors:
        raise ConfigError("invalid config '" + cfg.name + "':\n  - " + "\n  - ".join(errors))
    if r.temperature == 0 and r.n > 1:
        warnings.warn("rollout.temperature=0 (greedy): the n samples of a prompt are identical and "
                      "group advantages are all zero", stacklevel=2)
    return cfg


# ---------------------------------------------------------------------------------------------
# Help
# ---------------------------------------------------------------------------------------------
def config_help() -> str:
    """Every field as ``section.key (type, default): help``, one per line, grouped by section."""
    lines: list[str] = []
    default = Config()
    for sec_name, cls in SECTIONS.items():
        lines.append(f"{sec_name}:  {(cls.__doc__ or '').strip()}")
        hints = _hints(cls)
        sec = getattr(default, sec_name)
        for f in dataclasses.fields(cls):
            val = _plain(getattr(sec, f.name))
            lines.append(f"  {sec_name}.{f.name} ({_type_name(hints[f.name])}, default "
                         f"{yaml.safe_dump(val, default_flow_style=True).strip().removesuffix('...').strip()}): "
                         f"{f.metadata.get('help', '')}")
    return "\n".join(lines)
