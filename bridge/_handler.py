"""What the server calls: the runtime's side of a bridge connection.

The server owns the sockets, the protocol and the queues; a ``BridgeHandler`` decides what
host events and requests mean. One handler serves every connection of a server (it tells
them apart by the ``BridgeConnection`` it is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import attrs

from actors import LiveEvent

from ._errors import NotServedError
from ._messages import (
    GoalbarPause,
    GoalbarRead,
    GoalbarResult,
    GoalbarStart,
    GoalbarWatch,
    Mirrored,
    MirroredSeqs,
    PreStep,
    Select,
    Selection,
    SessionEvent,
    Verdict,
)

if TYPE_CHECKING:
    from ._server import BridgeConnection

DisconnectKind = Literal[
    "peer-closed",  # the peer closed the websocket, or the TCP connection broke
    "unauthorized",  # no hello with the right token and role first (closed 1008)
    "bad-version",  # another protocol version (closed 1002)
    "too-large",  # a frame over the size limit (closed 1009 by trio-websocket)
    "slow-peer",  # its outgoing queue filled up: dropped without a close handshake
    "server-closing",  # the server was cancelled
    "internal-error",  # a bug in the bridge itself (logged): it costs one connection only
]


@attrs.frozen
class Disconnect:
    """Why a connection ended: ``kind`` for code, ``detail`` for people."""

    kind: DisconnectKind
    detail: str


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

    def connected(self, conn: BridgeConnection) -> None: ...

    def disconnected(self, conn: BridgeConnection, reason: Disconnect) -> None: ...

    async def on_events(self, conn: BridgeConnection, items: Sequence[SessionEvent]) -> None: ...

    async def on_live(self, conn: BridgeConnection, items: Sequence[LiveEvent]) -> None: ...

    async def on_pre_step(self, conn: BridgeConnection, request: PreStep) -> Verdict: ...

    async def on_select(self, conn: BridgeConnection, request: Select) -> Selection: ...

    # The last seq mirrored of each session the host asks about (after each welcome, so
    # that it sends only what the runtime lacks); leave out the sessions it knows nothing
    # of. A handler without it answers ``MirroredSeqs({})`` (the host then sends every log
    # from seq 0).
    async def on_mirrored(self, conn: BridgeConnection, request: Mirrored) -> MirroredSeqs: ...

    # Optional (the server answers NOT_SERVED without it): a GoalBar page's request.
    # async def on_goalbar(self, conn, request: GoalbarRead | GoalbarWatch | GoalbarStart
    #                      | GoalbarPause) -> GoalbarResult: ...


class NullHandler:
    """Accepts and drops events, lets every pre-step enter, answers ``select`` with
    ``error NOT_SERVED`` and ``mirrored`` with nothing mirrored: the server's behaviour
    before the runtime is wired to it."""

    def connected(self, conn: BridgeConnection) -> None:
        pass

    def disconnected(self, conn: BridgeConnection, reason: Disconnect) -> None:
        pass

    async def on_events(self, conn: BridgeConnection, items: Sequence[SessionEvent]) -> None:
        pass

    async def on_live(self, conn: BridgeConnection, items: Sequence[LiveEvent]) -> None:
        pass

    async def on_pre_step(self, conn: BridgeConnection, request: PreStep) -> Verdict:
        return Verdict("enter")

    async def on_select(self, conn: BridgeConnection, request: Select) -> Selection:
        raise NotServedError("this runtime has no dock handler on the bridge")

    async def on_mirrored(self, conn: BridgeConnection, request: Mirrored) -> MirroredSeqs:
        return MirroredSeqs({})

    async def on_goalbar(
        self, conn: BridgeConnection, request: GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause
    ) -> GoalbarResult:
        raise NotServedError("this runtime serves no GoalBar")
