"""ScriptedAdapter: the test double every agent-loop test leans on."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
import trio.testing

from loopdock.runtime._errors import ModelError
from loopdock.runtime._messages import user_message
from loopdock.runtime.models import (
    Finish,
    ModelRequest,
    ReasoningDelta,
    Reply,
    ScriptedAdapter,
    TextDelta,
    ToolCall,
    ToolCallChunk,
    Usage,
)


def _request(text: str = "hi", *, system: str = "") -> ModelRequest:
    return ModelRequest(
        provider="scripted", model="m", system=system, messages=(user_message(text),)
    )


async def _collect(adapter: ScriptedAdapter, request: ModelRequest) -> list:
    async with aclosing(adapter.stream(request)) as chunks:
        return [chunk async for chunk in chunks]


async def test_replies_are_used_in_order_and_requests_recorded():
    adapter = ScriptedAdapter(["first", Reply(text="second")])
    r1, r2 = _request("one"), _request("two")

    assert await _collect(adapter, r1) == [TextDelta("first"), Usage(1, 1), Finish("stop")]
    assert (await _collect(adapter, r2))[0] == TextDelta("second")
    assert adapter.requests == [r1, r2]
    assert adapter.requests[1] is r2
    assert adapter.remaining == 0


async def test_full_reply_streams_reasoning_text_tool_calls_usage_finish():
    adapter = ScriptedAdapter(
        [
            Reply(
                text="let me look",
                reasoning="think",
                tool_calls=(ToolCall("ls", {"path": "."}), ToolCall("cat", '{"p": 1}', "mine")),
            )
        ]
    )
    chunks = await _collect(adapter, _request())

    assert chunks == [
        ReasoningDelta("think"),
        TextDelta("let me look"),
        ToolCallChunk("call-1", "ls", '{"path": "."}'),
        ToolCallChunk("mine", "cat", '{"p": 1}'),
        Usage(1, 1 + 3 + 1 + 2 + 1 + 2),
        Finish("tool-calls"),
    ]


async def test_generated_call_ids_are_unique_across_calls_of_one_adapter():
    adapter = ScriptedAdapter(
        [Reply(tool_calls=(ToolCall("a"),)), Reply(tool_calls=(ToolCall("b"),))]
    )
    first = await _collect(adapter, _request())
    second = await _collect(adapter, _request())

    assert first[0] == ToolCallChunk("call-1", "a", "{}")
    assert second[0] == ToolCallChunk("call-2", "b", "{}")
    # A fresh adapter starts its own numbering.
    fresh = ScriptedAdapter([Reply(tool_calls=(ToolCall("c"),))])
    assert (await _collect(fresh, _request()))[0].call_id == "call-1"


async def test_explicit_finish_and_usage_override_the_defaults():
    adapter = ScriptedAdapter([Reply(text="cut", finish="max-tokens", usage=Usage(7, 9))])
    assert (await _collect(adapter, _request()))[-2:] == [Usage(7, 9), Finish("max-tokens")]


async def test_respond_callable_sees_each_request_sync_or_async():
    def sync_respond(request: ModelRequest) -> Reply:
        return Reply(text=f"echo {request.messages[-1].text}")

    async def async_respond(request: ModelRequest) -> str:
        await trio.lowlevel.checkpoint()
        return f"async {request.system}"

    sync_adapter = ScriptedAdapter(sync_respond)
    assert (await _collect(sync_adapter, _request("x")))[0] == TextDelta("echo x")
    assert (await _collect(sync_adapter, _request("y")))[0] == TextDelta("echo y")
    assert len(sync_adapter.requests) == 2

    async_adapter = ScriptedAdapter(async_respond)
    assert (await _collect(async_adapter, _request(system="sys")))[0] == TextDelta("async sys")


async def test_error_is_raised_instead_of_streaming():
    boom = ModelError("scripted failure")
    adapter = ScriptedAdapter([Reply(text="never seen", error=boom), "after"])
    got = []
    with pytest.raises(ModelError) as info:
        async with aclosing(adapter.stream(_request())) as chunks:
            async for chunk in chunks:
                got.append(chunk)
    assert info.value is boom
    assert got == []
    # The failed call consumed its reply and was recorded; the script moves on.
    assert len(adapter.requests) == 1
    assert (await _collect(adapter, _request()))[0] == TextDelta("after")


async def test_running_out_of_replies_raises_model_error():
    adapter = ScriptedAdapter(["only"])
    await _collect(adapter, _request())
    with pytest.raises(ModelError, match=r"ran out of replies: 1 scripted.*#2"):
        await _collect(adapter, _request())
    assert len(adapter.requests) == 2


async def test_block_holds_the_call_until_set():
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply(text="late", block=gate)])
    got: list = []

    async def consume() -> None:
        got.extend(await _collect(adapter, _request()))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            # The call is in flight: recorded, but nothing streamed yet.
            assert len(adapter.requests) == 1
            assert got == []
            gate.set()
    assert got[0] == TextDelta("late")


async def test_blocked_call_can_be_cancelled():
    gate = trio.Event()  # never set
    adapter = ScriptedAdapter([Reply(text="never", block=gate)])
    got: list = []

    async def consume() -> None:
        got.extend(await _collect(adapter, _request()))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert nursery.cancel_scope.cancelled_caught
    assert got == []
    assert len(adapter.requests) == 1


async def test_block_is_awaited_before_the_error():
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply(error=ModelError("late failure"), block=gate)])
    outcome: list = []

    async def consume() -> None:
        try:
            await _collect(adapter, _request())
        except ModelError as exc:
            outcome.append(str(exc))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []
            gate.set()
    assert outcome == ["late failure"]


async def test_an_adapter_shared_by_many_agents_keeps_their_requests_not_the_agents(tmp_path):
    import gc
    import weakref

    from loopdock import Runtime

    adapter = ScriptedAdapter(lambda request: "ok")
    agents: list[weakref.ref] = []
    async with Runtime.open(tmp_path / "home") as rt:
        rt.register_adapter("shared", adapter)
        for i in range(20):
            handle = await rt.create_agent(session_id=f"s{i}", agent_options={"provider": "shared", "model": "m"})
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
            agents.append(weakref.ref(handle.agent))
            await handle.dispose()
        del handle
        gc.collect()
        assert [ref for ref in agents if ref() is not None] == []
    assert len(adapter.requests) == 20 and all(r.on_retry is None for r in adapter.requests)
    assert adapter.requests[0].messages[-1].text == "hello"  # what tests read is still there
