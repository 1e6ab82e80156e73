"""Files only their owner may read: the runtime home (0700) and what it holds (0600).

Session logs hold whole transcripts, so neither another user nor the process umask
decides who reads them: modes are set with ``chmod``/``fchmod`` after creation (a umask
only removes bits, and a strict one like 0277 would otherwise leave the owner unable to
write). A home that already exists with looser permissions is tightened, with a warning,
rather than refused: the files in it are ours, and refusing would only make the user run
the same ``chmod`` by hand.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._logging import get_logger

log = get_logger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Make ``path`` (and missing parents) a directory with mode 0700.

    Parents it creates get the usual mode; only ``path`` itself is made private. An
    existing directory open to others is tightened; if that fails (someone else owns it)
    a warning says so and the files inside still get 0600.
    """
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode == DIR_MODE:
        return
    try:
        path.chmod(DIR_MODE)
    except OSError as exc:
        log.warning("home.not_private", path=str(path), mode=oct(mode), error=exc.strerror or repr(exc))
        return
    if existed and mode & 0o077:
        log.warning("home.tightened", path=str(path), mode=oct(mode), now=oct(DIR_MODE))


def private_file(path: Path, *, create: bool) -> None:
    """Give ``path`` mode 0600, creating it empty first if ``create`` (else only if it exists)."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        if create:
            raise
        return
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
