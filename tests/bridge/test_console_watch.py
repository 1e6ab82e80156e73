"""The console's watch of the runtime's live events never ends ``serve``: a subscription
dropped for falling behind is replaced, an event it fails to show is skipped, and the
rows it shows read only what each session keeps in memory."""

from __future__ import annotations

import trio
import trio.testing
from structlog.testing import capture_logs

from loopdock import Runtime
from loopdock._bridge import runtime_view
from loopdock.bridge._console import ConsoleHandler


async def test_a_dropped_subscription_is_replaced_and_rows_catch_up(tmp_path):
    subscriptions = []
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home") as rt:
            console = ConsoleHandler(None, runtime_view(rt))

            def resubscribe():
                subscriptions.append(rt.subscribe_live())
                return subscriptions[-1]

            handles = [await rt.create_agent(session_id=f"a{i}") for i in range(5)]
            first = rt.subscribe_live(max_buffer=1)  # falls behind at the second event
            with capture_logs() as logs:
                async with trio.open_nursery() as nursery:
                    await nursery.start(console.watch_runtime, first, resubscribe)
                    for handle in handles:  # a burst: five inbox events, no checkpoint between
                        handle.agent.followup("hi")
                    for handle in handles:
                        await handle.agent.wait_idle()
                    await trio.testing.wait_all_tasks_blocked()
                    assert len(subscriptions) == 1  # dropped once, followed again
                    # Every agent's next event brings (or updates) its row.
                    for handle in handles:
                        handle.agent.followup("again")
                        await handle.agent.wait_idle()
                    await trio.testing.wait_all_tasks_blocked()
                    for handle in handles:
                        row = console.rows.get(handle.agent.id)
                        assert row is not None and (row.status, row.turns, row.last_turn) == ("idle", 2, "completed"), row
                    nursery.cancel_scope.cancel()
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert warnings.count("console fell behind the runtime's live events; following them again") == 1, warnings


async def test_an_event_the_console_fails_to_show_is_skipped(tmp_path, monkeypatch):
    failures = []
    real = ConsoleHandler.apply_live

    def apply_live(self, origin, item, view=None):
        if item.agent_id == "bad" and not failures:
            failures.append(item.type)
            raise KeyError("a bug in one row")
        return real(self, origin, item, view)

    monkeypatch.setattr(ConsoleHandler, "apply_live", apply_live)
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home") as rt:
            console = ConsoleHandler(None, runtime_view(rt))
            async with trio.open_nursery() as nursery:
                await nursery.start(console.watch_runtime, rt.subscribe_live(), rt.subscribe_live)
                bad = await rt.create_agent(session_id="bad")
                good = await rt.create_agent(session_id="good")
                for handle in (bad, good):
                    handle.agent.followup("hi")
                    await handle.agent.wait_idle()
                await trio.testing.wait_all_tasks_blocked()
                assert failures == ["agent/created"]
                assert console.rows["good"].turns == 1
                # Its creation was the event that failed; its next event brought its row.
                assert (console.rows["bad"].turns, console.rows["bad"].last_turn) == (1, "completed")
                nursery.cancel_scope.cancel()


async def test_the_view_reads_no_history_from_the_store(tmp_path, monkeypatch):
    with trio.fail_after(30):
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await rt.create_agent(session_id="a1")
            session = handle.agent.session
            for _ in range(3):
                handle.agent.followup("hi")
                await handle.agent.wait_idle()
                await session.flush()  # durable: the next turn's start trims it
            assert session.in_memory < session.event_count  # the agent trimmed its history
            reads = []
            monkeypatch.setattr(type(handle.agent.session), "_read", lambda self, *a: reads.append(a) or [])
            view = runtime_view(rt)("a1")
            assert view is not None and (view.turns, view.last_turn) == (3, "completed")
            assert reads == []
