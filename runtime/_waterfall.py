"""Waterfalls: ordered middleware chains, DSH-style ``listener(value, next)``.

A listener may inspect or rewrite the value, call ``await next(value)`` to continue (and
look at what the rest of the chain answered), or answer without calling ``next`` to
short-circuit. A listener that does not call ``next`` vetoes everything after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

V = TypeVar("V")
R = TypeVar("R")

Next = Callable[[V], Awaitable[R]]
Listener = Callable[[V, Next[V, R]], Awaitable[R]]


class Waterfall(Generic[V, R]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[_Entry[V, R]] = []

    def add(self, listener: Listener[V, R], *, prepend: bool = False) -> Callable[[], None]:
        """Add a listener (last, or first with ``prepend``: the outermost one sees the
        final answer of all others); returns an idempotent disposer for exactly this one."""
        entry = _Entry(listener)
        if prepend:
            self._listeners.insert(0, entry)
        else:
            self._listeners.append(entry)

        def dispose() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)

        return dispose

    def __len__(self) -> int:
        return len(self._listeners)

    async def run(self, value: V, final: Next[V, R]) -> R:
        """Run the chain on ``value``; ``final`` answers after the last listener."""
        if not self._listeners:
            return await final(value)
        # A snapshot: a listener added mid-run joins the next run.
        return await _Chain(tuple(entry.fn for entry in self._listeners), final, 0)(value)


class _Chain(Generic[V, R]):
    """``next`` for the listener at ``index``: calls the rest of the chain (one small
    object per listener and run, instead of a closure and a coroutine frame more)."""

    __slots__ = ("listeners", "final", "index")

    def __init__(self, listeners: tuple[Listener[V, R], ...], final: Next[V, R], index: int) -> None:
        self.listeners = listeners
        self.final = final
        self.index = index

    def __call__(self, value: V) -> Awaitable[R]:
        index = self.index
        if index == len(self.listeners):
            return self.final(value)
        return self.listeners[index](value, _Chain(self.listeners, self.final, index + 1))


class _Entry(Generic[V, R]):
    """Wraps a listener so the same function added twice gets two removable entries."""

    __slots__ = ("fn",)

    def __init__(self, fn: Listener[V, R]) -> None:
        self.fn = fn
