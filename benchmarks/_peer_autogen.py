"""The peer: autogen-core's SingleThreadedAgentRuntime, doing what loopdock does.

asyncio-based, so it always runs in its own process (``benchmarks._worker peer-*``) and
never shares an event loop with trio. Both sides get the same GC threshold (the one
``Runtime.open`` sets) and, for ``turns``, the same persistence code.

- ``turns`` (same work as a loopdock turn): one ``RoutedAgent`` per key; the client's
  request is one ``send_message``; the handler asks a scripted model (the same rule as
  loopdock's ping: a ``call: tool {json}`` line -> a ``FunctionCall``; a tool result ->
  ``pong: <result>``), runs the tool (an autogen ``FunctionTool``, called in the handler
  as loopdock calls its tools, not through a tool agent), asks the model again, and
  keeps the conversation (autogen ``LLMMessage`` values). Every turn writes the same 15
  events loopdock writes for it, built as loopdock builds them, to a loopdock
  ``SessionStore`` (same schema, same encoding, same SQL) through a group-commit writer
  task with loopdock's window (1 ms) in a worker thread. Same commit policy, same disk.
- ``bare``: an echo handler (request -> response): the runtime alone.
"""

# No `from __future__ import annotations` here: autogen-core reads the handler's type
# hints at class creation, and they must be real classes, not strings.
import asyncio
import gc
import importlib.util
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import Progress, peak_rss_bytes, summary_ms

NAME = "autogen-core SingleThreadedAgentRuntime"
GROUP_COMMIT_WINDOW = 0.001  # actors._store_writer.GROUP_COMMIT_WINDOW
GC_THRESHOLD = (10_000, 10, 10)  # loopdock.GC_THRESHOLD, what loopdock's side of the bench runs with
_CALL_LINE = re.compile(r"^\s*call:\s*(?P<name>[A-Za-z0-9_.:-]+)\s+(?P<args>\{.*\})\s*$")


def available() -> bool:
    return importlib.util.find_spec("autogen_core") is not None


@dataclass
class Request:
    text: str


@dataclass
class Reply:
    text: str


class Writer:
    """The peer's store writer: loopdock's commit policy on asyncio (group commit with a
    1 ms window, one transaction per batch, in a worker thread)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.pending: dict[str, list[Any]] = {}
        self.headers: dict[str, Any] = {}
        self.wakeup = asyncio.Event()
        self.commits = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def append(self, session: str, event: Any) -> None:
        self.pending.setdefault(session, []).append(event)
        self.idle.clear()
        self.wakeup.set()

    async def run(self) -> None:
        from loopdock.runtime import Write

        while True:
            await self.wakeup.wait()
            await asyncio.sleep(GROUP_COMMIT_WINDOW)
            self.wakeup.clear()
            batch, self.pending = self.pending, {}
            writes = [Write(sid, self.headers.pop(sid, None), tuple(events)) for sid, events in batch.items()]
            await asyncio.to_thread(self.store.commit, writes)
            self.commits += 1
            if not self.pending:
                self.idle.set()


def _classes(writer: Writer) -> tuple[type, type]:
    from autogen_core import CancellationToken, FunctionCall, MessageContext, RoutedAgent, message_handler
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        UserMessage,
    )
    from autogen_core.tools import FunctionTool

    from loopdock.runtime import new_event

    async def bench_echo(text: str) -> str:
        return f"echo: {text}"

    echo_tool = FunctionTool(bench_echo, "Echo the text back.", name="bench_echo")

    def model(history: list[Any], words: int) -> Any:
        """The scripted model: the same rule as loopdock's ping. ``words`` is the history's
        word count, kept as it grows (ping counts its input from running totals too)."""
        last = history[-1]
        if isinstance(last, UserMessage):
            calls = []
            for line in str(last.content).splitlines():
                match = _CALL_LINE.match(line)
                if match and isinstance(json.loads(match["args"]), dict):
                    calls.append(FunctionCall(id=f"call-{len(history)}", name=match["name"], arguments=match["args"]))
            if calls:
                return calls, words
        subject = "\n".join(r.content for r in last.content) if isinstance(last, FunctionExecutionResultMessage) else ""
        return "pong: " + subject, words

    class Worker(RoutedAgent):
        def __init__(self) -> None:
            super().__init__("bench worker")
            self.history: list[Any] = []
            self.words = 0  # the history's words, kept as it grows (see ``model``)
            self.seq = 0
            self.turns = 0
            self.session = str(self.id.key)
            writer.headers[self.session] = _header(self.session)

        def remember(self, message: Any) -> None:
            self.history.append(message)
            self.words += len(str(message.content).split())

        def log(self, event_type: str, data: dict[str, Any]) -> None:
            writer.append(self.session, new_event(event_type, self.seq, time.time_ns() // 1_000_000, data))
            self.seq += 1

        @message_handler
        async def on_request(self, message: Request, ctx: MessageContext) -> Reply:
            self.turns += 1
            turn = self.turns
            msg_id = f"m-{self.session}-{self.seq}"
            self.log("agent/inbox/spliced", {"op": "insert", "list": "nextTurn", "placement": "followup", "messageId": msg_id})
            self.log("turn/start", {"turn": turn})
            self.log("agent/inbox/spliced", {"op": "claim", "list": "nextTurn", "placement": "followup", "messageId": msg_id})
            user = UserMessage(content=message.text, source="user")
            self.remember(user)
            step = 0
            while True:
                step += 1
                self.log("step/start", {"turn": turn, "step": step})
                if step == 1:
                    self.log("user/message", {"role": "user", "content": [{"type": "text", "text": message.text}],
                                              "id": msg_id, "source": {"kind": "user"}})
                self.log("request/header", {"turn": turn, "step": step, "provider": "scripted", "model": "scripted-1"})
                await asyncio.sleep(0)  # a model call is an await, as ping's is a checkpoint
                answer, _ = model(self.history, self.words)
                if isinstance(answer, list):
                    self.remember(AssistantMessage(content=answer, source="model"))
                    self.log("assistant/message", {"role": "assistant", "id": f"a-{self.seq}", "content": [
                        {"type": "tool_call", "callId": c.id, "name": c.name, "arguments": c.arguments} for c in answer]})
                    results = []
                    for call in answer:
                        self.log("tool/call", {"callId": call.id, "name": call.name, "arguments": call.arguments})
                        output = await echo_tool.run_json(json.loads(call.arguments), CancellationToken(), call_id=call.id)
                        results.append(FunctionExecutionResult(content=echo_tool.return_value_as_string(output),
                                                               call_id=call.id, name=call.name, is_error=False))
                    self.remember(FunctionExecutionResultMessage(content=results))
                    for result in results:
                        self.log("tool/result", {"role": "tool", "id": f"t-{self.seq}", "source": {"kind": "tool", "callId": result.call_id},
                                                 "content": [{"type": "tool_result", "callId": result.call_id, "content": result.content, "isError": False}]})
                    self.log("step/end", {"turn": turn, "step": step})
                    continue
                self.remember(AssistantMessage(content=answer, source="model"))
                self.log("assistant/message", {"role": "assistant", "id": f"a-{self.seq}", "content": [{"type": "text", "text": answer}]})
                self.log("step/end", {"turn": turn, "step": step})
                self.log("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
                return Reply(answer)

    class Echo(RoutedAgent):
        def __init__(self) -> None:
            super().__init__("bench echo agent")

        @message_handler
        async def on_request(self, message: Request, ctx: MessageContext) -> Reply:
            return Reply(message.text)

    return Worker, Echo


def _header(session_id: str) -> Any:
    from loopdock.runtime import SessionHeader

    return SessionHeader(id=session_id, created_at=time.time_ns() // 1_000_000, cwd="/tmp")


TASK = 'call: bench_echo {"text": "hi"}'


async def _run(kind: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from autogen_core import AgentId, SingleThreadedAgentRuntime

    from loopdock.runtime import SessionStore

    n, k = params["n"], params["k"]
    scratch = Path(tempfile.mkdtemp(prefix="loopdock-bench-peer-"))
    store = SessionStore.open(scratch / "sessions.db")
    writer = Writer(store)
    worker, echo = _classes(writer)
    runtime = SingleThreadedAgentRuntime()
    await worker.register(runtime, "worker", worker)
    await echo.register(runtime, "echo", echo)
    runtime.start()
    writer_task = asyncio.create_task(writer.run())
    latencies: list[float] = []
    try:
        agent_type = "worker" if kind == "turns" else "echo"
        text = TASK if kind == "turns" else "x"
        ids = [AgentId(agent_type, f"a{i}") for i in range(n)]
        # autogen creates an agent on its first message: one warm-up request each.
        await asyncio.gather(*(runtime.send_message(Request(text), agent) for agent in ids))
        await writer.idle.wait()

        async def client(agent: Any) -> None:
            for _ in range(k):
                t0 = time.perf_counter()
                await runtime.send_message(Request(text), agent)
                latencies.append(time.perf_counter() - t0)

        progress(0.3, f"peer {kind} N={n}")
        started, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(agent) for agent in ids))
        await writer.idle.wait()  # persisted: the last event of every agent is durable
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        writer_task.cancel()
        await runtime.stop()
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)
    turns = n * k
    return {"n": n, "k": k, "turns": turns, "seconds": seconds, "turns_per_s": turns / seconds,
            "cpu_us_per_turn": cpu / turns * 1e6, "commits": writer.commits, "turn": summary_ms(latencies),
            "peak_rss_mb": peak_rss_bytes() / 2**20}


def run_peer(kind: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    gc.set_threshold(*GC_THRESHOLD)  # what loopdock's side runs with (as serve): same collector settings
    return asyncio.run(_run(kind, params, progress))
