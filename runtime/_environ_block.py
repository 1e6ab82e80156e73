"""Hiding the runtime's initial environment from ``/proc/<pid>/environ``.

The kernel serves ``/proc/<pid>/environ`` straight from the memory between the process's
``env_start`` and ``env_end``: the strings the process was started with, whatever the
process did to its environment afterwards (an ``unsetenv`` removes a pointer, never the
bytes). Any process of the same user may read that file, so a program the runtime runs
could read the runtime's API keys there even though its own environment holds none.

:func:`hide_environment_block` copies every variable the C library still uses out of that
block onto the heap (``strdup``, and the ``environ`` pointer moved to the copy), then
zeroes the block's bytes. ``getenv`` keeps working, Python's ``os.environ`` (a copy made at
start-up) is untouched, and the file shows only the variables in ``keep``: the harmless
ones every child gets anyway.

What it cannot do: a pointer some C code took from ``getenv`` before the call and kept
would now see an empty string (libraries read such variables at load and copy them; none
of ours keeps one); another thread calling ``getenv`` during the call could see a string
being zeroed. The values still live in this process's memory (Python's ``os.environ``,
the heap copies): a process allowed to ptrace this one or read its ``/proc/<pid>/mem``
(same user, unless Yama or non-dumpable forbid it; root always) can read them there.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ._logging import get_logger
from ._process import BASE_ENV

_log = get_logger(__name__)

# env_start and env_end: /proc/<pid>/stat fields 50 and 51 (1-based; proc(5)), counted
# here after the ")" that closes field 2.
_ENV_START, _ENV_END = 50 - 3, 51 - 3


def _block_span() -> tuple[int, int] | None:
    try:
        stat = Path("/proc/self/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    if len(fields) <= _ENV_END:
        return None
    return int(fields[_ENV_START]), int(fields[_ENV_END])


def hide_environment_block(keep: frozenset[str] = BASE_ENV) -> int:
    """Zero the initial environment block except the variables named in ``keep`` (which
    the C library still points at); return how many entries were zeroed. Does nothing
    (returns 0) where there is no ``/proc`` or the block does not look as expected."""
    span = _block_span()
    if span is None:
        return 0
    start, end = span
    try:
        served = Path("/proc/self/environ").read_bytes()
    except OSError:
        return 0
    # The block must be exactly what the kernel serves: otherwise the span is not what
    # this code thinks it is, and writing to it could corrupt anything.
    if end <= start or ctypes.string_at(start, end - start) != served:
        _log.warning("environ.block_unexpected")
        return 0

    libc = ctypes.CDLL(None, use_errno=True)
    libc.strdup.restype = ctypes.c_void_p
    libc.strdup.argtypes = [ctypes.c_void_p]
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    users: dict[int, int] = {}  # address in the block -> index in environ
    index = 0
    while (address := environ[index]) is not None:
        if start <= address < end:
            users[address] = index
        index += 1

    zeroed = 0
    offset = 0
    for entry in served.split(b"\0"):
        address = start + offset
        offset += len(entry) + 1
        if not entry:
            continue
        name = entry.partition(b"=")[0].decode("utf-8", "replace")
        if name in keep and address in users:
            continue
        if address in users:
            copy = libc.strdup(address)
            if not copy:
                raise MemoryError("strdup failed while moving the environment")
            environ[users[address]] = copy
        ctypes.memset(address, 0, len(entry))
        zeroed += 1
    _log.info("environ.block_hidden", zeroed=zeroed)
    return zeroed
