"""``OpenAICompatibleAdapter``: streaming chat completions over httpx (DeepSeek, ...).

httpx runs under trio through anyio. One ``httpx.AsyncClient`` is opened per model
call and closed when the stream ends or is cancelled, so the adapter owns no resource
between calls and needs no lifecycle of its own; a model call takes seconds, so the
extra connection setup does not matter.

Retries are bounded and only happen while the caller has seen nothing yet: once a chunk
was yielded, repeating the call could duplicate text or tool calls, so a later failure
is a ``ModelStreamBrokenError``. The retry policy is ``_http.RetryPolicy``'s.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import attrs
import httpx

from .._errors import ModelError
from .._logging import get_logger
from .._messages import (
    ImageBlock,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ._adapter import (
    Chunk,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallChunk,
    ToolSpec,
    Usage,
)
from ._http import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    ApiKey,
    Attempts,
    Price,
    RetryPolicy,
    SseCall,
    error_text,
    finish_reason,
    priced,
)

log = get_logger(__name__)

DEEPSEEK_BASE_URL = "https://api.deepseek.com"
DEEPSEEK_MODELS: tuple[str, ...] = ("deepseek-v4-flash", "deepseek-v4-pro")

_FINISH_REASONS: Mapping[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",  # the pre-tools name some servers still send
    "length": "max-tokens",
}


# -- request body ---------------------------------------------------------------------


def _user_content(blocks: Sequence[Any]) -> str | list[dict[str, Any]]:
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    images = [b for b in blocks if isinstance(b, ImageBlock)]
    if not images:
        return "".join(texts)
    # Content parts only when needed: text-only servers accept the plain string form.
    parts: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    for image in images:
        url = f"data:{image.media_type};base64,{image.data}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _convert_message(message: Message, *, echo_reasoning: bool) -> list[dict[str, Any]]:
    """One loopdock message as one or more chat-completions messages."""
    out: list[dict[str, Any]] = []
    # Tool results become one ``tool`` message each, whatever role carried them.
    results = [b for b in message.content if isinstance(b, ToolResultBlock)]
    others = [b for b in message.content if not isinstance(b, ToolResultBlock)]
    for result in results:
        out.append({"role": "tool", "tool_call_id": result.call_id, "content": result.content})
    if not others:
        return out

    if message.role == "assistant":
        entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
        calls = [b for b in others if isinstance(b, ToolCallBlock)]
        if calls:
            entry["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        reasoning = "".join(b.text for b in others if isinstance(b, ReasoningBlock))
        if reasoning and echo_reasoning:
            # DeepSeek's thinking models answer 400 when an assistant turn that made
            # tool calls comes back without its reasoning; other turns' is ignored.
            entry["reasoning_content"] = reasoning
        if entry["content"] is None and "tool_calls" not in entry:
            entry["content"] = ""
        out.append(entry)
    elif message.role == "system":
        out.append({"role": "system", "content": message.text})
    else:
        # ``user`` (and a ``tool`` message carrying text, which chat completions has
        # no other place for).
        out.append({"role": "user", "content": _user_content(others)})
    return out


def _tool_spec(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": dict(spec.parameters),
        },
    }


def build_body(request: ModelRequest, *, echo_reasoning: bool = True) -> dict[str, Any]:
    """The JSON body of a streaming chat-completions call for ``request``."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        messages.extend(_convert_message(message, echo_reasoning=echo_reasoning))
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "stream": True,
        # Without this, OpenAI-style servers send no usage at all when streaming.
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [_tool_spec(t) for t in request.tools]
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    return body


# -- response stream ------------------------------------------------------------------


@attrs.define
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: str = ""


@attrs.define
class _StreamParser:
    """Turns SSE lines into chunks; tool-call fragments are held until the end.

    A plain (synchronous) object rather than an async generator, so the adapter's own
    generator is the only one to close on cancellation.
    """

    redact: Callable[[str], str] = lambda text: text
    price: Price | None = None
    calls: dict[int, _PartialCall] = attrs.field(factory=dict)
    usage: Usage | None = None
    finish: FinishReason | None = None
    done: bool = False

    def feed(self, line: str) -> list[Chunk]:
        # Each ``data:`` line of an OpenAI-style stream holds one whole JSON event;
        # comments (``:``), ``event:``/``id:`` fields and blank separators carry nothing.
        if not line.startswith("data:"):
            return []
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return []
        try:
            event = json.loads(data)
        except ValueError:
            raise ModelError("model stream sent an event that is not JSON") from None
        if not isinstance(event, dict):
            return []
        if "error" in event:
            message = self.redact(error_text(event)) or "no message"
            raise ModelError(f"model stream reported an error: {message}")
        chunks: list[Chunk] = []
        usage = event.get("usage")
        if isinstance(usage, dict):
            # Some servers repeat a running total on every event: keep the last one.
            self.usage = Usage(
                int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            )
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                chunks.append(ReasoningDelta(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                chunks.append(TextDelta(content))
            for fragment in delta.get("tool_calls") or ():
                self._add_fragment(fragment)
            reason = choice.get("finish_reason")
            if reason:
                self.finish = finish_reason(str(reason), _FINISH_REASONS, "finish reason")
        return chunks

    def _add_fragment(self, fragment: Mapping[str, Any]) -> None:
        index = int(fragment.get("index", 0))
        call = self.calls.setdefault(index, _PartialCall())
        if fragment.get("id"):
            call.call_id = fragment["id"]
        function = fragment.get("function") or {}
        # Every field is a delta: names arrive whole from most servers, in pieces from
        # a few, and concatenation is right for both.
        call.name += function.get("name") or ""
        call.arguments += function.get("arguments") or ""

    def end(self) -> list[Chunk]:
        """The chunks due once the stream is over: assembled tool calls, usage, finish."""
        if self.finish is None:
            raise ModelError("model stream ended without a finish reason")
        chunks: list[Chunk] = []
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call.name:
                raise ModelError(f"model stream sent tool call #{index} without a name")
            chunks.append(
                ToolCallChunk(
                    call_id=call.call_id or f"call-{index}",
                    name=call.name,
                    # A call with no parameters may stream no argument text at all.
                    arguments=call.arguments or "{}",
                )
            )
        if self.usage is not None:
            chunks.append(priced(self.usage, self.price))
        chunks.append(Finish(self.finish))
        return chunks


# -- the adapter ----------------------------------------------------------------------


class OpenAICompatibleAdapter:
    """A model provider speaking the OpenAI chat-completions streaming protocol (vLLM,
    Ollama, llama.cpp's server, OpenRouter, DeepSeek, ...).

    ``api_key`` is the key itself or an ``ApiKey`` naming the variable that holds it
    (none at all for a local server without auth). ``client_factory()`` must return a
    fresh ``httpx.AsyncClient``; the adapter enters and closes it around each call.
    ``retry`` says how often 429s, 5xx and broken connections are retried (a 4xx is
    ModelRejectedError at once); ``draw`` is the jitter's random source. ``prices``
    (per model name) put a cost on each call's Usage. ``echo_reasoning`` sends an
    assistant turn's reasoning back as ``reasoning_content`` (DeepSeek requires it after
    tool calls).

    Cancelling the caller's scope mid-stream closes the HTTP stream and its connection
    before the cancellation propagates.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | ApiKey | None = None,
        *,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        draw: Callable[[], float] = random.random,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        models: Sequence[str] = (),
        prices: Mapping[str, Price] | None = None,
        echo_reasoning: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key if isinstance(api_key, ApiKey) else ApiKey(api_key)
        self._timeout = timeout
        self._client_factory = client_factory or self._default_client
        self.retry = retry
        self._draw = draw
        self.models = tuple(models)
        self.prices = dict(prices or {})
        self.echo_reasoning = echo_reasoning

    def __repr__(self) -> str:
        # Never the key: adapters end up in logs and tracebacks.
        return f"OpenAICompatibleAdapter(base_url={self.base_url!r})"

    def _default_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        url = f"{self.base_url}/chat/completions"
        key = self._key.get(self.base_url)

        def redact(text: str) -> str:
            # An error body may echo the credential back; it must not reach a log.
            return text.replace(key, "***") if key else text

        body = build_body(request, echo_reasoning=self.echo_reasoning)
        headers = {"Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        price = self.prices.get(request.model)
        call = SseCall(
            self._client_factory, url, body, headers, self.base_url, redact,
            lambda: _StreamParser(redact=redact, price=price),
        )  # fmt: skip
        attempts = Attempts(self.base_url, self.retry, request.on_retry, self._draw)
        async with aclosing(call.stream(attempts)) as chunks:
            async for chunk in chunks:
                yield chunk


def deepseek_adapter(env: Mapping[str, str]) -> OpenAICompatibleAdapter | None:
    """DeepSeek, a preset of the OpenAI-compatible adapter: its base URL (or
    ``DEEPSEEK_BASE_URL``), its key from ``DEEPSEEK_API_KEY``; None without that key."""
    if not (env.get("DEEPSEEK_API_KEY") or "").strip():
        return None
    base_url = (env.get("DEEPSEEK_BASE_URL") or "").strip() or DEEPSEEK_BASE_URL
    return OpenAICompatibleAdapter(
        base_url, ApiKey(env_name="DEEPSEEK_API_KEY", env=env), models=DEEPSEEK_MODELS
    )
