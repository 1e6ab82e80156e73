"""What a DSH host keeps on disk, and the environment that keeps it offline and quiet.

DSH writes each session to ``$DSH_HOME/sessions/--<cwd>--/<id>/session.v4.jsonl.zstd``; the
runtime (and its tests) read it back to see what DSH itself recorded, e.g. the loop dock's
binding on ``agent-preset/selected``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from runtime._errors import LoopdockError

SESSION_FILE = "session.v4.jsonl.zstd"


class DshLogError(LoopdockError):
    """Raised when a DSH session log cannot be found exactly once, or cannot be decoded
    (the ``zstd`` command is needed: Debian's package ``zstd``)."""

    code = "DSH_LOG"


def quiet_env(dsh_home: Path, home: Path) -> dict[str, str]:
    """The environment of a ``dsh`` child: its own DSH_HOME and HOME, telemetry off and its
    exporter pointed at a closed loopback port, so nothing leaves the machine."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "DSH_HOME": str(dsh_home),
        "DSH_TELEMETRY_MODE": "DISABLED",
        "DSH_TELEMETRY_OTLP_URL": "http://127.0.0.1:9/v1/logs",
    }


def session_log(dsh_home: Path, session_id: str) -> list[dict[str, Any]]:
    """Every event DSH persisted for ``session_id`` (header line included), in order."""
    zstd = shutil.which("zstd")
    if zstd is None:
        raise DshLogError("reading DSH's session logs needs the zstd command (apt-get install zstd)")
    found = list(dsh_home.glob(f"sessions/*/{session_id}/{SESSION_FILE}"))
    if len(found) != 1:
        raise DshLogError(f"expected one DSH log of session {session_id!r}, found {len(found)}")
    text = subprocess.run([zstd, "-dc", str(found[0])], check=True, capture_output=True).stdout.decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
