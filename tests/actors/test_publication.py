"""The publication transaction: setups, commits, scoped registrations and rollback."""

import pytest
import trio
import trio.testing

from loopdock.actors import UnknownHookError, UnknownServiceError
from loopdock.runtime import SetupError
from loopdock.runtime.tools import Tool


async def _noop(arguments, ctx):
    return "noop"


async def assert_nothing_left(rt, session_id="a1"):
    assert rt.list_agents() == []
    assert rt.get_agent(session_id) is None
    assert await rt.list_sessions() == []
    assert session_id not in rt.supervisor.sessions


async def test_setups_run_in_order_and_commits_only_after_all_setups(rt):
    calls = []

    def caller_setup(ctx):
        calls.append("setup 1")
        return lambda: calls.append("commit 1")

    async def second_setup(ctx):
        await trio.lowlevel.checkpoint()
        calls.append("setup 2")

        class Commit:
            def commit(self):
                calls.append("commit 2")

        return Commit()

    async def composed(ctx):
        from loopdock.actors import run_setups

        await run_setups(ctx, [caller_setup, None, second_setup])

    handle = await rt.create_agent(session_id="a1", setup=composed)
    assert calls == ["setup 1", "setup 2", "commit 1", "commit 2"]
    assert rt.list_agents() == ["a1"]
    await handle.dispose()


@pytest.mark.parametrize("where", ["setup", "commit"])
async def test_a_failing_setup_or_commit_leaves_nothing_behind(rt, where):
    registered = []

    def setup(ctx):
        registered.append(ctx.tools.register(Tool("scoped", "x", {"type": "object"}, _noop)))
        ctx.add_prompt_section("role", "you are a test")
        ctx.session.append("session/title", {"title": "half-built"})
        if where == "setup":
            raise ValueError("bad setup")

        def commit():
            raise ValueError("bad commit")

        return commit

    with pytest.raises(SetupError) as info:
        await rt.create_agent(session_id="a1", setup=setup)
    assert isinstance(info.value.__cause__, ValueError)
    await assert_nothing_left(rt)
    # The id is free again: a second creation succeeds and sees a clean slate.
    handle = await rt.create_agent(session_id="a1")
    assert "scoped" not in handle.agent.tools.names()
    assert "role" not in handle.agent.prompt_sections
    assert "session/title" not in [e.type for e in (await handle.agent.session.read_events())]
    await handle.dispose()


async def test_a_failing_resume_setup_keeps_the_persisted_session_unchanged(rt):
    handle = await rt.create_agent(session_id="a1")
    handle.agent.followup("hi")
    with trio.fail_after(5):
        await handle.agent.wait_idle()
    before = [e.type for e in (await handle.agent.session.read_events())]
    await handle.dispose()

    def setup(ctx):
        ctx.session.append("session/title", {"title": "should vanish"})
        raise RuntimeError("no")

    with pytest.raises(SetupError):
        await rt.resume_agent(resume_session_id="a1", setup=setup)
    assert rt.list_agents() == []
    resumed = await rt.resume_agent(resume_session_id="a1")
    assert [e.type for e in (await resumed.agent.session.read_events())] == before
    await resumed.dispose()


async def test_cancellation_during_setup_rolls_back(rt):
    entered = trio.Event()

    async def stuck(ctx):
        ctx.add_prompt_section("x", "y")
        entered.set()
        await trio.sleep_forever()

    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: rt.create_agent(session_id="a1", setup=stuck))
            await entered.wait()
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    await assert_nothing_left(rt)


async def test_scoped_registrations_are_undone_on_dispose(rt):
    base_tools = set(rt.tools.names())
    seen = {}

    def setup(ctx):
        ctx.tools.register(Tool("scoped", "x", {"type": "object"}, _noop))
        ctx.tools.restrict(deny=["write_file"])
        ctx.on("agent/pre-step", lambda pre, next_: next_(pre))
        seen["tools"] = set(ctx.tools.names())

    handle = await rt.create_agent(session_id="a1", setup=setup)
    assert seen["tools"] == base_tools - {"write_file"} | {"scoped"}
    assert len(handle.agent.pre_step) == 1
    await handle.dispose()
    assert len(handle.agent.pre_step) == 0
    assert set(handle.agent.tools.names()) == base_tools
    assert set(rt.tools.names()) == base_tools


async def test_services_and_hooks_are_checked(rt):
    rt.provide("greeter", "hello")
    got = {}

    def setup(ctx):
        got["service"] = ctx.get("greeter")
        with pytest.raises(UnknownServiceError):
            ctx.get("nothing")
        with pytest.raises(UnknownHookError):
            ctx.on("agent/teleport", lambda v, n: n(v))

    handle = await rt.create_agent(session_id="a1", setup=setup)
    assert got["service"] == "hello"
    await handle.dispose()


async def test_creating_a_live_or_persisted_id_is_refused(rt):
    from loopdock.runtime import SessionExistsError

    handle = await rt.create_agent(session_id="a1")
    with pytest.raises(SessionExistsError):
        await rt.create_agent(session_id="a1")
    await handle.dispose()
    with pytest.raises(SessionExistsError):
        await rt.create_agent(session_id="a1")
