"""``HostHandler``: the runtime's side of a DSH host, beyond the dock's ``select``.

It keeps

- the latest live connection of the DSH host (``host``) and the live agents the host
  announced (``agents``: ``agent/created``, ``agent/status``, ``agent/inbox/*``,
  ``agent/disposed``);
- a mirror of every session's events (``sessions``), checking that each session's ``seq``
  is contiguous from 0: a jump is recorded in ``gaps`` (and the mirror goes on from the
  new seq); an event at or below the last mirrored seq is a repeat and is dropped (and
  counted in ``repeats``). After each (re)connection the host asks how far the mirror
  reaches (``mirrored``) and sends each session from the next seq on, so repeats are rare:
  an older host, or a host whose question failed, sends every log from 0 again. The
  mirror of a session whose agents were all disposed is kept for the last
  ``RETAINED_CLOSED_SESSIONS`` such sessions only (DSH's own log is the record), and only
  the last ``RETAINED_GAPS`` gaps are kept;
- a registry of pre-step gates: ``gate(agent_id, callback)`` answers DSH's pre-step
  verdict requests for that agent with ``callback(PreStep)`` (a ``Verdict`` or an
  awaitable of one); an agent without a gate enters. A callback that raises, or does not
  answer before the host's deadline, makes the host reject (it fails closed);

and sends the runtime's commands to the exact live agent on the host: ``followup``,
``wake`` and ``cancel`` (``HostCommandError`` when the host says no, ``NoHostError`` when
no host is connected; the connection's own ``BridgeClosedError``, ``RequestTimeoutError``
and ``RemoteError`` pass through), and ``answer_approval``: the answer to a question DSH's
approval service asked (``ApprovalClosedError`` when the host no longer holds it open).

The plugin does not announce its agents again after a reconnect, so ``agents`` outlives a
connection; an agent leaves it with ``agent/disposed``, or when the connection that
announced it is closed by the host itself (close code 1000: DSH unloads the plugin, as
``dsh headless`` does when its task is done, before it disposes its agents). A host
process that died without saying so leaves its agents behind (``HostAgent.connection_id``
tells which connection announced each one).

What hosts can make it keep is capped, per connection (what that connection brought in)
and in all: mirrored sessions (``MAX_SESSIONS_PER_CONNECTION``, ``MAX_SESSIONS``), live
agents (``MAX_AGENTS_PER_CONNECTION``, ``MAX_AGENTS``) and the messages of one agent's
inbox (``MAX_INBOX``). At a cap, room is made by letting go of the oldest session no live
agent belongs to (of that connection, at its own cap), or of the oldest agent left behind
by a connection that ended; when there is none, the items that needed room are not kept
(the rest of the frame is) and the host gets an ``error`` frame: ``TOO_MANY_SESSIONS``,
``TOO_MANY_AGENTS`` or ``INBOX_FULL`` (``LimitError``). So what a peer that went away left
behind is bounded by the caps in all.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from loopdock.actors import LiveEvent, Placement
from loopdock.actors.dock import LoopDock
from loopdock.runtime import (
    ApprovalClosedError,
    Changes,
    Event,
    InvalidSessionIdError,
    LoopdockError,
    check_session_id,
)

from ._connection import CLOSE_NORMAL
from ._dock_select import DockSelectHandler
from ._errors import LimitError, RemoteError
from ._handler import Disconnect, HandlerLayer, Peer
from ._ledger import Ledger
from ._messages import (
    Ack,
    AnswerApproval,
    ApprovalDone,
    Cancel,
    Followup,
    Mirrored,
    MirroredSeqs,
    PreStep,
    SessionEvent,
    Verdict,
    Wake,
)
from ._server import REQUEST_TIMEOUT

#: How many closed sessions (every agent disposed) keep their mirror, newest first.
RETAINED_CLOSED_SESSIONS = 100
#: How many of the newest gaps ``gaps`` keeps.
RETAINED_GAPS = 1000
#: Sessions mirrored in all, and per connection (those it brought in that are still kept).
MAX_SESSIONS = 4096
MAX_SESSIONS_PER_CONNECTION = 1024
#: Live agents kept in all, and per connection (those it announced that are still kept).
MAX_AGENTS = 4096
MAX_AGENTS_PER_CONNECTION = 1024
#: Messages kept of one agent's inbox (inserted and not yet claimed or discarded).
MAX_INBOX = 1024

def _session_id(value: object) -> str | None:
    """``value`` if it is a session id the runtime's API accepts, else None."""
    try:
        return check_session_id(value)
    except InvalidSessionIdError:
        return None


#: ``callback(PreStep) -> Verdict | Awaitable[Verdict]``
Gate = Callable[[PreStep], "Verdict | Awaitable[Verdict]"]


class NoHostError(LoopdockError):
    """Raised by a command when no DSH host is connected."""

    code = "NO_HOST"


class HostCommandError(LoopdockError):
    """Raised by a command the host understood and could not carry out (a negative ack);
    ``code`` is the host's (e.g. ``NOT_LIVE``: no live agent with that id)."""

    def __init__(self, code: str, message: str, *, command: str, agent_id: str) -> None:
        super().__init__(f"{command} {agent_id}: {message}")
        self.code = code
        self.command = command
        self.agent_id = agent_id


@attrs.define
class HostAgent:
    """A live DSH agent as the host announced it."""

    id: str
    session_id: str
    #: ``startup`` or ``resume`` (what ``agent/created`` said), None if it was not seen
    source: str | None
    #: the connection that announced it
    connection_id: str
    #: ``idle`` or ``running`` (the last ``agent/status``), None before any
    status: str | None = None
    #: counts status changes, for observers that must not miss one
    status_version: int = 0
    #: message id -> message: inserted into its inbox and not yet claimed or discarded
    inbox: dict[str, Mapping[str, Any]] = attrs.field(factory=dict)
    #: the session's working directory (its header's ``cwd``), None if not announced
    cwd: str | None = None
    #: how many of a seeded (forked) session's events were copied from its parent
    inherited_events: int | None = None


@attrs.frozen
class Gap:
    """Session ``session_id`` jumped from ``expected`` to ``got``: events were lost."""

    session_id: str
    expected: int
    got: int


class HostHandler(HandlerLayer):
    """Mirrors the host's agents and sessions, gates pre-steps per agent and sends
    commands (see the module docstring); ``select`` goes on to a ``DockSelectHandler``
    on ``dock``."""

    def __init__(self, dock: LoopDock) -> None:
        super().__init__(DockSelectHandler(dock))
        #: the latest live DSH-host connection, None while there is none
        self.host: Peer | None = None
        #: agent id -> what the host announced (see the module docstring)
        self.agents: dict[str, HostAgent] = {}
        #: session id -> its events, in seq order
        self.sessions: dict[str, list[Event]] = {}
        #: session id -> its working directory as a host announced it (its header's ``cwd``),
        #: kept as long as the session's mirror: the session's project after its agents end
        self.cwds: dict[str, str] = {}
        #: the newest ``RETAINED_GAPS`` seq jumps seen, in arrival order
        self.gaps: list[Gap] = []
        #: events dropped as already mirrored (at or below their session's last seq)
        self.repeats = 0
        self._closed_sessions: dict[str, None] = {}  # oldest first: mirrors to let go of
        self._session_ledger = Ledger()  # who brought in each session of ``sessions``
        self._agent_ledger = Ledger()  # who announced each agent of ``agents``
        self._gates: dict[str, Gate] = {}
        self._changes = Changes()

    # -- waiting for the host ------------------------------------------------------------

    def poke(self) -> None:
        """Wake every ``wait_until`` to check its predicate again."""
        self._changes.notify()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; it is checked again after each change the
        host makes (a connection, events, live items). Bound it with a trio timeout."""
        await self._changes.wait_until(predicate)

    # -- connections ----------------------------------------------------------------------

    def connected(self, conn: Peer) -> None:
        super().connected(conn)
        if conn.role == "dsh-host":
            self.host = conn
            self.poke()

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        super().disconnected(conn, reason)
        if conn.role == "dsh-host" and reason.kind == "peer-closed" and reason.close_code == CLOSE_NORMAL:
            # The plugin closes the bridge itself only when DSH unloads it (``dsh headless``
            # exits after its task, before DSH disposes its agents): it will say nothing
            # more of the agents it announced, so they are gone, as after agent/disposed.
            # A host that lost its connection keeps them for its reconnection.
            for agent_id in [a.id for a in self.agents.values() if a.connection_id == conn.id]:
                self._drop_agent(agent_id)
        self._session_ledger.release(conn.id)
        self._agent_ledger.release(conn.id)
        if self.host is conn:
            self.host = None
        self.poke()

    # -- the mirror -------------------------------------------------------------------------

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None:
        await super().on_events(conn, items)
        refused: dict[str, None] = {}
        for item in items:
            log = self.sessions.get(item.session_id)
            if log is None:
                if item.session_id in refused or not self._admit_session(conn, item.session_id):
                    refused[item.session_id] = None
                    continue
                log = self.sessions[item.session_id] = []
            expected = log[-1].seq + 1 if log else 0
            seq = item.event.seq
            if seq < expected:
                self.repeats += 1  # e.g. the whole log again, from a host that did not ask
                continue
            if seq > expected:
                self.gaps.append(Gap(item.session_id, expected, seq))
                if len(self.gaps) > RETAINED_GAPS:
                    del self.gaps[0]
            log.append(item.event)
        self.poke()
        if refused:
            raise LimitError(
                "TOO_MANY_SESSIONS",
                f"{len(refused)} new session(s) not mirrored (the first: {next(iter(refused))!r}): the runtime "
                f"mirrors at most {MAX_SESSIONS_PER_CONNECTION} sessions per connection and {MAX_SESSIONS} "
                "in all, and none it mirrors could be let go of (each has a live agent)",
            )

    def _admit_session(self, conn: Peer, session_id: str) -> bool:
        """Make room to mirror one more session, brought in by ``conn``; False if none can be made."""
        ledger = self._session_ledger
        if ledger.held_by(conn.id) >= MAX_SESSIONS_PER_CONNECTION:
            victim = self._spare_session(lambda sid: ledger.owner(sid) == conn.id)
            if victim is None:
                return False
            self._forget_session(victim)
        if len(ledger) >= MAX_SESSIONS:
            victim = self._spare_session(lambda sid: True)
            if victim is None:
                return False
            self._forget_session(victim)
        ledger.add(session_id, conn.id)
        return True

    def _spare_session(self, among: Callable[[str], bool]) -> str | None:
        """The session (of those ``among`` accepts) to let go of: the oldest no agent belongs
        to, else the oldest whose agents were all left behind by connections that ended."""
        holders: dict[str, list[str]] = {}
        for agent in self.agents.values():
            holders.setdefault(agent.session_id, []).append(agent.id)
        ledger = self._session_ledger
        spare = ledger.oldest(lambda sid: sid not in holders and among(sid))
        if spare is None:
            spare = ledger.oldest(
                lambda sid: among(sid) and all(self._agent_ledger.owner(aid) is None for aid in holders[sid])
            )
        return spare

    def _forget_session(self, session_id: str) -> None:
        """Let go of a session's mirror, and of the agents left behind on it."""
        self.cwds.pop(session_id, None)
        for agent_id in [agent.id for agent in self.agents.values() if agent.session_id == session_id]:
            del self.agents[agent_id]
            self._agent_ledger.discard(agent_id)
        self.sessions.pop(session_id, None)
        self._closed_sessions.pop(session_id, None)
        self._session_ledger.discard(session_id)

    async def on_mirrored(self, conn: Peer, request: Mirrored) -> MirroredSeqs:
        """The last seq mirrored of each asked-for session this mirror holds."""
        return MirroredSeqs(
            {sid: log[-1].seq for sid in request.session_ids if (log := self.sessions.get(sid))}
        )

    async def on_live(self, conn: Peer, items: Sequence[LiveEvent]) -> None:
        await super().on_live(conn, items)
        refused: tuple[str, str] | None = None  # (code, message) of the first refusal
        for item in items:
            try:
                self._apply_live(conn, item)
            except LimitError as exc:
                # The others are still taken; the first says why. Its text is kept, not the
                # error: its traceback holds this frame, and so the items, in a reference
                # cycle that only the cyclic collector would free.
                refused = refused or (exc.code, str(exc))
        self.poke()
        if refused is not None:
            raise LimitError(*refused)

    def _new_agent(self, conn: Peer, agent_id: str) -> HostAgent:
        """A new ``HostAgent`` announced by ``conn``, kept if there is room (LimitError if not)."""
        ledger = self._agent_ledger
        if agent_id not in ledger:
            if ledger.held_by(conn.id) >= MAX_AGENTS_PER_CONNECTION:
                raise LimitError(
                    "TOO_MANY_AGENTS", f"agent {agent_id!r} not kept: at most {MAX_AGENTS_PER_CONNECTION} live "
                    "agents per connection",
                )
            if len(ledger) >= MAX_AGENTS:
                # Room goes to a live connection before agents a connection that ended left behind.
                victim = ledger.oldest(lambda aid: ledger.owner(aid) is None)
                if victim is None:
                    raise LimitError(
                        "TOO_MANY_AGENTS", f"agent {agent_id!r} not kept: at most {MAX_AGENTS} live agents in all",
                    )
                self._drop_agent(victim)
        ledger.add(agent_id, conn.id)
        agent = self.agents[agent_id] = HostAgent(agent_id, agent_id, None, conn.id)
        return agent

    def _drop_agent(self, agent_id: str) -> None:
        gone = self.agents.pop(agent_id, None)
        self._agent_ledger.discard(agent_id)
        if gone is not None:
            self._session_closed(gone.session_id)

    def _apply_live(self, conn: Peer, item: LiveEvent) -> None:
        data = item.data
        if item.type == "agent/created":
            source = data.get("source")
            session_id = _session_id(data.get("sessionId"))
            cwd, inherited = data.get("cwd"), data.get("inheritedEvents")
            known = self.agents.get(item.agent_id)
            if known is None or known.source is not None or known.connection_id != conn.id:
                known = self._new_agent(conn, item.agent_id)
            # (else: learned from its status or inbox a moment ago, the same live agent)
            known.source = source if isinstance(source, str) else None
            known.session_id = session_id if session_id is not None else item.agent_id
            self._closed_sessions.pop(known.session_id, None)
            known.cwd = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None
            if known.cwd is not None:
                self.cwds[known.session_id] = known.cwd
            valid = isinstance(inherited, int) and not isinstance(inherited, bool) and inherited >= 0
            known.inherited_events = inherited if valid else None
            return
        if item.type == "agent/disposed":
            self._drop_agent(item.agent_id)
            return
        agent = self.agents.get(item.agent_id)
        if agent is None:  # announced before this runtime listened: learn it now
            agent = self._new_agent(conn, item.agent_id)
        if item.type == "agent/status":
            status = data.get("status")
            status = status if isinstance(status, str) else None
            if status != agent.status:
                agent.status = status
                agent.status_version += 1
        elif item.type.startswith("agent/inbox/"):
            message = data.get("message")
            message_id = message.get("id") if isinstance(message, Mapping) else None
            if not isinstance(message_id, str):
                return
            if item.type == "agent/inbox/inserted" and isinstance(message, Mapping):
                if len(agent.inbox) >= MAX_INBOX and message_id not in agent.inbox:
                    raise LimitError(
                        "INBOX_FULL", f"message {message_id[:100]!r} of agent {agent.id!r} not kept: at most "
                        f"{MAX_INBOX} messages of one inbox are",
                    )
                agent.inbox[message_id] = message
            elif item.type in ("agent/inbox/claimed", "agent/inbox/discarded"):
                agent.inbox.pop(message_id, None)

    def _session_closed(self, session_id: str) -> None:
        if any(agent.session_id == session_id for agent in self.agents.values()):
            return
        self._closed_sessions[session_id] = None
        while len(self._closed_sessions) > RETAINED_CLOSED_SESSIONS:
            self._forget_session(next(iter(self._closed_sessions)))

    # -- pre-step gates ---------------------------------------------------------------------

    def gate(self, agent_id: str, callback: Gate | None) -> Callable[[], None]:
        """Answer ``agent_id``'s pre-step verdict requests with ``callback`` (replacing
        any earlier one); ``None`` removes the gate (its pre-steps enter again). Returns a
        disposer that removes exactly this gate (not a later one)."""
        if callback is None:
            self._gates.pop(agent_id, None)
        else:
            self._gates[agent_id] = callback

        def dispose() -> None:
            if callback is not None and self._gates.get(agent_id) is callback:
                del self._gates[agent_id]

        return dispose

    async def on_pre_step(self, conn: Peer, request: PreStep) -> Verdict:
        callback = self._gates.get(request.agent_id)
        if callback is None:
            return await super().on_pre_step(conn, request)
        verdict = callback(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if not isinstance(verdict, Verdict):
            raise TypeError(f"the pre-step gate of {request.agent_id} answered {verdict!r}")
        return verdict

    # -- commands ------------------------------------------------------------------------------

    async def _command(self, message: Followup | Wake | Cancel, reply_timeout: float) -> None:
        conn = self.host
        name = type(message).__name__.lower()
        if conn is None or conn.closed is not None:
            raise NoHostError(f"no DSH host is connected: cannot {name} {message.agent_id}")
        reply = await conn.request(message, reply_timeout)
        if not isinstance(reply, Ack):
            raise HostCommandError("BAD_REPLY", f"the host answered {reply!r}", command=name, agent_id=message.agent_id)
        if not reply.ok:
            error = reply.error
            raise HostCommandError(
                error.code if error is not None else "COMMAND_FAILED",
                error.message if error is not None else "the host refused",
                command=name,
                agent_id=message.agent_id,
            )

    async def followup(
        self,
        agent_id: str,
        message: Mapping[str, Any],
        placement: Placement = "followup",
        *,
        reply_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        """Put ``message`` (a DSH message; its ``source`` a producer-owned kind) into the
        live agent's inbox: ``followup`` (next turn, wakes it), ``steer`` or ``inject``.
        RequestTimeoutError if the host does not answer within ``reply_timeout`` seconds
        (the same for ``wake`` and ``cancel``)."""
        await self._command(Followup(agent_id, message, placement), reply_timeout)

    async def wake(self, agent_id: str, *, reply_timeout: float = REQUEST_TIMEOUT) -> None:
        """Wake the live agent (its inbox stalls after a pre-step reject)."""
        await self._command(Wake(agent_id), reply_timeout)

    async def cancel(
        self, agent_id: str, cause: str, *, keep_inbox: bool = True, reply_timeout: float = REQUEST_TIMEOUT
    ) -> None:
        """Cancel the live agent's turn (its inbox is kept unless ``keep_inbox`` is false)."""
        await self._command(Cancel(agent_id, cause, keep_inbox), reply_timeout)

    async def answer_approval(
        self,
        agent_id: str,
        approval_id: str,
        decision: str,
        reason: str | None = None,
        *,
        reply_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        """Answer the open question ``approval_id`` (DSH's id, from its ``approval/asked``)
        of the live agent: ``approve`` (DSH's outcome ``allowed-once``) or ``refuse``
        (``rejected``; DSH keeps no reason). Returns once the host says DSH logged the
        decision; ApprovalClosedError if the host does not hold the question open (DSH's own
        surfaces answered first, the turn was cancelled, the question is unknown)."""
        if decision not in ("approve", "refuse"):
            raise ValueError(f"a DSH approval is approved or refused, not {decision!r}")
        conn = self.host
        if conn is None or conn.closed is not None:
            raise NoHostError(f"no DSH host is connected: cannot answer approval {approval_id} of {agent_id}")
        message = AnswerApproval(agent_id, approval_id, decision, reason)  # type: ignore[arg-type]
        try:
            reply = await conn.request(message, reply_timeout)
        except RemoteError as exc:
            if exc.code == ApprovalClosedError.code:
                raise ApprovalClosedError(str(exc)) from None
            raise
        if not isinstance(reply, ApprovalDone):
            raise HostCommandError("BAD_REPLY", f"the host answered {reply!r}", command="approval", agent_id=agent_id)
