"""SessionLog: what the actors need of a session store, so that one process's SQLite
store (``runtime._store.SessionStore``) and the cluster's Redis store
(``runtime.cluster.RedisSessionStore``) are interchangeable.

Every method but ``acommit`` blocks: the actors call them in a worker thread
(``trio.to_thread``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from ._events import Event, SessionHeader
from ._messages import Message
from ._store import StoreError, Write


class SessionLog(Protocol):
    def exists(self, session_id: str) -> bool: ...

    def load(self, session_id: str) -> tuple[SessionHeader, list[Event]] | None:
        """The header and every event in seq order; None if the session is unknown."""

    def load_events(
        self, session_id: str, start: int = 0, stop: int | None = None, types: Collection[str] | None = None
    ) -> list[Event]:
        """Events with ``start <= seq < stop`` (of ``types`` if given), in seq order."""

    def load_messages(self, session_id: str, start: int, stop: int, types: Collection[str]) -> list[Message]:
        """The messages of the events of ``types`` with ``start <= seq < stop``, in seq order."""

    def load_outline(
        self, session_id: str, types: Collection[str]
    ) -> tuple[SessionHeader, int, int, list[Event]] | None:
        """Header, event count, last event's time and the events of ``types``."""

    def commit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        """Write the batch; returns the sessions whose part was refused (see SessionStore)."""

    async def acommit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        """``commit`` for the trio thread (the store writer's way in): SQLite's runs in a
        worker thread, Redis's in the trio thread itself."""

    def list_headers(self) -> list[SessionHeader]: ...

    def close(self) -> None: ...
