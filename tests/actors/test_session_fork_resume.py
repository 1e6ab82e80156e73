"""Sessions through the Runtime: resume (with open-turn repair), fork, id checks."""

from __future__ import annotations

import pytest
import trio

from loopdock import FakeDriver, Runtime
from loopdock.runtime import (
    AgentBusyError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
)
from loopdock.runtime._events import Event, SessionHeader
from loopdock.runtime._serde import event_to_wire, message_to_wire
from loopdock.runtime._store import SessionStore, Write


def wire(events) -> list[dict]:
    return [event_to_wire(e) for e in events]


def shape(events) -> list[tuple]:
    """What a fork copies: every event exactly, its original time included."""
    return [(e.seq, e.type, e.time, e.data) for e in events]


def load(home, session_id):
    with SessionStore.open(home / "sessions.db") as store:
        return store.load(session_id)


async def turn(agent, text: str) -> None:
    agent.followup(text)
    await agent.wait_idle()


def turn_ends(events) -> list[dict]:
    return [dict(e.data) for e in events if e.type == "turn/end"]


async def make_two_turn_session(home, session_id: str = "src") -> list[Event]:
    async with Runtime.open(home) as rt:
        h = await rt.create_agent(session_id=session_id)
        await turn(h.agent, "one")
        await turn(h.agent, "two")
        await h.dispose()
    return load(home, session_id)[1]


# -- 6. resume ---------------------------------------------------------------------------


async def test_resume_restores_transcript_and_turns_after_reopening(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            h = await rt.create_agent(session_id="a1")
            await turn(h.agent, "hello")
            await turn(h.agent, "again")
            transcript = [message_to_wire(m) for m in (await h.agent.read_transcript())]
            events = wire(await h.agent.session.read_events())
            assert h.agent.turns == 2
            await h.dispose()
        assert [m["content"][0]["text"] for m in transcript] == [
            "hello", "pong: hello", "again", "pong: again"
        ]

        async with Runtime.open(home) as rt:
            h = await rt.resume_agent(resume_session_id="a1")
            assert [message_to_wire(m) for m in (await h.agent.read_transcript())] == transcript
            assert h.agent.turns == 2
            assert wire(await h.agent.session.read_events()) == events  # nothing repaired or added
            await turn(h.agent, "three")
            assert h.agent.turns == 3
            texts = [m.content[0].text for m in (await h.agent.read_transcript())]
            assert texts[-2:] == ["three", "pong: three"]
            await h.dispose()
        stored = load(home, "a1")[1]
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert [d["turn"] for d in turn_ends(stored)] == [1, 2, 3]


def write_open_turn_session(home, session_id: str) -> list[Event]:
    """A session as a crash leaves it: turn 1 complete, turn 2 started, never ended."""
    t = 1_700_000_000_000
    user = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    reply = {"id": "m2", "role": "assistant", "content": [{"type": "text", "text": "pong: hi"}]}
    user2 = {"id": "m3", "role": "user", "content": [{"type": "text", "text": "more"}], "source": {"kind": "user"}}
    specs = [
        ("turn/start", {"turn": 1}),
        ("user/message", user),
        ("assistant/message", reply),
        ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        ("turn/start", {"turn": 2}),
        ("step/start", {"turn": 2, "step": 1}),
        ("user/message", user2),
    ]
    events = [Event(type_, seq, t + seq, data) for seq, (type_, data) in enumerate(specs)]
    header = SessionHeader(id=session_id, created_at=t, cwd=str(home))
    home.mkdir(parents=True, exist_ok=True)
    with SessionStore.open(home / "sessions.db") as store:
        store.commit([Write(session_id, header, events)])
    return events


async def test_resume_repairs_an_open_turn_once_and_durably(tmp_path):
    # On a driver that cannot resume a step (the react driver continues the turn: below).
    home = tmp_path / "home"
    original = write_open_turn_session(home, "crashed")
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            rt.register_driver("fake", FakeDriver("fake"))
            h = await rt.resume_agent(resume_session_id="crashed", driver="fake")
            assert h.agent.turns == 2
            assert [m.id for m in (await h.agent.read_transcript())] == ["m1", "m2", "m3"]
            events = (await h.agent.session.read_events())
            assert wire(events[: len(original)]) == wire(original)
            repair = events[len(original)]
            # After the repair, only what the loop dock records on a first resume.
            assert {e.type for e in events[len(original) + 1 :]} == {"agent-preset/selected"}
            assert (repair.type, repair.seq) == ("turn/end", len(original))
            assert dict(repair.data) == {"turn": 2, "reason": {"kind": "interrupted"}}
            assert repair.time >= original[-1].time
            await h.agent.session.flush()
            # Durable: a separate connection already sees the repair.
            assert wire(load(home, "crashed")[1]) == wire(events)
            await h.dispose()

        # Resuming again does not repair again.
        async with Runtime.open(home) as rt:
            rt.register_driver("fake", FakeDriver("fake"))
            h = await rt.resume_agent(resume_session_id="crashed")
            assert len(await h.agent.session.read_events()) == len(events)  # no second repair, no rebinding
            await turn(h.agent, "next")
            assert h.agent.turns == 3
            await h.dispose()
        stored = load(home, "crashed")[1]
        assert turn_ends(stored) == [
            {"turn": 1, "reason": {"kind": "completed"}},
            {"turn": 2, "reason": {"kind": "interrupted"}},
            {"turn": 3, "reason": {"kind": "completed"}},
        ]
        assert [e.seq for e in stored] == list(range(len(stored)))


async def test_resume_on_the_react_driver_continues_the_open_turn_from_its_step(tmp_path):
    home = tmp_path / "home"
    original = write_open_turn_session(home, "crashed")
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            h = await rt.resume_agent(resume_session_id="crashed")
            await h.agent.wait_idle()
            assert h.agent.turns == 2
            assert [m.text for m in (await h.agent.read_transcript())] == ["hi", "pong: hi", "more", "pong: more"]
            events = await h.agent.session.read_events()
            await h.dispose()
    assert wire(events[: len(original)]) == wire(original)
    added = [e.type for e in events[len(original) :] if e.type != "agent-preset/selected"]
    # Step 1 of turn 2 is asked again (its reply was never durable), in the same step.
    assert added == ["request/header", "assistant/message", "step/end", "turn/end"]
    assert turn_ends(events) == [
        {"turn": 1, "reason": {"kind": "completed"}},
        {"turn": 2, "reason": {"kind": "completed"}},
    ]


async def test_resume_unknown_and_live_sessions(tmp_path):
    with trio.fail_after(10):
        async with Runtime.open(tmp_path / "home") as rt:
            with pytest.raises(SessionNotFoundError):
                await rt.resume_agent(resume_session_id="nobody")
            h = await rt.create_agent(session_id="live")
            await turn(h.agent, "hi")
            before = wire(await h.agent.session.read_events())
            with pytest.raises(AgentBusyError):
                await rt.resume_agent(resume_session_id="live")
            assert rt.list_agents() == ["live"]
            assert rt.get_agent("live") is h.agent
            assert wire(await h.agent.session.read_events()) == before
            await turn(h.agent, "still works")
            assert h.agent.turns == 2
            await h.dispose()
            assert [s.id for s in await rt.list_sessions()] == ["live"]


BAD_IDS = ["", "has space", "a/b", "x" * 200]


@pytest.mark.parametrize("bad", BAD_IDS, ids=["empty", "space", "slash", "200-chars"])
async def test_invalid_session_ids_are_refused_and_nothing_is_written(tmp_path, bad):
    home = tmp_path / "home"
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            h = await rt.create_agent(session_id="ok")
            await h.dispose()  # flushes the header although the session has no event
            before = await rt.list_sessions()
            assert [s.id for s in before] == ["ok"]
            with pytest.raises(InvalidSessionIdError):
                await rt.create_agent(session_id=bad)
            with pytest.raises(InvalidSessionIdError):
                await rt.resume_agent(resume_session_id=bad)
            with pytest.raises(InvalidSessionIdError):
                await rt.fork_session("ok", bad)
            assert rt.list_agents() == []
            assert await rt.list_sessions() == before
        with SessionStore.open(home / "sessions.db") as store:
            assert [h.id for h in store.list_headers()] == ["ok"]


# -- 7. fork -----------------------------------------------------------------------------


async def test_fork_after_two_turns_copies_the_whole_completed_prefix(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        assert source[-1].type == "turn/end"
        async with Runtime.open(home) as rt:
            assert await rt.fork_session("src", "copy") == "copy"
            headers = {h.id: h for h in await rt.list_sessions()}
        fork_header, fork_events = load(home, "copy")
        assert shape(fork_events) == shape(source)
        times = [e.time for e in fork_events]
        assert times == sorted(times)
        assert fork_header.parent_session == "src"
        assert fork_header.cwd == headers["src"].cwd
        assert headers["copy"] == fork_header
        assert headers["src"].parent_session is None
        assert wire(load(home, "src")[1]) == wire(source)  # the source is untouched


def turn_end_index(events, number: int) -> int:
    return next(
        i for i, e in enumerate(events) if e.type == "turn/end" and e.data["turn"] == number
    )


def turn_two_middle(events) -> int:
    start = next(i for i, e in enumerate(events) if e.type == "turn/start" and e.data["turn"] == 2)
    middle = next(i for i, e in enumerate(events) if i > start and e.type == "user/message")
    assert start < middle < turn_end_index(events, 2)
    return events[middle].seq


async def test_fork_upto_the_middle_of_turn_two_keeps_only_turn_one(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        async with Runtime.open(home) as rt:
            await rt.fork_session("src", "half", upto_seq=turn_two_middle(source))
        fork_events = load(home, "half")[1]
        end1 = turn_end_index(source, 1)
        # Everything through turn 1 is copied, and turn 2 is not cut in two.
        assert shape(fork_events[: end1 + 1]) == shape(source[: end1 + 1])
        assert [e.type for e in fork_events].count("turn/start") == 1
        assert turn_ends(fork_events) == [{"turn": 1, "reason": {"kind": "completed"}}]
        assert not any(e.data.get("turn") == 2 for e in fork_events)


async def test_fork_upto_the_middle_of_turn_two_ends_exactly_at_turn_one_end(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        async with Runtime.open(home) as rt:
            await rt.fork_session("src", "half", upto_seq=turn_two_middle(source))
        fork_events = load(home, "half")[1]
        assert shape(fork_events) == shape(source[: turn_end_index(source, 1) + 1])


async def test_fork_upto_a_turn_end_includes_that_turn(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        end1 = turn_end_index(source, 1)
        async with Runtime.open(home) as rt:
            await rt.fork_session("src", "t1", upto_seq=source[end1].seq)
            await rt.fork_session("src", "t0", upto_seq=source[end1].seq - 1)
        assert shape(load(home, "t1")[1]) == shape(source[: end1 + 1])
        t0 = load(home, "t0")[1]
        assert not any(e.type.startswith("turn/") for e in t0)  # turn 1 would be cut


async def test_fork_errors_leave_the_store_unchanged(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        async with Runtime.open(home) as rt:
            h = await rt.create_agent(session_id="other")
            await turn(h.agent, "mine")
            await h.dispose()
            other = wire(load(home, "other")[1])
            before = await rt.list_sessions()
            with pytest.raises(SessionExistsError):
                await rt.fork_session("src", "other")
            with pytest.raises(SessionExistsError):
                await rt.fork_session("src", "src")
            with pytest.raises(SessionNotFoundError):
                await rt.fork_session("missing", "new")
            assert await rt.list_sessions() == before
        assert wire(load(home, "other")[1]) == other
        assert wire(load(home, "src")[1]) == wire(source)


async def test_a_fork_resumes_and_continues_the_turn_numbering(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        source = await make_two_turn_session(home)
        async with Runtime.open(home) as rt:
            await rt.fork_session("src", "branch")
            h = await rt.resume_agent(resume_session_id="branch")
            assert h.agent.turns == 2
            assert [m.content[0].text for m in (await h.agent.read_transcript())] == [
                "one", "pong: one", "two", "pong: two"
            ]
            await turn(h.agent, "three")
            assert h.agent.turns == 3
            await h.dispose()
        branch = load(home, "branch")[1]
        assert [d["turn"] for d in turn_ends(branch)] == [1, 2, 3]
        assert [e.seq for e in branch] == list(range(len(branch)))
        assert wire(load(home, "src")[1]) == wire(source)  # the source did not move


async def test_fork_of_a_live_session_copies_its_completed_turns(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            h = await rt.create_agent(session_id="live")
            await turn(h.agent, "one")
            await rt.fork_session("live", "snap")
            live_events = (await h.agent.session.read_events())
            await h.dispose()
        header, events = load(home, "snap")
        assert header.parent_session == "live"
        assert shape(events) == shape(live_events)


# -- 8. create over an existing id ---------------------------------------------------------


async def test_creating_an_existing_session_is_refused_and_leaves_it_untouched(tmp_path):
    home = tmp_path / "home"
    with trio.fail_after(10):
        async with Runtime.open(home) as rt:
            h = await rt.create_agent(session_id="a1")
            await turn(h.agent, "hello")
            with pytest.raises(SessionExistsError):
                await rt.create_agent(session_id="a1")  # live
            assert rt.get_agent("a1") is h.agent
            await h.dispose()
            persisted = load(home, "a1")
            with pytest.raises(SessionExistsError):
                await rt.create_agent(session_id="a1")  # persisted only
            assert rt.list_agents() == []
        assert load(home, "a1") == persisted

        async with Runtime.open(home) as rt:
            with pytest.raises(SessionExistsError):
                await rt.create_agent(session_id="a1")  # after reopening
            assert [s.id for s in await rt.list_sessions()] == ["a1"]
        assert load(home, "a1") == persisted
