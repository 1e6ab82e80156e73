"""Passivation under memory pressure (docs/lifecycle.md, "Policy"): over
``Runtime.open(memory_limit=...)``, idle agents are passivated, least recently active
first, whatever ``passivate_after`` says, until the process is judged back under the
low-water mark; agents something keeps active are skipped and lose nothing.

The RSS these tests judge is a fake one (``FakeRss``, put where the lifecycle takes its
reader from before the runtime opens), except in the last test, which runs a fresh
process on its real RSS. Sleeps are on trio's autojump clock: they let the pressure
task's periods pass, never stand in for a wait on something else."""

from __future__ import annotations

import json
import sys

import pytest
import structlog
import trio
import trio.testing
from leak_check import assert_no_leaked_agent_tasks

from loopdock import Runtime
from loopdock.actors import AGENT_BYTES, PRESSURE_PERIOD
from loopdock.actors import _lifecycle as lifecycle_module
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

LIMIT = 20 * AGENT_BYTES  # low-water mark: 18 agents' worth
HUGE = 1000 * LIMIT  # more than every agent of a test holds


class FakeRss:
    """The RSS the lifecycle reads: what the test says, counting the reads."""

    def __init__(self) -> None:
        self.value: int | None = 0
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        if self.value is None:
            raise FileNotFoundError("/proc/self/statm")  # as where there is no /proc
        return self.value


@pytest.fixture
def rss(monkeypatch):
    fake = FakeRss()
    monkeypatch.setattr(lifecycle_module, "read_rss", fake)  # taken when the runtime opens
    return fake


@pytest.fixture
async def prt(tmp_path, rss):
    # No idle policy: whatever is passivated here is passivated under pressure.
    async with Runtime.open(tmp_path / "home", passivate_after=None, memory_limit=LIMIT) as runtime:
        assert runtime.supervisor.lifecycle.read_rss is rss
        yield runtime
        assert_no_leaked_agent_tasks(runtime)


async def user_texts(agent) -> list[str]:
    return [
        "".join(b["text"] for b in e.data["content"] if b.get("type") == "text")
        for e in await agent.session.read_events()
        if e.type == "user/message"
    ]


async def turn_ends(agent) -> list[str]:
    return [e.data["reason"]["kind"] for e in await agent.session.read_events() if e.type == "turn/end"]


def weight(agent) -> int:
    """What the lifecycle estimates passivating ``agent`` releases."""
    return AGENT_BYTES + agent.history_weight()


def task_names() -> set[str]:
    names, nurseries = set(), list(trio.lowlevel.current_root_task().child_nurseries)
    while nurseries:
        for task in nurseries.pop().child_tasks:
            names.add(task.name)
            nurseries.extend(task.child_nurseries)
    return names


async def test_the_least_recently_active_go_first_in_that_order(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    pressure = lifecycle.pressure
    agents = [(await prt.create_agent(session_id=f"a{i}")).agent for i in range(10)]
    for agent in agents[:2]:  # a0 and a1 become the most recently active
        agent.followup("again")
        await agent.wait_idle()
    order = agents[2:] + agents[:2]
    assert list(lifecycle._idle) == order  # idle since, oldest first
    weights = [weight(agent) for agent in order]
    await trio.sleep(10 * PRESSURE_PERIOD)
    assert rss.reads >= 9 and lifecycle.passivations == 0  # under the limit: nothing

    # Over the limit by what the three least recently active hold (less a byte).
    rss.value = pressure.low_water + sum(weights[:3]) - 1
    assert rss.value > LIMIT
    with trio.fail_after(30):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 3)
    await trio.sleep(10 * PRESSURE_PERIOD)  # the RSS does not fall: what they held counts
    assert [agent.passivated for agent in order] == [True] * 3 + [False] * 7
    assert not pressure.relieving and pressure.episodes == 1

    # The process grows again (taking the free memory first): the next two go.
    rss.value += -(-(weights[3] + weights[4]) // 2)
    with trio.fail_after(30):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 5)
    await trio.sleep(10 * PRESSURE_PERIOD)
    assert [agent.passivated for agent in order] == [True] * 5 + [False] * 5
    assert pressure.episodes == 2 and lifecycle.passivations == 5
    # Passivated under pressure, the agents come back as any passivated agent does.
    order[0].followup("back")
    with trio.fail_after(30):
        await order[0].wait_idle()
    assert await user_texts(order[0]) == ["back"] and lifecycle.reactivations == 1


async def test_it_goes_on_between_the_marks_and_stops_under_the_low_water_mark(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    pressure = lifecycle.pressure
    agents = [(await prt.create_agent(session_id=f"a{i}")).agent for i in range(10)]
    weights = [weight(agent) for agent in agents]
    rss.value = pressure.low_water + weights[0] + weights[1] - 1
    with trio.fail_after(30):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 2)
    # Before the next reading: the process grew, and is judged between the two marks
    # (under the limit, over the low-water mark by what the next agent holds).
    assert pressure.credit == weights[0] + weights[1]
    grow = -(-weights[2] // 2)
    rss.value += grow
    judged = rss.value - (pressure.credit - grow)  # the growth took free memory first
    assert pressure.low_water < judged < LIMIT
    with trio.fail_after(30):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 3)
    reads = rss.reads
    await trio.sleep(20 * PRESSURE_PERIOD)
    assert rss.reads >= reads + 19  # judged again and again, under the low-water mark
    assert not pressure.relieving and pressure.episodes == 1
    assert [agent.passivated for agent in agents] == [True] * 3 + [False] * 7
    # Far under it: nothing more either.
    rss.value = 0
    await trio.sleep(20 * PRESSURE_PERIOD)
    assert lifecycle.passivations == 3


async def test_agents_kept_active_are_skipped_and_lose_nothing(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    gate = trio.Event()

    async def slow(arguments, ctx):
        await gate.wait()
        return "done"

    prt.register_tool(Tool("slow", "waits", {"type": "object"}, slow))
    prt.register_adapter("scripted", ScriptedAdapter([
        Reply("calling", tool_calls=[ToolCall("slow", {}, call_id="c1")]), Reply("finished"), Reply("second"),
    ]))
    options = {"provider": "scripted", "model": "s-1"}
    busy = (await prt.create_agent(session_id="busy", agent_options=options)).agent
    injected, subscribed, held, free1, free2 = [
        (await prt.create_agent(session_id=name)).agent for name in ("injected", "subscribed", "held", "free1", "free2")
    ]
    busy.followup("go")
    busy.followup("queued while busy")
    injected.inject("injected")
    subscription = subscribed.session.subscribe()
    with structlog.testing.capture_logs() as logs, held.keep_active():
        rss.value = HUGE
        with trio.fail_after(30):
            await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 2)
        await trio.sleep(10 * PRESSURE_PERIOD)
        assert (free1.passivated, free2.passivated) == (True, True)
        assert not any(agent.passivated for agent in (busy, injected, subscribed, held))
        assert busy.status == "running" and lifecycle.pressure.relieving
    # Nothing left to passivate: said once in the episode, with who stays active and why.
    warnings = [e for e in logs if e["event"] == "memory over the limit and no idle agent left to passivate"]
    assert len(warnings) == 1, warnings
    [warning] = warnings
    assert warning["log_level"] == "warning"
    # In memory: all six (the two free ones being passivated by this very round).
    assert (warning["active"], warning["passivating"], warning["kept_active"]) == (6, 2, 3)
    assert warning["oldest_kept"] == [
        {"agent_id": "injected", "reason": "messages queued"},
        {"agent_id": "subscribed", "reason": "its session has subscribers"},
        {"agent_id": "held", "reason": "held active"},
    ]

    # Once nothing keeps them, they go too, and what they had is in their logs.
    subscription.close()
    gate.set()
    injected.followup("wake")
    with trio.fail_after(60):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 6)
    assert all(agent.passivated for agent in (busy, injected, subscribed, held, free1, free2))
    assert await user_texts(busy) == ["go", "queued while busy"]
    assert await turn_ends(busy) == ["completed", "completed"]
    assert await user_texts(injected) == ["wake", "injected"]
    assert await turn_ends(injected) == ["completed"]
    assert lifecycle.reactivations == 0  # none was passivated with anything left to do


async def test_a_message_racing_with_a_pressure_passivation_is_delivered_once_in_order(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    agent = (await prt.create_agent(session_id="a1")).agent
    asked = trio.Event()
    lifecycle.vetoes.append(lambda candidate: asked.set() if candidate is agent else None)
    rss.value = HUGE
    with trio.fail_after(30):
        await asked.wait()
        while not agent.passivated:  # the passivation starts right after the last check
            await trio.lowlevel.checkpoint()
    assert agent._passive.transition  # its task is being ended, its session flushed
    sent = [f"m{i}" for i in range(5)]
    for text in sent:
        agent.followup(text)
    rss.value = 0  # no second passivation
    with trio.fail_after(60):
        await agent.wait_idle()
    assert (lifecycle.pressure_passivations, lifecycle.reactivations) == (1, 1)
    assert not agent.passivated and await user_texts(agent) == sent
    assert await turn_ends(agent) == ["completed"] * 5


async def test_a_message_between_the_choice_and_the_passivation_keeps_the_agent(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    agent = (await prt.create_agent(session_id="a1")).agent
    calls = []

    def veto(candidate):
        if candidate is agent:
            calls.append(candidate)
            if len(calls) == 1:  # the round's choice: a message comes right after it
                agent.followup("between")
        return None

    lifecycle.vetoes.append(veto)
    rss.value = HUGE
    with trio.fail_after(60):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 1)
    rss.value = 0
    # It ran its message first, and only then, idle again, was passivated.
    assert agent.passivated and lifecycle.reactivations == 0
    assert await user_texts(agent) == ["between"] and await turn_ends(agent) == ["completed"]


async def test_without_persistence_nothing_is_passivated_and_the_warning_says_why(tmp_path, rss, autojump_clock):
    async with Runtime.open(tmp_path / "home", passivate_after=None, memory_limit=LIMIT, persist=False) as rt:
        agents = [(await rt.create_agent(session_id=f"a{i}")).agent for i in range(3)]
        with structlog.testing.capture_logs() as logs:
            rss.value = HUGE
            await trio.sleep(10 * PRESSURE_PERIOD)
        assert not any(agent.passivated for agent in agents)
        warnings = [e for e in logs if e["event"] == "memory over the limit and no idle agent left to passivate"]
        assert len(warnings) == 1 and warnings[0]["kept_active"] == 3
        assert {entry["reason"] for entry in warnings[0]["oldest_kept"]} == {"the runtime persists nothing"}


async def test_an_unreadable_rss_is_said_once_and_read_again(prt, rss, autojump_clock):
    lifecycle = prt.supervisor.lifecycle
    agent = (await prt.create_agent(session_id="a1")).agent
    judged, reads = lifecycle.pressure.readings, rss.reads
    with structlog.testing.capture_logs() as logs:
        rss.value = None
        await trio.sleep(10 * PRESSURE_PERIOD)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "memory limit not enforced: the RSS cannot be read"
    ]
    assert rss.reads >= reads + 9 and lifecycle.pressure.readings == judged  # tried, nothing judged
    assert not agent.passivated
    rss.value = HUGE  # readable again: judged, and acted on
    with trio.fail_after(30):
        await lifecycle.wait_until(lambda: lifecycle.pressure_passivations == 1)


async def test_under_pressure_passivate_after_is_not_waited_for(tmp_path, rss, autojump_clock):
    async with Runtime.open(tmp_path / "home", passivate_after=3600.0, memory_limit=LIMIT) as rt:
        lifecycle = rt.supervisor.lifecycle
        agents = [(await rt.create_agent(session_id=f"a{i}")).agent for i in range(4)]
        rss.value = lifecycle.pressure.low_water + weight(agents[0]) + weight(agents[1]) - 1
        start = trio.current_time()
        with trio.fail_after(30):
            await lifecycle.wait_until(lambda: lifecycle.pressure_passivations == 2)
        assert trio.current_time() - start < 3 * PRESSURE_PERIOD
        assert [agent.passivated for agent in agents] == [True, True, False, False]
        # The idle policy still takes the others when their time comes.
        with trio.fail_after(7200):
            await lifecycle.wait_until(lambda: lifecycle.passivated == 4)
        assert trio.current_time() - start >= 3600.0 - 60
        assert (lifecycle.pressure_passivations, lifecycle.passivations) == (2, 4)
        assert_no_leaked_agent_tasks(rt)


async def test_without_a_limit_the_rss_is_never_read(tmp_path, monkeypatch, autojump_clock):
    reads = []
    monkeypatch.setattr(lifecycle_module, "read_rss", lambda: reads.append(1) or 0)
    async with Runtime.open(tmp_path / "home", passivate_after=60.0) as rt:
        lifecycle = rt.supervisor.lifecycle
        assert lifecycle.pressure is None
        assert "memory pressure" not in task_names() and "agent lifecycle" in task_names()
        agents = [(await rt.create_agent(session_id=f"a{i}")).agent for i in range(3)]
        for agent in agents:
            agent.followup("hello")
            await agent.wait_idle()
        with trio.fail_after(600):
            await lifecycle.wait_until(lambda: lifecycle.passivated == 3)  # the idle policy works
        await trio.sleep(3600)
    async with Runtime.open(tmp_path / "home2", passivate_after=None) as rt:
        agent = (await rt.create_agent(session_id="a1")).agent
        agent.followup("hello")
        await agent.wait_idle()
        assert rt.supervisor.lifecycle._idle == {}  # no policy at all: nothing is tracked
        await trio.sleep(3600)
        assert not agent.passivated
    assert reads == []


@pytest.mark.parametrize("value", [0, -5, 1.5, "2GB", True])
async def test_a_bad_memory_limit_is_a_value_error(tmp_path, value):
    with pytest.raises(ValueError, match="memory_limit must be a positive number of bytes"):
        async with Runtime.open(tmp_path / "home", memory_limit=value):
            pass
    assert not (tmp_path / "home").exists()  # refused before anything was made


async def test_a_good_memory_limit_is_kept(tmp_path, rss, autojump_clock):
    async with Runtime.open(tmp_path / "home", memory_limit=4 * 2**30) as rt:
        pressure = rt.supervisor.lifecycle.pressure
        assert (pressure.limit, pressure.low_water) == (4 * 2**30, int(4 * 2**30 * 0.9))
        assert rt.supervisor.lifecycle.passivate_after == 300.0
        await trio.sleep(5 * PRESSURE_PERIOD)
        assert rss.reads >= 4 and "memory pressure" in task_names()


@pytest.mark.parametrize("how", ["closed", "cancelled"])
async def test_the_runtime_ending_during_a_pressure_round_loses_nothing(tmp_path, rss, monkeypatch, autojump_clock, how):
    # Small batches: a round of 10 agents (a quarter of 40) passivates them 4 at a time.
    monkeypatch.setattr(lifecycle_module, "PASSIVATION_BATCH", 4)
    n = 40
    with trio.CancelScope() as scope:
        async with Runtime.open(tmp_path / "home", passivate_after=None, memory_limit=LIMIT) as rt:
            lifecycle = rt.supervisor.lifecycle
            agents = [(await rt.create_agent(session_id=f"a{i}")).agent for i in range(n)]
            for agent in agents:
                agent.followup(f"hello {agent.id}")
            for agent in agents:
                await agent.wait_idle()
            rss.value = HUGE
            with trio.fail_after(60):
                await lifecycle.wait_until(lambda: lifecycle.pressure_passivations >= 1)
            # The round's first batch is done, or nearly: the round has two more to go.
            assert 1 <= lifecycle.pressure_passivations <= 4
            if how == "cancelled":
                scope.cancel()
                await trio.sleep_forever()
    assert scope.cancelled_caught == (how == "cancelled")
    assert all(agent.closed for agent in agents)
    # The round stopped: no batch starts once the runtime closes, which it does at once
    # when the body ends; a cancelled body ends at its next checkpoint, and the round may
    # start its next batch meanwhile, never a second round (a quarter of 40: 10).
    assert 1 <= lifecycle.pressure_passivations == lifecycle.passivations <= (4 if how == "closed" else 10)
    with trio.fail_after(600):
        async with Runtime.open(tmp_path / "home", passivate_after=None) as rt:
            for i in range(n):
                agent = (await rt.resume_agent(resume_session_id=f"a{i}")).agent
                assert [m.text for m in await agent.read_transcript()] == [f"hello a{i}", f"pong: hello a{i}"]
                events = await agent.session.read_events()
                assert [e.seq for e in events] == list(range(len(events)))
                assert await turn_ends(agent) == ["completed"]
            assert_no_leaked_agent_tasks(rt)


REAL_RSS_CHILD = """
import json
import sys

import trio
import trio.testing

from loopdock import Runtime
from loopdock.actors import read_rss


async def main(home, n, margin):
    # A runtime opened and closed first: imports, the store's library, first agents.
    async with Runtime.open(home + "/warm", passivate_after=None) as rt:
        for i in range(20):
            await rt.create_agent(session_id=f"w{i}")
    baseline = read_rss()
    limit = baseline + margin
    async with Runtime.open(home + "/run", passivate_after=None, memory_limit=limit) as rt:
        lifecycle = rt.supervisor.lifecycle
        real, readings = lifecycle.read_rss, []

        def watched():
            value = real()
            readings.append([value, lifecycle.pressure_passivations])
            return value

        lifecycle.read_rss = watched
        for i in range(n):
            await rt.create_agent(session_id=f"a{i}")
        with trio.fail_after(3600):
            await lifecycle.wait_until(lambda: lifecycle.pressure_passivations > 0)
            while lifecycle.pressure.relieving:  # a round per period until the episode ends
                await trio.sleep(1)
        pressure = lifecycle.pressure
        print(json.dumps({
            "baseline": baseline, "limit": limit, "readings": readings, "judged": pressure.readings,
            "pressure_passivations": lifecycle.pressure_passivations, "passivations": lifecycle.passivations,
            "passivated": lifecycle.passivated, "episodes": pressure.episodes, "rss": pressure.rss,
            "held": pressure.held, "relieving": pressure.relieving, "final": read_rss(),
        }), flush=True)


trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), clock=trio.testing.MockClock(autojump_threshold=0))
"""


async def test_the_real_rss_over_a_limit_passivates_agents(tmp_path):
    """A fresh process (its RSS is its own, not this test run's) with a limit 8 MB above
    its baseline creates 2,000 agents (about 12 KB of RSS each, measured; 24 MB): the RSS
    passes the limit, and only then are agents passivated (there is no idle policy); the
    RSS does not fall (freed memory stays in the process), and yet the episode ends with
    agents still active: what was passivated is counted."""
    n, margin = 2000, 8 * 2**20
    with trio.fail_after(600):
        result = await trio.run_process(
            [sys.executable, "-P", "-c", REAL_RSS_CHILD, str(tmp_path), str(n), str(margin)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    readings, limit = report["readings"], report["limit"]
    over = [i for i, (value, _) in enumerate(readings) if value > limit]
    assert over, f"the RSS never passed the limit: {readings[-5:]}, limit {limit}"
    # Nothing was passivated before the RSS first read over the limit; then some were.
    assert all(done == 0 for _, done in readings[: over[0] + 1])
    assert 0 < report["pressure_passivations"] == report["passivations"] == report["passivated"] < n
    assert report["episodes"] >= 1 and report["judged"] >= len(readings)
    # The episode ended (judged back under the low-water mark) and none began since.
    assert not report["relieving"] and report["held"] <= limit
    print(f"real RSS: baseline {report['baseline']} B, limit {limit} B, {len(readings)} readings, "
          f"last {report['rss']} B (held {report['held']} B), after {report['final']} B; "
          f"{report['pressure_passivations']} of {n} agents passivated in {report['episodes']} episode(s)")
