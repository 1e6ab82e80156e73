"""``ScriptedAdapter``: a model whose replies a test writes in advance.

Tests script what "the model" says (text, reasoning, tool calls, a finish reason, or an
error), hold a call in flight with a ``trio.Event`` to exercise cancellation, and assert
on every ``ModelRequest`` the adapter received through ``.requests`` (kept without its
``on_retry`` callback: that closes over the agent, and an adapter shared by thousands of
rollouts would keep every agent alive).
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Union

import attrs
import trio

from .._errors import ModelError
from ._adapter import (
    Chunk,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallChunk,
    Usage,
)
from ._ping import count_words


def _arguments_text(value: str | Mapping[str, Any]) -> str:
    # Tests write arguments as dicts for readability; the wire form is JSON text.
    if isinstance(value, str):
        return value
    return json.dumps(dict(value))


@attrs.frozen
class ToolCall:
    """One scripted tool call; ``call_id=None`` gets ``call-<n>`` from the adapter."""

    name: str
    arguments: str = attrs.field(default="{}", converter=_arguments_text)
    call_id: str | None = None


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


@attrs.frozen
class Reply:
    """One scripted model reply.

    ``finish`` defaults to ``"tool-calls"`` when there are tool calls, else ``"stop"``;
    ``usage`` defaults to word counts. ``error`` is raised instead of streaming anything;
    ``block`` is awaited first (before the error, too) so a test can hold the call.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    reasoning: str = ""
    finish: FinishReason | None = None
    usage: Usage | None = None
    error: Exception | None = attrs.field(default=None, eq=False)
    block: trio.Event | None = attrs.field(default=None, eq=False, repr=False)


ReplyLike = Union[Reply, str]
Respond = Callable[[ModelRequest], Union[ReplyLike, Awaitable[ReplyLike]]]


def _as_reply(value: ReplyLike) -> Reply:
    # A bare string is the common case in tests: a plain text answer.
    return Reply(text=value) if isinstance(value, str) else value


class ScriptedAdapter:
    """Replies from a list (in order, each used once) or from ``respond(request)``."""

    def __init__(self, replies: Iterable[ReplyLike] | Respond) -> None:
        if callable(replies):
            self._respond: Respond | None = replies
            self._replies: list[Reply] = []
        else:
            self._respond = None
            self._replies = [_as_reply(r) for r in replies]
        self._next_reply = 0
        self._call_ids = itertools.count(1)
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """How many scripted replies are still unused (0 with a ``respond`` callable)."""
        return len(self._replies) - self._next_reply

    async def _reply_for(self, request: ModelRequest) -> Reply:
        if self._respond is not None:
            value = self._respond(request)
            if inspect.isawaitable(value):
                value = await value
            return _as_reply(value)
        if self._next_reply >= len(self._replies):
            raise ModelError(
                f"ScriptedAdapter ran out of replies: {len(self._replies)} scripted, "
                f"but model call #{len(self.requests)} was made"
            )
        reply = self._replies[self._next_reply]
        self._next_reply += 1
        return reply

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request if request.on_retry is None else attrs.evolve(request, on_retry=None))
        reply = await self._reply_for(request)
        if reply.block is not None:
            await reply.block.wait()
        if reply.error is not None:
            raise reply.error

        output_tokens = 0
        if reply.reasoning:
            output_tokens += count_words(reply.reasoning)
            await trio.lowlevel.checkpoint()
            yield ReasoningDelta(reply.reasoning)
        if reply.text:
            output_tokens += count_words(reply.text)
            await trio.lowlevel.checkpoint()
            yield TextDelta(reply.text)
        for call in reply.tool_calls:
            call_id = call.call_id if call.call_id is not None else f"call-{next(self._call_ids)}"
            output_tokens += count_words(call.name) + count_words(call.arguments)
            await trio.lowlevel.checkpoint()
            yield ToolCallChunk(call_id, call.name, call.arguments)

        usage = reply.usage
        if usage is None:
            input_tokens = count_words(request.system) + sum(
                count_words(m.text) for m in request.messages
            )
            usage = Usage(input_tokens, output_tokens)
        await trio.lowlevel.checkpoint()
        yield usage
        finish = reply.finish
        if finish is None:
            finish = "tool-calls" if reply.tool_calls else "stop"
        yield Finish(finish)
