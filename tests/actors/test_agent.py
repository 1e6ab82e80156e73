"""AgentActor: the concurrency contract (serialized turns, human priority, structured
cancellation), waterfalls, and the shape of a turn in the session log."""

import json

import attrs
import pytest
import trio
import trio.testing

from loopdock import Message, ProducerSource, TextBlock, user_message
from loopdock.actors import Reject, create_with_body
from loopdock.actors.dock import DriverLoop
from loopdock.runtime import (
    AgentClosedError,
    InvalidOptionsError,
    ModelError,
    UnknownAdapterError,
    UnknownToolError,
)
from loopdock.runtime.models import Finish, Reply, RetryNotice, ScriptedAdapter, TextDelta, ToolCall, Usage
from loopdock.runtime.tools import Tool

SCRIPTED = {"provider": "scripted", "model": "script-1"}


def automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), ProducerSource("test-driver", {"n": text}))


async def types(agent, *wanted):
    return [e.type for e in (await agent.session.read_events()) if not wanted or e.type in wanted]


async def turn_ends(agent):
    return [e.data["reason"] for e in (await agent.session.read_events()) if e.type == "turn/end"]


async def user_texts(agent):
    return [
        "".join(b["text"] for b in e.data["content"])
        for e in (await agent.session.read_events())
        if e.type == "user/message"
    ]


async def scripted_agent(rt, adapter, session_id="a1", **options):
    rt.register_adapter("scripted", adapter)
    return await rt.create_agent(session_id=session_id, agent_options={**SCRIPTED, **options})


# -- one serialized evaluation ---------------------------------------------------------


async def test_concurrent_followups_give_strictly_sequential_turns_in_order(rt, autojump_clock):
    in_flight = 0
    peak = 0

    async def respond(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1)  # a slow model: other followups arrive meanwhile
        in_flight -= 1
        return "ok"

    handle = await scripted_agent(rt, ScriptedAdapter(respond))
    sent = []

    async def send(i):
        await trio.sleep(i * 0.3)
        sent.append(handle.agent.followup(f"m{i}").id)

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(send, i)
    await handle.agent.wait_idle()

    assert peak == 1
    starts_and_ends = await types(handle.agent, "turn/start", "turn/end")
    assert starts_and_ends == ["turn/start", "turn/end"] * 40
    admitted = [e.data["id"] for e in (await handle.agent.session.read_events()) if e.type == "user/message"]
    assert admitted == sent


# -- human priority --------------------------------------------------------------------


async def test_human_input_cancels_unadmitted_reservation_and_goes_first(rt, autojump_clock):
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply("first", block=gate), "human reply", "auto reply"])
    handle = await scripted_agent(rt, adapter)
    agent = handle.agent
    agent.followup("start")
    await trio.testing.wait_all_tasks_blocked()
    assert agent.status == "running"

    reservation = agent.reserve(automatic("reserved"))
    agent.followup(automatic("plain automatic"))
    agent.followup("human")
    assert reservation.state == "cancelled"
    assert reservation.reason == "human-input"

    gate.set()
    await agent.wait_idle()
    assert await user_texts(agent) == ["start", "human", "plain automatic"]
    discards = [
        e.data for e in (await agent.session.read_events())
        if e.type == "agent/inbox/spliced" and e.data["op"] == "discard"
    ]
    assert [d["messageId"] for d in discards] == [reservation.message.id]


async def test_reservation_is_admitted_when_its_message_enters_a_step(rt):
    handle = await scripted_agent(rt, ScriptedAdapter(["done"]))
    reservation = handle.agent.reserve(automatic("continue"))
    with trio.fail_after(5):
        assert await reservation.wait() == "admitted"
        await handle.agent.wait_idle()
    assert await user_texts(handle.agent) == ["continue"]


async def test_only_producer_sources_may_reserve(rt):
    handle = await scripted_agent(rt, ScriptedAdapter([]))
    with pytest.raises(Exception) as info:
        handle.agent.reserve(user_message("I am a person"))
    assert info.value.code == "INVALID_RESERVATION"
    assert handle.agent.inbox_size == 0


# -- pre-step and request waterfalls ---------------------------------------------------


async def test_pre_step_reject_blocks_the_turn_and_the_agent_goes_on(rt):
    async def veto_first(pre, next_):
        if any(m.text == "vetoed" for m in pre.messages):
            return Reject("not now")
        return await next_(pre)

    adapter = ScriptedAdapter(["second reply"])
    rt.register_adapter("scripted", adapter)
    handle = await rt.create_agent(
        session_id="a1",
        agent_options=SCRIPTED,
        setup=lambda ctx: ctx.on("agent/pre-step", veto_first) and None,
    )
    agent = handle.agent
    reservation = agent.reserve(automatic("vetoed"))
    # Queued behind the vetoed one. Nothing wakes the agent again (unlike DSH 0.2.1,
    # where the inbox stalls after a reject): it must go on by itself.
    agent.followup(automatic("next"))
    with trio.fail_after(5):
        await agent.wait_idle()
    assert reservation.state == "rejected" and reservation.reason == "not now"
    vetoed = {"kind": "blocked", "reason": "not now", "messageIds": [reservation.message.id]}
    assert await turn_ends(agent) == [vetoed, {"kind": "completed"}]
    assert await user_texts(agent) == ["next"]
    assert len(adapter.requests) == 1


async def test_failing_pre_step_listener_fails_closed(rt):
    async def broken(pre, next_):
        raise RuntimeError("boom")

    rt.register_adapter("scripted", ScriptedAdapter([]))
    handle = await rt.create_agent(
        session_id="a1", agent_options=SCRIPTED, setup=lambda ctx: ctx.on("agent/pre-step", broken) and None
    )
    sent = handle.agent.followup("hi")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert await turn_ends(handle.agent) == [{"kind": "blocked", "reason": "pre-step listener failed", "messageIds": [sent.id]}]
    assert await types(handle.agent, "user/message", "request/header") == []


async def test_request_waterfall_may_rewrite_the_route(rt):
    adapter = ScriptedAdapter(["hi"])
    rt.register_adapter("scripted", adapter)

    async def reroute(request, next_):
        import attrs

        return await next_(attrs.evolve(request, model="rerouted-model"))

    handle = await rt.create_agent(
        session_id="a1", agent_options=SCRIPTED, setup=lambda ctx: ctx.on("agent/request", reroute) and None
    )
    handle.agent.followup("hello")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert adapter.requests[0].model == "rerouted-model"
    headers = [e.data for e in (await handle.agent.session.read_events()) if e.type == "request/header"]
    assert headers[0]["model"] == "rerouted-model"


# -- placements ------------------------------------------------------------------------


async def test_inject_does_not_wake_but_joins_the_next_step(rt):
    adapter = ScriptedAdapter(["ok"])
    handle = await scripted_agent(rt, adapter)
    handle.agent.inject("quiet note")
    await trio.testing.wait_all_tasks_blocked()
    assert await types(handle.agent, "turn/start") == []
    handle.agent.followup("go")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert await user_texts(handle.agent) == ["go", "quiet note"]
    assert [m.text for m in adapter.requests[0].messages] == ["go", "quiet note"]


async def test_steer_wakes_an_idle_agent(rt):
    handle = await scripted_agent(rt, ScriptedAdapter(["ok"]))
    handle.agent.steer("steered")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert await user_texts(handle.agent) == ["steered"]
    assert await turn_ends(handle.agent) == [{"kind": "completed"}]


async def test_steer_during_a_turn_adds_a_step(rt, autojump_clock):
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply("one", block=gate), "two"])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("start")
    await trio.testing.wait_all_tasks_blocked()
    handle.agent.steer("also this")
    gate.set()
    await handle.agent.wait_idle()
    assert await types(handle.agent, "turn/start", "step/start") == ["turn/start", "step/start", "step/start"]
    assert [m.text for m in adapter.requests[1].messages][-1] == "also this"


# -- cancellation ----------------------------------------------------------------------


async def test_cancel_aborts_the_turn_and_keeps_or_drops_the_inbox(rt, autojump_clock):
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply("never", block=gate), "second", Reply("x", block=gate)])
    handle = await scripted_agent(rt, adapter)
    agent = handle.agent
    agent.followup("one")
    await trio.testing.wait_all_tasks_blocked()
    agent.followup("two")
    agent.cancel("user pressed stop")
    await agent.wait_idle()
    assert (await turn_ends(agent))[:2] == [
        {"kind": "aborted", "cause": "user pressed stop"},
        {"kind": "completed"},
    ]
    agent.followup("three")
    await trio.testing.wait_all_tasks_blocked()
    agent.followup("four")
    agent.cancel("stop all", keep_inbox=False)
    await agent.wait_idle()
    assert "four" not in await user_texts(agent)
    assert (await turn_ends(agent))[-1] == {"kind": "aborted", "cause": "stop all"}


async def test_cancel_during_tool_calls_pairs_every_call_with_a_result(rt, autojump_clock):
    started = trio.Event()

    async def slow(arguments, ctx):
        started.set()
        await trio.sleep_forever()

    rt.register_tool(Tool("slow", "never returns", {"type": "object"}, slow))
    adapter = ScriptedAdapter([Reply(tool_calls=[ToolCall("slow", call_id="c1"), ToolCall("slow", call_id="c2")])])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("go")
    await started.wait()
    handle.agent.cancel("enough")
    await handle.agent.wait_idle()
    results = [e.data for e in (await handle.agent.session.read_events()) if e.type == "tool/result"]
    assert [r["content"][0]["callId"] for r in results] == ["c1", "c2"]
    assert all(r["content"][0]["content"] == "cancelled" for r in results)
    assert await turn_ends(handle.agent) == [{"kind": "aborted", "cause": "enough"}]


async def test_dispose_during_tool_calls_still_ends_the_turn_aborted(rt, autojump_clock, no_leaks):
    started = trio.Event()

    async def slow(arguments, ctx):
        started.set()
        await trio.sleep_forever()

    rt.register_tool(Tool("slow", "never returns", {"type": "object"}, slow))
    adapter = ScriptedAdapter([Reply(tool_calls=[ToolCall("slow", call_id="c1"), ToolCall("slow", call_id="c2")])])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("go")
    await started.wait()
    await handle.dispose()  # the cancellation reaches the turn through the tool nursery
    events = (await handle.agent.session.read_events())
    assert [e.data["content"][0]["callId"] for e in events if e.type == "tool/result"] == ["c1", "c2"]
    assert await turn_ends(handle.agent) == [{"kind": "aborted", "cause": "disposed"}]
    no_leaks(rt)


async def test_dispose_cancels_in_flight_work_and_leaks_nothing(rt, autojump_clock, no_leaks):
    gate = trio.Event()
    handle = await scripted_agent(rt, ScriptedAdapter([Reply("never", block=gate)]))
    agent = handle.agent
    reservation = agent.reserve(automatic("auto"))
    agent.followup("human")
    assert reservation.state == "cancelled"
    await trio.testing.wait_all_tasks_blocked()
    assert agent.status == "running"
    await handle.dispose()
    await handle.dispose()  # idempotent
    assert rt.list_agents() == []
    assert await turn_ends(agent) == [{"kind": "aborted", "cause": "disposed"}]
    no_leaks(rt)
    with pytest.raises(AgentClosedError):
        agent.followup("too late")


async def test_runtime_shutdown_aborts_running_turns_and_persists_them(tmp_path, autojump_clock):
    from loopdock import Runtime
    from loopdock.runtime._store import SessionStore

    never = trio.Event()  # every model call hangs until the runtime shuts down
    async with Runtime.open(tmp_path) as rt:
        rt.register_adapter("scripted", ScriptedAdapter(lambda request: Reply("x", block=never)))
        for i in range(3):
            handle = await rt.create_agent(session_id=f"s{i}", agent_options=SCRIPTED)
            handle.agent.followup("work")
        await trio.testing.wait_all_tasks_blocked()
        assert [rt.get_agent(f"s{i}").status for i in range(3)] == ["running"] * 3
    with SessionStore.open(tmp_path / "sessions.db") as store:
        for i in range(3):
            header, events = store.load(f"s{i}")
            assert events[-1].type == "turn/end"
            assert events[-1].data["reason"] == {"kind": "aborted", "cause": "disposed"}


# -- turn outcomes -----------------------------------------------------------------------


async def test_tool_calls_run_in_parallel_up_to_the_limit_and_log_in_call_order(rt, autojump_clock):
    running = 0
    peak = 0

    async def work(arguments, ctx):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(10 - arguments["n"])  # later calls finish first
        running -= 1
        return f"done {arguments['n']} in {ctx.session_id}"

    rt.register_tool(Tool("work", "works", {"type": "object"}, work))
    calls = [ToolCall("work", {"n": n}, call_id=f"c{n}") for n in range(5)]
    adapter = ScriptedAdapter([Reply(tool_calls=calls), "all done"])
    handle = await scripted_agent(rt, adapter, max_parallel_tool_calls=2)
    handle.agent.followup("go")
    await handle.agent.wait_idle()
    assert peak == 2
    results = [e.data["content"][0] for e in (await handle.agent.session.read_events()) if e.type == "tool/result"]
    assert [r["callId"] for r in results] == [f"c{n}" for n in range(5)]
    assert results[3]["content"] == "done 3 in a1"
    tool_calls = [e.data for e in (await handle.agent.session.read_events()) if e.type == "tool/call"]
    assert json.loads(tool_calls[1]["arguments"]) == {"n": 1}
    # The model saw every result on its second call.
    assert [m.role for m in adapter.requests[1].messages][-5:] == ["tool"] * 5
    assert await turn_ends(handle.agent) == [{"kind": "completed"}]


async def test_unknown_or_broken_tool_calls_become_error_results(rt):
    adapter = ScriptedAdapter(
        [Reply(tool_calls=[ToolCall("nope", call_id="c1"), ToolCall("read_file", "{not json", call_id="c2")]), "ok"]
    )
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("go")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    results = [e.data["content"][0] for e in (await handle.agent.session.read_events()) if e.type == "tool/result"]
    assert results[0]["isError"] and "unknown tool 'nope'" in results[0]["content"]
    assert results[1]["isError"] and "not valid JSON" in results[1]["content"]
    assert await turn_ends(handle.agent) == [{"kind": "completed"}]


async def test_max_tokens_ends_the_turn(rt):
    handle = await scripted_agent(rt, ScriptedAdapter([Reply("cut", finish="max-tokens")]))
    handle.agent.followup("go")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert await turn_ends(handle.agent) == [{"kind": "max-tokens"}]


async def test_model_error_ends_the_turn_and_the_agent_goes_on(rt):
    adapter = ScriptedAdapter([Reply(error=ModelError("provider down")), "recovered"])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("one")
    handle.agent.followup("two")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert await turn_ends(handle.agent) == [
        {"kind": "error", "message": "MODEL_ERROR: provider down"},
        {"kind": "completed"},
    ]


async def test_model_retries_are_logged(rt):
    async def respond(request):
        await request.on_retry(RetryNotice(attempt=1, delay=0.5, error="HTTP 503"))
        return "fine"

    handle = await scripted_agent(rt, ScriptedAdapter(respond))
    handle.agent.followup("go")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    retries = [e.data for e in (await handle.agent.session.read_events()) if e.type == "llm/retry"]
    assert retries == [{"turn": 1, "attempt": 1, "delay": 0.5, "error": "HTTP 503"}]


async def test_a_turn_logs_the_dsh_event_sequence(rt):
    adapter = ScriptedAdapter([Reply(tool_calls=[ToolCall("list_dir", {"path": "."}, call_id="c1")]), "listed"])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("look")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
        await handle.agent.session.flush()
    # The loop dock records the binding (and the standard preset) before anything else.
    assert (await types(handle.agent))[:2] == ["agent-preset/selected", "agent-preset/selected"]
    assert (await types(handle.agent))[2:] == [
        "agent/inbox/spliced", "turn/start", "agent/inbox/spliced",
        "step/start", "user/message", "request/header", "assistant/message", "tool/call",
        "tool/result", "step/end",
        "step/start", "request/header", "assistant/message", "step/end",
        "turn/end",
    ]
    events = (await handle.agent.session.read_events())
    assert [e.seq for e in events] == list(range(len(events)))
    assert handle.agent.session.committed_count == len(events)


async def test_each_assistant_message_keeps_the_usage_of_its_model_call(rt):
    adapter = ScriptedAdapter([
        Reply(tool_calls=[ToolCall("list_dir", {"path": "."})], usage=Usage(120, 7)),
        Reply(text="done", usage=Usage(150, 1)),
    ])
    handle = await scripted_agent(rt, adapter)
    handle.agent.followup("look")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    usages = [e.data.get("usage") for e in (await handle.agent.session.read_events()) if e.type == "assistant/message"]
    assert usages == [{"inputTokens": 120, "outputTokens": 7}, {"inputTokens": 150, "outputTokens": 1}]
    # The usage sits beside the message, not in it: the model never sees it.
    assert all(not hasattr(m, "usage") for m in handle.agent.transcript)


async def test_a_model_that_reports_no_usage_leaves_none_in_the_log(rt):
    class Silent:
        async def stream(self, request):
            yield TextDelta("hi")
            yield Finish("stop")

    rt.register_adapter("silent", Silent())
    handle = await rt.create_agent(session_id="quiet", agent_options={"provider": "silent", "model": "s"})
    handle.agent.followup("hello")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    [message] = [e.data for e in (await handle.agent.session.read_events()) if e.type == "assistant/message"]
    assert "usage" not in message


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_tokens": 0}, InvalidOptionsError),
        ({"maxTokens": -5}, InvalidOptionsError),
        ({"provider": "nowhere"}, UnknownAdapterError),
        ({"tools": ["read_file", "teleport"]}, UnknownToolError),
        ({"colour": "blue"}, InvalidOptionsError),
    ],
)
async def test_bad_options_raise_typed_errors_and_write_nothing(rt, options, error):
    with pytest.raises(error):
        await rt.create_agent(session_id="bad", agent_options=options)
    assert rt.list_agents() == []
    assert await rt.list_sessions() == []


async def test_live_events_follow_the_agent(rt):
    with rt.subscribe_live() as live:
        handle = await scripted_agent(rt, ScriptedAdapter(["hi"]))
        handle.agent.followup("hello")
        with trio.fail_after(5):
            await handle.agent.wait_idle()
            await handle.dispose()
        seen = []
        while True:
            try:
                event = live.receive_nowait()
            except trio.WouldBlock:
                break
            seen.append((event.type, dict(event.data)))
    kinds = [t for t, _ in seen]
    assert kinds[0] == "agent/created" and seen[0][1] == {"source": "startup"}
    assert ("agent/status", {"status": "running"}) in seen
    assert kinds.index("agent/inbox/inserted") < kinds.index("agent/inbox/claimed")
    assert kinds[-1] == "agent/disposed"


async def test_tools_run_in_the_cwd_of_the_options_a_setup_chose(rt, tmp_path):
    # The agent's cwd is built once per options: a setup that replaces them (after the
    # cwd was read) moves the tools to the new one.
    first, chosen = tmp_path / "first", tmp_path / "chosen"
    first.mkdir()
    chosen.mkdir()
    seen = []

    async def where(arguments, ctx):
        seen.append(ctx.cwd)
        return "here"

    rt.register_tool(Tool("where", "Where the tool runs.", {"type": "object", "properties": {}}, where))

    def setup(ctx):
        assert ctx.agent.cwd == first
        ctx.options = attrs.evolve(ctx.options, cwd=str(chosen))

    rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[ToolCall("where", "{}", call_id="c1")]), "ok"]))
    handle = await rt.create_agent(session_id="a1", agent_options={**SCRIPTED, "cwd": str(first)}, setup=setup)
    handle.agent.followup("where are you?")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    assert seen == [chosen]
    assert handle.agent.cwd == chosen


# -- one cancel scope for a run of turns -------------------------------------------------


def body_driver(body):
    class Driver:
        async def create_agent(self, owner, options):
            return await create_with_body(owner, options, body)

        async def resume(self, owner, options):
            raise NotImplementedError

    return DriverLoop.from_driver("body", Driver())


async def test_a_cancel_after_a_turns_last_checkpoint_does_not_reach_the_next_turn(rt, autojump_clock):
    checkpoints: list[str] = []

    class CancelsAtItsEnd:
        async def run_turn(self, turn) -> str:
            (message,) = await turn.begin_step()
            await trio.sleep(1)  # the turn's last checkpoint
            checkpoints.append(message.text)
            turn.end_step()
            if message.text == "first":
                turn.agent.cancel("too late")  # nothing of this turn is left to cancel
            return "completed"

    rt.dock.register(body_driver(CancelsAtItsEnd()))
    handle = await rt.create_agent(session_id="c1", loop="body")
    agent = handle.agent
    agent.followup("first")
    agent.followup("second")
    await agent.wait_idle()
    assert checkpoints == ["first", "second"]
    assert await turn_ends(agent) == [{"kind": "completed"}, {"kind": "completed"}]
    agent.followup("third")  # and cancelling still works afterwards
    await trio.testing.wait_all_tasks_blocked()
    agent.cancel("stop")
    await agent.wait_idle()
    assert (await turn_ends(agent))[-1] == {"kind": "aborted", "cause": "stop"} and checkpoints == ["first", "second"]


async def test_a_failure_raised_as_a_turn_is_cancelled_ends_that_turn_not_the_agent(rt, autojump_clock, caplog):
    class FailsWhenCancelled:
        async def run_turn(self, turn) -> str:
            (message,) = await turn.begin_step()
            if message.text != "fail as cancelled":
                turn.end_step()
                return "completed"

            async def cleanup_fails():
                try:
                    await trio.sleep_forever()
                finally:
                    raise ValueError("cleanup failed")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cleanup_fails)
                await trio.sleep_forever()
            return "unreachable"

    rt.dock.register(body_driver(FailsWhenCancelled()))
    handle = await rt.create_agent(session_id="c2", loop="body")
    agent = handle.agent
    agent.followup("fail as cancelled")
    await trio.testing.wait_all_tasks_blocked()
    agent.cancel("stop")
    await agent.wait_idle()
    assert await turn_ends(agent) == [{"kind": "aborted", "cause": "stop"}]
    assert "cleanup failed" in caplog.text
    agent.followup("next")  # the agent is still there
    await agent.wait_idle()
    assert (await turn_ends(agent))[-1] == {"kind": "completed"} and agent.status == "idle"
