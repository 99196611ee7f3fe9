"""A config's training set, read one way wherever it is read: the trainer (:func:`sparserl.train.build.build_trainer`,
which names ``data.train`` in its errors) and the experiments that sample its prompts as a run would.

The columns are ``data.prompt_key`` / ``data.label_key`` where set, else a built-in set's own mapping or the common
names; prompts take ``data.template`` and ``data.system_prompt``; bad rows are skipped up to
``data.skip_bad_rows`` (else the first one is an error naming its line).
"""

from __future__ import annotations

from ..config import DataConfig
from ..data import LoadedData, load_dataset

__all__ = ["load_train_set"]

_LIMIT_OF_CONFIG = object()


def load_train_set(data: DataConfig, limit: int | None | object = _LIMIT_OF_CONFIG) -> LoadedData:
    """The examples of ``data.train``, at most ``limit`` of them (default ``data.limit``; None = all). Errors are
    the loader's :class:`~sparserl.data.DataError` s; a column that cannot be guessed names ``data.prompt_key`` or
    ``data.label_key``."""
    return load_dataset(
        data.train,
        prompt_key=data.prompt_key,
        label_key=data.label_key,
        template=data.template,
        key_options=("data.prompt_key", "data.label_key"),
        system_prompt=data.system_prompt,
        limit=data.limit if limit is _LIMIT_OF_CONFIG else limit,
        skip_bad_rows=data.skip_bad_rows if data.skip_bad_rows else None,
    )
