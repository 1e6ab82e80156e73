"""What a peer can do to the websocket layer under the bridge, frame by frame.

A raw client (wsproto over a trio TCP stream) sends exactly the frames each test needs,
including ones no websocket library sends on purpose: a ping after the server's close
frame, a message too large for it then, text that is not UTF-8, a request path urlsplit
cannot read. Each test then shows that the server still accepts and serves another
connection.

Every test also checks the log: what a peer causes is logged at info at most; an error
line would mean a bug path ran (the server's last line of defence, which keeps it alive
but costs the connection).

Rules (as in trio-websocket's own tests): 127.0.0.1 only, port 0, an absolute
``trio.fail_after`` around every test's I/O, no sleeping to wait for something.
"""

import functools
import json
import os
import tracemalloc
from contextlib import asynccontextmanager

import pytest
import structlog
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Event, Ping, Pong, RejectConnection, Request, TextMessage
from wsproto.frame_protocol import Opcode

from loopdock.bridge import CLOSE_INVALID_DATA, CLOSE_POLICY_VIOLATION, NullHandler, serve_bridge

TOKEN = "test-token-for-the-bridge"
TIMEOUT = 10


@pytest.fixture(autouse=True)
def no_error_logged():
    with structlog.testing.capture_logs() as logs:
        yield logs
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []


class RawClient:
    """A websocket client that sends what it is told, when it is told, and reads events."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self._events: list[Event] = []

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def send_frame(self, opcode: Opcode, payload: bytes, *, fin: bool = True) -> None:
        """One masked frame, written by hand: wsproto will not write one in a closing state,
        nor a text frame that is not UTF-8."""
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await self.stream.send_all(bytes([(0x80 if fin else 0) | opcode.value, 0x80 | len(payload)]) + mask + masked)

    async def next_event(self) -> Event | None:
        """The next event from the server; None once it closed the TCP connection."""
        while not self._events:
            data = await self.stream.receive_some()
            if not data:
                return None
            self.ws.receive_data(data)
            self._events.extend(self.ws.events())
        return self._events.pop(0)

    async def until(self, kind: type) -> Event | None:
        while True:
            event = await self.next_event()
            if event is None or isinstance(event, kind):
                return event


@asynccontextmanager
async def raw_client(port, path="/dsh"):
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        client = RawClient(stream)
        await client.send(Request(host="127.0.0.1", target=path))
        yield client


def hello_text(role="dsh-host", token=TOKEN):
    return json.dumps({"v": 1, "type": "hello", "data": {"token": token, "role": role, "protocol": 1}})


@asynccontextmanager
async def running_bridge():
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_bridge, token=TOKEN))
        yield port
        nursery.cancel_scope.cancel()


async def still_serves(port):
    """A new client is welcomed and its ping answered: the server is alive and well."""
    async with raw_client(port) as client:
        assert isinstance(await client.until(AcceptConnection), AcceptConnection)
        await client.send(TextMessage(hello_text()))
        welcome = await client.until(TextMessage)
        assert json.loads(welcome.data)["type"] == "welcome"
        await client.send(TextMessage(json.dumps({"v": 1, "type": "ping", "id": "alive", "data": {}})))
        pong = await client.until(TextMessage)
        assert json.loads(pong.data) == {"v": 1, "type": "pong", "re": "alive", "data": {}}


async def refused_then(port, frames):
    """Open a connection, get it refused (a bad hello), and once the server's close frame
    is here send ``frames`` (opcode, payload) instead of the close reply."""
    async with raw_client(port) as client:
        assert isinstance(await client.until(AcceptConnection), AcceptConnection)
        await client.send(TextMessage(hello_text(token="wrong")))
        close = await client.until(CloseConnection)
        assert close.code == CLOSE_POLICY_VIOLATION  # the server is closing: ping it now
        for opcode, payload in frames:
            await client.send_frame(opcode, payload)
        # The close reply comes after them: once the server has closed the TCP connection,
        # it has read them all.
        await client.send(close.response())
        assert await client.next_event() is None


# -- the two frames that ended the server -------------------------------------------------


async def test_a_ping_after_the_servers_close_frame_costs_nothing_but_that_connection():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            await refused_then(port, [(Opcode.PING, b"still there?")])
            await still_serves(port)


async def test_a_ping_before_the_hello_times_out_costs_nothing(monkeypatch):
    from loopdock.bridge import _server as bridge_server

    monkeypatch.setattr(bridge_server, "HELLO_TIMEOUT", 0.2)
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                close = await client.until(CloseConnection)  # no hello in time
                assert close.code == CLOSE_POLICY_VIOLATION
                await client.send_frame(Opcode.PING, b"")
                await client.send(close.response())
                assert await client.next_event() is None
            await still_serves(port)


async def test_an_oversize_message_after_the_servers_close_frame_costs_nothing():
    # The message is sent in fragments: each is small, together they pass the size limit.
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_bridge, token=TOKEN, max_message_size=200))
            parts = [(Opcode.TEXT, b"x" * 100)] + [(Opcode.CONTINUATION, b"x" * 100)] * 3
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                await client.send(TextMessage(hello_text(token="wrong")))
                close = await client.until(CloseConnection)
                for i, (opcode, payload) in enumerate(parts):
                    await client.send_frame(opcode, payload, fin=i == len(parts) - 1)
                await client.send_frame(Opcode.PING, b"")
                await client.send(close.response())
                assert await client.next_event() is None
            await still_serves(port)
            nursery.cancel_scope.cancel()


async def test_many_pings_during_the_close_of_many_connections():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(refused_then, port, [(Opcode.PING, b"p")] * 5)
            await still_serves(port)


# -- what is read ahead ---------------------------------------------------------------------


async def test_a_message_over_the_limit_is_refused_before_it_is_whole():
    # Three fragments of 100 bytes against a limit of 250, and no last fragment: the server
    # closes with 1009 once the third is in, holding no more than the limit meanwhile.
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_bridge, token=TOKEN, max_message_size=250))
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                await client.send(TextMessage(hello_text()))
                assert json.loads((await client.until(TextMessage)).data)["type"] == "welcome"
                await client.send_frame(Opcode.TEXT, b"x" * 100, fin=False)
                await client.send_frame(Opcode.CONTINUATION, b"x" * 100, fin=False)
                await client.send_frame(Opcode.CONTINUATION, b"x" * 100, fin=False)
                close = await client.until(CloseConnection)
                assert close is not None and close.code == 1009
                await client.send(close.response())
                assert await client.next_event() is None
            await still_serves(port)
            nursery.cancel_scope.cancel()


class BlockingHandler(NullHandler):
    """Holds every ``events`` frame until released."""

    def __init__(self):
        self.holding = trio.Event()
        self.release = trio.Event()
        self.handled = False

    async def on_events(self, conn, items):
        self.holding.set()
        await self.release.wait()
        self.handled = True


async def test_a_ping_is_answered_while_the_message_before_it_is_being_handled():
    handler = BlockingHandler()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                await client.send(TextMessage(hello_text()))
                assert json.loads((await client.until(TextMessage)).data)["type"] == "welcome"
                await client.send(TextMessage(json.dumps({"v": 1, "type": "events", "data": {"items": []}})))
                await handler.holding.wait()
                await client.send(Ping(b"are you there"))
                assert (await client.until(Pong)).payload == b"are you there"
                assert not handler.handled  # the pong did not wait for the events
                handler.release.set()
            await still_serves(port)
            nursery.cancel_scope.cancel()


# -- frames the websocket protocol refuses ----------------------------------------------------


@pytest.mark.parametrize("greet", [False, True])
async def test_text_that_is_not_utf8_is_closed_with_1007(greet):
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                if greet:
                    await client.send(TextMessage(hello_text()))
                    assert json.loads((await client.until(TextMessage)).data)["type"] == "welcome"
                await client.send_frame(Opcode.TEXT, b'{"v": 1, "\xff\xfe"}')
                close = await client.until(CloseConnection)
                assert close is not None and close.code == CLOSE_INVALID_DATA
            await still_serves(port)


async def test_a_reply_racing_the_1007_close_frame_is_not_sent_after_it():
    # The bad hello and the bad text arrive together: the server answers the first while
    # its close frame for the second is going out. Its answer must stop there, not after.
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            for _ in range(10):
                async with raw_client(port) as client:
                    await client.until(AcceptConnection)
                    await client.send(TextMessage("not a hello"))
                    await client.send_frame(Opcode.TEXT, b"\xff")
                    close = await client.until(CloseConnection)
                    assert close is not None and close.code == CLOSE_INVALID_DATA
            await still_serves(port)


async def test_a_reserved_opcode_is_closed_with_1002():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with raw_client(port) as client:
                await client.until(AcceptConnection)
                await client.stream.send_all(bytes([0x83, 0x80]) + os.urandom(4))  # opcode 3: reserved
                close = await client.until(CloseConnection)
                assert close is not None and close.code == 1002
            await still_serves(port)


@pytest.mark.parametrize("target", ["//[", "/dsh?x=[", "http://[::1/dsh"])
async def test_a_request_target_urlsplit_cannot_read_is_refused_not_fatal(target):
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with raw_client(port, path=target) as client:
                event = await client.until((AcceptConnection, RejectConnection))
                assert isinstance(event, (AcceptConnection, RejectConnection))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                response = b""
                while chunk := await stream.receive_some():
                    response += chunk
                assert response.startswith(b"HTTP/1.1 404 ")
            await still_serves(port)


async def test_a_page_query_is_not_kept_once_answered():
    # The query is the page's to read (session=...): the server reads no more than the path,
    # so no URL parser's cache keeps 128 long targets after they were answered.
    async def get(target):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            response = b""
            while chunk := await stream.receive_some():
                response += chunk
        return response.split(b"\r\n", 1)[0]

    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            assert await get("/console?session=warm") == b"HTTP/1.1 200 OK"
            await trio.testing.wait_all_tasks_blocked()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for n in range(20):
                    assert await get(f"/console?session={n}" + "q" * 10_000) == b"HTTP/1.1 200 OK"
                    assert await get(f"/console/{n}" + "q" * 10_000) == b"HTTP/1.1 404 Not Found"
                await trio.testing.wait_all_tasks_blocked()
                kept = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert kept < 50_000, f"{kept} bytes kept after 40 requests of 10 KB"
            await still_serves(port)


async def test_a_peer_that_resets_the_connection_at_once_costs_nothing():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            for path in ("/dsh", "/nowhere"):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                client = RawClient(stream)
                await client.send(Request(host="127.0.0.1", target=path))
                # SO_LINGER 0: close sends a reset instead of a FIN.
                stream.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                await stream.aclose()
            await still_serves(port)


def connection_tasks():
    """The server's per-connection tasks still running (those serve_tcp starts)."""

    def tasks(task):
        yield task
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                yield from tasks(child)

    return [t for t in tasks(trio.lowlevel.current_root_task()) if t.name == "trio._highlevel_serve_listeners._run_handler"]


@pytest.mark.parametrize("upgrade", [False, True])
async def test_a_request_head_the_websocket_layer_refuses_is_let_go_of_at_once(upgrade):
    # A head over 16 KiB (here a 100 KB page query) is answered 431 and the stream closed;
    # the connection must not then wait for its hello timeout holding the head it had
    # buffered (it once did: a burst of them grew the server by 30 KB each, for good).
    headers = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            for n in range(3):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    head = f"GET /goalbar?session={n}{'q' * 100_000} HTTP/1.1\r\nHost: x\r\n{headers if upgrade else ''}\r\n"
                    try:
                        await stream.send_all(head.encode())
                    except trio.BrokenResourceError:
                        pass  # refused before the client had sent it all
                    response = b""
                    try:
                        while chunk := await stream.receive_some():
                            response += chunk
                    except trio.BrokenResourceError:
                        pass  # closed with the rest unread: a reset after the answer
                    assert response.startswith(b"HTTP/1.1 431 "), response[:100]
                await trio.testing.wait_all_tasks_blocked()
                assert connection_tasks() == []
            await still_serves(port)

