"""Data: prompts and labels for RL with verifiable rewards.

Built-in math sets (read from the shared data folder), any JSON-lines / JSON / Parquet file with
a column mapping, a generated arithmetic task for tiny models, and a resumable seeded sampler.
"""

from .arith import ARITH_DIFFICULTY, make_arith
from .example import Example
from .loaders import (
    DATASETS,
    DEFAULT_TEMPLATE,
    DataError,
    DataFileNotFoundError,
    LoadedData,
    PromptSampler,
    apply_template,
    clean_label,
    load_dataset,
    read_rows,
    read_text_lines,
    resolve_data_dir,
)

__all__ = [
    "Example",
    "LoadedData",
    "load_dataset",
    "PromptSampler",
    "make_arith",
    "ARITH_DIFFICULTY",
    "DATASETS",
    "DEFAULT_TEMPLATE",
    "resolve_data_dir",
    "read_rows",
    "clean_label",
    "apply_template",
    "DataError",
    "DataFileNotFoundError",
    "read_text_lines",
]
