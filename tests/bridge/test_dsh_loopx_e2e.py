"""The LoopX continuation on a real DSH session bound in real LoopX, and ``/loopx-init`` run by
a DSH user (issue 5, test 3).

`dsh headless` loads bridge/dsh_plugin through the patch and creates one extra agent,
``s-loopx``. The runtime mirrors it as a ``DshAgent`` proxy (the ``DshAgentMirror`` is the
handler the bridge serves) and attaches the unchanged ``LoopxContinuation`` to it, exactly
as it does for its own agents. The goal is bound to that session with the real CLI, then:

1. before the session invokes the ``loopx`` skill the driver stays passive;
2. the *model* invokes it: the plugin's ping model calls DSH's ``skill`` tool with
   ``{"name": "loopx"}`` (a skill installed in the project), DSH logs the call and its
   successful result in its own format, and that activates the driver. At the next idle
   the driver asks should-run with one fresh turn id, and one followup with the
   ``loopx-continuation`` source enters DSH, admitted at DSH's pre-step after the driver
   replayed should-run with that same turn id;
3. the test settles that turn in LoopX (writeback and spend under its exact identity, as
   the model would through its shell), so the driver continues again; that continuation
   is vetoed at pre-step by another listener: DSH ends it ``blocked`` and it never reaches
   a model step; the continuation is then quiet (latched) until a person acts, and asks
   LoopX nothing more;
4. a reservation DSH itself discards (a cancel that drops the inbox) is retired at once:
   DSH's own ``agent/inbox/discarded`` settles it ``cancelled``.

A second test runs ``/loopx-init`` as a DSH command (the plugin registers it; DSH executes
it as its web UI would): the runtime initialises LoopX for that agent and DSH's own log
records the command's success and the start and result messages.

Offline and quiet: temporary DSH_HOME and HOME, telemetry disabled, the plugin's `ping`
model, LoopX on Node 22 with its usage ping off, loopback only.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import trio

from loopdock import LoopxSettings
from loopdock._bridge import dsh_loopx_init
from loopdock._runtime import Runtime
from loopdock.actors import PreStep, Reject
from loopdock.actors.loopx import INIT_COMMAND_NAME, INIT_SOURCE_KIND
from loopdock.actors.loopx._continuation import continuation_message
from loopdock.bridge import DshAgentMirror, HostHandler, serve_bridge
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log, turn_end
from loopdock.bridge._dsh_files import event_source as _source_of
from loopdock.bridge._dsh_files import event_text as _text
from loopdock.bridge._dsh_files import split_turns as _turns
from loopdock.bridge._patch import write_patch
from loopdock.runtime.loopx import HOST_SURFACE, LoopxClient, LoopxOk, ShouldRun

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "x" * 20
SESSION = "s-loopx"
GOAL, LX_AGENT = "goal-dsh", "agent-dsh"
OWNED = "loopx-continuation"
# Placeholders LoopX leaves in its writeback template for the agent to fill in.
FILL = {
    "<validated_progress>": "the session went on",
    "<scale>": "single_surface",
    "<outcome>": "outcome_progress",
    "<boundary>": "in_flight_continuation",
}
# A person's message asking the ping model to call DSH's skill tool (its `call:` hook).
ACTIVATE = {
    "role": "user",
    "content": [{"type": "text", "text": 'call: skill {"name": "loopx"}'}],
    "source": {"kind": "user"},
}
HOLD = {"role": "user", "content": [{"type": "text", "text": "HOLD while a continuation waits"}], "source": {"kind": "user"}}


class RecordingClient(LoopxClient):
    """The real client, recording the turn id of every should-run call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.should_runs: list[str] = []
        self.answers: list = []
        self.settled: list = []

    async def should_run(self, goal_id, agent_id, turn_id):
        self.should_runs.append(turn_id)
        return await super().should_run(goal_id, agent_id, turn_id)

    async def run(self, *args, retry=False):
        answer = await super().run(*args, retry=retry)
        self.answers.append((args[:2], answer))
        return answer


async def ok(client: LoopxClient, *args: str) -> dict:
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return dict(result.payload)


async def settle(client: RecordingClient, turn_id: str) -> None:
    """Run the settlement plan LoopX gave with ``turn_id``'s admission: writeback, spend."""
    (admission,) = [a for args, a in client.answers if args == ("quota", "should-run") and isinstance(a, LoopxOk)
                    and a.payload["heartbeat_receipt"]["turn_instance_id"] == turn_id][:1]
    plan = admission.payload["interaction_contract"]["cli_channel"]["settlement_plan"]
    for kind in ("durable_writeback", "quota_spend"):
        (step,) = [s for s in plan["ordered_steps"] if s["kind"] == kind]
        template = step["command_template"]
        for placeholder, value in FILL.items():
            template = template.replace(placeholder, shlex.quote(value))
        argv = shlex.split(template)[1:]  # without the leading ``loopx``
        argv = [a for a in argv if a not in ("--registry", ".loopx/registry.json", "--format", "json")]
        client.settled.append((kind, await client.run(*argv)))


async def test_the_loopx_driver_continues_a_real_dsh_session(tmp_path, loopx_env, loopx_command, loopx_project):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    write_loopx_skill(loopx_project)
    cli = LoopxClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(240):
        await ok(cli, "bootstrap", "--project", ".", "--goal-id", GOAL, "--objective", "Keep the DSH session going",
                 "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
        await ok(cli, "register-agent", "--goal-id", GOAL, "--agent-id", LX_AGENT, "--require-new", "--execute")
        await ok(cli, "bind-agent-thread", "--goal-id", GOAL, "--thread-id", SESSION,
                 "--host-surface", HOST_SURFACE, "--agent-id", LX_AGENT, "--execute")
        await ok(cli, "todo", "add", "--goal-id", GOAL, "--project", ".", "--role", "agent",
                 "--claimed-by", LX_AGENT, "--task-class", "advancement_task", "--text", "[P0] Keep going")

    dsh_home = tmp_path / "dsh-home"
    seen: list[tuple[str, ...]] = []  # the continuation turn ids of each pre-step the proxy judged

    async def settle_then_veto(pre: PreStep, next_):
        """An inner pre-step listener (the driver's own is outermost, so its checks have
        passed). The first continuation is settled in LoopX as the model would settle it
        through its shell (writeback, then spend, under the turn's exact identity) and
        goes on; a later one is vetoed."""
        turns = tuple(m.source.fields["turnInstanceId"] for m in pre.messages if m.source and m.source.kind == OWNED)
        seen.append(turns)
        if len(seen) == 1:
            await settle(client, turns[0])
            return await next_(pre)
        return Reject("test: not now")

    settings = LoopxSettings(env=loopx_env, command=tuple(loopx_command), timeout=120, initialize=False)
    with trio.fail_after(480):
        async with Runtime.open(tmp_path / "runtime", loopx=settings) as rt:
            handler = HostHandler(rt.dock)
            # DSH announces each session's cwd: the fallback is never used here
            mirror = DshAgentMirror(handler, rt.loopx.start_continuation, lambda _: tmp_path / "elsewhere", frozenset({OWNED}))
            async with trio.open_nursery() as nursery:
                await nursery.start(mirror.run)
                port = await nursery.start(lambda task_status: serve_bridge(mirror, token=TOKEN, task_status=task_status))
                patch = write_patch(
                    tmp_path / "p", f"ws://127.0.0.1:{port}", TOKEN, ping=True,
                    extra={"createAgents": [{"sessionId": SESSION}], "verdictTimeoutMs": 240000},
                )
                async with dsh_process(
                    DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                    cwd=loopx_project, env=quiet_env(dsh_home, tmp_path / "home"), output=tmp_path / "dsh.err",
                ) as proc:
                    async def until(predicate) -> None:
                        while not predicate():
                            if proc.returncode is not None:
                                pytest.fail(f"dsh exited ({proc.returncode}): {(tmp_path / 'dsh.err').read_text()}")
                            with trio.move_on_after(0.5):  # and see whether dsh is still alive
                                await handler.wait_until(predicate)

                    def mirrored() -> bool:
                        live = handler.agents.get(SESSION)
                        proxy = mirror.proxies.get(SESSION)
                        return live is not None and live.source == "startup" and proxy is not None \
                            and proxy.live is live and SESSION in rt.loopx.continuations

                    await until(mirrored)
                    proxy = mirror.proxies[SESSION]
                    driver = rt.loopx.continuations[SESSION]
                    assert driver.agent is proxy
                    client = RecordingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
                    driver.clients = lambda: client
                    proxy.pre_step.add(settle_then_veto)
                    assert proxy.cwd == loopx_project and proxy.session.header.forked_events == 0

                    # 1. passive: idle checkpoints pass, nothing is asked or reserved
                    await driver.wait_checkpoint(0)
                    assert not driver.activation.active
                    assert (client.should_runs, driver.pending, driver.admitted) == ([], None, [])

                    # 2. the model calls the skill tool: DSH's own tool result activates the
                    #    driver, and one continuation is admitted
                    await handler.followup(SESSION, ACTIVATE)
                    await until(lambda: len(driver.admitted) == 1 or driver.stopped)
                    assert driver.admitted, (driver.stopped, client.answers)
                    (first,) = driver.admitted
                    assert driver.activation.active
                    # asked once at the idle checkpoint, replayed once at DSH's pre-step
                    assert client.should_runs[:2] == [first, first]
                    assert seen[0] == (first,)

                    # 3. the next continuation is vetoed: blocked in DSH, then quiet
                    await until(lambda: len(seen) >= 2 and driver.status.state == "quiet")
                    assert [(kind, type(r)) for kind, r in client.settled] == [
                        ("durable_writeback", LoopxOk), ("quota_spend", LoopxOk)
                    ], client.settled
                    assert driver.status.reason.startswith("the last turn was blocked")
                    assert driver.admitted == [first]
                    second = seen[1][0]
                    assert second != first
                    asked = len(client.should_runs)
                    await until(lambda: proxy.status == "idle" and not proxy.live.inbox)

                    # 4. DSH discards a waiting reservation: it is retired at once
                    await handler.followup(SESSION, HOLD)
                    await until(lambda: proxy.status == "running")
                    waiting = proxy.reserve(continuation_message("wait for it", GOAL, LX_AGENT, "ld-discarded"))
                    await until(lambda: any(m.get("id") == waiting.message.id for m in proxy.live.inbox.values()))
                    await handler.cancel(SESSION, "the person pressed stop", keep_inbox=False)
                    with trio.fail_after(60):
                        assert await waiting.wait() == "cancelled"
                    assert waiting.reason == "discarded by the host"
                    await until(lambda: proxy.status == "idle")
                    assert len(client.should_runs) == asked  # quiet: it asked LoopX nothing more

                    # the end: wake the headless agent (its ping call holds until then)
                    headless = next(a for a in handler.agents if a != SESSION)
                    await handler.wake(headless)
                    with trio.fail_after(60):
                        code = await proc.wait()
                assert code == 0, (tmp_path / "dsh.err").read_text(errors="replace")
                nursery.cancel_scope.cancel()

    # DSH's own log: the model's skill call and its result, the admitted continuation with
    # its exact source, the veto, the discard
    events = [e for e in session_log(dsh_home, SESSION) if "seq" in e]
    (call,) = [e for e in events if e["type"] == "tool/call"]
    assert (call["data"]["name"], json.loads(call["data"]["arguments"])) == ("skill", {"name": "loopx"})
    (result,) = [e for e in events if e["type"] == "tool/result"]
    assert result["data"]["message"]["toolCallId"] == call["data"]["callId"]
    assert result["data"]["message"]["isError"] is False
    turns = _turns(events)
    assert [(turn_end(t) or {}).get("kind") for t in turns] == ["completed", "completed", "blocked", "aborted"], [
        [(e["type"], _text(e)[:40], e["data"].get("reason")) for e in t] for t in turns
    ]
    _activation, continued, vetoed, _held = turns
    (message,) = [e for e in continued if e["type"] == "user/message" and (_source_of(e) or {}).get("kind") == OWNED]
    assert _source_of(message) == {
        "kind": OWNED, "schemaVersion": "loopx_dsh_continuation_v0",
        "goalId": GOAL, "agentId": LX_AGENT, "turnInstanceId": first,
    }
    assert str(loopx_project) not in _text(message)
    assert any(e["type"] == "assistant/message" and _text(e).startswith("pong: ") for e in continued)
    assert not [e for e in vetoed if e["type"] in ("user/message", "assistant/message", "request/context")]
    assert not [e for e in events if (_source_of(e) or {}).get("turnInstanceId") in (second, "ld-discarded")]
    assert any(e["type"] == "agent/inbox/spliced" and e["data"].get("outcome") == "canceled" for e in events)

    # LoopX holds one receipt for the admitted turn: asking again replays it
    with trio.fail_after(120):
        replay = await cli.should_run(GOAL, LX_AGENT, first)
    assert isinstance(replay, ShouldRun) and replay.receipt_status == "replayed"


def write_loopx_skill(project: Path) -> None:
    folder = project / ".agents" / "skills" / "loopx"
    folder.mkdir(parents=True, exist_ok=True)
    folder.joinpath("SKILL.md").write_text("---\nname: loopx\ndescription: test skill\n---\nUse loopx.\n")


async def test_a_dsh_user_runs_loopx_init_through_the_plugin(tmp_path, loopx_env, loopx_project):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    agents_home = tmp_path / "agents"
    env = {**loopx_env, "DSH_AGENTS_HOME": str(agents_home)}
    dsh_home = tmp_path / "dsh-home"
    settings = LoopxSettings(env=env, timeout=120, initialize=False)
    with trio.fail_after(480):
        async with Runtime.open(tmp_path / "runtime", loopx=settings) as rt:
            handler = HostHandler(rt.dock)
            mirror = DshAgentMirror(
                handler, rt.loopx.start_continuation, lambda _: loopx_project, frozenset({OWNED}),
                commands={INIT_COMMAND_NAME: dsh_loopx_init(rt.loopx)},
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(mirror.run)
                port = await nursery.start(lambda task_status: serve_bridge(mirror, token=TOKEN, task_status=task_status))
                patch = write_patch(
                    tmp_path / "p", f"ws://127.0.0.1:{port}", TOKEN, ping=True,
                    extra={"createAgents": [{"sessionId": SESSION}],
                           "runCommands": [{"sessionId": SESSION, "line": "/loopx-init"}]},
                )
                async with dsh_process(
                    DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                    cwd=loopx_project, env=quiet_env(dsh_home, tmp_path / "home"), output=tmp_path / "dsh.err",
                ) as proc:
                    def initialized() -> bool:
                        events = handler.sessions.get(SESSION, [])
                        done = [e for e in events if e.type == "command/done"]
                        results = [e for e in events if e.type == "user/message"
                                   and e.data.get("source", {}).get("phase") == "result"]
                        return bool(done) and bool(results) and proc.returncode is None
                    while not initialized():
                        assert proc.returncode is None, (tmp_path / "dsh.err").read_text(errors="replace")
                        with trio.move_on_after(0.5):
                            await handler.wait_until(initialized)
                    headless = next(a for a in handler.agents if a != SESSION)
                    await handler.wake(headless)
                    with trio.fail_after(60):
                        code = await proc.wait()
                assert code == 0, (tmp_path / "dsh.err").read_text(errors="replace")
                nursery.cancel_scope.cancel()
            adopted = rt.loopx.command

    events = [e for e in session_log(dsh_home, SESSION) if "seq" in e]
    (run,) = [e for e in events if e["type"] == "command/run"]
    (done,) = [e for e in events if e["type"] == "command/done"]
    assert run["data"]["name"] == "loopx-init"
    assert done["data"]["kind"] == "success" and "LoopX CLI 2.1.1 is ready" in done["data"]["text"]
    phases = [(_source_of(e) or {}).get("phase") for e in events
              if e["type"] == "user/message" and (_source_of(e) or {}).get("kind") == INIT_SOURCE_KIND]
    assert phases == ["start", "result"]
    assert (agents_home / "skills" / "loopx" / "SKILL.md").is_file()
    assert Path(adopted[-1]).name == "loopx"
