"""The HTTP/1.1 side of the bridge's port: h11 (sans-IO) under a small trio adapter.

Every connection to the port starts here. ``HttpConnection.read_request`` feeds h11 the
bytes as they arrive until one whole request is in: a head split across segments is only
more bytes for the parser, read as they come (never peeked at, never polled for). A head
still not whole past ``MAX_HEAD`` bytes is answered 431 (so h11 holds at most that, and
one read, of it), anything else h11 refuses 400. The server then answers the request
(``respond``: a page, a refusal; the connection closes after it) or hands a websocket
upgrade on to ``bridge._websocket``, with the bytes that came after it
(``trailing_data``). How long a peer may take is the caller's to bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import final

import h11
import trio

#: Bytes of a request head (request line and headers) that is not whole yet past which
#: it is refused (431).
MAX_HEAD = 16384
_RECEIVE_BYTES = 2**16


def is_websocket_upgrade(request: h11.Request) -> bool:
    """Whether ``request`` asks for a websocket (``Upgrade: websocket``)."""
    return any(name == b"upgrade" and b"websocket" in value.lower() for name, value in request.headers)


@final
class HttpConnection:
    """The HTTP side of one connection, for its first request (only the server creates it)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._head = False  # a HEAD request: its answer has no body

    async def read_request(self) -> h11.Request | None:
        """The peer's request, once it is all in (a body it declares is read and dropped).

        None when there is no request to answer: the peer closed or broke the connection
        first, or sent something h11 refuses, which is answered here (400, or 431 for a
        head past ``MAX_HEAD``) and the connection closed. Cancelled, it loses nothing.
        """
        request: h11.Request | None = None
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                await self.respond(exc.error_status_hint, f"bad request: {exc}".encode())
                return None
            if event is h11.NEED_DATA:
                try:
                    data = await self._stream.receive_some(_RECEIVE_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                self._h11.receive_data(bytes(data))  # b"": the peer closed its side
            elif isinstance(event, h11.Request):
                request = event
                self._head = event.method == b"HEAD"
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None
            # Otherwise h11.Data: a body nobody here reads.

    @property
    def trailing_data(self) -> bytes:
        """What the peer sent after its request (an eager websocket client's first frames)."""
        return self._h11.trailing_data[0]

    async def respond(
        self,
        status: int,
        body: bytes,
        *,
        content_type: str = "text/plain; charset=utf-8",
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Answer with ``status`` and ``body``, then close the connection. A peer that
        broke the connection meanwhile gets nothing."""
        response = h11.Response(
            status_code=status,
            reason=HTTPStatus(status).phrase.encode(),
            headers=[
                *headers,
                (b"Content-Type", content_type.encode()),
                (b"Content-Length", str(len(body)).encode()),
                (b"Cache-Control", b"no-store"),
                (b"X-Content-Type-Options", b"nosniff"),
                (b"Connection", b"close"),
            ],
        )
        data = self._h11.send(response) or b""
        if body and not self._head:
            data += self._h11.send(h11.Data(data=body)) or b""
        data += self._h11.send(h11.EndOfMessage()) or b""
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(self._stream)
