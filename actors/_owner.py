"""What an agent needs from the actor tree that owns it.

The supervisor provides it; declaring it here lets an agent (and the turns it runs) name
its owner without importing the supervisor, which imports the agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from loopdock.runtime import Message, Tracing
from loopdock.runtime.models import AdapterRegistry
from loopdock.runtime.tools import ToolRegistry

from ._admission import AdmissionGate
from ._fanout import Fanout
from ._history_cache import HistoryCache
from ._live import LiveEvent
from ._store_writer import StoreWriter


class AgentLifecycle(Protocol):
    """What an agent asks of the runtime's lifecycle (actors._lifecycle.Lifecycle); the
    agent passes itself."""

    def idle(self, agent: Any) -> None: ...

    def busy(self, agent: Any) -> None: ...

    def reactivate(self, agent: Any) -> None: ...

    async def close_passive(self, agent: Any, cause: str) -> None: ...


class AgentOwner(Protocol):
    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def adapters(self) -> AdapterRegistry: ...

    @property
    def live(self) -> Fanout[LiveEvent]: ...

    @property
    def admission(self) -> AdmissionGate:
        """The runtime-wide gate automatic turns pass (people's turns do not)."""

    @property
    def history(self) -> HistoryCache:
        """Which idle agents keep their history in memory."""

    @property
    def lifecycle(self) -> AgentLifecycle:
        """Passivates idle agents and reactivates them (docs/lifecycle.md)."""

    @property
    def writer(self) -> StoreWriter:
        """The store writer (a passivated agent's session reads the store through it)."""

    @property
    def tracing(self) -> Tracing | None:
        """The spans of turns, model and tool calls; None (the default): no tracing."""

    def announce(self, event_type: str, agent_id: str, data: Mapping[str, Any]) -> None:
        """Publish a live event about ``agent_id``."""

    async def prepare_step(self) -> None:
        """Bring what a step reads from outside up to date (before its messages are claimed)."""

    def expand(self, message: Message) -> list[Message]:
        """The messages to record in place of an admitted ``message``."""
