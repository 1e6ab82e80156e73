"""The ``react`` driver: the standard agent loop.

model -> tool calls (up to ``max_parallel_tool_calls`` at once) -> model ... until the
model stops without calling a tool and nothing waits for the next step. The turn ends
``completed``, ``max-tokens`` or (through the agent) ``error`` / ``aborted`` / ``blocked``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import trio

from loopdock.runtime import (
    Block,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolError,
    ToolResultBlock,
    ToolSource,
    get_logger,
)
from loopdock.runtime.models import (
    Chunk,
    Finish,
    ModelAdapter,
    ModelRequest,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallChunk,
    Usage,
)
from loopdock.runtime.tools import ToolContext

from ._call_approval import permit
from ._driver import AgentHandle, CreateAgentOptions, ResumeAgentOptions
from ._publication import create_with_body, resume_with_body
from ._supervisor import Supervisor
from ._turn import Turn

log = get_logger(__name__)


async def _request_as_is(request: ModelRequest) -> ModelRequest:
    return request


class ReactBody:
    #: It continues a turn from its last durable step (actors._step_resume): a resumed
    #: turn comes with ``turn.resumed``. A subclass that sets this False gets its open
    #: turns closed ``interrupted`` on resume.
    resumes_steps = True

    async def run_turn(self, turn: Turn) -> str:
        agent = turn.agent
        point = turn.resumed
        ask_again = point is not None and not point.answered  # the reply was cut: ask for it again
        if point is not None and point.answered:  # finish the step the log holds
            if point.calls:
                async with turn.outside():
                    await _run_tools(turn, point.calls)
            turn.resumed = None  # later steps' call ids are new calls, whatever they repeat
            if not point.step_ended:
                turn.end_step()
            if not point.more and not turn.has_step_input():
                return "completed"
        while True:
            if ask_again:  # its ``step/start`` and messages are in the log already
                ask_again, turn.resumed = False, None
            else:
                await turn.begin_step()
            request = await agent.request.run(turn.model_request(), _request_as_is)
            adapter = agent.owner.adapters.get(request.provider)
            turn.log(
                "request/header",
                {"turn": turn.number, "step": turn.step, "provider": request.provider, "model": request.model},
            )
            tracing = agent.owner.tracing
            if tracing is None:  # off: this check is all tracing costs a model call
                message, finish, usage = await _call_model(turn, adapter, request)
            else:
                with tracing.chat(turn.span, request.provider, request.model) as span:
                    message, finish, usage = await _call_model(turn, adapter, request)
                    tracing.chat_done(span, finish, usage)
            turn.record("assistant/message", message, usage=usage)
            calls = message.tool_calls
            for call in calls:
                turn.log("tool/call", {"callId": call.call_id, "name": call.name, "arguments": call.arguments})
            if finish == "max-tokens":
                _record_unrun(turn, calls, "not run: the reply hit max_tokens")
                turn.end_step()
                return "max-tokens"
            if calls:
                async with turn.outside():
                    await _run_tools(turn, calls)
                turn.end_step()
                continue
            turn.end_step()
            if not turn.has_step_input():
                return "completed"


async def _call_model(turn: Turn, adapter: ModelAdapter, request: ModelRequest) -> tuple[Message, str, Usage | None]:
    if getattr(adapter, "cpu_bound", False):  # it computes: keep the slot
        return await _collect(adapter.stream(request))
    async with turn.outside():  # the model may take seconds: no slot meanwhile
        return await _collect(adapter.stream(request))


async def _collect(stream: AsyncIterator[Chunk]) -> tuple[Message, str, Usage | None]:
    text: list[str] = []
    reasoning: list[str] = []
    ended: list[Block] = []  # reasoning blocks the provider closed (signed, redacted)
    calls: list[ToolCallBlock] = []
    finish = "stop"
    usage: Usage | None = None
    async for chunk in stream:
        if isinstance(chunk, TextDelta):
            text.append(chunk.text)
        elif isinstance(chunk, ReasoningDelta):
            reasoning.append(chunk.text)
        elif isinstance(chunk, ReasoningEnd):
            ended.append(ReasoningBlock("".join(reasoning), chunk.signature, chunk.redacted_data))
            reasoning.clear()
        elif isinstance(chunk, ToolCallChunk):
            calls.append(ToolCallBlock(chunk.call_id, chunk.name, chunk.arguments))
        elif isinstance(chunk, Usage):
            usage = chunk
        elif isinstance(chunk, Finish):
            finish = chunk.reason
    # Reasoning first, each closed block as it came (a provider replays them in order).
    blocks: list[Block] = ended
    if reasoning:
        blocks.append(ReasoningBlock("".join(reasoning)))
    if text:
        blocks.append(TextBlock("".join(text)))
    blocks.extend(calls)
    return Message(role="assistant", content=tuple(blocks)), finish, usage


def _result_message(call_id: str, content: str, is_error: bool) -> Message:
    return Message(
        role="tool",
        content=(ToolResultBlock(call_id, content, is_error),),
        source=ToolSource(call_id),
    )


def _record_unrun(turn: Turn, calls: Sequence[ToolCallBlock], why: str) -> None:
    for call in calls:
        turn.record("tool/result", _result_message(call.call_id, why, True))


async def _run_tools(turn: Turn, calls: Sequence[ToolCallBlock]) -> None:
    """Run the calls concurrently (bounded), then log every result in call order.

    If the turn is cancelled meanwhile, every call still gets a result ("cancelled") so
    the transcript stays well-formed for the next model request.
    """
    agent = turn.agent
    results: dict[str, tuple[str, bool]] = {}
    try:
        if len(calls) == 1:
            # The common case: nothing to run concurrently, so no nursery, no limiter
            # and no extra task; cancellation reaches the call the same way.
            results[calls[0].call_id] = await _run_tool(turn, calls[0])
        else:
            limiter = trio.CapacityLimiter(agent.options.max_parallel_tool_calls)

            async def run_one(call: ToolCallBlock) -> None:
                async with limiter:
                    results[call.call_id] = await _run_tool(turn, call)

            async with trio.open_nursery() as nursery:
                for call in calls:
                    nursery.start_soon(run_one, call)
    finally:
        for call in calls:
            if call.call_id not in results and turn.agent.stopping and turn.agent.approvals.asked(call.call_id, turn.number):
                continue  # its question stays open for the resumed agent, which runs the call
            content, is_error = results.get(call.call_id, ("cancelled", True))
            turn.record("tool/result", _result_message(call.call_id, content, is_error))


async def _run_tool(turn: Turn, call: ToolCallBlock) -> tuple[str, bool]:
    tracing = turn.agent.owner.tracing
    if tracing is None:  # off: this check is all tracing costs a tool call
        return await _run_tool_untraced(turn, call)
    with tracing.tool(turn.span, call.name, call.call_id) as span:
        content, is_error = await _run_tool_untraced(turn, call)
        if is_error:
            tracing.tool_failed(span, content[:200])
        return content, is_error


async def _run_tool_untraced(turn: Turn, call: ToolCallBlock) -> tuple[str, bool]:
    agent = turn.agent
    tool = agent.tools.lookup(call.name)
    if tool is None:
        visible = ", ".join(t.name for t in agent.tools.visible()) or "none"
        return f"unknown tool {call.name!r}; available tools: {visible}", True
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"arguments of {call.name} are not valid JSON: {exc.msg}", True
    if not isinstance(arguments, dict):
        return f"arguments of {call.name} must be a JSON object", True
    allowed = await permit(turn, call, tool, arguments)
    if allowed.arguments is None:
        return allowed.refusal or "refused", True
    arguments = allowed.arguments
    if turn.marks_starts and not (tool.read_only or tool.idempotent):
        # Durable before the tool starts: a crash from here on leaves a call that may
        # have run, which a resumed turn does not run again without asking.
        turn.log("tool/started", {"turn": turn.number, "step": turn.step, "callId": call.call_id})
        await turn.session.flush()
    ctx = ToolContext(session_id=agent.id, cwd=agent.cwd, call_id=call.call_id, threads=agent.tools.threads)
    try:
        return await tool.run(arguments, ctx), False
    except ToolError as exc:
        return str(exc), True
    except Exception as exc:
        agent.log.warning("tool failed", tool=call.name, error=repr(exc))
        return f"internal error in tool {call.name}: {type(exc).__name__}", True


class ReactDriver:
    """The shipped driver (registered as ``default``). ``owner`` is the Supervisor."""

    async def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> AgentHandle:
        return await create_with_body(owner, options, ReactBody())

    async def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> AgentHandle:
        return await resume_with_body(owner, options, ReactBody())
