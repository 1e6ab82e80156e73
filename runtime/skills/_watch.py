"""A change signal for the skill roots: Linux inotify, through ctypes (no dependency).

``open_watches(paths)`` returns an inotify file descriptor that becomes readable at the
first change to any of ``paths`` (a directory's entries, or a file in it written, moved,
deleted or re-permissioned), or None where inotify is missing or refuses (another OS, the
per-user limits): the catalog then keeps checking the disk on every lookup.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterable

from .._logging import get_logger

log = get_logger(__name__)

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
    | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()  # read-only after import: the C library's entry points, or None


def watch_supported() -> bool:
    return _LIBC is not None


def open_watches(paths: Iterable[str]) -> int | None:
    """An inotify fd watching every directory in ``paths`` (None if that fails)."""
    if _LIBC is None:
        return None
    fd: int = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        log.debug("skills.watch_unavailable", errno=ctypes.get_errno())
        return None
    for path in paths:
        if _LIBC.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            # Gone meanwhile, unreadable, or over the watch limit: no signal we can
            # trust for this tree; the caller rechecks and tries again, or goes on
            # checking the disk on every lookup.
            log.debug("skills.watch_failed", errno=ctypes.get_errno())
            os.close(fd)
            return None
    return fd
