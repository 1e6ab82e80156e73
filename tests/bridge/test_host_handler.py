"""``HostHandler``'s bookkeeping without a DSH host: a fake host connection, and the
``mirrored`` request over a real websocket on loopback (tests/bridge/test_dsh_commands_e2e.py
drives it with a real ``dsh headless``)."""

import json

import pytest
import trio

from loopdock._runtime import Runtime
from loopdock.bridge import Verdict, serve_bridge
from loopdock.bridge._host_handler import HostCommandError, HostHandler
from loopdock.bridge._messages import Mirrored, MirroredSeqs

TOKEN = "test-token-" + "c" * 20


async def _serve(nursery: trio.Nursery, handler: HostHandler, port: int = 0) -> tuple[trio.CancelScope, int]:
    """Start a bridge server; cancelling the returned scope stops it."""
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_bridge(handler, token=TOKEN, port=port, task_status=task_status)

    bound = await nursery.start(run)
    return scope, bound


class _FakeConn:
    role = "dsh-host"
    closed = None

    def __init__(self, reply=None) -> None:
        self.id = "c1"
        self.reply = reply
        self.sent: list = []

    async def request(self, message, reply_timeout=10.0):
        self.sent.append(message)
        return self.reply


async def test_host_handler_mirrors_agents_and_sessions_and_reports_gaps(tmp_path):
    from loopdock.actors import LiveEvent
    from loopdock.bridge import Ack, ErrorNotice, PreStep, SessionEvent, Wake
    from loopdock.bridge._handler import Disconnect
    from loopdock.bridge._host_handler import Gap, NoHostError
    from loopdock.runtime._events import Event

    async with Runtime.open(tmp_path / "runtime") as rt:
        handler = HostHandler(rt.dock)
        with pytest.raises(NoHostError):
            await handler.wake("x")
        conn = _FakeConn(Ack(False, ErrorNotice("NOT_LIVE", "no live agent x")))
        handler.connected(conn)
        assert handler.host is conn
        message = {"id": "m1", "role": "user", "content": [], "source": {"kind": "user"}}
        await handler.on_live(conn, [
            LiveEvent("agent/created", "x", {"source": "startup", "sessionId": "x"}),
            LiveEvent("agent/inbox/inserted", "x", {"message": message}),
            LiveEvent("agent/status", "x", {"status": "running"}),
            LiveEvent("agent/status", "y", {"status": "idle"}),  # announced before we listened
        ])
        assert handler.agents["x"].inbox == {"m1": message}
        assert (handler.agents["x"].source, handler.agents["x"].status) == ("startup", "running")
        assert handler.agents["y"].status == "idle" and handler.agents["y"].source is None
        await handler.on_live(conn, [LiveEvent("agent/inbox/claimed", "x", {"message": message}),
                                     LiveEvent("agent/disposed", "y", {})])
        assert handler.agents["x"].inbox == {} and "y" not in handler.agents

        def ev(seq):
            return SessionEvent("x", Event("turn/start", seq, 1000 + seq, {"turn": seq}))

        await handler.on_events(conn, [ev(0), ev(1), ev(1), ev(0), ev(4), ev(5)])
        assert [e.seq for e in handler.sessions["x"]] == [0, 1, 4, 5]
        assert handler.gaps == [Gap("x", 2, 4)]
        assert handler.repeats == 2
        # how far the mirror reaches, for the sessions asked about that it holds
        assert await handler.on_mirrored(conn, Mirrored(("x", "unknown"))) == MirroredSeqs({"x": 5})
        assert await handler.on_mirrored(conn, Mirrored(())) == MirroredSeqs({})

        # commands: a negative ack is a typed error
        with pytest.raises(HostCommandError) as failed:
            await handler.wake("x")
        assert (failed.value.code, failed.value.command, failed.value.agent_id) == ("NOT_LIVE", "wake", "x")
        assert conn.sent == [Wake("x")]
        conn.reply = Ack(True)
        await handler.cancel("x", "test")
        assert conn.sent[-1].cause == "test" and conn.sent[-1].keep_inbox is True

        # gates: per agent, sync or async; none -> enter
        step = PreStep("x", "x", 1, 1, ())
        assert await handler.on_pre_step(conn, step) == Verdict("enter")
        handler.gate("x", lambda request: Verdict("reject", "no"))
        assert await handler.on_pre_step(conn, step) == Verdict("reject", "no")

        async def later(request):
            await trio.lowlevel.checkpoint()
            return Verdict("enter")

        handler.gate("x", later)
        assert await handler.on_pre_step(conn, step) == Verdict("enter")
        handler.gate("x", lambda request: "yes")
        with pytest.raises(TypeError):
            await handler.on_pre_step(conn, step)
        handler.gate("x", None)
        assert await handler.on_pre_step(conn, step) == Verdict("enter")

        handler.disconnected(conn, Disconnect("peer-closed", "bye"))
        assert handler.host is None and "x" in handler.agents
        with pytest.raises(NoHostError):
            await handler.followup("x", message)


async def test_a_host_asks_how_far_the_mirror_reaches_over_the_wire(tmp_path):
    """``mirrored`` over a real websocket: HostHandler answers from its mirror (also behind
    the GoalBar handler ``loopdock serve`` puts in front of it); NullHandler, and a GoalBar
    handler in front of one, know nothing."""
    from trio_websocket import open_websocket

    from loopdock.bridge import NullHandler
    from loopdock.bridge._goalbar import GoalBarHandler

    def frame(type_, data, **ids):
        return json.dumps({"v": 1, "type": type_, **ids, "data": data})

    async def ask(handler, events=()) -> dict:
        async with trio.open_nursery() as nursery:
            server, port = await _serve(nursery, handler)
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                await ws.send_message(frame("hello", {"token": TOKEN, "role": "dsh-host", "protocol": 1}))
                assert json.loads(await ws.get_message())["type"] == "welcome"
                if events:
                    await ws.send_message(frame("events", {"items": [
                        {"sessionId": sid, "event": {"type": "turn/start", "seq": seq, "time": 1, "data": {}}}
                        for sid, seq in events
                    ]}))
                await ws.send_message(frame("mirrored", {"sessionIds": ["a", "b", "c"]}, id="h1"))
                reply = json.loads(await ws.get_message())
                assert (reply["type"], reply["re"]) == ("mirroredSeqs", "h1"), reply
            server.cancel()
        return reply["data"]["seqs"]

    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "runtime") as rt:
            sent = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("z", 0)]
            assert await ask(HostHandler(rt.dock), sent) == {"a": 2, "b": 0}
            async with trio.open_nursery() as nursery:
                behind = GoalBarHandler(None, lambda session_id: None, nursery, inner=HostHandler(rt.dock))
                assert await ask(behind, sent) == {"a": 2, "b": 0}
                assert await ask(GoalBarHandler(None, lambda session_id: None, nursery)) == {}
            assert await ask(NullHandler(), sent) == {}


async def test_the_handler_refuses_anything_but_the_runtime_s_dock(tmp_path):
    """``HostHandler(rt)`` (the runtime, not its dock) used to be taken, and every DSH
    ``select`` then failed as INTERNAL_ERROR ('Runtime' object has no attribute 'decide'):
    now it is refused where it is written."""
    from loopdock.bridge import DockSelectHandler

    async with Runtime.open(tmp_path / "runtime") as rt:
        for wrong in (rt, None, "standard"):
            with pytest.raises(TypeError, match=r"the runtime's loop dock \(rt\.dock\)"):
                HostHandler(wrong)
            with pytest.raises(TypeError, match=r"rt\.dock"):
                DockSelectHandler(wrong)
        assert HostHandler(rt.dock).inner.dock is rt.dock
