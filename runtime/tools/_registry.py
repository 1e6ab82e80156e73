"""Which tools exist (``ToolRegistry``) and which ones one agent may call (``AgentTools``).

The registry is runtime-wide and long-lived. An ``AgentTools`` is one agent's view of
it: a fixed subset chosen at construction, plus agent-scoped tools and restrictions
that setups add and that are undone by their disposers or, all at once, on rollback.
The model is only ever shown, and only ever gets to run, what ``visible()`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import attrs
import trio

from .._changes import Changes
from .._errors import DuplicateToolError, UnknownToolError
from .._logging import get_logger
from ..models._adapter import ToolSpec
from ._tool import Tool

_log = get_logger(__name__)

Disposer = Callable[[], None]

#: Worker threads the runtime's tool calls may hold at once (``ToolContext.threads``).
#: Apart from trio's default pool (40), which the store commits and loads in: a file
#: tool stuck on a hung mount keeps its thread until the filesystem answers, and 40 of
#: them would otherwise leave no thread to commit in, for every agent of the runtime.
TOOL_THREADS = 64


@attrs.define(eq=False)
class _Slot:
    """One registration. Disposers compare slots by identity, so a disposer can never
    remove a later registration of the same name (or even of the same Tool object)."""

    tool: Tool


@attrs.define(eq=False)
class _Restriction:
    allow: frozenset[str] | None
    deny: frozenset[str]


def _check_tool(tool: object) -> Tool:
    if not isinstance(tool, Tool):
        raise TypeError(f"expected a Tool, got {type(tool).__name__}")
    if not isinstance(tool.name, str) or not tool.name:
        raise TypeError(f"a tool name must be a non-empty string, got {tool.name!r}")
    return tool


def _names_arg(value: object, what: str) -> frozenset[str]:
    # A bare string is a Collection[str] of its characters; accepting it would turn
    # allow="shell" into allow={"s", "h", "e", "l"} and fail confusingly later.
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a collection of tool names, got {value!r}")
    names = frozenset(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what} must contain only strings, got {name!r}")
    return names


def _unknown(names: Iterable[str], known: Iterable[str], what: str) -> UnknownToolError:
    missing = ", ".join(repr(n) for n in sorted(names))
    registered = ", ".join(sorted(known)) or "(none)"
    return UnknownToolError(f"{what} names unknown tool(s) {missing}; registered: {registered}")


class ToolRegistry:
    """The runtime-wide set of tools, keyed by unique name."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self.version = 0  # bumped on every change: agents' views cache on it
        self.threads = trio.CapacityLimiter(TOOL_THREADS)  # see TOOL_THREADS

    def register(self, tool: Tool) -> Disposer:
        """Add ``tool``; the returned disposer removes exactly this registration.

        Calling the disposer again, or after the name was re-registered, does nothing.
        """
        tool = _check_tool(tool)
        if tool.name in self._slots:
            raise DuplicateToolError(f"tool {tool.name!r} is already registered")
        slot = _Slot(tool)
        self._slots[tool.name] = slot
        self.version += 1

        def dispose() -> None:
            if self._slots.get(tool.name) is slot:
                del self._slots[tool.name]
                self.version += 1

        return dispose

    def get(self, name: str) -> Tool:
        slot = self._slots.get(name)
        if slot is None:
            raise _unknown([name], self._slots, "lookup")
        return slot.tool

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._slots))

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def __len__(self) -> int:
        return len(self._slots)


class AgentTools:
    """One agent's tools: enabled base tools + scoped tools, narrowed by restrictions.

    ``enabled=None`` follows the base registry live (a base tool registered later is
    visible); an explicit ``enabled`` is checked once, here, and a base tool that is
    later unregistered simply stops being visible.
    """

    def __init__(self, base: ToolRegistry, enabled: Collection[str] | None = None) -> None:
        self._base = base
        self._enabled: frozenset[str] | None = None
        if enabled is not None:
            names = _names_arg(enabled, "enabled")
            missing = [n for n in names if n not in base]
            if missing:
                raise _unknown(missing, base.names(), "enabled")
            self._enabled = names
        self._scoped: dict[str, _Slot] = {}
        # Insertion-ordered; order does not matter for the result (restrictions intersect).
        self._restrictions: list[_Restriction] = []
        # visible() is asked for on every model request and every tool call; it is
        # recomputed only when the registry or this view changed.
        self._version = 0
        self._cache_key: tuple[int, int] | None = None
        self._visible: tuple[Tool, ...] = ()
        self._by_name: dict[str, Tool] = {}
        self._specs: tuple[ToolSpec, ...] = ()
        self._changes: Changes | None = None  # made by the first waiter: most views have none

    def _changed(self) -> None:
        self._version += 1
        if self._changes is not None:
            self._changes.notify()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, checked now and after each change of this view
        (a scoped tool registered or removed, a restriction added or lifted)."""
        if self._changes is None:
            self._changes = Changes()
        await self._changes.wait_until(predicate)

    @property
    def threads(self) -> trio.CapacityLimiter:
        """The runtime's pool of worker threads for tool calls (``TOOL_THREADS``)."""
        return self._base.threads

    # -- changes --------------------------------------------------------------------

    def register(self, tool: Tool) -> Disposer:
        """Add an agent-scoped tool; the disposer removes exactly this registration.

        A scoped tool may not reuse the name of any base-registry tool (enabled here or
        not): one name must mean one tool in logs and in the model's transcript.
        """
        tool = _check_tool(tool)
        if tool.name in self._base:
            raise DuplicateToolError(
                f"tool {tool.name!r} is already registered runtime-wide; "
                "an agent-scoped tool may not shadow it"
            )
        if tool.name in self._scoped:
            raise DuplicateToolError(f"tool {tool.name!r} is already registered for this agent")
        slot = _Slot(tool)
        self._scoped[tool.name] = slot
        self._changed()

        def dispose() -> None:
            if self._scoped.get(tool.name) is slot:
                del self._scoped[tool.name]
                self._changed()

        return dispose

    def restrict(
        self, allow: Collection[str] | None = None, deny: Collection[str] = ()
    ) -> Disposer:
        """Narrow the visible set to ``allow`` (if given) minus ``deny``.

        Active restrictions intersect. Every name must be registered (base or scoped)
        now: a restriction that silently refers to nothing is almost always a typo.
        """
        allow_names = None if allow is None else _names_arg(allow, "allow")
        deny_names = _names_arg(deny, "deny")
        known = set(self._base.names()) | set(self._scoped)
        missing = ((allow_names or frozenset()) | deny_names) - known
        if missing:
            raise _unknown(missing, known, "restriction")
        restriction = _Restriction(allow_names, deny_names)
        self._restrictions.append(restriction)
        self._changed()

        def dispose() -> None:
            # Identity, not equality: two equal restrictions are still two restrictions.
            for i, active in enumerate(self._restrictions):
                if active is restriction:
                    del self._restrictions[i]
                    self._changed()
                    return

        return dispose

    def dispose_scoped(self) -> None:
        """Drop every scoped tool and every restriction (rollback / agent dispose).

        Their disposers become no-ops.
        """
        if self._scoped or self._restrictions:
            _log.debug(
                "tools.dispose_scoped",
                scoped=sorted(self._scoped),
                restrictions=len(self._restrictions),
            )
        self._scoped.clear()
        self._restrictions.clear()
        self._changed()

    # -- views ----------------------------------------------------------------------

    def _candidates(self) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        for name in self._base.names():
            if self._enabled is None or name in self._enabled:
                tools[name] = self._base.get(name)
        # A base tool registered *after* a scoped one of the same name cannot be refused
        # (the registry does not know the agents); the agent's own tool keeps the name.
        for name, slot in self._scoped.items():
            tools[name] = slot.tool
        return tools

    def _allowed(self, name: str) -> bool:
        for r in self._restrictions:
            if r.allow is not None and name not in r.allow:
                return False
            if name in r.deny:
                return False
        return True

    def visible(self) -> tuple[Tool, ...]:
        """The tools the model may call, sorted by name (stable prompts, stable logs)."""
        key = (self._base.version, self._version)
        if key != self._cache_key:
            tools = self._candidates()
            self._visible = tuple(tools[n] for n in sorted(tools) if self._allowed(n))
            self._by_name = {tool.name: tool for tool in self._visible}
            self._specs = tuple(tool.spec for tool in self._visible)
            self._cache_key = key
        return self._visible

    def specs(self) -> tuple[ToolSpec, ...]:
        """The visible tools' specs (what every model request carries: built once per
        change of the tool set, not per request)."""
        self.visible()
        return self._specs

    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.visible())

    def lookup(self, name: str) -> Tool | None:
        """The visible tool called ``name``, else None (hidden and unknown look alike,
        so a model cannot probe for tools it was not shown)."""
        if not isinstance(name, str):
            return None
        self.visible()
        return self._by_name.get(name)
