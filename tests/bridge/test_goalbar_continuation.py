"""The GoalBar and the LoopX continuation together, on the REAL loopx CLI.

One runtime agent is bound to a real LoopX goal and has invoked the loopx skill; the
GoalBar service is opened on the runtime's LoopX integration (as ``loopdock serve`` does).
The scenario walks through what a person does with the bar over a working day:

1. the continuation's turn fails (a model error): the continuation is quiet and the bar
   says why;
2. Pause, double-clicked: one mutation, the goal stopped, the continuation paused; Pause
   again is refused;
3. while the agent works on a person's message, Start is refused; the person's message
   re-arms the continuation, but nothing continues on the paused goal;
4. Start: the goal is resumed and the continuation goes on at once, resuming the failed
   turn under its own id;
5. a continuation that is about to enter a model step when Pause is clicked never enters.

The per-goal locks are gone whenever no action runs. Nothing sleeps to synchronise.
"""

from __future__ import annotations

import trio

from loopdock import Runtime
from loopdock._bridge import goalbar_project_for
from loopdock.actors.loopx import LoopxSettings
from loopdock.bridge._goalbar import GoalBarService, GoalBarVisible
from loopdock.runtime._errors import ModelError
from loopdock.runtime.loopx import HOST_SURFACE, LifecycleResult, LoopxClient, LoopxOk
from loopdock.runtime.models import Reply, ScriptedAdapter
from loopdock.runtime.skills import SkillCatalog

PHASE = 240
SESSION = "s-bar"
GOAL, AGENT = "goal-bar", "agent-bar"


class CountingClient(LoopxClient):
    """The real client, counting lifecycle executions."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.executed: list[str] = []

    async def goal_lifecycle(self, goal_id, operation, *, execute):
        if execute:
            self.executed.append(operation)
        return await super().goal_lifecycle(goal_id, operation, execute=execute)


async def ok(client: LoopxClient, *args: str) -> None:
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)


async def lifecycle_state(client: LoopxClient) -> str:
    preview = await client.goal_lifecycle(GOAL, "stop", execute=False)
    assert isinstance(preview, LifecycleResult)
    return preview.before_state


def is_continuation(message) -> bool:
    return message.source is not None and message.source.kind == "loopx-continuation"


async def continuations(agent) -> list[str]:
    return [e.data["source"]["turnInstanceId"] for e in (await agent.session.read_events())
            if e.type == "user/message" and e.data.get("source", {}).get("kind") == "loopx-continuation"]


async def test_start_and_pause_control_the_continuation(tmp_path, loopx_env, loopx_command, loopx_project):
    skill = loopx_project / ".agents" / "skills" / "loopx"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: loopx\ndescription: test skill\n---\nUse loopx.\n")
    client = CountingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(PHASE):
        await ok(client, "bootstrap", "--project", ".", "--goal-id", GOAL, "--objective", "Keep the notes current",
                 "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
        await ok(client, "register-agent", "--goal-id", GOAL, "--agent-id", AGENT, "--require-new", "--execute")
        await ok(client, "bind-agent-thread", "--goal-id", GOAL, "--thread-id", SESSION,
                 "--host-surface", HOST_SURFACE, "--agent-id", AGENT, "--execute")
        await ok(client, "todo", "add", "--goal-id", GOAL, "--project", ".", "--role", "agent",
                 "--claimed-by", AGENT, "--task-class", "advancement_task", "--text", "[P0] Keep the notes current")

    thinking = trio.Event()  # a person's message the model works on until released
    failed_once = []

    def respond(request):
        last = request.messages[-1]
        if is_continuation(last) and not failed_once:
            failed_once.append(True)
            return Reply(error=ModelError("the provider is down"))
        if last.text == "think it over":
            return Reply("done thinking", block=thinking)
        return Reply("ok")

    veto_gate: trio.Event | None = None

    async def slow_gate(pre, next_):
        # An inner pre-step listener: holds a continuation on its way into a step.
        if veto_gate is not None and any(is_continuation(m) for m in pre.messages):
            held.set()
            await veto_gate.wait()
        return await next_(pre)

    held = trio.Event()
    settings = LoopxSettings(env=loopx_env, command=tuple(loopx_command), timeout=120, initialize=False)
    async with Runtime.open(tmp_path / "home", env=loopx_env, skills=SkillCatalog.from_env(loopx_project, loopx_env),
                            loopx=settings) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.create_agent(
            session_id=SESSION, agent_options={"provider": "scripted", "model": "m", "cwd": str(loopx_project)},
            setup=lambda ctx: ctx.on("agent/pre-step", slow_gate) and None,
        )
        agent, driver = handle.agent, rt.loopx.continuations[SESSION]
        driver.clients = lambda: client
        async with GoalBarService.open(lambda project: client, continuations=rt.loopx) as bar:
            # 1. The continuation's turn fails: quiet, and the bar says why.
            with trio.fail_after(PHASE):
                agent.followup("/loopx keep the notes current")
                await driver.wait_quiescent()
                shown = await bar.read(SESSION, loopx_project)
            (failed,) = driver.admitted
            assert isinstance(shown, GoalBarVisible) and shown.lifecycle_state == "active"
            assert (shown.continuation, shown.agent_running) == ("quiet", False)
            assert shown.continuation_reason.startswith("the last turn ended with an error")

            # 2. Pause, double-clicked: one mutation; then Pause again is refused.
            with trio.fail_after(PHASE):
                results = []
                async with trio.open_nursery() as nursery:
                    for _ in range(2):
                        nursery.start_soon(click, results, bar.pause, loopx_project)
                assert bar.actor_stats(SESSION, loopx_project)["mutations"] == 1  # the second click joined
                assert client.executed == ["stop"]
                again = await bar.pause(SESSION, loopx_project)  # LoopX's preview: a stop that changes nothing
            assert [r.outcome for r in results] == ["done", "done"]
            assert (again.outcome, again.reason) == ("refused", "already-paused")
            assert results[0].state.lifecycle_state == "stopped" and results[0].state.continuation == "paused"
            assert len(bar.locks) == 0

            # 3. Start while the agent works is refused; the person's message re-arms the
            #    continuation, but the paused goal keeps it from continuing.
            with trio.fail_after(PHASE):
                agent.followup("think it over")
                while agent.status != "running":
                    await agent.wait_status_change(agent.status_version)
                busy = await bar.start(SESSION, loopx_project)
                thinking.set()
                await driver.wait_quiescent()
            assert (busy.outcome, busy.reason) == ("refused", "agent-running") and busy.state.agent_running
            assert driver.admitted == [failed] and driver.status.state == "paused"
            assert await lifecycle_state(client) == "stopped"

            # 4. Start: resumed, and the failed turn goes on under its own id at once.
            with trio.fail_after(PHASE):
                started = await bar.start(SESSION, loopx_project)
                await driver.wait_quiescent()
            assert started.outcome == "done" and started.state.lifecycle_state == "active"
            # The state Start returns is read from LoopX after the continuation started: a
            # CLI call, during which the resumed turn may already have ended (unsettled:
            # needs-person, see 5). Either way it is no longer paused.
            assert started.state.continuation in ("queued", "working", "needs-person")
            assert client.executed == ["stop", "resume"]  # no --execute for the refused Pause
            assert await continuations(agent) == [failed, failed]

            # 5. A continuation on its way into a step when Pause is clicked never enters.
            #    (The resumed turn completed unsettled: LoopX needs a person; Start is it.)
            assert driver.status.state == "needs-person"
            veto_gate = trio.Event()
            with trio.fail_after(PHASE):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(driver.start)
                    await held.wait()
                    pending = driver.pending
                    paused = await bar.pause(SESSION, loopx_project)
                    veto_gate.set()
                await driver.wait_quiescent()
            assert paused.outcome == "done" and paused.state.lifecycle_state == "stopped"
            assert pending is not None and pending.reservation.state == "rejected"
            assert pending.reservation.reason == "loopx continuation: a Pause is in progress"
            assert await continuations(agent) == [failed, failed]  # nothing entered
            assert len(bar.locks) == 0
        await handle.dispose()


async def click(results, action, project):
    results.append(await action(SESSION, project, expected=(GOAL, AGENT)))


class CountingShouldRun(CountingClient):
    """...and the turn ids it asked should-run about."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    async def should_run(self, goal_id, agent_id, turn_id):
        self.asked.append(turn_id)
        return await super().should_run(goal_id, agent_id, turn_id)


async def test_a_passivated_agent_s_bar_shows_its_wait_and_start_brings_it_back(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    """The agent waits on LoopX's scheduler (its lane has nothing in scope) and is
    passivated meanwhile. The bar still finds its project and shows the wait it kept;
    Start brings the agent back and LoopX is asked at once, about the same attempt."""
    skill = loopx_project / ".agents" / "skills" / "loopx"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: loopx\ndescription: test skill\n---\nUse loopx.\n")
    client = CountingShouldRun(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(PHASE):
        await ok(client, "bootstrap", "--project", ".", "--goal-id", GOAL, "--objective", "Keep the notes current",
                 "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
        for agent_id in (AGENT, "agent-other"):
            await ok(client, "register-agent", "--goal-id", GOAL, "--agent-id", agent_id, "--require-new", "--execute")
        await ok(client, "bind-agent-thread", "--goal-id", GOAL, "--thread-id", SESSION,
                 "--host-surface", HOST_SURFACE, "--agent-id", AGENT, "--execute")
        # The goal's only todo is the other agent's: this lane waits.
        await ok(client, "todo", "add", "--goal-id", GOAL, "--project", ".", "--role", "agent",
                 "--claimed-by", "agent-other", "--task-class", "advancement_task", "--text", "[P0] Notes")

    settings = LoopxSettings(env=loopx_env, command=tuple(loopx_command), timeout=120, initialize=False)
    elsewhere = tmp_path / "elsewhere"  # the project ``serve --project`` would default to
    elsewhere.mkdir()
    async with Runtime.open(tmp_path / "home", env=loopx_env, skills=SkillCatalog.from_env(loopx_project, loopx_env),
                            loopx=settings, passivate_after=1.0) as rt:
        rt.loopx.client_for = lambda project: client
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("ok")))
        handle = await rt.create_agent(
            session_id=SESSION, agent_options={"provider": "scripted", "model": "m", "cwd": str(loopx_project)})
        agent, lifecycle = handle.agent, rt.supervisor.lifecycle
        project_for = goalbar_project_for(rt, elsewhere)
        async with GoalBarService.open(lambda project: client, continuations=rt.loopx) as bar:
            with trio.fail_after(PHASE):
                agent.followup("/loopx keep the notes current")
                await lifecycle.wait_until(lambda: agent.passivated and not agent._passive.transition)
                assert len(client.asked) == 1 and rt.loopx.status(SESSION).state == "waiting"
                assert project_for(SESSION) == loopx_project  # kept: not ``elsewhere``
                shown = await bar.read(SESSION, project_for(SESSION))
            assert isinstance(shown, GoalBarVisible) and shown.agent_id == AGENT
            assert (shown.continuation, shown.agent_running) == ("waiting", False)
            assert shown.continuation_reason.startswith("LoopX's scheduler asked to wait 600s")
            assert agent.passivated  # reading the bar did not bring it back

            with trio.fail_after(PHASE):
                result = await bar.start(SESSION, project_for(SESSION))
            assert result.outcome == "done", result
            assert client.executed == []  # the goal was active: nothing to resume in LoopX
            assert lifecycle.reactivations == 1
            assert client.asked == [client.asked[0]] * 2  # asked at once, about the same attempt
            assert result.state.continuation == "waiting"
            assert result.state.continuation_reason.endswith("(unchanged poll 1 of 3)")  # Start counts anew

            # Passivated again, then Pause: brought back, held, the goal stopped.
            with trio.fail_after(PHASE):
                await lifecycle.wait_until(lambda: agent.passivated and not agent._passive.transition)
                paused = await bar.pause(SESSION, project_for(SESSION))
            assert paused.outcome == "done", paused
            assert client.executed == ["stop"] and lifecycle.reactivations == 2
            assert paused.state.lifecycle_state == "stopped" and paused.state.continuation == "paused"
            assert len(client.asked) == 2  # a Pause asks nothing
            await handle.dispose()
