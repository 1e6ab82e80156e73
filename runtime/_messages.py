"""Messages, their content blocks and their typed sources, as frozen values.

A message is ``{id, role, content, source}``. The ``source`` says who produced it, typed
by ``kind``: humans (``user``, ``skill-invocation``), tools (``tool``) and producer-owned
kinds (``loopx-continuation``, ...). Humans' messages have priority in an agent's inbox.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal, Union

import attrs

from ._errors import LoopdockError
from ._ids import MESSAGE_IDS

Role = Literal["user", "assistant", "tool", "system"]


class InvalidMessageError(LoopdockError):
    """Raised when a message, block or source is malformed (empty producer kind, bad role...)."""

    code = "INVALID_MESSAGE"


# -- content blocks -------------------------------------------------------------------


@attrs.frozen
class TextBlock:
    text: str


@attrs.frozen
class ReasoningBlock:
    """The model's reasoning. A provider that wants it back unchanged says so:
    ``signature`` signs ``text`` (Anthropic's ``thinking`` blocks), ``redacted_data`` is
    reasoning it encrypted (a ``redacted_thinking`` block; ``text`` is then empty). Both
    are opaque: kept in the session log as they came, sent back byte for byte."""

    text: str
    signature: str | None = None
    redacted_data: str | None = None


@attrs.frozen
class ImageBlock:
    media_type: str
    data: str  # base64


@attrs.frozen
class ToolCallBlock:
    call_id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model produced it


@attrs.frozen
class ToolResultBlock:
    call_id: str
    content: str
    is_error: bool = False


Block = Union[TextBlock, ReasoningBlock, ImageBlock, ToolCallBlock, ToolResultBlock]

# -- sources --------------------------------------------------------------------------


@attrs.frozen
class UserSource:
    """A message typed by a person."""

    rpc_id: str | None = None
    kind: Literal["user"] = "user"


@attrs.frozen
class SkillInvocationSource:
    """A skill's body injected because a person typed ``/name``: human input too."""

    name: str
    form: str = "instructions"
    kind: Literal["skill-invocation"] = "skill-invocation"


@attrs.frozen
class ToolSource:
    """The result of one tool call, paired with it by ``call_id``."""

    call_id: str
    kind: Literal["tool"] = "tool"


BUILTIN_SOURCE_KINDS = frozenset(
    {"user", "skill-invocation", "tool", "skill-catalog", "goal", "runtime-context"}
)
HUMAN_SOURCE_KINDS = frozenset({"user", "skill-invocation"})

# DSH 0.2.1 ends a turn on the generic ``plugin`` kind: a producer must own its kind.
_FORBIDDEN_PRODUCER_KINDS = BUILTIN_SOURCE_KINDS | {"plugin"}
_PRODUCER_KIND = re.compile(r"^[a-z0-9][a-z0-9._/-]*$")


def _freeze(value: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(value))


@attrs.frozen
class ProducerSource:
    """A message authored by a program (a driver, a plugin, a command).

    ``kind`` is owned by the producer (``loopx-continuation``, ...); ``fields`` carry its
    typed attribution exactly as it goes on the wire (camelCase keys).
    """

    kind: str
    fields: Mapping[str, object] = attrs.field(factory=dict, converter=_freeze)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _PRODUCER_KIND.fullmatch(self.kind):
            raise InvalidMessageError(
                f"producer source kind {self.kind!r} must match {_PRODUCER_KIND.pattern}"
            )
        if self.kind in _FORBIDDEN_PRODUCER_KINDS:
            raise InvalidMessageError(
                f"source kind {self.kind!r} is not producer-owned; pick a kind of your own"
            )
        if "kind" in self.fields:
            raise InvalidMessageError("producer source fields must not contain 'kind'")

    def __hash__(self) -> int:
        return hash((self.kind, tuple(sorted(self.fields))))


Source = Union[UserSource, SkillInvocationSource, ToolSource, ProducerSource]


def is_human(source: Source) -> bool:
    """True for sources a person authored: they go ahead of everything automatic."""
    return source.kind in HUMAN_SOURCE_KINDS


# -- the message ----------------------------------------------------------------------


def _new_id() -> str:
    # UUID-shaped, unique per process and across processes (see runtime._ids.MessageIds).
    return MESSAGE_IDS.new()


def _blocks(value: Iterable[Block]) -> tuple[Block, ...]:
    return tuple(value)


@attrs.frozen
class Message:
    role: Role
    content: tuple[Block, ...] = attrs.field(converter=_blocks)
    source: Source | None = None
    id: str = attrs.field(factory=_new_id)

    def __attrs_post_init__(self) -> None:
        if self.role not in ("user", "assistant", "tool", "system"):
            raise InvalidMessageError(f"unknown message role {self.role!r}")

    # A message is frozen, so what is derived from its content is computed once, on first
    # use: model requests re-read the whole transcript on every step. Kept in plain slots
    # rather than cached_property, which attrs serves through ``__getattr__`` (a failed
    # attribute lookup first, on every first use).
    _text: str | None = attrs.field(default=None, init=False, eq=False, repr=False)
    _tool_calls: tuple[ToolCallBlock, ...] | None = attrs.field(default=None, init=False, eq=False, repr=False)
    _word_count: int = attrs.field(default=-1, init=False, eq=False, repr=False)

    @property
    def text(self) -> str:
        """The concatenated text blocks (what a transcript shows)."""
        text = self._text
        if text is None:
            text = "".join(b.text for b in self.content if isinstance(b, TextBlock))
            object.__setattr__(self, "_text", text)
        return text

    @property
    def tool_calls(self) -> tuple[ToolCallBlock, ...]:
        calls = self._tool_calls
        if calls is None:
            calls = tuple(b for b in self.content if isinstance(b, ToolCallBlock))
            object.__setattr__(self, "_tool_calls", calls)
        return calls

    @property
    def word_count(self) -> int:
        """Whitespace-separated words of every block's text: text, reasoning, a tool
        call's name and arguments, a tool result's content (images count none). The
        offline ``ping`` model's token count."""
        words = self._word_count
        if words < 0:
            words = 0
            for block in self.content:
                if isinstance(block, (TextBlock, ReasoningBlock)):
                    words += len(block.text.split())
                elif isinstance(block, ToolCallBlock):
                    words += len(block.name.split()) + len(block.arguments.split())
                elif isinstance(block, ToolResultBlock):
                    words += len(block.content.split())
            object.__setattr__(self, "_word_count", words)
        return words

    @property
    def content_chars(self) -> int:
        """Characters of every block's text: text, reasoning (its signature or redacted
        data too), a tool call's name and arguments, a tool result's content, an image's
        base64 data. What a message weighs
        in the history budget, beyond a fixed cost per message (``actors.HistoryCache``)."""
        chars = 0
        for block in self.content:
            if isinstance(block, TextBlock):
                chars += len(block.text)
            elif isinstance(block, ReasoningBlock):
                chars += len(block.text) + len(block.signature or "") + len(block.redacted_data or "")
            elif isinstance(block, ToolCallBlock):
                chars += len(block.name) + len(block.arguments)
            elif isinstance(block, ToolResultBlock):
                chars += len(block.content)
            else:
                chars += len(block.data)
        return chars


#: The source of a person's message without an rpc id: one frozen instance for all of them
#: (an agent keeps every message of its conversation warm).
PERSON = UserSource()


def user_message(text: str, *, source: Source | None = None) -> Message:
    """A user-role text message; the source defaults to a person."""
    return Message(role="user", content=(TextBlock(text),), source=source or PERSON)
