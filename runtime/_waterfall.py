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
        self._listeners: list[Listener[V, R]] = []

    def add(self, listener: Listener[V, R], *, prepend: bool = False) -> Callable[[], None]:
        """Add a listener (last, or first with ``prepend``: the outermost one sees the
        final answer of all others); returns an idempotent disposer for exactly this one."""
        entry = _Entry(listener)
        if prepend:
            self._listeners.insert(0, entry)  # type: ignore[arg-type]
        else:
            self._listeners.append(entry)  # type: ignore[arg-type]

        def dispose() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)  # type: ignore[arg-type]

        return dispose

    def __len__(self) -> int:
        return len(self._listeners)

    async def run(self, value: V, final: Callable[[V], Awaitable[R]]) -> R:
        """Run the chain on ``value``; ``final`` answers after the last listener."""
        if not self._listeners:
            return await final(value)
        # A snapshot: a listener added mid-run joins the next run.
        return await _Chain(tuple(entry.fn for entry in self._listeners), final, 0)(value)


class _Chain:
    """``next`` for the listener at ``index``: calls the rest of the chain (one small
    object per listener and run, instead of a closure and a coroutine frame more)."""

    __slots__ = ("listeners", "final", "index")

    def __init__(self, listeners: tuple, final: Callable, index: int) -> None:  # type: ignore[type-arg]
        self.listeners = listeners
        self.final = final
        self.index = index

    def __call__(self, value):  # type: ignore[no-untyped-def]
        index = self.index
        if index == len(self.listeners):
            return self.final(value)
        return self.listeners[index](value, _Chain(self.listeners, self.final, index + 1))


class _Entry:
    """Wraps a listener so the same function added twice gets two removable entries."""

    __slots__ = ("fn",)

    def __init__(self, fn: Listener) -> None:  # type: ignore[type-arg]
        self.fn = fn

    def __call__(self, value, next_):  # type: ignore[no-untyped-def]
        return self.fn(value, next_)
