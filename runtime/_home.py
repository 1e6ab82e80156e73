"""The runtime's home: the folder holding its session database and bridge token."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = ".loopdock"


def resolve_home(home: str | os.PathLike[str] | None) -> Path:
    """``home`` if given, else ``$LOOPDOCK_HOME``, else ``./.loopdock``; made absolute."""
    return Path(home or os.environ.get("LOOPDOCK_HOME") or DEFAULT_HOME).absolute()
