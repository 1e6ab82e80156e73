"""``DockSelectHandler``: the runtime's loop dock answering a DSH host's ``select``.

In dock mode the DSH plugin asks, for every create and resume, which loop and driver the
agent runs on. The answer comes from the runtime's ``LoopDock.decide`` (the same rules and
errors as ``rt.dock.create_agent``/``resume``, e.g. LOOP_SWITCH); DSH runs the agent and
records the binding in its own session log.

A resume is judged against the binding this handler decided for the session, kept in
memory: a session created before this runtime process started resumes as if it had no
binding. A durable answer needs the host to send the binding stored in DSH's log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from runtime._options import _CAMEL, AgentOptions  # _CAMEL: AgentOptions' spelling rule
from runtime.dock import Route

from ._handler import NullHandler
from ._messages import Select, Selection, SelectionParts

if TYPE_CHECKING:
    from runtime._runtime import Runtime

    from ._server import BridgeConnection

_OPTION_NAMES = frozenset(f.name for f in attrs.fields(AgentOptions))


def _known_options(value: Mapping[str, Any]) -> dict[str, Any]:
    """The DSH agent options the dock reads (DSH's own extra keys are not ours to judge)."""
    return {key: item for key, item in value.items() if _CAMEL.sub("_", key).lower() in _OPTION_NAMES}


class DockSelectHandler(NullHandler):
    """A ``BridgeHandler`` whose ``on_select`` answers from ``rt.dock``; everything else
    is ``NullHandler``'s (events dropped, every pre-step enters; subclass to do more)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: session id -> the binding decided for it (in memory; see the module docstring)
        self.bindings: dict[str, Route] = {}

    async def on_select(self, conn: BridgeConnection, request: Select) -> Selection:
        options = _known_options(request.agent_options)
        persisted = self.bindings.get(request.session_id) if request.op == "resume" else None
        choice = self.rt.dock.decide(
            request.op, request.session_id, options, request.agent_preset, persisted=persisted
        )
        self.bindings.setdefault(request.session_id, Route(choice.loop, choice.driver))
        return Selection(
            choice.loop,
            choice.driver,
            SelectionParts(provider=choice.provider, model=choice.model),
        )
