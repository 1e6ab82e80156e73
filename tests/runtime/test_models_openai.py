"""OpenAICompatibleAdapter against a stand-in chat-completions server on loopback
(tests/openai_standin.py).

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

from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from openai_standin import (
    Answer,
    FakeOpenAI,
    content,
    finish,
    reasoning,
    sse,
    status,
    tool_fragment,
    usage,
)

from loopdock.runtime._errors import ModelError, ModelRejectedError, ModelStreamBrokenError
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
    ApiKey,
    Finish,
    ModelRequest,
    OpenAICompatibleAdapter,
    Price,
    ReasoningDelta,
    RetryNotice,
    RetryPolicy,
    TextDelta,
    ToolCallChunk,
    ToolSpec,
    Usage,
    deepseek_adapter,
)
from loopdock.runtime.models._http import retry_after

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


def make_request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        provider="openai",
        model=kwargs.pop("model", "deepseek-v4-flash"),
        system=kwargs.pop("system", ""),
        messages=messages or (user_message("hi"),),
        **kwargs,
    )


def adapter_for(server: FakeOpenAI, **kwargs: Any) -> OpenAICompatibleAdapter:
    # No jitter unless a test asks for it: delays are then exactly the backoff's.
    kwargs.setdefault("draw", lambda: 0.0)
    return OpenAICompatibleAdapter(server.base_url, kwargs.pop("api_key", API_KEY), **kwargs)


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
        with pytest.raises(ModelError, match="stopped with finish reason .content_filter."):
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
        chunks, server = await run_against(answers, request)
        elapsed = trio.current_time() - start

    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert len(server.requests) == 3
    assert notices.seen == [
        RetryNotice(1, 0.5, "HTTP 503: busy"),
        RetryNotice(2, 1.0, "HTTP 429: slow down"),
    ]
    # The exponential backoff really was slept (in virtual time): 0.5 s + 1 s.
    assert elapsed == pytest.approx(1.5, abs=0.1)


async def test_retry_after_is_honoured_instead_of_the_backoff(io_autojump_clock):
    notices = Notices()
    answers = [status(429, "slow down", Retry_After="7"), sse(content("ok"), finish("stop"))]
    with trio.fail_after(30):
        start = trio.current_time()
        chunks, server = await run_against(answers, make_request(on_retry=notices))
        elapsed = trio.current_time() - start
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert notices.seen == [RetryNotice(1, 7.0, "HTTP 429: slow down")]
    assert elapsed == pytest.approx(7.0, abs=0.1)
    assert len(server.requests) == 2


async def test_a_retry_after_past_the_limit_fails_at_once(io_autojump_clock):
    notices = Notices()
    with trio.fail_after(30):
        with pytest.raises(ModelError, match="asks to wait 3600 s") as info:
            await run_against([status(429, Retry_After="3600"), sse(content("x"), finish("stop"))],
                              make_request(on_retry=notices))  # fmt: skip
    assert not isinstance(info.value, ModelRejectedError)
    assert notices.seen == []


async def test_backoff_is_exponential_capped_and_jittered(io_autojump_clock):
    notices = Notices()
    policy = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=3.0, jitter=0.5)
    with trio.fail_after(60):
        with pytest.raises(ModelError, match="failed after 5 attempts"):
            await run_against([status(503)] * 5, make_request(on_retry=notices), retry=policy,
                              draw=lambda: 0.5)  # fmt: skip
    # 1, 2, 4 -> 3 (the cap), 8 -> 3; each less half of its jitter share (0.5 * 0.5).
    assert [n.delay for n in notices.seen] == [0.75, 1.5, 2.25, 2.25]


async def test_retries_exhausted_is_a_model_error(io_autojump_clock):
    notices = Notices()
    with trio.fail_after(10):
        with pytest.raises(ModelError, match=r"failed after 3 attempts: HTTP 503") as info:
            await run_against(
                [status(503), status(503), status(503)],
                make_request(on_retry=notices),
                retry=RetryPolicy(max_attempts=3, base_delay=1.0),
            )
    assert [n.attempt for n in notices.seen] == [1, 2]
    assert [n.delay for n in notices.seen] == [1.0, 2.0]
    assert "oops" not in str(info.value)  # a non-JSON body is not quoted


async def test_401_is_not_retried_and_the_key_is_not_echoed(io_autojump_clock):
    notices = Notices()
    message = f"Authentication Fails, your api key: {API_KEY} is invalid"
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            server = await FakeOpenAI([status(401, message), status(401)]).start(nursery)
            with pytest.raises(ModelRejectedError) as info:
                await collect(adapter_for(server), make_request(on_retry=notices))
        nursery.cancel_scope.cancel()

    assert info.value.status == 401 and info.value.code == "MODEL_REJECTED"
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
            with pytest.raises(ModelStreamBrokenError, match="broke off"):
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
    adapter = OpenAICompatibleAdapter(
        f"http://127.0.0.1:{port}", API_KEY, retry=RetryPolicy(max_attempts=2), draw=lambda: 0.0
    )
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


# -- keys, prices, Retry-After --------------------------------------------------------


async def test_the_key_is_read_from_the_named_variable_at_each_call():
    env = {"MY_KEY": "sk-from-env"}
    key = ApiKey(env_name="MY_KEY", env=env)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            server = await FakeOpenAI([sse(content("a"), finish("stop"))] * 2).start(nursery)
            adapter = adapter_for(server, api_key=key)
            await collect(adapter, make_request())
            env["MY_KEY"] = "sk-rotated"
            await collect(adapter, make_request())
        nursery.cancel_scope.cancel()
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer sk-from-env", "Bearer sk-rotated"]
    assert "sk-" not in repr(key) and "sk-" not in repr(adapter)


async def test_an_unset_key_variable_is_refused_before_any_request():
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            server = await FakeOpenAI([sse(content("a"), finish("stop"))]).start(nursery)
            adapter = adapter_for(server, api_key=ApiKey(env_name="NOT_SET_KEY", env={}))
            with pytest.raises(ModelRejectedError, match=r"needs \$NOT_SET_KEY"):
                await collect(adapter, make_request())
        nursery.cancel_scope.cancel()
    assert server.requests == []


async def test_no_key_sends_no_authorization_header():
    with trio.fail_after(10):
        chunks, server = await run_against([sse(content("a"), finish("stop"))], api_key=None)
    assert chunks == [TextDelta("a"), Finish("stop")]
    assert "authorization" not in server.requests[0].headers


async def test_prices_put_a_cost_on_the_usage():
    prices = {"deepseek-v4-flash": Price(input=0.5, output=2.0)}
    with trio.fail_after(10):
        chunks, _ = await run_against([sse(content("a"), finish("stop"), usage(1000, 500))], prices=prices)
        other, _ = await run_against([sse(content("a"), finish("stop"), usage(1000, 500))],
                                     make_request(model="unpriced"), prices=prices)  # fmt: skip
    assert Usage(1000, 500, cost=pytest.approx(0.0015)) in chunks
    assert Usage(1000, 500) in other  # no price for the model: no cost


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after({"retry-after": "12"}) == 12.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, now=1445412480.0) == 30.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_deepseek_is_a_preset_of_the_generic_adapter():
    env = {"DEEPSEEK_API_KEY": "k", "DEEPSEEK_BASE_URL": "http://127.0.0.1:1/v1/"}
    adapter = deepseek_adapter(env)
    assert type(adapter) is OpenAICompatibleAdapter
    assert adapter.base_url == "http://127.0.0.1:1/v1"
    assert deepseek_adapter({}) is None
