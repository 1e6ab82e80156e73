"""Skills through a real Runtime: ``/name`` typed by a person injects the body after the
original message, the model's ``skill`` tool returns it, and nothing else expands."""

import json
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from loopdock import Message, ProducerSource, Runtime, TextBlock
from loopdock.actors import Reject
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.skills import SkillCatalog
from loopdock.runtime.skills._watch import watch_supported

TIMEOUT = 10
SCRIPTED = {"provider": "scripted", "model": "script-1"}
BODY = "# Demo\n\nFollow the demo steps."


def write_skill(root: Path, name: str, body: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill\n---\n{body}\n")


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "project"
    write_skill(path / ".dsh" / "skills", "demo", BODY)
    return path


async def start(rt, adapter, session_id="a1"):
    rt.register_adapter("scripted", adapter)
    handle = await rt.create_agent(session_id=session_id, agent_options=SCRIPTED)
    return handle.agent


async def user_events(agent):
    return [e.data for e in (await agent.session.read_events()) if e.type == "user/message"]


def text_of(data):
    return "".join(b["text"] for b in data["content"] if b["type"] == "text")


async def test_slash_name_logs_the_original_then_the_skill_body(tmp_path, project):
    adapter = ScriptedAdapter(["done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            agent = await start(rt, adapter)
            sent = agent.followup("/demo do X")
            await agent.wait_idle()

            original, injected = await user_events(agent)
            assert original["id"] == sent.id
            assert text_of(original) == "/demo do X"
            assert original["source"] == {"kind": "user"}
            assert injected["source"] == {"kind": "skill-invocation", "name": "demo", "form": "instructions"}
            assert text_of(injected) == BODY
            assert injected["role"] == "user"
            # Both are in the step, in order, and the model saw both.
            types = [e.type for e in (await agent.session.read_events())]
            step = types.index("step/start")
            assert types[step + 1 : step + 3] == ["user/message", "user/message"]
            assert [m.text for m in adapter.requests[0].messages] == ["/demo do X", BODY]
            ends = [e.data["reason"]["kind"] for e in (await agent.session.read_events()) if e.type == "turn/end"]
            assert ends == ["completed"]


async def test_the_model_calling_the_skill_tool_gets_the_body(tmp_path, project):
    adapter = ScriptedAdapter([Reply(tool_calls=[ToolCall("skill", {"name": "demo"}, call_id="c1")]), "done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            agent = await start(rt, adapter)
            agent.followup("use the demo skill")
            await agent.wait_idle()

            calls = [e.data for e in (await agent.session.read_events()) if e.type == "tool/call"]
            results = [e.data for e in (await agent.session.read_events()) if e.type == "tool/result"]
            assert calls == [{"callId": "c1", "name": "skill", "arguments": json.dumps({"name": "demo"})}]
            [result] = results
            assert result["source"] == {"kind": "tool", "callId": "c1"}
            [block] = result["content"]
            assert (block["callId"], block["content"], block["isError"]) == ("c1", BODY, False)
            # The tool was offered with the catalog listed, and its result reached the model.
            [spec] = [t for t in adapter.requests[0].tools if t.name == "skill"]
            assert "- demo: The demo skill" in spec.description
            assert adapter.requests[1].messages[-1].content[0].content == BODY
            # The model path injects nothing: only the person's message is a user/message.
            assert [text_of(d) for d in await user_events(agent)] == ["use the demo skill"]


async def test_a_non_human_message_starting_with_slash_name_is_not_expanded(tmp_path, project):
    adapter = ScriptedAdapter(["one", "two"])
    automatic = Message("user", (TextBlock("/demo do X"),), ProducerSource("test-driver"))
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            agent = await start(rt, adapter)
            agent.followup(automatic)
            await agent.wait_idle()
            reservation = agent.reserve(
                Message("user", (TextBlock("/demo again"),), ProducerSource("test-driver"))
            )
            assert await reservation.wait() == "admitted"
            await agent.wait_idle()

            events = await user_events(agent)
            assert [e["source"]["kind"] for e in events] == ["test-driver", "test-driver"]
            assert [text_of(e) for e in events] == ["/demo do X", "/demo again"]
            assert [m.text for m in adapter.requests[1].messages] == ["/demo do X", "one", "/demo again"]


async def test_a_skill_added_on_disk_is_invoked_without_a_restart(tmp_path, project):
    adapter = ScriptedAdapter(["before", "after"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            agent = await start(rt, adapter)
            agent.followup("/fresh go")
            await agent.wait_idle()
            write_skill(project / ".agents" / "skills", "fresh", "Fresh instructions.")
            agent.followup("/fresh go")
            await agent.wait_idle()

            kinds = [(e["source"]["kind"], text_of(e)) for e in await user_events(agent)]
            assert kinds == [
                ("user", "/fresh go"),
                ("user", "/fresh go"),
                ("skill-invocation", "Fresh instructions."),
            ]


async def test_a_vetoed_invocation_injects_nothing(tmp_path, project):
    async def veto(pre, next_):
        return Reject("no demos")

    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            adapter = ScriptedAdapter([])
            agent = await start(rt, adapter)
            agent.pre_step.add(veto)
            sent = agent.followup("/demo do X")
            await agent.wait_idle()
            assert await user_events(agent) == []
            assert adapter.requests == []
            ends = [e.data["reason"] for e in (await agent.session.read_events()) if e.type == "turn/end"]
            assert ends == [{"kind": "blocked", "reason": "no demos", "messageIds": [sent.id]}]


async def test_the_default_catalog_reads_dsh_home_and_registers_the_tool(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            assert "skill" in rt.tools
            assert rt.skills.get("from-home") is None
            # conftest points DSH_HOME at a temporary directory.
            write_skill(Path(os.environ["DSH_HOME"]) / "skills", "from-home", "home body")
            await rt.skills.refreshed()  # as every model step does first
            skill = rt.skills.get("from-home")
            assert (skill.root, skill.body) == ("dsh-home", "home body")


async def test_a_broken_expander_never_loses_the_message(tmp_path, project):
    def broken(message):
        raise RuntimeError("boom")

    adapter = ScriptedAdapter(["done"])
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            rt.supervisor.expanders.insert(0, broken)
            rt.supervisor.expanders.append(lambda message: [])  # invalid: would drop it
            agent = await start(rt, adapter)
            agent.followup("/demo do X")
            await agent.wait_idle()
            # The skill expander between the two broken ones still did its work.
            assert [e["source"]["kind"] for e in await user_events(agent)] == ["user", "skill-invocation"]
            ends = [e.data["reason"]["kind"] for e in (await agent.session.read_events()) if e.type == "turn/end"]
            assert ends == ["completed"]


async def test_a_resumed_session_keeps_the_injected_skill_in_its_transcript(tmp_path, project):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            agent = await start(rt, ScriptedAdapter(["done"]))
            agent.followup("/demo do X")
            await agent.wait_idle()
        adapter = ScriptedAdapter(["again"])
        async with Runtime.open(tmp_path / "home", skills=SkillCatalog(project)) as rt:
            rt.register_adapter("scripted", adapter)
            handle = await rt.resume_agent(resume_session_id="a1", agent_options=SCRIPTED)
            handle.agent.followup("next")
            await handle.agent.wait_idle()
            assert [m.text for m in adapter.requests[0].messages] == ["/demo do X", BODY, "done", "next"]


@pytest.mark.skipif(not watch_supported(), reason="needs inotify")
async def test_the_runtime_watches_the_skill_roots_for_the_models_listing(tmp_path):
    with trio.fail_after(TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            # Runtime.open returns once the watcher (in the runtime's nursery) is in place.
            assert rt.skills._live_watches == 1
            tool = rt.tools.get("skill")
            assert "No skills are installed." in tool.spec.description
            write_skill(Path(os.environ["DSH_HOME"]) / "skills", "watched", "body")
            # The watcher rescans after the change (in a worker thread) by itself.
            while "- watched: The watched skill" not in tool.spec.description:
                await trio.testing.wait_all_tasks_blocked()
        assert rt.skills._live_watches == 0  # cancelled with the runtime
