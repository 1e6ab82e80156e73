"""The driver seam (the seed's AgentFactory): what a loop implementation provides.

A driver owns the whole publication transaction of an agent: prepare the session,
construct the agent, run the setup, commit, enter the registries, announce, start.
``create_agent`` and ``resume`` return an ``AgentHandle``; any failure rolls back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Union

import attrs

from ._ids import check_session_id
from ._options import AgentOptions

if TYPE_CHECKING:
    from actors import AgentActor, AgentContext, Supervisor


class Commit(Protocol):
    def commit(self) -> None: ...


#: What a setup may return: nothing, an object with ``commit()``, or a plain callable.
SetupResult = Union[Commit, Callable[[], None], None]
Setup = Callable[["AgentContext"], Union[Awaitable[SetupResult], SetupResult]]


@attrs.frozen
class CreateAgentOptions:
    session_id: str = attrs.field(validator=lambda _, __, v: check_session_id(v))
    agent_options: AgentOptions = attrs.field(factory=AgentOptions, converter=AgentOptions.from_value)
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
    agent_options: AgentOptions = attrs.field(factory=AgentOptions, converter=AgentOptions.from_value)
    setup: Setup | None = None
    loop: str | None = None
    driver: str | None = None


@attrs.frozen
class AgentHandle:
    """What a driver returns: the live agent and the one way to dispose of it."""

    agent: AgentActor
    dispose: Callable[[], Awaitable[None]] = attrs.field(eq=False)


class Driver(Protocol):
    async def create_agent(self, owner: Supervisor, options: CreateAgentOptions) -> AgentHandle: ...

    async def resume(self, owner: Supervisor, options: ResumeAgentOptions) -> AgentHandle: ...
