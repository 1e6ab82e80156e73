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
        listeners = list(self._listeners)  # a listener added mid-run joins the next run

        async def call(index: int, current: V) -> R:
            if index == len(listeners):
                return await final(current)
            return await listeners[index](current, lambda v: call(index + 1, v))

        return await call(0, value)


class _Entry:
    """Wraps a listener so the same function added twice gets two removable entries."""

    __slots__ = ("fn",)

    def __init__(self, fn: Listener) -> None:  # type: ignore[type-arg]
        self.fn = fn

    def __call__(self, value, next_):  # type: ignore[no-untyped-def]
        return self.fn(value, next_)
