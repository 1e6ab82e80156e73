"""The LoopX continuation driver on the real CLI: passive until this exact session
invokes the loopx skill, fail-closed activation, human priority at pre-step, forks.

The driver's loopx command is a logging shim in front of the real CLI, so a test can
count every call the driver made (zero before activation)."""

import json
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from leak_check import assert_no_leaked_agent_tasks

from loopdock import LoopxSettings, Runtime
from loopdock.runtime.loopx import LoopxClient, ShouldRun
from loopdock.runtime.loopx import _client as loopx_client
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.skills import SkillCatalog
from loopdock.runtime.tools import Tool

LOOPX = ("--registry", ".loopx/registry.json", "--format", "json")


@pytest.fixture
def shim(tmp_path, loopx_command):
    """An argv prefix that logs each call, then runs the real loopx."""
    log = tmp_path / "loopx-calls.jsonl"
    script = tmp_path / "loopx-logged"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"os.execv({loopx_command[0]!r}, [{loopx_command[0]!r}, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)

    def calls():
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return (str(script),), calls


def write_skill(project: Path, name: str) -> None:
    folder = project / ".agents" / "skills" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: test skill\n---\nUse {name}.\n")


def open_runtime(tmp_path, env, project, command, **kwargs):
    # The tests hold one continuation object across hours of clock: no passivation
    # (which rebuilds it; that is tests/actors/test_loopx_passivation.py).
    kwargs.setdefault("passivate_after", None)
    return Runtime.open(
        tmp_path / "home",
        env=env,
        skills=SkillCatalog.from_env(project, env),
        loopx=LoopxSettings(env=env, command=command, timeout=120, initialize=False),
        **kwargs,
    )


async def say(rt, agent, text):
    """Send ``text`` and wait until the agent is idle again and its driver has evaluated
    that idle checkpoint (CLI calls included)."""
    agent.followup(text)
    await rt.loopx.continuations[agent.id].wait_quiescent()


async def test_passive_until_activation_and_every_other_shape_fails_closed(
    tmp_path, loopx_env, loopx_project, shim
):
    command, calls = shim
    write_skill(loopx_project, "loopx-project")  # another skill: invoking it must not count
    async with open_runtime(tmp_path, loopx_env, loopx_project, command) as rt:
        handle = await rt.create_agent(session_id="quiet", agent_options={"cwd": str(loopx_project)})
        agent, driver = handle.agent, rt.loopx.continuations["quiet"]
        with trio.fail_after(60):
            for text in [
                "hello",  # ordinary input, many idle transitions
                "/loopx please",  # no loopx skill installed: plain text, not an invocation
                "/loopx-project look around",  # another skill's invocation
                'call: skill {"name": "loopx"}',  # the model asks, but the call fails (no such skill)
                'call: skill ["loopx"]',  # arguments are not an object
                'call: skill {"name": "loopx-project"}',  # another skill, successfully
                "the loopx skill, loopx, LOOPX_TURN=x",  # prose
            ]:
                await say(rt, agent, text)
        assert driver.activation.active is False
        assert calls() == []  # zero CLI calls
        assert driver.timer is None and driver.pending is None  # zero timers, zero followups
        kinds = {e.data.get("source", {}).get("kind") for e in (await agent.session.read_events()) if e.type == "user/message"}
        assert kinds == {"user", "skill-invocation"}


async def test_user_invocation_activates_only_this_session(tmp_path, loopx_env, loopx_project, shim):
    command, calls = shim
    write_skill(loopx_project, "loopx")
    async with open_runtime(tmp_path, loopx_env, loopx_project, command) as rt:
        mine = await rt.create_agent(session_id="mine", agent_options={"cwd": str(loopx_project)})
        other = await rt.create_agent(session_id="other", agent_options={"cwd": str(loopx_project)})
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(say, rt, other.agent, "hello")
                nursery.start_soon(say, rt, mine.agent, "/loopx write the artifact")
        assert rt.loopx.continuations["mine"].activation.active is True
        assert rt.loopx.continuations["other"].activation.active is False
        # Active but unbound: one read-only resolve, then stop; no quota call, no followup.
        assert [c[c.index("json") + 1] for c in calls()] == ["resolve-agent-thread"]
        assert "--thread-id" in calls()[0] and calls()[0][calls()[0].index("--thread-id") + 1] == "mine"
        assert rt.loopx.continuations["mine"].stopped == "binding missing"
        assert rt.loopx.continuations["mine"].pending is None

        # A fork of the activated session does not inherit the activation.
        await mine.dispose()
        await rt.fork_session("mine", "mine-fork")
        fork = await rt.resume_agent(resume_session_id="mine-fork", agent_options={"cwd": str(loopx_project)})
        with trio.fail_after(60):
            await say(rt, fork.agent, "continue")
        assert rt.loopx.continuations["mine-fork"].activation.active is False
        assert len(calls()) == 1


async def test_a_successful_model_skill_call_activates(tmp_path, loopx_env, loopx_project, shim):
    command, calls = shim
    write_skill(loopx_project, "loopx")
    async with open_runtime(tmp_path, loopx_env, loopx_project, command) as rt:
        handle = await rt.create_agent(session_id="model-path", agent_options={"cwd": str(loopx_project)})
        with trio.fail_after(60):
            await say(rt, handle.agent, 'call: skill {"name": "loopx"}')
        assert rt.loopx.continuations["model-path"].activation.active is True
        assert len(calls()) == 1


async def bind(client: LoopxClient, session_id: str, goal: str = "g1", agent: str = "a1") -> None:
    for args in [
        ("bootstrap", "--project", ".", "--goal-id", goal, "--objective", "Write it",
         "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only"),
        ("register-agent", "--goal-id", goal, "--agent-id", agent, "--require-new", "--execute"),
        ("bind-agent-thread", "--goal-id", goal, "--thread-id", session_id,
         "--host-surface", "deepseek-harness-native", "--agent-id", agent, "--execute"),
        ("todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent", "--claimed-by", agent,
         "--task-class", "advancement_task", "--text", "[P0] Write it"),
    ]:
        result = await client.run(*args)
        assert getattr(result, "payload", {}).get("ok") is True, result


async def test_human_input_wins_at_pre_step(tmp_path, loopx_env, loopx_project, loopx_command, shim):
    command, calls = shim
    write_skill(loopx_project, "loopx")
    client = LoopxClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(120):
        await bind(client, "busy")

    human_answered = trio.Event()

    def respond(request):
        last = request.messages[-1]
        if last.text == "I changed my mind":
            human_answered.set()
        return Reply("ok")

    async def a_person_types_meanwhile(pre, next_):
        if any(m.source is not None and m.source.kind == "loopx-continuation" for m in pre.messages):
            agent.followup("I changed my mind")  # arrives while the continuation is at pre-step
        return await next_(pre)

    async with open_runtime(tmp_path, loopx_env, loopx_project, command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.create_agent(
            session_id="busy",
            agent_options={"provider": "scripted", "model": "m", "cwd": str(loopx_project)},
            setup=lambda ctx: ctx.on("agent/pre-step", a_person_types_meanwhile) and None,
        )
        agent, driver = handle.agent, rt.loopx.continuations["busy"]
        with trio.fail_after(120):
            agent.followup("/loopx write it")
            await human_answered.wait()
            await agent.wait_idle()
        ends = [e.data["reason"] for e in (await agent.session.read_events()) if e.type == "turn/end"]
        await handle.dispose()

    assert ends[0] == {"kind": "completed"}
    assert len(ends[1].pop("messageIds")) == 1  # the continuation's message, vetoed
    assert ends[1] == {"kind": "blocked", "reason": "loopx continuation: human input is waiting"}
    assert ends[2] == {"kind": "completed"}  # the person's message, right after
    assert driver.admitted == []
    # The driver asked should-run twice with one turn id: admission, then the pre-step replay.
    should_runs = [c for c in calls() if c[4:6] == ["quota", "should-run"]]
    turn_ids = [c[c.index("--turn-instance-id") + 1] for c in should_runs]
    assert len(turn_ids) >= 2 and turn_ids[0] == turn_ids[1]


async def test_a_continuation_turn_that_asks_waits_for_a_person_and_nothing_automatic_answers(
    tmp_path, loopx_env, loopx_project, loopx_command
):
    write_skill(loopx_project, "loopx")
    client = LoopxClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(120):
        await bind(client, "asks")
    ran = []

    async def touch(arguments, ctx):
        ran.append(dict(arguments))
        return "touched"

    def respond(request):
        last = request.messages[-1]
        continuation = last.source is not None and last.source.kind == "loopx-continuation"
        if continuation and not ran and last.role == "user":
            return Reply(tool_calls=[ToolCall("touch", {"path": "a.txt"}, call_id="c1")])
        return Reply("ok")

    async with open_runtime(tmp_path, loopx_env, loopx_project, tuple(loopx_command)) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        rt.register_tool(Tool("touch", "touches a file", {"type": "object"}, touch))
        options = {"provider": "scripted", "model": "m", "cwd": str(loopx_project),
                   "approvals": {"tools": {"touch": "ask"}}}
        handle = await rt.create_agent(session_id="asks", agent_options=options)
        agent, driver = handle.agent, rt.loopx.continuations["asks"]
        with trio.fail_after(120):
            agent.followup("/loopx write it")
            [approval] = await agent.wait_approvals()  # asked in the continuation's turn
        assert approval.turn == 2 and len(driver.admitted) == 1
        assert (agent.status, rt.supervisor.admission.in_use) == ("running", 0)  # it waits, without a slot
        await trio.testing.wait_all_tasks_blocked(0.1)
        # Nothing automatic answered it or got in: the driver waits for the agent's idle.
        assert agent.pending_approvals() == [approval] and ran == []
        events = await agent.session.read_events()
        assert [e for e in events if e.type == "approval/answered"] == []
        assert sum(1 for e in events if e.type == "turn/start") == 2
        with trio.fail_after(120):
            await approval.answer("approve")  # a person
            await agent.wait_idle()
        [ended] = [e.data["reason"] for e in await agent.session.read_events() if e.type == "turn/end" and e.data["turn"] == 2]
        await handle.dispose()
    assert ran == [{"path": "a.txt"}] and ended == {"kind": "completed"}


async def test_its_own_pre_step_veto_is_evaluated_again_at_the_next_idle_checkpoint(
    tmp_path, loopx_env, loopx_project, loopx_command
):
    """Between the reservation and the pre-step a second goal binds the same session in
    LoopX, so the binding is ambiguous: the continuation's own pre-step check vetoes its
    step (the turn ends blocked), and the idle checkpoint right after evaluates again --
    it asks LoopX, which now says the binding is ambiguous, and stops on that answer,
    instead of staying quiet until a person acts."""
    write_skill(loopx_project, "loopx")

    class RebindAfterTheTaskBody(LoopxClient):
        """The real client; once the first task body is read (the continuation reserves
        right after it), a second goal binds this session."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls: list[str] = []
            self.rebound = False

        async def run(self, *args, retry=False):
            self.calls.append(" ".join(args[:2]) if args[0] == "quota" else args[0])
            return await super().run(*args, retry=retry)

        async def heartbeat_prompt(self, goal_id, agent_id, turn_id):
            body = await super().heartbeat_prompt(goal_id, agent_id, turn_id)
            if not self.rebound:
                self.rebound = True
                await bind(self, "veto", goal="g2", agent="a2")
            return body

    client = RebindAfterTheTaskBody(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(120):
        await bind(client, "veto")
    async with open_runtime(tmp_path, loopx_env, loopx_project, tuple(loopx_command)) as rt:
        handle = await rt.create_agent(session_id="veto", agent_options={"cwd": str(loopx_project)})
        driver = rt.loopx.continuations["veto"]
        driver.clients = lambda: client
        client.calls.clear()
        with trio.fail_after(180):
            await say(rt, handle.agent, "/loopx write it")
        ends = [e.data["reason"] for e in (await handle.agent.session.read_events()) if e.type == "turn/end"]
        assert [end["kind"] for end in ends] == ["completed", "blocked"]
        assert ends[1]["reason"] == "loopx continuation: binding changed (ambiguous)"
        # Evaluation, the rebinding (4 calls), the pre-step's resolve; then the next idle
        # checkpoint's own resolve, which LoopX answers "ambiguous": a stop on its answer.
        assert client.calls == [
            "resolve-agent-thread", "quota should-run", "heartbeat-prompt",
            "bootstrap", "register-agent", "bind-agent-thread", "todo",
            "resolve-agent-thread",
            "resolve-agent-thread",
        ]
        assert (driver.status.state, driver.status.reason) == ("stopped", "binding ambiguous")
        assert driver.history.latch is None and driver.admitted == []
        await handle.dispose()


STANDIN = """#!{python} -IS
# A LoopX stand-in for scheduler and transport faults: answers from a script of replies
# keyed by subcommand, logging every call.
import json, os, sys
argv = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")
sub = argv[argv.index("json") + 1] if "json" in argv else argv[0]
if sub == "resolve-agent-thread":
    tid = argv[argv.index("--thread-id") + 1]
    print(json.dumps({{"ok": True, "schema_version": "loopx_thread_agent_binding_resolution_v0",
        "status": "bound", "goal_id": "g1", "agent_id": "a1", "thread_id": tid,
        "host_surface": "deepseek-harness-native", "matches": [{{"goal_id": "g1", "agent_id": "a1"}}]}}))
    sys.exit(0)
if sub == "quota":
    turn = argv[argv.index("--turn-instance-id") + 1]
    calls = sum(1 for line in open({log!r}) if '"should-run"' in line)
    if {transport_failures} >= calls:
        sys.exit(7)  # a transport failure: non-zero, no JSON
    wait = {{"local_scheduler": {{"recommended_interval_minutes": 5}}}} if calls == {transport_failures} + 1 else {{}}
    print(json.dumps({{"ok": True, "should_run": False, "decision": "wait",
        "goal_id": "g1", "agent_identity": {{"agent_id": "a1"}},
        "heartbeat_receipt": {{"turn_instance_id": turn, "status": "committed"}},
        "scheduler_hint": {{"action": "wait", "cold_path_detail": wait}}}}))
    sys.exit(0)
sys.exit(2)
"""


def standin(tmp_path, transport_failures=0):
    log = tmp_path / "standin-calls.jsonl"
    script = tmp_path / "loopx-standin"
    script.write_text(STANDIN.format(python=sys.executable, log=str(log), transport_failures=transport_failures))
    script.chmod(0o755)

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return (str(script),), calls


def subcommands(calls):
    return [c[c.index("json") + 1] if c[c.index("json") + 1] != "quota" else "should-run" for c in calls]


@pytest.fixture
def jump_clock():
    # Real time (the stand-in's processes take what they take), except that the test
    # moves the clock past the scheduler's wait once the driver has armed its timer. No
    # autojump: it would leap to the CLI timeout while a slow stand-in starts.
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def immediate_retries(monkeypatch):
    """The client's retries back to back (their schedule is tested in test_loopx_client)."""
    monkeypatch.setattr(loopx_client, "ATTEMPT_BACKOFF", (0.0,) * len(loopx_client.ATTEMPT_BACKOFF))


async def test_a_scheduler_wait_arms_one_timer_and_wakes_a_new_checkpoint(tmp_path, loopx_project, jump_clock):
    command, calls = standin(tmp_path)
    write_skill(loopx_project, "loopx")
    async with Runtime.open(
        tmp_path / "home",
        skills=SkillCatalog.from_env(loopx_project, {"HOME": str(tmp_path)}),
        loopx=LoopxSettings(command=command, timeout=10_000, initialize=False),
        passivate_after=None,  # one continuation object throughout
    ) as rt:
        handle = await rt.create_agent(session_id="waiting", agent_options={"cwd": str(loopx_project)})
        driver = rt.loopx.continuations["waiting"]
        start = trio.current_time()
        await say(rt, handle.agent, "/loopx keep going")
        assert driver.timer is not None and driver.stopped == "waiting 300s"
        assert subcommands(calls()) == ["resolve-agent-thread", "should-run"]
        checkpoints = driver.checkpoints
        await trio.testing.wait_all_tasks_blocked()  # the timer task sleeps from now
        jump_clock.jump(290)  # (real time moves too: a margin for a slow machine)
        await trio.testing.wait_all_tasks_blocked()
        assert driver.checkpoints == checkpoints and driver.timer is not None  # not yet
        jump_clock.jump(10)
        with trio.fail_after(60):  # created after the jumps: 60 s of real time
            await driver.wait_checkpoint(checkpoints)  # the timer's own checkpoint
        assert trio.current_time() - start >= 300
        assert driver.timer is None and driver.pending is None
        assert driver.stopped == "should-run: wait"  # no second wait hint: stop, no timer
        assert subcommands(calls()) == ["resolve-agent-thread", "should-run"] * 2
        turn_ids = [c[c.index("--turn-instance-id") + 1] for c in calls() if "should-run" in c]
        assert turn_ids[0] == turn_ids[1]  # nothing was admitted: the same attempt, asked again
        assert_no_leaked_agent_tasks(rt)  # the continuation is the agent's one companion
        await handle.dispose()
        assert "waiting" not in rt.loopx.continuations
        assert_no_leaked_agent_tasks(rt)


async def test_a_goal_that_keeps_answering_wait_is_polled_as_loopx_s_scheduler_says(
    tmp_path, loopx_env, loopx_project, loopx_command, jump_clock
):
    """LoopX (the real CLI) keeps answering "wait" for an agent lane with nothing in scope;
    the continuation polls it exactly as LoopX's scheduler hint says: the progression's
    intervals one after another, the count started again when the hint's reset token
    changes (here: a person's gate lands on the lane meanwhile) and when a person speaks
    in the session, and no more polls once the unchanged-poll limit is reached. Every
    poll asks about the same attempt, so LoopX keeps one receipt, replayed."""
    write_skill(loopx_project, "loopx")

    class Recording(LoopxClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.answers: list[ShouldRun] = []

        async def should_run(self, goal_id, agent_id, turn_id):
            answer = await super().should_run(goal_id, agent_id, turn_id)
            assert isinstance(answer, ShouldRun), answer
            self.answers.append(answer)
            return answer

    client = Recording(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(120):
        # The session is a1's; the goal's only todo is a2's: a1 has nothing in scope.
        for args in [
            ("bootstrap", "--project", ".", "--goal-id", "g1", "--objective", "Write it",
             "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only"),
            ("register-agent", "--goal-id", "g1", "--agent-id", "a1", "--require-new", "--execute"),
            ("register-agent", "--goal-id", "g1", "--agent-id", "a2", "--require-new", "--execute"),
            ("bind-agent-thread", "--goal-id", "g1", "--thread-id", "polled",
             "--host-surface", "deepseek-harness-native", "--agent-id", "a1", "--execute"),
            ("todo", "add", "--goal-id", "g1", "--project", ".", "--role", "agent", "--claimed-by", "a2",
             "--task-class", "advancement_task", "--text", "[P0] Write it"),
        ]:
            result = await client.run(*args)
            assert getattr(result, "payload", {}).get("ok") is True, result

    async with open_runtime(tmp_path, loopx_env, loopx_project, tuple(loopx_command)) as rt:
        handle = await rt.create_agent(session_id="polled", agent_options={"cwd": str(loopx_project)})
        driver = rt.loopx.continuations["polled"]
        driver.clients = lambda: client
        waits: list[int] = []

        def armed() -> int:
            assert driver.timer is not None and driver.status.state == "waiting", driver.status
            seconds = int(driver.stopped.removeprefix("waiting ").removesuffix("s"))
            waits.append(seconds)
            return seconds

        async def poll_after(seconds: int) -> None:
            """Move the clock to just before the timer: nothing; then past it: one poll."""
            checkpoints = driver.checkpoints
            await trio.testing.wait_all_tasks_blocked()
            jump_clock.jump(seconds - 30)  # (real time moves too: a margin for a slow machine)
            await trio.testing.wait_all_tasks_blocked()
            assert driver.checkpoints == checkpoints and driver.timer is not None
            jump_clock.jump(30)
            with trio.fail_after(60):
                await driver.wait_checkpoint(checkpoints)

        with trio.fail_after(60):
            await say(rt, handle.agent, "/loopx keep going")  # the first answer
        await poll_after(armed())  # the second
        # The lane's state changes in LoopX while the continuation waits: a person's gate.
        with trio.fail_after(60):
            gate = await client.run("todo", "add", "--goal-id", "g1", "--project", ".", "--role", "user",
                                    "--task-class", "user_gate", "--blocks-agent", "a1", "--text", "Decide")
        assert gate.payload["ok"] is True
        for _ in range(4):  # the third (a new reset token) to the sixth
            await poll_after(armed())
        # The limit: that poll was the final check; nothing changed, so no timer any more.
        assert driver.timer is None and driver.status.state == "stopped"
        assert driver.status.reason.startswith("LoopX's scheduler: unchanged after 3 polls")
        await trio.testing.wait_all_tasks_blocked()
        jump_clock.jump(48 * 3600)
        await trio.testing.wait_all_tasks_blocked()
        assert len(client.answers) == 6  # not polled again, however long it waits

        # What LoopX said (2.1.1): an out-of-scope lane backs off 10, 20, 30, 60 minutes,
        # a lane gated on a person 30, 60, 120; three unchanged polls each, then stop.
        hints = [a.scheduler for a in client.answers]
        first, gated = hints[0], hints[2]
        assert (first.progression_minutes, first.unchanged_poll_limit, first.after_limit) == (
            (10.0, 20.0, 30.0, 60.0), 3, "stop_tick_loop")
        assert (gated.progression_minutes, gated.unchanged_poll_limit) == ((30.0, 60.0, 120.0), 3)
        assert [h.reset_token for h in hints] == [first.reset_token] * 2 + [gated.reset_token] * 4
        assert first.reset_token != gated.reset_token
        assert all(not a.should_run for a in client.answers)
        # The progression from its start, and again from its start under the new token.
        assert waits == [600, 1200, 1800, 3600, 7200]
        # One attempt: every poll asked about the same turn, whose receipt was replayed.
        assert len({a.turn_id for a in client.answers}) == 1
        assert [a.receipt_status for a in client.answers] == ["committed"] + ["replayed"] * 5

        # A person's message in the session counts from the start again.
        with trio.fail_after(60):
            await say(rt, handle.agent, "any news?")
        assert armed() == 1800 and driver.status.reason.endswith("(unchanged poll 1 of 3)")
        assert len(client.answers) == 7
        await handle.dispose()


async def test_should_run_transport_failures_retry_with_one_turn_id_then_stop(
    tmp_path, loopx_project, immediate_retries
):
    command, calls = standin(tmp_path, transport_failures=3)  # every attempt fails
    write_skill(loopx_project, "loopx")
    async with Runtime.open(
        tmp_path / "home",
        skills=SkillCatalog.from_env(loopx_project, {"HOME": str(tmp_path)}),
        loopx=LoopxSettings(command=command, timeout=10_000, initialize=False),
        passivate_after=None,  # one continuation object throughout
    ) as rt:
        handle = await rt.create_agent(session_id="flaky", agent_options={"cwd": str(loopx_project)})
        driver = rt.loopx.continuations["flaky"]
        await say(rt, handle.agent, "/loopx keep going")
        attempts = [c for c in calls() if "should-run" in c]
        assert len(attempts) == 3  # the contract's budget: three attempts in all
        assert len({c[c.index("--turn-instance-id") + 1] for c in attempts}) == 1  # one identity
        assert driver.stopped == "should-run failed: exit code 7 without JSON"
        assert driver.timer is None and driver.pending is None  # no breaker, no endless retry
        await handle.dispose()
