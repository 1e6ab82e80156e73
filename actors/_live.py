"""Live agent events: announced to whoever listens, never persisted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class LiveEvent:
    """A live, not persisted, agent event: ``agent/created``, ``agent/status``, ..."""

    type: str
    agent_id: str
    data: Mapping[str, Any]
