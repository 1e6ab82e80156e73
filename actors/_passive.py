"""What a passivated agent keeps in memory, and its session as seen meanwhile.

A passivated agent (docs/lifecycle.md) is the same ``AgentActor`` object its callers
hold, emptied down to three attributes: its id, its owner and one ``Passive`` record.
Everything else (inbox, nursery, tools, waterfalls, session actor, history) is released;
the session log in the store is the truth it is rebuilt from on its next message.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NoReturn

import trio

from loopdock.runtime import AgentPassivatedError, Changes, Event, Message

from ._inbox import Entry
from ._store_writer import StoreWriter


class Passive:
    """One passivated agent's state: small on purpose (a million of them must fit).

    ``recipe``: how to resume it (the caller's options, for the dock's resume path);
    ``pending``: messages sent since it was passivated, in arrival order, delivered to
    the rebuilt agent's inbox (and logged there) once it runs again; ``transition``: True
    while it is being passivated or reactivated;
    ``scope``: the reactivation's cancel scope; ``error``: why the last reactivation
    failed; ``wanted``: someone asked for it to run again (a message, ``activate()``);
    ``closed``: disposed while passivated; ``changes``: made for the first waiter;
    ``kept``: what its companions keep across the passivation (``Lifecycle.keepers``: the
    LoopX continuation's scheduler state), None when none keeps anything."""

    __slots__ = (
        "recipe", "pending", "status_version", "transition", "scope", "error", "wanted", "closed", "changes", "kept",
    )

    def __init__(self, recipe: Any, status_version: int) -> None:
        self.recipe = recipe
        self.pending: list[Entry] | None = None
        self.status_version = status_version
        self.transition = False
        self.scope: trio.CancelScope | None = None
        self.error: BaseException | None = None
        self.wanted = False
        self.closed = False
        self.changes: Changes | None = None
        self.kept: dict[str, Any] | None = None

    def notify(self) -> None:
        if self.changes is not None:
            self.changes.notify()

    async def changed(self) -> None:
        """Wait for the next change of this record (a message, the end of a transition)."""
        if self.changes is None:
            self.changes = Changes()
        await self.changes.wait()

    def queue(self, entry: Entry) -> None:
        if self.pending is None:
            self.pending = []
        self.pending.append(entry)

    def take_pending(self) -> list[Entry]:
        pending, self.pending = self.pending or [], None
        return pending

    def has_human(self) -> bool:
        return any(entry.human for entry in self.pending or ())


class PassiveSession:
    """``agent.session`` of a passivated agent: its log, read from the store (in a worker
    thread, as every store read). Only the readers; anything else raises
    AgentPassivatedError (``await agent.activate()`` gives the live session back)."""

    __slots__ = ("id", "_writer")

    def __init__(self, session_id: str, writer: StoreWriter) -> None:
        self.id = session_id
        self._writer = writer

    @property
    def closed(self) -> bool:
        return False

    @property
    def published(self) -> bool:
        return True

    async def read_events(self, start: int = 0) -> list[Event]:
        store = self._writer.store
        return await trio.to_thread.run_sync(
            lambda: store.load_events(self.id, start, None), limiter=self._writer.readers
        )

    async def read_history(self, types: Collection[str]) -> list[Event]:
        store = self._writer.store
        return await trio.to_thread.run_sync(
            lambda: store.load_events(self.id, 0, None, types), limiter=self._writer.readers
        )

    async def read_messages(self, types: Collection[str]) -> list[Message]:
        store = self._writer.store

        def read() -> list[Message]:
            outline = store.load_outline(self.id, ())
            count = 0 if outline is None else outline[1]
            return store.load_messages(self.id, 0, count, types)

        return await trio.to_thread.run_sync(read, limiter=self._writer.readers)

    async def flush(self) -> None:
        """Nothing is pending: a passivated session's log is durable."""
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(name)
        raise passivated(self.id, f"session.{name}")


def passivated(agent_id: str, what: str) -> AgentPassivatedError:
    return AgentPassivatedError(
        f"agent {agent_id!r} is passivated: {what} is not in memory; `await agent.activate()` brings it back"
    )
