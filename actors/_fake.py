"""A fake driver: real agents, real session logs, no model call at all.

Each turn answers every message with ``"<name>: <text>"``. It stands in for a second
agent loop in demos and in tests of the loop dock (the "fake factory" of the dock's design).
"""

from __future__ import annotations

from loopdock.runtime import Message, TextBlock

from ._driver import AgentHandle, CreateAgentOptions, ResumeAgentOptions
from ._publication import create_with_body, resume_with_body
from ._supervisor import Supervisor
from ._turn import Turn


class FakeBody:
    def __init__(self, name: str) -> None:
        self.name = name

    async def run_turn(self, turn: Turn) -> str:
        while True:
            messages = await turn.begin_step()
            text = " / ".join(m.text for m in messages)
            turn.record("assistant/message", Message("assistant", (TextBlock(f"{self.name}: {text}"),)))
            turn.end_step()
            if not turn.has_step_input():
                return "completed"


class FakeDriver:
    """``FakeDriver("loop-ping")``: agents that answer ``loop-ping: <text>``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.created: list[CreateAgentOptions] = []  # what it was asked, for tests
        self.resumed: list[ResumeAgentOptions] = []

    async def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> AgentHandle:
        self.created.append(options)
        return await create_with_body(owner, options, FakeBody(self.name))

    async def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> AgentHandle:
        self.resumed.append(options)
        return await resume_with_body(owner, options, FakeBody(self.name))
