"""Slash commands: the registry, and ``Runtime.execute_command`` logging, errors, failure
isolation, cancellation, and the withdrawal of unadmitted automatic work."""

import pytest
import trio
import trio.testing

from loopdock import (
    Command,
    CommandContext,
    CommandResult,
    Message,
    ProducerSource,
    Runtime,
    TextBlock,
)
from loopdock.actors import (
    CommandRegistry,
    DuplicateCommandError,
    InvalidCommandError,
    UnknownAgentError,
    UnknownCommandError,
)
from loopdock.runtime.models import Reply, ScriptedAdapter

TIMEOUT = 10
SCRIPTED = {"provider": "scripted", "model": "script-1"}


def command(name, run=None, description="test command"):
    async def ok(ctx, args):
        return CommandResult(True, f"ran with {args!r}")

    return Command(name, description, run or ok)


def automatic(text):
    return Message("user", (TextBlock(text),), ProducerSource("test-driver", {"n": text}))


async def command_events(agent):
    return [(e.type, dict(e.data)) for e in (await agent.session.read_events()) if e.type.startswith("command/")]


async def start(rt, adapter, session_id="a1"):
    rt.register_adapter("scripted", adapter)
    handle = await rt.create_agent(session_id=session_id, agent_options=SCRIPTED)
    return handle


# -- the registry ----------------------------------------------------------------------------


def test_register_get_names_and_an_idempotent_disposer():
    registry = CommandRegistry()
    hello = command("hello")
    dispose = registry.register(hello)
    registry.register(command("another"))
    assert registry.get("hello") is hello
    assert registry.names() == ("another", "hello")
    dispose()
    dispose()  # idempotent
    assert registry.get("hello") is None
    again = command("hello")
    registry.register(again)
    dispose()  # an old disposer never removes a newer registration
    assert registry.get("hello") is again


def test_a_duplicate_name_is_a_typed_error():
    registry = CommandRegistry()
    registry.register(command("hello"))
    with pytest.raises(DuplicateCommandError, match="hello") as info:
        registry.register(command("hello"))
    assert info.value.code == "DUPLICATE_COMMAND"


@pytest.mark.parametrize("name", ["", "/hello", "two words", "-dash"])
def test_a_malformed_name_is_refused(name):
    with pytest.raises(InvalidCommandError) as info:
        CommandRegistry().register(command(name))
    assert info.value.code == "INVALID_COMMAND"


def test_parse_splits_name_and_args():
    registry = CommandRegistry()
    hello = command("hello")
    registry.register(hello)
    assert registry.parse("/hello") == (hello, "")
    assert registry.parse("  /hello   a  b \n") == (hello, "a  b")


# -- execute_command ----------------------------------------------------------------------------


async def test_execute_command_logs_run_and_done_and_gives_the_result(tmp_path):
    seen = []

    async def run(ctx, args):
        seen.append(ctx)
        return CommandResult(True, "greeted", {"who": args})

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("hello", run))
            handle = await start(rt, ScriptedAdapter([]))
            result = await rt.execute_command("a1", "/hello  world ")

            assert result == CommandResult(True, "greeted", {"who": "world"})
            assert await command_events(handle.agent) == [
                ("command/run", {"name": "hello", "args": "world"}),
                ("command/done", {"name": "hello", "ok": True, "message": "greeted"}),
            ]
            [ctx] = seen
            assert isinstance(ctx, CommandContext)
            assert (ctx.agent, ctx.owner, ctx.name, ctx.session_id) == (handle.agent, rt.supervisor, "hello", "a1")
            await handle.agent.session.flush()
            stored = [e.type for e in (await handle.agent.session.read_events()) if e.type.startswith("command/")]
            assert stored == ["command/run", "command/done"]


@pytest.mark.parametrize("line", ["/nope", "hello", "", "/", "/hello2 x"])
async def test_an_unknown_command_or_a_line_without_slash_is_a_typed_error(tmp_path, line):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("hello"))
            rt.commands.register(command("bye"))
            handle = await start(rt, ScriptedAdapter([]))
            with pytest.raises(UnknownCommandError, match=r"commands: /bye, /hello") as info:
                await rt.execute_command("a1", line)
            assert info.value.code == "UNKNOWN_COMMAND"
            assert await command_events(handle.agent) == []


async def test_an_unknown_or_disposed_agent_is_a_typed_error(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("hello"))
            with pytest.raises(UnknownAgentError, match="ghost") as info:
                await rt.execute_command("ghost", "/hello")
            assert info.value.code == "UNKNOWN_AGENT"
            handle = await start(rt, ScriptedAdapter([]))
            await handle.dispose()
            with pytest.raises(UnknownAgentError):
                await rt.execute_command("a1", "/hello")


async def test_a_raising_command_gives_ok_false_and_the_agent_keeps_working(tmp_path):
    async def boom(ctx, args):
        raise RuntimeError("/secret/path/in/a/message")

    adapter = ScriptedAdapter(["still here"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("boom", boom))
            handle = await start(rt, adapter)
            result = await rt.execute_command("a1", "/boom")

            assert result.ok is False
            assert result.message == "/boom failed: RuntimeError"  # no raw exception text
            assert (await command_events(handle.agent))[-1] == (
                "command/done", {"name": "boom", "ok": False, "message": "/boom failed: RuntimeError"},
            )
            handle.agent.followup("are you alive?")
            await handle.agent.wait_idle()
            assert not handle.agent.closed
            ends = [e.data["reason"]["kind"] for e in (await handle.agent.session.read_events()) if e.type == "turn/end"]
            assert ends == ["completed"]
            assert len(adapter.requests) == 1


async def test_a_command_returning_no_result_is_reported_not_crashed(tmp_path):
    async def sloppy(ctx, args):
        return "done"

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("sloppy", sloppy))
            await start(rt, ScriptedAdapter([]))
            result = await rt.execute_command("a1", "/sloppy")
            assert (result.ok, result.message) == (False, "/sloppy returned no result")


async def test_command_execution_withdraws_a_pending_reservation(tmp_path):
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply("first", block=gate), "after command"])
    seen_state = []

    async def inspect(ctx, args):
        seen_state.append(reservation.state)  # already withdrawn when the command runs
        return CommandResult(True, "ok")

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("inspect", inspect))
            handle = await start(rt, adapter)
            agent = handle.agent
            agent.followup("start")
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "running"  # the model call is held by the gate
            reservation = agent.reserve(automatic("continue automatically"))
            assert reservation.state == "pending"

            result = await rt.execute_command("a1", "/inspect")

            assert result.ok
            assert seen_state == ["cancelled"]
            assert (reservation.state, reservation.reason) == ("cancelled", "command")
            assert agent.inbox_size == 0
            discards = [
                e for e in (await agent.session.read_events())
                if e.type == "agent/inbox/spliced" and e.data["op"] == "discard"
            ]
            assert [(d.data["messageId"], d.data["reason"]) for d in discards] == [
                (reservation.message.id, "command")
            ]
            # The withdrawal is logged inside the command's run/done bracket.
            [run_seq] = [e.seq for e in (await agent.session.read_events()) if e.type == "command/run"]
            [done_seq] = [e.seq for e in (await agent.session.read_events()) if e.type == "command/done"]
            assert run_seq < discards[0].seq < done_seq

            agent.followup("human")
            gate.set()
            await agent.wait_idle()
            texts = ["".join(b["text"] for b in e.data["content"]) for e in (await agent.session.read_events()) if e.type == "user/message"]
            assert texts == ["start", "human"]


async def test_withdraw_reservations_withdraws_only_reservations(tmp_path):
    gate = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await start(rt, ScriptedAdapter([Reply("held", block=gate), "plain", "plain 2"]))
            agent = handle.agent
            agent.followup("start")
            await trio.testing.wait_all_tasks_blocked()
            first = agent.reserve(automatic("r1"))
            second = agent.reserve(automatic("r2"), placement="inject")
            agent.followup(automatic("plain automatic"))
            assert agent.withdraw_reservations("test") == 2
            assert agent.withdraw_reservations("test") == 0
            assert [(r.state, r.reason) for r in (first, second)] == [("cancelled", "test")] * 2
            assert agent.inbox_size == 1
            gate.set()
            await agent.wait_idle()


async def test_withdraw_takes_a_reservation_or_its_message_id_and_nothing_else(tmp_path):
    gate = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await start(rt, ScriptedAdapter([Reply("held", block=gate), "plain", "plain 2"]))
            agent = handle.agent
            agent.followup("start")
            await trio.testing.wait_all_tasks_blocked()
            first = agent.reserve(automatic("r1"))
            second = agent.reserve(automatic("r2"))
            plain = agent.followup(automatic("plain automatic"))
            assert agent.withdraw(plain.id) is False  # queued, but not a reservation
            assert agent.withdraw(second.message.id, "by id") is True  # as a cluster worker withdraws
            assert agent.withdraw(second.message.id) is False  # gone already
            assert agent.withdraw(first, "by object") is True
            assert [(r.state, r.reason) for r in (first, second)] == [("cancelled", "by object"), ("cancelled", "by id")]
            assert agent.inbox_size == 1
            gate.set()
            await agent.wait_idle()


async def test_disposing_the_agent_cancels_a_running_command(tmp_path):
    started = trio.Event()
    cancelled = []

    async def wait_forever(ctx, args):
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(ctx.cancel_scope.cancel_called)
            raise

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("wait", wait_forever))
            handle = await start(rt, ScriptedAdapter([]))
            results = []

            async def run():
                results.append(await rt.execute_command("a1", "/wait"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await started.wait()
                await handle.dispose()

            assert cancelled == [True]
            assert [(r.ok, r.message) for r in results] == [(False, "/wait was cancelled: the agent stopped")]
            # command/done is logged only if it beats the session's close (a race the
            # disposal decides); when it is there, it says the command did not succeed.
            events = await command_events(handle.agent)
            assert events[0] == ("command/run", {"name": "wait", "args": ""})
            assert all(data["ok"] is False for kind, data in events[1:])
            assert [kind for kind, _ in events[1:]] in ([], ["command/done"])


async def test_a_caller_cancelling_logs_the_command_as_cancelled(tmp_path):
    started = trio.Event()

    async def wait_forever(ctx, args):
        started.set()
        await trio.sleep_forever()

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("wait", wait_forever))
            handle = await start(rt, ScriptedAdapter(["alive"]))
            with trio.CancelScope() as scope:

                async def cancel_once_started():
                    await started.wait()
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_once_started)
                    await rt.execute_command("a1", "/wait x")
            assert scope.cancelled_caught
            assert await command_events(handle.agent) == [
                ("command/run", {"name": "wait", "args": "x"}),
                ("command/done", {"name": "wait", "ok": False, "message": "/wait was cancelled"}),
            ]
            handle.agent.followup("still alive?")
            await handle.agent.wait_idle()
            ends = [e.data["reason"]["kind"] for e in (await handle.agent.session.read_events()) if e.type == "turn/end"]
            assert ends == ["completed"]


async def test_a_command_can_talk_to_its_agent(tmp_path):
    adapter = ScriptedAdapter(["answered"])

    async def ask(ctx, args):
        ctx.agent.followup(f"from command: {args}")
        return CommandResult(True, "queued")

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command("ask", ask))
            handle = await start(rt, adapter)
            assert (await rt.execute_command("a1", "/ask status")).ok
            await handle.agent.wait_idle()
            assert [m.text for m in adapter.requests[0].messages] == ["from command: status"]
