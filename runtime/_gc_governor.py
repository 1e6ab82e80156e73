"""GcGovernor: keeps the runtime's long-lived objects out of CPython's full collections.

A full (generation 2) collection walks every tracked object, and nothing runs meanwhile:
at 10,000 resumed agents that is millions of objects and pauses of hundreds of
milliseconds, which a person's turn waits through like everything else. Almost all of
those objects live as long as their agent, and the collector can find nothing to free
among them: the runtime's agents, sessions and turns make no reference cycles (reference
counting frees a disposed agent completely; tests/loopdock/test_gc_governor.py checks
it with the collector disabled). So the governor moves them out of the collector's
sight with ``gc.freeze()`` (the permanent generation, never walked), and collections,
full ones included, walk only what was allocated since the last freeze.

When it freezes (``gc.freeze()`` is O(1): it splices lists, so freezing often costs
nothing; what it freezes is whatever is live at that moment):

- after agents started (created or resumed): a burst is frozen as it goes, once per
  pass of the scheduler that saw agents start, and the last time after it settles, so
  that the young collections do not keep walking the new agents either;
- after every collection (in the collector's callback itself, while the governor's task
  runs): what survived it is long-lived enough to keep (the retained events and warm
  histories under steady turns; a turn's objects that happened to be in flight die by
  reference counting, frozen or not). Survivors then never pile up in the older generations: at 10,000 resuming agents, freezing
  only when survivors reached generation 2 left generation 1 at 120,000 objects and
  its collections at 60 ms, so every collection is in effect a young one (at most the
  10,000 objects of generation 0's threshold, give or take).

Its task waits for agents to start (and, once a minute at most, for a collection to
ask for the full-collection check below) rather than polling, so an idle runtime has no
timer (and a test's autojump clock does not leap while the runtime waits on a thread).

The trade-off: an object frozen and later part of unreachable cycles is not collected
while it stays frozen. The runtime's own objects make none (see above); a loop, tool or
setup from elsewhere that makes cycles per agent or per turn would leak them. So memory
stays bounded: when the frozen heap has grown ``full_factor`` times (4) since the last
full collection, and at most once per ``full_interval`` (10 minutes), the governor thaws
everything and runs one full collection (the long pause this otherwise avoids), then
freezes the survivors again. Frozen garbage is then at most three times the live heap,
and a runtime whose heap is steady never pays that pause.

That pause grows with the heap (25 s at about 1.6 GB of a million registered agents on a
loaded 2-core machine: benchmarks/PROFILE.md). So the factor backs off on evidence: a
full collection that finds almost nothing to free (under ``FOUND_LITTLE`` of the objects
it walked: no loop or tool of this process makes cycles worth the pause) doubles the
growth the next one waits for; one that finds more sets it back to ``full_factor``. A
process whose code makes no cycles pays the pause once per doubling of the factor, ever
more rarely; one whose code starts making cycles later keeps garbage bounded, by the
factor reached meanwhile.

Only a runtime that owns the collector governs it (``governed``): one that set the
threshold itself, in a process that had frozen nothing. ``Runtime.open(gc_threshold=None)``
(the default) leaves the collector alone, freezing included.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from ._gc import gc_threshold

#: See the module doc: when the frozen heap has grown this many times since the last full
#: collection, and at most once per this many seconds, thaw and collect everything once.
FULL_FACTOR = 4.0
FULL_INTERVAL = 600.0
#: A full collection that frees less than this fraction of what it walked found "almost
#: nothing": the next one waits for twice the growth (module doc).
FOUND_LITTLE = 0.01


def backed_off(factor: float, full_factor: float, found: int, walked: int) -> float:
    """The growth the next full collection waits for, after one that walked ``walked``
    objects and found ``found`` unreachable (module doc)."""
    return factor * 2 if found < FOUND_LITTLE * walked else full_factor


class GcGovernor:
    def __init__(
        self, token: trio.lowlevel.TrioToken, *, full_factor: float = FULL_FACTOR,
        full_interval: float = FULL_INTERVAL,
    ) -> None:
        self._token = token
        self._wakeup = trio.Event()
        self._running = False  # the task runs: the callback may freeze
        self.full_factor = full_factor
        self.full_interval = full_interval
        #: the growth the next full collection waits for (backs off: module doc)
        self.factor = full_factor
        self._baseline = 0  # frozen objects after the first freeze or the last full collection
        # The first full collection comes no sooner than one interval after the start
        # (a runtime starting up grows its heap many times over).
        self._last_full = time.monotonic()
        self._next_check = -math.inf  # the first freeze measures the baseline
        #: statistics (benchmarks and tests): agents started, how many times it froze, and
        #: how many full collections it ran.
        self.started = 0
        self.freezes = 0
        self.full_collections = 0

    async def agent_started(self, agent: object) -> None:
        """The supervisor's hook, called with every agent once it runs."""
        self.started += 1
        self._wake()

    def collected(self, phase: str, info: dict[str, Any]) -> None:
        """The collector's callback (``gc.callbacks``); runs in whichever thread collected,
        in the middle of any code. It freezes the survivors itself (``gc.freeze()`` is
        O(1) and touches nothing of trio's) and wakes the governor's task only when the
        full-collection check is due. Waking it on every collection wrote to trio's
        wake-up socket inside the pause, and that write gives the GIL up: at saturation
        the store's writer thread took it, and the pause lasted about 5 ms (the switch
        interval) longer than the collection."""
        if phase != "stop" or not self._running:
            return
        gc.freeze()
        self.freezes += 1
        if time.monotonic() >= self._next_check:
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The governor's task (one per runtime): freeze after each wakeup."""
        task_status.started()
        self._running = True
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                self.freeze()
        finally:
            # A governor that stopped for good must not go on freezing from the
            # callback: the full collection that bounds frozen garbage is the task's.
            self._running = False

    def _wake(self) -> None:
        self._wakeup.set()  # whichever event the governor waits on by now

    def freeze(self) -> None:
        gc.freeze()
        self.freezes += 1
        now = time.monotonic()
        if now < self._next_check:
            return
        # gc.get_freeze_count() walks the whole permanent generation: read it at most
        # once per tenth of the interval, never on every freeze.
        self._next_check = now + self.full_interval / 10
        frozen = gc.get_freeze_count()
        if not self._baseline:
            self._baseline = frozen
        elif frozen >= self.factor * self._baseline and now - self._last_full >= self.full_interval:
            gc.unfreeze()
            found = gc.collect()  # frees what was frozen and became unreachable cycles since
            gc.freeze()
            self.full_collections += 1
            self._baseline = gc.get_freeze_count()
            self._last_full = now
            self.factor = backed_off(self.factor, self.full_factor, found, frozen)

    def thaw(self) -> None:
        """Hand every frozen object back to the collector (on close)."""
        if self.freezes:
            gc.unfreeze()


@contextmanager
def governed(threshold: tuple[int, int, int] | None) -> Iterator[GcGovernor | None]:
    """The runtime's collector setting for the duration (call it inside trio):
    ``threshold`` (see ``runtime._gc``) and, if this runtime set it and nothing is frozen
    yet, a governor (run its ``run`` in the runtime's nursery); thawed on exit. Yields
    None when the runtime leaves the collector alone."""
    with gc_threshold(threshold) as owned:
        if not owned or gc.get_freeze_count() or not gc.isenabled():
            yield None
            return
        governor = GcGovernor(trio.lowlevel.current_trio_token())
        gc.callbacks.append(governor.collected)
        try:
            yield governor
        finally:
            gc.callbacks.remove(governor.collected)
            governor.thaw()
