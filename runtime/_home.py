"""The runtime's home: the folder holding its session database and bridge token.

It lives outside every agent's working directory by default (agents start in the
process's cwd), in the per-user data directory of the XDG base directory spec. The file
tools refuse it wherever it is (``runtime.tools``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_NAME = "loopdock"


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/loopdock``, else ``~/.local/share/loopdock``. A relative
    ``XDG_DATA_HOME`` is ignored, as the spec says."""
    env = os.environ if environ is None else environ
    data = env.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(data):
        home = env.get("HOME") or str(Path.home())
        data = os.path.join(home, ".local", "share")
    return Path(data) / APP_NAME


def resolve_home(home: str | os.PathLike[str] | None) -> Path:
    """``home`` if given, else ``$LOOPDOCK_HOME``, else :func:`default_home`; made absolute."""
    chosen = home or os.environ.get("LOOPDOCK_HOME")
    return Path(chosen).absolute() if chosen else default_home().absolute()
