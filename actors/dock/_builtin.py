"""The built-in strategy loops (loopdock's founding demo runs one of each).

- ``standard``: the standard preset, the full toolset (a baseline, not a claim).
- ``minimal-first``: the model sees a minimal toolset until the first tool call of a
  turn, then the standard toolset. Done entirely through the setup contract (a pre-step
  and a request listener); the driver is untouched.
"""

from __future__ import annotations

import attrs

from loopdock.runtime import Next
from loopdock.runtime.models import ModelRequest

from .._agent_context import AgentContext
from .._pre_step import PreStep, Verdict
from ._loops import StrategyLoop
from ._presets import MINIMAL_TOOLS


async def _standard_setup(ctx: AgentContext) -> None:
    await ctx.get("agentPresets").mount(ctx, "standard")


async def _minimal_first_setup(ctx: AgentContext) -> None:
    await ctx.get("agentPresets").mount(ctx, "standard")
    agent = ctx.agent
    # Per-agent state in the setup's closure: where the current turn's messages start
    # (set at every turn's first step, before its first request).
    turn_start = {"index": 0}

    async def mark_turn_start(pre: PreStep, next_: Next[PreStep, Verdict]) -> Verdict:
        if pre.step == 1:
            turn_start["index"] = len(agent.transcript)
        return await next_(pre)

    async def narrow_until_first_call(request: ModelRequest, next_: Next[ModelRequest, ModelRequest]) -> ModelRequest:
        called = any(m.tool_calls for m in request.messages[turn_start["index"] :])
        if not called:
            request = attrs.evolve(request, tools=tuple(t for t in request.tools if t.name in MINIMAL_TOOLS))
        return await next_(request)

    ctx.on("agent/pre-step", mark_turn_start)
    ctx.on("agent/request", narrow_until_first_call)


STANDARD = StrategyLoop(
    id="standard",
    label="Standard",
    description="The standard preset with the full toolset; the baseline loop.",
    setup=_standard_setup,
)

MINIMAL_FIRST = StrategyLoop(
    id="minimal-first",
    label="Minimal first",
    description="A minimal toolset until the first tool call of a turn, then the standard one.",
    setup=_minimal_first_setup,
)

BUILTIN_LOOPS = (STANDARD, MINIMAL_FIRST)
