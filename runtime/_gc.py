"""The runtime's setting for CPython's cyclic garbage collector.

A runtime keeps every live session's history in memory, so with many busy agents the
heap grows by a few objects per event. With CPython's default thresholds (700, 10, 10)
that growth sets off a full collection every ~70,000 allocations, each one walking the
whole heap (about 0.2 s at 1,000 agents x 10 turns): on the benchmark's many-agents
workload that was 27% of all CPU time. ``GC_THRESHOLD`` lets the young generation grow
to 10,000 objects before a collection, which makes collections (and full ones, which
also need 10 x 10 younger ones first) about 14 times rarer; the memory collected is the
same, only later. Reference counting frees everything acyclic at once either way.

The threshold is process-wide, so the runtime only changes it while it is open and only
when the process still has CPython's default (an application that tuned the collector
itself keeps its setting), and puts the default back on close unless someone changed it
meanwhile. It does so only when asked (``Runtime.open(gc_threshold=GC_THRESHOLD)``, as
``loopdock serve`` and ``loopdock worker`` do); by default an embedded runtime leaves the
collector alone. A runtime that set the threshold also freezes its long-lived objects
(``runtime._gc_governor``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: CPython's own default thresholds.
CPYTHON_DEFAULT_THRESHOLD = (700, 10, 10)

#: What serve and worker ask ``Runtime.open`` for (see the module doc).
GC_THRESHOLD = (10_000, 10, 10)


@contextmanager
def gc_threshold(threshold: tuple[int, int, int] | None) -> Iterator[bool]:
    """Set the collector's ``threshold`` for the duration, if the process still has
    CPython's default; yields whether it did. ``None`` changes nothing."""
    if threshold is None or gc.get_threshold() != CPYTHON_DEFAULT_THRESHOLD:
        yield False
        return
    gc.set_threshold(*threshold)
    try:
        yield True
    finally:
        if gc.get_threshold() == threshold:  # nobody else changed it meanwhile
            gc.set_threshold(*CPYTHON_DEFAULT_THRESHOLD)
