"""The bridge server against real websocket clients.

Rules (as in trio-websocket's own tests): 127.0.0.1 only, port 0, an absolute
``trio.fail_after`` around every test's I/O, and no sleeping to wait for something: tests
wait on what the server does (a frame, a close, a handler callback).
"""

import functools
import json
import math
from contextlib import asynccontextmanager

import pytest
import structlog
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket

from loopdock import Event
from loopdock.actors import LiveEvent
from loopdock.actors.dock import DockError
from loopdock.bridge import (
    BATCH_ITEMS,
    Ack,
    BridgeClosedError,
    ErrorCode,
    Followup,
    Ping,
    Pong,
    ProtocolError,
    RemoteError,
    RequestTimeoutError,
    Selection,
    SelectionParts,
    Verdict,
    Wake,
    serve_bridge,
)
from loopdock.bridge import _server as bridge_server

TOKEN = "test-token-for-the-bridge"
TIMEOUT = 10


class RecordingHandler:
    """Records what the server hands over; answers pre-steps and selects like a dock."""

    def __init__(self):
        self._connected_send, self.connected_conns = trio.open_memory_channel(100)
        self._ended_send, self.ended = trio.open_memory_channel(100)
        self.events = []
        self.live = []
        self.fail_next_events = False

    def connected(self, conn):
        self._connected_send.send_nowait(conn)

    def disconnected(self, conn, reason):
        self._ended_send.send_nowait((conn, reason))

    async def on_events(self, conn, items):
        if self.fail_next_events:
            self.fail_next_events = False
            raise RuntimeError("a bug in the handler")
        self.events.extend(items)

    async def on_live(self, conn, items):
        self.live.extend(items)

    async def on_pre_step(self, conn, request):
        if any("weekend" in json.dumps(m) for m in request.messages):
            return Verdict("reject", "not on weekends")
        return Verdict("enter")

    async def on_select(self, conn, request):
        if request.op == "resume":
            raise DockError("LOOP_SWITCH", f"session {request.session_id!r} is bound to loop standard")
        return Selection("planner", "loop2", SelectionParts(deny_tools=("shell",)))


@asynccontextmanager
async def running_bridge(handler=None, **options):
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN, **options))
        yield port
        nursery.cancel_scope.cancel()


def wire(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


def hello_text(role="dsh-host", token=TOKEN):
    return wire("hello", {"token": token, "role": role, "protocol": 1, "capabilities": ["events", "live", "commands", "pre-step", "dock"]})


async def receive(ws):
    return json.loads(await ws.get_message())


@asynccontextmanager
async def client(port, path="/dsh", role="dsh-host", **options):
    """A connected client that has said hello and read its welcome."""
    async with open_websocket("127.0.0.1", port, path, use_ssl=False, **options) as ws:
        await ws.send_message(hello_text(role))
        welcome = await receive(ws)
        assert welcome["type"] == "welcome", welcome
        yield ws


async def closed_with(ws):
    """The close code the server ended ``ws`` with (every frame before it is skipped)."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await ws.get_message()
    return info.value.reason.code


# -- bad input against the live server ---------------------------------------------------


async def test_a_wrong_token_is_closed_with_1008_and_never_welcomed():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                await ws.send_message(hello_text(token="guess"))
                error = await receive(ws)
                assert error["type"] == "error" and error["data"]["code"] == "UNAUTHORIZED"
                assert await closed_with(ws) == 1008
    with pytest.raises(trio.WouldBlock):
        handler.connected_conns.receive_nowait()  # the handler never saw this peer


async def test_a_first_frame_that_is_not_hello_is_closed_with_1008():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                await ws.send_message(wire("ping", {}, id="1"))
                assert (await receive(ws))["data"]["code"] == "UNAUTHORIZED"
                assert await closed_with(ws) == 1008


async def test_a_hello_for_the_other_endpoint_is_closed_with_1008():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await ws.send_message(hello_text(role="dsh-host"))
                assert (await receive(ws))["data"]["code"] == "UNAUTHORIZED"
                assert await closed_with(ws) == 1008


async def test_a_silent_peer_is_closed_with_1008_after_the_hello_timeout(monkeypatch):
    monkeypatch.setattr(bridge_server, "HELLO_TIMEOUT", 0.2)
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                error = await receive(ws)
                assert (error["data"]["code"], error["data"]["message"]) == ("UNAUTHORIZED", "no hello in time")
                assert await closed_with(ws) == 1008


async def test_malformed_json_after_hello_gets_an_error_frame_and_the_connection_stays_usable():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with client(port) as ws:
                await ws.send_message('{"v": 1, "type": ')
                error = await receive(ws)
                assert error["type"] == "error" and error["data"]["code"] == "MALFORMED_JSON"
                await ws.send_message(b"\x01\x02")
                assert (await receive(ws))["data"]["code"] == "BAD_ENVELOPE"
                await ws.send_message(wire("ping", {}, id="still-there"))
                assert await receive(ws) == {"v": 1, "type": "pong", "re": "still-there", "data": {}}


async def test_an_unknown_type_gets_unknown_type_answering_its_id():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            async with client(port) as ws:
                await ws.send_message(wire("teleport", {"to": "mars"}, id="t1"))
                error = await receive(ws)
                assert (error["re"], error["data"]["code"]) == ("t1", "UNKNOWN_TYPE")
                await ws.send_message(wire("ping", {}, id="p"))
                assert (await receive(ws))["type"] == "pong"


async def test_a_wrong_protocol_version_gets_bad_version_and_close_1002():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                await ws.send_message(json.dumps({"v": 2, "type": "ping", "id": "1", "data": {}}))
                error = await receive(ws)
                assert error["data"]["code"] == "BAD_VERSION"
                assert await closed_with(ws) == 1002
            _, reason = await handler.ended.receive()
            assert reason.kind == "bad-version"


async def test_an_oversize_frame_is_closed_with_1009():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler, max_message_size=4096) as port:
            async with client(port) as ws:
                await ws.send_message(wire("events", {"items": [], "pad": "x" * 5000}))
                assert await closed_with(ws) == 1009
            _, reason = await handler.ended.receive()
            assert reason.kind == "too-large"


async def test_an_unknown_path_is_rejected_in_the_handshake():
    with trio.fail_after(TIMEOUT):
        async with running_bridge() as port:
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket("127.0.0.1", port, "/admin", use_ssl=False):
                    pass  # pragma: no cover - the handshake fails first
            assert info.value.status_code == 404
            # A query string does not change the endpoint.
            async with client(port, path="/goalbar?x=1", role="goalbar") as ws:
                await ws.send_message(wire("ping", {}, id="q"))
                assert (await receive(ws))["re"] == "q"


async def test_a_failing_handler_costs_an_error_frame_not_the_connection():
    handler = RecordingHandler()
    handler.fail_next_events = True
    event = {"sessionId": "s", "event": {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}}
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                await ws.send_message(wire("events", {"items": [event]}))
                assert (await receive(ws))["data"]["code"] == "INTERNAL_ERROR"
                await ws.send_message(wire("events", {"items": [event]}))
                await ws.send_message(wire("ping", {}, id="after"))
                assert (await receive(ws))["re"] == "after"
    assert [item.event.seq for item in handler.events] == [0]


# -- what a host sends --------------------------------------------------------------------


async def test_host_events_and_live_events_reach_the_handler_in_order():
    handler = RecordingHandler()
    items = [{"sessionId": "s1", "event": {"type": "user/message", "seq": n, "time": n, "data": {"n": n}}} for n in range(50)]
    live = [{"type": "agent/status", "agentId": "s1", "data": {"status": "idle"}}]
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                await ws.send_message(wire("events", {"items": items[:30]}))
                await ws.send_message(wire("events", {"items": items[30:]}))
                await ws.send_message(wire("live", {"items": live}))
                # The reply to a ping after them proves they were all taken (one reader, in order).
                await ws.send_message(wire("ping", {}, id="sync"))
                assert (await receive(ws))["re"] == "sync"
    assert [item.event.seq for item in handler.events] == list(range(50))
    assert handler.events[7].session_id == "s1" and handler.events[7].event.data == {"n": 7}
    assert handler.live == [LiveEvent("agent/status", "s1", {"status": "idle"})]


async def test_pre_step_and_select_requests_are_answered_by_the_handler():
    handler = RecordingHandler()
    step = {"agentId": "a1", "sessionId": "a1", "turn": 3, "step": 0}
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                await ws.send_message(wire("preStep", {**step, "messages": [{"text": "weekend work"}]}, id="h1"))
                assert await receive(ws) == {"v": 1, "type": "verdict", "re": "h1", "data": {"kind": "reject", "reason": "not on weekends"}}
                await ws.send_message(wire("select", {"op": "create", "sessionId": "a2"}, id="h2"))
                assert await receive(ws) == {
                    "v": 1, "type": "selection", "re": "h2",
                    "data": {"loop": "planner", "driver": "loop2", "parts": {"denyTools": ["shell"]}},
                }
                await ws.send_message(wire("select", {"op": "resume", "sessionId": "a1"}, id="h3"))
                error = await receive(ws)
                assert (error["type"], error["re"], error["data"]["code"]) == ("error", "h3", "LOOP_SWITCH")


async def test_an_invalid_session_id_is_answered_and_never_reaches_the_handler():
    handler = RecordingHandler()
    handler.on_select = None  # a select reaching the handler would fail the test with INTERNAL_ERROR
    good = {"sessionId": "s1", "event": {"type": "turn/start", "seq": 0, "time": 1, "data": {}}}
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                await ws.send_message(wire("select", {"op": "create", "sessionId": "../.."}, id="h1"))
                error = await receive(ws)
                assert (error["type"], error["re"], error["data"]["code"]) == ("error", "h1", "INVALID_SESSION_ID")
                await ws.send_message(wire("events", {"items": [good, {**good, "sessionId": "x" * 100_000}]}))
                assert (await receive(ws))["data"]["code"] == "INVALID_SESSION_ID"
                await ws.send_message(wire("live", {"items": [{"type": "agent/status", "agentId": "", "data": {}}]}))
                assert (await receive(ws))["data"]["code"] == "INVALID_SESSION_ID"
                await ws.send_message(wire("ping", {}, id="sync"))
                assert (await receive(ws))["re"] == "sync"
    assert handler.events == [] and handler.live == []  # the whole frame is refused


# -- what the runtime sends -----------------------------------------------------------------


async def answer_one(ws, reply):
    """Read one request from the server and answer it with ``reply(request)``."""
    request = await receive(ws)
    await ws.send_message(reply(request))
    return request


async def test_a_server_request_is_answered_by_the_client():
    handler = RecordingHandler()
    message = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "go on"}], "source": {"kind": "loopx-continuation"}}
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                conn = await handler.connected_conns.receive()
                async with trio.open_nursery() as nursery:
                    seen = []

                    async def host():
                        seen.append(await answer_one(ws, lambda r: wire("ack", {"ok": True}, re=r["id"])))

                    nursery.start_soon(host)
                    reply = await conn.request(Followup("a1", message, "followup"), reply_timeout=5)
                assert reply == Ack(True)
                assert seen[0]["type"] == "followup"
                assert seen[0]["data"] == {"agentId": "a1", "message": message, "placement": "followup"}

                # An error frame in reply becomes a typed error for the caller.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        answer_one, ws, lambda r: wire("error", {"code": "NOT_LIVE", "message": "no agent a9"}, re=r["id"])
                    )
                    with pytest.raises(RemoteError) as info:
                        await conn.request(Wake("a9"), reply_timeout=5)
                assert info.value.code == "NOT_LIVE"


async def test_a_request_that_is_not_json_fails_its_caller_not_the_connection():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                conn = await handler.connected_conns.receive()
                with pytest.raises(ProtocolError) as info:
                    await conn.request(Followup("a1", {"text": float("nan")}), reply_timeout=5)
                assert info.value.code is ErrorCode.BAD_DATA
                assert conn._protocol.pending == frozenset()  # nothing left waiting for a reply
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(answer_one, ws, lambda r: wire("pong", {}, re=r["id"]))
                    assert await conn.request(Ping(), reply_timeout=5) == Pong()


async def test_a_request_without_reply_times_out_and_its_late_reply_is_refused():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                conn = await handler.connected_conns.receive()
                with pytest.raises(RequestTimeoutError):
                    await conn.request(Ping(), reply_timeout=0.2)
                request = await receive(ws)
                await ws.send_message(wire("pong", {}, re=request["id"]))
                error = await receive(ws)
                assert error["data"]["code"] == "BAD_ENVELOPE" and request["id"] in error["data"]["message"]


async def test_waiting_requests_fail_when_the_peer_goes_away():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                conn = await handler.connected_conns.receive()
                async with trio.open_nursery() as nursery:
                    outcome = []

                    async def ask():
                        try:
                            await conn.request(Wake("a1"), reply_timeout=TIMEOUT)
                        except BridgeClosedError as exc:
                            outcome.append(exc)

                    nursery.start_soon(ask)
                    await receive(ws)  # the wake is out; now leave without answering
                    await ws.aclose()
                assert len(outcome) == 1
            _, reason = await handler.ended.receive()
            assert reason.kind == "peer-closed"
            assert conn.closed == reason
            with pytest.raises(BridgeClosedError):
                await conn.request(Ping())


async def test_the_server_closing_ends_every_connection_and_its_requests():
    handler = RecordingHandler()
    outcome = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as outer:
            server_scope = trio.CancelScope()

            async def server(task_status):
                with server_scope:
                    await serve_bridge(handler, token=TOKEN, task_status=task_status)

            port = await outer.start(server)
            async with client(port) as ws:
                conn = await handler.connected_conns.receive()

                async def ask():
                    try:
                        await conn.request(Wake("a1"), reply_timeout=TIMEOUT)
                    except BridgeClosedError as exc:
                        outcome.append(exc)

                outer.start_soon(ask)
                await receive(ws)  # the request is out
                server_scope.cancel()
                _, reason = await handler.ended.receive()
                assert reason.kind == "server-closing"
    assert len(outcome) == 1


async def test_many_events_published_at_once_arrive_batched_and_in_order():
    handler = RecordingHandler()
    count = 1000
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port, path="/goalbar", role="goalbar") as ws:
                conn = await handler.connected_conns.receive()
                for seq in range(count):
                    assert conn.publish_event("s1", Event("user/message", seq, seq, {"n": seq}))
                conn.publish_live(LiveEvent("agent/status", "s1", {"status": "idle"}))
                frames = []
                seqs = []
                while len(seqs) < count:
                    frame = await receive(ws)
                    frames.append(frame)
                    seqs.extend(item["event"]["seq"] for item in frame["data"]["items"])
                live = await receive(ws)
    assert seqs == list(range(count))
    assert {f["type"] for f in frames} == {"events"}
    # Published without a checkpoint in between, so every frame but the last is full.
    assert len(frames) == math.ceil(count / BATCH_ITEMS) < count
    assert live["type"] == "live" and live["data"]["items"] == [{"type": "agent/status", "agentId": "s1", "data": {"status": "idle"}}]


# The same producer for both tests below: one small event per scheduler turn, for ever or
# until refused. publish_event is a plain function, so the producer cannot wait on the peer;
# the checkpoint only lets the sender and the client run between two events.
SLOW_PEER_OUTBOX = 16
PAD = {"pad": "x" * 512}


async def produce(conn, limit):
    published = 0
    while published < limit and conn.publish_event("s1", Event("user/message", published, 0, PAD)):
        published += 1
        await trio.lowlevel.checkpoint()
    return published


async def test_a_slow_client_is_dropped_with_a_reason_and_never_blocks_the_producer():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler, outbox_size=SLOW_PEER_OUTBOX) as port:
            # message_queue_size=1: this client's library stops reading the socket as soon as
            # one message waits for it, and it never reads one: TCP backpressure builds up.
            async with client(port, path="/goalbar", role="goalbar", message_queue_size=1):
                conn = await handler.connected_conns.receive()
                published = await produce(conn, limit=math.inf)
                dropped, reason = await handler.ended.receive()
    assert dropped is conn
    assert reason.kind == "slow-peer" and "queue is full" in reason.detail
    assert published >= SLOW_PEER_OUTBOX  # the outbox took its fill before the drop
    assert not conn.publish_event("s1", Event("user/message", published, 0, {}))  # and refuses after


async def test_a_client_that_reads_keeps_up_with_the_same_producer():
    # The control for the test above: there, the drop comes from the client not reading.
    handler = RecordingHandler()
    count = 2000
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler, outbox_size=SLOW_PEER_OUTBOX) as port:
            async with client(port, path="/goalbar", role="goalbar", message_queue_size=1) as ws:
                conn = await handler.connected_conns.receive()
                seqs = []

                async def read():
                    while len(seqs) < count:
                        frame = await receive(ws)
                        seqs.extend(item["event"]["seq"] for item in frame["data"]["items"])

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    assert await produce(conn, limit=count) == count
                assert conn.closed is None
    assert seqs == list(range(count))


async def test_only_goalbar_clients_get_events_and_no_item_too_large_for_a_frame():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler, max_message_size=4096) as port:
            async with client(port):
                host = await handler.connected_conns.receive()
                with pytest.raises(TypeError):
                    host.publish_event("s1", Event("user/message", 0, 0, {}))
            async with client(port, path="/goalbar", role="goalbar"):
                goalbar = await handler.connected_conns.receive()
                with pytest.raises(ProtocolError) as info:
                    goalbar.publish_event("s1", Event("user/message", 0, 0, {"pad": "x" * 5000}))
                assert info.value.code is ErrorCode.TOO_LARGE
                assert goalbar.publish_event("s1", Event("user/message", 0, 0, {"pad": "x" * 100}))


async def test_a_ping_from_the_runtime_is_ponged_by_a_client():
    handler = RecordingHandler()
    with trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port, path="/goalbar", role="goalbar") as ws:
                conn = await handler.connected_conns.receive()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(answer_one, ws, lambda r: wire("pong", {}, re=r["id"]))
                    assert await conn.request(Ping(), reply_timeout=5) == Pong()


# -- what gets logged -------------------------------------------------------------------------


async def test_a_peers_errors_are_one_info_line_and_a_count_and_a_handler_bug_is_an_error():
    handler = RecordingHandler()
    handler.fail_next_events = True
    event = {"sessionId": "s", "event": {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}}
    with structlog.testing.capture_logs() as logs, trio.fail_after(TIMEOUT):
        async with running_bridge(handler) as port:
            async with client(port) as ws:
                for bad in ("{", "[]", wire("teleport", {}, id="t"), b"\x00"):
                    await ws.send_message(bad)
                    assert (await receive(ws))["type"] == "error"
                await ws.send_message(wire("events", {"items": [event]}))  # the handler's bug
                assert (await receive(ws))["data"]["code"] == "INTERNAL_ERROR"
            await handler.ended.receive()
    peer = [e for e in logs if e["event"] == "bridge peer sent a frame the runtime refuses"]
    assert [(e["log_level"], e["code"]) for e in peer] == [("info", "MALFORMED_JSON")]  # the first one only
    [ended] = [e for e in logs if e["event"] == "bridge connection ended"]
    assert (ended["log_level"], ended["peer_errors"]) == ("info", 4)
    [bug] = [e for e in logs if e["log_level"] not in ("debug", "info")]
    assert (bug["event"], bug["log_level"], bug["exc_info"]) == ("bridge handler failed", "error", True)
