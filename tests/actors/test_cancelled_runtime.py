"""A runtime cancelled from outside (an enclosing cancel scope, as Ctrl-C does) still
closes durably: a task that disposes its agent in a shielded ``finally`` (what a harness
does to leave nothing half-done) gets its session flushed even though the store writer
was cancelled along with everything else, instead of waiting forever for it."""

from __future__ import annotations

import trio

from loopdock import Runtime
from loopdock.runtime._store import SessionStore
from loopdock.runtime.models import ScriptedAdapter


async def test_a_shielded_dispose_after_an_outer_cancel_still_makes_the_session_durable(tmp_path):
    in_call = trio.Event()

    async def respond(request):
        in_call.set()
        await trio.sleep_forever()

    async def work(rt):
        handle = await rt.create_agent(session_id="a1", agent_options={"provider": "held", "model": "h"})
        try:
            handle.agent.followup("go")
            await handle.agent.wait_idle()
        finally:
            with trio.CancelScope(shield=True):
                await handle.dispose()

    with trio.fail_after(30):
        with trio.CancelScope() as outer:
            async with Runtime.open(tmp_path / "home") as rt:
                rt.register_adapter("held", ScriptedAdapter(respond))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(work, rt)
                    await in_call.wait()
                    outer.cancel()
    assert outer.cancelled_caught
    with SessionStore.open(tmp_path / "home" / "sessions.db") as store:
        _, events = store.load("a1")
    assert events[-1].type == "turn/end"
    # The outer cancel and the dispose race for the turn (trio runs a batch of woken tasks
    # in an arbitrary order): whichever ends it names the cause; either way that end is
    # durable.
    reason = events[-1].data["reason"]
    assert reason["kind"] == "aborted" and reason["cause"] in ("cancelled", "disposed"), reason
