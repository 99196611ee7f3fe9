"""One registry helper for every list of named things: compressors, corrections, advantage
estimators (the verl ``@register_adv_est("grpo")`` habit).

    COMPRESSORS = Registry("compressor")

    @COMPRESSORS.register("rkv")
    class RKV(KVCompressor): ...

    COMPRESSORS.get("rkv")      # the class; an unknown name raises UnknownNameError with a hint
    COMPRESSORS.names()         # sorted names: the one list the config, the CLI and the docs use

Registering a second, different object under a name already taken raises ``ValueError`` (the same
object again is a no-op, so re-importing a module is harmless).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import SparserlError

__all__ = ["Registry", "UnknownNameError", "did_you_mean"]

T = TypeVar("T")


def did_you_mean(name: str, candidates) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


class UnknownNameError(SparserlError, ValueError):
    """A name that no registry entry has."""


class Registry(Generic[T]):
    """Name → object, filled by a decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}; available: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
