"""What a DSH host keeps on disk, and the environment that keeps it offline and quiet.

DSH writes each session to ``$DSH_HOME/sessions/--<cwd>--/<id>/session.v4.jsonl.zstd``; the
runtime (and its tests) read it back to see what DSH itself recorded, e.g. the loop dock's
binding on ``agent-preset/selected``; the functions at the end read its shapes (messages,
their text and source, turns).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from loopdock.runtime import LoopdockError

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


# -- reading DSH's log shapes ------------------------------------------------------------


def logged_message(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """The message of a message event: DSH stores a ``user/message`` as the event's data
    and an ``assistant/message`` under ``data.message``."""
    data = event.get("data") or {}
    message = data.get("message", data) if isinstance(data, Mapping) else {}
    return message if isinstance(message, Mapping) else {}


def message_text(message: Mapping[str, Any]) -> str:
    """The concatenated text blocks of a DSH message, '' if it has none."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        return ""
    return "".join(b.get("text", "") for b in content if isinstance(b, Mapping) and b.get("type") == "text")


def event_text(event: Mapping[str, Any]) -> str:
    """The text of a message event (``user/message``, ``assistant/message``), else ''."""
    return message_text(logged_message(event))


def event_source(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``source`` of a message event's message, None if it has none."""
    source = logged_message(event).get("source")
    return source if isinstance(source, Mapping) else None


def split_turns(log: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The log's turns, each from its ``turn/start`` to its ``turn/end`` (inclusive; a turn
    still open at the end of the log runs to the end)."""
    turns: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] | None = None
    for event in log:
        if event.get("type") == "turn/start":
            current = [event]
            turns.append(current)
        elif current is not None:
            current.append(event)
            if event.get("type") == "turn/end":
                current = None
    return turns


def turn_end(turn: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ``reason`` of a turn's ``turn/end`` (e.g. ``{kind: completed}``), None if open."""
    last = turn[-1] if turn else {}
    reason = (last.get("data") or {}).get("reason") if last.get("type") == "turn/end" else None
    return reason if isinstance(reason, Mapping) else None


@asynccontextmanager
async def dsh_process(
    dsh: Path, args: Sequence[str], *, cwd: Path, env: Mapping[str, str], output: Path
) -> AsyncIterator[trio.Process]:
    """Run ``dsh args`` in ``cwd`` with ``env``, its stdout and stderr written to ``output``.
    On leaving the block a process still running is killed and reaped, also when the block
    fails or is cancelled."""
    async with await trio.open_file(output, "wb") as out:
        proc = await trio.lowlevel.open_process(
            [str(dsh), *args], cwd=cwd, env=dict(env), stdout=out.wrapped, stderr=out.wrapped
        )
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
