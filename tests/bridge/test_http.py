"""What a peer can do to the HTTP side of the bridge's port, byte by byte.

A raw TCP client sends request heads as they come: split across segments, trickled one
byte at a time, too large, malformed, with a Host header wsproto cannot read, with the
first websocket frames right behind the upgrade request. Each test then shows that the
server still serves another client, and (as in test_websocket.py) that nothing was logged
above info: an error line would mean a bug path ran.

Rules (as in trio-websocket's own tests): 127.0.0.1 only, port 0, an absolute
``trio.fail_after`` around every test's I/O, ``autojump_clock`` for the timers (a trickle
sent every virtual second), no sleeping to wait for something.
"""

import base64
import functools
import json
import os
from contextlib import asynccontextmanager

import pytest
import structlog
import trio

from loopdock.bridge import _server as bridge_server
from loopdock.bridge import serve_bridge
from loopdock.bridge._http import MAX_HEAD

TOKEN = "test-token-for-the-bridge"
TIMEOUT = 10


@pytest.fixture(autouse=True)
def no_error_logged():
    with structlog.testing.capture_logs() as logs:
        yield logs
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []


@asynccontextmanager
async def running_bridge():
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_bridge, token=TOKEN))
        yield port
        nursery.cancel_scope.cancel()


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while chunk := await stream.receive_some():
            data += chunk
    except trio.BrokenResourceError:  # closed with our bytes unread: a reset
        pass
    return data


async def exchange(port: int, *parts: bytes) -> bytes:
    """Send ``parts`` (a virtual second apart: each one reaches the server alone) and
    return the whole answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for i, part in enumerate(parts):
            if i:
                await trio.sleep(1)
            await stream.send_all(part)
        return await read_all(stream)


def status_line(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode()


def upgrade_head(path: str = "/dsh", *, key: bool = True, host: bytes = b"127.0.0.1") -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
    if key:
        lines.append("Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode())
    head = ("\r\n".join(lines) + "\r\n").encode()
    return head + b"Host: " + host + b"\r\n\r\n"


def masked_text(text: str) -> bytes:
    payload = text.encode()
    assert len(payload) < 126
    mask = os.urandom(4)
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def server_text(data: bytes) -> tuple[str, bytes]:
    """One unmasked text frame from the server (payload < 126 bytes) and what follows it."""
    assert data[0] == 0x81 and data[1] < 126, data[:2]
    return data[2 : 2 + data[1]].decode(), data[2 + data[1] :]


async def still_serves(port: int) -> None:
    """A websocket client is welcomed (the hello goes with the upgrade request)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        hello = json.dumps({"v": 1, "type": "hello", "data": {"token": TOKEN, "role": "dsh-host", "protocol": 1}})
        await stream.send_all(upgrade_head() + masked_text(hello))
        data = b""
        while b"welcome" not in data:
            data += await stream.receive_some()
        head, _, rest = data.partition(b"\r\n\r\n")
        assert status_line(head).startswith("HTTP/1.1 101 ")  # (wsproto 1.2 sends no reason phrase)
        assert json.loads(server_text(rest)[0])["type"] == "welcome"


# -- heads as they come ---------------------------------------------------------------------


async def test_a_head_split_across_segments_is_read_as_it_comes(autojump_clock):
    # (No page of PAGES here: the server reads those in a worker thread, which the
    # autojump clock cannot wait for.)
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            response = await exchange(port, b"GE", b"T /nowhere?x=1 HT", b"TP/1.1\r\nHost: x\r", b"\n\r\n")
            assert status_line(response) == "HTTP/1.1 404 Not Found"
            assert response.endswith(b"no page '/nowhere'")
            hello = json.dumps({"v": 1, "type": "hello", "data": {"token": TOKEN, "role": "dsh-host", "protocol": 1}})
            head, frame = upgrade_head(), masked_text(hello)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                for part in (head[:10], head[10:-3], head[-3:] + frame[:3], frame[3:]):
                    await stream.send_all(part)
                    await trio.sleep(1)
                data = b""
                while b"welcome" not in data:
                    data += await stream.receive_some()
                assert status_line(data).startswith("HTTP/1.1 101 ")


async def test_a_head_trickled_a_byte_a_second_is_dropped_at_the_handshake_timeout(autojump_clock):
    # Slowloris: each byte comes before any idle timeout would end the connection; the
    # whole request has HANDSHAKE_TIMEOUT, counted from the connection's start.
    with trio.fail_after(6 * bridge_server.HANDSHAKE_TIMEOUT):
        async with running_bridge() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream, trio.open_nursery() as nursery:
                started = trio.current_time()

                async def trickle():
                    await stream.send_all(b"GET /goalbar HTTP/1.1\r\nX-Slow: ")
                    while True:
                        await trio.sleep(1)
                        await stream.send_all(b"z")

                nursery.start_soon(trickle)
                await still_serves(port)  # meanwhile, others are served
                assert await read_all(stream) == b""  # closed, unanswered
                waited = trio.current_time() - started
                nursery.cancel_scope.cancel()
            assert bridge_server.HANDSHAKE_TIMEOUT <= waited < bridge_server.HANDSHAKE_TIMEOUT + 2
            await still_serves(port)


async def test_frames_sent_with_the_upgrade_request_are_read_at_once():
    # still_serves sends its hello right behind the request, and waits for the welcome
    # without sending anything more.
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            await still_serves(port)


# -- heads the server refuses -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        # (the end of the head comes a second later: h11 bounds what it holds of a head
        # that is not whole yet)
        ([b"GET /goalbar HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEAD, b"\r\n\r\n"], 431),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET /goalbar HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"POST /goalbar HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 405),
        (upgrade_head(key=False), 400),
        (upgrade_head().replace(b"Version: 13", b"Version: 8"), 426),
        (upgrade_head(host=b"\xff"), 400),  # wsproto reads Host as IDNA: this raised in it
        (upgrade_head("/console"), 404),  # a page, not a websocket endpoint
    ],
)
async def test_a_request_the_server_refuses_is_answered_with_its_status(autojump_clock, request_bytes, status):
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            response = await exchange(port, *(request_bytes if isinstance(request_bytes, list) else [request_bytes]))
            assert status_line(response).startswith(f"HTTP/1.1 {status} ")
            assert b"Connection: close" in response
            await still_serves(port)


async def test_a_head_request_is_answered_without_a_body():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            response = await exchange(port, b"HEAD /console HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _, body = response.partition(b"\r\n\r\n")
            assert status_line(head) == "HTTP/1.1 200 OK" and body == b""
            assert int(dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])[b"Content-Length"]) > 0


async def test_a_peer_that_closes_mid_head_costs_nothing():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /goalbar HTTP/1.1\r\nHo")
            await stream.send_eof()
            assert status_line(await read_all(stream)) == "HTTP/1.1 400 Bad Request"
            await stream.aclose()
            await still_serves(port)
