"""Supervisor: owns the actor tree of one runtime.

It holds the nursery every agent runs in, the session and agent registries, the store
writer, the shared registries (model adapters, tools, services) and the live event
stream. Drivers receive it as their ``owner``. Closing it disposes every agent, flushes
every session, and only then stops the writer: nothing outlives it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from loopdock.runtime import (
    AgentBusyError,
    Event,
    LoopdockError,
    Message,
    SessionExistsError,
    SessionHeader,
    SessionLog,
    SessionNotFoundError,
    Tracing,
    check_session_id,
    get_logger,
    safe_message,
)
from loopdock.runtime.models import AdapterRegistry
from loopdock.runtime.tools import ToolRegistry

from ._admission import AdmissionGate
from ._agent import AgentActor
from ._fanout import Fanout
from ._faults import record_fault
from ._history_cache import HistoryCache
from ._lifecycle import Lifecycle
from ._live import LiveEvent
from ._session import RETAINED_TYPES, SessionActor, _now_ms
from ._step_resume import SuspendedTurn, open_question, resume_point
from ._store_writer import StoreWriter
from ._supervision import STOP, Action, supervised

log = get_logger(__name__)


class UnknownServiceError(LoopdockError):
    """Raised when ``agent_ctx.get(name)`` names a service nobody provides."""

    code = "UNKNOWN_SERVICE"


class RuntimeClosedError(LoopdockError):
    """Raised when creating or resuming an agent while the runtime shuts down."""

    code = "RUNTIME_CLOSED"


class Supervisor:
    def __init__(
        self,
        nursery: trio.Nursery,
        store: SessionLog,
        writer: StoreWriter,
        adapters: AdapterRegistry,
        tools: ToolRegistry,
        *,
        admission: AdmissionGate | None = None,
        history: HistoryCache | None = None,
        tracing: Tracing | None = None,
        passivate_after: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.nursery = nursery
        self.store = store
        self.writer = writer
        self.adapters = adapters
        self.tools = tools
        self.services: dict[str, Any] = {}
        self.sessions: dict[str, SessionActor] = {}
        self.agents: dict[str, AgentActor] = {}
        self.live: Fanout[LiveEvent] = Fanout("live")
        # Its stall watcher (``admission.run``) runs in the runtime's nursery.
        self.admission = admission if admission is not None else AdmissionGate()
        self.history = history if history is not None else HistoryCache()
        self.tracing = tracing
        self.closing = False
        # Passivates agents idle for ``passivate_after`` seconds (None: never), and idle
        # agents while the process holds more than ``memory_limit`` bytes (None: no
        # limit), and brings them back on their next message; its ``run`` goes in the
        # runtime's nursery.
        self.lifecycle = Lifecycle(self, passivate_after, memory_limit)
        # Applied in order to every message admitted into a model step; each returns the
        # messages to record in place of the one it got (``[m]`` leaves it alone).
        self.expanders: list[Callable[[Message], Sequence[Message]]] = []
        # Awaited before every model step, before its messages are claimed: they bring
        # what steps read from the disk up to date (the skill catalog), off trio's thread.
        self.step_preparers: list[Callable[[], Awaitable[object]]] = []
        # Called with every agent once it runs (e.g. to start its LoopX continuation
        # driver as a companion actor); a failing hook is logged, never fatal.
        self.agent_started: list[Callable[[AgentActor], Awaitable[None]]] = []

    # -- services ----------------------------------------------------------------------

    def provide(self, name: str, service: Any) -> Callable[[], None]:
        """Publish a runtime service for setups (``agent_ctx.get(name)``)."""
        if name in self.services:
            raise LoopdockError(f"service {name!r} is already provided")
        self.services[name] = service

        def dispose() -> None:
            if self.services.get(name) is service:
                del self.services[name]

        return dispose

    def service(self, name: str) -> Any:
        try:
            return self.services[name]
        except KeyError:
            raise UnknownServiceError(
                f"no service {name!r}; provided: {', '.join(sorted(self.services)) or 'none'}"
            ) from None

    async def prepare_step(self) -> None:
        """Await every step preparer; one that fails is logged and skipped (the step goes
        on with what it read last)."""
        for prepare in list(self.step_preparers):
            try:
                await prepare()
            except Exception as exc:
                log.warning("step preparer failed", preparer=repr(prepare), error=repr(exc))

    def expand(self, message: Message) -> list[Message]:
        """Run ``message`` through every expander; the result replaces it in the log.

        An expander that fails, or returns anything but a non-empty sequence of messages,
        is skipped with a warning: an admitted message is never lost to a broken one.
        """
        messages = [message]
        for expander in list(self.expanders):
            expanded: list[Message] = []
            for current in messages:
                try:
                    returned = expander(current)
                    if type(returned) is tuple and len(returned) == 1 and returned[0] is current:
                        expanded.append(current)  # unchanged: the common case, nothing to check
                        continue
                    result = list(returned)
                    if not result or not all(isinstance(m, Message) for m in result):
                        raise TypeError("an expander must return a non-empty sequence of Message")
                except Exception as exc:
                    log.warning("message expander failed", expander=repr(expander), error=repr(exc))
                    result = [current]
                expanded.extend(result)
            messages = expanded
        return messages

    def announce(self, event_type: str, agent_id: str, data: Mapping[str, Any]) -> None:
        self.live.publish(LiveEvent(event_type, agent_id, data))

    # -- sessions ----------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closing:
            raise RuntimeClosedError("the runtime is shutting down")

    async def new_session(
        self,
        session_id: str,
        *,
        cwd: str | None = None,
        parent_session: str | None = None,
        agent_preset: str | None = None,
        events: Sequence[Event] = (),
        forked_events: int | None = None,
    ) -> SessionActor:
        """A fresh, unpublished session (nothing is written until it is published)."""
        check_session_id(session_id)
        self.check_open()
        if session_id in self.sessions or await trio.to_thread.run_sync(
            self.store.exists, session_id
        ):
            raise SessionExistsError(
                f"session {session_id!r} already exists; resume it instead of creating it"
            )
        header = SessionHeader(
            id=session_id,
            created_at=_now_ms(),
            cwd=cwd or os.getcwd(),
            parent_session=parent_session,
            agent_preset=agent_preset,
            forked_events=forked_events,
        )
        return SessionActor(header, self.writer, events=events)

    async def read_outline(self, session_id: str) -> Outline | None:
        """What resuming ``session_id`` reads of its log (``load_session``), from the store:
        header, length, last time and the events of ``OUTLINE_TYPES``; None if unknown."""
        return await trio.to_thread.run_sync(self.store.load_outline, session_id, OUTLINE_TYPES)

    async def load_session(
        self, session_id: str, *, resumes_steps: bool = False, into: AgentActor | None = None,
        outline: Outline | None = None,
    ) -> SessionActor:
        """A persisted session, ready to resume. An open turn is repaired as interrupted,
        unless its agent continues it (``session.suspended_turn``): ``resumes_steps``
        (its driver's body can) and the log holds a step to go on from, or a question
        asked in it is still open (withdrawn by an agent that cannot continue it).
        ``into``: the passivated agent of this id being reactivated. ``outline``: its
        ``read_outline`` if the caller read it already (the dock does, to find the
        binding), so that a resume reads the store once."""
        check_session_id(session_id, what="resume session id")
        self.check_open()
        live = self.agents.get(session_id)
        if live is not None and not (live is into and into.passivated):
            raise AgentBusyError(f"session {session_id!r} already has a live agent")
        # Only an outline: the log itself stays in the store until a reader needs it.
        loaded = outline if outline is not None else await self.read_outline(session_id)
        if loaded is None:
            raise SessionNotFoundError(f"no persisted session {session_id!r}")
        header, count, last_time, indexed = loaded
        session = SessionActor(
            header, self.writer, persisted=True, base=count, last_time=last_time,
            retained=[e for e in indexed if e.type in RETAINED_TYPES],
            turns=sum(1 for e in indexed if e.type == "turn/start"),
        )
        open_turn = _open_turn(indexed)
        if open_turn is None:
            return session
        number, start = open_turn
        point = None
        if resumes_steps:  # the open turn's events, and only those (actors._step_resume)
            point = resume_point(await trio.to_thread.run_sync(self.store.load_events, session_id, start))
        if point is not None or open_question(indexed, start):
            session.suspended_turn = SuspendedTurn(number, start, point)
        else:
            session.append("turn/end", {"turn": number, "reason": {"kind": "interrupted"}})
        return session

    async def fork_session(self, source_id: str, new_id: str, *, upto_seq: int | None = None) -> str:
        """Persist a new session holding the longest prefix of ``source_id`` that ends at a
        completed turn boundary (at or before ``upto_seq``); returns the new id."""
        check_session_id(new_id)
        loaded = await trio.to_thread.run_sync(self.store.load, check_session_id(source_id))
        live = self.sessions.get(source_id)
        if live is not None:
            header, events = live.header, await live.read_events()
        elif loaded is not None:
            header, events = loaded
        else:
            raise SessionNotFoundError(f"no session {source_id!r} to fork")
        if upto_seq is not None:
            events = events[: upto_seq + 1]
        prefix = events[: _prefix_end(events)]
        session = await self.new_session(
            new_id, cwd=header.cwd, parent_session=header.id, agent_preset=header.agent_preset,
            events=prefix, forked_events=len(prefix),
        )
        session.publish()
        await session.close()
        return new_id

    # -- agents ------------------------------------------------------------------------

    def enter(self, agent: AgentActor) -> None:
        """Register ``agent`` (a reactivated one is registered already, passivated)."""
        registered = self.agents.get(agent.id)
        if (registered is not None and registered is not agent) or agent.id in self.sessions:
            raise AgentBusyError(f"agent {agent.id!r} is already live")
        self.sessions[agent.id] = agent.session
        self.agents[agent.id] = agent

    async def run_agent(self, agent: AgentActor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run ``agent``'s evaluator in this supervisor's nursery (``nursery.start``).

        Policy ``stop``: if the evaluator itself fails (a failed *turn* is not a failure:
        it ends ``error`` and the agent goes on), the failure is recorded in the session
        and announced (``agent/error``), and the agent is retired as if disposed. Its
        siblings and the runtime go on."""
        failed: list[Exception] = []

        def report(error: Exception, action: Action) -> None:
            failed.append(error)
            record_fault(agent.session, "agent", error, action="retired")
            self.announce("agent/error", agent.id, {"error": safe_message(error)})

        await supervised(agent.run, name=f"agent {agent.id}", policy=STOP, report=report, task_status=task_status)
        if failed:
            try:
                await agent_dispose(self, agent)()
            except Exception as exc:  # e.g. its last events could not be made durable
                log.error("failed agent not closed cleanly", agent_id=agent.id, error=safe_message(exc))

    def leave(self, agent: AgentActor) -> None:
        if self.agents.get(agent.id) is agent:
            del self.agents[agent.id]
            self.sessions.pop(agent.id, None)  # a passivated agent has no session actor

    async def aclose(self) -> None:
        """Dispose every agent (concurrently), then drain the writer. One agent that
        cannot be closed cleanly (its last events not durable: the store failed) is
        logged and does not keep the others from closing."""
        self.closing = True
        self.lifecycle.closing = True
        self.writer.closing()  # a store that fails now fails these agents' last events

        async def dispose(agent: AgentActor) -> None:
            try:
                await agent_dispose(self, agent)()
            except Exception as exc:
                log.error("agent not closed cleanly", agent_id=agent.id, error=safe_message(exc))

        async with trio.open_nursery() as nursery:
            for agent in list(self.agents.values()):
                if self.lifecycle.close_now(agent, "disposed"):  # passivated: nothing to wait for
                    self.leave(agent)
                    self.announce("agent/disposed", agent.id, {})
                else:
                    nursery.start_soon(dispose, agent)
        await self.writer.drain()
        self.live.close()


def agent_dispose(owner: Supervisor, agent: AgentActor) -> Callable[[], Any]:
    """The one disposal path: used by handles and by runtime shutdown (idempotent)."""

    async def dispose() -> None:
        if agent.closed and owner.agents.get(agent.id) is not agent:
            return
        await agent.stop("disposed")
        agent.dispose_scoped()
        owner.leave(agent)
        try:
            await agent.session.close()
        finally:
            owner.announce("agent/disposed", agent.id, {})

    return dispose


#: What resuming reads of a log: turn boundaries and the retained state events.
#: The events a resume reads of a log (``Supervisor.read_outline``): turn boundaries and
#: what a session retains (its bindings and approvals).
OUTLINE_TYPES = frozenset({"turn/start", "turn/end", *RETAINED_TYPES})
#: ``SessionStore.load_outline``'s answer: header, event count, last time, the events.
Outline = tuple[SessionHeader, int, int, list[Event]]


def _open_turn(events: Sequence[Event]) -> tuple[int, int] | None:
    """The open turn's number and its ``turn/start``'s seq, if a turn is open."""
    open_turn: tuple[int, int] | None = None
    for event in events:
        if event.type == "turn/start":
            open_turn = (event.data["turn"], event.seq)
        elif event.type == "turn/end":
            open_turn = None
    return open_turn


def _prefix_end(events: Sequence[Event]) -> int:
    """Length of the longest prefix that does not cut a turn in two.

    Inbox splices outside a turn belong to the turn that will claim the message, so
    they never extend the prefix: a fork must not hold a queued message nobody claims.
    """
    end = 0
    in_turn = False
    for index, event in enumerate(events):
        if event.type == "turn/start":
            in_turn = True
        elif event.type == "turn/end":
            in_turn = False
        if not in_turn and event.type != "agent/inbox/spliced":
            end = index + 1
    return end
