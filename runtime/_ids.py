"""Session ids: the one identity an agent, its session and its LoopX thread share."""

from __future__ import annotations

import re

from ._errors import InvalidSessionIdError

MAX_SESSION_ID_LENGTH = 128

# LoopX accepts a thread id of <= 128 chars with no whitespace, control characters,
# slashes or quotes; a session id is used as that thread id, so it obeys the same rule.
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")


def check_session_id(value: object, *, what: str = "session id") -> str:
    """Return ``value`` if it is a valid session id, else raise InvalidSessionIdError."""
    if not isinstance(value, str) or not value:
        raise InvalidSessionIdError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_SESSION_ID_LENGTH:
        raise InvalidSessionIdError(
            f"{what} {value[:20]!r}... is {len(value)} characters long; "
            f"at most {MAX_SESSION_ID_LENGTH} are allowed"
        )
    if not _SESSION_ID.fullmatch(value):
        raise InvalidSessionIdError(
            f"{what} {value!r} must start with a letter or digit and contain only "
            "letters, digits and . _ : @ + -"
        )
    return value
