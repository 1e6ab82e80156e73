"""The one interface every model adapter implements, and the values crossing it.

An adapter turns a ``ModelRequest`` into an async stream of chunks. It never touches
the session log: retries are reported through ``ModelRequest.on_retry`` so the agent
can log ``llm/retry``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, Union

import attrs

from .._messages import Message


@attrs.frozen
class ToolSpec:
    """What the model is told about one tool."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object


@attrs.frozen
class RetryNotice:
    """One retried model call: logged by the agent as ``llm/retry``."""

    attempt: int  # the attempt that failed, from 1
    delay: float  # seconds until the next attempt
    error: str  # a short, safe description (no secrets, no bodies)


@attrs.frozen
class ModelRequest:
    provider: str
    model: str
    system: str
    # A tuple, or an agent's transcript snapshot (runtime.TranscriptView): immutable either way.
    messages: Sequence[Message]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096
    reasoning_effort: str | None = None
    on_retry: Callable[[RetryNotice], Awaitable[None]] | None = attrs.field(
        default=None, eq=False, repr=False
    )


# -- chunks ---------------------------------------------------------------------------


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class ReasoningDelta:
    text: str


@attrs.frozen
class ReasoningEnd:
    """Ends one reasoning block that the provider wants back unchanged: the
    ``ReasoningDelta`` text since the previous ``ReasoningEnd`` with the ``signature``
    that signs it, or (``redacted_data``, no text) reasoning the provider encrypted. The
    agent keeps each such block apart, in order (``ReasoningBlock``)."""

    signature: str | None = None
    redacted_data: str | None = None


@attrs.frozen
class ToolCallChunk:
    """One complete tool call (adapters assemble streamed fragments before yielding)."""

    call_id: str
    name: str
    arguments: str  # raw JSON text


@attrs.frozen
class Usage:
    input_tokens: int
    output_tokens: int
    cost: float | None = None  # US dollars, when the provider's config gives prices


FinishReason = Literal["stop", "tool-calls", "max-tokens"]


@attrs.frozen
class Finish:
    reason: FinishReason


Chunk = Union[TextDelta, ReasoningDelta, ReasoningEnd, ToolCallChunk, Usage, Finish]


class ModelAdapter(Protocol):
    """A model provider. ``stream`` must be cancellable at every await.

    An adapter whose calls only compute (no network, no disk) says so with a class
    attribute ``cpu_bound = True``: an automatic turn then keeps its admission slot
    across the call (``actors.AdmissionGate``). Any other adapter is taken to wait on
    I/O, and a turn gives its slot back while it waits.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]: ...
