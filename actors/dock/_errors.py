"""The loop dock's one error class. ``code`` is stable; messages name the offending id
and, where it helps, what is available."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from loopdock.runtime import LoopdockError

DockErrorCode = Literal[
    "INVALID_CONFIG",
    "INVALID_LOOP_ID",
    "INVALID_LOOP_DEFINITION",
    "DUPLICATE_LOOP",
    "UNKNOWN_LOOP",
    "MISSING_DRIVER",
    "UNKNOWN_DRIVER",
    "INVALID_DRIVER",
    "DUPLICATE_DRIVER",
    "LOOP_SWITCH",
]


class DockError(LoopdockError):
    """Raised by the loop dock; ``code`` says which rule was broken:

    - INVALID_CONFIG: malformed dock config, or a driver chosen for a driver loop;
    - INVALID_LOOP_ID: a loop id that does not match ``^[a-z0-9][a-z0-9._-]*$``;
    - INVALID_LOOP_DEFINITION: a loop without its required parts;
    - DUPLICATE_LOOP / DUPLICATE_DRIVER: an id or name registered twice;
    - UNKNOWN_LOOP / UNKNOWN_DRIVER: nothing registered under that id or name;
    - MISSING_DRIVER: a strategy loop's driver is not registered;
    - INVALID_DRIVER: a bad driver name, or a driver without create_agent/resume;
    - LOOP_SWITCH: resuming a session with a loop or driver other than its binding.
    """

    def __init__(self, code: DockErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def available(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed) if listed else "none"
