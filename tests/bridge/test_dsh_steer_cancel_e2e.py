"""Steer, inject and cancel from the runtime on a real DSH host (``HostHandler.followup``
with ``placement="steer"``/``"inject"``, ``HostHandler.cancel``).

`dsh headless` (not in dock mode) loads bridge/dsh_plugin through the patch; the plugin
creates four agents, one per scenario, and everything is judged on DSH's own session log
(and on the live inbox events the host streams):

- ``s-inject``: an inject into an idle agent does not wake it (it waits in the inbox for
  the next turn); an inject into a running turn enters that turn's next step: no new
  turn, no wake.
- ``s-steer``: a steer wakes an idle agent (its message enters the new turn's first
  step); a steer into a running turn enters that turn's next step.
- ``s-keep``: ``cancel`` ends the running turn ``aborted`` with the runtime's cause; a
  followup queued behind it stays in the inbox (DSH does not run it by itself) and runs
  once the runtime wakes the agent.
- ``s-drop``: ``cancel(keep_inbox=False)`` also discards the queued followups: the host
  streams ``agent/inbox/discarded`` for each, and they never reach a model.

A running turn comes from the plugin's ping model: a step whose user text says WAIT
streams ``pong: `` and then waits until a steer or an inject reaches that agent's next
step, or the turn is cancelled. Offline and quiet: DSH_HOME and HOME in a temporary
directory, telemetry disabled, loopback only. The headless task says HOLD, so `dsh
headless` stays up until the runtime wakes that agent.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import trio

from loopdock._runtime import Runtime
from loopdock.bridge import serve_bridge
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log
from loopdock.bridge._dsh_files import event_source as _source_of
from loopdock.bridge._dsh_files import event_text as _text
from loopdock.bridge._dsh_files import message_text as _text_of
from loopdock.bridge._dsh_files import split_turns as _turns
from loopdock.bridge._dsh_files import turn_end as _reason
from loopdock.bridge._host_handler import HostHandler
from loopdock.bridge._patch import write_patch

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "s" * 20
INJECT, STEER, KEEP, DROP = "s-inject", "s-steer", "s-keep", "s-drop"
AGENTS = (INJECT, STEER, KEEP, DROP)
USER = {"kind": "user"}


def _message(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}], "source": USER}


def _steps(turn: list[dict]) -> dict[int, list[dict]]:
    """A turn's events by step (from its step/start to its step/end)."""
    steps: dict[int, list[dict]] = {}
    current: list[dict] | None = None
    for event in turn:
        if event["type"] == "step/start":
            current = steps.setdefault(event["data"]["step"], [])
        if current is not None:
            current.append(event)
        if event["type"] == "step/end":
            current = None
    return steps


def _said(events: list[dict], kind: str) -> list[str]:
    """The texts of the ``kind`` messages (``user`` or ``assistant``) among ``events``,
    DSH's runtime-context snapshots left out."""
    return [
        _text(e) for e in events
        if e["type"] == f"{kind}/message"
        and (_source_of(e) or {}).get("kind") != "runtime-context"
    ]


class LiveRecordingHandler(HostHandler):
    """A ``HostHandler`` that also keeps every live item the host sent, in order."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt.dock)
        self.live: list = []

    async def on_live(self, conn, items) -> None:
        self.live.extend(items)
        await super().on_live(conn, items)


async def test_steer_inject_and_cancel_reach_the_running_dsh_turn(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    with trio.fail_after(180):
        async with Runtime.open(tmp_path / "runtime") as rt:
            handler = LiveRecordingHandler(rt)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
                patch = write_patch(
                    tmp_path / "p", f"ws://127.0.0.1:{port}", TOKEN, ping=True,
                    extra={"createAgents": [{"sessionId": a} for a in AGENTS]},
                )
                work = tmp_path / "work"
                work.mkdir()
                async with dsh_process(
                    DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                    cwd=work, env=quiet_env(dsh_home, tmp_path / "home"), output=tmp_path / "dsh.err",
                ) as proc:
                    async def until(predicate) -> None:
                        while not predicate():
                            if proc.returncode is not None:
                                pytest.fail(f"dsh exited ({proc.returncode}): {(tmp_path / 'dsh.err').read_text()}")
                            with trio.move_on_after(0.5):  # and see whether dsh is still alive
                                await handler.wait_until(predicate)

                    def mirrored(agent: str, type_: str, text: str | None = None) -> int:
                        return sum(
                            1 for e in handler.sessions.get(agent, [])
                            if e.type == type_ and (text is None or _text_of(e.data.get("message", e.data)) == text)
                        )

                    def ends(agent: str, kind: str) -> int:
                        return sum(
                            1 for e in handler.sessions.get(agent, [])
                            if e.type == "turn/end" and (e.data.get("reason") or {}).get("kind") == kind
                        )

                    def idle(agent: str) -> bool:
                        return handler.agents[agent].status == "idle"

                    def queued(agent: str, text: str) -> bool:
                        return any(_text_of(m) == text for m in handler.agents[agent].inbox.values())

                    await until(lambda: handler.host is not None and set(AGENTS) <= set(handler.agents)
                                and any(a not in AGENTS for a in handler.agents))
                    headless = next(a for a in handler.agents if a not in AGENTS)

                    # -- inject: into an idle agent it waits for the next turn ...
                    await handler.followup(INJECT, _message("injected while idle"), "inject")
                    await until(lambda: queued(INJECT, "injected while idle"))
                    await handler.followup(INJECT, _message("first turn"))
                    await until(lambda: ends(INJECT, "completed") == 1 and idle(INJECT))
                    # ... into a running turn it enters that turn's next step
                    await handler.followup(INJECT, _message("WAIT for an inject"))
                    await until(lambda: mirrored(INJECT, "user/message", "WAIT for an inject") == 1)
                    assert handler.agents[INJECT].status == "running"
                    await handler.followup(INJECT, _message("injected mid-turn"), "inject")
                    await until(lambda: ends(INJECT, "completed") == 2 and idle(INJECT))

                    # -- steer: it wakes an idle agent ...
                    await handler.followup(STEER, _message("steered while idle"), "steer")
                    await until(lambda: ends(STEER, "completed") == 1 and idle(STEER))
                    # ... and enters a running turn's next step
                    await handler.followup(STEER, _message("WAIT for a steer"))
                    await until(lambda: mirrored(STEER, "user/message", "WAIT for a steer") == 1)
                    await handler.followup(STEER, _message("steered mid-turn"), "steer")
                    await until(lambda: ends(STEER, "completed") == 2 and idle(STEER))

                    # -- cancel, keeping the inbox
                    await handler.followup(KEEP, _message("WAIT to be cancelled"))
                    await until(lambda: mirrored(KEEP, "user/message", "WAIT to be cancelled") == 1)
                    # the WAIT hook holds the agent's own model call only: DSH's title call
                    # for the session (with the same user text) is answered meanwhile
                    await until(lambda: any(
                        e.type == "session/title" and (e.data.get("source") or {}).get("kind") == "provider"
                        for e in handler.sessions[KEEP]
                    ))
                    await handler.followup(KEEP, _message("queued behind the cancel"))
                    await until(lambda: queued(KEEP, "queued behind the cancel"))
                    await handler.cancel(KEEP, "test: stop this turn")
                    await until(lambda: ends(KEEP, "aborted") == 1 and idle(KEEP))
                    # kept, and not run by DSH on its own: waiting for a wake
                    assert queued(KEEP, "queued behind the cancel")
                    assert mirrored(KEEP, "turn/start") == 1
                    await handler.wake(KEEP)
                    await until(lambda: ends(KEEP, "completed") == 1 and idle(KEEP))

                    # -- cancel, discarding the inbox
                    await handler.followup(DROP, _message("WAIT to be cancelled"))
                    await until(lambda: mirrored(DROP, "user/message", "WAIT to be cancelled") == 1)
                    await handler.followup(DROP, _message("dropped one"))
                    await handler.followup(DROP, _message("dropped two"))
                    await until(lambda: queued(DROP, "dropped one") and queued(DROP, "dropped two"))
                    dropped_ids = {i for i, m in handler.agents[DROP].inbox.items()}
                    await handler.cancel(DROP, "test: drop everything", keep_inbox=False)
                    await until(lambda: ends(DROP, "aborted") == 1 and idle(DROP) and not handler.agents[DROP].inbox)
                    discarded = [i for i in handler.live if i.agent_id == DROP and i.type == "agent/inbox/discarded"]
                    assert {i.data["message"]["id"] for i in discarded} == dropped_ids
                    assert sorted(_text_of(i.data["message"]) for i in discarded) == ["dropped one", "dropped two"]
                    # gone from DSH's inbox too: the next turn sees only the new message
                    await handler.followup(DROP, _message("after the drop"))
                    await until(lambda: ends(DROP, "completed") == 1 and idle(DROP))

                    # the end: wake the headless agent (its ping call holds until then)
                    await handler.wake(headless)
                    with trio.fail_after(60):
                        code = await proc.wait()
                stderr = (tmp_path / "dsh.err").read_text(errors="replace")
                assert code == 0, stderr
                nursery.cancel_scope.cancel()

    logs = {agent: [e for e in session_log(dsh_home, agent) if "seq" in e] for agent in AGENTS}
    for agent in AGENTS:
        # the runtime's mirror is DSH's own log, event for event
        assert [(e.seq, e.type) for e in handler.sessions[agent]] == [(e["seq"], e["type"]) for e in logs[agent]][: len(handler.sessions[agent])]
        assert handler.gaps == []

    # -- inject
    log = logs[INJECT]
    turns = _turns(log)
    assert [_reason(t)["kind"] for t in turns] == ["completed", "completed"], turns
    first, second = turns
    # the idle inject did not wake the agent: the first turn started only after the followup,
    # and both messages entered its first step (the next-step input first)
    splices = [e for e in log if e["type"] == "agent/inbox/spliced" and e["data"].get("inserted")]
    assert [(e["data"]["target"], _text_of(e["data"]["inserted"][0])) for e in splices[:2]] == [
        ("next-step", "injected while idle"), ("next-turn", "first turn"),
    ]
    assert splices[0]["seq"] < splices[1]["seq"] < first[0]["seq"]
    assert _said(_steps(first)[1], "user") == ["injected while idle", "first turn"]
    # the inject into the running turn: the same turn's next step, no new turn
    steps = _steps(second)
    assert sorted(steps) == [1, 2]
    assert _said(steps[1], "user") == ["WAIT for an inject"]
    assert _said(steps[1], "assistant") == ["pong: WAIT for an inject"]
    assert _said(steps[2], "user") == ["injected mid-turn"]
    assert _said(steps[2], "assistant") == ["pong: injected mid-turn"]
    assert [e["type"] for e in log].count("turn/start") == 2

    # -- steer
    log = logs[STEER]
    turns = _turns(log)
    assert [_reason(t)["kind"] for t in turns] == ["completed", "completed"], turns
    first, second = turns
    steer = next(e for e in log if e["type"] == "agent/inbox/spliced" and e["data"].get("inserted"))
    assert steer["data"]["target"] == "next-step" and steer["seq"] < first[0]["seq"]
    assert _said(_steps(first)[1], "user") == ["steered while idle"]
    assert _said(first, "assistant") == ["pong: steered while idle"]
    steps = _steps(second)
    assert sorted(steps) == [1, 2]
    assert _said(steps[1], "user") == ["WAIT for a steer"]
    assert _said(steps[2], "user") == ["steered mid-turn"]
    assert _said(steps[2], "assistant") == ["pong: steered mid-turn"]

    # -- cancel, keeping the inbox
    log = logs[KEEP]
    turns = _turns(log)
    assert [_reason(t)["kind"] for t in turns] == ["aborted", "completed"], turns
    cancelled, kept = turns
    # the runtime's cancel is a hook's, and DSH keeps its cause
    assert _reason(cancelled) == {"kind": "aborted", "reason": {"kind": "hook", "reason": "test: stop this turn"}}
    assert sorted(_steps(cancelled)) == [1]
    # the model's answer was cut off where the cancel found it
    [interrupted] = [e for e in cancelled if e["type"] == "assistant/message"]
    assert interrupted["data"].get("interrupted") is True and _text(interrupted) == "pong: "
    assert "pong: WAIT to be cancelled" not in _said(log, "assistant")
    assert _said(kept, "user") == ["queued behind the cancel"]
    assert _said(kept, "assistant") == ["pong: queued behind the cancel"]
    assert not [i for i in handler.live if i.agent_id == KEEP and i.type == "agent/inbox/discarded"]
    assert not [e for e in log if e["type"] == "agent/inbox/spliced" and e["data"].get("outcome") == "canceled"]

    # -- cancel, discarding the inbox
    log = logs[DROP]
    turns = _turns(log)
    assert [_reason(t)["kind"] for t in turns] == ["aborted", "completed"], turns
    cancelled, after = turns
    assert _reason(cancelled) == {"kind": "aborted", "reason": {"kind": "hook", "reason": "test: drop everything"}}
    dropped = [e for e in log if e["type"] == "agent/inbox/spliced" and e["data"].get("outcome") == "canceled"]
    assert [(e["data"]["target"], e["data"].get("removedCount")) for e in dropped] == [("next-turn", 2)]
    assert _said(after, "user") == ["after the drop"]
    said = _said(log, "user") + _said(log, "assistant")
    assert not [t for t in said if "dropped" in t]
