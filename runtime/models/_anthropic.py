"""``AnthropicAdapter``: the Anthropic Messages API, streamed (``POST /v1/messages``).

The SSE events: ``message_start`` (input usage), ``content_block_start`` / ``_delta`` /
``_stop`` (text; thinking, whose signature arrives as ``signature_delta``;
redacted_thinking, whole at its start; or a tool_use whose input arrives as
``input_json_delta`` pieces), ``message_delta`` (stop reason, output usage),
``message_stop``, ``ping``, and ``error`` (``overloaded_error`` and ``api_error`` are
retried like a 529 while nothing was yielded). Retries, key handling and cancellation are ``_http.SseCall``'s.
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
from .._messages import ImageBlock, Message, ReasoningBlock, TextBlock, ToolCallBlock, ToolResultBlock
from ._adapter import (
    Chunk,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallChunk,
    Usage,
)
from ._http import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    ApiKey,
    Attempts,
    Price,
    RetryableStatus,
    RetryPolicy,
    SseCall,
    error_text,
    finish_reason,
    priced,
)

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"

_FINISH_REASONS: Mapping[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
}
# Error events that say the service, not the request, failed.
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error"})


# -- request body ---------------------------------------------------------------------


def _blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock) and block.text:
            out.append({"type": "text", "text": block.text})
        elif isinstance(block, ReasoningBlock):
            # Extended thinking with tools: the turn's thinking blocks go back unchanged,
            # before its tool_use blocks. Reasoning without a signature (another
            # provider's) cannot: the API checks it.
            if block.redacted_data is not None:
                out.append({"type": "redacted_thinking", "data": block.redacted_data})
            elif block.signature is not None:
                out.append({"type": "thinking", "thinking": block.text, "signature": block.signature})
        elif isinstance(block, ImageBlock):
            source = {"type": "base64", "media_type": block.media_type, "data": block.data}
            out.append({"type": "image", "source": source})
        elif isinstance(block, ToolCallBlock):
            try:
                arguments = json.loads(block.arguments or "{}")
            except ValueError:
                arguments = {}  # the model wrote bad JSON; its tool result said so already
            out.append({"type": "tool_use", "id": block.call_id, "name": block.name, "input": arguments})
        elif isinstance(block, ToolResultBlock):
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.call_id, "content": block.content}
            if block.is_error:
                result["is_error"] = True
            out.append(result)
    return out


def build_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of a streaming Messages call for ``request``."""
    system = [request.system] if request.system else []
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "system":
            system.append(message.text)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        # The API wants user and assistant to alternate: consecutive turns of one role merge.
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in request.tools
        ]
    return body


# -- response stream ------------------------------------------------------------------


@attrs.define
class _ToolUse:
    call_id: str
    name: str
    arguments: str = ""


@attrs.define
class _StreamParser:
    redact: Callable[[str], str] = lambda text: text
    price: Price | None = None
    tools: dict[int, _ToolUse] = attrs.field(factory=dict)
    # Open thinking blocks' signatures, and open redacted_thinking blocks' data, by index.
    signatures: dict[int, str] = attrs.field(factory=dict)
    redacted: dict[int, str] = attrs.field(factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    finish: FinishReason | None = None
    done: bool = False

    def feed(self, line: str) -> list[Chunk]:
        # ``event:`` lines repeat the data's own ``type``; only ``data:`` lines matter.
        if not line.startswith("data:"):
            return []
        try:
            event = json.loads(line[len("data:") :].strip())
        except ValueError:
            raise ModelError("model stream sent an event that is not JSON") from None
        if not isinstance(event, dict):
            return []
        kind = event.get("type")
        if kind == "message_start":
            self._usage((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            return self._start(int(event.get("index", 0)), event.get("content_block") or {})
        elif kind == "content_block_delta":
            return self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            return self._stop(int(event.get("index", 0)))
        elif kind == "message_delta":
            self._usage(event.get("usage"))
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish = finish_reason(str(reason), _FINISH_REASONS, "stop reason")
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self._error(event)
        return []

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # Cached prompt tokens are input too, counted apart by the API.
        inputs = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
        if any(isinstance(n, int) for n in inputs):
            self.input_tokens = sum(n for n in inputs if isinstance(n, int))
        if isinstance(usage.get("output_tokens"), int):
            self.output_tokens = usage["output_tokens"]  # a running total

    def _start(self, index: int, block: Mapping[str, Any]) -> list[Chunk]:
        kind = block.get("type")
        if kind == "tool_use":
            self.tools[index] = _ToolUse(str(block.get("id") or f"call-{index}"), str(block.get("name") or ""))
        elif kind == "thinking":
            self.signatures[index] = str(block.get("signature") or "")
            if block.get("thinking"):
                return [ReasoningDelta(str(block["thinking"]))]
        elif kind == "redacted_thinking":
            self.redacted[index] = str(block.get("data") or "")
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[Chunk]:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [TextDelta(str(delta["text"]))]
        if kind == "thinking_delta" and delta.get("thinking"):
            return [ReasoningDelta(str(delta["thinking"]))]
        if kind == "signature_delta" and index in self.signatures:
            self.signatures[index] += str(delta.get("signature") or "")
        if kind == "input_json_delta" and index in self.tools:
            self.tools[index].arguments += str(delta.get("partial_json") or "")
        return []

    def _stop(self, index: int) -> list[Chunk]:
        if index in self.signatures:
            return [ReasoningEnd(signature=self.signatures.pop(index) or None)]
        if index in self.redacted:
            return [ReasoningEnd(redacted_data=self.redacted.pop(index))]
        tool = self.tools.pop(index, None)
        if tool is None:
            return []
        if not tool.name:
            raise ModelError(f"model stream sent tool call #{index} without a name")
        # A call with no parameters may stream no input at all.
        return [ToolCallChunk(tool.call_id, tool.name, tool.arguments or "{}")]

    def _error(self, event: Mapping[str, Any]) -> None:
        error = event.get("error") or {}
        kind = str(error.get("type") or "error") if isinstance(error, dict) else "error"
        message = self.redact(error_text(event)) or "no message"
        if kind in _RETRYABLE_ERRORS:
            raise RetryableStatus(f"{kind}: {message}", None)
        raise ModelError(f"model stream reported an error: {kind}: {message}")

    def end(self) -> list[Chunk]:
        if self.finish is None:
            raise ModelError("model stream ended without a stop reason")
        usage = priced(Usage(self.input_tokens, self.output_tokens), self.price)
        return [usage, Finish(self.finish)]


# -- the adapter ----------------------------------------------------------------------


class AnthropicAdapter:
    """A model provider speaking Anthropic's Messages API.

    ``api_key`` is the key or an ``ApiKey`` naming its variable; it is sent as
    ``x-api-key`` with ``anthropic-version``. The other options are the OpenAI-compatible
    adapter's. Tool calls are yielded as each tool_use block closes.

    Cancelling the caller's scope mid-stream closes the HTTP stream and its connection
    before the cancellation propagates.
    """

    def __init__(
        self,
        api_key: str | ApiKey,
        base_url: str = ANTHROPIC_BASE_URL,
        *,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        draw: Callable[[], float] = random.random,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        prices: Mapping[str, Price] | None = None,
        version: str = ANTHROPIC_VERSION,
        models: Sequence[str] = (),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key if isinstance(api_key, ApiKey) else ApiKey(api_key)
        self._timeout = timeout
        self._client_factory = client_factory or self._default_client
        self.retry = retry
        self._draw = draw
        self.prices = dict(prices or {})
        self.version = version
        self.models = tuple(models)

    def __repr__(self) -> str:
        return f"AnthropicAdapter(base_url={self.base_url!r})"

    def _default_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        key = self._key.get(self.base_url)

        def redact(text: str) -> str:
            return text.replace(key, "***") if key else text

        headers = {
            "x-api-key": key,
            "anthropic-version": self.version,
            "accept": "text/event-stream",
        }
        price = self.prices.get(request.model)
        call = SseCall(
            self._client_factory, f"{self.base_url}/v1/messages", build_body(request), headers, self.base_url,
            redact, lambda: _StreamParser(redact=redact, price=price),
        )  # fmt: skip
        attempts = Attempts(self.base_url, self.retry, request.on_retry, self._draw)
        async with aclosing(call.stream(attempts)) as chunks:
            async for chunk in chunks:
                yield chunk
