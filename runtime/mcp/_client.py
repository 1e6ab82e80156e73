"""One agent's connection to one MCP server, and the tools it mounts.

``McpServer.run`` is the agent's companion (it lives and is cancelled with the agent):
it connects, lists the server's tools and registers them on the agent's tool view as
``<server>__<tool>``, re-lists them on ``notifications/tools/list_changed``, and holds
the connection until the server goes away. A call that finds the server gone asks for a
restart; past ``max_restarts`` in ``restart_window`` seconds the tools answer
unavailable. Each call has its own deadline (``timeout``). See docs/supervision.md.

The SDK (``mcp``, the ``loopdock[mcp]`` extra) is imported only when a server starts.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._errors import LoopdockError, ToolError
from .._logging import get_logger
from .._process import BASE_ENV, open_child, pick_env
from ..tools import AgentTools, Disposer, Tool, ToolContext
from ._lines import Lines, LineTooLong
from ._spec import McpServerSpec

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult

_log = get_logger(__name__)

#: How long a server may take to start and answer its handshake, whatever its ``timeout``
#: (a call's deadline): a stdio server is an interpreter importing its SDK, which takes
#: seconds on a loaded machine, and a short per-call deadline must not fail its start.
HANDSHAKE_SECONDS = 30.0
#: The longest line (one JSON-RPC message) a stdio server may write: past it the server is
#: stopped, as one that floods its stdout.
MAX_LINE = 8 * 1024 * 1024
#: How much of a server's stderr goes to the log per start; the rest is read and dropped.
MAX_STDERR_LOG = 64 * 1024
#: How much of one stderr line goes to the log (the rest of it is dropped).
STDERR_LINE = 1000
_CHUNK = 65_536
_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def require_sdk() -> None:
    """Raise a one-line error when the SDK is not installed."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise LoopdockError("MCP servers need the MCP SDK: pip install 'loopdock[mcp]'") from None


def tool_name(server: str, tool: str) -> str:
    return f"{server}__{_TOOL_CHARS.sub('_', tool)}"[:64]


def result_text(result: CallToolResult) -> str:
    """What the model reads of a tool result: text as is, images and other binary content
    as a short placeholder, structured content as JSON when no text says it already."""
    parts: list[str] = []
    for item in result.content:
        block: Any = item  # one of the SDK's content models, told apart by ``type``
        kind = block.type
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64's padding is no data
            parts.append(f"[{kind} {block.mimeType}, {size} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {block.resource.uri}]")
    if result.structuredContent is not None and not any(b.type == "text" for b in result.content):
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    return "\n".join(parts)


class ServerGoneError(Exception):
    """The server's process ended (its stdout closed) before the handshake was done."""


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class _Connection:
    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.dead = trio.Event()
        self.why = "the server exited"

    async def call(self, name: str, arguments: Mapping[str, Any]) -> CallToolResult:
        outcome: list[CallToolResult | BaseException] = []

        async def call() -> None:
            try:
                outcome.append(await self.session.call_tool(name, dict(arguments)))
            except Exception as exc:
                outcome.append(exc)
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await self.dead.wait()
            nursery.cancel_scope.cancel()
        if not outcome:
            raise ToolError(f"{self.why} during the call")
        if isinstance(outcome[0], BaseException):
            if self.dead.is_set():
                raise ToolError(f"{self.why} during the call")
            raise ToolError(f"the call failed: {outcome[0]}")
        return outcome[0]


class McpServer:
    """One server of one agent. ``run`` is the agent's companion."""

    def __init__(self, spec: McpServerSpec, tools: AgentTools, cwd: Path) -> None:
        self.spec = spec
        self._tools = tools
        self._cwd = Path(spec.cwd) if spec.cwd and Path(spec.cwd).is_absolute() else cwd / (spec.cwd or "")
        self._registered: dict[str, Disposer] = {}
        self._conn: _Connection | None = None
        self._attempts = 0  # failed connection attempts
        self._wanted = trio.Event()
        self._changed = trio.Event()
        self._starts: deque[float] = deque()
        self.unavailable = False
        self.last_error = ""
        self.log = _log.bind(mcp_server=spec.name)

    # -- the companion ---------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False

        def ready() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        try:
            while True:
                now = trio.current_time()
                while self._starts and now - self._starts[0] > self.spec.restart_window:
                    self._starts.popleft()
                if len(self._starts) > self.spec.max_restarts:
                    self.unavailable = True
                    self.log.warning("mcp.unavailable", restarts=self.spec.max_restarts, error=self.last_error)
                    self._notify()
                    ready()
                    await trio.sleep_forever()
                self._starts.append(now)
                try:
                    await self._connect(ready)
                except Exception as exc:
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    self.log.warning("mcp.connection_failed", error=self.last_error)
                    self._attempts += 1  # failed starts: a call waiting for one gives up
                self._notify()
                ready()
                await self._wanted.wait()
                self._wanted = trio.Event()
        finally:
            for dispose in self._registered.values():
                dispose()
            self._registered.clear()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _connect(self, ready: Callable[[], None]) -> None:
        from mcp.client.streamable_http import streamable_http_client

        if self.spec.command is not None:
            env = {**pick_env(os.environ, BASE_ENV), **self.spec.env}
            async with open_child(list(self.spec.command), cwd=self._cwd, env=env) as child:
                from anyio import create_memory_object_stream
                from mcp.shared.message import SessionMessage

                read_send, read_recv = create_memory_object_stream[SessionMessage | Exception](0)
                write_send, write_recv = create_memory_object_stream[SessionMessage](0)
                gone = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_stdout, child.stdout, read_send, gone)
                    nursery.start_soon(self._write_stdin, write_recv, child.stdin)
                    nursery.start_soon(self._log_stderr, child.stderr)
                    await self._serve(read_recv, write_send, gone, ready)
                    nursery.cancel_scope.cancel()
        else:
            assert self.spec.url is not None
            async with streamable_http_client(self.spec.url) as (read, write, _):
                await self._serve(read, write, trio.Event(), ready)

    async def _serve(self, read: Any, write: Any, gone: trio.Event, ready: Callable[[], None]) -> None:
        from mcp import ClientSession

        refresh = trio.Event()

        async def on_message(message: Any) -> None:
            if type(getattr(message, "root", None)).__name__ == "ToolListChangedNotification":
                refresh.set()

        async with ClientSession(read, write, message_handler=on_message) as session:
            conn = _Connection(session)
            try:
                shaken = False
                with trio.fail_after(max(self.spec.timeout, HANDSHAKE_SECONDS)):
                    async with trio.open_nursery() as handshake:  # a server that exits fails it at once
                        handshake.start_soon(_cancel_when_set, gone, handshake.cancel_scope)
                        await session.initialize()
                        await self._list_tools(session)
                        shaken = True
                        handshake.cancel_scope.cancel()
                if not shaken:
                    raise ServerGoneError(self.last_error or "the server exited before its handshake")
                self._conn = conn
                self._notify()
                ready()
                self.log.info("mcp.connected", tools=sorted(self._registered))
                async with trio.open_nursery() as nursery:

                    async def refresher() -> None:
                        nonlocal refresh
                        while True:
                            await refresh.wait()
                            refresh = trio.Event()
                            with trio.fail_after(self.spec.timeout):
                                await self._list_tools(session)

                    nursery.start_soon(refresher)
                    await gone.wait()
                    conn.why = "the server exited" if not self.last_error else self.last_error
                    nursery.cancel_scope.cancel()
                self.last_error = conn.why
            finally:
                conn.dead.set()
                self._conn = None

    async def _list_tools(self, session: ClientSession) -> None:
        listed = (await session.list_tools()).tools
        wanted = {tool_name(self.spec.name, t.name): t for t in listed}
        for name in [n for n in self._registered if n not in wanted]:
            self._registered.pop(name)()
        for name, tool in wanted.items():
            if name in self._registered:
                self._registered.pop(name)()
            self._registered[name] = self._tools.register(
                Tool(
                    name, tool.description or "", tool.inputSchema, self._runner(tool.name), _read_only(tool),
                    _idempotent(tool),
                )
            )

    def _runner(self, mcp_name: str) -> Callable[[Mapping[str, Any], ToolContext], Any]:
        async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            return await self.call(mcp_name, arguments)

        return run

    # -- calls -----------------------------------------------------------------------

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        where = f"MCP server {self.spec.name!r}"
        with trio.move_on_after(self.spec.timeout):
            conn = await self._connection(where)
            try:
                result = await conn.call(name, arguments)
            except ToolError as exc:
                raise ToolError(f"{where}: {name}: {exc}") from None
            text = result_text(result)
            if result.isError:
                raise ToolError(text or f"{where}: {name} failed")
            return text
        raise ToolError(f"{where}: {name} did not answer within {self.spec.timeout:g} s")

    async def _connection(self, where: str) -> _Connection:
        attempts = self._attempts
        while True:
            if self.unavailable:
                raise ToolError(
                    f"{where} is unavailable: it failed {self.spec.max_restarts + 1} times within "
                    f"{self.spec.restart_window:g} s (last: {self.last_error})"
                )
            if self._conn is not None and not self._conn.dead.is_set():
                return self._conn
            if self._attempts > attempts:  # a restart for this call failed
                raise ToolError(f"{where} could not be started: {self.last_error}")
            self._wanted.set()
            await self._changed.wait()

    # -- the stdio pipes -------------------------------------------------------------

    async def _read_stdout(self, stdout: trio.abc.ReceiveStream, send: Any, gone: trio.Event) -> None:
        from mcp.shared.message import SessionMessage
        from mcp.types import JSONRPCMessage

        lines = Lines(MAX_LINE)
        try:
            while chunk := await stdout.receive_some(_CHUNK):
                try:
                    finished = lines.feed(chunk)
                except LineTooLong:
                    self.last_error = f"the server wrote a line longer than {MAX_LINE} bytes: stopped"
                    self.log.warning("mcp.stdout_flood", limit=MAX_LINE)
                    return
                for line in finished:
                    if not line.strip():
                        continue
                    try:
                        message = JSONRPCMessage.model_validate_json(line)
                    except ValueError:
                        self.log.debug("mcp.stdout_not_json", line=line[:200].decode(errors="replace"))
                        continue
                    await send.send(SessionMessage(message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            gone.set()

    async def _write_stdin(self, receive: Any, stdin: trio.abc.SendStream) -> None:
        try:
            async for message in receive:
                data = message.message.model_dump_json(by_alias=True, exclude_none=True)
                await stdin.send_all(data.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _log_stderr(self, stderr: trio.abc.ReceiveStream) -> None:
        logged = 0
        lines = Lines(STDERR_LINE, cut=True)
        try:
            while chunk := await stderr.receive_some(_CHUNK):
                if logged >= MAX_STDERR_LOG:
                    continue  # read and dropped: the server never blocks on a full pipe
                for line in lines.feed(chunk):
                    logged += len(line) + 1
                    self.log.info("mcp.stderr", line=line.decode(errors="replace"))
                    if logged >= MAX_STDERR_LOG:
                        self.log.warning("mcp.stderr_capped", limit=MAX_STDERR_LOG)
                        break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _read_only(tool: Any) -> bool:
    # The server's own hint: an approval policy's ``hints`` default runs such tools unasked.
    annotations = getattr(tool, "annotations", None)
    return bool(getattr(annotations, "readOnlyHint", False))


def _idempotent(tool: Any) -> bool:
    # The server's own hint: a call a crash cut runs again on resume unasked.
    annotations = getattr(tool, "annotations", None)
    return bool(getattr(annotations, "idempotentHint", False))
