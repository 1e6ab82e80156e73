"""A stand-in model server on 127.0.0.1, for the model adapter tests: OpenAI's chat
completions events, or Anthropic's Messages events with ``Answer(named=True)``.

It speaks just enough HTTP/1.1: it reads the request line, headers and a Content-Length
body, records the request, and plays one scripted answer per connection (every answer
says ``Connection: close``, so each attempt is a fresh connection and the order of
answers is the order of attempts).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import attrs
import trio


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
    headers: dict[str, str] = attrs.Factory(dict)  # extra headers of a non-200 answer
    named: bool = False  # each event preceded by ``event: <its type>`` (Anthropic's form)


def sse(*events: Any, done: bool = True, **options: Any) -> Answer:
    return Answer(events=[*events, "[DONE]"] if done else list(events), **options)


def status(code: int, message: str | None = None, **headers: str) -> Answer:
    body = {"error": {"message": message, "type": "x"}} if message is not None else None
    return Answer(status=code, error_body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})


def _encode_event(event: Any, named: bool = False) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event)
    name = f"event: {event['type']}\n" if named and isinstance(event, dict) else ""
    return f"{name}data: {data}\n\n".encode()


_REASONS = {200: "OK", 401: "Unauthorized", 429: "Too Many Requests", 503: "Unavailable", 529: "Overloaded"}


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
            extra = "".join(f"{name}: {value}\r\n" for name, value in answer.headers.items())
            await stream.send_all(
                f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Error')}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            return
        payloads = [_encode_event(e, answer.named) for e in answer.events]
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


# -- events --------------------------------------------------------------------------


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
