"""The decoders the step's cost is predicted for, as their Hugging Face ``config.json`` values.

Qwen3-1.7B and Qwen3-4B: the configs of ``Qwen/Qwen3-1.7B`` and ``Qwen/Qwen3-4B`` on the Hugging Face hub
(both ``tie_word_embeddings: true``, ``head_dim`` 128, vocabulary 151,936, bfloat16); their parameter
counts, 1.72e9 and 4.02e9 by :attr:`~sparserl.cost.ModelShape.params`, are the model cards' 1.7B and 4.0B.
SmolLM2-135M: the config of the embedded default model (``sparserl.models.loading``), 1.35e8 parameters.
"""

from __future__ import annotations

import json
from pathlib import Path

from .rollout import ModelShape

__all__ = ["CONFIGS", "model_shape"]

#: the config.json values the cost model reads, per model name
CONFIGS: dict[str, dict] = {
    "qwen3-1.7b": {
        "model_type": "qwen3",
        "num_hidden_layers": 28,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "qwen3-4b": {
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "smollm2-135m": {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
}


def model_shape(model: str, dtype: str = "float32", kv_dtype: str | None = None) -> ModelShape:
    """The :class:`ModelShape` of a name of :data:`CONFIGS` or of a Hugging Face folder (its
    ``config.json``), its weights held in ``dtype`` and its cache in ``kv_dtype`` (default: ``dtype``).
    Raises ``ValueError`` naming what is missing."""
    config = CONFIGS.get(model.lower())
    if config is None:
        path = Path(model).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if path.name != "config.json" or not path.is_file():
            raise ValueError(
                f"model_shape: {model!r} is neither one of {', '.join(CONFIGS)} nor a folder with a config.json"
            )
        config = json.loads(path.read_text())
    return ModelShape.from_config(config, dtype, kv_dtype)
