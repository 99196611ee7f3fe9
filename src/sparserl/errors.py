"""The one base class of sparserl's user-facing errors.

Every error a user can cause (a bad config key, a missing data file, an unreadable model, a corrupt
checkpoint, a bad reward spec or command option) derives from :class:`SparserlError`; its message
names the file (and line), key or option, the bad value, and what would be valid. The CLI catches
this class alone and prints ``error: <message>`` with a non-zero exit; any other exception is a bug
and keeps its traceback.
"""
from __future__ import annotations

__all__ = ["SparserlError"]


class SparserlError(Exception):
    """A problem with the user's input (config, data, model, checkpoint, reward spec, options)."""
