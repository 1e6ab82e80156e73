"""The websocket side of the bridge's port: wsproto (sans-IO RFC 6455) under a small trio adapter.

``accept_websocket`` takes an upgrade request that ``bridge._http`` has read, answers it
with wsproto's 101, and yields the ``WebSocket``: one task of its own reads the stream (the
only one that does), feeds wsproto each chunk as it comes, and deals with each event in
order:

- a message (its parts in order) is queued for ``receive``; a message whose parts pass
  ``max_message_size`` (characters of text, bytes of binary) is refused with close 1009
  as soon as they do, before it is whole;
- a ping is answered with a pong while the connection is open;
- the peer's close frame is answered with ours;
- a frame wsproto cannot parse (text that is not UTF-8, a reserved opcode or bit, a
  control frame over 125 bytes, ...) fails the connection (RFC 6455 section 7.1.7): a
  close frame carrying wsproto's code (1007, 1002), and nothing more is read.

The reader reads the next chunk only once every queued message was taken: it is one chunk
ahead of ``receive`` at most (a peer that is not read from waits, TCP backpressure), and a
ping or a bad frame that comes while the last message is being handled is dealt with then.
Once our close frame is out, nothing more is sent (RFC 6455 section 5.5.1): pings and
messages still arriving are read and dropped until the peer's close frame or the end of its
stream (unless wsproto failed). Frames go out whole and in the order wsproto made them (one lock over making and
writing them), so no reply can follow our close frame. ``receive`` and ``send`` raise
``ConnectionClosed`` once the connection is closing; ``close`` finishes the close handshake
and closes the TCP connection; ``abort`` closes it at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from typing import cast, final

import h11
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

from ._connection import CLOSE_TOO_LARGE

#: Bytes read from the stream at a time.
RECEIVE_BYTES = 2**16
#: The close code for a TCP connection that ended without a close frame (RFC 6455 section 7.1.5).
CLOSE_ABNORMAL = 1006
#: Our close code when the server goes away.
CLOSE_GOING_AWAY = 1001


class ConnectionClosed(Exception):
    """Raised by ``WebSocket.receive`` once the connection is closing and every message
    read before was taken, and by ``send`` once it can send no more. ``code`` and
    ``reason`` say why: the peer's close frame, ours, or 1006 when the TCP connection
    ended without one."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class HandshakeRefused(Exception):
    """Raised by ``accept_websocket`` for an upgrade request wsproto refuses (no
    ``Sec-WebSocket-Key``, another websocket version, ...); nothing was sent yet.
    ``status`` and ``headers`` are the HTTP answer wsproto suggests."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.headers = headers


@asynccontextmanager
async def accept_websocket(
    stream: trio.abc.Stream, request: h11.Request, trailing_data: bytes, *, max_message_size: int
) -> AsyncIterator[WebSocket]:
    """Answer ``request`` (a websocket upgrade, read by h11) with 101 and yield the
    connection, its reader running until the block ends (the TCP connection is closed
    then; ``close`` first for a close handshake). ``trailing_data``: what the peer sent
    after the request, parsed at once. Raises HandshakeRefused before sending anything if
    wsproto refuses the request, and ConnectionClosed if the peer went away before the
    101 was out."""
    ws = WSConnection(ConnectionType.SERVER)
    try:
        ws.initiate_upgrade_connection(list(request.headers), request.target)
    except RemoteProtocolError as exc:
        hint = exc.event_hint
        if isinstance(hint, RejectConnection):
            raise HandshakeRefused(hint.status_code, list(hint.headers), str(exc)) from None
        raise HandshakeRefused(400, [], str(exc)) from None
    except UnicodeError:  # wsproto reads the Host header as IDNA, which not every value is
        raise HandshakeRefused(400, [], "a Host header that is not a host name") from None
    for _ in ws.events():  # the request, which was read already
        pass
    accepted = ws.send(AcceptConnection())
    websocket = WebSocket(stream, ws, max_message_size=max_message_size)
    async with websocket._send_lock:
        await websocket._write(accepted)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(websocket._read_frames, trailing_data)
            yield websocket
            nursery.cancel_scope.cancel()
    finally:
        await websocket.abort()


@final
class WebSocket:
    """One accepted websocket connection on a trio stream (only ``accept_websocket``
    creates it)."""

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, *, max_message_size: int) -> None:
        self._stream = stream
        self._ws = ws
        self._max_message_size = max_message_size
        self._messages: deque[str | bytes] = deque()  # whole, not taken yet
        self._parts: list[str | bytes | bytearray] = []  # of the message coming in
        self._size = 0
        self._send_lock = trio.Lock()
        self._arrived = trio.Event()  # a message was queued, or the connection is closing
        self._taken = trio.Event()  # the queue was emptied, or our close frame went out
        self._read_all = trio.Event()  # the reader is done: close handshake over, or no more data
        #: Why the connection is closing, once it is: (code, reason).
        self._closing: tuple[int, str] | None = None
        self._failed = False  # wsproto failed to parse the peer's data
        self._broken = False  # a write was cut short, or the stream is closed

    # -- receiving -----------------------------------------------------------------------

    async def receive(self) -> str | bytes:
        """The next message from the peer: text as ``str``, binary as ``bytes``.

        Raises ConnectionClosed once the connection is closing and every message that
        came before was taken. Cancelling it loses nothing.
        """
        while not self._messages:
            if self._closing is not None:
                raise ConnectionClosed(*self._closing)
            self._arrived = trio.Event()
            await self._arrived.wait()
        message = self._messages.popleft()
        if not self._messages:
            self._taken.set()
        return message

    async def _read_frames(self, data: bytes) -> None:
        """The connection's one reader, from ``data`` (what came with the request) on."""
        try:
            while True:
                if data:
                    self._ws.receive_data(data)
                    # Closed here also when cancelled mid-way, not by whichever garbage
                    # collection finds it (its close then runs wherever that started).
                    with closing(self._ws.events()) as events:
                        for event in events:
                            await self._deal_with(event)
                # Done: the close handshake is over, or the stream is unusable, or wsproto
                # failed to parse it (RFC 6455 section 7.1.7: process nothing more of it).
                if self._broken or self._failed or self._ws.state is ConnectionState.CLOSED:
                    return
                while self._messages and self._ws.state is ConnectionState.OPEN and not self._broken:
                    self._taken = trio.Event()
                    await self._taken.wait()
                try:
                    data = bytes(await self._stream.receive_some(RECEIVE_BYTES))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self._close_as(CLOSE_ABNORMAL, "the TCP connection ended without a close frame")
                    return
        except ConnectionClosed:
            pass  # a pong or a close frame found the connection broken: nothing more to read
        finally:
            self._read_all.set()
            self._arrived.set()

    async def _deal_with(self, event: Event) -> None:
        state = self._ws.state
        if isinstance(event, (TextMessage, BytesMessage)):
            if state is ConnectionState.OPEN:
                await self._take_part(event)
        elif isinstance(event, Ping):
            if state is ConnectionState.OPEN:
                await self._send_event(event.response())
        elif isinstance(event, CloseConnection):
            if state is ConnectionState.REMOTE_CLOSING:  # the peer's close frame: answer it
                self._close_as(event.code, event.reason or "")
                await self._send_event(event.response())
            elif state is ConnectionState.CLOSED:  # the peer's answer to ours
                self._close_as(event.code, event.reason or "")
            else:
                # Not a close frame (one would have moved wsproto on from OPEN or
                # LOCAL_CLOSING): wsproto failed to parse the peer's data.
                self._failed = True
                await self._fail(event.code, event.reason or "")

    async def _take_part(self, event: TextMessage | BytesMessage) -> None:
        self._size += len(event.data)
        if self._size > self._max_message_size:
            self._parts.clear()
            await self._fail(CLOSE_TOO_LARGE, f"a message over {self._max_message_size} characters or bytes")
            return
        self._parts.append(event.data)
        if event.message_finished:
            parts, self._parts, self._size = self._parts, [], 0
            if isinstance(event, TextMessage):
                self._messages.append("".join(cast(list[str], parts)))
            else:
                self._messages.append(b"".join(cast(list[bytes], parts)))
            self._arrived.set()

    async def _fail(self, code: int, reason: str) -> None:
        """Send our close frame with ``code`` unless one went out, and take no more messages."""
        # Set first: a writer waiting for the lock meanwhile must get ConnectionClosed.
        self._close_as(code, reason)
        if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            try:
                await self._send_event(CloseConnection(code=code, reason=reason))
            except ConnectionClosed:
                pass  # the peer is gone
        self._taken.set()  # the reader reads on, to the peer's close frame

    def _close_as(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = (code, reason)
            self._arrived.set()

    # -- sending -------------------------------------------------------------------------

    async def send(self, message: str | bytes) -> None:
        """Send one message (text for ``str``). Raises ConnectionClosed if it cannot go
        out: our close frame went out before it, or the peer is gone. Cancelled while
        writing, it leaves the connection broken (``close`` only closes the TCP connection)."""
        await self._send_event(TextMessage(data=message) if isinstance(message, str) else BytesMessage(data=message))

    async def _send_event(self, event: Event) -> None:
        async with self._send_lock:
            # wsproto refuses anything after our close frame, and anything but that frame
            # once the peer's is in.
            sendable = {ConnectionState.OPEN}
            if isinstance(event, CloseConnection):
                sendable.add(ConnectionState.REMOTE_CLOSING)
            if self._broken or self._ws.state not in sendable:
                self._close_as(CLOSE_ABNORMAL, "the connection broke")
                assert self._closing is not None
                raise ConnectionClosed(*self._closing)
            await self._write(self._ws.send(event))

    async def _write(self, data: bytes) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
            self._close_as(CLOSE_ABNORMAL, "the TCP connection broke")
            assert self._closing is not None
            raise ConnectionClosed(*self._closing) from None
        except BaseException:
            self._broken = True  # cancelled: after a frame cut short, nothing more can be sent
            raise

    # -- closing -------------------------------------------------------------------------

    async def close(self, code: int, reason: str) -> None:
        """Finish the connection: send our close frame with ``code`` unless one went out,
        wait until the reader is done (the peer's close frame, or the end of its stream),
        then close the TCP connection. Bound it with a deadline: cancelled, it closes the
        TCP connection at once."""
        try:
            await self._fail(code, reason)
            if not self._broken:  # else no close frame can go out, nor the handshake end
                await self._read_all.wait()
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Close the TCP connection without a close handshake (for a peer that does not
        read, a close frame would only queue behind what it never drains)."""
        self._broken = True
        self._close_as(CLOSE_ABNORMAL, "aborted")
        await trio.aclose_forcefully(self._stream)
