"""The LoopX project a command works in: a directory, checked before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

from loopdock.runtime import InvalidOptionsError


def checked_project(project: str | os.PathLike[str] | None, what: str) -> Path:
    """``project`` (default: the current directory) made absolute; InvalidOptionsError
    naming it as ``what`` unless it is a directory. It stats the disk: async callers run
    it in a worker thread."""
    directory = Path(project if project is not None else Path.cwd()).absolute()
    if not directory.is_dir():
        raise InvalidOptionsError(f"{what} is not a directory: {str(directory)[:200]}")
    return directory
