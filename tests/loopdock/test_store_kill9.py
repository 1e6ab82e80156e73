"""kill -9 of a runtime writing fast: the store stays whole, and nothing acknowledged is lost.

A child runtime (``home_child.py scribe``) runs a few agents, each in one endless turn
that appends bursts of events and prints an ``ack`` line after every ``flush()``
returns. Each round waits for acks from every agent (the child is then mid-writing, by
construction), SIGKILLs it, and checks the home: ``PRAGMA integrity_check`` is ok, every
acknowledged event is there with its text, seqs run from 0 without a hole, and the
killed turn comes back ``interrupted`` on resume. The next round's child resumes the
same sessions, so later rounds also kill a runtime that resumed after a kill.
"""

from __future__ import annotations

import sqlite3

import trio

from loopdock import FakeDriver, Runtime
from loopdock.runtime._home_lock import HomeInUseError
from loopdock.runtime._store import SessionStore

TIMEOUT = 60  # per round: the child imports loopdock; generous for a loaded 2-core machine
ROUNDS = 5
AGENTS = 3
ACKS_PER_AGENT = 20  # acks seen from every agent before the kill


def open_turn(events) -> int | None:
    turn = None
    for event in events:
        if event.type == "turn/start":
            turn = event.data["turn"]
        elif event.type == "turn/end":
            turn = None
    return turn


def read_ack(line: str, into: dict[tuple[str, int], str]) -> str | None:
    """Record an ``ack SID SEQ TEXT`` line; returns its session id (None for other lines)."""
    if not line.startswith("ack "):
        return None
    _, sid, seq, text = line.split(" ", 3)
    into[sid, int(seq)] = text
    return sid


async def test_kill_9_while_writing_loses_no_acknowledged_flush(tmp_path, children):
    home = tmp_path / "home"
    sessions = [f"scribe-{i}" for i in range(AGENTS)]
    acked_total = 0
    for round_ in range(ROUNDS):
        acked: dict[tuple[str, int], str] = {}  # (session, seq) -> text, durable by the child's word
        with trio.fail_after(TIMEOUT):
            child = await children.start("scribe", str(home), str(AGENTS))
            try:
                counts = dict.fromkeys(sessions, 0)
                while min(counts.values()) < ACKS_PER_AGENT:
                    line = await child.line()
                    assert line is not None, f"the child ended early; see {child.stderr}"
                    sid = read_ack(line, acked)
                    if sid is not None:
                        counts[sid] += 1
                # Never two writers: while the child lives, this process cannot open its home.
                try:
                    async with Runtime.open(home):
                        raise AssertionError("a second runtime opened a home in use")
                except HomeInUseError as exc:
                    assert exc.pid == child.pid
            finally:
                await child.kill_9()
            # Acks printed before the kill but not read yet count too.
            while (line := await child.line()) is not None:
                read_ack(line, acked)
        acked_total += len(acked)

        raw = sqlite3.connect(home / "sessions.db")
        try:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            raw.close()

        killed_turns: dict[str, int] = {}
        with SessionStore.open(home / "sessions.db") as store:
            for sid in sessions:
                loaded = store.load(sid)
                assert loaded is not None
                events = loaded[1]
                assert [e.seq for e in events] == list(range(len(events))), sid
                for (acked_sid, seq), text in acked.items():
                    if acked_sid == sid:
                        assert seq < len(events), (sid, seq, len(events))
                        assert events[seq].type == "assistant/message"
                        assert events[seq].data["content"][0]["text"] == text
                turn = open_turn(events)
                assert turn is not None, f"{sid}: the kill left no open turn"
                killed_turns[sid] = turn

        # Resumed (on any driver of the bound name), the killed turn ends interrupted.
        with trio.fail_after(TIMEOUT):
            async with Runtime.open(home) as rt:
                rt.register_driver("scribe", FakeDriver("scribe"))
                for sid in sessions:
                    handle = await rt.resume_agent(resume_session_id=sid)
                    ends = [e.data for e in (await handle.agent.session.read_events()) if e.type == "turn/end"]
                    assert ends[-1] == {"turn": killed_turns[sid], "reason": {"kind": "interrupted"}}
                    assert len(ends) == round_ + 1  # every earlier killed turn ended once, too
                    await handle.dispose()
    assert acked_total >= ROUNDS * AGENTS * ACKS_PER_AGENT
