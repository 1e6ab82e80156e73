"""A continuation a person can leave running, on the REAL loopx CLI (2.1.1, Node 22).

One scenario per behaviour, each on a fresh LoopX project and runtime home:

- a cancelled continuation turn latches the continuation, also across a restart, until a
  person speaks; LoopX then reports that turn unsettled and the continuation resumes it
  under its own turn id; a turn the model completed without settling needs a person, and
  Start offers LoopX's recovery turn; the goal id is 150 characters long (LoopX binds it)
  and an agent beside it never notices anything;
- a restart in the middle of a continuation turn is not a person's decision: the turn is
  resumed without anyone acting;
- a scheduler wake-up and an idle checkpoint evaluating at once admit one turn;
- ``/loopx-init`` repairs the CLI for agents that existed before it: their continuations
  call the repaired CLI from their next evaluation on.

Each CLI call costs ~0.7 s; the scenarios count every call they cause (a client that
records them) and assert on what LoopX itself answers. Nothing sleeps to synchronise.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from loopdock import Runtime
from loopdock.actors._faults import FAULT_KIND
from loopdock.actors.loopx import LoopxSettings
from loopdock.actors.loopx._continuation import RECOVERY_NOTE, RESUME_NOTE
from loopdock.runtime.loopx import HOST_SURFACE, LoopxClient, LoopxOk, ShouldRun
from loopdock.runtime.models import Reply, ScriptedAdapter
from loopdock.runtime.skills import SkillCatalog

PHASE = 180
LONG_GOAL = "goal-" + "g" * 145  # LoopX binds a goal id of 150 characters


class RecordingClient(LoopxClient):
    """The real client, recording each call's subcommand (and should-run turn ids)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []
        self.should_runs: list[str] = []

    async def run(self, *args, retry=False):
        self.calls.append(" ".join(args[:2]) if args[0] == "quota" else args[0])
        if args[:2] == ("quota", "should-run"):
            self.should_runs.append(args[args.index("--turn-instance-id") + 1])
        return await super().run(*args, retry=retry)


async def ok(client: LoopxClient, *args: str) -> dict:
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return dict(result.payload)


async def bind(client: LoopxClient, session_id: str, goal: str = "g1", agent: str = "a1") -> None:
    await ok(client, "bootstrap", "--project", ".", "--goal-id", goal, "--objective", "Write the notes",
             "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
    await ok(client, "register-agent", "--goal-id", goal, "--agent-id", agent, "--require-new", "--execute")
    await ok(client, "bind-agent-thread", "--goal-id", goal, "--thread-id", session_id,
             "--host-surface", HOST_SURFACE, "--agent-id", agent, "--execute")
    await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent", "--claimed-by", agent,
             "--task-class", "advancement_task", "--text", "[P0] Write the notes")


def write_loopx_skill(project: Path) -> None:
    folder = project / ".agents" / "skills" / "loopx"
    folder.mkdir(parents=True, exist_ok=True)
    folder.joinpath("SKILL.md").write_text("---\nname: loopx\ndescription: test skill\n---\nUse loopx.\n")


def open_runtime(home: Path, env, project: Path, command, **loopx):
    return Runtime.open(
        home, env=env, skills=SkillCatalog.from_env(project, env),
        loopx=LoopxSettings(env=env, command=tuple(command), timeout=120, initialize=False, **loopx),
    )


def is_continuation(message) -> bool:
    return message.source is not None and message.source.kind == "loopx-continuation"


async def continuations(agent) -> list[tuple[str, str]]:
    """(turn id, text) of every continuation message that entered a model step."""
    return [(e.data["source"]["turnInstanceId"], e.data["content"][0]["text"]) for e in (await agent.session.read_events())
            if e.type == "user/message" and e.data.get("source", {}).get("kind") == "loopx-continuation"]


async def turn_ends(agent) -> list[str]:
    return [e.data["reason"]["kind"] for e in (await agent.session.read_events()) if e.type == "turn/end"]


async def test_a_cancelled_turn_latches_across_a_restart_and_is_resumed_when_a_person_speaks(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    write_loopx_skill(loopx_project)
    client = RecordingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(PHASE):
        await bind(client, "s-latch", goal=LONG_GOAL)
    never = trio.Event()
    first_turn = trio.Event()

    def respond(request):
        last = request.messages[-1]
        if is_continuation(last) and not first_turn.is_set():
            first_turn.set()
            return Reply(block=never)  # the person cancels this one
        return Reply("ok")

    home = tmp_path / "home"
    async with open_runtime(home, loopx_env, loopx_project, loopx_command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        options = {"provider": "scripted", "model": "m", "cwd": str(loopx_project)}
        handle = await rt.create_agent(session_id="s-latch", agent_options=options)
        bystander = await rt.create_agent(session_id="s-bystander", agent_options=options)
        driver = rt.loopx.continuations["s-latch"]
        driver.clients = lambda: client
        client.calls.clear()
        with trio.fail_after(PHASE):
            handle.agent.followup("/loopx write the notes")
            await first_turn.wait()
            await trio.testing.wait_all_tasks_blocked()  # the reservation's watcher takes in its admission
            (turn_id,) = driver.admitted
            handle.agent.cancel("the person pressed stop")
            await driver.wait_quiescent()
            calls_when_latched = len(client.calls)
            bystander.agent.followup("hello")
            await rt.loopx.continuations["s-bystander"].wait_quiescent()
        assert (await turn_ends(handle.agent))[-1] == "aborted"
        assert driver.status.state == "quiet" and driver.status.reason.startswith("the last turn was cancelled")
        assert [t for t, _ in await continuations(handle.agent)] == [turn_id]
        assert await turn_ends(bystander.agent) == ["completed"]  # the agent beside it never noticed
        # The continuation came with the 150-character goal id LoopX bound.
        (source,) = [e.data["source"] for e in (await handle.agent.session.read_events())
                     if e.type == "user/message" and e.data["source"]["kind"] == "loopx-continuation"]
        assert source["goalId"] == LONG_GOAL and len(LONG_GOAL) == 150
        assert not [e for e in (await handle.agent.session.read_events())
                    if e.type == "system/message" and e.data["source"]["kind"] == FAULT_KIND]

    # A restart: the latch is folded from the session log again; still no CLI call.
    async with open_runtime(home, loopx_env, loopx_project, loopx_command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.resume_agent(resume_session_id="s-latch", agent_options=options)
        driver = rt.loopx.continuations["s-latch"]
        driver.clients = lambda: client
        with trio.fail_after(PHASE):
            await driver.wait_quiescent()
        assert driver.status.state == "quiet" and len(client.calls) == calls_when_latched

        # A person speaks: LoopX says the cancelled turn is unsettled; it is resumed under
        # its own id (one new receipt for the recovery answer, none for the resumption).
        with trio.fail_after(PHASE):
            handle.agent.followup("please go on")
            await driver.wait_quiescent()
        resumed = (await continuations(handle.agent))[1:]
        assert [t for t, _ in resumed] == [turn_id]
        assert resumed[0][1].startswith(RESUME_NOTE) and f"LOOPX_TURN={turn_id}" in resumed[0][1]
        fresh = [t for t in client.should_runs if t != turn_id]
        assert len(set(fresh)) == 1

        # The model completed that turn without settling it: LoopX still owes its closeout,
        # and only a person may start the recovery.
        assert driver.status.state == "needs-person", driver.status
        assert turn_id in (driver.status.reason or "")
        owed = fresh[0]
        assert set(client.should_runs[-1:]) == {owed}  # asked again with the owed id: no new receipt

        with trio.fail_after(PHASE):
            await driver.start()  # the GoalBar's Start: the go-ahead
            await driver.wait_quiescent()
        recovery = (await continuations(handle.agent))[2:]
        assert [t for t, _ in recovery] == [owed] and recovery[0][1].startswith(RECOVERY_NOTE)
        assert f"LOOPX_TURN={owed}" in recovery[0][1]
        await handle.dispose()

    answer = await client.should_run(LONG_GOAL, "a1", turn_id)
    assert isinstance(answer, ShouldRun) and answer.receipt_status == "replayed"


async def test_a_restart_in_the_middle_of_a_turn_resumes_it_without_a_person(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    write_loopx_skill(loopx_project)
    client = RecordingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(PHASE):
        await bind(client, "s-restart")
    in_turn = trio.Event()
    never = trio.Event()

    def respond(request):
        if is_continuation(request.messages[-1]) and not in_turn.is_set():
            in_turn.set()
            return Reply(block=never)  # the runtime goes away during this model call
        return Reply("ok")

    home = tmp_path / "home"
    options = {"provider": "scripted", "model": "m", "cwd": str(loopx_project)}
    async with open_runtime(home, loopx_env, loopx_project, loopx_command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.create_agent(session_id="s-restart", agent_options=options)
        rt.loopx.continuations["s-restart"].clients = lambda: client
        with trio.fail_after(PHASE):
            handle.agent.followup("/loopx write the notes")
            await in_turn.wait()
            await trio.testing.wait_all_tasks_blocked()  # the reservation's watcher takes in its admission
        (turn_id,) = rt.loopx.continuations["s-restart"].admitted
    # closing the runtime ended the turn (aborted: disposed)

    async with open_runtime(home, loopx_env, loopx_project, loopx_command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.resume_agent(resume_session_id="s-restart", agent_options=options)
        driver = rt.loopx.continuations["s-restart"]
        driver.clients = lambda: client
        with trio.fail_after(PHASE):
            await driver.wait_quiescent()
        assert (await turn_ends(handle.agent))[-2:] == ["aborted", "completed"]
        assert [t for t, _ in await continuations(handle.agent)] == [turn_id, turn_id]
        assert driver.admitted == [turn_id]
        await handle.dispose()


async def test_a_wake_up_and_an_idle_checkpoint_at_once_admit_one_turn(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    write_loopx_skill(loopx_project)
    client = RecordingClient(loopx_command, project=loopx_project, env=loopx_env, timeout=120)
    with trio.fail_after(PHASE):
        await bind(client, "s-once")
    entered: list[str] = []

    def respond(request):
        if is_continuation(request.messages[-1]):
            entered.append(request.messages[-1].source.fields["turnInstanceId"])
        return Reply("ok")

    gate = trio.Event()

    async def hold_continuations(pre, next_):
        # Keeps the first continuation's turn open until the test is done requesting.
        if any(is_continuation(m) for m in pre.messages):
            await gate.wait()
        return await next_(pre)

    async with open_runtime(tmp_path / "home", loopx_env, loopx_project, loopx_command) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(respond))
        handle = await rt.create_agent(
            session_id="s-once", agent_options={"provider": "scripted", "model": "m", "cwd": str(loopx_project)},
            setup=lambda ctx: ctx.on("agent/pre-step", hold_continuations) and None,
        )
        driver = rt.loopx.continuations["s-once"]
        driver.clients = lambda: client

        with trio.fail_after(PHASE):
            handle.agent.followup("/loopx write the notes")
            await handle.agent.wait_idle()  # the person's turn is over: the idle checkpoint runs
            async with trio.open_nursery() as nursery:
                nursery.start_soon(driver.checkpoint)
                for _ in range(3):
                    driver.request()  # what the scheduler's timer does when it fires
                nursery.start_soon(driver.checkpoint)
            gate.set()
            await driver.wait_quiescent()
        assert len(entered) == 1 and driver.admitted == entered
        # Asked once and replayed once at pre-step, with no other attempt in between: the
        # requests made meanwhile found the turn queued (before, two evaluations could
        # each admit a turn of their own).
        assert client.should_runs[:2] == [entered[0], entered[0]]
        await handle.dispose()


BROKEN = "#!/bin/sh\n# A LoopX command that no longer works (an upgrade gone wrong).\nexit 3\n"


async def test_loopx_init_repairs_the_cli_of_agents_that_existed_before_it(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    write_loopx_skill(loopx_project)
    broken = tmp_path / "broken-loopx"
    broken.write_text(BROKEN)
    broken.chmod(0o755)
    env = {**loopx_env, "DSH_AGENTS_HOME": str(tmp_path / "agents")}
    client = LoopxClient(loopx_command, project=loopx_project, env=env, timeout=120)
    with trio.fail_after(PHASE):
        await bind(client, "s-repair")
    options = {"provider": "scripted", "model": "m", "cwd": str(loopx_project)}
    async with open_runtime(tmp_path / "home", env, loopx_project, [str(broken)]) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("ok")))
        handle = await rt.create_agent(session_id="s-repair", agent_options=options)
        other = await rt.create_agent(session_id="s-other", agent_options=options)
        driver = rt.loopx.continuations["s-repair"]
        with trio.fail_after(PHASE):
            handle.agent.followup("/loopx write the notes")
            await driver.wait_quiescent()
        assert driver.status.state == "failed" and driver.admitted == []
        assert driver.status.reason == "binding unavailable: exit code 3 without JSON"
        faults = [e.data["source"] for e in (await handle.agent.session.read_events())
                  if e.type == "system/message" and e.data["source"]["kind"] == FAULT_KIND]
        assert [f["error"] for f in faults] == ["binding unavailable: exit code 3 without JSON"]

        with trio.fail_after(PHASE):
            result = await rt.execute_command("s-repair", "/loopx-init")
        assert result.ok, result.message
        repaired = rt.loopx.command
        assert repaired != (str(broken),) and Path(repaired[-1]).name == "loopx"
        # Both continuations (created before the repair) now build clients on it.
        assert driver.clients().command == rt.loopx.continuations["s-other"].clients().command == repaired

        with trio.fail_after(PHASE):
            handle.agent.followup("please go on")
            await driver.wait_quiescent()
        assert len(driver.admitted) == 1 and driver.status.state != "failed"
        await handle.dispose()
        await other.dispose()
