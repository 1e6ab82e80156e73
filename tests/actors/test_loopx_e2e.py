"""Issue 4's end-to-end proof on the real loopx CLI (Node 22, temporary HOME and project).

A scripted model invokes the ``loopx`` skill, binds a goal to this exact session through
the shell tool, and stops. The continuation driver then admits one continuation: one
fresh turn id through should-run, the thin task body, the typed followup source and the
pre-step replay. The scripted model settles that turn through the shell exactly as the
settlement plan says. Afterwards LoopX holds one heartbeat receipt for the turn, one
spent slot, and every settlement receipt carries the same effect id.
"""

import json
import re
import shlex

import trio

from loopdock import LoopxSettings, Runtime
from loopdock.runtime.loopx import LOOPX_TURN_PATTERN, LoopxClient, LoopxOk, ShouldRun
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.skills import SkillCatalog
from loopdock.runtime.tools import ShellPolicy

SESSION = "e2e-session-1"
GOAL, AGENT = "goal-e2e", "agent-e2e"
LOOPX = "loopx --registry .loopx/registry.json --format json"
# Placeholders LoopX leaves in its writeback template for the agent to fill in.
FILL = {
    "<validated_progress>": "the artifact is written",
    "<scale>": "single_surface",
    "<outcome>": "outcome_progress",
    "<boundary>": "in_flight_continuation",
}


def shell(command: str) -> Reply:
    return Reply(tool_calls=[ToolCall("shell", {"command": command})])


def tool_json(request) -> dict:
    """The JSON a shell call printed (the last tool result the model saw)."""
    text = request.messages[-1].content[0].content
    assert text.startswith("exit code 0"), text[:300]
    return json.loads(text.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0])


def filled(template: str) -> str:
    for placeholder, value in FILL.items():
        template = template.replace(placeholder, shlex.quote(value))
    return template


class Model:
    """The scripted model: one reply per request, in a fixed plan."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.plan: dict | None = None
        self.settled = trio.Event()
        self.continuation_seen: list = []
        self.steps = iter(
            [
                # Turn 1: the person's task. Invoke the skill, bind this session, stop.
                lambda r: Reply(tool_calls=[ToolCall("skill", {"name": "loopx"})]),
                lambda r: shell(
                    f"{LOOPX} bootstrap --project . --goal-id {GOAL} --objective 'Write the artifact' "
                    "--adapter-kind read_only_project_map_v0 --adapter-status connected-read-only"
                ),
                lambda r: shell(f"{LOOPX} register-agent --goal-id {GOAL} --agent-id {AGENT} --require-new --execute"),
                lambda r: shell(
                    f"{LOOPX} bind-agent-thread --goal-id {GOAL} --thread-id {SESSION} "
                    f"--host-surface deepseek-harness-native --agent-id {AGENT} --execute"
                ),
                lambda r: shell(
                    f"{LOOPX} todo add --goal-id {GOAL} --project . --role agent --claimed-by {AGENT} "
                    "--task-class advancement_task --text '[P0] Write the artifact'"
                ),
                lambda r: Reply("The goal is bound to this session."),
                # Turn 2: the continuation. Run the guard for its exact turn, then the plan.
                self.guard,
                self.writeback,
                self.spend,
                self.done,
            ]
        )

    def __call__(self, request) -> Reply:
        return next(self.steps)(request)

    def guard(self, request) -> Reply:
        message = request.messages[-1]
        self.continuation_seen.append(message)
        (self.turn_id,) = LOOPX_TURN_PATTERN.findall(message.text)
        return shell(
            f"{LOOPX} quota should-run --goal-id {GOAL} --agent-id {AGENT} "
            f"--runtime-profile generic_cli --turn-instance-id {self.turn_id}"
        )

    def writeback(self, request) -> Reply:
        self.plan = tool_json(request)["interaction_contract"]["cli_channel"]["settlement_plan"]
        return shell(filled(self.step("durable_writeback")))

    def spend(self, request) -> Reply:
        return shell(self.step("quota_spend"))

    def done(self, request) -> Reply:
        self.settled.set()
        return Reply("Settled.")

    def step(self, kind: str) -> str:
        (step,) = [s for s in self.plan["ordered_steps"] if s["kind"] == kind]
        return step["command_template"]


async def test_a_bound_session_is_continued_and_settled_under_one_turn_identity(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    env = {**loopx_env, "DSH_AGENTS_HOME": str(tmp_path / "agents")}
    client = LoopxClient(loopx_command, project=loopx_project, env=env, timeout=120)
    with trio.fail_after(120):
        skills = await client.workflow_skills(tmp_path / "agents" / "skills", install=True)
    assert skills.entry_status == "created"

    model = Model()
    shell_env = {k: env[k] for k in ("PATH", "HOME", "LOOPX_USAGE_PING")}
    async with Runtime.open(
        tmp_path / "home",
        env=env,
        shell=ShellPolicy(allow=frozenset({"loopx"}), timeout=120, env=shell_env),
        skills=SkillCatalog.from_env(loopx_project, env),
        loopx=LoopxSettings(env=env, command=tuple(loopx_command), timeout=120, initialize=False),
    ) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(model))
        handle = await rt.create_agent(
            session_id=SESSION, agent_options={"provider": "scripted", "model": "m", "cwd": str(loopx_project)}
        )
        agent = handle.agent
        driver = rt.loopx.continuations[SESSION]
        assert driver.activation.active is False
        agent.followup("Write the artifact, please.")
        with trio.fail_after(240):
            await model.settled.wait()
            await agent.wait_idle()
        admitted = list(driver.admitted)
        events = await agent.session.read_events()
        await handle.dispose()

    # One continuation, admitted under the turn id the model then settled.
    assert admitted == [model.turn_id]
    turn_id = model.turn_id
    (continuation,) = model.continuation_seen
    assert continuation.source.kind == "loopx-continuation"
    assert dict(continuation.source.fields) == {
        "schemaVersion": "loopx_dsh_continuation_v0",
        "goalId": GOAL,
        "agentId": AGENT,
        "turnInstanceId": turn_id,
    }
    assert str(loopx_project) not in continuation.text  # no local absolute path reaches the model
    logged = [e for e in events if e.type == "user/message" and e.data.get("source", {}).get("kind") == "loopx-continuation"]
    assert [e.data["source"]["turnInstanceId"] for e in logged] == [turn_id]
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed", "completed"]

    # LoopX: the receipt for this turn replays (it exists once), and so does the spend.
    with trio.fail_after(120):
        first = await client.should_run(GOAL, AGENT, turn_id)
        second = await client.should_run(GOAL, AGENT, turn_id)
        spend = shlex.split(model.step("quota_spend"))[1:]
        spend = [a for a in spend if a not in ("--registry", ".loopx/registry.json", "--format", "json")]
        replay = await client.run(*spend)
    assert isinstance(first, ShouldRun) and isinstance(second, ShouldRun)
    assert (first.receipt_status, second.receipt_status) == ("replayed", "replayed")
    effect_id = first.effect_id
    assert effect_id.endswith(f":{turn_id}") and second.effect_id == effect_id
    assert first.payload["heartbeat_receipt"]["event_id"] == second.payload["heartbeat_receipt"]["event_id"]
    assert isinstance(replay, LoopxOk)
    assert (replay.payload["appended"], replay.payload["idempotent_replay"]) == (False, True)
    receipts = replay.payload["settlement_result"]["receipts"]
    assert [r["step_kind"] for r in receipts] == ["validation", "durable_writeback", "quota_spend"]
    assert {r["effect_id"] for r in receipts} == {effect_id}
    assert re.fullmatch(r"ld-[0-9a-f]{32}", turn_id)
