"""AdmissionGate: runtime-wide admission of automatic work, so that people go first.

An agent's inbox takes a person's message before automatic ones, but that alone does not
help a person whose agent is idle while hundreds of *other* agents run automatic turns:
trio runs every runnable task once per scheduler round, so the person's turn waits for a
slice of every busy agent (at 200 busy agents, tens of milliseconds per round). The gate
bounds how many automatic turns compute at once; human turns never pass through it.

Policy:

- An automatic turn (opened by a message whose source is not a person, with no human
  input queued) takes a *slot* before it starts, and holds it while it computes. A human
  turn takes no slot: its latency is a scheduler round or two of at most ``slots``
  automatic turns, whatever the number of agents.
- A slot bounds how many automatic turns are *runnable*: a turn that only yields to
  the scheduler (the offline ``ping`` model's call, an in-memory tool) keeps it. A turn
  gives it back while it waits on the outside world (``Turn.outside()``: the react
  driver does so around every tool batch, and around model calls unless the adapter
  says ``cpu_bound = True``) and takes one again afterwards, so 10,000 agents waiting
  seconds on a model hold no slot between them.
- A slot held longer than ``stall`` seconds while others wait stops counting: its turn
  is presumably waiting on something the runtime cannot see (a pre-step listener calling
  a CLI, a custom driver's network call), and must not hold back everyone else.
- Waiters are served first come, first served; an agent waiting for a slot that gets a
  person's message stops waiting and runs the person's turn at once.
- No starvation either way: people never wait for a slot, and automatic work always has
  its ``slots`` (people do not take them), so it shares the CPU with people.
- While the gate is *held* (``hold(reason)``: the runtime does so while the session
  store cannot write, so that events do not pile up in memory) no automatic turn is
  admitted; turns already running go on, people's turns are not affected.

Nothing here is durable: which turn holds a slot is scheduling, not session state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

#: Automatic turns computing at once. Enough to keep a core busy through the store
#: thread's GIL hand-offs, few enough that a scheduler round stays ~1-2 ms (see
#: benchmarks/README.md, "Human priority").
AUTOMATIC_SLOTS = 8

#: A slot held this long (seconds) while others wait stops counting (see the module doc).
STALL = 0.02


@attrs.define(eq=False)
class Slot:
    """One automatic turn's permission to compute; ``release()`` exactly once."""

    gate: AdmissionGate
    acquired_at: float
    counted: bool = True  # False once released or stalled

    def release(self) -> None:
        if self.counted:
            self.counted = False
            self.gate._release(self)


@attrs.define(eq=False)
class _Waiter:
    wake: Callable[[], None]
    slot: Slot | None = None


class AdmissionGate:
    def __init__(self, slots: int = AUTOMATIC_SLOTS, *, stall: float = STALL) -> None:
        if slots < 1:
            raise ValueError(f"an admission gate needs at least one slot, not {slots}")
        self.slots = slots
        self.stall = stall
        self.in_use = 0
        self._holders: dict[Slot, None] = {}  # counted slots, oldest first
        self._waiters: deque[_Waiter] = deque()
        self._wakeup = trio.Event()  # the stall watcher: someone started waiting
        #: Why no automatic turn is admitted now (``hold``); None: admitting.
        self.held: str | None = None
        self._unheld = trio.Event()
        #: statistics (benchmarks and tests): slots granted, grants that had to wait,
        #: slots that stopped counting because they stalled.
        self.granted = 0
        self.waited = 0
        self.stalled = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def hold(self, reason: str | None) -> None:
        """Admit no automatic turn while ``reason`` is set; ``hold(None)`` admits again
        (waiters first, in order)."""
        self.held = reason
        if reason is None:
            self._unheld.set()
            self._hand_on()
        elif self._unheld.is_set():
            self._unheld = trio.Event()

    def try_acquire(self) -> Slot | None:
        """A slot at once if one is free and nobody waits for one; never a checkpoint."""
        if self.in_use < self.slots and not self._waiters and self.held is None:
            return self._grant()
        return None

    def enqueue(self, wake: Callable[[], None]) -> _Waiter:
        """Queue for a slot; ``wake()`` is called (synchronously) once it is granted."""
        waiter = _Waiter(wake)
        self._waiters.append(waiter)
        self._wakeup.set()
        return waiter

    def dequeue(self, waiter: _Waiter) -> None:
        """Stop waiting (the waiter went away or a person came first); a slot granted
        meanwhile is handed on."""
        if waiter.slot is not None:
            waiter.slot.release()
        else:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The stall watcher (one task per runtime): uncounts slots held past ``stall``
        while others wait for one."""
        task_status.started()
        while True:
            if self.held is not None:  # nothing is handed out: nothing to watch
                await self._unheld.wait()
                continue
            if not self._waiters:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            oldest = next(iter(self._holders), None)
            if oldest is None:  # no slot taken: hand them out
                self._hand_on()
                await trio.lowlevel.checkpoint()
                continue
            deadline = oldest.acquired_at + self.stall
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            if oldest.counted and self._holders.pop(oldest, False) is None:
                oldest.counted = False
                self.stalled += 1
                self.in_use -= 1
                self._hand_on()

    # -- internals --------------------------------------------------------------------

    def _grant(self) -> Slot:
        slot = Slot(self, trio.current_time())
        self.in_use += 1
        self.granted += 1
        self._holders[slot] = None
        return slot

    def _release(self, slot: Slot) -> None:
        if self._holders.pop(slot, False) is None:
            self.in_use -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters and self.in_use < self.slots and self.held is None:
            waiter = self._waiters.popleft()
            waiter.slot = self._grant()
            self.waited += 1
            waiter.wake()
