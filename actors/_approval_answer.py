"""A person's answer to an approval question, as the log records it (actors._approvals)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class Answer:
    decision: str  # approve | refuse | edit, or withdrawn (nobody waits any more)
    reason: str | None = None
    arguments: Mapping[str, Any] | None = None  # an edit's new arguments
