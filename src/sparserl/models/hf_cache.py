"""What transformers calls a model's KV cache, in the version installed.

transformers renamed the forward's ``past_key_values`` argument, and the outputs' field of that name,
to ``cache`` (5.24 has the new name; the old one still works there, with a FutureWarning: "will be
removed in version 5.40.0").
sparserl asks for ``transformers>=5.0``, so both spellings must work: the argument's name is read from the
module's ``forward`` signature, the cache from whichever field the output has.
"""

from __future__ import annotations

import inspect
from functools import cache

__all__ = ["cache_argument", "output_cache"]


@cache
def _argument_of(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_argument(module) -> str:
    """``"cache"`` where ``module.forward`` takes it, else ``"past_key_values"``."""
    return _argument_of(type(module))


def output_cache(output):
    """The KV cache a forward's or ``generate``'s output returned (None when it holds none)."""
    fields = getattr(output, "__dataclass_fields__", {})
    if "cache" in fields:
        return output.cache
    return getattr(output, "past_key_values", None)
