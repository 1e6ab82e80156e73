"""The template's own test: the loop's setup on a real loopdock runtime, offline.

It goes through ``rt.create_agent(setup=...)`` rather than the dock so that it checks
exactly what the loop composes, whatever else the dock adds.
"""

import trio
from loopdock_loop_template import LOOPS, PROMPT_SECTION, PROMPT_TEXT, TEMPLATE_LOOP

from loopdock import Runtime, ScriptedAdapter


async def test_template_loop_composes_a_concise_read_only_agent(tmp_path):
    assert LOOPS == (TEMPLATE_LOOP,) and TEMPLATE_LOOP.id == "template-concise"
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home") as rt:
            # A scripted model records the request, so we can see what the model is shown.
            model = ScriptedAdapter(["ok"])
            rt.register_adapter("scripted", model)
            handle = await rt.create_agent(
                session_id="t1",
                agent_options={"provider": "scripted", "model": "scripted-1"},
                setup=TEMPLATE_LOOP.setup,
            )
            agent = handle.agent
            assert agent.prompt_sections[PROMPT_SECTION] == PROMPT_TEXT
            assert set(agent.tools.names()) == {"read_file", "list_dir"}

            agent.followup("What is 2 + 2?")
            await agent.wait_idle()
            [request] = model.requests
            assert PROMPT_TEXT in request.system
            assert {tool.name for tool in request.tools} == {"read_file", "list_dir"}
            ends = [e.data["reason"]["kind"] for e in await agent.session.read_events() if e.type == "turn/end"]
            assert ends == ["completed"]
            await handle.dispose()
