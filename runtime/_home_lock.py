"""One runtime per home: an exclusive ``flock`` held for the runtime's whole life.

Two runtimes on one home hand out the same seqs to the same sessions and refuse each
other's rows, so their logs end up interleaved and full of holes. ``acquire_home``
takes ``flock(LOCK_EX | LOCK_NB)`` on ``<home>/runtime.lock``; a second opener, in
another process or in the same one (``flock`` belongs to the open file, not the
process), gets HomeInUseError at once. It does not wait: a runtime holds its home for as
long as it runs, often for days, so waiting would only hang a command or a test where an
immediate error names the home and the holder's pid.

The OS drops the lock when its holder exits, however it exits (kill -9 included), so a
restart after a crash takes the home at once; no stale lock needs clearing. The file
stays behind on purpose: only its lock means anything, and deleting it could let two
openers lock two different files. It holds the holder's pid, a hint for the error message
and nothing else.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import final

from ._errors import LoopdockError
from ._logging import get_logger
from ._private import FILE_MODE, private_dir

log = get_logger(__name__)

LOCK_FILE = "runtime.lock"


class HomeInUseError(LoopdockError):
    """Raised by ``Runtime.open`` when another runtime (in any process, this one
    included) holds the home. ``home`` is the home's path; ``pid`` the holder's process
    id as it recorded it, or None if it could not be read."""

    code = "HOME_IN_USE"

    def __init__(self, home: Path, pid: int | None) -> None:
        if pid is None:
            holder = "another loopdock runtime"
        elif pid == os.getpid():
            holder = f"another runtime in this process (pid {pid})"
        else:
            holder = f"another loopdock runtime (pid {pid})"
        super().__init__(
            f"runtime home {str(home)!r} is in use by {holder}; "
            "close that runtime or open a different home"
        )
        self.home = home
        self.pid = pid


@final
class HomeLock:
    """The hold on one home, from ``acquire_home``; ``release()`` (idempotent) or the
    end of the process gives it up."""

    def __init__(self, home: Path, fd: int) -> None:
        self.home = home
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops the flock

    def __enter__(self) -> HomeLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def acquire_home(home: Path) -> HomeLock:
    """Make ``home`` a private directory and hold it; raises HomeInUseError if it is held."""
    private_dir(home)
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HomeInUseError(home, _read_pid(fd)) from None
        pid = str(os.getpid()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, pid + b"\n", 0)
    except BaseException:
        os.close(fd)
        raise
    log.debug("home.acquired", home=str(home), pid=os.getpid())
    return HomeLock(home, fd)


def _read_pid(fd: int) -> int | None:
    # The holder may be between truncating and writing: an empty or partial read is "unknown".
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
