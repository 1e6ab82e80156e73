"""``Runtime.serve_bridge``: what ``loopdock serve`` serves, from an embedded runtime, over
a real websocket on loopback. A test plays the DSH host (hello, ``select``, live agent
events, acks); tests/loopdock/test_readme_embedded_bridge_e2e.py does it with a real
``dsh headless``."""

from __future__ import annotations

import json
import socket

import pytest
import trio
from trio_websocket import open_websocket

from loopdock import Bridge, DshAgent, LoopdockError, Runtime
from loopdock.bridge._token import load_or_create_token


def frame(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


async def test_a_dsh_host_gets_the_dock_s_answer_and_its_agents_the_runtime_s_messages(tmp_path):
    async with Runtime.open(tmp_path / "home") as rt:  # LoopX off: agents mirrored all the same
        before = await rt.create_agent(session_id="own-1")
        with trio.fail_after(60):
            async with rt.serve_bridge(project=tmp_path) as bridge:
                assert isinstance(bridge, Bridge) and bridge.port > 0
                assert bridge.url == f"ws://127.0.0.1:{bridge.port}"
                assert bridge.token == load_or_create_token(rt.home)  # what dsh-patch writes
                async with open_websocket("127.0.0.1", bridge.port, "/dsh", use_ssl=False) as ws:
                    hello = {"token": bridge.token, "role": "dsh-host", "protocol": 1,
                             "capabilities": ["events", "live", "commands", "pre-step", "dock"]}
                    await ws.send_message(frame("hello", hello))
                    assert json.loads(await ws.get_message())["type"] == "welcome"
                    # dock mode: the runtime's dock picks the loop of a new DSH session
                    await ws.send_message(frame("select", {"op": "create", "sessionId": "dsh-1",
                                                           "agentOptions": {"provider": "ping", "model": "ping-1"}}, id="h1"))
                    reply = json.loads(await ws.get_message())
                    assert (reply["type"], reply["re"]) == ("selection", "h1")
                    assert (reply["data"]["loop"], reply["data"]["driver"]) == ("standard", "default")
                    await ws.send_message(frame("live", {"items": [{"type": "agent/created", "agentId": "dsh-1",
                                                                    "data": {"source": "startup", "sessionId": "dsh-1",
                                                                             "cwd": str(tmp_path)}}]}))
                    agents = bridge.dsh_agents()
                    agent = await agents.__anext__()
                    assert isinstance(agent, DshAgent) and (agent.id, agent.cwd) == ("dsh-1", tmp_path)
                    assert bridge.hosts.agents["dsh-1"] is agent.live
                    agent.followup("And what will you do next?")
                    request = json.loads(await ws.get_message())
                    assert (request["type"], request["data"]["agentId"]) == ("followup", "dsh-1")
                    assert request["data"]["message"]["content"] == [{"type": "text", "text": "And what will you do next?"}]
                    await ws.send_message(frame("ack", {"ok": True}, re=request["id"]))
                # The host closed the bridge (as the plugin does when DSH unloads it): the
                # agent is gone for the runtime too.
                await agent.wait_closed()
                assert bridge.hosts.agents == {}
                await agents.aclose()
        assert rt.get_agent("own-1") is before.agent  # the runtime's own agents are untouched


async def test_dsh_agents_gives_each_live_agent_once_in_the_order_they_came(tmp_path):
    from loopdock.actors import LiveEvent

    class Host:
        id, role, closed = "c1", "dsh-host", None

    async with Runtime.open(tmp_path / "home") as rt:
        with trio.fail_after(60):
            async with rt.serve_bridge(project=tmp_path) as bridge:
                host = Host()
                bridge.hosts.connected(host)
                created = [LiveEvent("agent/created", a, {"source": "startup", "sessionId": a}) for a in ("a", "b")]
                await bridge.hosts.on_live(host, created[:1])
                first = bridge.dsh_agents()
                assert (await first.__anext__()).id == "a"
                await bridge.hosts.on_live(host, [*created[1:], LiveEvent("agent/disposed", "a", {})])
                assert (await first.__anext__()).id == "b"
                # a later iterator starts with those live now
                later = bridge.dsh_agents()
                assert (await later.__anext__()).id == "b"
                await first.aclose()
                await later.aclose()


async def test_a_taken_port_is_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with Runtime.open(tmp_path / "home") as rt:
            with pytest.raises(LoopdockError) as refused:
                async with rt.serve_bridge(port=port):
                    pytest.fail("served on a taken port")
            assert refused.value.code == "PORT_IN_USE"


async def test_the_console_shows_the_runtime_s_agents_live_before_the_bridge_opened(tmp_path):
    async with Runtime.open(tmp_path / "home") as rt:
        await rt.create_agent(session_id="own-1")
        with trio.fail_after(60):
            async with rt.serve_bridge(project=tmp_path) as bridge:
                async with open_websocket("127.0.0.1", bridge.port, "/goalbar", use_ssl=False) as ws:
                    hello = {"token": bridge.token, "role": "goalbar", "protocol": 1, "capabilities": ["live", "console"]}
                    await ws.send_message(frame("hello", hello))
                    assert json.loads(await ws.get_message())["type"] == "welcome"
                    pushed = json.loads(await ws.get_message())
                    (row,) = [item["data"] for item in pushed["data"]["items"] if item["agentId"] == "own-1"]
                    assert (row["origin"], row["sessionId"], row["loop"], row["driver"]) == (
                        "runtime", "own-1", "standard", "default"
                    )
