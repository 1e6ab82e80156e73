"""An agent's inbox: two lists (next turn, next step) with human input first.

Pure data, no I/O: the AgentActor logs every change. Placements:

- ``followup``: next turn, wakes an idle agent;
- ``steer``: next step, wakes an idle agent;
- ``inject``: next step, does not wake.

Human messages (source ``user`` / ``skill-invocation``) are always taken before automatic
ones, and a human message arriving cancels every automatic *reservation* still waiting in
the inbox (a reservation is admitted only when its message enters a model step).
"""

from __future__ import annotations

from typing import Literal

import attrs
import trio

from loopdock.runtime import LoopdockError, Message, is_human

Placement = Literal["followup", "steer", "inject"]
PLACEMENTS: tuple[Placement, ...] = ("followup", "steer", "inject")

ReservationState = Literal["pending", "admitted", "rejected", "cancelled"]


class InvalidReservationError(LoopdockError):
    """Raised when reserving a message whose source is missing or human (humans just send)."""

    code = "INVALID_RESERVATION"


@attrs.define(eq=False)
class Reservation:
    """An automatic message's claim on the agent, settled exactly once.

    ``await wait()`` returns the final state: ``admitted`` (it entered a model step),
    ``rejected`` (vetoed at pre-step), or ``cancelled`` (human input won, the agent was
    cancelled or disposed, or the owner withdrew it) with ``reason`` saying which.
    """

    message: Message
    placement: Placement
    state: ReservationState = "pending"
    reason: str | None = None
    _settled: trio.Event = attrs.field(factory=trio.Event, repr=False)

    def settle(self, state: ReservationState, reason: str | None = None) -> bool:
        """Give the reservation its final state (the agent's side, or a proxy's that
        carries out an agent elsewhere); False if it was settled already."""
        if self.state != "pending":
            return False
        self.state, self.reason = state, reason
        self._settled.set()
        return True

    async def wait(self) -> ReservationState:
        await self._settled.wait()
        return self.state


@attrs.frozen(eq=False)  # identity: the same message may be queued twice
class Entry:
    message: Message
    placement: Placement
    reservation: Reservation | None = None

    @property
    def human(self) -> bool:
        return self.message.source is not None and is_human(self.message.source)


def _take_first_human_first(queue: list[Entry]) -> Entry | None:
    for entry in queue:
        if entry.human:
            queue.remove(entry)
            return entry
    return queue.pop(0) if queue else None


class Inbox:
    def __init__(self) -> None:
        # Lists, not deques: queues hold a message or two, and an empty deque weighs
        # 600 bytes more than an empty list in each of thousands of idle agents.
        self.next_turn: list[Entry] = []
        self.next_step: list[Entry] = []

    def add(self, entry: Entry) -> list[Entry]:
        """Queue ``entry``; returns the reservations it displaced (human input wins)."""
        displaced: list[Entry] = []
        if entry.human:
            displaced = self.remove_reserved()
        (self.next_turn if entry.placement == "followup" else self.next_step).append(entry)
        return displaced

    def take_turn(self) -> Entry | None:
        """The message that opens the next turn: the oldest human one, else the oldest."""
        return _take_first_human_first(self.next_turn)

    def take_step(self) -> list[Entry]:
        """Everything queued for the next step, human messages first, FIFO otherwise."""
        if not self.next_step:  # a step of a turn nobody steers: most of them
            return []
        entries = sorted(self.next_step, key=lambda e: not e.human)  # stable
        self.next_step.clear()
        return entries

    def has_wakeable(self) -> bool:
        return bool(self.next_turn) or any(e.placement == "steer" for e in self.next_step)

    def has_step_input(self) -> bool:
        return bool(self.next_step)

    def has_human(self) -> bool:
        return any(e.human for e in self.entries())

    def entries(self) -> list[Entry]:
        return [*self.next_turn, *self.next_step]

    def remove_reserved(self) -> list[Entry]:
        """Take out every entry that carries a reservation, in one pass."""
        removed = [e for e in self.entries() if e.reservation is not None]
        if removed:
            self.next_turn = [e for e in self.next_turn if e.reservation is None]
            self.next_step = [e for e in self.next_step if e.reservation is None]
        return removed

    def remove(self, entry: Entry) -> bool:
        if entry in self.next_turn or entry in self.next_step:
            self._remove(entry)
            return True
        return False

    def clear(self) -> list[Entry]:
        removed = self.entries()
        self.next_turn.clear()
        self.next_step.clear()
        return removed

    def __len__(self) -> int:
        return len(self.next_turn) + len(self.next_step)

    def _remove(self, entry: Entry) -> None:
        (self.next_turn if entry in self.next_turn else self.next_step).remove(entry)
