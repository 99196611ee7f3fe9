"""Every check a run makes before its real work, without loading any weights: :func:`preflight`.

``sparserl train`` and ``sparserl config`` ask the same questions of a config, in this order, and the
first problem ends it with one line naming the key:

1. the rules between keys (:func:`sparserl.config.validate`);
2. the model: ``model.name`` is the embedded default, ``tiny``, a Hugging Face folder with a
   ``config.json`` of a supported family, or a ``.gguf`` file (:func:`sparserl.models.loading.check_model`),
   and ``model.device`` exists on this machine;
3. the reward: every ``module:function`` of ``reward.fn`` imports and names a callable;
4. LoRA: every name of ``train.lora_target`` (and ``algorithm.distill_sparse.target``) is a linear module
   of the model, whose modules are listed from its architecture alone: the model is built on PyTorch's
   meta device from its ``config.json`` or its GGUF header, so no weight is read;
5. the data: ``data.train`` and ``data.eval`` read, with their columns;
6. the memory: the step's predicted peak (:func:`sparserl.memory.predict_peak`, from the model's
   architecture and the config) within ``train.max_memory_gb`` or the machine's available memory, else
   refused naming the keys that would make it fit (:func:`check_memory`).

The run folder (writable, resumable) and Ray's address are the run's own checks, made where the run
starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import Config, ConfigError, validate
from .memory import MemoryPrediction

__all__ = [
    "preflight",
    "check_rewards",
    "check_lora_targets",
    "check_data",
    "check_memory",
    "model_linear_names",
    "prompt_tokens_bound",
]

#: tokens a chat template adds around a prompt's text (SmolLM2's: its default system prompt and the role
#: markers, ~30 tokens), as the bound of :func:`prompt_tokens_bound` counts them
TEMPLATE_TOKENS = 64


def preflight(cfg: Config) -> MemoryPrediction:
    """Raise the first problem that would stop ``train`` before its first step, loading no weights:
    a :class:`~sparserl.config.ConfigError`, :class:`~sparserl.models.loading.ModelLoadError`,
    :class:`~sparserl.reward.registry.RewardSpecError` or :class:`~sparserl.data.DataError`, each a
    :class:`~sparserl.errors.SparserlError` whose message names the key. Returns the run's predicted peak
    memory (:func:`check_memory`)."""
    from .models.loading import check_model, resolve_device

    validate(cfg)
    check_model(cfg.model.name)
    resolve_device(cfg.model.device)
    check_rewards(cfg)
    check_lora_targets(cfg)
    train = check_data(cfg)
    return check_memory(cfg, prompt_tokens_bound(train))


def prompt_tokens_bound(examples) -> int:
    """The longest prompt's tokens, bounded without a tokenizer: a byte-level BPE token covers at least one
    UTF-8 byte, so the prompt's bytes (every message's content) plus :data:`TEMPLATE_TOKENS`; at most
    :data:`sparserl.packing.PROMPT_TOKENS_BOUND`, the longest prompt the config's rules assume."""
    from .packing import PROMPT_TOKENS_BOUND

    longest = 0
    for ex in examples:
        text = ex.prompt if isinstance(ex.prompt, str) else "".join(m.get("content", "") for m in ex.prompt)
        longest = max(longest, len(text.encode()))
        if longest + TEMPLATE_TOKENS >= PROMPT_TOKENS_BOUND:
            break
    return min(PROMPT_TOKENS_BOUND, longest + TEMPLATE_TOKENS)


def check_memory(cfg: Config, prompt_tokens: int) -> MemoryPrediction:
    """The run's predicted peak memory (:func:`sparserl.memory.predict_peak` on the model's architecture,
    prompts of at most ``prompt_tokens`` tokens), or a :class:`~sparserl.config.ConfigError` when it
    exceeds ``train.max_memory_gb`` (None: the machine's available memory less a margin), in one line
    naming the changes that fit (:func:`sparserl.memory.check_fits`)."""
    from .cost import ModelShape
    from .memory import check_fits

    shape = ModelShape.from_config(_architecture_fields(cfg.model.name, cfg.model.seed))
    return check_fits(cfg, shape, prompt_tokens)


def _architecture_fields(name: str, seed: int) -> Any:
    """A folder's ``config.json`` as a dict (read without importing transformers), else :func:`_architecture`."""
    import json

    from .models.loading import DEFAULT_MODEL, cache_dir

    folder = cache_dir() / "smollm2-135m-instruct" if name in (DEFAULT_MODEL, "default", "smollm2") else Path(name)
    if name != "tiny":
        try:
            return json.loads((folder.expanduser() / "config.json").read_text())
        except (OSError, ValueError):
            pass
    return _architecture(name, seed)


def check_rewards(cfg: Config) -> None:
    """Every ``module:function`` of ``reward.fn`` imports and is callable (a built-in name is known);
    nothing starts: no checker process, no reward pool."""
    from .reward.registry import BUILTIN_REWARDS, load_reward

    specs = [cfg.reward.fn] if isinstance(cfg.reward.fn, str) else list(cfg.reward.fn)
    for spec in specs:
        if spec.strip() not in BUILTIN_REWARDS:
            load_reward(spec, timeout_s=None, workers=0)  # imports the module; RewardSpecError names reward.fn


def check_lora_targets(cfg: Config) -> None:
    """Every module name of ``train.lora_target`` (when ``train.lora_rank`` > 0) and of
    ``algorithm.distill_sparse.target`` is a linear module of the model (peft's ``target_modules``
    match the last part of a module's name); ``all-linear`` always is."""
    wanted = []
    if cfg.train.lora_rank and cfg.train.lora_target != "all-linear":
        wanted.append(("train.lora_target", cfg.train.lora_target))
    ds = cfg.algorithm.distill_sparse
    if ds is not None and ds.target != "all-linear":
        wanted.append(("algorithm.distill_sparse.target", ds.target))
    if not wanted:
        return
    names = model_linear_names(cfg.model.name, cfg.model.seed)
    for key, target in wanted:
        missing = [t for t in target if t not in names]
        if missing:
            raise ConfigError(
                f"{key}={list(target)}: {', '.join(missing)} names no linear module of "
                f"{cfg.model.name}; its linear modules: {', '.join(names)} (or all-linear)"
            )


def model_linear_names(name: str, seed: int = 0) -> list[str]:
    """The last name part of every ``nn.Linear`` of the model ``name``, sorted, once each: the model built
    on the meta device from its architecture (no weight is read or allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .models.loading import linear_names

    with torch.device("meta"):
        return linear_names(AutoModelForCausalLM.from_config(_architecture(name, seed)))


def _architecture(name: str, seed: int) -> Any:
    """The Hugging Face config of ``model.name``: ``tiny``'s own, a folder's ``config.json``, a GGUF file's
    header (the embedded default's converted folder when it exists, else its GGUF)."""
    from transformers import AutoConfig

    from .models.loading import DEFAULT_MODEL, ModelLoadError, cache_dir, embedded_gguf_path, tiny_config

    if name == "tiny":
        return tiny_config()
    if name in (DEFAULT_MODEL, "default", "smollm2"):
        folder = cache_dir() / "smollm2-135m-instruct"
        path = folder if (folder / "config.json").exists() else embedded_gguf_path()
    else:
        path = Path(name).expanduser()
    try:
        if path.suffix == ".gguf":
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoConfig.from_pretrained(str(path))
    except Exception as e:  # re-raised with the file named
        raise ModelLoadError(f"{path}: cannot read the model's architecture: {e}") from e


def check_data(cfg: Config):
    """``data.train`` and ``data.eval`` read as the run reads them, their columns found; a problem is a
    :class:`~sparserl.data.DataError` naming the key. Returns the training set."""
    from .data import DataError, load_dataset

    d = cfg.data
    sets = [
        (
            "data.train",
            d.train,
            dict(
                prompt_key=d.prompt_key,
                label_key=d.label_key,
                limit=d.limit,
                key_options=("data.prompt_key", "data.label_key"),
                skip_bad_rows=d.skip_bad_rows if d.skip_bad_rows else None,
            ),
        )
    ]
    if d.eval:
        sets.append(
            (
                "data.eval",
                d.eval,
                dict(
                    prompt_key=d.eval_prompt_key,
                    label_key=d.eval_label_key,
                    limit=d.eval_limit,
                    preferred_keys=(d.prompt_key, d.label_key),
                    key_options=("data.eval_prompt_key", "data.eval_label_key"),
                ),
            )
        )
    loaded = []
    for key, spec, options in sets:
        try:
            loaded.append(load_dataset(spec, template=d.template, system_prompt=d.system_prompt, **options))
        except DataError as e:
            raise type(e)(f"{key}={spec!r}: {e}") from None
    return loaded[0]
