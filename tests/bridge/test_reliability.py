"""The bridge under hostile peers: a seeded wire fuzz against a real in-process server, and
stalled readers against the outgoing budget. Fast, bounded, loopback only.

The fuzz: ``WORKERS`` concurrent clients, each with its own ``random.Random`` seeded from
``SEED``, draw ``FRAMES`` frames in all, written by hand (so any frame at all: pings and
pongs at any time, also after their own close frame or the server's, fragments with pings
between them, text that is not UTF-8, reserved opcodes and bits, messages over the size
limit, binary frames, envelopes of every type with ids and session ids good and bad,
junk), over connections to every path that they end gracefully, abruptly or with a
reset. Frames are drawn before anything is sent, so a run sends the same frames whatever
the timing (the server reads a connection up to where it closes it). The server runs a
real ``HostHandler`` with small caps, so that they are reached. Afterwards: the server is
alive and serves a new client, nothing was logged at error level (that would be a bug
path), the log holds at most three lines per connection, and what the peers left behind
is within the caps, with no bytes queued. ``LOOPDOCK_FUZZ_RUNS=n`` runs it on ``n`` sets of
seeds (``-s`` shows what each run got through).

The stalled readers: clients that never read, while every peer gets the same events;
the bytes queued for all of them together, measured on each queue after every publish,
never pass the server's budget; every stalled reader is dropped, and a client that reads
gets every event, in order.

Rules: 127.0.0.1 only, port 0, an absolute ``trio.fail_after`` around every test's I/O,
no sleeping to wait for something.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import random
import string

import pytest
import structlog
import trio
from trio_websocket import open_websocket

from loopdock.bridge import HandlerLayer, HostHandler, _dock_select, _host_handler, serve_bridge
from loopdock.bridge._messages import MAX_ID_LENGTH, MESSAGE_TYPES
from loopdock.runtime._events import Event

TOKEN = "test-token-for-the-bridge"
SEED = 20261201
WORKERS = 6
FRAMES = 3000
#: Fuzz runs, each on its own seeds (SEED + run * WORKERS + worker): one in the suite; set
#: LOOPDOCK_FUZZ_RUNS for a longer campaign (docs/reliability.md).
RUNS = int(os.environ.get("LOOPDOCK_FUZZ_RUNS", "1"))
MAX_MESSAGE_SIZE = 8192
TIMEOUT = 60

# -- frames, written by hand -------------------------------------------------------------------

TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0


def frame(rng: random.Random, opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0) -> bytes:
    """One client frame: masked with a mask drawn from ``rng``."""
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 2**16:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    mask = rng.randbytes(4)
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
    return head + mask + masked


def upgrade(rng: random.Random, path: str) -> bytes:
    key = base64.b64encode(rng.randbytes(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


GOOD_SIDS = [f"s{n}" for n in range(40)]
BAD_SIDS = ["", "../..", "a\x00b", "x" * (MAX_ID_LENGTH + 1), "white space", 7, None]


def session_id(rng: random.Random) -> object:
    return rng.choice(BAD_SIDS) if rng.random() < 0.1 else rng.choice(GOOD_SIDS)


def request_id(rng: random.Random) -> object:
    return rng.choice(["r1", "x", "", "x" * (MAX_ID_LENGTH + 1), 5, None, "".join(rng.choices(string.printable, k=8))])


def data_for(rng: random.Random, type_: str) -> object:
    """A ``data`` for ``type_``: mostly the right shape, with session ids good or bad."""
    sid = session_id(rng)
    event = {"type": rng.choice(["turn/start", "user/message"]), "seq": rng.choice([*range(8), -1]), "time": 1, "data": {}}
    message = {"id": f"m{rng.randrange(5)}", "role": "user", "source": {"kind": rng.choice(["user", "loopx-continuation"])}}
    shapes = {
        "hello": {"token": rng.choice([TOKEN, "wrong"]), "role": rng.choice(["dsh-host", "goalbar"]), "protocol": rng.choice([1, 1, 2])},
        "events": {"items": [{"sessionId": session_id(rng), "event": event} for _ in range(rng.randrange(4))]},
        "live": {"items": [
            {"type": rng.choice(["agent/created", "agent/status", "agent/inbox/inserted", "agent/inbox/claimed", "agent/disposed", "x"]),
             "agentId": session_id(rng), "data": {"sessionId": session_id(rng), "status": "idle", "message": message}}
            for _ in range(rng.randrange(4))
        ]},
        "preStep": {"agentId": sid, "sessionId": sid, "turn": 1, "step": 0, "messages": [message]},
        "select": {"op": rng.choice(["create", "resume"]), "sessionId": sid, "agentOptions": rng.choice([{}, {"loop": "nope"}, {"model": 5}]),
                   **({"binding": {"loop": rng.choice(["standard", "Not A Loop"])}} if rng.random() < 0.5 else {})},
        "mirrored": {"sessionIds": [session_id(rng) for _ in range(rng.randrange(4))]},
        "goalbarRead": {"sessionId": sid},
        "error": {"code": "X", "message": "peer error"},
    }
    if type_ in shapes and rng.random() < 0.85:
        return shapes[type_]
    return rng.choice([{}, [], None, {"x": 1}, "text", {"items": "no"}])


REQUESTS = ("preStep", "select", "mirrored", "ping", "goalbarRead")


def text_message(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.6:  # what a host or page sends, ids right, data mostly right
        type_ = rng.choice(["events", "live", *REQUESTS])
        envelope = {"v": 1, "type": type_, "data": data_for(rng, type_)}
        if type_ in REQUESTS:
            envelope["id"] = f"q{rng.randrange(1000)}"
        return json.dumps(envelope).encode()
    if roll < 0.8:
        type_ = rng.choice([*MESSAGE_TYPES, "hello", "events", "live", "select", "mirrored", "preStep", "teleport"])
        envelope = {"v": rng.choice([1] * 98 + [2, "1"]), "type": type_, "data": data_for(rng, type_)}
        if rng.random() < 0.6:
            envelope["id"] = request_id(rng)
        if rng.random() < 0.2:
            envelope["re"] = request_id(rng)
        return json.dumps(envelope).encode()
    if roll < 0.90:
        return "".join(rng.choices(string.printable + "é→世\U0001f600", k=rng.randrange(40))).encode()
    if roll < 0.99:
        return b"[" * rng.randrange(1, 3000)
    return b'{"v": 1, "type": "ping", "id": "' + rng.randbytes(4) + b'", "data": {}}'  # mostly not UTF-8


def connection_script(rng: random.Random, frames: int) -> tuple[bytes, list[bytes], str]:
    """One connection: its upgrade request, ``frames`` frames, and how it ends."""
    path = rng.choice(["/dsh"] * 14 + ["/goalbar"] * 4 + ["/nowhere", "//["])
    out: list[bytes] = []
    if rng.random() < 0.9:
        hello = {"v": 1, "type": "hello", "data": {"token": TOKEN if rng.random() < 0.9 else "guess",
                                                  "role": "goalbar" if path == "/goalbar" else "dsh-host", "protocol": 1}}
        out.append(frame(rng, TEXT, json.dumps(hello).encode()))
    # Frames that end the connection (the websocket protocol refuses them) are rarer than
    # the others, so that connections live long enough to reach deep into the server.
    while len(out) < frames:
        roll = rng.random()
        if roll < 0.66:
            out.append(frame(rng, TEXT, text_message(rng)))
        elif roll < 0.82:
            out.append(frame(rng, PING, rng.randbytes(rng.randrange(0, 126))))
        elif roll < 0.85:
            out.append(frame(rng, PONG, rng.randbytes(rng.randrange(0, 10))))
        elif roll < 0.89:
            out.append(frame(rng, BINARY, rng.randbytes(rng.randrange(0, 64))))
        elif roll < 0.96:  # a message in fragments, a ping between them
            body = text_message(rng)
            cut = len(body) // 2
            out += [frame(rng, TEXT, body[:cut], fin=False), frame(rng, PING, b"mid"), frame(rng, CONTINUATION, body[cut:])]
        elif roll < 0.965:  # over the size limit, in fragments
            out += [frame(rng, TEXT, b"x" * 4000, fin=False)] + [frame(rng, CONTINUATION, b"x" * 4000, fin=False)] * 2
            out.append(frame(rng, CONTINUATION, b"x", fin=True))
        elif roll < 0.97:
            out.append(frame(rng, CLOSE, (1000).to_bytes(2, "big") + b"bye"))
        elif roll < 0.975:
            out.append(frame(rng, rng.choice([0x3, 0x4, 0xB, 0xF]), b"reserved"))
        elif roll < 0.98:
            out.append(frame(rng, TEXT, b"rsv", rsv=rng.choice([1, 2, 4])))
        elif roll < 0.985:
            out.append(frame(rng, PING, b"x" * 126))  # a control frame too long
        elif roll < 0.99:
            out.append(frame(rng, CONTINUATION, b"nothing to continue"))
        else:
            out.append(frame(rng, CLOSE, b"\x03"))  # a close payload of one byte
    return upgrade(rng, path), out, rng.choice(["close", "close", "abort", "reset"])


def worker_scripts(seed: int) -> list[tuple[bytes, list[bytes], str]]:
    rng = random.Random(seed)
    scripts, left = [], FRAMES // WORKERS
    while left > 0:
        count = min(left, rng.choice([1, 2, 5, 20, 60]))
        scripts.append(connection_script(rng, count))
        left -= count
    return scripts


async def run_script(port: int, request: bytes, frames: list[bytes], ending: str) -> int:
    """Play one connection; the number of frames the server took before it closed."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    delivered = 0

    answered, drained = trio.Event(), trio.Event()

    async def drain() -> None:
        head = b""
        try:
            while data := await stream.receive_some(65536):
                if not answered.is_set():
                    head += data
                    if b"\r\n\r\n" in head:
                        answered.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        answered.set()
        drained.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        try:
            await stream.send_all(request)
            # As a client should: frames sent with the request would wait in the server's
            # wsproto until more data came.
            await answered.wait()
            for data in frames:
                await stream.send_all(data)
                delivered += 1
                await trio.lowlevel.checkpoint()
            if ending == "close":
                await stream.send_all(frame(random.Random(len(frames)), CLOSE, (1000).to_bytes(2, "big")))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server closed this connection: the rest of its frames are not sent
        if ending == "close":
            # As a client should, wait for the server to close the TCP connection (bounded:
            # a server still waiting for the rest of a fragmented message does not).
            with trio.move_on_after(5):
                await drained.wait()
        elif ending == "reset":  # SO_LINGER 0: a reset instead of a FIN
            stream.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        nursery.cancel_scope.cancel()
    await trio.aclose_forcefully(stream)
    return delivered


class Signal:
    """Wakes whoever waits, each time something changed."""

    def __init__(self):
        self._event = trio.Event()

    def notify(self):
        self._event.set()
        self._event = trio.Event()

    async def wait(self):
        await self._event.wait()


class Recording(HandlerLayer):
    """Passes everything on to ``inner``, keeps every connection it was told of, and counts
    the frames that reached it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.conns = []
        self.ended = 0
        self.changed = Signal()
        self.reached = 0

    async def on_events(self, conn, items):
        self.reached += 1
        await super().on_events(conn, items)

    async def on_live(self, conn, items):
        self.reached += 1
        await super().on_live(conn, items)

    async def on_pre_step(self, conn, request):
        self.reached += 1
        return await super().on_pre_step(conn, request)

    async def on_select(self, conn, request):
        self.reached += 1
        return await super().on_select(conn, request)

    async def on_mirrored(self, conn, request):
        self.reached += 1
        return await super().on_mirrored(conn, request)

    def connected(self, conn):
        super().connected(conn)
        self.conns.append(conn)
        self.changed.notify()

    def disconnected(self, conn, reason):
        super().disconnected(conn, reason)
        self.ended += 1
        self.changed.notify()


async def still_serves(port: int) -> None:
    async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
        await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": {"token": TOKEN, "role": "dsh-host", "protocol": 1}}))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        await ws.send_message(json.dumps({"v": 1, "type": "ping", "id": "alive", "data": {}}))
        assert json.loads(await ws.get_message()) == {"v": 1, "type": "pong", "re": "alive", "data": {}}


@pytest.fixture
def small_caps(monkeypatch):
    for name, value in [("MAX_SESSIONS", 12), ("MAX_SESSIONS_PER_CONNECTION", 8), ("MAX_AGENTS", 12),
                        ("MAX_AGENTS_PER_CONNECTION", 8), ("MAX_INBOX", 3), ("RETAINED_GAPS", 10),
                        ("RETAINED_CLOSED_SESSIONS", 4)]:
        monkeypatch.setattr(_host_handler, name, value)
    monkeypatch.setattr(_dock_select, "MAX_BINDINGS", 12)
    monkeypatch.setattr(_dock_select, "MAX_BINDINGS_PER_CONNECTION", 8)


@pytest.mark.parametrize("run", range(RUNS))
async def test_a_seeded_wire_fuzz_with_pings_ends_no_server_and_leaves_what_the_caps_allow(rt, small_caps, run):
    host = HostHandler(rt.dock)
    handler = Recording(host)
    scripts = [worker_scripts(SEED + run * WORKERS + n) for n in range(WORKERS)]
    assert sum(len(frames) for worker in scripts for _, frames, _ in worker) >= FRAMES
    assert sum(1 for worker in scripts for _, frames, _ in worker for f in frames if f[0] & 0x0F == PING) > 300
    delivered = []
    with structlog.testing.capture_logs() as logs, trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(
                functools.partial(serve_bridge, handler, token=TOKEN, max_message_size=MAX_MESSAGE_SIZE)
            )

            async def worker(n: int) -> None:
                for request, frames, ending in scripts[n]:
                    delivered.append(await run_script(port, request, frames, ending))

            async with trio.open_nursery() as clients:
                for n in range(WORKERS):
                    clients.start_soon(worker, n)
            await still_serves(port)
            while handler.ended < len(handler.conns):  # every connection the fuzz opened has ended
                await handler.changed.wait()
            nursery.cancel_scope.cancel()

    connections = sum(len(worker) for worker in scripts)
    # Enough got through, and deep enough: frames sent before the server closed their
    # connection, and frames that reached the handler's code.
    print(f"fuzz run {run}: {connections} connections, {sum(delivered)} frames delivered, "
          f"{handler.reached} reached the handler, {len(handler.conns)} welcomed")
    assert sum(delivered) >= FRAMES // 3 and handler.reached >= 100
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []
    ended = [e for e in logs if e["event"] == "bridge connection ended"]
    assert len(handler.conns) >= 20  # the fuzz got through to the handler, often
    assert len(handler.conns) + 1 <= len(ended) <= connections + 1  # (the last one: the check's)
    # Per connection at most three lines: welcomed, its first error, its end.
    assert len([e for e in logs if e["event"].startswith("bridge")]) <= 3 * (connections + 1) + 1
    # What the peers left behind is within the caps, and nothing is queued for them.
    assert len(host.sessions) <= 12 and len(host.agents) <= 12 and len(host.inner.bindings) <= 12
    assert all(len(agent.inbox) <= 3 for agent in host.agents.values()) and len(host.gaps) <= 10
    assert sum(conn._outbox.size for conn in handler.conns) == 0


# -- stalled readers against the budget ---------------------------------------------------------

BUDGET = 2 * 2**20
STALLED = 8
PAD = {"pad": "x" * 16_000}


async def test_stalled_readers_cannot_queue_more_than_the_budget_and_a_reader_keeps_up():
    handler = Recording(None)
    hello = json.dumps({"v": 1, "type": "hello", "data": {"token": TOKEN, "role": "goalbar", "protocol": 1}})
    seqs: list[int] = []
    got = Signal()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(
                serve_bridge, handler, token=TOKEN, outbox_bytes=BUDGET, outbox_budget=BUDGET
            ))
            stalled = []
            for n in range(STALLED):
                # A raw client that says hello and never reads: only its socket buffers and
                # then the server's queue take what is sent to it.
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                stream.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
                rng = random.Random(n)
                await stream.send_all(upgrade(rng, "/goalbar"))
                response = b""
                while b"\r\n\r\n" not in response:
                    response += await stream.receive_some(1)  # the 101 and nothing after it
                await stream.send_all(frame(rng, TEXT, hello.encode()))
                stalled.append(stream)
            while len(handler.conns) < STALLED:
                await handler.changed.wait()
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as reader:
                await reader.send_message(hello)
                assert json.loads(await reader.get_message())["type"] == "welcome"
                while len(handler.conns) < STALLED + 1:
                    await handler.changed.wait()
                reading = handler.conns[-1]

                async def read() -> None:
                    while True:
                        batch = json.loads(await reader.get_message())
                        seqs.extend(item["event"]["seq"] for item in batch["data"]["items"])
                        got.notify()

                async with trio.open_nursery() as reading_tasks:
                    reading_tasks.start_soon(read)
                    published = peak = 0
                    while any(conn.closed is None for conn in handler.conns[:STALLED]):
                        for conn in handler.conns:
                            conn.publish_event("s1", Event("user/message", published, 0, PAD))
                        published += 1
                        queued = sum(conn._outbox.size for conn in handler.conns)
                        peak = max(peak, queued)
                        assert queued <= BUDGET
                        await trio.lowlevel.checkpoint()
                    while len(seqs) < published:
                        await got.wait()
                    reading_tasks.cancel_scope.cancel()
                assert reading.closed is None
            for stream in stalled:
                await stream.aclose()
            nursery.cancel_scope.cancel()
    assert peak > BUDGET // 2  # the budget was what held, not something before it
    assert seqs == list(range(published))
    assert {conn.closed.kind for conn in handler.conns[:STALLED]} == {"slow-peer"}
    assert any("budget" in conn.closed.detail for conn in handler.conns[:STALLED])
