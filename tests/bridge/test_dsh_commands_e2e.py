"""Runtime commands on a real DSH host, and pre-step verdicts that fail closed (issue 5, test 2).

`dsh headless` (not in dock mode) loads bridge/dsh_plugin through the patch; the plugin
creates one extra agent, ``s-cmd``, which the runtime drives through a ``HostHandler``:

1. a runtime-issued followup with a producer-owned source (``loopx-continuation``) enters
   exactly that agent: DSH's own session log shows the message with that very source;
2. the runtime's pre-step gate rejects the second continuation: DSH ends that turn
   ``blocked``; a human message queued behind it is not lost; the runtime wakes the agent
   and the queue goes on (the human message's turn completes);
3. the runtime dies while a pre-step verdict is pending (the gate never answers; the
   bridge server is cancelled): the plugin fails closed, DSH ends that turn ``blocked``
   and the message never reaches a model step. A new server on the same port gets the
   plugin back (reconnect) with the events DSH logged meanwhile, and only those: the plugin
   asks how far the runtime's mirror reaches (``mirrored``) and nothing is sent twice;
4. a runtime of the older protocol (it answers ``mirrored`` with UNKNOWN_TYPE) gets every
   live session's log again from seq 0, and the mirror drops them all as repeats.

Offline and quiet: DSH_HOME and HOME in a temporary directory, telemetry disabled, the
plugin's `ping` model (it answers ``pong: <last user text>``), loopback only. The headless
task says HOLD, so `dsh headless` stays up until the runtime wakes that agent.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import MappingProxyType

import pytest
import trio

from loopdock._runtime import Runtime
from loopdock.bridge import Ping, Pong, Verdict, serve_bridge
from loopdock.bridge import _connection as bridge_connection
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log, turn_end
from loopdock.bridge._dsh_files import event_source as _source_of
from loopdock.bridge._dsh_files import event_text as _text
from loopdock.bridge._dsh_files import message_text as _text_of
from loopdock.bridge._dsh_files import split_turns as _turns
from loopdock.bridge._host_handler import HostCommandError, HostHandler
from loopdock.bridge._messages import Mirrored
from loopdock.bridge._patch import write_patch

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "c" * 20
AGENT = "s-cmd"
OWNED = "loopx-continuation"
TEST_LIMIT_S = 120
VERDICT_DEADLINE_MS = 10 * TEST_LIMIT_S * 1000  # never reached while the test runs


def _source(turn_instance: str) -> dict:
    return {"kind": OWNED, "schemaVersion": "test", "goalId": "g", "agentId": "a", "turnInstanceId": turn_instance}


def _message(text: str, source: dict) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}], "source": source}


def _dsh_env(tmp: Path) -> dict[str, str]:
    return quiet_env(tmp / "dsh-home", tmp / "home")


async def _serve(nursery: trio.Nursery, handler: HostHandler, port: int = 0) -> tuple[trio.CancelScope, int]:
    """Start a bridge server; cancelling the returned scope kills it (the runtime's side)."""
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_bridge(handler, token=TOKEN, port=port, task_status=task_status)

    bound = await nursery.start(run)
    return scope, bound


async def test_runtime_commands_enter_the_exact_dsh_agent_and_pre_step_fails_closed(tmp_path, monkeypatch):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    pre_steps: list[tuple[str, ...]] = []  # the owned turn instances of each verdict request
    human_queued = trio.Event()
    reserved = trio.Event()

    async def gate(request) -> Verdict:
        owned = tuple(
            m["source"]["turnInstanceId"] for m in request.messages if m.get("source", {}).get("kind") == OWNED
        )
        pre_steps.append(owned)
        if owned == ("t1",):
            return Verdict("enter")
        if owned == ("t2",):
            await human_queued.wait()  # the human message is queued behind the vetoed one
            return Verdict("reject", "test: the runtime vetoes t2")
        if owned == ("t3",):
            reserved.set()
            await trio.sleep_forever()  # the runtime dies before it answers
        return Verdict("reject", f"unexpected {owned}")

    with trio.fail_after(TEST_LIMIT_S):
        async with Runtime.open(tmp_path / "runtime") as rt:
            handler = HostHandler(rt.dock)
            handler.gate(AGENT, gate)
            async with trio.open_nursery() as nursery:
                server, port = await _serve(nursery, handler)
                patch = write_patch(
                    tmp_path / "p", f"ws://127.0.0.1:{port}", TOKEN, ping=True,
                    extra={"createAgents": [{"sessionId": AGENT}], "verdictTimeoutMs": VERDICT_DEADLINE_MS},
                )
                work = tmp_path / "work"
                work.mkdir()
                async with dsh_process(
                    DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                    cwd=work, env=_dsh_env(tmp_path), output=tmp_path / "dsh.err",
                ) as proc:
                    def dsh_alive() -> bool:
                        if proc.returncode is not None:
                            pytest.fail(f"dsh exited ({proc.returncode}): {(tmp_path / 'dsh.err').read_text()}")
                        return True

                    async def until(predicate) -> None:
                        while not (dsh_alive() and predicate()):
                            with trio.move_on_after(0.5):  # and see whether dsh is still alive
                                await handler.wait_until(predicate)

                    def headless_agent() -> str | None:
                        return next((a for a in handler.agents if a != AGENT), None)

                    def ends(reason: str) -> int:
                        return sum(
                            1 for e in handler.sessions.get(AGENT, [])
                            if e.type == "turn/end" and (e.data.get("reason") or {}).get("kind") == reason
                        )

                    await until(lambda: handler.host is not None and AGENT in handler.agents
                                and headless_agent() is not None)
                    headless = headless_agent()
                    # the host answers for its live agents only
                    with pytest.raises(HostCommandError) as refused:
                        await handler.wake("no-such-agent")
                    assert refused.value.code == "NOT_LIVE"

                    # 1. a runtime-issued continuation enters the exact agent
                    await handler.followup(AGENT, _message("continuation one", _source("t1")))
                    await until(lambda: ends("completed") == 1)
                    assert pre_steps == [("t1",)]

                    # 2. a pre-step reject blocks the next one; a human message waits behind it
                    await handler.followup(AGENT, _message("continuation two", _source("t2")))
                    await until(lambda: ("t2",) in pre_steps)
                    await handler.followup(AGENT, _message("human after the veto", {"kind": "user"}))
                    await until(lambda: any(_text_of(m) == "human after the veto" for m in handler.agents[AGENT].inbox.values()))
                    human_queued.set()
                    await until(lambda: ends("blocked") == 1 and handler.agents[AGENT].status == "idle")
                    # stalled: DSH does not run the queued human message by itself. Two
                    # round trips through the plugin let DSH's event loop turn after the
                    # blocked turn; the plugin sends what it queued before a pong, so a turn
                    # DSH had started would be mirrored by then.
                    for _ in range(2):
                        assert isinstance(await handler.host.request(Ping(), 30), Pong)
                    assert ends("completed") == 1
                    assert [m for m in handler.agents[AGENT].inbox.values() if _text_of(m) == "human after the veto"]
                    await handler.wake(AGENT)
                    await until(lambda: ends("completed") == 2 and handler.agents[AGENT].status == "idle")

                    # 3. the runtime dies mid-reservation: the plugin fails closed
                    await handler.followup(AGENT, _message("continuation three", _source("t3")))
                    await reserved.wait()
                    assert handler.repeats == 0  # the first connection sent nothing twice
                    server.cancel()
                    killed_ms = time.time() * 1000
                    await until(lambda: handler.host is None)
                    # what the runtime had when it stopped listening (no frame is taken after that)
                    had = {sid: len(log) for sid, log in handler.sessions.items()}
                    server, _ = await _serve(nursery, handler, port)  # a new runtime on the same port
                    await until(lambda: handler.host is not None and ends("blocked") == 2)
                    # the plugin answers a ping once its resend after the welcome is out
                    assert isinstance(await handler.host.request(Ping(), 30), Pong)
                    blocked = [e for e in handler.sessions[AGENT] if e.type == "turn/end"][-1]
                    # the verdict deadline lies beyond the whole test's time limit: only the
                    # closed connection can have rejected it
                    assert pre_steps == [("t1",), ("t2",), ("t3",)]
                    # DSH logged it after the runtime had gone; it arrived, and nothing the
                    # runtime already had came again
                    assert blocked.time >= int(killed_ms) and blocked.seq >= had[AGENT], (blocked, had)
                    assert len(handler.sessions[AGENT]) > had[AGENT]
                    assert handler.repeats == 0
                    assert handler.gaps == []

                    # 4. an older runtime: `mirrored` is not a message it knows (UNKNOWN_TYPE),
                    #    so the plugin sends every live session's log from seq 0 again
                    live_sessions = {a.session_id for a in handler.agents.values()}
                    assert live_sessions == {AGENT, headless}
                    had = {sid: len(handler.sessions[sid]) for sid in live_sessions}
                    server.cancel()
                    await until(lambda: handler.host is None)
                    accepted = bridge_connection._ACCEPTED
                    monkeypatch.setattr(bridge_connection, "_ACCEPTED", MappingProxyType(
                        {**accepted, "dsh-host": accepted["dsh-host"] - {Mirrored}}))
                    server, _ = await _serve(nursery, handler, port)
                    await until(lambda: handler.host is not None)
                    assert isinstance(await handler.host.request(Ping(), 30), Pong)
                    assert handler.repeats == sum(had.values()), (handler.repeats, had)
                    assert {sid: len(handler.sessions[sid]) for sid in live_sessions} == had
                    assert handler.gaps == []
                    monkeypatch.setattr(bridge_connection, "_ACCEPTED", accepted)

                    # the end: wake the headless agent (its ping call holds until then)
                    await handler.wake(headless)
                    with trio.fail_after(60):
                        code = await proc.wait()
                stderr = (tmp_path / "dsh.err").read_text(errors="replace")
                assert code == 0, stderr
                nursery.cancel_scope.cancel()

    log = session_log(dsh_home, AGENT)
    events = [e for e in log if "seq" in e]
    # the runtime's mirror is DSH's own log, event for event, up to where it stopped listening
    mirrored = [(e.seq, e.type) for e in handler.sessions[AGENT]]
    assert mirrored == [(e["seq"], e["type"]) for e in events][: len(mirrored)]
    assert [e.seq for e in handler.sessions[AGENT]] == list(range(len(mirrored)))

    turns = _turns(events)
    assert [(turn_end(t) or {}).get("kind") for t in turns] == ["completed", "blocked", "completed", "blocked"], [
        [(e["type"], _text(e)) for e in t] for t in turns
    ]
    one, two, human, three = turns

    # 1. the continuation entered with its exact source, and the model answered it
    sources = [_source_of(e) for e in one if e["type"] == "user/message"]
    assert _source("t1") in sources
    assert [e for e in log if e["type"] == "user/message" and _source_of(e) == _source("t1")]
    assert any(e["type"] == "assistant/message" and _text(e) == "pong: continuation one" for e in one)
    # ... in that agent only
    headless_log = session_log(dsh_home, headless)
    assert not [e for e in headless_log if (_source_of(e) or {}).get("kind") == OWNED]

    # 2. vetoed: it never became part of the conversation, no model step ran; the human
    #    message behind it ran after the wake
    assert not [e for e in events if e["type"] == "user/message" and _source_of(e) == _source("t2")]
    assert not [e for e in two if e["type"] in ("step/start", "assistant/message", "request/context")]
    assert not [e for e in events if "continuation two" in _text(e) and e["type"] == "assistant/message"]
    assert any(e["type"] == "user/message" and _text(e) == "human after the veto" for e in human)
    assert any(e["type"] == "assistant/message" and _text(e) == "pong: human after the veto" for e in human)

    # 3. failed closed: nothing of it entered a model step
    assert not [e for e in events if e["type"] == "user/message" and _source_of(e) == _source("t3")]
    assert not [e for e in three if e["type"] in ("step/start", "assistant/message", "request/context")]
    assert not [e for e in events if "continuation three" in _text(e) and e["type"] == "assistant/message"]
    assert "continuation three" not in json.dumps([e for e in events if e["type"] == "request/context"])
