"""AnthropicAdapter against a stand-in Messages server on loopback (tests/openai_standin.py,
answering with named SSE events). Timer tests run on a MockClock that jumps after 20 ms of
real idleness (see test_models_openai.py for why not the stock autojump_clock)."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest
import trio
import trio.testing
from openai_standin import Answer, FakeOpenAI, status

from loopdock.runtime._errors import ModelError, ModelRejectedError, ModelStreamBrokenError
from loopdock.runtime._messages import (
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    user_message,
)
from loopdock.runtime.models import (
    AnthropicAdapter,
    Finish,
    ModelRequest,
    Price,
    ReasoningDelta,
    ReasoningEnd,
    RetryNotice,
    TextDelta,
    ToolCallChunk,
    ToolSpec,
    Usage,
)

API_KEY = "sk-ant-test-not-a-real-key"


@pytest.fixture
def io_autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.02)


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


# -- the wire format ------------------------------------------------------------------


def start(input_tokens: int = 10) -> dict:
    return {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}  # fmt: skip


def text_block(index: int, *pieces: str) -> list[dict]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
          for p in pieces),
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def tool_block(index: int, call_id: str, name: str, *pieces: str) -> list[dict]:
    return [
        {"type": "content_block_start", "index": index,
         "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}}
          for p in pieces),
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def thinking_block(index: int, signature: str, *pieces: str) -> list[dict]:
    """A thinking block as extended thinking streams it: text pieces, then its signature
    (in two pieces here, to check they are joined)."""
    half = len(signature) // 2
    return [
        {"type": "content_block_start", "index": index,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": p}}
          for p in pieces),
        {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature[:half]}},
        {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature[half:]}},
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def redacted_block(index: int, data: str) -> list[dict]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "redacted_thinking", "data": data}},
        {"type": "content_block_stop", "index": index},
    ]  # fmt: skip


def stop(reason: str = "end_turn", output_tokens: int = 5) -> list[dict]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
         "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]  # fmt: skip


def messages(*events: Any, **options: Any) -> Answer:
    return Answer(events=list(events), named=True, **options)


def make_request(*msgs: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(provider="anthropic", model=kwargs.pop("model", "claude-test"),
                        system=kwargs.pop("system", ""), messages=msgs or (user_message("hi"),), **kwargs)  # fmt: skip


class Notices:
    def __init__(self) -> None:
        self.seen: list[RetryNotice] = []

    async def __call__(self, notice: RetryNotice) -> None:
        self.seen.append(notice)


async def run_against(answers: list[Answer], request: ModelRequest | None = None,
                      **kwargs: Any) -> tuple[list, FakeOpenAI]:  # fmt: skip
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI(answers).start(nursery)
        kwargs.setdefault("draw", lambda: 0.0)
        adapter = AnthropicAdapter(API_KEY, f"http://127.0.0.1:{server.port}", **kwargs)
        try:
            async with aclosing(adapter.stream(request or make_request())) as stream:
                chunks = [chunk async for chunk in stream]
        except Exception as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return chunks, server


# -- streaming ------------------------------------------------------------------------


async def test_text_streams_with_usage_and_cost():
    answer = messages(start(100), {"type": "ping"}, *text_block(0, "Hel", "lo"), *stop("end_turn", 7))
    with trio.fail_after(10):
        chunks, server = await run_against([answer], prices={"claude-test": Price(3.0, 15.0)})
    assert chunks == [TextDelta("Hel"), TextDelta("lo"), Usage(100, 7, cost=pytest.approx(0.000405)), Finish("stop")]
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == API_KEY and request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body["stream"] is True


async def test_a_tool_call_is_assembled_from_json_pieces():
    answer = messages(start(), *text_block(0, "Looking."), *tool_block(1, "toolu_1", "read_file", '{"pa', 'th": "a"}'),
                      *tool_block(2, "toolu_2", "list_dir"), *stop("tool_use"))  # fmt: skip
    with trio.fail_after(10):
        chunks, _ = await run_against([answer])
    assert chunks[:3] == [
        TextDelta("Looking."),
        ToolCallChunk("toolu_1", "read_file", '{"path": "a"}'),
        ToolCallChunk("toolu_2", "list_dir", "{}"),
    ]
    assert chunks[-1] == Finish("tool-calls")


async def test_the_request_body_maps_system_tools_and_tool_turns():
    history = (
        user_message("list it"),
        Message("assistant", (TextBlock("ok"), ToolCallBlock("toolu_1", "list_dir", '{"path": "."}'))),
        Message("tool", (ToolResultBlock("toolu_1", "a.txt"),)),
        Message("tool", (ToolResultBlock("toolu_2", "boom", is_error=True),)),
    )
    tool = ToolSpec("list_dir", "List a folder.", {"type": "object", "properties": {}})
    request = make_request(*history, system="Be brief.", tools=(tool,), max_tokens=321)
    with trio.fail_after(10):
        _, server = await run_against([messages(start(), *text_block(0, "x"), *stop())], request)
    body = server.requests[0].body
    assert body["system"] == "Be brief." and body["max_tokens"] == 321 and body["model"] == "claude-test"
    assert body["tools"] == [{"name": "list_dir", "description": "List a folder.",
                              "input_schema": {"type": "object", "properties": {}}}]  # fmt: skip
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "list it"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {"path": "."}}]},
        # both results in one user turn: the roles must alternate
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True}]},
    ]  # fmt: skip


async def test_thinking_blocks_end_with_their_signature_or_redacted_data():
    answer = messages(start(), *thinking_block(0, "c2lnLW9uZQ==", "First, ", "look."), *redacted_block(1, "ZW5jcnlwdGVk"),
                      *tool_block(2, "toolu_1", "list_dir"), *stop("tool_use"))  # fmt: skip
    with trio.fail_after(10):
        chunks, _ = await run_against([answer])
    assert chunks[:-2] == [
        ReasoningDelta("First, "),
        ReasoningDelta("look."),
        ReasoningEnd(signature="c2lnLW9uZQ=="),
        ReasoningEnd(redacted_data="ZW5jcnlwdGVk"),
        ToolCallChunk("toolu_1", "list_dir", "{}"),
    ]


async def test_signed_and_redacted_reasoning_go_back_in_order_before_the_tool_use():
    history = (
        user_message("list it"),
        Message("assistant", (
            ReasoningBlock("First, look.", signature="c2lnLW9uZQ=="),
            ReasoningBlock("", redacted_data="ZW5jcnlwdGVk"),
            ReasoningBlock("another provider's, unsigned"),
            TextBlock("ok"),
            ToolCallBlock("toolu_1", "list_dir", "{}"),
        )),
        Message("tool", (ToolResultBlock("toolu_1", "a.txt"),)),
    )  # fmt: skip
    with trio.fail_after(10):
        _, server = await run_against([messages(start(), *text_block(0, "x"), *stop())], make_request(*history))
    assert server.requests[0].body["messages"][1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "First, look.", "signature": "c2lnLW9uZQ=="},
        {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {}},
    ]}  # fmt: skip


@pytest.mark.parametrize(("wire", "ours"), [("end_turn", "stop"), ("stop_sequence", "stop"),
                                            ("max_tokens", "max-tokens")])  # fmt: skip
async def test_stop_reasons_are_mapped(wire, ours):
    with trio.fail_after(10):
        chunks, _ = await run_against([messages(start(), *text_block(0, "x"), *stop(wire))])
    assert chunks[-1] == Finish(ours)


async def test_a_refusal_is_a_model_error():
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="stopped with stop reason .refusal."):
            await run_against([messages(start(), *stop("refusal"))])


# -- errors and retries ---------------------------------------------------------------


async def test_429_with_retry_after_then_success(io_autojump_clock):
    notices = Notices()
    answers = [status(429, "rate limited", Retry_After="4"), status(529, "overloaded"),
               messages(start(), *text_block(0, "ok"), *stop())]  # fmt: skip
    with trio.fail_after(30):
        begun = trio.current_time()
        chunks, server = await run_against(answers, make_request(on_retry=notices))
        elapsed = trio.current_time() - begun
    assert chunks[0] == TextDelta("ok")
    assert notices.seen == [RetryNotice(1, 4.0, "HTTP 429: rate limited"), RetryNotice(2, 1.0, "HTTP 529: overloaded")]
    assert elapsed == pytest.approx(5.0, abs=0.1)
    assert len(server.requests) == 3


async def test_401_is_rejected_at_once_without_echoing_the_key(io_autojump_clock):
    notices = Notices()
    with trio.fail_after(10):
        with pytest.raises(ModelRejectedError) as info:
            await run_against([status(401, f"invalid x-api-key {API_KEY}"), messages(start(), *stop())],
                              make_request(on_retry=notices))  # fmt: skip
    assert info.value.status == 401 and "invalid x-api-key" in str(info.value)
    assert API_KEY not in str(info.value)
    assert notices.seen == []


async def test_an_overloaded_event_before_any_chunk_is_retried(io_autojump_clock):
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    notices = Notices()
    with trio.fail_after(30):
        chunks, server = await run_against([messages(start(), overloaded), messages(start(), *text_block(0, "ok"),
                                            *stop())], make_request(on_retry=notices))  # fmt: skip
    assert chunks[0] == TextDelta("ok")
    assert notices.seen == [RetryNotice(1, 0.5, "overloaded_error: Overloaded")]


async def test_an_invalid_request_event_is_a_model_error_without_retry(io_autojump_clock):
    bad = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="invalid_request_error: no"):
            await run_against([messages(start(), bad), messages(start(), *stop())])


async def test_a_stream_cut_after_text_is_broken_not_retried(io_autojump_clock):
    events = [start(), *text_block(0, "partial", "more"), *stop()]
    got: list = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            server = await FakeOpenAI([messages(*events, break_after=3)]).start(nursery)
            adapter = AnthropicAdapter(API_KEY, f"http://127.0.0.1:{server.port}")
            with pytest.raises(ModelStreamBrokenError, match="broke off"):
                async with aclosing(adapter.stream(make_request())) as chunks:
                    async for chunk in chunks:
                        got.append(chunk)
        nursery.cancel_scope.cancel()
    assert got == [TextDelta("partial")]
    assert len(server.requests) == 1


async def test_cancellation_mid_stream_closes_the_connection():
    got: list = []
    first = trio.Event()

    async def consume(adapter: AnthropicAdapter) -> None:
        async with aclosing(adapter.stream(make_request())) as chunks:
            async for chunk in chunks:
                got.append(chunk)
                first.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            events = [start(), *text_block(0, "one", "two"), *stop()]
            server = await FakeOpenAI([messages(*events, hold_after=3)]).start(nursery)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as inner:
                    inner.start_soon(consume, AnthropicAdapter(API_KEY, f"http://127.0.0.1:{server.port}"))
                    await first.wait()
                    scope.cancel()
            assert scope.cancelled_caught
            await server.hung_up.wait()  # the server saw the connection closed
            nursery.cancel_scope.cancel()
    assert got == [TextDelta("one")]
