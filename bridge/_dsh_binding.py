"""Where the loop dock's binding lives in a DSH session log, and moving old ones there.

The DSH plugin records a session's ``{loop, driver}`` once, as a *plugin record*: an event
of type ``plugin:loopdock/binding`` whose envelope carries ``ignorable: true``, written
with DSH's own ``appendPluginRecord``. DSH 0.2.1's session reader keeps such records and
skips them (they never reach the model), so the session stays adoptable: tested with ``dsh
headless --session-id`` and the SDK's ``resume_session``. The other candidates fail: any
``agent-preset/selected`` (the headless runner refuses it, run against the binary); an extra
header field (the v4 header validator in the binary's bundled source refuses unknown
fields); a ``system/message`` (DSH reads it as the model's system prompt). DSH reserves ``appendPluginRecord`` for its experimental
packages and keeps records across a future format migration "best effort": a lost record
would resume the session on its route or the default loop.

Earlier plugins put the binding on ``agent-preset/selected`` (``data.agentLoopDock``).
DSH's headless runner refuses any session holding that event without a non-empty
``agentPreset``, and one with a preset as well, so such a session cannot be resumed
headless. ``migrate_dsh_home`` rewrites those logs in place: the event becomes the plugin
record at the same ``seq`` (a binding-only event), or keeps its preset and loses the
binding, which is then appended as a record (an event that also selected a preset). Seqs
stay dense and no other event changes. A session a live DSH process holds (its
``session.lock``) is left alone and reported.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from loopdock.actors.dock import BINDING_EVENT, BINDING_KEY, Route, parse_binding

from ._dsh_files import SESSION_FILE, DshLogError

#: The plugin record type that holds the binding (DSH's ``plugin:`` record grammar).
BINDING_RECORD = "plugin:loopdock/binding"
LOCK_FILE = "session.lock"


def dsh_binding(events: Iterable[Any]) -> Route | None:
    """The newest valid binding in a DSH session log (dicts as DSH writes them, or the
    runtime's mirrored ``Event``s): a plugin record, or the older ``agentLoopDock`` field
    on ``agent-preset/selected``; malformed ones are skipped."""
    found: Route | None = None
    for event in events:
        kind = event.get("type") if isinstance(event, Mapping) else getattr(event, "type", None)
        data = event.get("data") if isinstance(event, Mapping) else getattr(event, "data", None)
        if not isinstance(data, Mapping):
            continue
        if kind == BINDING_RECORD:
            binding = parse_binding(data)
        elif kind == BINDING_EVENT:
            binding = parse_binding(data.get(BINDING_KEY))
        else:
            continue
        found = binding or found
    return found


@attrs.frozen
class Migrated:
    """One session log looked at by ``migrate_dsh_home``."""

    session_id: str
    path: Path
    #: ``migrated`` (rewritten), ``busy`` (a DSH process holds it; untouched)
    outcome: str
    binding: Route | None = None


def _zstd() -> str:
    found = shutil.which("zstd")
    if found is None:
        raise DshLogError("migrating DSH's session logs needs the zstd command (apt-get install zstd)")
    return found


def _rows(path: Path) -> list[dict[str, Any]]:
    text = subprocess.run([_zstd(), "-dc", str(path)], check=True, capture_output=True).stdout.decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _record(seq: int, time: int, data: Any) -> dict[str, Any]:
    return {"type": BINDING_RECORD, "seq": seq, "time": time, "data": data, "ignorable": True}


def _migrated_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Route | None]:
    """The rows with every old binding moved, and the newest valid binding (None if none)."""
    out: list[dict[str, Any]] = []
    newest: Route | None = None
    newest_left_with_a_preset = False
    for row in rows:
        data = row.get("data")
        if row.get("type") != BINDING_EVENT or not isinstance(data, Mapping) or BINDING_KEY not in data:
            out.append(row)
            continue
        binding = parse_binding(data[BINDING_KEY])
        preset = data.get("agentPreset")
        if isinstance(preset, str) and preset:
            # DSH's own preset choice stays; only the dock's field leaves the event.
            out.append({**row, "data": {k: v for k, v in data.items() if k != BINDING_KEY}})
        else:
            # The same value in its new place (a malformed one stays malformed: skipped).
            out.append(_record(row["seq"], row["time"], data[BINDING_KEY]))
        if binding is not None:
            newest, newest_left_with_a_preset = binding, bool(preset)
    if newest is not None and newest_left_with_a_preset:
        last = out[-1]
        value = {"loop": newest.loop, **({"driver": newest.driver} if newest.driver else {})}
        out.append(_record(int(last["seq"]) + 1, int(last["time"]), value))
    return out, newest


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write a v4 log as DSH reads it: the header line alone in the first zstd frame, the
    events in a second; aside first, then renamed over the old file."""
    zstd = _zstd()
    lines = [json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n" for row in rows]
    draft = path.with_name(f".{path.name}.migrating")
    with open(draft, "wb") as out:
        for chunk in (lines[:1], lines[1:]):
            if chunk:
                data = "".join(chunk).encode()
                out.write(subprocess.run([zstd, "-q", "-c"], input=data, check=True, capture_output=True).stdout)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(draft, 0o600)
    os.replace(draft, path)


def migrate_session_log(path: Path) -> Migrated | None:
    """Move the old bindings of one session log (``.../<id>/session.v4.jsonl.zstd``);
    None if it holds none. Holds DSH's own write lock (``session.lock``) meanwhile."""
    session_id = path.parent.name
    with open(path.parent / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return Migrated(session_id, path, "busy") if _has_old_binding(_rows(path)) else None
            raise
        try:
            rows = _rows(path)
            if not _has_old_binding(rows):
                return None
            new_rows, binding = _migrated_rows(rows)
            _write(path, new_rows)
            return Migrated(session_id, path, "migrated", binding)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _has_old_binding(rows: list[dict[str, Any]]) -> bool:
    return any(
        row.get("type") == BINDING_EVENT and isinstance(row.get("data"), Mapping) and BINDING_KEY in row["data"]
        for row in rows
    )


def migrate_dsh_home(dsh_home: Path) -> list[Migrated]:
    """``migrate_session_log`` over every session under ``dsh_home``; what it did."""
    done: list[Migrated] = []
    for path in sorted(dsh_home.glob(f"sessions/*/*/{SESSION_FILE}")):
        result = migrate_session_log(path)
        if result is not None:
            done.append(result)
    return done
