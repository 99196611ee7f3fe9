"""The record every data source produces: one prompt and its reference answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Example"]


@dataclass
class Example:
    """One prompt and its reference answer.

    ``prompt``: a text problem or a list of chat messages (dicts with ``role`` and ``content``);
    ``label``: the reference answer as a string; ``meta``: where it came from (``source`` file,
    ``line`` or ``row``, ``dataset``) and small per-problem fields (id, level, subject...).
    """

    prompt: str | list[dict[str, str]]
    label: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The problem as the model is asked it, as text: the prompt itself when it is a string, else its
        last user message (after ``data.template``); what a reward's third parameter, ``prompt``, receives."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else (self.prompt[-1]["content"] if self.prompt else "")
