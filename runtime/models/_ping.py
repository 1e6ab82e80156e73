"""``PingAdapter``: an offline, deterministic model for demos, smoke tests and examples.

It never touches the network, the clock or a random source, so the same request always
streams the same chunks. Two behaviours, chosen by the last message of the request:

* a user message with lines ``call: <tool-name> <json-object>`` asks for those tool
  calls (one ``ToolCallChunk`` per line, then ``Usage``, then ``Finish("tool-calls")``);
* anything else is answered ``pong: <text>``, one ``TextDelta`` per word, truncated to
  ``max_tokens`` words (``Finish("max-tokens")``) when the reply is longer.

A "token" is a whitespace-separated word: crude, but deterministic and easy to assert on.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence

import trio

from .._messages import Message, ToolResultBlock
from .._transcript import tool_call_count, word_count
from ._adapter import Chunk, Finish, FinishReason, ModelRequest, TextDelta, ToolCallChunk, Usage

PING_MODEL = "ping-1"

# ``call: list_dir {"path": "."}``; the JSON must decode to an object, checked after the
# match, so a malformed line is simply not a call (it gets ponged back instead).
_CALL_LINE = re.compile(r"^\s*call:\s*(?P<name>[A-Za-z0-9_.:-]+)\s+(?P<args>\{.*\})\s*$")
# A word with the whitespace that follows it: concatenating the pieces gives back the
# reply exactly, so streaming does not alter spacing or newlines.
_WORD_PIECE = re.compile(r"\S+\s*")


def count_words(text: str) -> int:
    """The ping "token" count of ``text``."""
    return len(text.split())


def _parse_calls(text: str) -> list[tuple[str, str]]:
    calls = []
    for line in text.splitlines():
        match = _CALL_LINE.match(line)
        if match is None:
            continue
        try:
            decoded = json.loads(match["args"])
        except ValueError:
            continue
        if isinstance(decoded, dict):
            calls.append((match["name"], match["args"]))
    return calls


def _input_tokens(request: ModelRequest) -> int:
    # Message.word_count is this same count, computed once per (frozen) message; an
    # agent's request carries a transcript snapshot whose total is kept as it grows, so
    # a step costs the same whatever the length of the history.
    return count_words(request.system) + word_count(request.messages)


def _pong_subject(messages: Sequence[Message]) -> str:
    """What the pong echoes: the tool results if the model is being shown some, else
    the last user message's text (empty when there is none)."""
    if messages and messages[-1].role == "tool":
        results = [b.content for b in messages[-1].content if isinstance(b, ToolResultBlock)]
        return "\n".join(results)
    for message in reversed(messages):
        if message.role == "user":
            return message.text
    return ""


class PingAdapter:
    """Offline, deterministic model adapter; accepts any model name (``ping-1`` by
    convention)."""

    models: tuple[str, ...] = (PING_MODEL,)
    #: It computes and never waits on I/O: a turn keeps its admission slot across a
    #: call (see ``ModelAdapter``).
    cpu_bound = True

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        # One schedule point per request: a model call is a checkpoint, as trio asks.
        # After it every chunk is a cancel point (the stream is cancellable at each
        # chunk, as the adapter protocol requires) but not a schedule point: nothing
        # here blocks, and a scheduler round per word only spends the caller's time.
        await trio.lowlevel.checkpoint()
        input_tokens = _input_tokens(request)
        last = request.messages[-1] if request.messages else None

        calls = _parse_calls(last.text) if last is not None and last.role == "user" else []
        if calls:
            # Ids continue after the calls already in the conversation, so they stay
            # unique within a session without the adapter keeping any state.
            first = 1 + tool_call_count(request.messages)
            output_tokens = 0
            for offset, (name, arguments) in enumerate(calls):
                output_tokens += count_words(name) + count_words(arguments)
                await trio.lowlevel.checkpoint_if_cancelled()
                yield ToolCallChunk(f"ping-call-{first + offset}", name, arguments)
            await trio.lowlevel.checkpoint_if_cancelled()
            yield Usage(input_tokens, output_tokens)
            yield Finish("tool-calls")
            return

        pieces = _WORD_PIECE.findall("pong: " + _pong_subject(request.messages))
        reason: FinishReason = "stop"
        if len(pieces) > request.max_tokens:
            pieces = pieces[: max(request.max_tokens, 0)]
            if pieces:
                # The cut reply ends at its last word, not on dangling whitespace.
                pieces[-1] = pieces[-1].rstrip()
            reason = "max-tokens"
        for piece in pieces:
            await trio.lowlevel.checkpoint_if_cancelled()
            yield TextDelta(piece)
        await trio.lowlevel.checkpoint_if_cancelled()
        yield Usage(input_tokens, len(pieces))
        yield Finish(reason)
