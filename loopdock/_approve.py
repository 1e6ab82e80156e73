"""``loopdock sessions approve ID APPROVAL_ID [--refuse REASON]``: a person's answer to an
open approval question of a session no runtime is running.

The answer is one ``approval/answered`` event appended to the session's log in the
home's store, under the home's lock, so that no runtime writes the log meanwhile: the
runtime that resumes the session next continues its turn as the answer says (the call
runs, or the model reads the refusal). A runtime that holds the home answers through its
own API (``approval.answer``); then this command refuses with HOME_IN_USE.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TextIO

from loopdock.runtime import (
    ApprovalClosedError,
    SessionNotFoundError,
    SessionStore,
    Write,
    acquire_home,
    check_session_id,
    new_event,
)

from ._sessions import STORE_FILE

_TYPES = ("approval/requested", "approval/answered")


def answer_offline(home: Path, session_id: str, approval_id: str, refuse: str | None) -> dict[str, Any]:
    """Append the answer; returns its data. Raises ApprovalClosedError when the question
    is not open, SessionNotFoundError when there is no such session, HomeInUseError when a
    runtime holds the home."""
    check_session_id(session_id)
    if not (home / STORE_FILE).is_file():  # nothing to answer: create no home by mistake
        raise SessionNotFoundError(f"no session {session_id!r}: {home} holds no sessions")
    with acquire_home(home), SessionStore.open(home / STORE_FILE) as store:
        loaded = store.load_outline(session_id, _TYPES)
        if loaded is None:
            raise SessionNotFoundError(f"no session {session_id!r} under {home}")
        _header, count, last_time, events = loaded
        asked = {e.data.get("id") for e in events if e.type == "approval/requested"}
        closed = {e.data.get("id") for e in events if e.type == "approval/answered"}
        if approval_id not in asked or approval_id in closed:
            raise ApprovalClosedError(
                f"approval {approval_id!r} of session {session_id} is not open: "
                "it was answered or withdrawn already, or never asked"
            )
        data: dict[str, Any] = {"id": approval_id, "decision": "approve"}
        if refuse is not None:
            data = {"id": approval_id, "decision": "refuse", "reason": refuse}
        # Times never decrease within a session (runtime._events).
        now = max(time.time_ns() // 1_000_000, last_time)
        refused = store.commit([Write(session_id, None, (new_event("approval/answered", count, now, data),))])
        if session_id in refused:
            raise refused[session_id]
    return data


def approve_command(home: Path, session_id: str, approval_id: str, refuse: str | None, out: TextIO) -> None:
    data = answer_offline(home, session_id, approval_id, refuse)
    print(f"{session_id}: {approval_id} {data['decision']}d; the session's next resume continues its turn", file=out)
