"""A LoopX agent across passivation (docs/lifecycle.md): an agent waiting on LoopX's
scheduler is passivated like any idle agent, the runtime keeps its timer and wakes it
when it is due, and the rebuilt continuation goes on exactly where it was: the same
poll, under the same turn id, at the same moment, with its latch and poll count.

The fake client (tests/fake_loopx.py) is set on the integration, so every continuation
rebuilt for the agent uses it; the autojump clock runs hours in no time."""

from __future__ import annotations

from itertools import pairwise

import pytest
import trio
from fake_loopx import FakeLoopx, Polls, admitted, open_runtime, waiting, write_loopx_skill
from leak_check import assert_no_leaked_agent_tasks

from loopdock import AgentClosedError, Runtime
from loopdock.runtime.loopx import ThreadBinding
from loopdock.runtime.models import Reply, ScriptedAdapter

AFTER = 60.0  # passivate_after: shorter than every LoopX wait below
HINT = {"progression_minutes": (10.0, 20.0, 30.0), "unchanged_poll_limit": 3, "after_limit": "stop_tick_loop",
        "reset_token": "t1"}


async def agent_on(rt: Runtime, fake: FakeLoopx, session_id: str = "a1", respond=None):
    """An agent (its handle) whose continuations, the first and every rebuilt one, ask ``fake``."""
    rt.loopx.client_for = lambda project: fake
    rt.register_adapter("scripted", ScriptedAdapter(respond or (lambda request: Reply("ok"))))
    handle = await rt.create_agent(
        session_id=session_id, agent_options={"provider": "scripted", "model": "m", "cwd": str(fake.project)}
    )
    return handle


async def passivated(rt: Runtime, agent) -> None:
    await rt.supervisor.lifecycle.wait_until(lambda: agent.passivated and not agent._passive.transition)


async def go(rt: Runtime, agent) -> None:
    """A person invokes the loopx skill; wait until the continuation evaluated after it."""
    agent.followup("/loopx go")
    await agent.wait_idle()
    await rt.loopx.continuations[agent.id].wait_quiescent()


def gaps(times: list[float]) -> list[int]:
    return [round(b - a) for a, b in pairwise(times)]


async def test_a_waiting_agent_is_passivated_and_woken_for_each_poll_as_if_it_had_stayed(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        lifecycle = rt.supervisor.lifecycle
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            assert rt.loopx.continuations[agent.id].status.state == "waiting"
            await passivated(rt, agent)
            assert trio.current_time() - polls.times[0] == pytest.approx(AFTER, abs=1)
            # Passivated, it shows what it was doing; nothing of it runs.
            assert agent.id not in rt.loopx.continuations
            assert rt.loopx.status(agent.id).state == "waiting"
            # Its timers wake it three times; each time it polls and is passivated again.
            await lifecycle.wait_until(lambda: lifecycle.wakeups.fired == 3 and len(polls.times) == 4)
            await passivated(rt, agent)
        # Exactly LoopX's progression (10, 20, 30 min), as without passivation, then the
        # unchanged-poll limit: no timer any more, so no wake-up.
        assert gaps(polls.times) == [600, 1200, 1800]
        assert len(set(fake.should_runs)) == 1  # one attempt: every poll asked about the same turn
        assert rt.loopx.status(agent.id).reason.startswith("LoopX's scheduler: unchanged after 3 polls")
        assert lifecycle.reactivations == 3 and lifecycle.passivations == 4
        await trio.sleep(7 * 24 * 3600)
        assert len(polls.times) == 4 and lifecycle.wakeups.fired == 3 and agent.passivated
        # Nothing about it was written to the log: the session holds only the one turn.
        events = await agent.session.read_events()
        assert [e.type for e in events].count("turn/start") == 1
        assert_no_leaked_agent_tasks(rt)


async def test_brought_back_before_its_timer_it_waits_out_the_rest(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    polls = Polls(1, HINT)  # one wait, then LoopX says stop
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            await passivated(rt, agent)
            await trio.sleep(200 - AFTER)
            await agent.activate()  # no message: nothing to evaluate for
            continuation = rt.loopx.continuations[agent.id]
            await continuation.wait_quiescent()
            assert len(polls.times) == 1 and continuation.status.state == "waiting"
            assert continuation.wake_at == pytest.approx(polls.times[0] + 600)
            with agent.keep_active():  # (so that the poll is the timer's, not a wake-up's)
                await polls.done.wait()
        assert gaps(polls.times) == [600]
        assert rt.supervisor.lifecycle.wakeups.fired == 0


async def test_a_persons_message_to_a_passivated_waiting_agent_runs_first_and_counts_polls_anew(
    tmp_path, autojump_clock
):
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            await passivated(rt, agent)
            await trio.sleep(300)
            sent = trio.current_time()
            agent.followup("any news?")
            await agent.wait_idle()
            continuation = rt.loopx.continuations[agent.id]
            await continuation.wait_quiescent()
        # The person's turn ran, then LoopX was asked at once, counting from the start.
        assert len(polls.times) == 2 and polls.times[1] == pytest.approx(sent, abs=1)
        assert continuation.status.reason.endswith("(unchanged poll 1 of 3)")
        assert continuation.wake_at == pytest.approx(polls.times[1] + 600)


async def test_its_own_veto_does_not_latch_it_after_a_passivation(tmp_path, autojump_clock):
    """The continuation's own pre-step check vetoes its turn (the binding moved to
    another lane): that blocked turn must not latch it. The log does not say who vetoed
    a step, so a continuation rebuilt from the log alone would be quiet; the kept memo
    says it was not, and the wake-up polls."""
    write_loopx_skill(tmp_path)
    first: list[str] = []

    def answer(turn_id):
        if not first:
            first.append(turn_id)
        return admitted(turn_id) if turn_id == first[0] else waiting(turn_id, 10, **HINT)

    fake = FakeLoopx(tmp_path, answer=answer)
    fake.bindings = [ThreadBinding("bound", "g1", "a1"), ThreadBinding("bound", "g1", "a2")]
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            continuation = rt.loopx.continuations[agent.id]
            ends = [e.data["reason"]["kind"] for e in await agent.session.read_events() if e.type == "turn/end"]
            assert ends == ["completed", "blocked"]
            assert continuation.status.state == "waiting" and continuation.history.latch is None
            asked = len(fake.should_runs)
            await passivated(rt, agent)
            lifecycle = rt.supervisor.lifecycle
            await lifecycle.wait_until(lambda: lifecycle.wakeups.fired == 1)
            await agent.activate()
            continuation = rt.loopx.continuations[agent.id]
            await continuation.wait_quiescent()
        assert continuation.history.latch is None
        assert len(fake.should_runs) == asked + 1 and fake.should_runs[-1] == fake.should_runs[-2]
        assert continuation.status.state == "waiting"


async def test_a_person_s_start_that_re_armed_it_survives_a_passivation(tmp_path, autojump_clock):
    """A failed turn latches the continuation; a person's Start re-arms it (in memory:
    the log does not say so) and LoopX answers a wait. Passivated and woken, it polls:
    it is not quiet again."""
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    failures = [RuntimeError("the model is down")]

    def respond(request):
        if failures:
            raise failures.pop()
        return Reply("ok")

    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake, respond=respond)).agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            continuation = rt.loopx.continuations[agent.id]
            assert continuation.status.state == "quiet" and not polls.times
            async with rt.loopx.live(agent.id) as live:
                assert live is continuation
                await live.start()
            assert continuation.status.state == "waiting" and len(polls.times) == 1
            await passivated(rt, agent)
            lifecycle = rt.supervisor.lifecycle
            await lifecycle.wait_until(lambda: len(polls.times) == 2)
        assert gaps(polls.times) == [600]
        # Polled, then passivated again: still not latched, still waiting.
        await passivated(rt, agent)
        assert agent.carried("loopx").latch is None and rt.loopx.status(agent.id).state == "waiting"


async def test_a_start_on_a_passivated_agent_brings_it_back_and_polls_now(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            await passivated(rt, agent)
            await trio.sleep(100)
            async with rt.loopx.live(agent.id) as continuation:
                assert not agent.passivated
                status = await continuation.start()
                assert status.state == "waiting"
                await trio.sleep(2 * AFTER)
                assert not agent.passivated  # kept active for the length of the action
        assert gaps(polls.times) == [round(AFTER + 100)]
        assert continuation.status.reason.endswith("(unchanged poll 1 of 3)")  # Start counts anew


async def test_a_wake_up_does_nothing_for_an_agent_disposed_meanwhile(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        handle = await agent_on(rt, fake)
        agent = handle.agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            await passivated(rt, agent)
            await handle.dispose()
            await trio.sleep(3600)
        assert len(polls.times) == 1 and rt.supervisor.lifecycle.wakeups.fired == 0
        assert rt.supervisor.lifecycle.reactivations == 0
        with pytest.raises(AgentClosedError):
            await agent.activate()
        assert_no_leaked_agent_tasks(rt)


async def test_disposing_during_its_wake_up_reactivation_rolls_it_back(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    entered, release = trio.Event(), trio.Event()
    setups = 0

    async def setup(ctx):
        nonlocal setups
        setups += 1
        if setups > 1:  # the reactivation: stuck until released
            entered.set()
            await release.wait()

    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        rt.loopx.client_for = lambda project: fake
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("ok")))
        handle = await rt.create_agent(
            session_id="a1", setup=setup, agent_options={"provider": "scripted", "model": "m", "cwd": str(tmp_path)}
        )
        agent = handle.agent
        with trio.fail_after(24 * 3600):
            await go(rt, agent)
            await passivated(rt, agent)
            await entered.wait()  # the timer's wake-up is rebuilding it
            assert rt.supervisor.lifecycle.wakeups.fired == 1
            await handle.dispose()
        assert agent.closed and len(polls.times) == 1
        assert agent.id not in rt.loopx.continuations
        assert_no_leaked_agent_tasks(rt)


async def test_an_evaluation_under_way_keeps_its_agent_active(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=Polls(100, HINT))
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        fake.gate = trio.Event()  # LoopX does not answer
        with trio.fail_after(24 * 3600):
            agent.followup("/loopx go")
            await fake.entered.wait()
            await trio.sleep(10 * AFTER)
            assert not agent.passivated
            assert rt.supervisor.lifecycle.why_active(agent) == "a LoopX evaluation is due"
            fake.gate.set()
            await rt.loopx.continuations[agent.id].wait_quiescent()
            await passivated(rt, agent)  # answered: a wait, and nothing keeps it active


async def test_a_restart_forgets_the_timer_and_asks_loopx_at_the_first_idle_checkpoint(tmp_path, autojump_clock):
    """What is kept is kept in memory: after the runtime closes (or dies) with the agent
    passivated, resuming it asks LoopX at once, as after any restart (LoopX's own
    scheduler state is LoopX's)."""
    write_loopx_skill(tmp_path)
    polls = Polls(100, HINT)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        agent = (await agent_on(rt, fake)).agent
        with trio.fail_after(3600):
            await go(rt, agent)
            await passivated(rt, agent)
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        rt.loopx.client_for = lambda project: fake
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("ok")))
        with trio.fail_after(3600):
            handle = await rt.resume_agent(resume_session_id="a1")
            continuation = rt.loopx.continuations["a1"]
            await continuation.wait_quiescent()
            assert len(polls.times) == 2 and polls.times[1] - polls.times[0] == pytest.approx(AFTER, abs=1)
            assert continuation.status.reason.endswith("(unchanged poll 1 of 3)")
            await handle.dispose()


async def test_many_agents_woken_at_the_same_moment_each_poll_once(tmp_path, autojump_clock):
    """Fifty waiting agents passivated together come due together: each is brought back
    once and asks LoopX once, about its own attempt; then all are passivated again."""
    write_loopx_skill(tmp_path)
    asked: dict[str, list[float]] = {}

    class PerAgent(FakeLoopx):
        async def should_run(self, goal_id, agent_id, turn_id):
            answer = await super().should_run(goal_id, agent_id, turn_id)
            asked.setdefault(turn_id, []).append(trio.current_time())
            return answer

    fake = PerAgent(tmp_path, answer=lambda turn_id: waiting(turn_id, 10, **HINT))
    async with open_runtime(tmp_path, tmp_path, passivate_after=AFTER) as rt:
        rt.loopx.client_for = lambda project: fake
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("ok")))
        agents = []
        with trio.fail_after(24 * 3600):
            for n in range(50):
                handle = await rt.create_agent(
                    session_id=f"a{n}", agent_options={"provider": "scripted", "model": "m", "cwd": str(tmp_path)})
                agents.append(handle.agent)
            for agent in agents:  # no checkpoint between: they all go at once
                agent.followup("/loopx go")
            lifecycle = rt.supervisor.lifecycle
            await lifecycle.wait_until(lambda: len(asked) == 50 and all(len(t) == 2 for t in asked.values()))
            await lifecycle.wait_until(lambda: all(a.passivated and not a._passive.transition for a in agents))
        assert lifecycle.wakeups.fired == 50 and lifecycle.reactivations == 50
        assert all(round(second - first) == 600 for first, second in asked.values())
        assert all(rt.loopx.status(a.id).reason.endswith("(unchanged poll 2 of 3)") for a in agents)
        assert_no_leaked_agent_tasks(rt)
