"""The DSH-path fences around an automatic turn, on a real DSH host (issue 36).

`dsh headless` loads bridge/dsh_plugin and, after it, a probe plugin
(``dsh_fence_probe.mjs``) through the patch; the bridge plugin creates one extra agent,
``s-fence``, which the runtime mirrors as a ``DshAgent`` (the ``DshAgentMirror`` is the
handler the bridge serves) and reserves automatic messages on (source kind
``loopx-continuation``), as the LoopX continuation does:

1. the downstream pre-step decision: after the runtime's enter, a later DSH listener (the
   probe) answers nothing, an unknown kind, the message rewritten, the message dropped, a
   person's message added, an error, or a veto. The bridge plugin passes on only a valid
   decision and fails closed on everything else: DSH ends each of those turns ``blocked``,
   the automatic message never enters a model step, and the reservation settles
   ``rejected`` by DSH's own log (a valid decision enters and is ``admitted``);
2. a DSH command is a fence: ``/loopx-init`` (the probe types it; the runtime's handler
   holds it until the test lets it finish) takes the automatic message queued when it
   starts out of DSH's inbox, the runtime's followup of one is refused while it runs, and
   once it is done an automatic message enters again; a command that starts and ends after
   the runtime let a step enter (the probe runs one in its later pre-step listener) still
   keeps that step's automatic message out;
3. input a plugin writes into the agent's inbox on the DSH side competes with an automatic
   message as a person's does: the probe's followup arriving behind a queued automatic
   message, a plugin's message waiting when the runtime's followup arrives, and a person's
   followup arriving behind an automatic message queued for the next step each come
   first, and the automatic message never enters a model step.

Everything is judged on DSH's own session log and on the reservations' states. Offline and
quiet: DSH_HOME and HOME in a temporary directory, telemetry disabled, the plugin's `ping`
model, loopback only. The headless task says HOLD, so `dsh headless` stays up until the
runtime wakes that agent.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from loopdock._runtime import Runtime
from loopdock.actors import CommandResult, PreStep
from loopdock.bridge import DshAgent, DshAgentMirror, HostHandler, serve_bridge
from loopdock.bridge._dsh_agent import COMMAND_RAN, HostCommand
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log, split_turns, turn_end
from loopdock.bridge._dsh_files import event_source as _source_of
from loopdock.bridge._dsh_files import event_text as _text
from loopdock.bridge._patch import write_patch
from loopdock.runtime import Message, ProducerSource, TextBlock

DSH = Path(sys.executable).parent / "dsh"
PROBE = Path(__file__).with_name("dsh_fence_probe.mjs")
TOKEN = "e2e-token-" + "f" * 20
AGENT = "s-fence"
OWNED = "loopx-continuation"
TEST_LIMIT_S = 240


def automatic(text: str, turn_id: str) -> Message:
    """An automatic message as the continuation reserves it (its own turn id)."""
    fields = {"schemaVersion": "test", "goalId": "g", "agentId": "a", "turnInstanceId": turn_id}
    return Message("user", (TextBlock(text),), ProducerSource(OWNED, fields))


def turn_id_of(event: Mapping[str, Any]) -> str | None:
    return (_source_of(event) or {}).get("turnInstanceId")


@attrs.define
class Host:
    """A running `dsh headless` with the probe, the runtime's mirror of it and helpers."""

    handler: HostHandler
    mirror: DshAgentMirror
    proc: trio.Process
    output: Path
    dsh_home: Path

    @property
    def proxy(self) -> DshAgent:
        return self.mirror.proxies[AGENT]

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            if self.proc.returncode is not None:
                pytest.fail(f"dsh exited ({self.proc.returncode}): {self.output.read_text(errors='replace')}")
            with trio.move_on_after(0.5):  # and see whether dsh is still alive
                await self.handler.wait_until(predicate)

    async def idle(self) -> None:
        """Until the agent is idle with nothing queued (as the mirror shows it)."""
        await self.until(lambda: self.proxy.status == "idle" and not self.proxy.live.inbox)

    def log(self) -> list[dict[str, Any]]:
        return [e for e in session_log(self.dsh_home, AGENT) if "seq" in e]


@asynccontextmanager
async def dsh_with_probe(tmp_path: Path, commands: Mapping[str, HostCommand] | None = None) -> AsyncIterator[Host]:
    async with Runtime.open(tmp_path / "runtime") as rt:
        handler = HostHandler(rt.dock)

        async def on_agent(proxy: DshAgent) -> None:
            pass

        mirror = DshAgentMirror(handler, on_agent, lambda _: tmp_path, frozenset({OWNED}), commands=commands)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            port = await nursery.start(functools.partial(serve_bridge, mirror, token=TOKEN))
            patch = write_patch(
                tmp_path / "p", f"ws://127.0.0.1:{port}", TOKEN, ping=True,
                extra={"createAgents": [{"sessionId": AGENT}], "verdictTimeoutMs": TEST_LIMIT_S * 1000},
            )
            rows = yaml.safe_load(patch.read_text())
            rows.append({"insert": [{"id": "fence-probe", "name": str(PROBE), "config": {"ownedKinds": [OWNED]}}]})
            patch.write_text(yaml.safe_dump(rows, sort_keys=False))
            work = tmp_path / "work"
            work.mkdir()
            dsh_home, output = tmp_path / "dsh-home", tmp_path / "dsh.err"
            async with dsh_process(
                DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                cwd=work, env=quiet_env(dsh_home, tmp_path / "home"), output=output,
            ) as proc:
                host = Host(handler, mirror, proc, output, dsh_home)
                await host.until(lambda: (proxy := mirror.proxies.get(AGENT)) is not None and proxy.running
                                 and any(a != AGENT for a in handler.agents))
                yield host
                # the end: wake the headless agent (its ping call holds until then)
                await handler.wake(next(a for a in handler.agents if a != AGENT))
                with trio.fail_after(60):
                    code = await proc.wait()
            assert code == 0, output.read_text(errors="replace")
            nursery.cancel_scope.cancel()


# -- 1. the downstream pre-step decision -----------------------------------------------------

#: What the probe answers after the runtime's enter, none of which may pass.
INVALID = ("none", "unknown", "rewrite", "drop", "add", "throw")


async def test_only_a_valid_downstream_decision_lets_an_automatic_message_enter(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    judged: list[str] = []  # the turn ids the runtime let enter, in order

    async def gate(pre: PreStep, next_):
        judged.extend(m.source.fields["turnInstanceId"] for m in pre.messages
                      if isinstance(m.source, ProducerSource) and m.source.kind == OWNED)
        return await next_(pre)

    states: dict[str, tuple[str, str | None]] = {}
    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path) as host:
            host.proxy.pre_step.add(gate)
            for mode in (*INVALID, "reject", "pass"):
                await host.idle()
                reservation = host.proxy.reserve(automatic(f"DOWNSTREAM {mode}", f"t-{mode}"))
                with trio.fail_after(60):
                    await reservation.wait()
                states[mode] = (reservation.state, reservation.reason)
            await host.idle()
    events = host.log()  # as DSH persisted it, once it exited

    # the runtime let every one of them enter: the probe answered after the bridge plugin
    assert judged == [f"t-{mode}" for mode in (*INVALID, "reject", "pass")]
    for mode in (*INVALID, "reject"):
        assert states[mode] == ("rejected", "the turn ended blocked before the message entered a model step"), (mode, states)
    assert states["pass"] == ("admitted", None)

    # DSH's log: each invalid answer (and the veto) ended its turn blocked before any model
    # step, and nothing of it became part of the conversation
    turns = split_turns(events)
    assert [(turn_end(t) or {}).get("kind") for t in turns] == ["blocked"] * (len(INVALID) + 1) + ["completed"], [
        [(e["type"], _text(e)[:40]) for e in t] for t in turns
    ]
    for turn in turns[:-1]:
        assert not [e for e in turn if e["type"] in ("step/start", "user/message", "assistant/message")], turn
    logged = [turn_id_of(e) for e in events if e["type"] == "user/message" and turn_id_of(e)]
    assert logged == ["t-pass"], logged
    texts = [_text(e) for e in events if e["type"] in ("user/message", "assistant/message")]
    assert not [t for t in texts if "rewritten by a later listener" in t or "smuggled in by a later listener" in t]
    assert "pong: DOWNSTREAM pass" in texts


# -- 2. a DSH command is a fence -----------------------------------------------------------------


async def test_no_automatic_message_is_admitted_across_a_dsh_command(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    started, release = trio.Event(), trio.Event()

    async def init(proxy: DshAgent, args: str) -> CommandResult:  # the runtime's /loopx-init, held
        started.set()
        await release.wait()
        return CommandResult(True, "checked")

    def logged(event_type: str) -> Callable[[], bool]:
        return lambda: any(e.type == event_type for e in host.proxy.session.events)

    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path, {"loopx-init": init}) as host:
            proxy = host.proxy
            await host.idle()
            # a. a person runs /loopx-init (the probe types it) while an automatic message is
            #    queued for the agent's next step
            queued = proxy.reserve(automatic("COMMAND while queued", "t-queued"), "inject")
            with trio.fail_after(60):
                assert await queued.wait() == "cancelled"
                await started.wait()
            assert queued.reason in (COMMAND_RAN, "discarded by the host")
            with trio.fail_after(60):  # taken out of DSH's inbox, not left there
                await host.until(logged("command/run"))
                await host.idle()

            # b. while it runs, the runtime's followup of an automatic message is refused
            refused = proxy.reserve(automatic("while the command runs", "t-refused"))
            with trio.fail_after(60):
                assert await refused.wait() == "cancelled"
            assert refused.reason == "the host did not take it: FENCED"

            # c. once it is done, an automatic message enters again
            release.set()
            await host.until(logged("command/done"))
            after = proxy.reserve(automatic("after the command", "t-after"))
            with trio.fail_after(60):
                assert await after.wait() == "admitted", after.reason
            await host.idle()
            assert queued.message.id not in proxy.live.inbox

            # d. a command starts and ends after the runtime's enter, before the step is entered
            judged = proxy.reserve(automatic("DOWNSTREAM command", "t-judged"))
            with trio.fail_after(60):
                assert await judged.wait() == "rejected", judged.reason
            assert judged.reason == "the turn ended blocked before the message entered a model step"
            await host.idle()
    events = host.log()

    # DSH's log: the queued message was taken out of the inbox (no turn blocked on it), and
    # only the message reserved after the command entered a model step
    assert [turn_id_of(e) for e in events if e["type"] == "user/message" and turn_id_of(e)] == ["t-after"]
    assert [(turn_end(t) or {}).get("kind") for t in split_turns(events)] == ["completed", "blocked"]
    assert len([e for e in events if e["type"] == "agent/inbox/spliced" and e["data"].get("outcome") == "canceled"]) == 1
    runs = [e["seq"] for e in events if e["type"] == "command/run"]
    done = [e["seq"] for e in events if e["type"] == "command/done"]
    entered = next(e["seq"] for e in events if e["type"] == "user/message" and turn_id_of(e) == "t-after")
    assert len(runs) == len(done) == 2 and runs[0] < done[0] < entered < runs[1], (runs, done, entered)


# -- 3. input a plugin (or a person) writes comes first -----------------------------------------

#: How a queued automatic message is retired when input comes first: the runtime saw the
#: input arrive, or DSH's discard of the message (the plugin took it out of the inbox).
WITHDRAWN = ("input a person or a plugin wrote came first", "discarded by the host")


async def test_input_a_plugin_writes_comes_before_an_automatic_message(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path) as host:
            proxy = host.proxy
            await host.idle()
            # a. the probe plugin queues a followup of its own right behind the automatic one
            nudged = proxy.reserve(automatic("NUDGE the agent", "t-nudged"))
            with trio.fail_after(60):
                assert await nudged.wait() == "cancelled"
            assert nudged.reason in WITHDRAWN
            await host.idle()

            # b. a plugin's message waits (queued for the next step without a wake) when the
            #    runtime's followup of an automatic message arrives
            waiting = Message("user", (TextBlock("a plugin's note"),), ProducerSource("some-plugin", {}))
            proxy.inject(waiting)
            await host.until(lambda: waiting.id in proxy.live.inbox)
            refused = proxy.reserve(automatic("after the plugin's note", "t-refused"))
            with trio.fail_after(60):
                assert await refused.wait() == "cancelled"
            assert refused.reason == "the host did not take it: FENCED"
            proxy.followup("a person goes on")  # runs the plugin's note along
            await host.idle()

            # d. a person's followup arrives behind an automatic message queued for the next step
            behind = proxy.reserve(automatic("queued for the next step", "t-behind"), "inject")
            await host.until(lambda: behind.message.id in proxy.live.inbox)
            proxy.followup("a person's question")
            with trio.fail_after(60):
                assert await behind.wait() == "cancelled"
            assert behind.reason in WITHDRAWN
            await host.idle()
            # taken out of DSH's inbox, not left to a pre-step
            assert not {nudged.message.id, behind.message.id} & set(proxy.live.inbox)
    events = host.log()

    # DSH's log: none of the automatic messages entered; the plugin's and the person's input ran
    assert not [e for e in events if e["type"] == "user/message" and turn_id_of(e)]
    said = [_text(e) for e in events if e["type"] == "assistant/message"]
    assert "pong: a plugin nudges the agent" in said, said
    assert "pong: a person goes on" in said and "pong: a person's question" in said, said
    user = [(_source_of(e) or {}).get("kind") for e in events if e["type"] == "user/message"]
    assert "some-plugin" in user and "fence-probe" in user, user
    assert len([e for e in events if e["type"] == "agent/inbox/spliced" and e["data"].get("outcome") == "canceled"]) == 2
