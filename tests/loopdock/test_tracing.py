"""Tracing through the public API: ``Runtime.open(tracer_provider=...)`` and the spans
of a turn (OpenTelemetry's GenAI conventions), checked with the SDK's in-memory exporter;
and with no provider, no OpenTelemetry at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from loopdock import Runtime
from loopdock.runtime import ModelError
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall, Usage

SCRIPTED = {"provider": "scripted", "model": "script-1"}


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_operation(finished):
    found: dict[str, list] = {}
    for span in finished:
        found.setdefault(span.attributes["gen_ai.operation.name"], []).append(span)
    return found


async def test_a_two_tool_turn_is_one_agent_span_over_its_model_and_tool_calls(tmp_path, spans):
    provider, exporter = spans
    (tmp_path / "notes.txt").write_text("hello")
    calls = [
        ToolCall("read_file", {"path": "notes.txt"}, call_id="read"),
        ToolCall("list_dir", {"path": "."}, call_id="list"),
    ]
    script = ScriptedAdapter([Reply(tool_calls=calls, usage=Usage(11, 7)), Reply("done", usage=Usage(23, 2))])
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home", tracer_provider=provider) as rt:
            rt.register_adapter("scripted", script)
            handle = await rt.create_agent(session_id="tracer", agent_options=SCRIPTED, cwd=str(tmp_path))
            handle.agent.followup("read the notes")
            await handle.agent.wait_idle()
            loop, driver = handle.agent.options.loop, handle.agent.options.driver
    found = by_operation(exporter.get_finished_spans())
    [turn] = found["invoke_agent"]
    assert turn.name == "invoke_agent tracer"
    assert turn.parent is None
    assert turn.attributes["gen_ai.agent.id"] == "tracer"
    assert turn.attributes["gen_ai.agent.name"] == "tracer"
    assert (loop, driver) == ("standard", "default")  # the dock's defaults, named on the span
    assert turn.attributes["loopdock.loop"] == loop
    assert turn.attributes["loopdock.driver"] == driver
    assert turn.attributes["loopdock.turn.end_reason"] == "completed"
    assert turn.status.status_code is StatusCode.UNSET

    chats = sorted(found["chat"], key=lambda span: span.start_time)
    assert [span.name for span in chats] == ["chat script-1", "chat script-1"]
    for span in chats:
        assert span.parent.span_id == turn.context.span_id
        assert span.context.trace_id == turn.context.trace_id
        assert span.attributes["gen_ai.provider.name"] == "scripted"
        assert span.attributes["gen_ai.request.model"] == "script-1"
    assert [(s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"]) for s in chats] == [
        (11, 7),
        (23, 2),
    ]
    assert [s.attributes["gen_ai.response.finish_reasons"] for s in chats] == [("tool_calls",), ("stop",)]

    tools = {span.attributes["gen_ai.tool.call.id"]: span for span in found["execute_tool"]}
    assert set(tools) == {"read", "list"}
    assert tools["read"].name == "execute_tool read_file"
    assert tools["read"].attributes["gen_ai.tool.name"] == "read_file"
    assert tools["list"].attributes["gen_ai.tool.name"] == "list_dir"
    for span in tools.values():
        assert span.parent.span_id == turn.context.span_id
        assert span.status.status_code is StatusCode.UNSET
        # Between the model call that asked for it and the one that read its result.
        assert chats[0].end_time <= span.start_time and span.end_time <= chats[1].start_time
    assert len(exporter.get_finished_spans()) == 5


async def test_a_failed_model_call_and_a_failed_tool_are_errors(tmp_path, spans):
    provider, exporter = spans
    script = ScriptedAdapter(
        [Reply(tool_calls=[ToolCall("no_such_tool", call_id="bad")]), Reply(error=ModelError("the model is down"))]
    )
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home", tracer_provider=provider) as rt:
            rt.register_adapter("scripted", script)
            handle = await rt.create_agent(session_id="failing", agent_options=SCRIPTED, cwd=str(tmp_path))
            handle.agent.followup("go")
            await handle.agent.wait_idle()
    found = by_operation(exporter.get_finished_spans())
    [turn] = found["invoke_agent"]
    assert turn.attributes["loopdock.turn.end_reason"] == "error"
    assert turn.status.status_code is StatusCode.ERROR
    [tool] = found["execute_tool"]
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["error.type"] == "tool_error"
    ok, failed = sorted(found["chat"], key=lambda span: span.start_time)
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ModelError"
    assert "gen_ai.usage.input_tokens" not in failed.attributes


async def test_each_turn_is_a_trace_of_its_own(tmp_path, spans):
    provider, exporter = spans
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home", tracer_provider=provider) as rt:
            rt.register_adapter("scripted", ScriptedAdapter(["one", "two"]))
            handle = await rt.create_agent(session_id="twice", agent_options=SCRIPTED, cwd=str(tmp_path))
            for text in ("first", "second"):
                handle.agent.followup(text)
                await handle.agent.wait_idle()
    turns = by_operation(exporter.get_finished_spans())["invoke_agent"]
    assert sorted(span.attributes["loopdock.turn"] for span in turns) == [1, 2]
    assert len({span.context.trace_id for span in turns}) == 2


# With tracing off, a turn costs one attribute check per span site: OpenTelemetry is not
# even imported (it is installed here, as the test extra installs it).
TURN_WITHOUT_TRACING = """
import sys, trio
from loopdock import Runtime
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall

async def main():
    async with Runtime.open(sys.argv[1]) as rt:
        rt.register_adapter("s", ScriptedAdapter([Reply(tool_calls=[ToolCall("list_dir", {"path": "."})]), "done"]))
        handle = await rt.create_agent(session_id="quiet", agent_options={"provider": "s", "model": "m"}, cwd=sys.argv[2])
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        events = [e.type for e in await handle.agent.session.read_events()]
    assert events.count("tool/result") == 1 and events.count("assistant/message") == 2, events
    print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))

trio.run(main)
"""


def test_without_a_tracer_provider_opentelemetry_is_not_imported(tmp_path):
    done = subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(TURN_WITHOUT_TRACING), str(tmp_path / "home"), str(tmp_path)],
        cwd=tmp_path,  # the installed package, not the source tree
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_turn_cancelled_during_its_model_call_ends_every_span(tmp_path, spans):
    """Cancelling a turn mid-call must not leave a span open (an open span is never
    exported): the model call's span ends unmarked, the turn's says it was aborted."""
    provider, exporter = spans
    asked = trio.Event()

    async def never_answers(request):
        asked.set()
        await trio.sleep_forever()

    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home", tracer_provider=provider) as rt:
            rt.register_adapter("scripted", ScriptedAdapter(never_answers))
            handle = await rt.create_agent(session_id="stopped", agent_options=SCRIPTED, cwd=str(tmp_path))
            handle.agent.followup("go")
            await asked.wait()
            handle.agent.cancel()
            await handle.agent.wait_idle()
            reasons = [e.data["reason"] for e in await handle.agent.session.read_events() if e.type == "turn/end"]
    found = by_operation(exporter.get_finished_spans())
    [turn] = found["invoke_agent"]
    assert reasons[0]["kind"] == turn.attributes["loopdock.turn.end_reason"] == "aborted"  # the log's word
    assert turn.status.status_code is StatusCode.UNSET  # a person's cancel is not an error
    [chat] = found["chat"]
    assert chat.parent.span_id == turn.context.span_id
    assert chat.status.status_code is StatusCode.UNSET
    assert "gen_ai.usage.input_tokens" not in chat.attributes
    assert turn.start_time <= chat.start_time and chat.end_time <= turn.end_time
