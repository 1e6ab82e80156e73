"""PingAdapter: offline and deterministic, so every expectation here is exact."""

from __future__ import annotations

from contextlib import aclosing

import trio

from loopdock.runtime._messages import (
    Message,
    ToolCallBlock,
    ToolResultBlock,
    ToolSource,
    user_message,
)
from loopdock.runtime.models import (
    Finish,
    ModelRequest,
    PingAdapter,
    TextDelta,
    ToolCallChunk,
    Usage,
)


def _request(*messages: Message, max_tokens: int = 4096, system: str = "") -> ModelRequest:
    return ModelRequest(
        provider="ping", model="ping-1", system=system, messages=messages, max_tokens=max_tokens
    )


async def _collect(request: ModelRequest) -> list:
    async with aclosing(PingAdapter().stream(request)) as chunks:
        return [chunk async for chunk in chunks]


def _text(chunks: list) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


async def test_pong_echoes_the_last_user_message():
    chunks = await _collect(_request(user_message("hello  there\nworld"), system="be brief"))

    assert _text(chunks) == "pong: hello  there\nworld"
    # One delta per word, so consumers see real streaming.
    assert len([c for c in chunks if isinstance(c, TextDelta)]) == 4
    # input: "be brief" + "hello there world"; output: the four words of the reply.
    assert chunks[-2:] == [Usage(5, 4), Finish("stop")]


async def test_pong_after_tool_results_echoes_their_contents():
    call = Message(role="assistant", content=(ToolCallBlock("c1", "ls", "{}"),))
    results = Message(
        role="tool",
        content=(ToolResultBlock("c1", "a.txt"), ToolResultBlock("c2", "b.txt")),
        source=ToolSource("c1"),
    )
    chunks = await _collect(_request(user_message("list"), call, results))

    assert _text(chunks) == "pong: a.txt\nb.txt"
    assert chunks[-1] == Finish("stop")


async def test_pong_with_no_user_message_is_just_pong():
    chunks = await _collect(_request())
    assert _text(chunks) == "pong: "
    assert chunks[-2:] == [Usage(0, 1), Finish("stop")]


async def test_call_lines_become_tool_calls():
    text = 'please\ncall: list_dir {"path": "."}\ncall: read_file {"path": "a.txt"}\nthanks'
    chunks = await _collect(_request(user_message(text)))

    assert chunks[:2] == [
        ToolCallChunk("ping-call-1", "list_dir", '{"path": "."}'),
        ToolCallChunk("ping-call-2", "read_file", '{"path": "a.txt"}'),
    ]
    assert isinstance(chunks[2], Usage)
    assert chunks[3] == Finish("tool-calls")
    assert len(chunks) == 4


async def test_call_ids_continue_after_calls_already_in_the_conversation():
    earlier = Message(
        role="assistant",
        content=(
            ToolCallBlock("ping-call-1", "a", "{}"),
            ToolCallBlock("ping-call-2", "b", "{}"),
        ),
    )
    result = Message(role="tool", content=(ToolResultBlock("ping-call-1", "ok"),))
    chunks = await _collect(
        _request(user_message("call: a {}"), earlier, result, user_message("call: c {}"))
    )

    assert chunks[0] == ToolCallChunk("ping-call-3", "c", "{}")


async def test_malformed_call_lines_are_ponged_back():
    # Not a JSON object: an array, broken JSON, no arguments at all.
    text = "call: ls [1]\ncall: ls {oops}\ncall: ls"
    chunks = await _collect(_request(user_message(text)))

    assert not [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert _text(chunks) == "pong: " + text
    assert chunks[-1] == Finish("stop")


async def test_call_lines_in_a_tool_result_are_not_calls():
    # Only a user's message can ask for calls: a tool echoing the syntax must not loop.
    result = Message(role="tool", content=(ToolResultBlock("c1", "call: ls {}"),))
    chunks = await _collect(_request(result))

    assert _text(chunks) == "pong: call: ls {}"


async def test_reply_longer_than_max_tokens_is_truncated():
    chunks = await _collect(_request(user_message("one two three four"), max_tokens=3))

    assert _text(chunks) == "pong: one two"
    assert chunks[-2:] == [Usage(4, 3), Finish("max-tokens")]


async def test_reply_exactly_max_tokens_long_is_not_truncated():
    chunks = await _collect(_request(user_message("one two"), max_tokens=3))

    assert _text(chunks) == "pong: one two"
    assert chunks[-1] == Finish("stop")


async def test_same_request_gives_same_chunks():
    request = _request(user_message("determinism please\ncall: x {\"a\": 1}"))
    first = await _collect(request)
    second = await _collect(request)
    assert first == second
    assert first[0] == ToolCallChunk("ping-call-1", "x", '{"a": 1}')

    other = _request(user_message("same words twice"), max_tokens=2)
    assert await _collect(other) == await _collect(other)


async def test_any_model_name_is_accepted():
    request = ModelRequest(
        provider="ping", model="whatever-9", system="", messages=(user_message("hi"),)
    )
    assert _text(await _collect(request)) == "pong: hi"


async def test_stream_is_cancellable_between_chunks():
    # The adapter never blocks, but it must still honour cancellation at each step.
    got = []
    with trio.CancelScope() as scope:
        async with aclosing(PingAdapter().stream(_request(user_message("a b c d")))) as chunks:
            async for chunk in chunks:
                got.append(chunk)
                scope.cancel()
    assert scope.cancelled_caught
    assert got == [TextDelta("pong: ")]

