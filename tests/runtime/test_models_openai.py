"""OpenAICompatibleAdapter against a fake chat-completions server on loopback.

The fake server below speaks just enough HTTP/1.1: it reads the request line, headers
and a Content-Length body, records the request, and plays one scripted answer per
connection (every answer says ``Connection: close``, so each attempt is a fresh
connection and the order of answers is the order of attempts).

Clocks: tests with retry backoff or timeouts run on ``io_autojump_clock``, a MockClock
that jumps only after every task has been idle for 20 ms of *real* time. The stock
``autojump_clock`` (threshold 0) jumps the instant no task is runnable and a zero-timeout
poll finds no I/O ready. It does pass here on Linux, whose loopback hands bytes over
synchronously, but nothing promises that the peer's bytes (or a connect's completion)
are ready at that instant elsewhere; if they are not, the clock leaps to the next
deadline (the client's read timeout, or the test's ``fail_after``) and the test fails
for no reason. 20 ms is far above loopback latency and still makes the 0.5-5 s virtual
sleeps free. Tests without timers use the real clock.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from loopdock.runtime._errors import ModelError
from loopdock.runtime._messages import (
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSource,
    user_message,
)
from loopdock.runtime.models import (
    Finish,
    ModelRequest,
    OpenAICompatibleAdapter,
    ReasoningDelta,
    RetryNotice,
    TextDelta,
    ToolCallChunk,
    ToolSpec,
    Usage,
)

API_KEY = "sk-test-not-a-real-key"


@pytest.fixture
def io_autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.02)


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch):
    # The adapter's default client honours proxy variables; loopback must stay direct.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


# -- the fake server ------------------------------------------------------------------


@attrs.frozen
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # decoded JSON


@attrs.define
class Answer:
    """One scripted HTTP answer.

    ``events`` are SSE ``data:`` payloads (dicts are JSON-encoded; ``"[DONE]"`` is sent
    as is). ``hold_after``: after that many events, stop and wait for the client to hang
    up. ``break_after``: after that many events, drop the connection mid-body (the
    declared Content-Length is never reached). ``hang``: never answer at all.
    """

    status: int = 200
    events: Sequence[Any] = ()
    error_body: Any = None
    hold_after: int | None = None
    break_after: int | None = None
    hang: bool = False


def sse(*events: Any, done: bool = True, **options: Any) -> Answer:
    return Answer(events=[*events, "[DONE]"] if done else list(events), **options)


def status(code: int, message: str | None = None) -> Answer:
    body = {"error": {"message": message, "type": "x"}} if message is not None else None
    return Answer(status=code, error_body=body)


def _encode_event(event: Any) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event)
    return f"data: {data}\n\n".encode()


_REASONS = {200: "OK", 401: "Unauthorized", 429: "Too Many Requests", 503: "Unavailable"}


class FakeOpenAI:
    def __init__(self, answers: Sequence[Answer]) -> None:
        self.answers = list(answers)
        self.requests: list[RecordedRequest] = []
        self.hung_up = trio.Event()  # set when a held connection saw the client go
        self.port = 0

    async def start(self, nursery: trio.Nursery) -> FakeOpenAI:
        # nursery.start passes no keyword arguments, hence the partial.
        serve = functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, stream: trio.SocketStream) -> None:
        # A handler exception would crash serve_tcp's nursery and the test with it;
        # a client that hangs up mid-answer is normal here, not an error.
        try:
            async with stream:
                request = await self._read_request(stream)
                self.requests.append(request)
                answer = self.answers[len(self.requests) - 1]
                await self._answer(stream, answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _read_request(self, stream: trio.SocketStream) -> RecordedRequest:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            data = await stream.receive_some()
            assert data, "client closed before sending a full request"
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += await stream.receive_some()
        return RecordedRequest(method, path, headers, json.loads(rest) if rest else None)

    async def _wait_for_hangup(self, stream: trio.SocketStream) -> None:
        while await stream.receive_some():
            pass
        self.hung_up.set()

    async def _answer(self, stream: trio.SocketStream, answer: Answer) -> None:
        if answer.hang:
            await self._wait_for_hangup(stream)
            return
        if answer.status != 200:
            body = json.dumps(answer.error_body).encode() if answer.error_body else b"oops"
            await stream.send_all(
                f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Error')}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            return
        payloads = [_encode_event(e) for e in answer.events]
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
        if answer.break_after is not None:
            # Promise more than we send, so the early close is a protocol error.
            head += f"Content-Length: {sum(map(len, payloads)) + 1000}\r\n"
        await stream.send_all((head + "\r\n").encode())
        for number, payload in enumerate(payloads):
            if number == answer.hold_after:
                await self._wait_for_hangup(stream)
                return
            if number == answer.break_after:
                return
            # Split every event across two writes, so the client must reassemble lines.
            middle = len(payload) // 2
            await stream.send_all(payload[:middle])
            await stream.send_all(payload[middle:])


# -- helpers --------------------------------------------------------------------------


def content(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def reasoning(text: str) -> dict:
    return {
        "choices": [{"index": 0, "delta": {"reasoning_content": text}, "finish_reason": None}]
    }


def finish(reason: str) -> dict:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def usage(prompt: int, completion: int) -> dict:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def tool_fragment(index: int, *, id: str | None = None, name: str | None = None,
                  arguments: str | None = None) -> dict:  # fmt: skip
    fragment: dict[str, Any] = {"index": index}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    function = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    fragment["function"] = function
    return {"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}]}


def make_request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        provider="openai",
        model=kwargs.pop("model", "deepseek-v4-flash"),
        system=kwargs.pop("system", ""),
        messages=messages or (user_message("hi"),),
        **kwargs,
    )


def adapter_for(server: FakeOpenAI, **kwargs: Any) -> OpenAICompatibleAdapter:
    return OpenAICompatibleAdapter(server.base_url, API_KEY, **kwargs)


async def collect(adapter: OpenAICompatibleAdapter, request: ModelRequest) -> list:
    async with aclosing(adapter.stream(request)) as chunks:
        return [chunk async for chunk in chunks]


async def run_against(answers: Sequence[Answer], request: ModelRequest | None = None,
                      **kwargs: Any) -> tuple[list, FakeOpenAI]:  # fmt: skip
    """Serve ``answers``, make one model call, return its chunks and the server.

    A failure of the call is re-raised outside the server's nursery, so tests see the
    adapter's own exception rather than an ExceptionGroup around it.
    """
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI(answers).start(nursery)
        try:
            chunks = await collect(adapter_for(server, **kwargs), request or make_request())
        except Exception as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return chunks, server


class Notices:
    """An ``on_retry`` callback that remembers what it was told."""

    def __init__(self) -> None:
        self.seen: list[RetryNotice] = []

    async def __call__(self, notice: RetryNotice) -> None:
        self.seen.append(notice)


# -- streaming ------------------------------------------------------------------------


async def test_text_streams_as_deltas_then_usage_and_finish():
    with trio.fail_after(10):
        chunks, server = await run_against(
            [sse(content("Hel"), content("lo"), finish("stop"), usage(12, 2))]
        )
    assert chunks == [TextDelta("Hel"), TextDelta("lo"), Usage(12, 2), Finish("stop")]
    assert len(server.requests) == 1


async def test_reasoning_streams_before_text():
    with trio.fail_after(10):
        chunks, _ = await run_against(
            [sse(reasoning("Let me "), reasoning("think."), content("42"), finish("stop"))]
        )
    assert chunks == [
        ReasoningDelta("Let me "),
        ReasoningDelta("think."),
        TextDelta("42"),
        Finish("stop"),
    ]


async def test_parallel_tool_call_fragments_are_assembled():
    events = [
        content("Checking."),
        tool_fragment(0, id="call_a", name="list_dir", arguments=""),
        tool_fragment(1, id="call_b", name="read_file"),
        tool_fragment(0, arguments='{"pa'),
        tool_fragment(1, arguments='{"path": '),
        tool_fragment(0, arguments='th": "."}'),
        tool_fragment(1, arguments='"a.txt"}'),
        finish("tool_calls"),
        usage(30, 20),
    ]
    with trio.fail_after(10):
        chunks, _ = await run_against([sse(*events)])
    assert chunks == [
        TextDelta("Checking."),
        ToolCallChunk("call_a", "list_dir", '{"path": "."}'),
        ToolCallChunk("call_b", "read_file", '{"path": "a.txt"}'),
        Usage(30, 20),
        Finish("tool-calls"),
    ]


async def test_tool_call_without_arguments_gets_an_empty_object():
    with trio.fail_after(10):
        chunks, _ = await run_against(
            [sse(tool_fragment(0, id="c", name="now"), finish("tool_calls"))]
        )
    assert chunks == [ToolCallChunk("c", "now", "{}"), Finish("tool-calls")]


@pytest.mark.parametrize(
    ("wire", "ours"),
    [("stop", "stop"), ("tool_calls", "tool-calls"), ("length", "max-tokens")],
)
async def test_finish_reasons_are_mapped(wire, ours):
    with trio.fail_after(10):
        chunks, _ = await run_against([sse(content("x"), finish(wire))])
    assert chunks[-1] == Finish(ours)


async def test_unknown_finish_reason_is_a_model_error():
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="content_filter"):
            await run_against([sse(content("x"), finish("content_filter"))])


async def test_stream_without_a_finish_reason_is_a_model_error():
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="without a finish reason"):
            await run_against([sse(content("x"))])


async def test_error_event_in_the_stream_is_a_model_error():
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="overloaded"):
            await run_against([sse({"error": {"message": "overloaded"}})])


# -- request shape --------------------------------------------------------------------


async def test_request_body_and_headers():
    conversation = (
        user_message("list the files"),
        Message(
            role="assistant",
            content=(
                ReasoningBlock("need ls"),
                TextBlock("Looking."),
                ToolCallBlock("call_1", "list_dir", '{"path": "."}'),
                ToolCallBlock("call_2", "pwd", "{}"),
            ),
        ),
        Message(
            role="tool",
            content=(ToolResultBlock("call_1", "a.txt"), ToolResultBlock("call_2", "/w")),
            source=ToolSource("call_1"),
        ),
        Message(role="assistant", content=(TextBlock("Done."),)),
        user_message("thanks"),
    )
    tool = ToolSpec(
        "list_dir",
        "List a directory.",
        {"type": "object", "properties": {"path": {"type": "string"}}},
    )
    request = make_request(
        *conversation,
        model="deepseek-v4-pro",
        system="You are terse.",
        tools=(tool,),
        max_tokens=256,
        reasoning_effort="high",
    )
    with trio.fail_after(10):
        _, server = await run_against([sse(content("ok"), finish("stop"))], request)

    (sent,) = server.requests
    assert sent.method == "POST"
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": "deepseek-v4-pro",
        "max_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "high",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": "Looking.",
                "reasoning_content": "need ls",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "list_dir", "arguments": '{"path": "."}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "pwd", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "call_2", "content": "/w"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "list_dir",
                    "description": "List a directory.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
        ],
    }


async def test_optional_fields_are_left_out():
    with trio.fail_after(10):
        _, server = await run_against(
            [sse(content("ok"), finish("stop"))],
            make_request(Message(role="assistant", content=(ToolCallBlock("c", "f", "{}"),))),
            echo_reasoning=False,
        )
    body = server.requests[0].body
    assert "tools" not in body
    assert "reasoning_effort" not in body
    # No system prompt, so no system message; a tool-call-only turn has null content.
    assert body["messages"] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    ]


# -- retries --------------------------------------------------------------------------


async def test_429_and_503_are_retried_with_notices_then_succeed(io_autojump_clock):
    notices = Notices()
    request = make_request(on_retry=notices)
    answers = [
        status(503, "busy"),
        status(429, "slow down"),
        sse(content("ok"), finish("stop")),
    ]
    with trio.fail_after(10):
        start = trio.current_time()
        chunks, server = await run_against(answers, request, backoff=(0.5, 2.0))
        elapsed = trio.current_time() - start

    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert len(server.requests) == 3
    assert notices.seen == [
        RetryNotice(1, 0.5, "HTTP 503: busy"),
        RetryNotice(2, 2.0, "HTTP 429: slow down"),
    ]
    # The backoff really was slept (in virtual time): 0.5 s + 2 s.
    assert elapsed == pytest.approx(2.5, abs=0.1)


async def test_retries_exhausted_is_a_model_error(io_autojump_clock):
    notices = Notices()
    with trio.fail_after(10):
        with pytest.raises(ModelError, match=r"failed after 3 attempts: HTTP 503") as info:
            await run_against(
                [status(503), status(503), status(503)],
                make_request(on_retry=notices),
                max_attempts=3,
                backoff=(1.0,),
            )
    assert [n.attempt for n in notices.seen] == [1, 2]
    assert [n.delay for n in notices.seen] == [1.0, 1.0]  # the last delay repeats
    assert "oops" not in str(info.value)  # a non-JSON body is not quoted


async def test_401_is_not_retried_and_the_key_is_not_echoed(io_autojump_clock):
    notices = Notices()
    message = f"Authentication Fails, your api key: {API_KEY} is invalid"
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            server = await FakeOpenAI([status(401, message), status(401)]).start(nursery)
            with pytest.raises(ModelError) as info:
                await collect(adapter_for(server), make_request(on_retry=notices))
        nursery.cancel_scope.cancel()

    text = str(info.value)
    assert "HTTP 401" in text
    assert "Authentication Fails" in text
    assert API_KEY not in text
    assert len(server.requests) == 1
    assert notices.seen == []


async def test_broken_stream_before_any_chunk_is_retried(io_autojump_clock):
    # Only a tool-call fragment arrived: nothing was yielded yet, so retrying is safe.
    notices = Notices()
    first = sse(tool_fragment(0, id="c", name="ls"), finish("tool_calls"), break_after=1)
    second = sse(content("ok"), finish("stop"))
    with trio.fail_after(10):
        chunks, server = await run_against([first, second], make_request(on_retry=notices))
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert len(server.requests) == 2
    assert notices.seen == [RetryNotice(1, 0.5, "RemoteProtocolError")]


async def test_no_retry_once_a_chunk_was_yielded(io_autojump_clock):
    notices = Notices()
    got: list = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            answers = [sse(content("partial"), finish("stop"), break_after=1)]
            server = await FakeOpenAI(answers).start(nursery)
            with pytest.raises(ModelError, match="broke off"):
                async with aclosing(
                    adapter_for(server).stream(make_request(on_retry=notices))
                ) as chunks:
                    async for chunk in chunks:
                        got.append(chunk)
        nursery.cancel_scope.cancel()
    assert got == [TextDelta("partial")]
    assert len(server.requests) == 1
    assert notices.seen == []


async def test_read_timeout_is_retried(io_autojump_clock):
    notices = Notices()
    with trio.fail_after(30):
        start = trio.current_time()
        chunks, server = await run_against(
            [Answer(hang=True), sse(content("ok"), finish("stop"))],
            make_request(on_retry=notices),
            timeout=httpx.Timeout(5.0),
        )
        elapsed = trio.current_time() - start
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert notices.seen == [RetryNotice(1, 0.5, "ReadTimeout")]
    assert server.hung_up.is_set()  # the timed-out connection was closed, not leaked
    assert elapsed == pytest.approx(5.5, abs=0.1)


async def test_connection_refused_is_retried_then_fails(io_autojump_clock):
    # A port that was just free: nothing listens there any more.
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()

    notices = Notices()
    adapter = OpenAICompatibleAdapter(f"http://127.0.0.1:{port}", API_KEY, max_attempts=2)
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="failed after 2 attempts: ConnectError"):
            await collect(adapter, make_request(on_retry=notices))
    assert notices.seen == [RetryNotice(1, 0.5, "ConnectError")]


async def test_other_httpx_failures_are_model_errors_without_retry():
    notices = Notices()
    # The scheme is refused before any connection is attempted: no server needed.
    adapter = OpenAICompatibleAdapter("ftp://127.0.0.1:1", API_KEY)
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="UnsupportedProtocol"):
            await collect(adapter, make_request(on_retry=notices))
    assert notices.seen == []


async def test_error_event_does_not_echo_the_key():
    event = {"error": {"message": f"bad key {API_KEY}"}}
    with trio.fail_after(10):
        with pytest.raises(ModelError, match="bad key") as info:
            await run_against([sse(event)])
    assert API_KEY not in str(info.value)


# -- cancellation ---------------------------------------------------------------------


async def test_cancellation_mid_stream_closes_the_connection():
    got: list = []
    first_chunk = trio.Event()

    async def consume(adapter: OpenAICompatibleAdapter) -> None:
        async with aclosing(adapter.stream(make_request())) as chunks:
            async for chunk in chunks:
                got.append(chunk)
                first_chunk.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = await FakeOpenAI(
                [sse(content("one"), content("two"), finish("stop"), hold_after=1)]
            ).start(nursery)
            with trio.CancelScope() as consumer_scope:
                async with trio.open_nursery() as inner:
                    inner.start_soon(consume, adapter_for(server))
                    await first_chunk.wait()
                    # The consumer is now waiting for bytes the server holds back.
                    consumer_scope.cancel()
            # The adapter let trio.Cancelled through (no ModelError, nothing swallowed)...
            assert consumer_scope.cancelled_caught
            # ...and hung up, which is how the server learns the call was abandoned.
            await server.hung_up.wait()
            nursery.cancel_scope.cancel()
    assert got == [TextDelta("one")]
    assert len(server.requests) == 1


async def test_cancellation_during_backoff_propagates(io_autojump_clock):
    scope = trio.CancelScope()

    async def cancel_on_retry(notice: RetryNotice) -> None:
        scope.cancel()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = await FakeOpenAI([status(503), sse(content("x"), finish("stop"))]).start(
                nursery
            )
            with scope:
                await collect(adapter_for(server), make_request(on_retry=cancel_on_retry))
            nursery.cancel_scope.cancel()
    assert scope.cancelled_caught
    assert len(server.requests) == 1  # the retry never happened
