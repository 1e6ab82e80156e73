"""The two spellings of one name: snake_case in Python, camelCase on DSH's wire and in
its config (``max_tokens`` <-> ``maxTokens``)."""

from __future__ import annotations

import re

_UPPER = re.compile(r"(?<!^)(?=[A-Z])")


def camel(name: str) -> str:
    """``max_tokens`` -> ``maxTokens``."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def snake(name: str) -> str:
    """``maxTokens`` -> ``max_tokens`` (a snake_case name stays as it is)."""
    return _UPPER.sub("_", name).lower()
