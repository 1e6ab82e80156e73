"""Session ids (the one identity an agent, its session and its LoopX thread share) and
the unique ids of messages."""

from __future__ import annotations

import itertools
import os
import re
import uuid

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


class MessageIds:
    """Unique, UUID-shaped message ids, cheaply: a random per-process prefix + a counter.

    DSH expects a message id to be a UUID (version 4 layout). ``uuid.uuid4()`` costs an
    ``os.urandom`` syscall per id, on the hot path of every step; here 60 random bits are
    drawn once per process and the remaining 62 bits count up, so ids stay unique within
    the process (the counter) and across processes (the prefix), and every id parses as a
    version-4, RFC 4122-variant UUID. ``next(itertools.count())`` is atomic under the GIL,
    so ids may be drawn from any thread. A forked child draws a new prefix.
    """

    _SUFFIX_MASK = (1 << 62) - 1

    def __init__(self) -> None:
        self._reseed()

    def _reseed(self) -> None:
        # The first three groups of a random UUID4 (its version nibble included).
        self._prefix = str(uuid.uuid4())[:19]
        self._counter = itertools.count()

    def new(self) -> str:
        low = 0x8000_0000_0000_0000 | (next(self._counter) & self._SUFFIX_MASK)  # variant 10
        text = f"{low:016x}"
        return f"{self._prefix}{text[:4]}-{text[4:]}"


#: The process's message id source (``Message``'s default id). Its only mutable state is
#: its counter; it is reseeded in a forked child so parent and child never share ids.
MESSAGE_IDS = MessageIds()
os.register_at_fork(after_in_child=MESSAGE_IDS._reseed)
