"""The bridge server: one port, h11 and wsproto under thin trio adapters around the sans-IO
protocol, one actor per connection.

    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_bridge, handler, token=token))

Every connection starts as HTTP/1.1 (``bridge._http``, h11): its request is read as its
bytes arrive, within ``HANDSHAKE_TIMEOUT`` however it trickles in. A websocket upgrade is
served by path: ``/dsh`` for a DSH host (role ``dsh-host``) and ``/goalbar`` for GoalBar
clients (role ``goalbar``); any other path is refused with HTTP 404. A plain GET is answered
with a page of ``PAGES`` (``/goalbar``: the GoalBar page, on the websocket's own origin) or
404 (another method: 405). The websocket (``bridge._websocket``, wsproto) then carries the bridge protocol
(``bridge._connection``). Each connection is an actor with its own nursery: a receiver
(decode, answer protocol errors, hand events and requests to the handler), a sender
draining a bounded outbox (event traffic batched), and one task per request from the peer.
Everything is cancelled with the server's nursery.

Nothing a peer sends ends the server or another connection: what a peer can cause ends
at most its own connection, with one info-level line (``bridge connection ended``, its
``kind`` and ``detail``, and the count of its protocol errors, the first of which is
logged as it happens). A bug, ours or a library's, is logged at error level with its
traceback and costs the one connection too.

Why wsproto and h11 under adapters of our own, not hypercorn's trio worker: every promise
of docs/reliability.md is made at the level of single frames and connections, and must be
ours to keep: the close code for each refusal (1008, 1002, 1007, 1009), nothing sent after
our close frame, a slow peer aborted without a close handshake while its queue is let go
of, the hello deadline, the outbox per connection. wsproto shows us every frame event
(pings, close frames, its parse failures) and leaves each decision to us through its
public API; hypercorn's ASGI interface hides them, offers no abort (a ``websocket.close``
queues behind the backlog a stalled peer never drains), and keeps its limits and timeouts
in its own server-wide configuration, so the promises would rest again on another
server's internals, which is what this replaces (a subclass of trio-websocket's private
methods). It also fits the code: hypercorn brings h2, hpack, hyperframe, priority and its
config and logging machinery for a port serving two pages and two websocket paths, while
wsproto and h11 are two small pure-Python sans-IO libraries (h11 came with httpx already),
the shape STYLE.md asks for: a sans-IO core and thin trio adapters, as hypercorn itself
is built on the same two.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, final
from urllib.parse import urlsplit

import h11
import trio

from loopdock.actors import LiveEvent
from loopdock.runtime import Event, LoopdockError, get_logger

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
from ._http import HttpConnection, is_websocket_upgrade
from ._messages import (
    GOALBAR_REQUESTS,
    AnswerApproval,
    ApprovalDone,
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
from ._websocket import CLOSE_GOING_AWAY, ConnectionClosed, HandshakeRefused, WebSocket, accept_websocket

log = get_logger(__name__)

DEFAULT_HOST = "127.0.0.1"
#: Largest incoming message, in characters (bytes if binary); the connection is closed
#: with 1009 as soon as one passes it. Items published to a peer must fit in a frame of
#: this size too.
MAX_MESSAGE_SIZE = 2**20
#: Seconds a new connection has to send its whole HTTP request (a page's GET or a
#: websocket upgrade), however it trickles in; then it is closed unanswered.
HANDSHAKE_TIMEOUT = 10.0
#: Seconds a websocket connection has to send its hello.
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
# Longest request target before its query that is read (an absolute URI's scheme and host
# included); every endpoint's is far shorter.
_MAX_TARGET_PATH = 1024


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


def _remote(stream: trio.SocketStream) -> str:
    """The peer's address, as far as it is still known."""
    try:
        address = stream.socket.getpeername()
    except OSError:  # the peer is already gone (getpeername fails once it reset the connection)
        return "gone"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _path(target: str) -> str:
    """The path of an HTTP request target; "" for one ``urlsplit`` cannot read (``//[``).

    Only what comes before the query is read, and a long one not at all (no endpoint's is):
    ``urlsplit`` keeps the last 128 strings it was given (an LRU cache), so a page URL with
    a 10 KB ``session=`` query stayed in memory after it was answered."""
    before_query = target.partition("?")[0].partition("#")[0]
    if len(before_query) > _MAX_TARGET_PATH:
        return ""
    try:
        return urlsplit(before_query).path
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

    async def request(self, message: BridgeMessage, reply_timeout: float = REQUEST_TIMEOUT) -> BridgeMessage:
        """Send a request (``Followup``, ``Wake``, ``Cancel``, ``Ping``) and return its reply.

        Raises RequestTimeoutError after ``reply_timeout`` seconds without a reply (the
        protocol's deadline: the request is forgotten, and the error's code goes on the
        wire to whoever asked), RemoteError
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
            with trio.move_on_after(reply_timeout):
                await waiter.done.wait()
            if not waiter.done.is_set():
                raise RequestTimeoutError(f"no reply to {frame.type} {frame.id} within {reply_timeout} s")
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

    async def _run(self, ws: WebSocket) -> None:
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
                await ws.abort()
        except Exception as exc:  # a bug here must cost one connection, not the server
            self._log.exception("bridge connection failed")
            ending = Disconnect("internal-error", repr(exc))
            await ws.abort()
        finally:
            self._finish(ending or Disconnect("server-closing", "the bridge server is shutting down"))

    async def _close(self, ws: WebSocket, close: Close) -> None:
        """Let the sender flush what is queued (the error frame that says why), then close."""
        self._finishing = True
        self._ready.set()
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            await self._flushed.wait()
            await ws.close(close.code, close.reason)
        if scope.cancelled_caught:
            await ws.abort()

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

    async def _send_loop(self, ws: WebSocket) -> None:
        try:
            while True:
                text = self._outbox.take()
                if text is None:
                    if self._finishing:
                        return
                    self._ready = trio.Event()
                    await self._ready.wait()
                    continue
                await ws.send(text)
        except ConnectionClosed:
            pass  # the receiver sees the close too, and ends the connection
        finally:
            self._flushed.set()

    async def _receive_loop(self, ws: WebSocket) -> tuple[Disconnect, Close | None]:
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

    async def _receive_one(self, ws: WebSocket) -> tuple[Disconnect, Close | None] | None:
        try:
            data = await ws.receive()
        except ConnectionClosed as exc:
            if exc.code == CLOSE_TOO_LARGE:
                return Disconnect("too-large", exc.reason or "a message over the size limit"), None
            detail = f"close code {exc.code}: {exc.reason}"
            if exc.code in (CLOSE_PROTOCOL_ERROR, CLOSE_INVALID_DATA):
                return Disconnect("bad-frame", detail), None
            return Disconnect("peer-closed", detail, exc.code), None
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
            elif isinstance(message, AnswerApproval):
                reply = await self._handler.on_approval(self, message)
                expected = ApprovalDone
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

    async def serve_websocket(stream: trio.SocketStream, http: HttpConnection, request: h11.Request, path: str) -> None:
        role = ENDPOINTS.get(path)
        if role is None:
            await _answer(http, 404, f"no bridge endpoint {path[:100]!r}: use /dsh or /goalbar".encode())
            return
        remote = _remote(stream)
        try:
            async with accept_websocket(
                stream, request, http.trailing_data, max_message_size=max_message_size
            ) as ws:
                # Only now: its outbox takes a share of the budget until the connection ends.
                conn = BridgeConnection(
                    role,
                    token,
                    served,
                    remote=remote,
                    outbox_size=outbox_size,
                    outbox_bytes=outbox_bytes,
                    budget=budget,
                    max_message_size=max_message_size,
                )
                try:
                    await conn._run(ws)
                finally:
                    # What is left: the end of the close handshake after our close frame
                    # for a frame the peer sent (1009, 1007, 1002), or nothing (the TCP
                    # connection is closed already; or the server is closing, and this is
                    # cancelled: it is closed at once).
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await ws.close(CLOSE_GOING_AWAY, "the server is shutting down")
        except HandshakeRefused as exc:
            await _answer(http, exc.status, f"not a websocket handshake: {exc}".encode(), headers=exc.headers)
        except ConnectionClosed:
            pass  # the peer left before its handshake was answered: nobody to serve

    async def serve_stream(stream: trio.SocketStream) -> None:
        http = HttpConnection(stream)
        request = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            request = await http.read_request()
        if request is None:
            return  # too slow, gone, or answered already (HTTP that h11 refuses)
        path = _path(request.target.decode("latin-1"))
        if is_websocket_upgrade(request):
            await serve_websocket(stream, http, request, path)
        else:
            await _answer_page(http, request, path)

    async def connection(stream: trio.SocketStream) -> None:
        # serve_tcp runs this in the server's own nursery: what escapes here would end the
        # server and every connection. What a peer can cause is handled on the way (and
        # logged at info at most); anything reaching this point is a bug, ours or a
        # library's, and costs this connection only.
        try:
            await serve_stream(stream)
        except* Exception:
            log.exception("bridge connection failed")
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, connection, port, host=host))
        bound = listeners[0].socket.getsockname()[1]
        log.info("bridge serving", host=host, port=bound)
        task_status.started(bound)
        await trio.sleep_forever()


#: Pages served over plain HTTP on the bridge's own origin: path -> file in this package.
PAGES: Mapping[str, str] = MappingProxyType({"/goalbar": "goalbar/index.html", "/console": "console/index.html"})


async def _answer_page(http: HttpConnection, request: h11.Request, path: str) -> None:
    """Answer a plain HTTP request: a page of :data:`PAGES` for a GET, else 404 or 405."""
    if request.method not in (b"GET", b"HEAD"):
        await _answer(http, 405, b"only GET is served here", headers=[(b"Allow", b"GET, HEAD")])
        return
    page = PAGES.get(path)
    if page is None:
        await _answer(http, 404, f"no page {path[:100]!r}".encode())
        return
    body = await trio.to_thread.run_sync((Path(__file__).parent / page).read_bytes)
    await _answer(http, 200, body, content_type="text/html; charset=utf-8")


async def _answer(
    http: HttpConnection,
    status: int,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer over HTTP and close; a peer that does not read it gets ``CLOSE_TIMEOUT``."""
    with trio.move_on_after(CLOSE_TIMEOUT):
        await http.respond(status, body, content_type=content_type, headers=headers or [])
