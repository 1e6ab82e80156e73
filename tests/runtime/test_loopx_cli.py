"""The LoopX client on the REAL loopx CLI (2.1.1, Node 22 from scripts/test), end to end.

Every test runs in its own temporary HOME, project and runtime root with
LOOPX_USAGE_PING=0. Each CLI call costs ~0.7 s, so each test builds only the state it needs
and the phases of a test are marked. Registration (bootstrap, register-agent,
bind-agent-thread, todo add) belongs to the loopx skill, so the tests run it through
``client.run(...)``; the typed methods are what the driver and the GoalBar use."""

import shlex

import pytest
import trio

from loopdock.runtime._ids import check_session_id
from loopdock.runtime.loopx import (
    HOST_SURFACE,
    LOOPX_TURN_PATTERN,
    LifecycleResult,
    LoopxClient,
    LoopxFailure,
    LoopxOk,
    ShouldRun,
    SkillsResult,
    TaskBody,
    ThreadBinding,
    TodoProgress,
)

# Generous per-phase bounds: a phase is a handful of ~0.7 s calls.
PHASE = 90


@pytest.fixture
def client(loopx_command, loopx_project, loopx_env, loopx_runtime_root) -> LoopxClient:
    return LoopxClient(
        loopx_command, project=loopx_project, env=loopx_env, timeout=60, runtime_root=loopx_runtime_root
    )


async def ok(client: LoopxClient, *args: str) -> dict:
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return dict(result.payload)


async def new_goal(client: LoopxClient, goal_id: str, agent_id: str) -> None:
    """The skill's registration choreography for one goal with one agent lane."""
    await ok(client, "bootstrap", "--project", ".", "--goal-id", goal_id, "--objective", f"Test goal {goal_id}",
             "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
    registered = await ok(client, "register-agent", "--goal-id", goal_id, "--agent-id", agent_id,
                          "--require-new", "--execute")
    assert registered["registered_agents"] == [agent_id]


async def bind(client: LoopxClient, goal_id: str, agent_id: str, thread_id: str) -> None:
    bound = await ok(client, "bind-agent-thread", "--goal-id", goal_id, "--thread-id", thread_id,
                     "--host-surface", HOST_SURFACE, "--agent-id", agent_id, "--execute")
    assert bound["binding"]["status"] == "bound" and bound["registration_readback"]["verified"] is True


PLACEHOLDERS = {
    "<validated_progress>": "validated_progress",
    "<scale>": "implementation",
    "<outcome>": "primary_goal_outcome",
    "<boundary>": "semantic_closeout",
    "<validated evidence>": "tests pass",
}


def plan_args(client: LoopxClient, template: str) -> list[str]:
    """A settlement-plan command template as ``client.run`` arguments: the template must
    start with exactly the client's own executable name and global options; placeholders
    get the values this test's (pretend) work validated."""
    words = shlex.split(template)
    expected_globals = client.argv()[len(client.command):]
    assert words[0] == "loopx"
    assert words[1:1 + len(expected_globals)] == expected_globals, template
    args = [PLACEHOLDERS.get(w, w) for w in words[1 + len(expected_globals):]]
    assert not any(a.startswith("<") and a.endswith(">") for a in args), args
    return args


async def test_version_and_thread_binding_resolution(client):
    session = check_session_id("dsh-session-0001")  # a loopdock session id is a valid thread id

    # Phase 1: the CLI is the one the test extra pins.
    with trio.fail_after(PHASE):
        version = await client.version()
    assert version.parts == (2, 1, 1)

    # Phase 2: register and bind one goal/agent to the session; resolve it and a stranger.
    with trio.fail_after(PHASE):
        await new_goal(client, "goal-one", "agent-one")
        await bind(client, "goal-one", "agent-one", session)
        bound = await client.resolve_thread(session)
        missing = await client.resolve_thread("dsh-session-9999")
    assert bound == ThreadBinding("bound", "goal-one", "agent-one")
    assert missing == ThreadBinding("missing")

    # Phase 3: a second goal binding the same session makes it ambiguous (LoopX allows
    # the second bind and fails closed on resolution, listing both matches).
    with trio.fail_after(PHASE):
        await new_goal(client, "goal-two", "agent-two")
        await bind(client, "goal-two", "agent-two", session)
        ambiguous = await client.resolve_thread(session)
        raw = await client.run("resolve-agent-thread", "--host-surface", HOST_SURFACE, "--thread-id", session)
    assert ambiguous == ThreadBinding("ambiguous", error_kind="thread_agent_binding_ambiguous")
    assert isinstance(raw, LoopxFailure)
    assert sorted(m["goal_id"] for m in raw.payload["matches"]) == ["goal-one", "goal-two"]


async def test_admission_heartbeat_settlement_and_replay(client):
    goal, agent, turn = "goal-work", "agent-work", "dsh-session-0002:turn-1"

    # Phase 1: one goal, one agent lane, one open P0 todo claimed by the agent.
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        added = await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                         "--claimed-by", agent, "--task-class", "advancement_task", "--text", "[P0] Write the artifact")
    todo_id = added["todo_id"]

    # Phase 2: admission with a turn id commits a receipt; the same turn id replays it.
    with trio.fail_after(PHASE):
        first = await client.should_run(goal, agent, turn)
        again = await client.should_run(goal, agent, turn)
    assert isinstance(first, ShouldRun) and isinstance(again, ShouldRun)
    assert (first.should_run, first.decision, first.receipt_status) == (True, "run", "committed")
    assert first.effect_id == f"{goal}:{agent}:{todo_id}:{turn}" and first.todo_id == todo_id
    assert first.wait_minutes is not None and first.wait_minutes > 0  # from --include-detail scheduler
    assert (again.should_run, again.receipt_status, again.effect_id) == (True, "replayed", first.effect_id)
    assert again.payload["heartbeat_receipt"]["event_id"] == first.payload["heartbeat_receipt"]["event_id"]
    plan = first.settlement_plan
    assert plan["schema_version"] == "quota_settlement_plan_v1"
    assert plan["identity"]["effect_id"] == first.effect_id
    steps = {step["kind"]: step for step in plan["ordered_steps"]}
    assert [s["kind"] for s in plan["ordered_steps"]] == ["validation", "durable_writeback", "quota_spend", "terminal_closeout"]

    # Phase 3: the thin task body for that exact turn.
    with trio.fail_after(PHASE):
        body = await client.heartbeat_prompt(goal, agent, turn)
    assert isinstance(body, TaskBody) and body.schema_version == "heartbeat_agent_input_v1"
    assert LOOPX_TURN_PATTERN.findall(body.text) == [turn]

    # Phase 4: run the plan's writeback and spend as given; a second spend replays.
    with trio.fail_after(PHASE):
        writeback = await ok(client, *plan_args(client, steps["durable_writeback"]["command_template"]))
        spend_args = plan_args(client, steps["quota_spend"]["command_template"])
        spent = await ok(client, *spend_args)
        replay = await ok(client, *spend_args)
    assert writeback["settlement_progress"]["next_step"] == "quota_spend"
    assert (spent["appended"], spent["idempotent_replay"]) == (True, False)
    assert spent["settlement_progress"]["state"] == "settled"
    assert (replay["appended"], replay["idempotent_replay"]) == (False, True)
    receipts = replay["settlement_result"]["receipts"]
    assert [r["step_kind"] for r in receipts] == ["validation", "durable_writeback", "quota_spend"]
    assert {r["effect_id"] for r in receipts} == {first.effect_id}

    # Phase 5: the conditional closeout. LoopX's hard-lease authority refuses `todo
    # complete` without a task lease fence, which the plan's template does not carry:
    # acquire one and pass its key and version.
    with trio.fail_after(PHASE):
        lease = await ok(client, "task-lease", "acquire", "--goal-id", goal, "--todo-id", todo_id,
                         "--owner", agent, "--idempotency-key", "lease-1")
        version = str(lease["lease"]["version"])
        closeout = plan_args(client, steps["terminal_closeout"]["command_template"])
        done = await ok(client, *closeout, "--task-lease-idempotency-key", "lease-1",
                        "--task-lease-expected-version", version)
        progress = await client.todo_progress(goal, agent)
    assert done["status"] == "done"
    assert progress == TodoProgress(done=1, open=0, total=1)


async def test_lifecycle_preview_stop_and_resume_with_readback(client):
    goal, agent = "goal-life", "agent-life"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                 "--claimed-by", agent, "--task-class", "advancement_task", "--text", "[P0] First")
        await ok(client, "todo", "add", "--goal-id", goal, "--project", ".", "--role", "agent",
                 "--claimed-by", agent, "--task-class", "advancement_task", "--text", "[P1] Second")

    # Phase 1: a preview writes nothing.
    with trio.fail_after(PHASE):
        preview = await client.goal_lifecycle(goal, "stop", execute=False)
    assert isinstance(preview, LifecycleResult)
    assert (preview.before_state, preview.after_state, preview.changed, preview.written) == ("active", "stopped", True, False)
    assert (preview.readback_status, preview.readback_verified) == ("not_executed", False)

    # Phase 2: stop for real, read back; admission then says stop, with no wait and no spend.
    with trio.fail_after(PHASE):
        stopped = await client.goal_lifecycle(goal, "stop", execute=True)
        skip = await client.should_run(goal, agent, "turn-stopped")
    assert (stopped.before_state, stopped.after_state, stopped.written) == ("active", "stopped", True)
    assert (stopped.readback_status, stopped.readback_verified) == ("verified", True)
    assert isinstance(skip, ShouldRun)
    assert (skip.should_run, skip.decision, skip.receipt_status) == (False, "skip", "committed")
    assert skip.scheduler_action == "stop_until_explicit_resume"
    assert skip.wait_minutes is None and skip.effect_id is None

    # Phase 3: resume for real, read back; the lane's progress is still readable.
    with trio.fail_after(PHASE):
        resumed = await client.goal_lifecycle(goal, "resume", execute=True)
        progress = await client.todo_progress(goal, agent)
    assert (resumed.before_state, resumed.after_state, resumed.changed) == ("stopped", "active", True)
    assert resumed.readback_verified
    assert progress == TodoProgress(done=0, open=2, total=2)
    assert progress.done + progress.open == progress.total


async def test_workflow_skills_inspect_install_and_user_owned_entry(client, tmp_path):
    skills = tmp_path / "agents" / "skills"
    with trio.fail_after(PHASE):
        before = await client.workflow_skills(skills, install=False)
        installed = await client.workflow_skills(skills, install=True)
        after = await client.workflow_skills(skills, install=False)
    assert isinstance(before, SkillsResult) and (before.operation, before.install_required) == ("inspect", True)
    assert isinstance(installed, SkillsResult) and installed.operation == "install"
    assert installed.entry_status == "created" and installed.ready is True
    assert {"loopx-project", "loopx-pr-program", "loopx-pr-review", "loopx-doc-registry", "loopx-self-repair"} <= set(installed.installed)
    assert set(installed.installed.values()) == {"created"}
    assert (after.install_required, after.ready, after.entry_status) == (False, True, "unchanged")
    entry = (skills / "loopx" / "SKILL.md").read_text()
    assert f"--host-surface {HOST_SURFACE}" in entry and '--thread-id "$DSH_SESSION_ID"' in entry

    # A user-owned entry skill is never overwritten: a typed refusal.
    mine = tmp_path / "mine"
    (mine / "loopx").mkdir(parents=True)
    (mine / "loopx" / "SKILL.md").write_text("# my own loopx skill\n")
    with trio.fail_after(PHASE):
        refused = await client.workflow_skills(mine, install=True)
    assert isinstance(refused, LoopxFailure)
    assert refused.payload["entry"]["status"] == "skipped_user_file"
    assert (mine / "loopx" / "SKILL.md").read_text() == "# my own loopx skill\n"
