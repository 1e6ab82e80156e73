"""The dock's binding in DSH's log: read from plugin records (and the older field), and the
migration of old logs (on files written as DSH writes them; the real ``dsh`` adopting the
result is tests/bridge/test_dsh_resume_e2e.py)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from loopdock.actors.dock import Route
from loopdock.bridge._dsh_binding import (
    BINDING_RECORD,
    LOCK_FILE,
    _rows,
    _write,
    dsh_binding,
    migrate_dsh_home,
    migrate_session_log,
)
from loopdock.bridge._dsh_files import SESSION_FILE, session_log

HEADER = {"type": "session", "version": 4, "id": "s1", "createdAt": 1, "cwd": "/w", "isSeeded": False, "delegationDepth": 0}


def _event(seq: int, type_: str, data: dict, **extra) -> dict:
    return {"type": type_, "seq": seq, "time": 1000 + seq, "data": data, **extra}


def _log(home: Path, session_id: str, events: list[dict]) -> Path:
    path = home / "sessions" / "--w--" / session_id / SESSION_FILE
    path.parent.mkdir(parents=True)
    _write(path, [{**HEADER, "id": session_id}, *events])
    return path


def test_the_newest_valid_binding_wins_whichever_place_holds_it():
    old = _event(0, "agent-preset/selected", {"agentLoopDock": {"loop": "old", "driver": "d1"}})
    record = _event(1, BINDING_RECORD, {"loop": "new", "driver": "d2"}, ignorable=True)
    broken = _event(2, BINDING_RECORD, {"loop": "Not A Loop"}, ignorable=True)
    assert dsh_binding([old]) == Route("old", "d1")
    assert dsh_binding([old, record, broken]) == Route("new", "d2")
    assert dsh_binding([broken]) is None
    assert dsh_binding([_event(0, "turn/start", {"turn": 1})]) is None


def test_a_binding_only_event_becomes_a_record_at_the_same_seq(tmp_path):
    events = [
        _event(0, "permission/preset", {"preset": "workspace-write"}),
        _event(1, "agent-preset/selected", {"agentLoopDock": {"loop": "kept", "driver": "default"}}),
        _event(2, "turn/start", {"turn": 1}),
    ]
    path = _log(tmp_path, "s1", events)
    [done] = migrate_dsh_home(tmp_path)
    assert (done.session_id, done.outcome, done.binding) == ("s1", "migrated", Route("kept", "default"))
    rows = session_log(tmp_path, "s1")
    assert rows[0] == HEADER
    assert rows[1:] == [
        events[0],
        {"type": BINDING_RECORD, "seq": 1, "time": 1001, "data": {"loop": "kept", "driver": "default"}, "ignorable": True},
        events[2],
    ]
    assert migrate_session_log(path) is None  # nothing left to move
    assert migrate_dsh_home(tmp_path) == []


def test_a_preset_stays_and_the_binding_it_carried_is_appended(tmp_path):
    events = [
        _event(0, "agent-preset/selected", {"agentPreset": "reviewer", "agentLoopDock": {"loop": "kept"}}),
        _event(1, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
    ]
    _log(tmp_path, "s2", events)
    [done] = migrate_dsh_home(tmp_path)
    assert done.binding == Route("kept")
    rows = session_log(tmp_path, "s2")[1:]
    assert rows == [
        _event(0, "agent-preset/selected", {"agentPreset": "reviewer"}),
        events[1],
        {"type": BINDING_RECORD, "seq": 2, "time": 1001, "data": {"loop": "kept"}, "ignorable": True},
    ]
    assert [row["seq"] for row in rows] == [0, 1, 2]  # still dense
    assert dsh_binding(rows) == Route("kept")


def test_a_malformed_old_binding_moves_as_it_is_and_stays_unread(tmp_path):
    _log(tmp_path, "s3", [_event(0, "agent-preset/selected", {"agentLoopDock": {"loop": "BAD ID"}})])
    [done] = migrate_dsh_home(tmp_path)
    assert (done.outcome, done.binding) == ("migrated", None)
    [row] = session_log(tmp_path, "s3")[1:]
    assert row == {"type": BINDING_RECORD, "seq": 0, "time": 1000, "data": {"loop": "BAD ID"}, "ignorable": True}
    assert dsh_binding([row]) is None


def test_a_session_a_dsh_process_holds_is_left_alone(tmp_path):
    path = _log(tmp_path, "s4", [_event(0, "agent-preset/selected", {"agentLoopDock": {"loop": "kept"}})])
    before = path.read_bytes()
    with open(path.parent / LOCK_FILE, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as DSH holds it while the session is open
        [done] = migrate_dsh_home(tmp_path)
        assert done.outcome == "busy"
        assert path.read_bytes() == before
    [done] = migrate_dsh_home(tmp_path)  # once DSH let go
    assert done.outcome == "migrated"
    assert [r["type"] for r in _rows(path)] == ["session", BINDING_RECORD]
