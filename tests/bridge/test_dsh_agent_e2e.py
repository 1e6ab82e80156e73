"""The ``Agent`` contract on a real DSH host, through the runtime's proxies (``DshAgent``,
started by a ``DshAgentMirror`` as ``loopdock serve`` starts them): ``followup``,
``steer``, ``inject`` and ``cancel`` reach the exact live agent, ``wait_idle`` returns
once what was sent has run (so the runtime's mirror shows it at once), and a message the
host refuses is an error at ``wait_idle``.

`dsh headless` (not in dock mode) loads bridge/dsh_plugin through the patch; the plugin
creates one agent per scenario:

- ``k-follow``: a followup, then a steer into the idle agent, each run by the time
  ``wait_idle`` returns; then a message with no source, which the host refuses
  (``BAD_DATA``): ``wait_idle`` raises MessageRefusedError;
- ``k-inject``: an inject into the idle agent wakes nothing (``wait_idle`` returns with no
  turn), and enters the first step of the turn the next followup opens;
- ``k-cancel``: ``cancel`` ends the running turn ``aborted`` with its cause, and the
  followup queued behind it runs without anyone waking the agent (DSH itself would leave
  it stalled): ``wait_idle`` returns once it has.

A running turn comes from the plugin's ping model: a step whose user text says WAIT streams
``pong: `` and then waits until the turn is cancelled. Offline and quiet: DSH_HOME and HOME
in a temporary directory, telemetry disabled, loopback only. The headless task says HOLD,
so `dsh headless` stays up until the runtime wakes that agent.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import trio

from loopdock import MessageRefusedError, Runtime
from loopdock.bridge import DshAgent, DshAgentMirror, HostHandler, serve_bridge
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log
from loopdock.bridge._dsh_files import event_source as _source_of
from loopdock.bridge._dsh_files import event_text as _text
from loopdock.bridge._dsh_files import message_text as _text_of
from loopdock.bridge._dsh_files import split_turns as _turns
from loopdock.bridge._dsh_files import turn_end as _reason
from loopdock.bridge._patch import write_patch
from loopdock.runtime._messages import Message, TextBlock

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "k" * 20
FOLLOW, INJECT, CANCEL = "k-follow", "k-inject", "k-cancel"
AGENTS = (FOLLOW, INJECT, CANCEL)


def _users(events: list[dict]) -> list[str]:
    """The texts of the person's messages among ``events`` (DSH's runtime-context
    snapshots left out)."""
    return [
        _text(e) for e in events
        if e["type"] == "user/message" and (_source_of(e) or {}).get("kind") != "runtime-context"
    ]


async def test_the_agent_contract_holds_on_a_real_dsh_host(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    with trio.fail_after(180):
        async with Runtime.open(tmp_path / "runtime") as rt:
            handler = HostHandler(rt.dock)

            async def no_driver(proxy: DshAgent) -> None:
                pass

            mirror = DshAgentMirror(handler, no_driver, lambda session_id: tmp_path, frozenset())
            async with trio.open_nursery() as nursery:
                await nursery.start(mirror.run)
                port = await nursery.start(functools.partial(serve_bridge, mirror, token=TOKEN))
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

                    def ends(agent: str, kind: str | None = None) -> int:
                        return sum(
                            1 for e in handler.sessions.get(agent, [])
                            if e.type == "turn/end" and (kind is None or (e.data.get("reason") or {}).get("kind") == kind)
                        )

                    def mirrored(agent: str, text: str) -> bool:
                        return any(
                            e.type == "user/message" and _text_of(e.data) == text for e in handler.sessions.get(agent, [])
                        )

                    await until(lambda: handler.host is not None and all(
                        (p := mirror.proxies.get(a)) is not None and p.running for a in AGENTS
                    ) and any(a not in AGENTS for a in handler.agents))
                    headless = next(a for a in handler.agents if a not in AGENTS)
                    follow, inject, cancel = (mirror.proxies[a] for a in AGENTS)

                    # -- followup and steer: run by the time wait_idle returns
                    first = follow.followup("hello there")
                    await follow.wait_idle()
                    assert ends(FOLLOW, "completed") == 1 and mirrored(FOLLOW, "hello there")
                    follow.steer("steered while idle")
                    await follow.wait_idle()
                    assert ends(FOLLOW, "completed") == 2 and mirrored(FOLLOW, "steered while idle")
                    # -- a message the host refuses (DSH wants a source kind)
                    sourceless = follow.followup(Message("user", (TextBlock("no source"),), None))
                    with pytest.raises(MessageRefusedError) as refused:
                        await follow.wait_idle()
                    await follow.wait_idle()  # raised once

                    # -- inject: wakes nothing, enters the next turn's first step
                    inject.inject("a quiet note")
                    await inject.wait_idle()
                    assert ends(INJECT) == 0 and len(handler.agents[INJECT].inbox) == 1
                    inject.followup("now go")
                    await inject.wait_idle()
                    assert ends(INJECT, "completed") == 1

                    # -- cancel: the running turn ends aborted; what it kept runs on
                    cancel.followup("WAIT to be cancelled")
                    await until(lambda: mirrored(CANCEL, "WAIT to be cancelled"))
                    # the WAIT hook holds the agent's own model call only: DSH's title call
                    # for the session (with the same user text) is answered meanwhile
                    await until(lambda: any(
                        e.type == "session/title" and (e.data.get("source") or {}).get("kind") == "provider"
                        for e in handler.sessions[CANCEL]
                    ))
                    cancel.followup("queued behind the cancel")
                    cancel.cancel("test: stop this turn")
                    await cancel.wait_idle()
                    assert ends(CANCEL, "aborted") == 1 and ends(CANCEL, "completed") == 1

                    # the end: wake the headless agent (its ping call holds until then)
                    await handler.wake(headless)
                    with trio.fail_after(60):
                        code = await proc.wait()
                stderr = (tmp_path / "dsh.err").read_text(errors="replace")
                assert code == 0, stderr
                nursery.cancel_scope.cancel()

    error = refused.value
    assert (error.code, error.message_id, error.host_code) == ("MESSAGE_REFUSED", sourceless.id, "BAD_DATA")
    assert "source" in error.reason
    logs = {agent: [e for e in session_log(dsh_home, agent) if "seq" in e] for agent in AGENTS}

    # -- followup and steer: a person's messages, one turn each; the refused one never logged
    turns = _turns(logs[FOLLOW])
    assert [_reason(t)["kind"] for t in turns] == ["completed", "completed"]
    assert [_users(t) for t in turns] == [["hello there"], ["steered while idle"]]
    said = [e for e in logs[FOLLOW] if e["type"] == "user/message" and _text(e) == "hello there"]
    assert [(e["data"]["id"], _source_of(e)) for e in said] == [(first.id, {"kind": "user"})]
    assert "no source" not in _users(logs[FOLLOW])

    # -- inject: no turn of its own; in the first step of the turn the followup opened
    turns = _turns(logs[INJECT])
    assert [_reason(t)["kind"] for t in turns] == ["completed"]
    assert _users(turns[0]) == ["a quiet note", "now go"]

    # -- cancel: aborted with the runtime's cause, then the kept followup ran
    turns = _turns(logs[CANCEL])
    assert [_reason(t)["kind"] for t in turns] == ["aborted", "completed"]
    assert _reason(turns[0]) == {"kind": "aborted", "reason": {"kind": "hook", "reason": "test: stop this turn"}}
    assert _users(turns[1]) == ["queued behind the cancel"]
