"""``Changes``: a counter of state changes that tasks can wait on.

trio's ``Event`` fires once; an object whose state changes many times needs a fresh one
after each change, and observers that must not miss a change need a version to compare.
``Changes`` is that pattern written once:

    changes = Changes()
    changes.notify()                              # after every state change
    await changes.wait_until(lambda: obj.ready)   # predicate checked after each change
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class Changes:
    def __init__(self) -> None:
        self.version = 0  # how many times ``notify`` ran
        self._event = trio.Event()

    def notify(self) -> None:
        """Count one change and wake every waiter (never a checkpoint)."""
        self.version += 1
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Wait for the next ``notify``."""
        await self._event.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds, checking it again after every change.
        Always a checkpoint, as trio's conventions ask."""
        await trio.lowlevel.checkpoint()
        while not predicate():
            await self._event.wait()
