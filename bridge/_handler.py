"""What the server calls: the runtime's side of a bridge connection.

The server owns the sockets, the protocol and the queues; a ``BridgeHandler`` decides what
host events and requests mean. One handler serves every connection of a server (it tells
them apart by the ``Peer`` it is given: the server's ``BridgeConnection``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import attrs

from loopdock.actors import LiveEvent
from loopdock.runtime import Event

from ._errors import NotServedError
from ._messages import (
    AnswerApproval,
    ApprovalDone,
    BridgeMessage,
    CommandDone,
    GoalbarPause,
    GoalbarRead,
    GoalbarResult,
    GoalbarStart,
    GoalbarView,
    GoalbarWatch,
    Mirrored,
    MirroredSeqs,
    PreStep,
    Role,
    RunCommand,
    Select,
    Selection,
    SessionEvent,
    Verdict,
)

DisconnectKind = Literal[
    "peer-closed",  # the peer closed the websocket, or the TCP connection broke
    "unauthorized",  # no hello with the right token and role first (closed 1008)
    "bad-version",  # another protocol version (closed 1002)
    "too-large",  # a message over the size limit (closed 1009)
    "bad-frame",  # a frame the websocket protocol refuses, e.g. text not UTF-8 (closed 1007 or 1002)
    "slow-peer",  # its outgoing queue filled up: dropped without a close handshake
    "server-closing",  # the server was cancelled
    "internal-error",  # a bug in the bridge itself (logged): it costs one connection only
]


@attrs.frozen
class Disconnect:
    """Why a connection ended: ``kind`` for code, ``detail`` for people; ``close_code``:
    the websocket close code the peer sent, when it closed the connection itself."""

    kind: DisconnectKind
    detail: str
    close_code: int | None = None


class Peer(Protocol):
    """One connection as a handler sees it (the server's ``BridgeConnection``)."""

    @property
    def id(self) -> str: ...

    @property
    def role(self) -> Role: ...

    @property
    def closed(self) -> Disconnect | None:
        """Why the connection ended; None while it lives."""

    def publish_event(self, session_id: str, event: Event) -> bool: ...

    def publish_live(self, item: LiveEvent) -> bool: ...

    def publish_goalbar(self, state: GoalbarView) -> bool: ...

    async def request(self, message: BridgeMessage, reply_timeout: float = ...) -> BridgeMessage: ...


class BridgeHandler(Protocol):
    """The runtime's side of the bridge.

    ``connected`` and ``disconnected`` are plain functions (they must not block): they
    run in the connection's actor, ``connected`` after the welcome was queued, and
    ``disconnected`` exactly once after it, whatever ended the connection (also under
    cancellation). Requests that were waiting on the connection have already failed with
    ``BridgeClosedError`` by then.

    ``on_events`` and ``on_live`` are awaited in arrival order, one batch at a time: the
    next frame of that peer is not read until they return (keep them quick). ``on_pre_step``,
    ``on_select`` and ``on_mirrored`` run concurrently with the reading, one task per
    request; raising a
    ``LoopdockError`` answers the request with an ``error`` frame carrying its ``code``
    (e.g. the dock's ``LOOP_SWITCH``); any other exception is logged and answered with
    ``INTERNAL_ERROR``. All of them are cancelled when the connection ends.
    """

    def connected(self, conn: Peer) -> None: ...

    def disconnected(self, conn: Peer, reason: Disconnect) -> None: ...

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None: ...

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None: ...

    async def on_pre_step(self, conn: Peer, request: PreStep) -> Verdict: ...

    async def on_select(self, conn: Peer, request: Select) -> Selection: ...

    async def on_mirrored(self, conn: Peer, request: Mirrored) -> MirroredSeqs:
        """The last seq mirrored of each session the host asks about (after each welcome,
        so that it sends only what the runtime lacks); sessions it knows nothing of are
        left out (the host then sends their logs from seq 0)."""

    async def on_goalbar(
        self, conn: Peer, request: GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause
    ) -> GoalbarResult:
        """A GoalBar page's request (``NotServedError``: this runtime serves no GoalBar)."""

    async def on_command(self, conn: Peer, request: RunCommand) -> CommandDone:
        """A command a DSH user ran in a live agent that the runtime carries out
        (``NotServedError``: this runtime serves no such command)."""

    async def on_approval(self, conn: Peer, request: AnswerApproval) -> ApprovalDone:
        """A console page answers a runtime agent's approval question (``NotServedError``:
        this runtime serves no console)."""


class NullHandler:
    """Accepts and drops events, lets every pre-step enter, answers ``select`` with
    ``error NOT_SERVED`` and ``mirrored`` with nothing mirrored: the server's behaviour
    before the runtime is wired to it."""

    def connected(self, conn: Peer) -> None:
        pass

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        pass

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None:
        pass

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None:
        pass

    async def on_pre_step(self, conn: Peer, request: PreStep) -> Verdict:
        return Verdict("enter")

    async def on_select(self, conn: Peer, request: Select) -> Selection:
        raise NotServedError("this runtime has no dock handler on the bridge")

    async def on_mirrored(self, conn: Peer, request: Mirrored) -> MirroredSeqs:
        return MirroredSeqs({})

    async def on_goalbar(
        self, conn: Peer, request: GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause
    ) -> GoalbarResult:
        raise NotServedError("this runtime serves no GoalBar")

    async def on_command(self, conn: Peer, request: RunCommand) -> CommandDone:
        raise NotServedError("this runtime runs no host commands")

    async def on_approval(self, conn: Peer, request: AnswerApproval) -> ApprovalDone:
        raise NotServedError("this runtime serves no console")


class HandlerLayer:
    """A handler that answers some messages itself and passes every other one on to
    ``inner`` (a ``NullHandler`` by default): handlers combine by wrapping one another.
    Subclasses override what they answer and call ``super()`` to pass a message on."""

    def __init__(self, inner: BridgeHandler | None = None) -> None:
        self.inner: BridgeHandler = inner if inner is not None else NullHandler()

    def connected(self, conn: Peer) -> None:
        self.inner.connected(conn)

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        self.inner.disconnected(conn, reason)

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None:
        await self.inner.on_events(conn, items)

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None:
        await self.inner.on_live(conn, items)

    async def on_pre_step(self, conn: Peer, request: PreStep) -> Verdict:
        return await self.inner.on_pre_step(conn, request)

    async def on_select(self, conn: Peer, request: Select) -> Selection:
        return await self.inner.on_select(conn, request)

    async def on_mirrored(self, conn: Peer, request: Mirrored) -> MirroredSeqs:
        return await self.inner.on_mirrored(conn, request)

    async def on_goalbar(
        self, conn: Peer, request: GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause
    ) -> GoalbarResult:
        return await self.inner.on_goalbar(conn, request)

    async def on_command(self, conn: Peer, request: RunCommand) -> CommandDone:
        return await self.inner.on_command(conn, request)

    async def on_approval(self, conn: Peer, request: AnswerApproval) -> ApprovalDone:
        return await self.inner.on_approval(conn, request)
