"""What peers can make the handlers keep: session ids checked, and caps per connection and
in all (``HostHandler``'s mirror, agents and inboxes, ``DockSelectHandler``'s bindings),
with what a connection that ended left behind going first when room is needed.

The handlers are driven directly, as the server calls them, with small caps patched in.
"""

import gc
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from loopdock.actors import LiveEvent
from loopdock.bridge import DockSelectHandler, HostHandler, LimitError, Select, _console, _dock_select, _host_handler
from loopdock.bridge._console import ConsoleHandler
from loopdock.bridge._handler import Disconnect
from loopdock.bridge._ledger import Ledger
from loopdock.bridge._messages import SessionEvent
from loopdock.runtime._errors import LoopdockError
from loopdock.runtime._events import Event

GONE = Disconnect("peer-closed", "test")


def peer(conn_id):
    return SimpleNamespace(id=conn_id, role="dsh-host", closed=None)


def event(session_id, seq=0):
    return SessionEvent(session_id, Event("turn/start", seq, 1, {"turn": 1}))


def created(agent_id, session_id=None):
    return LiveEvent("agent/created", agent_id, {"source": "startup", "sessionId": session_id or agent_id})


async def refused(call, code):
    with pytest.raises(LimitError) as info:
        await call
    assert info.value.code == code
    return str(info.value)


@pytest.fixture
def small_caps(monkeypatch):
    for name, value in [("MAX_SESSIONS", 4), ("MAX_SESSIONS_PER_CONNECTION", 3), ("MAX_AGENTS", 4),
                        ("MAX_AGENTS_PER_CONNECTION", 3), ("MAX_INBOX", 2), ("RETAINED_GAPS", 3)]:
        monkeypatch.setattr(_host_handler, name, value)
    monkeypatch.setattr(_dock_select, "MAX_BINDINGS", 4)
    monkeypatch.setattr(_dock_select, "MAX_BINDINGS_PER_CONNECTION", 3)


@pytest.fixture
def host(rt):
    return HostHandler(rt.dock)


# -- the ledger ----------------------------------------------------------------------------------


def test_the_ledger_counts_per_connection_and_keeps_the_order_ids_came_in():
    ledger = Ledger()
    for key, owner in [("a", "c1"), ("b", "c2"), ("c", "c1")]:
        ledger.add(key, owner)
    assert (len(ledger), ledger.held_by("c1"), ledger.held_by("c2")) == (3, 2, 1)
    assert ledger.oldest(lambda key: True) == "a"
    ledger.add("a", "c2")  # brought in again: moves, and is the newest
    assert (ledger.held_by("c1"), ledger.held_by("c2"), ledger.oldest(lambda key: True)) == (1, 2, "b")
    ledger.release("c2")
    assert (ledger.owner("a"), ledger.owner("b"), ledger.owner("c")) == (None, None, "c1")
    assert (len(ledger), ledger.held_by("c2")) == (3, 0)
    ledger.discard("a")
    ledger.discard("c")
    ledger.discard("never")
    assert (len(ledger), ledger.held_by("c1"), "b" in ledger, "a" in ledger) == (1, 0, True, False)


# -- session ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../..", "", "a\x00b", "x" * 100_000, 7, None])
async def test_an_announced_session_id_the_api_refuses_is_not_kept(host, bad):
    conn = peer("c1")
    host.connected(conn)
    await host.on_live(conn, [LiveEvent("agent/created", "a1", {"source": "startup", "sessionId": bad})])
    assert host.agents["a1"].session_id == "a1"  # the agent's own (checked) id instead


async def test_the_console_keeps_no_session_id_the_api_refuses_and_logs_little_of_what_a_peer_chose(rt):
    console = ConsoleHandler(DockSelectHandler(rt.dock))
    conn = peer("c1")
    huge = "z" * 100_000
    with capture_logs() as logs:
        await console.on_live(conn, [LiveEvent("agent/created", "a1", {"source": huge, "sessionId": huge})])
        with pytest.raises(LoopdockError) as info:  # the dock's message quotes the name whole
            await console.on_select(conn, Select("create", "s1", {"loop": huge}))
        assert info.value.code == "UNKNOWN_LOOP"
        await console.on_select(conn, Select("create", "s2", agent_preset=huge))
    assert console.rows["a1"].session_id == "a1"  # the agent's own id, as the host handler does
    assert [e["event"] for e in logs] == ["session start", "loop refused", "loop decision"]
    assert all(len(str(value)) <= 200 for entry in logs for value in entry.values()), logs


async def test_the_console_remembers_a_bounded_number_of_selects_whose_agent_never_came(rt, monkeypatch):
    monkeypatch.setattr(_console, "MAX_DECIDED", 4)
    console = ConsoleHandler(DockSelectHandler(rt.dock))
    conn = peer("c1")
    for n in range(10):
        await console.on_select(conn, Select("create", f"s{n}"))
    assert list(console._decided) == ["s6", "s7", "s8", "s9"]  # the newest MAX_DECIDED
    await console.on_live(conn, [created("a9", "s9")])
    assert console.rows["a9"].loop == "standard" and "s9" not in console._decided


# -- the mirror -------------------------------------------------------------------------------------


async def test_past_its_own_cap_a_connection_lets_go_of_its_oldest_session_without_an_agent(host, small_caps):
    conn = peer("c1")
    host.connected(conn)
    await host.on_events(conn, [event(f"s{n}") for n in range(5)])
    assert sorted(host.sessions) == ["s2", "s3", "s4"]


async def test_past_its_own_cap_with_every_session_live_a_connection_is_refused(host, small_caps):
    conn = peer("c1")
    host.connected(conn)
    await host.on_live(conn, [created(f"s{n}") for n in range(3)])
    await host.on_events(conn, [event(f"s{n}") for n in range(3)])
    why = await refused(host.on_events(conn, [event("s0", 1), event("s3"), event("s3", 1), event("s4")]), "TOO_MANY_SESSIONS")
    assert "2 new session(s)" in why and "'s3'" in why
    assert sorted(host.sessions) == ["s0", "s1", "s2"]
    assert [e.seq for e in host.sessions["s0"]] == [0, 1]  # the frame's other items were taken


async def test_the_cap_in_all_holds_across_connections(host, small_caps):
    first, second = peer("c1"), peer("c2")
    host.connected(first)
    host.connected(second)
    await host.on_live(first, [created(f"a{n}") for n in range(3)])
    await host.on_events(first, [event(f"a{n}") for n in range(3)])
    await host.on_live(second, [created("b0")])
    await host.on_events(second, [event("b0")])
    await refused(host.on_events(second, [event("b1")]), "TOO_MANY_SESSIONS")
    assert len(host.sessions) == 4


async def test_agents_a_connection_that_ended_left_behind_make_room_for_a_live_one(host, small_caps):
    gone, live = peer("c1"), peer("c2")
    host.connected(gone)
    await host.on_live(gone, [created(f"a{n}") for n in range(3)])  # never disposed
    await host.on_events(gone, [event("a0")])
    host.disconnected(gone, GONE)
    host.connected(live)
    await host.on_live(live, [created("b0")])
    assert sorted(host.agents) == ["a0", "a1", "a2", "b0"]
    await host.on_live(live, [created("b1")])
    assert sorted(host.agents) == ["a1", "a2", "b0", "b1"]  # the oldest left behind
    assert "a0" in host.sessions  # its mirror is a closed session's now


async def test_sessions_a_connection_that_ended_left_behind_make_room_for_a_live_one(host, small_caps, monkeypatch):
    monkeypatch.setattr(_host_handler, "MAX_AGENTS", 10)
    gone, live = peer("c1"), peer("c2")
    host.connected(gone)
    await host.on_live(gone, [created("a0"), created("a1")])
    await host.on_events(gone, [event("a0"), event("a1"), event("loose")])
    host.disconnected(gone, GONE)
    host.connected(live)
    await host.on_live(live, [created(f"b{n}") for n in range(3)])
    await host.on_events(live, [event("b0")])
    assert sorted(host.sessions) == ["a0", "a1", "b0", "loose"]
    # First the session no agent belongs to, then the oldest whose agents were left behind
    # (let go of with it); never one of a live connection's.
    await host.on_events(live, [event("b1")])
    assert sorted(host.sessions) == ["a0", "a1", "b0", "b1"]
    await host.on_events(live, [event("b2")])
    assert sorted(host.sessions) == ["a1", "b0", "b1", "b2"]
    assert sorted(host.agents) == ["a1", "b0", "b1", "b2"]


async def test_nothing_live_is_let_go_of_for_a_new_agent(host, small_caps):
    first, second = peer("c1"), peer("c2")
    host.connected(first)
    host.connected(second)
    await host.on_live(first, [created(f"a{n}") for n in range(3)])
    why = await refused(host.on_live(first, [created("a3")]), "TOO_MANY_AGENTS")
    assert "per connection" in why
    await host.on_live(second, [created("b0")])
    # An unknown agent's status teaches it too, and counts the same.
    await refused(host.on_live(second, [LiveEvent("agent/status", "b1", {"status": "idle"}), created("b2")]), "TOO_MANY_AGENTS")
    assert sorted(host.agents) == ["a0", "a1", "a2", "b0"]
    # A disposed agent makes room again.
    await host.on_live(first, [LiveEvent("agent/disposed", "a0", {}), created("a3")])
    assert sorted(host.agents) == ["a1", "a2", "a3", "b0"]


async def test_an_inbox_keeps_at_most_its_cap(host, small_caps):
    conn = peer("c1")
    host.connected(conn)

    def inserted(n):
        return LiveEvent("agent/inbox/inserted", "a1", {"message": {"id": f"m{n}", "role": "user"}})

    await host.on_live(conn, [created("a1"), inserted(0), inserted(1)])
    await refused(host.on_live(conn, [inserted(2), inserted(1)]), "INBOX_FULL")
    assert sorted(host.agents["a1"].inbox) == ["m0", "m1"]
    await host.on_live(conn, [LiveEvent("agent/inbox/claimed", "a1", {"message": {"id": "m0"}}), inserted(2)])
    assert sorted(host.agents["a1"].inbox) == ["m1", "m2"]


async def test_refused_items_leave_nothing_for_the_cyclic_collector(host, small_caps):
    # What a refusal keeps must be freed by reference counting, not kept in a cycle until
    # the (rare, freezing) cyclic collector runs: each refused frame here is 100 KB.
    conn = peer("c1")
    host.connected(conn)
    await host.on_live(conn, [created(f"a{n}") for n in range(3)])
    await host.on_events(conn, [event(f"a{n}") for n in range(3)])
    pad = {"pad": "p" * 100_000}
    gc.collect()
    gc.disable()
    try:
        for n in range(3):
            for call, code in [
                (host.on_live(conn, [LiveEvent("agent/status", f"b{n}", {"status": "idle", **pad})]), "TOO_MANY_AGENTS"),
                (host.on_events(conn, [SessionEvent(f"u{n}", Event("turn/start", 0, 1, pad))]), "TOO_MANY_SESSIONS"),
            ]:
                try:  # not pytest.raises: its ExceptionInfo and this frame would make a cycle
                    await call
                except LimitError as exc:
                    assert exc.code == code
                else:
                    pytest.fail("taken")
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert sorted(host.agents) == sorted(host.sessions) == ["a0", "a1", "a2"]


async def test_only_the_newest_gaps_are_kept(host, small_caps):
    conn = peer("c1")
    host.connected(conn)
    await host.on_events(conn, [event("s", seq) for seq in range(0, 20, 2)])
    assert [(g.expected, g.got) for g in host.gaps] == [(13, 14), (15, 16), (17, 18)]


# -- the dock's bindings ----------------------------------------------------------------------------


async def test_bindings_are_capped_per_connection_and_in_all_oldest_first(rt, small_caps):
    handler = DockSelectHandler(rt.dock)
    first, second = peer("c1"), peer("c2")
    for n in range(4):
        await handler.on_select(first, Select("create", f"a{n}"))
    assert sorted(handler.bindings) == ["a1", "a2", "a3"]  # its own oldest forgotten
    await handler.on_select(second, Select("create", "b0"))
    await handler.on_select(second, Select("create", "b1"))
    assert sorted(handler.bindings) == ["a2", "a3", "b0", "b1"]  # the oldest of all
    await handler.on_select(first, Select("create", "a2"))  # decided again: the newest now
    handler.disconnected(first, GONE)
    await handler.on_select(second, Select("create", "b2"))
    assert sorted(handler.bindings) == ["a2", "b0", "b1", "b2"]
