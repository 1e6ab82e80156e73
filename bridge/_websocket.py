"""trio-websocket's server side, with what a peer can do to it while it closes worked around.

trio-websocket 0.12 on wsproto >= 1.2 lets a peer end the whole server, or a connection
without saying why, through its reader task (which runs in the caller's nursery):

- A ping that arrives after our close frame is answered with a pong, which wsproto
  refuses in its closing state: ``LocalProtocolError`` escapes the reader task, so the
  nursery that runs it and everything above it fails (python-trio/trio-websocket#184; the
  fix proposed there, #198, is in no release). A message over the size limit in that
  state fails the same way: its 1009 close frame is refused.
- A frame wsproto cannot parse (invalid UTF-8 in a text message, a bad opcode, a control
  frame too long, ...) ends the connection without a close frame: wsproto reports it as a
  ``CloseConnection`` event but stays OPEN, and trio-websocket sends a close frame back
  only for a close the peer started. RFC 6455 section 7.1.7 asks for one carrying the code
  (1007 for invalid UTF-8, 1002 for a protocol error).

``wrap_server_stream`` is trio-websocket's own, building the connection from
``_ServerWebSocket``, which sends nothing once our close frame is out and fails a
connection it cannot parse with a close frame. The overridden methods are private to
trio-websocket: a test per flaw (``tests/bridge/test_websocket.py``) pins them to the
version installed.
"""

from __future__ import annotations

import trio
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection, WebSocketRequest
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage


class _ServerWebSocket(WebSocketConnection):
    async def _handle_ping_event(self, event: Ping) -> None:
        # After our close frame nothing more may be sent (RFC 6455 section 5.5.1), and
        # wsproto raises for a pong then.
        if self._wsproto.state is ConnectionState.OPEN:
            await super()._handle_ping_event(event)

    async def _handle_message_event(self, event: BytesMessage | TextMessage) -> None:
        # A message after our close frame is never read; passing it on would also let an
        # oversize one ask for a second close frame, which wsproto raises for.
        if self._wsproto.state is ConnectionState.OPEN:
            await super()._handle_message_event(event)

    async def _handle_close_connection_event(self, event: CloseConnection) -> None:
        if self._wsproto.state is ConnectionState.OPEN:
            # A close frame from the peer would have moved wsproto on to REMOTE_CLOSING:
            # this is wsproto failing to parse the peer's data, so we fail the connection
            # with the code it found. The reason is set first, as trio-websocket does
            # before its own close frames: while the frame goes out, a sender must get
            # ConnectionClosed, not wsproto's error for a message after a close frame. A
            # peer already gone has nothing to be told.
            self._close_reason = CloseReason(event.code, event.reason)
            try:
                await self._send(CloseConnection(code=event.code, reason=event.reason))
            except ConnectionClosed:
                pass
        await super()._handle_close_connection_event(event)


async def wrap_server_stream(
    nursery: trio.Nursery, stream: trio.abc.Stream, *, max_message_size: int
) -> WebSocketRequest | None:
    """Like ``trio_websocket.wrap_server_stream``: the peer's opening handshake, once it
    has arrived, on a connection whose reader runs in ``nursery``; None if the reader
    stopped first.

    trio-websocket's own waits for a handshake after its reader has stopped, too: a request
    wsproto refuses (a head over h11's 16 KiB, ...) is answered 400 and its stream closed,
    and the wait then lasted until the caller's timeout, holding the connection and the
    head it buffered (30 KB RSS a request; 900 such requests in 1.6 s left ``serve``
    28 MB larger for good)."""
    connection = _ServerWebSocket(stream, WSConnection(ConnectionType.SERVER), max_message_size=max_message_size)
    stopped = trio.Event()

    async def read() -> None:
        try:
            await connection._reader_task()
        finally:
            stopped.set()

    nursery.start_soon(read)
    request: WebSocketRequest | None = None
    async with trio.open_nursery() as race:

        async def handshake() -> None:
            nonlocal request
            request = await connection._get_request()
            race.cancel_scope.cancel()

        async def reader_stopped() -> None:
            await stopped.wait()
            race.cancel_scope.cancel()

        race.start_soon(handshake)
        race.start_soon(reader_stopped)
    return request
