"""The driver seam (DSH's agent factory): what a loop implementation provides.

A driver owns the whole publication transaction of an agent: prepare the session,
construct the agent, run the setup, commit, enter the registries, announce, start.
``create_agent`` and ``resume`` return an ``AgentHandle``; any failure rolls back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, Union

import attrs

from loopdock.runtime import AgentOptions, check_session_id

from ._agent import AgentActor
from ._agent_context import AgentContext
from ._supervisor import Outline, Supervisor


class Commit(Protocol):
    def commit(self) -> None: ...


#: What a setup may return: nothing, an object with ``commit()``, or a plain callable.
SetupResult = Union[Commit, Callable[[], None], None]
Setup = Callable[[AgentContext], Union[Awaitable[SetupResult], SetupResult]]


def _agent_options(value: AgentOptions | Mapping[str, Any] | None) -> AgentOptions:
    return AgentOptions.from_value(value)


@attrs.frozen
class CreateAgentOptions:
    session_id: str = attrs.field(validator=lambda _, __, v: check_session_id(v))
    agent_options: AgentOptions = attrs.field(factory=AgentOptions, converter=_agent_options)
    setup: Setup | None = None
    meta: Mapping[str, Any] | None = None
    cwd: str | None = None
    parent_session: str | None = None
    agent_preset: str | None = None
    # The loop dock's selection: set by the dock before a driver sees the options.
    loop: str | None = None
    driver: str | None = None


@attrs.frozen
class ResumeAgentOptions:
    resume_session_id: str = attrs.field(
        validator=lambda _, __, v: check_session_id(v, what="resume session id")
    )
    agent_options: AgentOptions = attrs.field(factory=AgentOptions, converter=_agent_options)
    setup: Setup | None = None
    loop: str | None = None
    driver: str | None = None
    #: Set by the runtime when it reactivates a passivated agent (actors._lifecycle): the
    #: agent object to rebuild in place, which its callers hold. ``resume_with_body``
    #: honours it; a driver that builds its agents otherwise gets no ``reactivation``
    #: recipe from the dock, so its agents are never passivated.
    into: AgentActor | None = attrs.field(default=None, eq=False, repr=False)
    #: Set by the dock: the session's outline (``Supervisor.read_outline``) it read to find
    #: the stored binding, which ``resume_with_body`` hands to ``load_session`` so that a
    #: resume reads the store once. Never kept in a recipe.
    outline: Outline | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class AgentHandle:
    """What a driver returns: the live agent and the one way to dispose of it."""

    agent: AgentActor
    dispose: Callable[[], Awaitable[None]] = attrs.field(eq=False)


class Driver(Protocol):
    """Anything with these two (usually ``async def``) methods; the dock's one agent factory
    delegates every create and resume to a driver."""

    def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> Awaitable[AgentHandle]: ...

    def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> Awaitable[AgentHandle]: ...
