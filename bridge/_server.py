"""The bridge server: trio-websocket around the sans-IO protocol, one actor per connection.

    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_bridge, handler, token=token))

Endpoints by path: ``/dsh`` for a DSH host (role ``dsh-host``) and ``/goalbar`` for GoalBar
clients (role ``goalbar``); any other path is refused with HTTP 404 during the handshake.
A plain HTTP GET (no websocket upgrade) on the same port is answered with a page of
``PAGES`` (``/goalbar``: the GoalBar page, on the websocket's own origin) or 404.
Each connection is an actor with its own nursery: a receiver (decode, answer protocol
errors, hand events and requests to the handler), a sender draining a bounded outbox
(event traffic batched), and one task per request from the peer. Everything is cancelled
with the server's nursery.

Nothing a peer sends ends the server or another connection: what a peer can cause ends
at most its own connection, with one info-level line (``bridge connection ended``, its
``kind`` and ``detail``, and the count of its protocol errors, the first of which is
logged as it happens). A bug, ours or a library's, is logged at error level with its
traceback and costs the one connection too.
"""

from __future__ import annotations

import functools
import secrets
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, final
from urllib.parse import urlsplit

import trio
from trio_websocket import ConnectionClosed, Endpoint, WebSocketConnection, WebSocketRequest

from loopdock.actors import LiveEvent
from loopdock.runtime._errors import LoopdockError
from loopdock.runtime._events import Event
from loopdock.runtime._logging import get_logger

from ._connection import (
    CLOSE_INVALID_DATA,
    CLOSE_POLICY_VIOLATION,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TOO_LARGE,
    Answered,
    Close,
    Connection,
    ConnectionState,
    Opened,
    Output,
    Received,
    SendFrame,
)
from ._errors import (
    BridgeClosedError,
    ErrorCode,
    ProtocolError,
    RemoteError,
    RequestTimeoutError,
)
from ._handler import BridgeHandler, Disconnect, DisconnectKind, NullHandler
from ._messages import (
    GOALBAR_REQUESTS,
    BridgeMessage,
    CommandDone,
    ErrorNotice,
    Events,
    Frame,
    Goalbar,
    GoalbarResult,
    GoalbarView,
    Hello,
    Live,
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
from ._outbox import OUTBOX_BUDGET, OUTBOX_BYTES, OUTBOX_SIZE, Outbox, OutboxBudget
from ._protocol import encode, encode_item
from ._websocket import wrap_server_stream

log = get_logger(__name__)

DEFAULT_HOST = "127.0.0.1"
#: Largest incoming frame, in characters; trio-websocket closes the connection with 1009
#: beyond it. Items published to a peer must fit in a frame of this size too.
MAX_MESSAGE_SIZE = 2**20
#: Seconds a new connection has to send its hello.
HELLO_TIMEOUT = 10.0
#: Seconds to flush the last frames and finish the close handshake before aborting.
CLOSE_TIMEOUT = 5.0
#: Default deadline of ``BridgeConnection.request``, in seconds.
REQUEST_TIMEOUT = 10.0
#: Requests from one peer handled at once; beyond that its frames wait (TCP backpressure).
MAX_CONCURRENT_REQUESTS = 64

#: Websocket path -> the role served there.
ENDPOINTS: Mapping[str, Role] = MappingProxyType({"/dsh": "dsh-host", "/goalbar": "goalbar"})

# Room for the envelope of a batch frame around one item.
_BATCH_OVERHEAD = 64
# How much of a peer's own text (an error it reports) goes into a log line.
_LOGGED_TEXT = 200


class _Waiter:
    """One pending request's reply slot."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.message: BridgeMessage | None = None
        self.error: LoopdockError | None = None

    def resolve(self, message: BridgeMessage) -> None:
        if not self.done.is_set():
            self.message = message
            self.done.set()

    def fail(self, error: LoopdockError) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


async def _abort(ws: WebSocketConnection) -> None:
    """Close the TCP connection without a close handshake.

    For a peer that does not read, a close frame would only queue behind the backlog it
    never drains. trio-websocket's ``aclose`` closes the stream when it is cancelled, so
    it is called already cancelled.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        await ws.aclose()


def _remote(ws: WebSocketConnection) -> str:
    """The peer's address, as far as it is still known."""
    try:
        endpoint = ws.remote
    except OSError:  # the peer is already gone (getpeername fails once it reset the connection)
        return "gone"
    return f"{endpoint.address}:{endpoint.port}" if isinstance(endpoint, Endpoint) else endpoint


def _path(target: str) -> str:
    """The path of an HTTP request target; "" for one ``urlsplit`` cannot read (``//[``)."""
    try:
        return urlsplit(target).path
    except ValueError:
        return ""


@final
class BridgeConnection:
    """One peer, as the handler sees it (only factories create it: ``serve_bridge``).

    ``publish_event``/``publish_live`` queue event traffic for a GoalBar client and never
    wait; ``request`` sends a command to a DSH host and waits for its reply.
    """

    def __init__(
        self,
        role: Role,
        token: str,
        handler: BridgeHandler,
        *,
        remote: str,
        outbox_size: int,
        outbox_bytes: int,
        budget: OutboxBudget,
        max_message_size: int,
    ) -> None:
        self.id = secrets.token_hex(6)
        self.role: Role = role
        self.remote = remote
        #: Why the connection ended; None while it lives.
        self.closed: Disconnect | None = None
        self._protocol = Connection(role, token, connection_id=self.id)
        self._handler = handler
        self._outbox = Outbox(max_items=outbox_size, max_bytes=outbox_bytes, budget=budget)
        self._outbox.on_evicted = self._evicted
        self._max_item = max_message_size - _BATCH_OVERHEAD
        self._ready = trio.Event()
        self._finishing = False
        self._flushed = trio.Event()
        self._waiters: dict[str, _Waiter] = {}
        self._scope = trio.CancelScope()
        self._dropped: Disconnect | None = None
        self._opened = False
        self._request_slots = trio.Semaphore(MAX_CONCURRENT_REQUESTS)
        self._nursery: trio.Nursery | None = None
        self._peer_errors = 0
        self._log = log.bind(connection_id=self.id, role=role, remote=remote)

    @property
    def hello(self) -> Hello | None:
        """The peer's hello (its capabilities), once the handshake is done."""
        return self._protocol.hello

    # -- for producers (never waits) ---------------------------------------------------

    def publish_event(self, session_id: str, event: Event) -> bool:
        """Queue one session event for the peer, to go out batched in an ``events`` frame.

        Returns False, without waiting, if the connection is closed or the peer was just
        dropped for being too slow (its outbox was full). Raises ProtocolError if the
        event is not JSON (BAD_DATA) or does not fit in a frame (TOO_LARGE), and TypeError
        on a DSH host's connection (events flow from the host, not to it).
        """
        return self._publish(SessionEvent(session_id, event))

    def publish_live(self, item: LiveEvent) -> bool:
        """Like ``publish_event``, for a live agent event (a ``live`` frame)."""
        return self._publish(item)

    def publish_goalbar(self, state: GoalbarView) -> bool:
        """Queue a ``goalbar`` frame (the bar changed) for a GoalBar client; False, without
        waiting, if the connection is closed or was dropped."""
        if self.role != "goalbar":
            raise TypeError("GoalBar states go to GoalBar clients only")
        if not self._accepting():
            return False
        return self._send(Frame(Goalbar(state)))

    def _publish(self, item: SessionEvent | LiveEvent) -> bool:
        if self.role != "goalbar":
            raise TypeError("the runtime streams events to GoalBar clients only")
        kind, text = encode_item(item)
        if len(text) > self._max_item:
            raise ProtocolError(
                ErrorCode.TOO_LARGE,
                f"a {kind} item of {len(text)} characters does not fit in a frame "
                f"({self._max_item + _BATCH_OVERHEAD} at most)",
            )
        if not self._accepting():
            return False
        if not self._outbox.put_item(kind, text):
            self._drop_slow_peer()
            return False
        self._ready.set()
        return True

    def _accepting(self) -> bool:
        return self._protocol.state is ConnectionState.OPEN and self._dropped is None and not self._finishing

    def _send(self, frame: Frame) -> bool:
        try:
            text = encode(frame)
        except ProtocolError:
            self._log.exception("a frame of ours cannot be encoded", type=frame.type)
            return False
        return self._queue(text)

    def _queue(self, text: str) -> bool:
        if self._dropped is not None or self._finishing:
            return False
        if not self._outbox.put_frame(text):
            self._drop_slow_peer()
            return False
        self._ready.set()
        return True

    def _drop_slow_peer(self) -> None:
        unsent = f"{len(self._outbox)} frames and items, {self._outbox.size} bytes unsent"
        if self._outbox.refused_by_budget:
            self._drop(f"the server's outgoing budget for all peers is used up, and its queue would hold the most ({unsent})")
        else:
            self._drop(f"its outgoing queue is full ({unsent})")

    def _evicted(self) -> None:
        self._drop("the server's outgoing budget for all peers is used up, and its queue held the most of it")

    def _drop(self, detail: str) -> None:
        if self._dropped is None:
            # Logged once, at info, with the connection's end: a slow peer is its own doing.
            self._dropped = Disconnect("slow-peer", detail)
            # It is aborted, not flushed: what it has queued is let go of at once.
            self._outbox.close()
            self._scope.cancel()

    # -- requests to the peer ----------------------------------------------------------

    async def request(self, message: BridgeMessage, timeout: float = REQUEST_TIMEOUT) -> BridgeMessage:
        """Send a request (``Followup``, ``Wake``, ``Cancel``, ``Ping``) and return its reply.

        Raises RequestTimeoutError after ``timeout`` seconds without a reply, RemoteError
        if the peer answered with an ``error`` frame, BridgeClosedError if the connection
        is or gets closed first, ProtocolError (BAD_DATA) if ``message`` is not JSON.
        Cancelling the caller forgets the request.
        """
        if self.closed is not None or not self._accepting():
            raise BridgeClosedError(f"bridge connection {self.id} is closed")
        frame = self._protocol.request(message)
        assert frame.id is not None
        waiter = _Waiter()
        self._waiters[frame.id] = waiter
        try:
            # Encoded here, so that a message that is not JSON fails its caller (BAD_DATA).
            if not self._queue(encode(frame)):
                raise BridgeClosedError(f"bridge connection {self.id} was dropped")
            with trio.move_on_after(timeout):
                await waiter.done.wait()
            if not waiter.done.is_set():
                raise RequestTimeoutError(f"no reply to {frame.type} {frame.id} within {timeout} s")
            if waiter.error is not None:
                raise waiter.error
            assert waiter.message is not None
            if isinstance(waiter.message, ErrorNotice):
                raise RemoteError(waiter.message.code, waiter.message.message)
            return waiter.message
        finally:
            del self._waiters[frame.id]
            self._protocol.abandon(frame.id)

    # -- the actor -----------------------------------------------------------------------

    async def _run(self, ws: WebSocketConnection) -> None:
        ending: Disconnect | None = None
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._send_loop, ws)
                    ending, close = await self._receive_loop(ws)
                    self._protocol.close()
                    if close is not None:
                        await self._close(ws, close)
                    nursery.cancel_scope.cancel()
            if self._dropped is not None:
                ending = self._dropped
                await _abort(ws)
        except Exception as exc:  # a bug here must cost one connection, not the server
            self._log.exception("bridge connection failed")
            ending = Disconnect("internal-error", repr(exc))
            await _abort(ws)
        finally:
            self._finish(ending or Disconnect("server-closing", "the bridge server is shutting down"))

    async def _close(self, ws: WebSocketConnection, close: Close) -> None:
        """Let the sender flush what is queued (the error frame that says why), then close."""
        self._finishing = True
        self._ready.set()
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            await self._flushed.wait()
            await ws.aclose(close.code, close.reason)
        if scope.cancelled_caught:
            await _abort(ws)

    def _finish(self, ending: Disconnect) -> None:
        self.closed = ending
        self._protocol.close()
        self._outbox.close()
        for waiter in self._waiters.values():
            waiter.fail(BridgeClosedError(f"bridge connection {self.id} closed: {ending.kind}"))
        self._log.info("bridge connection ended", kind=ending.kind, detail=ending.detail, peer_errors=self._peer_errors)
        if self._opened:
            self._call(self._handler.disconnected, self, ending)

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._log.exception("bridge handler failed", callback=getattr(fn, "__name__", repr(fn)))

    async def _send_loop(self, ws: WebSocketConnection) -> None:
        try:
            while True:
                text = self._outbox.take()
                if text is None:
                    if self._finishing:
                        return
                    self._ready = trio.Event()
                    await self._ready.wait()
                    continue
                await ws.send_message(text)
        except ConnectionClosed:
            pass  # the receiver sees the close too, and ends the connection
        finally:
            self._flushed.set()

    async def _receive_loop(self, ws: WebSocketConnection) -> tuple[Disconnect, Close | None]:
        with trio.move_on_after(HELLO_TIMEOUT):
            while self._protocol.state is ConnectionState.AWAITING_HELLO:
                ended = await self._receive_one(ws)
                if ended is not None:
                    return ended
        if self._protocol.state is ConnectionState.AWAITING_HELLO:
            ended = await self._apply(self._protocol.expire_hello())
            assert ended is not None
            return ended
        while True:
            ended = await self._receive_one(ws)
            if ended is not None:
                return ended

    async def _receive_one(self, ws: WebSocketConnection) -> tuple[Disconnect, Close | None] | None:
        try:
            data = await ws.get_message()
        except ConnectionClosed as exc:
            reason = exc.reason
            if reason is not None and reason.code == CLOSE_TOO_LARGE:
                return Disconnect("too-large", reason.reason or "a frame over the size limit"), None
            code = reason.code if reason is not None else None
            detail = f"close code {code}: {reason.reason if reason else ''}"
            if code in (CLOSE_PROTOCOL_ERROR, CLOSE_INVALID_DATA):
                return Disconnect("bad-frame", detail), None
            return Disconnect("peer-closed", detail, code), None
        return await self._apply(self._protocol.receive(data))

    def _peer_error(self, event: str, code: str, detail: str) -> None:
        """Count an error on the peer's side of the protocol. Only the first one is
        logged as it happens (the count goes out with the connection's end line): a peer
        sending nothing but bad frames must not be able to fill the log."""
        self._peer_errors += 1
        if self._peer_errors == 1:
            self._log.info(event, code=code[:_LOGGED_TEXT], detail=detail[:_LOGGED_TEXT])

    async def _apply(self, outputs: list[Output]) -> tuple[Disconnect, Close | None] | None:
        why = ""
        for out in outputs:
            if isinstance(out, SendFrame):
                if isinstance(out.frame.message, ErrorNotice):
                    why = out.frame.message.message
                    if self._opened and self._protocol.state is ConnectionState.OPEN:
                        self._peer_error("bridge peer sent a frame the runtime refuses", out.frame.message.code, why)
                self._send(out.frame)
            elif isinstance(out, Close):
                kind: DisconnectKind = "unauthorized" if out.code == CLOSE_POLICY_VIOLATION else "bad-version"
                return Disconnect(kind, why), out
            elif isinstance(out, Opened):
                self._opened = True
                self._log = self._log.bind(capabilities=list(out.hello.capabilities))
                self._log.info("bridge peer connected")
                self._call(self._handler.connected, self)
            elif isinstance(out, Received):
                await self._dispatch(out.frame)
            elif isinstance(out, Answered):
                waiter = self._waiters.get(out.request_id)
                if waiter is not None:
                    waiter.resolve(out.message)
        return None

    async def _dispatch(self, frame: Frame) -> None:
        message = frame.message
        if isinstance(message, Events):
            await self._notify(self._handler.on_events, message.items)
        elif isinstance(message, Live):
            await self._notify(self._handler.on_live, message.items)
        elif isinstance(message, ErrorNotice):
            self._peer_error("bridge peer reported an error", message.code, message.message)
        else:
            # Acquired here, not in the task: a peer flooding requests stops being read.
            await self._request_slots.acquire()
            assert self._nursery is not None
            self._nursery.start_soon(self._serve_request, frame)

    async def _notify(self, fn: Callable[..., Any], items: Any) -> None:
        try:
            await fn(self, items)
        except LoopdockError as exc:
            # The handler refused what the peer sent (an invalid or untracked session, ...).
            self._peer_error("bridge peer sent items the runtime refuses", str(exc.code), str(exc))
            self._send(Frame(ErrorNotice(str(exc.code), str(exc))))
        except Exception:
            self._log.exception("bridge handler failed", callback=fn.__name__)
            self._send(Frame(ErrorNotice("INTERNAL_ERROR", "the runtime failed to take these items; see its log")))

    async def _serve_request(self, frame: Frame) -> None:
        message = frame.message
        reply: BridgeMessage
        try:
            if isinstance(message, PreStep):
                reply = await self._handler.on_pre_step(self, message)
                expected: type = Verdict
            elif isinstance(message, GOALBAR_REQUESTS):
                reply = await self._handler.on_goalbar(self, message)
                expected = GoalbarResult
            elif isinstance(message, Mirrored):
                reply = await self._handler.on_mirrored(self, message)
                expected = MirroredSeqs
            elif isinstance(message, RunCommand):
                reply = await self._handler.on_command(self, message)
                expected = CommandDone
            else:
                assert isinstance(message, Select)
                reply = await self._handler.on_select(self, message)
                expected = Selection
            if not isinstance(reply, expected):
                raise TypeError(f"the handler answered {frame.type} with {reply!r}")
        except LoopdockError as exc:
            reply = ErrorNotice(str(exc.code), str(exc))
        except Exception:
            self._log.exception("bridge handler failed", request=frame.type)
            reply = ErrorNotice("INTERNAL_ERROR", f"the runtime failed to answer {frame.type}; see its log")
        finally:
            self._request_slots.release()
        self._send(self._protocol.reply(frame, reply))


async def serve_bridge(
    handler: BridgeHandler | None = None,
    *,
    token: str,
    host: str = DEFAULT_HOST,
    port: int = 0,
    max_message_size: int = MAX_MESSAGE_SIZE,
    outbox_size: int = OUTBOX_SIZE,
    outbox_bytes: int = OUTBOX_BYTES,
    outbox_budget: int = OUTBOX_BUDGET,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the bridge on ``host:port`` (port 0: any free port) until cancelled.

    With ``await nursery.start(...)`` it returns the bound port once connections are
    accepted. ``token`` is the shared secret a peer's hello must carry. ``handler``
    (default: a ``NullHandler``) is called for every connection. ``outbox_size`` and
    ``outbox_bytes`` are the frames and event items, and the bytes, queued for a peer
    before it is dropped as too slow; ``outbox_budget`` is the bytes queued for all peers
    together: past it, the peer whose queue holds the most is dropped (see ``Outbox``).
    Bind one address (the default loopback one): the port of several listeners is ambiguous.
    """
    if not token:
        raise ValueError("the bridge token must not be empty")
    served: BridgeHandler = handler if handler is not None else NullHandler()
    budget = OutboxBudget(outbox_budget)

    async def accept(request: WebSocketRequest) -> None:
        path = _path(request.path)
        role = ENDPOINTS.get(path)
        if role is None:
            await request.reject(404, body=f"no bridge endpoint {path[:100]!r}: use /dsh or /goalbar".encode())
            return
        ws = await request.accept()
        conn = BridgeConnection(
            role,
            token,
            served,
            remote=_remote(ws),
            outbox_size=outbox_size,
            outbox_bytes=outbox_bytes,
            budget=budget,
            max_message_size=max_message_size,
        )
        await conn._run(ws)

    async def serve_stream(stream: trio.SocketStream) -> None:
        # A browser's plain GET of a page is answered here; everything else (the
        # websocket handshakes) goes to trio-websocket untouched.
        if await _serve_page(stream):
            return
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(HELLO_TIMEOUT) as handshake:
                request = await wrap_server_stream(nursery, stream, max_message_size=max_message_size)
            if handshake.cancelled_caught:
                nursery.cancel_scope.cancel()
                await stream.aclose()
                return
            try:
                await accept(request)
            except ConnectionClosed:
                pass  # the peer left before its handshake was answered: nobody to serve
            finally:
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await request._connection.aclose()
            nursery.cancel_scope.cancel()

    async def connection(stream: trio.SocketStream) -> None:
        # serve_tcp runs this in the server's own nursery: what escapes here would end the
        # server and every connection. What a peer can cause is handled on the way (and
        # logged at info at most); anything reaching this point is a bug, ours or a
        # library's, and costs this connection only.
        try:
            await serve_stream(stream)
        except* Exception:
            log.exception("bridge connection failed")
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, connection, port, host=host))
        bound = listeners[0].socket.getsockname()[1]
        log.info("bridge serving", host=host, port=bound)
        task_status.started(bound)
        await trio.sleep_forever()


#: Pages served over plain HTTP on the bridge's own origin: path -> file in this package.
PAGES: Mapping[str, str] = MappingProxyType({"/goalbar": "goalbar/index.html", "/console": "console/index.html"})
_HEAD_LIMIT = 16384


async def _serve_page(stream: trio.SocketStream) -> bool:
    """If the request waiting on ``stream`` is a plain HTTP GET (no websocket upgrade),
    answer it (a page of :data:`PAGES`, or 404) and return True; leave the stream unread
    and return False otherwise. The request head is peeked, not consumed. A peer that
    breaks the connection meanwhile is closed here too (True)."""
    try:
        return await _answer_page(stream)
    except OSError:  # e.g. reset by the peer: nothing to answer
        await stream.aclose()
        return True


async def _answer_page(stream: trio.SocketStream) -> bool:
    head = b""
    with trio.move_on_after(HELLO_TIMEOUT):
        for _ in range(100):
            await trio.lowlevel.wait_readable(stream.socket)
            head = await stream.socket.recv(_HEAD_LIMIT, socket.MSG_PEEK)
            if not head or b"\r\n\r\n" in head or len(head) >= _HEAD_LIMIT:
                break
            await trio.sleep(0.01)  # a head split across segments: wait for the rest
    if not head.startswith(b"GET ") or b"\r\n\r\n" not in head:
        return False
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "websocket" in headers.get("upgrade", ""):
        return False
    await stream.socket.recv(len(head.split(b"\r\n\r\n", 1)[0]) + 4)  # consume the head
    parts = lines[0].split(" ")
    path = _path(parts[1]) if len(parts) == 3 else ""
    page = PAGES.get(path)
    if page is None:
        status, ctype, body = "404 Not Found", "text/plain; charset=utf-8", f"no page {path[:100]!r}".encode()
    else:
        status, ctype = "200 OK", "text/html; charset=utf-8"
        body = await trio.to_thread.run_sync((Path(__file__).parent / page).read_bytes)
    response = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with trio.move_on_after(CLOSE_TIMEOUT):
        try:
            await stream.send_all(response)
        except trio.BrokenResourceError:
            pass
    await stream.aclose()
    return True
