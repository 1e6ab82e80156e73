"""``loopdock serve --otlp URL`` / ``$LOOPDOCK_OTLP_ENDPOINT``: the runtime's spans go to
an OTLP/HTTP collector, here a tiny receiver on 127.0.0.1 that records every POST."""

from __future__ import annotations

import http.server
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
import trio
from line_reader import Lines
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

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
