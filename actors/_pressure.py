"""Memory pressure: over ``Runtime.open(memory_limit=...)``, idle agents are passivated.

The measure is the process's resident set (RSS, ``/proc/self/statm``): what the system
counts against it. The lifecycle reads it once per ``PRESSURE_PERIOD`` (trio's clock),
in a task that exists only when a limit is set: without one nothing reads it and nothing
runs. One read of a procfs file costs microseconds and never waits on a disk, so it is
done on trio's thread.

``MemoryPressure`` is the judgement, without I/O: fed each reading, it says how many
bytes to release; the lifecycle (actors._lifecycle) picks the agents and passivates
them, least recently active first, and tells it what they were estimated to hold.

- **Hysteresis**: an episode starts when the process holds more than the limit and ends
  when it holds no more than the low-water mark (``LOW_WATER``, 90% of the limit); in
  between, each period's round asks for what is above the low-water mark, so that one
  episode does not stop a few bytes under the limit to start again a second later.
- **Freed memory may stay in the process**: pymalloc gives an arena back to the system
  only once every block in it is free, and glibc's malloc keeps freed chunks for reuse,
  so the RSS may not fall at all after agents are passivated. A policy that waited for it
  to fall would passivate every idle agent. So what a round passivates is counted, each
  agent at ``AGENT_BYTES`` plus its warm history (``history_weight``), as a ``credit``:
  memory free inside the process, which new objects take before the process grows. The
  process is judged to hold its RSS minus the credit. The credit is spent by every change
  of the RSS seen since (a fall: the memory went back to the system; a rise: new objects
  took it, or the process grew anyway) and by every reactivation (a rebuilt agent takes
  about what passivating it released), so a process that keeps growing is judged on what
  it holds again, and a round or two later more agents go.
- **One round per period**, of at most ``ROUND_FRACTION`` of the idle agents (at least
  ``PASSIVATION_BATCH``): one reading, however high (a burst the agents have no part in),
  never empties the runtime at once; the next reading judges what the last round did.
- **No explicit collection**: the runtime's agents make no reference cycles
  (runtime._gc_governor), so a passivated agent's objects are freed by reference counting
  at once, and a full collection of a large heap is the pause the gc governor exists to
  avoid.
"""

from __future__ import annotations

import mmap
from typing import final

from loopdock.runtime import get_logger

log = get_logger(__name__)

#: How often the RSS is read while a limit is set (seconds of trio's clock).
PRESSURE_PERIOD = 1.0

#: An episode ends once the process holds no more than this fraction of the limit.
LOW_WATER = 0.9

#: A round passivates at most this fraction of the idle agents (and at least one batch).
ROUND_FRACTION = 0.25

#: What passivating an idle agent releases, besides its warm history: an active idle
#: agent holds about 20 KB, a passivated one under 1 KB (docs/lifecycle.md, "Measured").
AGENT_BYTES = 20_000


def check_memory_limit(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"memory_limit must be a positive number of bytes (an int) or None, got {value!r}")
    return value


def read_rss() -> int:
    """The process's resident set size in bytes (Linux's ``/proc/self/statm``; OSError
    where there is none)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


@final
class MemoryPressure:
    """The judgement of one runtime's memory (module docstring): ``judge`` each reading,
    tell it what was ``released``."""

    def __init__(self, limit: int) -> None:
        check_memory_limit(limit)
        self.limit = limit
        self.low_water = int(limit * LOW_WATER)
        #: Bytes estimated free inside the process: released by passivations and not yet
        #: seen go back to the system or be taken again.
        self.credit = 0
        #: In an episode: over the limit, not yet back under the low-water mark.
        self.relieving = False
        #: This episode's warning that no agent was left to passivate was logged.
        self.warned = False
        self.episodes = 0
        self.readings = 0
        self._rss: int | None = None
        self._reactivations = 0

    @property
    def rss(self) -> int | None:
        """The last reading."""
        return self._rss

    @property
    def held(self) -> int | None:
        """What the process is judged to hold: the last reading less the credit."""
        return None if self._rss is None else self._rss - self.credit

    def judge(self, rss: int, reactivations: int = 0) -> int:
        """Bytes to release now (0: none). ``rss``: the reading; ``reactivations``: how
        many agents the lifecycle has reactivated so far (each spends credit)."""
        self.readings += 1
        spent = (reactivations - self._reactivations) * AGENT_BYTES
        if self._rss is not None:
            spent += abs(rss - self._rss)
        self.credit = max(0, self.credit - spent)
        self._rss, self._reactivations = rss, reactivations
        held = rss - self.credit
        if not self.relieving:
            if held <= self.limit:
                return 0
            self.relieving, self.warned = True, False
            self.episodes += 1
            log.info("memory over the limit: passivating idle agents", rss=rss, held=held, limit=self.limit)
        elif held <= self.low_water:
            self.relieving = False
            log.info("memory back under the low-water mark", rss=rss, held=held, low_water=self.low_water)
            return 0
        return held - self.low_water

    def released(self, nbytes: int) -> None:
        """Passivations released about ``nbytes`` (estimated)."""
        self.credit += nbytes
