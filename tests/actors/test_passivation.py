"""Agents as virtual actors (docs/lifecycle.md): an idle agent is passivated after the
policy, and its next message brings it back through the resume path, exactly once,
in order, a person's message first; the object its callers hold stays valid."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import tracemalloc

import pytest
import trio
import trio.testing
from leak_check import assert_no_leaked_agent_tasks

from loopdock import (
    AgentClosedError,
    AgentPassivatedError,
    AgentReactivationError,
    Message,
    ProducerSource,
    Runtime,
    TextBlock,
)
from loopdock.actors._lifecycle import Kept
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

AFTER = 60.0  # passivate_after in these tests (trio's autojump clock makes it instant)


def automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), ProducerSource("test-driver", {"n": text}))


async def passivated(rt: Runtime, agent, live) -> None:
    """Wait (on the live stream, not a sleep) until ``agent`` is passivated."""
    while not (agent.passivated and not agent._passive.transition):
        event = await live.receive()
        if event.type == "agent/passivated" and event.agent_id == agent.id:
            break
    assert agent.passivated


async def user_texts(agent) -> list[str]:
    return [
        "".join(b["text"] for b in e.data["content"] if b.get("type") == "text")
        for e in await agent.session.read_events()
        if e.type == "user/message"
    ]


@pytest.fixture
async def prt(tmp_path):
    async with Runtime.open(tmp_path / "home", passivate_after=AFTER) as runtime:
        yield runtime
        assert_no_leaked_agent_tasks(runtime)


async def test_an_idle_agent_is_passivated_after_the_policy_and_not_before(prt, autojump_clock):
    live = prt.subscribe_live()
    handle = await prt.create_agent(session_id="a1")
    agent = handle.agent
    agent.followup("hello")
    await agent.wait_idle()
    await trio.sleep(AFTER - 1)
    assert not agent.passivated and agent.status == "idle"
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    # What is left: the id, the owner and the record; the object is the one held.
    assert set(vars(agent)) == {"id", "owner", "_passive"}
    assert prt.get_agent("a1") is agent and prt.list_agents() == ["a1"]
    assert agent.status == "idle" and agent.inbox_size == 0 and not agent.closed
    assert "a1" not in prt.supervisor.sessions
    await agent.wait_idle()  # a passivated agent with nothing sent to it is idle
    with pytest.raises(AgentPassivatedError, match="activate"):
        agent.options  # noqa: B018
    with pytest.raises(AgentPassivatedError):
        agent.session.event_count  # noqa: B018


async def test_the_default_policy_is_five_minutes_and_none_turns_it_off(tmp_path, autojump_clock):
    async with Runtime.open(tmp_path / "a") as rt:
        assert rt.supervisor.lifecycle.passivate_after == 300.0
    async with Runtime.open(tmp_path / "b", passivate_after=None) as rt:
        agent = (await rt.create_agent(session_id="a1")).agent
        await trio.sleep(86_400)
        assert not agent.passivated
        assert_no_leaked_agent_tasks(rt)
    with pytest.raises(ValueError, match="passivate_after"):
        async with Runtime.open(tmp_path / "c", passivate_after=0):
            pass


async def test_nothing_is_passivated_without_persistence(tmp_path, autojump_clock):
    async with Runtime.open(tmp_path / "home", passivate_after=AFTER, persist=False) as rt:
        agent = (await rt.create_agent(session_id="a1")).agent
        await trio.sleep(AFTER * 10)
        assert not agent.passivated


@pytest.mark.parametrize("kind", ["followup", "steer", "inject", "reserve"])
async def test_each_kind_of_message_reactivates_the_agent_held_by_its_caller(prt, autojump_clock, kind):
    live = prt.subscribe_live()
    handle = await prt.create_agent(session_id="a1")
    agent = handle.agent
    agent.followup("first")
    await agent.wait_idle()
    before = await agent.session.read_events()
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    reservation = None
    if kind == "reserve":
        reservation = agent.reserve(automatic("second"))
    else:
        getattr(agent, kind)("second")
    assert agent.inbox_size == 1 and agent.passivated  # queued, in arrival order
    if kind == "inject":  # it comes back, but an inject wakes nobody
        with trio.fail_after(AFTER * 3):
            await agent.activate()
        assert agent.inbox_size == 1
        await trio.sleep(AFTER * 5)
        assert not agent.passivated  # a queued message keeps it active
        agent.followup("third")
    with trio.fail_after(AFTER * 3):
        await agent.wait_idle()
    assert not agent.passivated and prt.get_agent("a1") is agent is handle.agent
    assert prt.supervisor.lifecycle.reactivations == 1
    if reservation is not None:
        assert await reservation.wait() == "admitted"
    events = await agent.session.read_events()
    assert [e.seq for e in events] == list(range(len(events)))
    assert [(e.type, e.data) for e in events[: len(before)]] == [(e.type, e.data) for e in before]
    texts = await user_texts(agent)
    # An inject enters the next turn's first step, after the message that opened it.
    assert texts == (["first", "third", "second"] if kind == "inject" else ["first", "second"])
    transcript = await agent.read_transcript()
    assert transcript[-1].text.startswith("pong: ")


async def test_passivating_and_reactivating_write_nothing_to_the_log(prt, autojump_clock):
    live = prt.subscribe_live()
    agent = (await prt.create_agent(session_id="a1")).agent
    agent.followup("hello")
    await agent.wait_idle()
    for _ in range(3):
        before = await agent.session.read_events()
        with trio.fail_after(AFTER * 3):
            await passivated(prt, agent, live)
        assert await agent.session.read_events() == before  # read from the store meanwhile
        assert [m.text for m in await agent.read_transcript()] == ["hello", "pong: hello"]
        with trio.fail_after(AFTER * 3):
            await agent.activate()
        assert agent.session.event_count == len(before)
        assert await agent.session.read_events() == before
    assert prt.supervisor.lifecycle.reactivations == 3


async def test_an_owner_that_releases_agents_itself_gets_the_quiescent_ones_once_due(prt, autojump_clock):
    # As a cluster worker's shard host does (Lifecycle.release): same policy, no shell kept.
    lifecycle = prt.supervisor.lifecycle
    handles = {s: await prt.create_agent(session_id=s) for s in ("idle", "held", "kept")}
    released: list[tuple[str, float]] = []

    async def release(agent) -> bool:
        assert lifecycle.why_active(agent) is None  # quiescent: no checkpoint since the check
        released.append((agent.id, trio.current_time()))
        if agent.id == "kept":
            return False  # not now (e.g. the host is handing a batch over): offered again later
        await handles[agent.id].dispose()
        return True

    lifecycle.release = release
    start = trio.current_time()
    with handles["held"].agent.keep_active(), trio.fail_after(AFTER * 3):
        await lifecycle.wait_until(lambda: lifecycle.passivations == 1 and len(released) == 2)
    assert sorted(r[0] for r in released) == ["idle", "kept"] and min(r[1] for r in released) >= start + AFTER
    with trio.fail_after(AFTER * 3):
        await lifecycle.wait_until(lambda: lifecycle.passivations == 2)  # one period after the hold
    assert handles["idle"].agent.closed and handles["held"].agent.closed
    assert not any(h.agent.passivated for h in handles.values())  # never passivated in place
    await trio.sleep(AFTER * 10 + 1)
    # A released agent is no candidate any more; the one refused is offered once a period.
    assert [r[0] for r in released if r[0] != "kept"] == ["idle", "held"]
    kept = [r[1] for r in released if r[0] == "kept"]
    assert len(kept) >= 10 and all(b - a == pytest.approx(AFTER) for a, b in zip(kept, kept[1:], strict=False))


async def test_an_owner_that_keeps_nothing_is_not_given_an_agent_a_companion_keeps_state_of(prt, autojump_clock):
    # A cluster worker keeps nothing of an agent it lets go: one whose companion keeps state
    # in memory across a passivation (a LoopX wait) must stay active there.
    lifecycle = prt.supervisor.lifecycle
    keeping = (await prt.create_agent(session_id="keeping")).agent
    plain = (await prt.create_agent(session_id="plain")).agent
    lifecycle.keepers.append(lambda agent: Kept("memo", "state", None) if agent is keeping else None)
    released: list[str] = []

    async def release(agent) -> bool:
        released.append(agent.id)
        return True

    lifecycle.release = release
    with trio.fail_after(AFTER * 10):
        await lifecycle.wait_until(lambda: released == ["plain"])
        await trio.sleep(AFTER * 5)
    assert released == ["plain"] and not keeping.passivated and not keeping.closed
    assert not plain.passivated  # let go of by the owner, not passivated in place


async def test_many_racing_messages_make_one_reactivation_and_run_in_order(prt, autojump_clock):
    live = prt.subscribe_live()
    agent = (await prt.create_agent(session_id="a1")).agent
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    sent: list[str] = []

    async def send(i: int) -> None:
        await trio.sleep(0.001 * (i % 7))  # interleaved with the reactivation under way
        sent.append(f"m{i}")
        agent.followup(f"m{i}")

    async with trio.open_nursery() as nursery:
        for i in range(30):
            nursery.start_soon(send, i)
    with trio.fail_after(AFTER * 3):
        await agent.wait_idle()
    assert prt.supervisor.lifecycle.reactivations == 1
    assert await user_texts(agent) == sent
    turns = [e for e in await agent.session.read_events() if e.type == "turn/end"]
    assert len(turns) == 30 and all(e.data["reason"]["kind"] == "completed" for e in turns)


async def test_a_message_sent_while_the_agent_passivates_brings_it_back(prt, autojump_clock):
    agent = (await prt.create_agent(session_id="a1")).agent
    asked = trio.Event()

    def veto(candidate):
        if candidate is agent:
            asked.set()  # the last check: passivation starts right after it, at once
        return None

    prt.supervisor.lifecycle.vetoes.append(veto)
    await asked.wait()  # we run once the passivation waits for the agent's task to end
    assert agent.passivated and agent._passive.transition
    agent.followup("during")
    lifecycle = prt.supervisor.lifecycle
    with trio.fail_after(AFTER * 3):
        await agent.wait_idle()
    assert (lifecycle.passivations, lifecycle.reactivations) == (1, 1)
    assert not agent.passivated and await user_texts(agent) == ["during"]


async def test_a_persons_message_comes_first_across_the_boundary(prt, autojump_clock):
    live = prt.subscribe_live()
    agent = (await prt.create_agent(session_id="a1")).agent
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    reservation = agent.reserve(automatic("automatic reserved"))
    agent.followup(automatic("automatic plain"))
    agent.followup("from a person")
    assert agent.has_pending_human_input()
    with trio.fail_after(AFTER * 3):
        await agent.wait_idle()
    # The person's message displaced the reservation and opened the first turn.
    assert await reservation.wait() == "cancelled" and reservation.reason == "human-input"
    assert await user_texts(agent) == ["from a person", "automatic plain"]


async def test_a_failed_reactivation_keeps_the_messages_queued_and_is_tried_again(prt, autojump_clock):
    live = prt.subscribe_live()
    fail = [False]

    def setup(ctx):
        if fail[0]:
            raise RuntimeError("the setup cannot run now")

    agent = (await prt.create_agent(session_id="a1", setup=setup)).agent
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    fail[0] = True
    message = agent.followup("kept")
    with trio.fail_after(AFTER * 3):
        with pytest.raises(AgentReactivationError, match="setup"):
            await agent.wait_idle()
    assert agent.passivated and agent.inbox_size == 1  # not lost
    assert "a1" not in prt.supervisor.sessions and prt.get_agent("a1") is agent
    assert_no_leaked_agent_tasks(prt)  # no half-built actor left
    fail[0] = False
    with trio.fail_after(AFTER * 3):
        await agent.activate()
        await agent.wait_idle()
    assert await user_texts(agent) == ["kept"]
    spliced = [e.data for e in await agent.session.read_events() if e.type == "agent/inbox/spliced"]
    assert [d["op"] for d in spliced if d["messageId"] == message.id] == ["insert", "claim"]


async def test_disposing_during_reactivation_cancels_it_and_leaks_nothing(prt, autojump_clock):
    live = prt.subscribe_live()
    entered, release = trio.Event(), trio.Event()
    block = [False]

    async def setup(ctx):
        if block[0]:
            entered.set()
            await release.wait()  # never set: the reactivation hangs here

    handle = await prt.create_agent(session_id="a1", setup=setup)
    agent = handle.agent
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    block[0] = True
    reservation = agent.reserve(automatic("never admitted"))
    agent.followup("never run")
    with trio.fail_after(AFTER * 3):
        await entered.wait()
        assert agent.passivated and agent._passive.transition
        await handle.dispose()
    assert agent.closed and prt.get_agent("a1") is None
    assert await reservation.wait() == "cancelled" and reservation.reason == "disposed"
    with pytest.raises(AgentClosedError):
        agent.followup("too late")
    await agent.wait_idle()
    assert_no_leaked_agent_tasks(prt)
    # The session is as it was: the half-built agent wrote nothing.
    reopened = await prt.resume_agent(resume_session_id="a1")
    assert await user_texts(reopened.agent) == []


async def test_the_runtime_closing_during_reactivation_leaks_nothing(tmp_path, autojump_clock):
    release = trio.Event()
    block = [False]

    async def setup(ctx):
        if block[0]:
            await release.wait()

    async with Runtime.open(tmp_path / "home", passivate_after=AFTER) as rt:
        live = rt.subscribe_live()
        agent = (await rt.create_agent(session_id="a1", setup=setup)).agent
        with trio.fail_after(AFTER * 3):
            await passivated(rt, agent, live)
        block[0] = True
        agent.followup("in flight")
        await trio.sleep(1)
        assert agent._passive.transition
    assert agent.closed


async def test_not_passivated_while_busy_subscribed_asking_held_or_vetoed(prt, autojump_clock):
    gate = trio.Event()

    async def slow(arguments, ctx):
        await gate.wait()
        return "done"

    prt.register_tool(Tool("slow", "waits", {"type": "object"}, slow))
    prt.register_adapter("scripted", ScriptedAdapter([
        Reply("calling", tool_calls=[ToolCall("slow", {}, call_id="c1")]), Reply("finished"),
        Reply("asking", tool_calls=[ToolCall("touch", {}, call_id="c2")]), Reply("after the answer"),
    ]))
    prt.register_tool(Tool("touch", "touches", {"type": "object"}, slow))
    options = {"provider": "scripted", "model": "s-1", "approvals": {"tools": {"touch": "ask"}}}
    agent = (await prt.create_agent(session_id="busy", agent_options=options)).agent
    agent.followup("go")
    await trio.sleep(AFTER * 10)
    assert agent.status == "running" and not agent.passivated  # a turn runs
    gate.set()
    await agent.wait_idle()

    agent.followup("ask")
    with trio.fail_after(AFTER * 3):
        [approval] = await agent.wait_approvals()
    await trio.sleep(AFTER * 10)
    assert not agent.passivated  # an approval question is open
    await approval.answer("approve")
    await agent.wait_idle()

    subscription = agent.session.subscribe()
    await trio.sleep(AFTER * 10)
    assert not agent.passivated  # its session has a subscriber
    subscription.close()

    with agent.keep_active():
        await trio.sleep(AFTER * 10)
        assert not agent.passivated

    vetoed = [True]
    prt.supervisor.lifecycle.vetoes.append(lambda a: "a test's veto" if vetoed[0] and a is agent else None)
    await trio.sleep(AFTER * 10)
    assert not agent.passivated
    vetoed[0] = False
    with trio.fail_after(AFTER * 3):
        await prt.supervisor.lifecycle.wait_until(lambda: agent.passivated)  # nothing keeps it any more


async def test_a_command_reactivates_the_agent_and_holds_it_active(prt, autojump_clock):
    from loopdock import Command, CommandResult

    live = prt.subscribe_live()
    seen = []

    async def run(ctx, args):
        await trio.sleep(AFTER * 10)
        seen.append(ctx.agent.passivated)
        return CommandResult(True, "ok")

    prt.commands.register(Command("wait", "waits", run))
    agent = (await prt.create_agent(session_id="a1")).agent
    with trio.fail_after(AFTER * 3):
        await passivated(prt, agent, live)
    result = await prt.execute_command("a1", "/wait")
    assert result.ok and seen == [False]


KILLED_CHILD = """
import sys

import trio

from loopdock import Runtime


async def main(home, n):
    async with Runtime.open(home, passivate_after=0.2) as rt:
        live = rt.subscribe_live()
        handles = [await rt.create_agent(session_id=f"k{i}") for i in range(n)]
        for handle in handles:
            handle.agent.followup(f"hello {handle.agent.id}")
        for handle in handles:
            await handle.agent.wait_idle()
        print("idle", flush=True)
        async for event in live:  # the first passivation done: others are under way
            if event.type == "agent/passivated":
                print("passivating", flush=True)
                await trio.sleep_forever()


trio.run(main, sys.argv[1], int(sys.argv[2]))
"""


async def test_kill_9_while_passivating_loses_nothing_and_resume_works(tmp_path):
    home, n = tmp_path / "home", 40
    process = await trio.lowlevel.open_process(
        [sys.executable, "-P", "-c", KILLED_CHILD, str(home), str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    buffer = b""
    try:
        with trio.fail_after(120):
            while b"passivating" not in buffer:
                chunk = await process.stdout.receive_some()
                assert chunk, "the child ended before it passivated"
                buffer += chunk
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)  # this test started it
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    with trio.fail_after(120):
        async with Runtime.open(home, passivate_after=AFTER) as rt:
            for i in range(n):
                agent = (await rt.resume_agent(resume_session_id=f"k{i}")).agent
                assert [m.text for m in await agent.read_transcript()] == [f"hello k{i}", f"pong: hello k{i}"]
                agent.followup("again")
                await agent.wait_idle()
                events = await agent.session.read_events()
                assert [e.seq for e in events] == list(range(len(events)))
                ends = [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
                assert ends == ["completed", "completed"]  # nothing was left open
            assert_no_leaked_agent_tasks(rt)


async def test_ten_thousand_registered_agents_cost_little_each_when_passivated(tmp_path, autojump_clock):
    """10,000 agents created through the public API with persistence on, 100 of them
    active; tracemalloc says what each passivated one still holds (its handle included)."""
    n, active = 10_000, 100
    async with Runtime.open(tmp_path / "home", passivate_after=AFTER) as rt:
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            handles = [await rt.create_agent(session_id=f"s{i}") for i in range(n)]
            lifecycle = rt.supervisor.lifecycle
            with trio.fail_after(AFTER * 100):
                await lifecycle.wait_until(lambda: lifecycle.passivations == n and not lifecycle._idle)
            assert lifecycle.passivated == n
            gc.collect()
            residue = (tracemalloc.get_traced_memory()[0] - base) / n
            for handle in handles[:active]:
                handle.agent.followup("wake up")
            with trio.fail_after(AFTER * 100):
                for handle in handles[:active]:
                    await handle.agent.wait_idle()
            assert rt.supervisor.lifecycle.passivated == n - active
            assert rt.supervisor.lifecycle.reactivations == active
        finally:
            tracemalloc.stop()
        print(f"residue per passivated agent: {residue:.0f} B")
        # Measured: about 1.3 KB, of which about 350 B are the handles this test keeps.
        assert residue < 1536, f"{residue:.0f} B per passivated agent"
        assert_no_leaked_agent_tasks(rt)
