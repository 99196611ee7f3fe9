"""The one base class of sparserl's user-facing errors.

Every error a user can cause (a bad config key, a missing data file, an unreadable model, a corrupt
checkpoint, a bad reward spec or command option) derives from :class:`SparserlError`; its message
names the file (and line), key or option, the bad value, and what would be valid. The CLI catches
this class alone and prints ``error: <message>`` with a non-zero exit; any other exception is a bug
and keeps its traceback.

The subclasses live next to what they are about: ``ConfigError`` (``sparserl.config``),
``DataError`` (``sparserl.data.loaders``), ``ModelLoadError`` (``sparserl.models.loading``),
``CheckpointError`` (``sparserl.train.checkpoint``), ``ResumeError`` (``sparserl.train.trainer``),
``RewardSpecError`` (``sparserl.reward.registry``), ``CompressorOptionError`` and
``UnknownNameError`` (``sparserl.rollout.kv`` / ``sparserl.registry``), ``OutlierCountError``
(``sparserl.rollout.quant.outliers``), ``NativeArchError`` (``sparserl.rollout.native``), ``CompareError``
(``sparserl.compare``), ``EnvPathError`` (``sparserl.envpath``: a folder variable such as
``SPARSERL_CACHE``), and :class:`OptionError` here (a command's own options).
"""

from __future__ import annotations

__all__ = ["OptionError", "SparserlError"]


class SparserlError(Exception):
    """A problem with the user's input (config, data, model, checkpoint, reward spec, options)."""


class OptionError(SparserlError, ValueError):
    """A command option (a number, a flag, an output path) that is out of range or unusable; the
    message names the option, the value and what would be valid."""
