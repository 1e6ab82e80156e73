"""Spans for turns, model calls and tool calls, after OpenTelemetry's GenAI conventions.

A runtime opened with a tracer provider gives its agents a ``Tracing``; one opened
without has none, and every span site is then one ``is None`` check: nothing here is
imported, and no span object is made. That is why ``opentelemetry`` is imported only
where a ``Tracing`` is made (it is an optional extra: ``pip install 'loopdock[otel]'``).

The spans: ``invoke_agent {agent}`` per turn, its children ``chat {model}`` per model
call and ``execute_tool {tool}`` per tool call. Parents are passed explicitly, not
through the current context: a tool call runs in a task of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._errors import safe_message

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from .models import Usage

#: The instrumentation scope's name.
TRACER_NAME = "loopdock"

#: Our finish reasons as the GenAI conventions spell them.
FINISH_REASONS = {"stop": "stop", "tool-calls": "tool_calls", "max-tokens": "length"}


class Tracing:
    """Makes the spans of one runtime's agents from ``provider``'s tracer."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace  # only with tracing on: see the module's docstring

        self._trace = trace
        self._tracer = provider.get_tracer(TRACER_NAME)

    def start_turn(self, agent_id: str, loop: str | None, driver: str | None, turn: int) -> Span:
        """The ``invoke_agent`` span of one turn; the caller ends it (``end_turn``)."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": agent_id,
            "gen_ai.agent.name": agent_id,
            "gen_ai.conversation.id": agent_id,
            "loopdock.turn": turn,
        }
        if loop is not None:
            attributes["loopdock.loop"] = loop
        if driver is not None:
            attributes["loopdock.driver"] = driver
        return self._tracer.start_span(
            f"invoke_agent {agent_id}", kind=self._trace.SpanKind.INTERNAL, attributes=attributes
        )

    def end_turn(self, span: Span, reason: Mapping[str, Any]) -> None:
        """Close a turn's span with its end reason (``turn/end``'s): ``error`` is an error."""
        kind = reason["kind"]
        span.set_attribute("loopdock.turn.end_reason", kind)
        if kind == "error":
            span.set_attribute("error.type", "error")
            span.set_status(self._trace.StatusCode.ERROR, str(reason.get("message", "")))
        span.end()

    @contextmanager
    def chat(self, parent: Span | None, provider: str, model: str) -> Iterator[Span]:
        """The ``chat`` span of one model call; a failure marks it an error."""
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
        }
        with self._span(f"chat {model}", parent, self._trace.SpanKind.CLIENT, attributes) as span:
            yield span

    def chat_done(self, span: Span, finish: str, usage: Usage | None) -> None:
        span.set_attribute("gen_ai.response.finish_reasons", [FINISH_REASONS.get(finish, finish)])
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if usage.cost is not None:
                span.set_attribute("loopdock.usage.cost_usd", usage.cost)

    @contextmanager
    def tool(self, parent: Span | None, name: str, call_id: str) -> Iterator[Span]:
        """The ``execute_tool`` span of one tool call."""
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
        }
        with self._span(f"execute_tool {name}", parent, self._trace.SpanKind.INTERNAL, attributes) as span:
            yield span

    def tool_failed(self, span: Span, description: str) -> None:
        """The tool answered with an error result (the turn goes on)."""
        span.set_attribute("error.type", "tool_error")
        span.set_status(self._trace.StatusCode.ERROR, description)

    @contextmanager
    def _span(self, name: str, parent: Span | None, kind: Any, attributes: Mapping[str, Any]) -> Iterator[Span]:
        context = None if parent is None else self._trace.set_span_in_context(parent)
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        try:
            yield span
        except Exception as exc:
            # Only failures: a cancellation (a BaseException) ends the span as it is.
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(self._trace.StatusCode.ERROR, safe_message(exc))
            raise
        finally:
            span.end()
