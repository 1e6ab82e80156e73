"""``DockSelectHandler``: the runtime's loop dock answering a DSH host's ``select``.

In dock mode the DSH plugin asks, for every create and resume, which loop and driver the
agent runs on. The answer comes from the runtime's ``LoopDock.decide`` (the same rules and
errors as ``rt.dock.create_agent``/``resume``, e.g. LOOP_SWITCH); DSH runs the agent and
records the binding in its own session log.

A resume is judged against the session's durable binding: the one the host read from
DSH's own session log and sent with ``select`` (``Select.binding``). The binding this
handler decided earlier, kept in memory, is only a fallback for a host that sent none
(e.g. an older plugin). If both exist and disagree, the host's wins: DSH's log is the
durable record (the binding is written there once and never overwritten), and memory can
be stale, e.g. after the session was resumed through another runtime. A binding that does
not follow the dock's id grammar counts as none, as a malformed one in a log does.

Being a fallback, the memory is capped rather than refused: past ``MAX_BINDINGS_PER_CONNECTION``
bindings decided for one connection, that connection's oldest is forgotten, and past
``MAX_BINDINGS`` in all (those of connections that ended included) the oldest of all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from loopdock.actors.dock import LoopDock, Route, parse_binding
from loopdock.runtime import AgentOptions, snake

from ._handler import BridgeHandler, Disconnect, HandlerLayer, Peer
from ._ledger import Ledger
from ._messages import Select, Selection, SelectionParts

#: Bindings remembered in all, and per connection (those decided for its selects).
MAX_BINDINGS = 4096
MAX_BINDINGS_PER_CONNECTION = 1024

_OPTION_NAMES = frozenset(f.name for f in attrs.fields(AgentOptions))


def _known_options(value: Mapping[str, Any]) -> dict[str, Any]:
    """The DSH agent options the dock reads (DSH's own extra keys are not ours to judge)."""
    return {key: item for key, item in value.items() if snake(key) in _OPTION_NAMES}


class DockSelectHandler(HandlerLayer):
    """A handler whose ``on_select`` answers from the runtime's dock; everything else goes
    on to ``inner`` (by default a ``NullHandler``: events dropped, every pre-step enters)."""

    def __init__(self, dock: LoopDock, inner: BridgeHandler | None = None) -> None:
        if not isinstance(dock, LoopDock):
            # Found at the first select otherwise, where DSH only hears INTERNAL_ERROR.
            raise TypeError(f"the bridge answers select from the runtime's loop dock (rt.dock), not {type(dock).__name__}")
        super().__init__(inner)
        self.dock = dock
        #: session id -> the binding decided for it, or the durable one the host sent on a
        #: resume (in memory: a fallback only, see the module docstring)
        self.bindings: dict[str, Route] = {}
        self._ledger = Ledger()  # which connection's select decided each binding

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        super().disconnected(conn, reason)
        self._ledger.release(conn.id)

    async def on_select(self, conn: Peer, request: Select) -> Selection:
        options = _known_options(request.agent_options)
        persisted = self.persisted(request) if request.op == "resume" else None
        choice = self.dock.decide(
            request.op, request.session_id, options, request.agent_preset, persisted=persisted
        )
        self._remember(conn, request.session_id, Route(choice.loop, choice.driver))
        return Selection(
            choice.loop,
            choice.driver,
            SelectionParts(provider=choice.provider, model=choice.model),
        )

    def _remember(self, conn: Peer, session_id: str, route: Route) -> None:
        ledger = self._ledger
        if session_id not in ledger:
            if ledger.held_by(conn.id) >= MAX_BINDINGS_PER_CONNECTION:
                self._forget(ledger.oldest(lambda sid: ledger.owner(sid) == conn.id))
            if len(ledger) >= MAX_BINDINGS:
                self._forget(ledger.oldest(lambda sid: True))
        ledger.add(session_id, conn.id)
        self.bindings[session_id] = route

    def _forget(self, session_id: str | None) -> None:
        if session_id is not None:
            self._ledger.discard(session_id)
            self.bindings.pop(session_id, None)

    def persisted(self, request: Select) -> Route | None:
        """The binding a resume is judged against: the host's (from DSH's log) if it sent
        a valid one, else the one remembered for the session, else None."""
        if request.binding is not None:
            stored = parse_binding(attrs.asdict(request.binding))
            if stored is not None:
                return stored
        return self.bindings.get(request.session_id)
