"""Transcript: an agent's model-visible conversation, with O(1) snapshots.

Every model request carries the whole conversation. Copying it into a tuple per request
(and having the ``ping`` model sum its words per request) made a step cost grow with the
history. A transcript is append-only, so a (transcript, length) pair is a stable snapshot:
``snapshot()`` is O(1), and running totals of the words and tool calls kept alongside let
``ping`` count a snapshot's tokens and tool calls in O(1) too.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

from ._messages import Message


class Transcript:
    """An append-only list of messages (``append``, ``len``, indexing, iteration)."""

    __slots__ = ("_messages", "_words", "_calls", "_chars")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = list(messages)
        # Running totals, extended on demand (a transcript read back from the store is
        # only summed if a request asks): _words[i] is the word count of the first i
        # messages, for i < len(_words).
        self._words = array("q", [0])
        self._calls = array("q", [0])
        self._chars = sum(m.content_chars for m in self._messages)

    def append(self, message: Message) -> None:
        self._messages.append(message)
        self._chars += message.content_chars

    @property
    def content_chars(self) -> int:
        """``sum(m.content_chars for m in transcript)``, in O(1)."""
        return self._chars

    def _totals(self, length: int) -> tuple[int, int]:
        words, calls, messages = self._words, self._calls, self._messages
        while len(words) <= length:
            message = messages[len(words) - 1]
            words.append(words[-1] + message.word_count)
            calls.append(calls[-1] + len(message.tool_calls))
        return words[length], calls[length]

    def snapshot(self) -> TranscriptView:
        """The messages so far, as an immutable sequence (later appends do not show)."""
        return TranscriptView(self, len(self._messages))

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self._messages[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages)

    def __repr__(self) -> str:
        return f"Transcript({len(self._messages)} messages)"


class TranscriptView(Sequence[Message]):
    """The first ``length`` messages of a transcript: what one model request sees.

    Compares equal to a tuple of the same messages (and hashes like one).
    """

    __slots__ = ("_transcript", "_length")

    def __init__(self, transcript: Transcript, length: int) -> None:
        self._transcript = transcript
        self._length = length

    @property
    def word_count(self) -> int:
        """``sum(m.word_count for m in view)``, in O(1) (amortised)."""
        return self._transcript._totals(self._length)[0]

    @property
    def tool_call_count(self) -> int:
        """``sum(len(m.tool_calls) for m in view)``, in O(1) (amortised)."""
        return self._transcript._totals(self._length)[1]

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self._transcript._messages[: self._length][index])
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("transcript index out of range")
        return self._transcript._messages[index]

    def __iter__(self) -> Iterator[Message]:
        return islice(self._transcript._messages, self._length)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, TranscriptView):
            return self._length == other._length and (
                self._transcript is other._transcript or tuple(self) == tuple(other)
            )
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"TranscriptView({self._length} messages)"


def word_count(messages: Sequence[Message]) -> int:
    """The words of ``messages`` (O(1) for a transcript snapshot)."""
    if isinstance(messages, TranscriptView):
        return messages.word_count
    return sum(m.word_count for m in messages)


def tool_call_count(messages: Sequence[Message]) -> int:
    """The tool calls in ``messages`` (O(1) for a transcript snapshot)."""
    if isinstance(messages, TranscriptView):
        return messages.tool_call_count
    return sum(len(m.tool_calls) for m in messages)
