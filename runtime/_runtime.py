"""Runtime: the embedded entry point.

    async with Runtime.open(home="./.loopdock") as rt:
        handle = await rt.create_agent(session_id="a1")
        handle.agent.followup("hello")
        await handle.agent.wait_idle()
        await handle.dispose()

Closing the ``async with`` disposes every agent (their turns end ``aborted``), makes
every session durable and closes the database.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
import trio

from actors import AgentActor, LiveEvent, ReactDriver, StoreWriter, Subscription, Supervisor

from ._driver import AgentHandle, CreateAgentOptions, Driver, ResumeAgentOptions, Setup
from ._errors import LoopdockError
from ._events import SessionHeader
from ._options import AgentOptions
from ._store import SessionStore
from .models import AdapterRegistry, ModelAdapter, default_adapters
from .tools import ShellPolicy, Tool, ToolRegistry, builtin_tools, shell_tool

log = structlog.get_logger(__name__)

DEFAULT_HOME = ".loopdock"
DEFAULT_DRIVER = "default"
_DRIVER_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class UnknownDriverError(LoopdockError):
    """Raised when an agent asks for a driver name that is not registered."""

    code = "UNKNOWN_DRIVER"


class InvalidDriverError(LoopdockError):
    """Raised when registering a driver with a bad name or without create_agent/resume."""

    code = "INVALID_DRIVER"


class DuplicateDriverError(LoopdockError):
    """Raised when a driver name is registered twice."""

    code = "DUPLICATE_DRIVER"


def resolve_home(home: str | os.PathLike[str] | None) -> Path:
    return Path(home or os.environ.get("LOOPDOCK_HOME") or DEFAULT_HOME).absolute()


class Runtime:
    def __init__(self, home: Path, supervisor: Supervisor) -> None:
        self.home = home
        self._supervisor = supervisor
        self._drivers: dict[str, Driver] = {}

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        home: str | os.PathLike[str] | None = None,
        *,
        shell: ShellPolicy | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Runtime]:
        """Open the runtime on ``home`` (``$LOOPDOCK_HOME``, default ``./.loopdock``).

        ``shell`` enables the shell tool under that policy (it is off by default).
        Model adapters: ``ping`` always, ``deepseek`` when ``DEEPSEEK_API_KEY`` is set.
        """
        path = resolve_home(home)
        store = await trio.to_thread.run_sync(SessionStore.open, path / "sessions.db")
        try:
            tools = ToolRegistry()
            for tool in builtin_tools():
                tools.register(tool)
            if shell is not None:
                tools.register(shell_tool(shell))
            body_error: BaseException | None = None
            async with trio.open_nursery() as nursery:
                writer = StoreWriter(store)
                await nursery.start(writer.run)
                supervisor = Supervisor(
                    nursery, store, writer, default_adapters(env if env is not None else os.environ), tools
                )
                rt = cls(path, supervisor)
                rt.register_driver(ReactDriver())
                try:
                    yield rt
                except BaseException as exc:
                    # Re-raised below, outside the nursery, so that the caller sees its
                    # own exception rather than an ExceptionGroup around it.
                    body_error = exc
                finally:
                    with trio.CancelScope(shield=True):
                        await supervisor.aclose()
                    nursery.cancel_scope.cancel()
            if body_error is not None:
                raise body_error
        finally:
            await trio.to_thread.run_sync(store.close)

    # -- registries ----------------------------------------------------------------------

    @property
    def adapters(self) -> AdapterRegistry:
        return self._supervisor.adapters

    @property
    def tools(self) -> ToolRegistry:
        return self._supervisor.tools

    @property
    def supervisor(self) -> Supervisor:
        """The actor tree's owner (what drivers receive as ``owner``)."""
        return self._supervisor

    def register_adapter(self, name: str, adapter: ModelAdapter) -> Callable[[], None]:
        return self.adapters.register(name, adapter)

    def register_tool(self, tool: Tool) -> Callable[[], None]:
        return self.tools.register(tool)

    def provide(self, name: str, service: Any) -> Callable[[], None]:
        """Offer a service to setups (``agent_ctx.get(name)``)."""
        return self._supervisor.provide(name, service)

    def register_driver(self, name_or_driver: str | Driver, driver: Driver | None = None) -> Callable[[], None]:
        """``register_driver(driver)`` registers ``default``; ``register_driver(name, driver)``
        a named one. Returns an idempotent disposer removing only that same driver."""
        if driver is None:
            name, driver = DEFAULT_DRIVER, name_or_driver  # type: ignore[assignment]
        else:
            name = name_or_driver  # type: ignore[assignment]
        if not isinstance(name, str) or not _DRIVER_NAME.match(name):
            raise InvalidDriverError(f"driver name {name!r} must match {_DRIVER_NAME.pattern}")
        if not (callable(getattr(driver, "create_agent", None)) and callable(getattr(driver, "resume", None))):
            raise InvalidDriverError(f"driver {name!r} must have create_agent() and resume()")
        if name in self._drivers:
            raise DuplicateDriverError(f"driver {name!r} is already registered")
        self._drivers[name] = driver

        def dispose() -> None:
            if self._drivers.get(name) is driver:
                del self._drivers[name]

        return dispose

    def _driver(self, name: str | None) -> Driver:
        name = name or DEFAULT_DRIVER
        try:
            return self._drivers[name]
        except KeyError:
            raise UnknownDriverError(
                f"no driver {name!r}; registered: {', '.join(sorted(self._drivers)) or 'none'}"
            ) from None

    # -- agents ----------------------------------------------------------------------------

    async def create_agent(
        self,
        *,
        session_id: str,
        agent_options: AgentOptions | Mapping[str, Any] | None = None,
        setup: Setup | None = None,
        driver: str | None = None,
        cwd: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> AgentHandle:
        """Create and start a new agent (its id is ``session_id``). Nothing is left behind
        if it fails: the error is raised and no session or agent exists afterwards."""
        options = CreateAgentOptions(
            session_id=session_id, agent_options=agent_options, setup=setup, cwd=cwd, meta=meta
        )
        chosen = self._driver(driver or options.agent_options.driver)
        return await chosen.create_agent(self._supervisor, options)

    async def resume_agent(
        self,
        *,
        resume_session_id: str,
        agent_options: AgentOptions | Mapping[str, Any] | None = None,
        setup: Setup | None = None,
        driver: str | None = None,
    ) -> AgentHandle:
        """Bring a persisted session back as a live agent; an interrupted turn is closed
        as ``turn/end {reason: interrupted}`` first."""
        options = ResumeAgentOptions(
            resume_session_id=resume_session_id, agent_options=agent_options, setup=setup
        )
        chosen = self._driver(driver or options.agent_options.driver)
        return await chosen.resume(self._supervisor, options)

    async def fork_session(self, source_id: str, new_id: str, *, upto_seq: int | None = None) -> str:
        """Copy the longest prefix of a session that ends at a turn boundary into a new one."""
        return await self._supervisor.fork_session(source_id, new_id, upto_seq=upto_seq)

    def get_agent(self, agent_id: str) -> AgentActor | None:
        return self._supervisor.agents.get(agent_id)

    def list_agents(self) -> list[str]:
        return sorted(self._supervisor.agents)

    async def list_sessions(self) -> list[SessionHeader]:
        """Every persisted session's header."""
        return await trio.to_thread.run_sync(self._supervisor.store.list_headers)

    def subscribe_live(self, max_buffer: int = 1024) -> Subscription[LiveEvent]:
        """Live agent events (``agent/created``, ``agent/status``, ``agent/inbox/*``, ...)."""
        return self._supervisor.live.subscribe(max_buffer)
