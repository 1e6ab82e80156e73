"""The wake-ups of passivated agents: timers their companions had armed, kept by the runtime.

A companion that arms a timer (the LoopX continuation's scheduler wait) loses it when its
agent is passivated: the timer was a task of the agent. Passivating the agent hands the
timer's deadline (trio's clock) to the lifecycle (``Kept.wake_at``), and ``Wakeups``, one
task and one heap for every passivated agent of a runtime, reactivates the agent at that
moment. The companion, rebuilt with what it kept, finds its deadline passed and does what
its timer would have done.

A wake-up names the passivation it was made for: one whose agent came back before it was
due (a message, ``activate()``) or was disposed is dropped when it comes due (its entry,
a few dozen bytes, stays in the heap until then: at most a day for LoopX's waits).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import trio

from loopdock.runtime import Changes

from ._agent import AgentActor
from ._passive import Passive


class Wakeups:
    """``wake(agent)`` is called when a wake-up of a still-passivated ``agent`` is due."""

    def __init__(self, wake: Callable[[AgentActor], None]) -> None:
        self._wake = wake
        self._heap: list[tuple[float, int, AgentActor, Passive]] = []
        self._scheduled = 0  # a tie-breaker: equal deadlines come due in scheduling order
        self._changes = Changes()
        self.fired = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, at: float, agent: AgentActor, passive: Passive) -> None:
        """Reactivate ``agent`` at ``at`` if it is still in this passivation then."""
        self._scheduled += 1
        entry = (at, self._scheduled, agent, passive)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:  # earlier than what the loop sleeps for
            self._changes.notify()

    async def run(self) -> None:
        while True:
            if not self._heap:
                await self._changes.wait()
                continue
            at = self._heap[0][0]
            if trio.current_time() < at:
                with trio.CancelScope(deadline=at):
                    await self._changes.wait()  # an earlier one, or the deadline
                continue
            _, _, agent, passive = heapq.heappop(self._heap)
            if agent._passive is passive and not passive.closed:
                self.fired += 1
                self._wake(agent)
