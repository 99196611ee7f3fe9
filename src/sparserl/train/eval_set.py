"""A config's evaluation set, read one way wherever it is read: the run's preflight, its held-out
evaluations (:func:`sparserl.train.held_out.held_out_eval`) and ``sparserl compare --eval``.

The prompts take the training set's form (``data.template``, ``data.system_prompt``). The columns are
``data.eval_prompt_key`` / ``data.eval_label_key`` where set; otherwise a built-in set's own mapping,
or, for a file, the training set's columns (``data.prompt_key`` / ``data.label_key``) where the file
has them, then the common names (as verl applies one ``data.prompt_key`` to its training and
validation files).
"""

from __future__ import annotations

from ..config import DataConfig
from ..data import LoadedData, load_dataset

__all__ = ["load_eval_set"]

_LIMIT_OF_CONFIG = object()


def load_eval_set(
    data: DataConfig, spec: str | None = None, limit: int | None | object = _LIMIT_OF_CONFIG
) -> LoadedData:
    """The examples of ``spec`` (default ``data.eval``), at most ``limit`` of them (default
    ``data.eval_limit``; None = all), read as the module docstring says. Errors are the loader's
    :class:`~sparserl.data.DataError` s; a column that cannot be guessed names ``data.eval_prompt_key``
    or ``data.eval_label_key``."""
    spec = data.eval if spec is None else spec
    if spec is None:
        raise ValueError("no evaluation set: data.eval is null and no set was given")
    return load_dataset(
        spec,
        prompt_key=data.eval_prompt_key,
        label_key=data.eval_label_key,
        template=data.template,
        system_prompt=data.system_prompt,
        limit=data.eval_limit if limit is _LIMIT_OF_CONFIG else limit,
        preferred_keys=(data.prompt_key, data.label_key),
        key_options=("data.eval_prompt_key", "data.eval_label_key"),
    )
