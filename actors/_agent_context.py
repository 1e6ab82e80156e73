"""AgentContext: what a setup may touch on an unpublished agent.

Every registration made through it is scoped to the agent and undone when the creation
rolls back or the agent is disposed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loopdock.runtime import AgentOptions, LoopdockError
from loopdock.runtime.tools import AgentTools, Tool

from ._agent import AgentActor
from ._session import SessionActor
from ._supervisor import Supervisor


class UnknownHookError(LoopdockError):
    """Raised when ``agent_ctx.on`` names a hook the agent does not have."""

    code = "UNKNOWN_HOOK"


HOOKS = ("agent/pre-step", "agent/request")


class AgentContext:
    def __init__(self, owner: Supervisor, agent: AgentActor) -> None:
        self.owner = owner
        self.agent = agent

    @property
    def session(self) -> SessionActor:
        return self.agent.session

    @property
    def options(self) -> AgentOptions:
        return self.agent.options

    @options.setter
    def options(self, value: AgentOptions) -> None:
        """A setup may replace the unpublished agent's options (the loop dock pins models)."""
        self.agent.options = value

    @property
    def tools(self) -> ScopedTools:
        return ScopedTools(self.agent)

    def add_prompt_section(self, name: str, text: str) -> Callable[[], None]:
        """Add a named system-prompt section (replacing is refused: sections are owned)."""
        sections = self.agent.prompt_sections
        if name in sections:
            raise LoopdockError(f"prompt section {name!r} is already set")
        sections[name] = text

        def dispose() -> None:
            if sections.get(name) is text:
                del sections[name]

        return self.agent.add_scoped(dispose)

    def on(self, hook: str, listener: Callable[..., Any], *, prepend: bool = False) -> Callable[[], None]:
        """Add a waterfall listener (``agent/pre-step`` or ``agent/request``); ``prepend``
        makes it the outermost one."""
        if hook == "agent/pre-step":
            return self.agent.add_scoped(self.agent.pre_step.add(listener, prepend=prepend))
        if hook == "agent/request":
            return self.agent.add_scoped(self.agent.request.add(listener, prepend=prepend))
        raise UnknownHookError(f"unknown hook {hook!r}; hooks: {', '.join(HOOKS)}")

    def get(self, service: str) -> Any:
        return self.owner.service(service)

    def defer(self, disposer: Callable[[], None]) -> Callable[[], None]:
        """Run ``disposer`` when the agent is rolled back or disposed."""
        return self.agent.add_scoped(disposer)


class ScopedTools:
    """The agent's tool view, with registrations scoped to the agent."""

    def __init__(self, agent: AgentActor) -> None:
        self._agent = agent
        self._tools: AgentTools = agent.tools

    def register(self, tool: Tool) -> Callable[[], None]:
        return self._agent.add_scoped(self._tools.register(tool))

    def restrict(self, allow: Any = None, deny: Any = ()) -> Callable[[], None]:
        return self._agent.add_scoped(self._tools.restrict(allow, deny))

    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._tools.visible())
