"""``loopdock sessions list | show ID | tail ID``: what every agent did and is doing.

Two kinds of sessions: the runtime's own (its SQLite store under the home, opened
read-only: this works while ``loopdock serve`` or another program holds the runtime
open, and never migrates or writes the file) and the DSH sessions a ``serve`` mirrors
(DSH's own logs under ``$DSH_HOME``, the durable record of those agents). For each:
its loop and driver (the dock's binding, read back from the log), its status (the last
turn's end, or ``running`` while a turn is open), its turn count and its last event.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import attrs

from loopdock.actors.dock import Route, read_binding
from loopdock.bridge import SESSION_FILE, dsh_binding, logged_message, session_log
from loopdock.runtime import Event, SessionNotFoundError, event_from_wire

STORE_FILE = "sessions.db"
#: Seconds between two looks at a followed session (``tail``).
TAIL_INTERVAL = 0.5


@attrs.frozen
class Summary:
    """One session, as ``sessions list`` shows it."""

    id: str
    origin: str  # "runtime" or "dsh"
    binding: Route | None
    status: str
    turns: int
    last_type: str | None
    last_time: int | None
    title: str | None = None


def _status(types_and_data: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[str, int]:
    status, turns = "new", 0
    for kind, data in types_and_data:
        if kind == "turn/start":
            status, turns = "running", turns + 1
        elif kind == "turn/end":
            reason = data.get("reason")
            status = str(reason.get("kind")) if isinstance(reason, Mapping) else "ended"
    return status, turns


# -- the runtime's store, read-only --------------------------------------------------------


def _connect(home: Path) -> sqlite3.Connection | None:
    path = home / STORE_FILE
    if not path.exists():
        return None
    # mode=ro: a viewer must not migrate, create or lock out the runtime that owns it.
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)


def runtime_session_ids(home: Path) -> list[str]:
    conn = _connect(home)
    if conn is None:
        return []
    with conn:
        rows = conn.execute("SELECT header FROM sessions").fetchall()
    conn.close()
    headers = [json.loads(header) for (header,) in rows]
    return [h["id"] for h in sorted(headers, key=lambda h: (h.get("createdAt", 0), h["id"]))]


def runtime_events(home: Path, session_id: str, after: int = -1) -> list[Event] | None:
    """The session's events with ``seq > after``; None if the store does not hold it."""
    conn = _connect(home)
    if conn is None:
        return None
    try:
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            return None
        rows = conn.execute(
            "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after),
        ).fetchall()
    finally:
        conn.close()
    return [event_from_wire({"seq": s, "type": t, "time": tm, "data": json.loads(d)}) for s, t, tm, d in rows]


def _runtime_summary(home: Path, session_id: str) -> Summary:
    events = runtime_events(home, session_id) or []
    status, turns = _status([(e.type, e.data) for e in events])
    last = events[-1] if events else None
    return Summary(session_id, "runtime", read_binding(events), status, turns,
                   last.type if last else None, last.time if last else None)


# -- DSH's own logs ------------------------------------------------------------------------


def dsh_session_ids(dsh_home: Path | None) -> list[str]:
    if dsh_home is None:
        return []
    return sorted({p.parent.name for p in dsh_home.glob(f"sessions/*/*/{SESSION_FILE}")})


def dsh_events(dsh_home: Path | None, session_id: str) -> list[dict[str, Any]] | None:
    """The DSH session's events (header line dropped); None if DSH does not hold it."""
    if dsh_home is None or session_id not in dsh_session_ids(dsh_home):
        return None
    return [row for row in session_log(dsh_home, session_id) if "seq" in row]


def _dsh_summary(dsh_home: Path, session_id: str) -> Summary:
    events = dsh_events(dsh_home, session_id) or []
    status, turns = _status([(str(e.get("type")), e.get("data") or {}) for e in events])
    titles = [e["data"].get("title") for e in events if e.get("type") == "session/title" and isinstance(e.get("data"), dict)]
    last = events[-1] if events else None
    return Summary(session_id, "dsh", dsh_binding(events), status, turns,
                   str(last["type"]) if last else None, int(last["time"]) if last else None,
                   str(titles[-1]) if titles else None)


def summaries(home: Path, dsh_home: Path | None) -> list[Summary]:
    found = [_runtime_summary(home, sid) for sid in runtime_session_ids(home)]
    found += [_dsh_summary(dsh_home, sid) for sid in dsh_session_ids(dsh_home)] if dsh_home else []
    return found


# -- printing ------------------------------------------------------------------------------


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def print_list(found: Sequence[Summary], out: TextIO) -> None:
    if not found:
        print("no sessions", file=out)
        return
    rows = [("SESSION", "FROM", "LOOP", "DRIVER", "STATUS", "TURNS", "LAST EVENT", "AT (UTC)")]
    for s in found:
        rows.append((
            s.id, s.origin, s.binding.loop if s.binding else "-", (s.binding.driver or "-") if s.binding else "-",
            s.status, str(s.turns), s.last_type or "-", _when(s.last_time),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)


def _text(message: Mapping[str, Any]) -> str:
    parts = []
    for block in message.get("content") or []:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and block.get("text"):
            parts.append(str(block["text"]))
        elif block.get("type") == "tool-result":
            content = block.get("content")
            parts.append(content if isinstance(content, str) else json.dumps(content)[:500])
    return "".join(parts)


def event_line(kind: str, seq: int, at: int, data: Mapping[str, Any]) -> str:
    """One event as a line a person reads: who said what, tool calls, turn ends."""
    head = f"{seq:>5} {_when(at)[11:]} {kind:<22}"
    if kind in ("user/message", "assistant/message", "tool/result"):
        message = logged_message({"data": data})
        source = message.get("source")
        kind_of = f" [{source.get('kind')}]" if isinstance(source, Mapping) and source.get("kind") else ""
        return f"{head}{kind_of} {_text(message)}".replace("\n", " | ")[:400]
    if kind == "tool/call":
        return f"{head} {data.get('name')} {str(data.get('arguments'))[:300]}"
    if kind == "turn/end":
        reason = data.get("reason")
        return f"{head} turn {data.get('turn')} {reason.get('kind') if isinstance(reason, Mapping) else reason}"
    if kind == "turn/start":
        return f"{head} turn {data.get('turn')}"
    return head.rstrip()


def _lines(events: Sequence[Event] | Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, str]]:
    for e in events:
        if isinstance(e, Event):
            yield e.seq, event_line(e.type, e.seq, e.time, e.data)
        else:
            yield int(e["seq"]), event_line(str(e["type"]), int(e["seq"]), int(e["time"]), e.get("data") or {})


def _events_of(home: Path, dsh_home: Path | None, session_id: str) -> tuple[str, list[Any]]:
    events = runtime_events(home, session_id)
    if events is not None:
        return "runtime", events
    found = dsh_events(dsh_home, session_id)
    if found is not None:
        return "dsh", found
    where = f"{home / STORE_FILE}" + (f" or under {dsh_home}" if dsh_home else " (and no DSH_HOME to look in)")
    raise SessionNotFoundError(f"no session {session_id[:128]!r} in {where}")


def show(home: Path, dsh_home: Path | None, session_id: str, out: TextIO) -> None:
    origin, events = _events_of(home, dsh_home, session_id)
    summary = _runtime_summary(home, session_id) if origin == "runtime" else _dsh_summary(dsh_home or Path(), session_id)
    binding = f"loop {summary.binding.loop} on driver {summary.binding.driver or '-'}" if summary.binding else "no binding"
    print(f"{session_id} ({origin}): {binding}; {summary.status}; {summary.turns} turns", file=out)
    for _, line in _lines(events):
        print(line, file=out)


def tail(home: Path, dsh_home: Path | None, session_id: str, out: TextIO, *, lines: int, follow: bool) -> None:
    """The last ``lines`` events, then (``follow``) every new one as it is committed,
    until interrupted."""
    origin, events = _events_of(home, dsh_home, session_id)
    past = list(_lines(events))
    for _, line in past[-lines:] if lines > 0 else []:
        print(line, file=out, flush=True)
    last = past[-1][0] if past else -1
    while follow:
        time.sleep(TAIL_INTERVAL)  # a viewer polls the files the owners write
        if origin == "runtime":
            fresh: list[Any] = runtime_events(home, session_id, last) or []
        else:
            fresh = [e for e in (dsh_events(dsh_home, session_id) or []) if int(e["seq"]) > last]
        for seq, line in _lines(fresh):
            print(line, file=out, flush=True)
            last = seq
