"""``loopdock serve --otlp URL`` / ``$LOOPDOCK_OTLP_ENDPOINT``: the runtime's spans go to
an OTLP/HTTP collector, here a tiny receiver on 127.0.0.1 that records every POST."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import trio
from line_reader import Lines
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from trio_websocket import open_websocket

from loopdock import Runtime
from loopdock._otlp import otlp_tracing, traces_url
from loopdock.runtime import InvalidOptionsError
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall


class Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[tuple[str, bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def span_names(self) -> list[str]:
        names = []
        for path, body in self.posts:
            assert path == "/v1/traces"
            request = ExportTraceServiceRequest.FromString(body)
            names += [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
        return names


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_traces_url_is_the_collectors_v1_traces():
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("https://collector/otlp/v1/traces") == "https://collector/otlp/v1/traces"
    with pytest.raises(InvalidOptionsError, match="http"):
        traces_url("127.0.0.1:4318")


async def test_serves_tracing_exports_a_turns_spans_when_it_closes(tmp_path, receiver):
    script = ScriptedAdapter([Reply(tool_calls=[ToolCall("list_dir", {"path": "."})]), "done"])
    with trio.fail_after(30):
        async with otlp_tracing(receiver.url) as provider:
            assert provider is not None
            async with Runtime.open(tmp_path / "home", tracer_provider=provider) as rt:
                rt.register_adapter("s", script)
                handle = await rt.create_agent(
                    session_id="exported", agent_options={"provider": "s", "model": "m"}, cwd=str(tmp_path)
                )
                handle.agent.followup("go")
                await handle.agent.wait_idle()
            assert receiver.posts == []  # batched: nothing sent yet
    # Closing flushed the batch to the collector.
    assert sorted(receiver.span_names()) == ["chat m", "chat m", "execute_tool list_dir", "invoke_agent exported"]


async def test_without_a_url_there_is_no_provider():
    async with otlp_tracing(None) as provider:
        assert provider is None


READY = re.compile(r"^loopdock serve: ws://")


@pytest.mark.parametrize("how", ["flag", "env"])
async def test_serve_exports_to_the_otlp_url_it_is_given(tmp_path, receiver, how):
    args = ["--otlp", receiver.url] if how == "flag" else []
    env = {**os.environ, "LOOPDOCK_OTLP_ENDPOINT": receiver.url} if how == "env" else dict(os.environ)
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--port", "0", "--no-loopx", "--home",
             str(tmp_path / "home"), *args],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        try:
            out = Lines(proc.stdout)
            await out.until(READY.pattern)
            assert (await out.until(r"traces: ")).strip() == f"traces: {receiver.url}/v1/traces"
        finally:
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0


async def test_serve_refuses_a_bad_otlp_url_in_one_line(tmp_path):
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--no-loopx", "--home", str(tmp_path / "home"),
             "--otlp", "localhost:4318"],
            cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "loopdock: INVALID_OPTIONS: --otlp must be an http(s) URL such as http://127.0.0.1:4318, got 'localhost:4318'"
    ]


# -- serve, the installed command, exporting a real turn's spans --------------------------

#: A loop package (loaded by serve from its config's ``loopPackages``): the shipped react
#: driver, whose agents are given one task as soon as they exist. serve's wire protocol
#: has no message that starts a turn of the runtime's own agents (DSH hosts run their own
#: turns), so the turn is started from serve's other public surface, a loop package.
SELF_STARTING = """
from loopdock import DriverLoop, ReactDriver

TASK = 'call: list_dir {"path": "."}'


class SelfStarting:
    def __init__(self):
        self.react = ReactDriver()

    async def create_agent(self, owner, options):
        handle = await self.react.create_agent(owner, options)
        handle.agent.followup(TASK)
        return handle

    async def resume(self, owner, options):
        return await self.react.resume(owner, options)


LOOPS = (DriverLoop.from_driver("self-starting", SelfStarting()),)
"""


def received_spans(receiver: Receiver) -> list:
    spans = []
    for path, body in receiver.posts:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
            assert service == "loopdock"
            spans += [span for scope in resource.scope_spans for span in scope.spans]
    return spans


def attributes(span) -> dict:
    out = {}
    for attribute in span.attributes:
        value = attribute.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[attribute.key] = [getattr(item, item.WhichOneof("value")) for item in value.array_value.values]
        else:
            out[attribute.key] = getattr(value, kind)
    return out


async def watch_until_idle_after_a_turn(port: int, token: str, agent_id: str) -> dict:
    """The console's row of ``agent_id`` once its first turn has ended (serve's /goalbar
    websocket with the ``console`` capability, as the console page reads it)."""
    async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
        hello = {"token": token, "role": "goalbar", "protocol": 1, "capabilities": ["live", "goalbar", "console"]}
        await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        while True:
            frame = json.loads(await ws.get_message())
            for item in frame.get("data", {}).get("items", ()) if frame["type"] == "live" else ():
                row = item["data"]
                if item["type"] == "console/agent" and row["id"] == agent_id and row["turns"] >= 1 \
                        and row["status"] == "idle":
                    return row


async def test_the_serve_command_exports_a_tool_turns_spans_and_flushes_them_on_sigterm(tmp_path, receiver):
    (tmp_path / "packages").mkdir()
    (tmp_path / "packages" / "self_starting_loop.py").write_text(SELF_STARTING)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello")
    config = tmp_path / "dock.yml"
    config.write_text(textwrap.dedent(f"""\
        loopPackages: [self_starting_loop]
        agents:
          - {{id: traced, loop: self-starting, model: ping-1, cwd: {json.dumps(str(work))}}}
    """))
    loopdock = Path(sys.executable).parent / "loopdock"  # the installed console script
    env = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path / "user"), "DSH_HOME": str(tmp_path / "dsh"),
        "LOOPX_USAGE_PING": "0", "DSH_TELEMETRY_MODE": "DISABLED", "PYTHONPATH": str(tmp_path / "packages"),
        # The batch processor's timer would export within 5 s; here only the stop path may.
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
    }
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [str(loopdock), "serve", "--port", "0", "--no-loopx", "--home", str(tmp_path / "home"),
             "--config", str(config), "--otlp", receiver.url],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        try:
            out = Lines(proc.stdout)
            ready = re.match(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$", await out.until(READY.pattern))
            port, token = int(ready[1]), (await trio.Path(ready[2]).read_text()).strip()
            row = await watch_until_idle_after_a_turn(port, token, "traced")
            assert (row["loop"], row["lastTurn"], row["turns"]) == ("self-starting", "completed", 1)
            assert receiver.posts == []  # batched, and the timer is far off: nothing sent yet
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    spans = received_spans(receiver)
    by_name = {span.name: span for span in spans}
    assert sorted(span.name for span in spans) == ["chat ping-1", "chat ping-1", "execute_tool list_dir",
                                                   "invoke_agent traced"]
    turn = by_name["invoke_agent traced"]
    assert turn.parent_span_id == b""  # a trace of its own: nothing above it
    turn_attributes = attributes(turn)
    assert turn_attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn_attributes["gen_ai.agent.id"] == "traced"
    assert turn_attributes["loopdock.loop"] == "self-starting" == row["loop"]
    # A driver loop is its own driver: none is named, on the console or on the span (a
    # strategy loop's driver is, as tests/loopdock/test_tracing.py checks).
    assert row["driver"] is None and "loopdock.driver" not in turn_attributes
    assert turn_attributes["loopdock.turn.end_reason"] == "completed"
    for span in spans:
        if span is not turn:
            assert span.trace_id == turn.trace_id and span.parent_span_id == turn.span_id, span.name
    chats = sorted((s for s in spans if s.name == "chat ping-1"), key=lambda s: s.start_time_unix_nano)
    assert [attributes(s)["gen_ai.response.finish_reasons"] for s in chats] == [["tool_calls"], ["stop"]]
    assert all(attributes(s)["gen_ai.provider.name"] == "ping" for s in chats)
    tool = attributes(by_name["execute_tool list_dir"])
    assert tool["gen_ai.tool.name"] == "list_dir" and tool["gen_ai.operation.name"] == "execute_tool"
    # The tool ran between the two model calls.
    assert chats[0].end_time_unix_nano <= by_name["execute_tool list_dir"].start_time_unix_nano
    assert by_name["execute_tool list_dir"].end_time_unix_nano <= chats[1].start_time_unix_nano
