"""``Changes``: a counter of state changes that tasks can wait on.

trio's ``Event`` fires once; an object whose state changes many times needs a fresh one
after each change, and observers that must not miss a change need a version to compare.
``Changes`` is that pattern written once:

    changes = Changes()
    changes.notify()                              # after every state change
    await changes.wait_until(lambda: obj.ready)   # predicate checked after each change

``notify`` checks each waiter's predicate itself and wakes only the waiters whose
predicate now holds. Waking a task to have it find its predicate still false costs a
scheduler round, and one object (an agent, the bridge's host) may have many waiters and
many changes that concern few of them. So call ``notify`` *after* a change is complete:
a predicate that is false at that moment is not checked again until the next
``notify``. A predicate must only read state (it runs inside ``notify``); if it raises,
its waiter is woken to raise it in its own task.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


def _always() -> bool:
    return True


class Changes:
    __slots__ = ("version", "_waiters")

    def __init__(self) -> None:
        self.version = 0  # how many times ``notify`` ran
        self._waiters: dict[trio.lowlevel.Task, Callable[[], bool]] = {}

    def notify(self) -> None:
        """Count one change and wake the waiters whose predicate holds now (never a
        checkpoint)."""
        self.version += 1
        if not self._waiters:
            return
        ready = []
        for task, predicate in list(self._waiters.items()):
            try:
                holds = predicate()
            except Exception:
                holds = True  # raised again in the waiter's own task
            if holds:
                ready.append(task)
        for task in ready:
            del self._waiters[task]
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        """Wait for the next ``notify``."""
        await self._park(_always)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds, checking it after every change. Always a
        checkpoint, as trio's conventions ask: an explicit one when it holds at once,
        else the wait itself."""
        if predicate():
            await trio.lowlevel.checkpoint()
            return
        while True:
            await self._park(predicate)
            if predicate():  # it held at the notify; a change since may have undone it
                return

    async def _park(self, predicate: Callable[[], bool]) -> None:
        task = trio.lowlevel.current_task()
        waiters = self._waiters
        waiters[task] = predicate

        def abort(_: object) -> trio.lowlevel.Abort:
            del waiters[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
