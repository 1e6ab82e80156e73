"""The loop dock through a real Runtime: selection, durable binding, composition, presets,
configured agents and the original dock's two demos.

Rules: a temporary home per test, FakeDrivers (agents answering ``"<name>: <text>"``),
the offline ``ping`` model or a ScriptedAdapter, ``trio.fail_after`` around every test,
and no sleeps: agents are awaited with ``wait_idle`` and background starts with
``wait_all_tasks_blocked``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from leak_check import assert_no_leaked_agent_tasks

from loopdock import CreateAgentOptions, ResumeAgentOptions, Runtime
from loopdock.actors._fake import FakeDriver
from loopdock.actors.dock import (
    BINDING_EVENT,
    BINDING_KEY,
    DockConfig,
    DockError,
    DriverLoop,
    Route,
    StrategyLoop,
    UnknownPresetError,
    parse_config,
    read_binding,
)
from loopdock.runtime import InvalidOptionsError, InvalidSessionIdError, SetupError
from loopdock.runtime._events import Event, SessionHeader
from loopdock.runtime._store import SessionStore, Write
from loopdock.runtime.models import ModelRequest, Reply, ScriptedAdapter, ToolCall

TIMEOUT = 10


def noop(ctx):
    return None


def raises_code(code):
    return pytest.raises(DockError, check=lambda e: e.code == code)


@asynccontextmanager
async def opened(home: Path, **kwargs: Any) -> AsyncIterator[Runtime]:
    async with Runtime.open(home, **kwargs) as rt:
        yield rt
        assert_no_leaked_agent_tasks(rt)


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


async def ask(agent, text: str) -> str:
    agent.followup(text)
    await agent.wait_idle()
    return agent.transcript[-1].text


async def stored(rt: Runtime, session_id: str):
    return await trio.to_thread.run_sync(rt.supervisor.store.load, session_id)


async def stored_events(rt: Runtime, session_id: str) -> list[Event]:
    loaded = await stored(rt, session_id)
    assert loaded is not None, session_id
    return loaded[1]


def bindings(events) -> list[Any]:
    """Every ``agentLoopDock`` value recorded in a log, valid or not."""
    return [e.data[BINDING_KEY] for e in events if e.type == BINDING_EVENT and BINDING_KEY in e.data]


def preset_events(events) -> list[Any]:
    return [dict(e.data) for e in events if e.type == BINDING_EVENT]


async def until(predicate: Callable[[], bool]) -> None:
    """Let background tasks run until ``predicate()`` holds (the test's fail_after bounds it)."""
    while not predicate():
        await trio.testing.wait_all_tasks_blocked()


async def settled(rt: Runtime) -> None:
    """Wait until every configured agent has started or is blocked waiting for its loop
    or driver (nothing left to run)."""
    await trio.testing.wait_all_tasks_blocked()


def write_session(home: Path, session_id: str, events: list[tuple[str, dict]], agent_preset: str | None = None):
    """Persist a session directly, as an older loopdock (or another host) would have."""
    header = SessionHeader(id=session_id, created_at=1, cwd=str(home), agent_preset=agent_preset)
    with SessionStore.open(home / "sessions.db") as store:
        store.commit(
            [Write(session_id, header, tuple(Event(t, seq, 1, d) for seq, (t, d) in enumerate(events)))]
        )


class Recording:
    """Wraps a driver: records the calls and the handles it returned."""

    def __init__(self, inner, calls: list | None = None, label: str = "driver") -> None:
        self.inner = inner
        self.calls = calls if calls is not None else []
        self.label = label
        self.handles: list = []

    async def create_agent(self, owner, options):
        self.calls.append(("create", self.label, options.loop, options.driver))
        handle = await self.inner.create_agent(owner, options)
        self.handles.append(handle)
        return handle

    async def resume(self, owner, options):
        self.calls.append(("resume", self.label, options.loop, options.driver))
        handle = await self.inner.resume(owner, options)
        self.handles.append(handle)
        return handle


# -- session ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, ""])
async def test_create_and_resume_reject_missing_or_empty_session_ids(home, bad):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", fake))
            with pytest.raises(InvalidSessionIdError):
                await rt.dock.create_agent(rt.supervisor, CreateAgentOptions(session_id=bad, loop="fake"))
            with pytest.raises(InvalidSessionIdError):
                await rt.dock.resume(rt.supervisor, ResumeAgentOptions(resume_session_id=bad, loop="fake"))
            if bad == "":
                with pytest.raises(InvalidSessionIdError):
                    await rt.create_agent(session_id=bad, loop="fake")
                with pytest.raises(InvalidSessionIdError):
                    await rt.resume_agent(resume_session_id=bad, loop="fake")
            assert fake.created == [] and fake.resumed == []
            assert await rt.list_sessions() == []


async def test_runtime_driver_names_follow_the_loop_id_grammar(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            with raises_code("INVALID_DRIVER"):
                rt.register_driver("not a valid name", FakeDriver("x"))
            with raises_code("INVALID_DRIVER"):
                await rt.create_agent(session_id="a1", driver="Not Valid")
            with raises_code("INVALID_LOOP_ID"):
                await rt.create_agent(session_id="a1", loop="Not Valid")
            with raises_code("INVALID_LOOP_ID"):
                await rt.create_agent(session_id="a1", agent_options={"loop": "Not Valid"})
            assert rt.dock.list_drivers() == ["default"]
            assert await rt.list_sessions() == []


@pytest.mark.parametrize("field", ["loop", "driver"])
async def test_an_empty_explicit_loop_or_driver_is_rejected_not_ignored(home, field):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            with pytest.raises(DockError):
                await rt.create_agent(session_id="a1", **{field: ""})
            assert await rt.list_sessions() == []


async def test_the_legacy_factory_alias_never_selects_a_loop(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            # The original ignored `factory`; loopdock refuses unknown options outright, so it
            # can never be mistaken for a loop selection.
            with pytest.raises(InvalidOptionsError):
                await rt.create_agent(session_id="a1", agent_options={"factory": "legacy-factory"})
            assert await rt.list_sessions() == []


# -- driver loops ----------------------------------------------------------------------------


async def test_driver_selection_on_a_driver_loop_is_invalid_config(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = FakeDriver("full")
            rt.register_driver("loop1", FakeDriver("loop1"))
            rt.dock.register(DriverLoop.from_driver("full-driver", fake))
            for kwargs in ({"driver": "loop1"}, {"agent_options": {"driver": "loop1"}}, {"driver": "default"}):
                with raises_code("INVALID_CONFIG") as info:
                    await rt.create_agent(session_id="s", loop="full-driver", **kwargs)
                assert "full-driver" in str(info.value)
            assert fake.created == []
            assert await rt.list_sessions() == []


async def test_an_explicit_loop_reaches_its_driver_loop_and_the_handle_comes_back_unchanged(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = Recording(FakeDriver("pro"))
            rt.dock.register(DriverLoop.from_driver("pro-loop", fake))
            handle = await rt.create_agent(session_id="session-1", loop="pro-loop")
            assert fake.calls == [("create", "driver", "pro-loop", None)]
            assert handle is fake.handles[0]
            assert await ask(handle.agent, "hi") == "pro: hi"


async def test_an_unknown_loop_is_unknown_loop_and_nothing_is_persisted(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            with raises_code("UNKNOWN_LOOP") as info:
                await rt.create_agent(session_id="session-1", loop="missing")
            assert "'missing'" in str(info.value)
            assert "minimal-first, standard" in str(info.value)
            assert rt.list_agents() == []
            assert await rt.list_sessions() == []
            assert await stored(rt, "session-1") is None


async def test_a_driver_loop_binding_stores_the_loop_only(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.dock.register(DriverLoop.from_driver("pro-loop", FakeDriver("pro")))
            handle = await rt.create_agent(session_id="s1", loop="pro-loop")
            await handle.agent.session.flush()
            assert bindings(await stored_events(rt, "s1")) == [{"loop": "pro-loop"}]


# -- what the driver sees ----------------------------------------------------------------------


async def test_a_strategy_driver_sees_the_resolved_loop_and_driver_in_its_options(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = FakeDriver("loop1")
            rt.register_driver("loop1", fake)
            rt.dock.register(StrategyLoop(id="demo-loop", setup=noop, driver="loop1"))
            await rt.create_agent(session_id="s1", loop="demo-loop")
            (options,) = fake.created
            assert (options.loop, options.driver) == ("demo-loop", "loop1")
            assert (options.agent_options.loop, options.agent_options.driver) == ("demo-loop", "loop1")


async def test_a_driver_loop_sees_the_loop_in_options_and_agent_options(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = FakeDriver("pro")
            rt.dock.register(DriverLoop.from_driver("pro-loop", fake))
            # Selected through agent options only: the driver still sees it in both places.
            await rt.create_agent(session_id="s1", agent_options={"loop": "pro-loop"})
            (options,) = fake.created
            assert options.loop == options.agent_options.loop == "pro-loop"
            assert options.driver is None and options.agent_options.driver is None


async def test_loop_pins_override_provider_and_model_and_drop_reasoning_effort(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.register_adapter("scripted", ScriptedAdapter(lambda request: "ok"))
            fake = FakeDriver("pinned")
            rt.dock.register(DriverLoop.from_driver("pinned", fake, provider="scripted", model="m-pinned"))
            await rt.create_agent(
                session_id="s1",
                loop="pinned",
                agent_options={"provider": "ping", "model": "ping-1", "reasoning_effort": "max", "max_tokens": 512},
            )
            options = fake.created[0].agent_options
            assert (options.provider, options.model) == ("scripted", "m-pinned")
            assert options.reasoning_effort is None
            assert options.max_tokens == 512
            assert options.loop == "pinned"


async def test_a_model_only_pin_keeps_the_callers_provider(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            fake = FakeDriver("pinned")
            rt.dock.register(DriverLoop.from_driver("model-pin", fake, model="ping-pinned"))
            await rt.create_agent(
                session_id="s1", loop="model-pin", agent_options={"reasoning_effort": "high", "max_tokens": 99}
            )
            options = fake.created[0].agent_options
            assert (options.provider, options.model, options.reasoning_effort, options.max_tokens) == (
                "ping",
                "ping-pinned",
                None,
                99,
            )


async def test_a_strategy_pin_reaches_the_model_request(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            scripted = ScriptedAdapter(lambda request: "pinned answer")
            rt.register_adapter("scripted", scripted)
            rt.dock.register(StrategyLoop(id="pinned", setup=noop, provider="scripted", model="m-pinned"))
            handle = await rt.create_agent(
                session_id="s1", loop="pinned", agent_options={"reasoning_effort": "high", "max_tokens": 321}
            )
            assert await ask(handle.agent, "hi") == "pinned answer"
            (request,) = scripted.requests
            assert (request.provider, request.model, request.reasoning_effort, request.max_tokens) == (
                "scripted",
                "m-pinned",
                None,
                321,
            )


# -- two-layer routing --------------------------------------------------------------------------


async def test_four_composite_strategies_over_two_named_drivers_each_reach_the_right_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            loop1, loop2 = FakeDriver("loop1"), FakeDriver("loop2")
            rt.register_driver("loop1", loop1)
            rt.register_driver("loop2", loop2)
            assert rt.dock.list_drivers() == ["default", "loop1", "loop2"]
            slots = ["loop1.strategy1", "loop1.strategy2", "loop2.strategy3", "loop2.strategy4"]
            for slot in slots:
                rt.dock.register(StrategyLoop(id=slot, setup=noop, driver=slot.split(".")[0]))
            replies = {}
            for number, slot in enumerate(slots, start=1):
                handle = await rt.create_agent(session_id=f"a{number}", loop=slot)
                replies[slot] = await ask(handle.agent, "hi")
            assert [(o.session_id, o.loop, o.driver) for o in loop1.created] == [
                ("a1", "loop1.strategy1", "loop1"),
                ("a2", "loop1.strategy2", "loop1"),
            ]
            assert [(o.session_id, o.loop, o.driver) for o in loop2.created] == [
                ("a3", "loop2.strategy3", "loop2"),
                ("a4", "loop2.strategy4", "loop2"),
            ]
            assert replies == {slot: f"{slot.split('.')[0]}: hi" for slot in slots}


async def test_one_strategy_runs_on_two_drivers_chosen_at_runtime(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            loop1, loop2 = FakeDriver("loop1"), FakeDriver("loop2")
            rt.register_driver("loop1", loop1)
            rt.register_driver("loop2", loop2)
            rt.dock.register(StrategyLoop(id="strategy-shared", setup=noop))
            a = await rt.create_agent(session_id="a", loop="strategy-shared", driver="loop1")
            b = await rt.create_agent(session_id="b", agent_options={"loop": "strategy-shared", "driver": "loop2"})
            assert [(o.session_id, o.loop, o.driver) for o in loop1.created] == [("a", "strategy-shared", "loop1")]
            assert [(o.session_id, o.loop, o.driver) for o in loop2.created] == [("b", "strategy-shared", "loop2")]
            assert await ask(a.agent, "x") == "loop1: x"
            assert await ask(b.agent, "y") == "loop2: y"


async def test_an_explicit_driver_overrides_the_strategys_preferred_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            loop1, loop2 = FakeDriver("loop1"), FakeDriver("loop2")
            rt.register_driver("loop1", loop1)
            rt.register_driver("loop2", loop2)
            rt.dock.register(StrategyLoop(id="loop2.strategy3", setup=noop, driver="loop2"))
            handle = await rt.create_agent(session_id="a", loop="loop2.strategy3", driver="loop1")
            assert loop2.created == [] and len(loop1.created) == 1
            assert await ask(handle.agent, "x") == "loop1: x"


async def test_a_named_driver_strategy_waits_for_its_own_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.dock.register(StrategyLoop(id="loop2.strategy3", setup=noop, driver="loop2"))
            # The default driver exists, but this strategy wants loop2.
            with raises_code("MISSING_DRIVER") as info:
                await rt.create_agent(session_id="s", loop="loop2.strategy3")
            assert "loop2" in str(info.value) and "default" in str(info.value)
            rt.register_driver("loop1", FakeDriver("loop1"))
            with raises_code("MISSING_DRIVER"):
                await rt.create_agent(session_id="s", loop="loop2.strategy3")
            assert await rt.list_sessions() == []
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            handle = await rt.create_agent(session_id="s", loop="loop2.strategy3")
            assert [o.session_id for o in loop2.created] == ["s"]
            assert await ask(handle.agent, "hi") == "loop2: hi"


async def test_a_session_route_driver_applies_under_an_explicit_loop(home):
    config = {"sessionLoops": {"s": {"loop": "standard", "driver": "loop2"}}}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            rt.dock.register(StrategyLoop(id="custom", setup=noop))
            handle = await rt.create_agent(session_id="s", loop="custom")
            assert [(o.loop, o.driver) for o in loop2.created] == [("custom", "loop2")]
            assert await ask(handle.agent, "hi") == "loop2: hi"


# -- the default driver --------------------------------------------------------------------------


async def test_strategy_loops_need_a_registered_default_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            ran = []
            rt.dock.register(StrategyLoop(id="demo-loop", setup=lambda ctx: ran.append(ctx.agent.id)))
            rt.dock.default_driver = "nope"
            with raises_code("MISSING_DRIVER") as info:
                await rt.create_agent(session_id="session-1", loop="demo-loop")
            assert "'nope'" in str(info.value) and "demo-loop" in str(info.value)
            assert ran == []
            assert await rt.list_sessions() == []
            fake = FakeDriver("nope")
            rt.register_driver("nope", fake)
            handle = await rt.create_agent(session_id="session-1", loop="demo-loop")
            assert ran == ["session-1"]
            assert [(o.loop, o.driver) for o in fake.created] == [("demo-loop", "nope")]
            await handle.agent.session.flush()
            assert bindings(await stored_events(rt, "session-1")) == [{"loop": "demo-loop", "driver": "nope"}]


async def test_the_default_driver_setting_drives_new_sessions(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            rt.dock.default_driver = "loop2"
            a = await rt.create_agent(session_id="a")  # the default loop: standard
            assert [(o.session_id, o.loop, o.driver) for o in loop2.created] == [("a", "standard", "loop2")]
            assert await ask(a.agent, "hi") == "loop2: hi"
            rt.dock.default_driver = None  # back to the config's: the react driver
            b = await rt.create_agent(session_id="b")
            assert len(loop2.created) == 1
            assert await ask(b.agent, "hi") == "pong: hi"
            await a.agent.session.flush()
            await b.agent.session.flush()
            assert bindings(await stored_events(rt, "a")) == [{"loop": "standard", "driver": "loop2"}]
            assert bindings(await stored_events(rt, "b")) == [{"loop": "standard", "driver": "default"}]


async def test_the_config_default_driver_is_used_when_nothing_else_picks_one(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config={"defaultDriver": "loop2"}) as rt:
            with raises_code("MISSING_DRIVER"):
                await rt.create_agent(session_id="a")
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            handle = await rt.create_agent(session_id="a")
            assert await ask(handle.agent, "hi") == "loop2: hi"


# -- composition ----------------------------------------------------------------------------------


async def test_caller_setup_runs_before_the_strategy_setup(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            order = []
            rt.dock.register(StrategyLoop(id="demo-loop", setup=lambda ctx: order.append("strategy")))
            await rt.create_agent(session_id="s1", loop="demo-loop", setup=lambda ctx: order.append("caller"))
            assert order == ["caller", "strategy"]


async def test_the_dock_setups_run_between_the_caller_and_the_strategy(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            seen = {}

            async def caller(ctx):
                seen["caller"] = (read_binding(await ctx.session.read_events()), len(ctx.agent.request))

            async def strategy(ctx):
                seen["strategy"] = (read_binding(await ctx.session.read_events()), len(ctx.agent.request))

            rt.dock.register(StrategyLoop(id="demo-loop", setup=strategy))
            await rt.create_agent(session_id="s1", loop="demo-loop", setup=caller)
            # caller -> durable binding -> route-follow (one request listener) -> strategy
            assert seen == {"caller": (None, 0), "strategy": (Route("demo-loop", "default"), 1)}


async def test_the_strategy_wrapper_delegates_create_and_resume_through_the_driver_in_order(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            events = []
            driver = Recording(FakeDriver("loop1"), calls=events)
            rt.register_driver("loop1", driver)
            rt.dock.register(StrategyLoop(id="demo", setup=lambda ctx: events.append("strategy"), driver="loop1"))
            handle = await rt.create_agent(session_id="s1", loop="demo", setup=lambda ctx: events.append("caller"))
            assert events == [("create", "driver", "demo", "loop1"), "caller", "strategy"]
            await handle.dispose()
            events.clear()
            await rt.resume_agent(resume_session_id="s1")
            assert events == [("resume", "driver", "demo", "loop1"), "strategy"]


async def test_setups_run_in_order_and_commits_run_in_order_only_after_every_setup(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            calls = []

            class Commit:
                def __init__(self, name):
                    self.name = name

                def commit(self):
                    calls.append(f"commit {self.name}")

            async def caller(ctx):
                await trio.lowlevel.checkpoint()
                calls.append("setup caller")
                return Commit("caller")

            def strategy(ctx):
                calls.append("setup strategy")
                return lambda: calls.append("commit strategy")  # a plain-function commit

            rt.dock.register(StrategyLoop(id="demo", setup=strategy))
            handle = await rt.create_agent(session_id="s1", loop="demo", setup=caller)
            assert calls == ["setup caller", "setup strategy", "commit caller", "commit strategy"]
            assert rt.list_agents() == ["s1"]
            assert await ask(handle.agent, "hi") == "pong: hi"


async def assert_nothing_left(rt: Runtime, session_id: str) -> None:
    assert rt.list_agents() == []
    assert rt.get_agent(session_id) is None
    assert session_id not in rt.supervisor.sessions
    assert await rt.list_sessions() == []
    assert await stored(rt, session_id) is None


@pytest.mark.parametrize("where", ["caller-setup", "strategy-setup", "caller-commit", "strategy-commit"])
async def test_a_failing_setup_or_commit_leaves_no_agent_no_session_and_no_binding(home, where):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            calls = []

            def step(name):
                def setup(ctx):
                    calls.append(f"setup {name}")
                    ctx.add_prompt_section(name, "x")
                    if where == f"{name}-setup":
                        raise ValueError(f"bad {name} setup")

                    def commit():
                        calls.append(f"commit {name}")
                        if where == f"{name}-commit":
                            raise ValueError(f"bad {name} commit")

                    return commit

                return setup

            fake = FakeDriver("loop1")
            rt.register_driver("loop1", fake)
            rt.dock.register(StrategyLoop(id="demo", setup=step("strategy"), driver="loop1"))
            with pytest.raises(SetupError) as info:
                await rt.create_agent(session_id="s1", loop="demo", setup=step("caller"))
            assert isinstance(info.value.__cause__, ValueError)
            expected = {
                # a failing setup stops the rest and runs no commit
                "caller-setup": ["setup caller"],
                "strategy-setup": ["setup caller", "setup strategy"],
                # a failing commit stops the later commits
                "caller-commit": ["setup caller", "setup strategy", "commit caller"],
                "strategy-commit": ["setup caller", "setup strategy", "commit caller", "commit strategy"],
            }[where]
            assert calls == expected
            await assert_nothing_left(rt, "s1")
            # The id is free again and the new agent starts clean.
            rt.dock.unregister("demo")
            rt.dock.register(StrategyLoop(id="demo", setup=noop, driver="loop1"))
            handle = await rt.create_agent(session_id="s1", loop="demo")
            assert handle.agent.prompt_sections == {}
            await handle.agent.session.flush()
            assert bindings(await stored_events(rt, "s1")) == [{"loop": "demo", "driver": "loop1"}]


async def test_a_failing_strategy_setup_on_resume_leaves_the_session_unchanged(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.dock.register(StrategyLoop(id="fragile", setup=noop))
            handle = await rt.create_agent(session_id="s1", loop="fragile")
            await handle.dispose()
            before = await stored_events(rt, "s1")
            rt.dock.unregister("fragile")

            def broken(ctx):
                ctx.session.append("session/title", {"title": "half"})
                raise ValueError("broken")

            rt.dock.register(StrategyLoop(id="fragile", setup=broken))
            with pytest.raises(SetupError):
                await rt.resume_agent(resume_session_id="s1")
            assert rt.list_agents() == []
            assert await stored_events(rt, "s1") == before


# -- the durable binding ------------------------------------------------------------------------


async def test_create_records_exactly_one_binding_on_the_known_event(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.register_driver("loop1", FakeDriver("loop1"))
            handle = await rt.create_agent(session_id="s1", loop="standard", driver="loop1")
            await handle.agent.session.flush()
            events = await stored_events(rt, "s1")
            assert bindings(events) == [{"loop": "standard", "driver": "loop1"}]
            assert read_binding(events) == Route("standard", "loop1")
            # The standard strategy's preset mount follows on the same known event type.
            assert preset_events(events)[-1] == {"agentPreset": "standard"}


async def test_the_binding_keeps_the_effective_preset_a_caller_mounted(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:

            async def mount_minimal(ctx):
                await ctx.get("agentPresets").mount(ctx, "minimal")

            handle = await rt.create_agent(session_id="s1", setup=mount_minimal)
            await handle.agent.session.flush()
            events = preset_events(await stored_events(rt, "s1"))
            assert events == [
                {"agentPreset": "minimal"},
                {"agentPreset": "minimal", BINDING_KEY: {"loop": "standard", "driver": "default"}},
            ]


async def test_two_agents_on_two_loops_and_drivers_resume_on_them_after_a_restart(home):
    def register(rt):
        drivers = FakeDriver("loop1"), FakeDriver("loop2")
        rt.register_driver("loop1", drivers[0])
        rt.register_driver("loop2", drivers[1])
        rt.dock.register(StrategyLoop(id="alpha", setup=noop, driver="loop1"))
        rt.dock.register(StrategyLoop(id="beta", setup=noop))
        return drivers

    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            register(rt)
            a = await rt.create_agent(session_id="a", loop="alpha")
            b = await rt.create_agent(session_id="b", loop="beta", driver="loop2")
            assert await ask(a.agent, "one") == "loop1: one"
            assert await ask(b.agent, "one") == "loop2: one"

        async with opened(home) as rt:
            loop1, loop2 = register(rt)
            a = await rt.resume_agent(resume_session_id="a")
            b = await rt.resume_agent(resume_session_id="b")
            assert [(o.resume_session_id, o.loop, o.driver) for o in loop1.resumed] == [("a", "alpha", "loop1")]
            assert [(o.resume_session_id, o.loop, o.driver) for o in loop2.resumed] == [("b", "beta", "loop2")]
            assert loop1.created == [] and loop2.created == []
            assert await ask(a.agent, "two") == "loop1: two"
            assert await ask(b.agent, "two") == "loop2: two"
            # The whole conversation survived the restart.
            assert [m.text for m in a.agent.transcript] == ["one", "loop1: one", "two", "loop1: two"]


async def test_sessions_without_a_preset_resume_on_their_recorded_loop_and_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.register_driver("loop1", FakeDriver("loop1"))
            rt.dock.register(StrategyLoop(id="custom", setup=noop))
            handle = await rt.create_agent(session_id="s1", loop="custom", driver="loop1")
            await handle.agent.session.flush()
            events = await stored_events(rt, "s1")
            assert (await stored(rt, "s1"))[0].agent_preset is None
            assert [e for e in preset_events(events) if "agentPreset" in e] == []

        async with opened(home) as rt:
            loop1 = FakeDriver("loop1")
            rt.register_driver("loop1", loop1)
            rt.dock.register(StrategyLoop(id="custom", setup=noop))
            handle = await rt.resume_agent(resume_session_id="s1")
            # Not the default driver, although it is registered and nothing was asked for.
            assert [(o.loop, o.driver) for o in loop1.resumed] == [("custom", "loop1")]
            assert await ask(handle.agent, "hi") == "loop1: hi"


async def test_resume_needs_the_bound_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.register_driver("loop1", FakeDriver("loop1"))
            handle = await rt.create_agent(session_id="s1", driver="loop1")
            await handle.dispose()

        async with opened(home) as rt:
            before = await stored_events(rt, "s1")
            with raises_code("MISSING_DRIVER") as info:
                await rt.resume_agent(resume_session_id="s1")
            assert "loop1" in str(info.value)
            assert rt.list_agents() == []
            assert await stored_events(rt, "s1") == before


async def test_resume_does_not_record_the_binding_again(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.register_driver("loop1", FakeDriver("loop1"))
            handle = await rt.create_agent(session_id="s1", driver="loop1")
            await ask(handle.agent, "hi")
            await handle.dispose()
            created = preset_events(await stored_events(rt, "s1"))
            for _ in range(2):
                handle = await rt.resume_agent(resume_session_id="s1")
                await ask(handle.agent, "again")
                await handle.dispose()
            events = await stored_events(rt, "s1")
            assert preset_events(events) == created
            assert bindings(events) == [{"loop": "standard", "driver": "loop1"}]


async def test_resume_prefers_the_newest_valid_binding_over_the_header_preset_route(home):
    write_session(
        home,
        "s1",
        [
            (BINDING_EVENT, {BINDING_KEY: {"loop": "loop-old"}}),
            (BINDING_EVENT, {"agentPreset": "old-preset", BINDING_KEY: {"loop": "loop-new"}}),
        ],
        agent_preset="old-preset",
    )
    config = {"presetLoops": {"old-preset": "loop-old"}}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            old, new = FakeDriver("old"), FakeDriver("new")
            rt.dock.register(DriverLoop.from_driver("loop-old", old))
            rt.dock.register(DriverLoop.from_driver("loop-new", new))
            handle = await rt.resume_agent(resume_session_id="s1")
            assert old.resumed == [] and [o.loop for o in new.resumed] == ["loop-new"]
            assert await ask(handle.agent, "hi") == "new: hi"


async def test_resume_prefers_the_newest_selected_preset_over_the_header(home):
    write_session(
        home,
        "session-1",
        [(BINDING_EVENT, {"agentPreset": "old-preset"}), (BINDING_EVENT, {"agentPreset": "fake-example-preset"})],
        agent_preset="old-preset",
    )
    config = {"presetLoops": {"fake-example-preset": "fake", "old-preset": "old"}}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            fake, old = FakeDriver("fake"), FakeDriver("old")
            rt.dock.register(DriverLoop.from_driver("fake", fake))
            rt.dock.register(DriverLoop.from_driver("old", old))
            await rt.resume_agent(resume_session_id="session-1")
            assert [o.loop for o in fake.resumed] == ["fake"] and old.resumed == []


async def test_a_stored_binding_is_merged_over_the_preset_route_field_by_field(home):
    # The preset route says which driver; the binding (from an older dock) only the loop.
    write_session(home, "s1", [(BINDING_EVENT, {BINDING_KEY: {"loop": "custom"}})], agent_preset="p")
    config = {"presetLoops": {"p": {"loop": "standard", "driver": "loop2"}}}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            rt.dock.register(StrategyLoop(id="custom", setup=noop))
            await rt.resume_agent(resume_session_id="s1")
            assert [(o.loop, o.driver) for o in loop2.resumed] == [("custom", "loop2")]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"loop": "other-loop"}, id="explicit-loop"),
        pytest.param({"agent_options": {"loop": "other-loop"}}, id="agent-options-loop"),
        pytest.param({"loop": "strategy-shared", "driver": "loop2"}, id="explicit-driver-same-loop"),
        pytest.param({"driver": "loop2"}, id="explicit-driver-only"),
    ],
)
async def test_resume_refuses_a_loop_or_driver_switch_and_leaves_the_session_unchanged(home, kwargs):
    def register(rt):
        drivers = FakeDriver("loop1"), FakeDriver("loop2")
        rt.register_driver("loop1", drivers[0])
        rt.register_driver("loop2", drivers[1])
        rt.dock.register(StrategyLoop(id="strategy-shared", setup=noop))
        rt.dock.register(StrategyLoop(id="other-loop", setup=noop))
        return drivers

    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            register(rt)
            handle = await rt.create_agent(session_id="s1", loop="strategy-shared", driver="loop1")
            await ask(handle.agent, "hi")

        async with opened(home) as rt:
            loop1, loop2 = register(rt)
            before = await stored_events(rt, "s1")
            with raises_code("LOOP_SWITCH") as info:
                await rt.resume_agent(resume_session_id="s1", **kwargs)
            assert "'s1'" in str(info.value)
            assert loop1.resumed == [] and loop2.resumed == []
            assert rt.list_agents() == []
            assert await stored_events(rt, "s1") == before
            # Asking for what it is bound to (or nothing) still works.
            handle = await rt.resume_agent(resume_session_id="s1", loop="strategy-shared", driver="loop1")
            assert await ask(handle.agent, "back") == "loop1: back"


async def test_a_session_route_to_another_loop_is_a_loop_switch_on_resume(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            await rt.create_agent(session_id="s1")
        async with opened(home, config={"sessionLoops": {"s1": "minimal-first"}}) as rt:
            with raises_code("LOOP_SWITCH"):
                await rt.resume_agent(resume_session_id="s1")
            assert rt.list_agents() == []


async def test_a_malformed_persisted_binding_degrades_to_none(home):
    write_session(home, "s1", [(BINDING_EVENT, {BINDING_KEY: {"loop": "not a loop id"}})])
    with trio.fail_after(TIMEOUT):
        async with opened(home, config={"defaultLoop": "fallback"}) as rt:
            fallback = FakeDriver("fallback")
            rt.dock.register(DriverLoop.from_driver("fallback", fallback))
            # A would-be switch is no switch: there is no valid binding to switch from.
            handle = await rt.resume_agent(resume_session_id="s1", loop="fallback")
            assert [o.loop for o in fallback.resumed] == ["fallback"]
            await handle.agent.session.flush()
            events = await stored_events(rt, "s1")
            assert bindings(events) == [{"loop": "not a loop id"}, {"loop": "fallback"}]
            assert read_binding(events) == Route("fallback")


async def test_a_malformed_newer_binding_is_skipped_for_the_older_valid_one(home):
    write_session(
        home,
        "s1",
        [
            (BINDING_EVENT, {BINDING_KEY: {"loop": "bound"}}),
            (BINDING_EVENT, {BINDING_KEY: {"loop": "bound", "driver": "Bad Driver"}}),
            (BINDING_EVENT, {BINDING_KEY: "garbage"}),
        ],
    )
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            bound = FakeDriver("bound")
            rt.dock.register(DriverLoop.from_driver("bound", bound))
            handle = await rt.resume_agent(resume_session_id="s1")
            assert [o.loop for o in bound.resumed] == ["bound"]
            await handle.agent.session.flush()
            assert len(bindings(await stored_events(rt, "s1"))) == 3  # nothing new recorded


async def test_an_older_session_without_a_binding_gets_one_on_its_first_resume(home):
    write_session(home, "old", [("session/title", {"title": "from before the dock"})])
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            rt.dock.default_driver = "loop2"  # no binding: loop.driver ?? the current default
            handle = await rt.resume_agent(resume_session_id="old")
            assert [(o.loop, o.driver) for o in loop2.resumed] == [("standard", "loop2")]
            assert await ask(handle.agent, "hi") == "loop2: hi"
            await handle.dispose()
            assert bindings(await stored_events(rt, "old")) == [{"loop": "standard", "driver": "loop2"}]
            # The binding is now the identity: the default driver no longer decides.
            rt.dock.default_driver = None
            handle = await rt.resume_agent(resume_session_id="old")
            assert [(o.loop, o.driver) for o in loop2.resumed][-1] == ("standard", "loop2")
            await handle.dispose()
            assert len(bindings(await stored_events(rt, "old"))) == 1


async def test_an_older_session_resumes_on_its_header_preset_route(home):
    write_session(home, "old", [], agent_preset="example-preset")
    with trio.fail_after(TIMEOUT):
        async with opened(home, config={"presetLoops": {"example-preset": "example-loop"}}) as rt:
            example = FakeDriver("example")
            rt.dock.register(DriverLoop.from_driver("example-loop", example))
            handle = await rt.resume_agent(resume_session_id="old")
            assert [o.loop for o in example.resumed] == ["example-loop"]
            await handle.agent.session.flush()
            assert preset_events(await stored_events(rt, "old")) == [
                {"agentPreset": "example-preset", BINDING_KEY: {"loop": "example-loop"}}
            ]


# -- route-follow -----------------------------------------------------------------------------


@pytest.fixture
def route_config():
    return {"presetLoops": {"minimal": "pinned-loop"}}


def register_pinned(rt):
    pinned = ScriptedAdapter(lambda request: "pinned")
    own = ScriptedAdapter(lambda request: "own")
    rt.register_adapter("scripted", pinned)
    rt.register_adapter("own", own)
    rt.dock.register(StrategyLoop(id="pinned-loop", setup=noop, provider="scripted", model="m-pinned"))
    rt.dock.register(StrategyLoop(id="bare", setup=noop))
    return pinned, own


OWN = {"provider": "own", "model": "m-own", "reasoning_effort": "high", "max_tokens": 321}


def route_of(request: ModelRequest):
    return request.provider, request.model, request.reasoning_effort, request.max_tokens


async def test_a_preset_routed_to_a_pinned_loop_pins_every_request(home, route_config):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=route_config) as rt:
            pinned, own = register_pinned(rt)
            handle = await rt.create_agent(session_id="p1", agent_preset="minimal", agent_options=OWN)
            assert await ask(handle.agent, "one") == "pinned"
            assert await ask(handle.agent, "two") == "pinned"
            assert [route_of(r) for r in pinned.requests] == [("scripted", "m-pinned", None, 321)] * 2
            assert own.requests == []
            await handle.agent.session.flush()
            assert bindings(await stored_events(rt, "p1")) == [{"loop": "pinned-loop", "driver": "default"}]


async def test_the_pinned_route_follows_the_effective_preset_per_request(home, route_config):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=route_config) as rt:
            pinned, own = register_pinned(rt)
            # An explicit unpinned loop; the session's preset maps to the pinned one.
            handle = await rt.create_agent(session_id="p2", loop="bare", agent_preset="minimal", agent_options=OWN)
            agent = handle.agent
            assert await ask(agent, "one") == "pinned"
            assert route_of(pinned.requests[-1]) == ("scripted", "m-pinned", None, 321)

            # The preset changes: the pin is released and the agent's own route is back.
            agent.session.append(BINDING_EVENT, {"agentPreset": "standard"})
            assert await ask(agent, "two") == "own"
            assert route_of(own.requests[-1]) == ("own", "m-own", "high", 321)

            # And back again.
            agent.session.append(BINDING_EVENT, {"agentPreset": "minimal"})
            assert await ask(agent, "three") == "pinned"
            assert len(pinned.requests) == 2 and len(own.requests) == 1
            headers = [(e.data["provider"], e.data["model"]) for e in (await agent.session.read_events()) if e.type == "request/header"]
            assert headers == [("scripted", "m-pinned"), ("own", "m-own"), ("scripted", "m-pinned")]


def replay_pinned_route(ctx):
    """A setup whose inner listener still carries the pin of an earlier request."""

    async def replay_pin(request, next_):
        return attrs.evolve(await next_(request), provider="scripted", model="m-pinned")

    ctx.on("agent/request", replay_pin)


async def test_a_stale_pin_falls_back_to_the_agents_own_route(home, route_config):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=route_config) as rt:
            pinned, own = register_pinned(rt)
            handle = await rt.create_agent(
                session_id="p3",
                loop="bare",
                setup=replay_pinned_route,
                agent_options={"provider": "own", "model": "m-own"},
            )
            assert await ask(handle.agent, "hi") == "own"
            assert pinned.requests == []
            assert route_of(own.requests[0])[:2] == ("own", "m-own")


async def test_what_counts_as_a_stale_pin_follows_the_registry_and_the_config(home, route_config):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=route_config) as rt:
            pinned, own = register_pinned(rt)
            handle = await rt.create_agent(
                session_id="p5",
                loop="bare",
                setup=replay_pinned_route,
                agent_options={"provider": "own", "model": "m-own"},
            )
            assert await ask(handle.agent, "pinned by a preset's loop") == "own"
            # No preset maps to a loop that pins it any more: the route is the listener's own.
            assert rt.dock.unregister("pinned-loop")
            assert await ask(handle.agent, "loop gone") == "pinned"
            rt.dock.register(StrategyLoop(id="pinned-loop", setup=noop, provider="scripted", model="m-pinned"))
            assert await ask(handle.agent, "loop back") == "own"
            rt.dock.config = DockConfig()  # a config that maps no preset
            assert await ask(handle.agent, "no preset maps") == "pinned"
            assert len(pinned.requests) == 2 and len(own.requests) == 2


async def test_without_a_pinned_route_requests_are_left_alone(home, route_config):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=route_config) as rt:
            pinned, own = register_pinned(rt)
            handle = await rt.create_agent(session_id="p4", loop="bare", agent_preset="standard", agent_options=OWN)
            assert await ask(handle.agent, "hi") == "own"
            assert route_of(own.requests[0]) == ("own", "m-own", "high", 321)
            assert pinned.requests == []


# -- agent presets ----------------------------------------------------------------------------


async def test_the_standard_loop_mounts_its_preset_and_records_it(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            handle = await rt.create_agent(session_id="s1")
            agent = handle.agent
            assert list(agent.prompt_sections) == ["preset:standard"]
            # The standard preset restricts nothing: the agent sees every registered tool.
            assert set(agent.tools.names()) == set(rt.tools.names()) >= {"read_file", "write_file", "list_dir"}
            await agent.session.flush()
            assert {"agentPreset": "standard"} in preset_events(await stored_events(rt, "s1"))


async def test_a_preset_is_never_mounted_twice_and_the_callers_mount_wins(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            results = []

            async def caller(ctx):
                results.append(await ctx.get("agentPresets").mount(ctx, "minimal"))

            async def strategy(ctx):
                results.append(await ctx.get("agentPresets").mount(ctx, "standard"))

            rt.dock.register(StrategyLoop(id="double", setup=strategy))
            handle = await rt.create_agent(session_id="s1", loop="double", setup=caller)
            assert results == [True, False]
            agent = handle.agent
            assert set(agent.tools.names()) == {"read_file", "list_dir"}
            assert list(agent.prompt_sections) == ["preset:minimal"]
            # The built-in standard loop also leaves a caller's preset alone.
            other = await rt.create_agent(session_id="s2", setup=caller)
            assert set(other.agent.tools.names()) == {"read_file", "list_dir"}
            await other.agent.session.flush()
            assert {"agentPreset": "standard"} not in preset_events(await stored_events(rt, "s2"))


async def test_mounting_an_unknown_preset_rolls_the_creation_back(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:

            async def strategy(ctx):
                await ctx.get("agentPresets").mount(ctx, "no-such-preset")

            rt.dock.register(StrategyLoop(id="broken", setup=strategy))
            with pytest.raises(UnknownPresetError):
                await rt.create_agent(session_id="s1", loop="broken")
            await assert_nothing_left(rt, "s1")


async def test_minimal_first_narrows_the_tools_until_the_first_tool_call_of_each_turn(home, tmp_path):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            scripted = ScriptedAdapter(
                [
                    Reply(tool_calls=[ToolCall("list_dir", {"path": "."})]),
                    Reply(text="listed"),
                    Reply(text="second turn"),
                ]
            )
            rt.register_adapter("scripted", scripted)
            handle = await rt.create_agent(
                session_id="s1",
                loop="minimal-first",
                cwd=str(tmp_path),
                agent_options={"provider": "scripted", "model": "m"},
            )
            assert await ask(handle.agent, "look around") == "listed"
            assert await ask(handle.agent, "again") == "second turn"
            full = sorted(rt.tools.names())
            assert "write_file" in full
            tools = [sorted(t.name for t in r.tools) for r in scripted.requests]
            assert tools == [
                ["list_dir", "read_file"],
                full,
                ["list_dir", "read_file"],  # a new turn starts minimal again
            ]
            # The agent's own toolset is untouched: only the requests are narrowed.
            assert sorted(handle.agent.tools.names()) == full


# -- configured agents --------------------------------------------------------------------------


async def test_configured_agents_are_created_through_their_loop(home):
    config = {"agents": [{"id": "planner", "sessionId": "p-session", "loop": "pro-loop", "maxTokens": 77}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            fake = FakeDriver("fake")
            rt.register_driver("fake", fake)
            rt.dock.register(StrategyLoop(id="pro-loop", setup=noop, driver="fake"))
            await until(lambda: "planner" in rt.dock.configured)
            assert [(o.session_id, o.loop, o.driver, o.agent_options.max_tokens) for o in fake.created] == [
                ("p-session", "pro-loop", "fake", 77)
            ]
            assert rt.list_agents() == ["p-session"]
            assert rt.dock.configured["planner"].agent is rt.get_agent("p-session")
            assert await ask(rt.get_agent("p-session"), "hi") == "fake: hi"
            assert rt.dock.warnings == []


async def test_configured_agents_on_builtin_loops_start_when_the_runtime_opens(home):
    config = {"agents": [{"id": "flash", "sessionId": "flash-session"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            await until(lambda: "flash" in rt.dock.configured)
            agent = rt.get_agent("flash-session")
            assert await ask(agent, "hi") == "pong: hi"
            await agent.session.flush()
            assert bindings(await stored_events(rt, "flash-session")) == [{"loop": "standard", "driver": "default"}]


async def test_configured_driver_loop_agents_do_not_wait_for_the_default_driver(home):
    config = {
        "defaultDriver": "absent",
        "agents": [
            {"id": "standalone", "sessionId": "driver-session", "loop": "driver-loop"},
            {"id": "waiting", "sessionId": "strategy-session"},
        ],
    }
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            fake = FakeDriver("full")
            rt.dock.register(DriverLoop.from_driver("driver-loop", fake))
            await until(lambda: "standalone" in rt.dock.configured)
            assert [o.session_id for o in fake.created] == ["driver-session"]
            await settled(rt)
            # The strategy agent still waits for the (absent) default driver, quietly.
            assert "waiting" not in rt.dock.configured
            assert rt.dock.warnings == []
            assert rt.list_agents() == ["driver-session"]


async def test_configured_agents_queue_until_their_driver_registers(home):
    config = {"agents": [{"id": "planner", "sessionId": "p-session", "loop": "pro-loop"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            rt.dock.register(StrategyLoop(id="pro-loop", setup=noop, driver="loop2"))
            await settled(rt)
            assert rt.dock.configured == {}
            assert rt.dock.warnings == []
            assert await rt.list_sessions() == []
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            await until(lambda: "planner" in rt.dock.configured)
            assert [(o.session_id, o.loop, o.driver) for o in loop2.created] == [("p-session", "pro-loop", "loop2")]


async def test_configured_strategy_agents_wait_for_the_configured_default_driver(home):
    config = {"defaultDriver": "loop2", "agents": [{"id": "planner", "sessionId": "p-session"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            await settled(rt)
            assert rt.dock.configured == {} and rt.dock.warnings == []
            loop2 = FakeDriver("loop2")
            rt.register_driver("loop2", loop2)
            await until(lambda: "planner" in rt.dock.configured)
            assert [(o.loop, o.driver) for o in loop2.created] == [("standard", "loop2")]


async def test_a_configured_persisted_session_id_is_resumed_not_recreated(home):
    config = {"agents": [{"id": "planner", "sessionId": "p-session", "loop": "fake"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            first = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", first))
            await until(lambda: "planner" in rt.dock.configured)
            assert await ask(rt.get_agent("p-session"), "one") == "fake: one"
            assert len(first.created) == 1 and first.resumed == []

        async with opened(home, config=config) as rt:
            second = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", second))
            await until(lambda: "planner" in rt.dock.configured)
            assert second.created == []
            assert [o.resume_session_id for o in second.resumed] == ["p-session"]
            agent = rt.get_agent("p-session")
            assert await ask(agent, "two") == "fake: two"
            assert [m.text for m in agent.transcript] == ["one", "fake: one", "two", "fake: two"]
            assert rt.dock.warnings == []


async def test_a_configured_resume_session_id_is_resumed(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.dock.register(DriverLoop.from_driver("fake", FakeDriver("fake")))
            await rt.create_agent(session_id="kept", loop="fake")
        config = {"agents": [{"id": "keeper", "resumeSessionId": "kept"}]}
        async with opened(home, config=config) as rt:
            fake = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", fake))
            await until(lambda: "keeper" in rt.dock.configured)
            assert [o.resume_session_id for o in fake.resumed] == ["kept"]


async def test_a_configured_agent_that_fails_gives_one_warning_and_the_runtime_stays_up(home):
    config = {"agents": [{"id": "broken", "sessionId": "broken-session", "provider": "no-such-provider"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            await until(lambda: rt.dock.warnings)
            await settled(rt)
            (warning,) = rt.dock.warnings
            assert "'broken'" in warning and "no-such-provider" in warning
            assert rt.dock.configured == {}
            assert await rt.list_sessions() == []
            handle = await rt.create_agent(session_id="fine")
            assert await ask(handle.agent, "still up?") == "pong: still up?"
            assert len(rt.dock.warnings) == 1


async def test_a_configured_agent_switching_a_persisted_sessions_loop_is_a_warning(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            await rt.create_agent(session_id="p-session")  # bound to standard/default
        config = {"agents": [{"id": "planner", "sessionId": "p-session", "loop": "minimal-first"}]}
        async with opened(home, config=config) as rt:
            await until(lambda: rt.dock.warnings)
            (warning,) = rt.dock.warnings
            assert "'planner'" in warning and "minimal-first" in warning
            assert rt.list_agents() == []


async def test_a_configured_agent_on_a_session_routed_loop_waits_for_that_loop(home):
    config = {"sessionLoops": {"p-session": "fake"}, "agents": [{"id": "planner", "sessionId": "p-session"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            await settled(rt)
            fake = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", fake))
            await until(lambda: "planner" in rt.dock.configured or rt.dock.warnings)
            assert rt.dock.warnings == []
            assert [o.session_id for o in fake.created] == ["p-session"]


async def test_a_configured_persisted_session_waits_for_its_bound_loop(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home) as rt:
            rt.dock.register(DriverLoop.from_driver("fake", FakeDriver("fake")))
            await rt.create_agent(session_id="p-session", loop="fake")
        config = {"agents": [{"id": "planner", "sessionId": "p-session"}]}
        async with opened(home, config=config) as rt:
            await settled(rt)
            fake = FakeDriver("fake")
            rt.dock.register(DriverLoop.from_driver("fake", fake))
            await until(lambda: "planner" in rt.dock.configured or rt.dock.warnings)
            assert rt.dock.warnings == []
            assert [o.resume_session_id for o in fake.resumed] == ["p-session"]


# -- the original's two demos ----------------------------------------------------------------------


async def test_demo_two_strategy_loops_sharing_one_fake_driver(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config={"defaultDriver": "fake"}) as rt:
            calls = []
            fake = FakeDriver("fake")
            rt.register_driver("fake", fake)
            rt.dock.register(
                StrategyLoop(
                    id="loop-a", description="the baseline slot", setup=lambda ctx: calls.append(("loop-a", ctx.agent.id))
                )
            )
            rt.dock.register(
                StrategyLoop(
                    id="loop-b", description="the second slot", setup=lambda ctx: calls.append(("loop-b", ctx.agent.id))
                )
            )
            a = await rt.create_agent(session_id="agent-a", loop="loop-a")
            b = await rt.create_agent(session_id="agent-b", loop="loop-b")
            assert calls == [("loop-a", "agent-a"), ("loop-b", "agent-b")]
            assert [(o.session_id, o.loop, o.driver) for o in fake.created] == [
                ("agent-a", "loop-a", "fake"),
                ("agent-b", "loop-b", "fake"),
            ]
            assert await ask(a.agent, "hi") == "fake: hi"
            assert await ask(b.agent, "hi") == "fake: hi"
            await a.agent.session.flush()
            await b.agent.session.flush()
            assert read_binding(await stored_events(rt, "agent-a")) == Route("loop-a", "fake")
            assert read_binding(await stored_events(rt, "agent-b")) == Route("loop-b", "fake")


async def test_demo_two_independent_fake_driver_loops_in_one_dock(home):
    with trio.fail_after(TIMEOUT):
        async with opened(home, config={"defaultLoop": "loop-x"}) as rt:
            loop_x, loop_y = FakeDriver("loop-x"), FakeDriver("loop-y")
            rt.dock.register(DriverLoop.from_driver("loop-x", loop_x))
            rt.dock.register(DriverLoop.from_driver("loop-y", loop_y))
            a = await rt.create_agent(session_id="agent-a", loop="loop-x")
            b = await rt.create_agent(session_id="agent-b", loop="loop-y")
            assert [o.session_id for o in loop_x.created] == ["agent-a"]
            assert [o.session_id for o in loop_y.created] == ["agent-b"]
            # Two agents, one dock, two different loops, answering at the same time.
            a.agent.followup("hello")
            b.agent.followup("hello")
            await a.agent.wait_idle()
            await b.agent.wait_idle()
            assert a.agent.transcript[-1].text == "loop-x: hello"
            assert b.agent.transcript[-1].text == "loop-y: hello"


async def test_a_configured_agent_without_a_session_id_runs_on_its_own_id_and_comes_back_on_it(home):
    config = {"agents": [{"id": "flash", "loop": "minimal-first"}, {"id": "pro", "sessionId": "pro-1"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            handles = await rt.wait_configured()
            assert set(handles) == {"flash", "pro"}
            assert handles["flash"].agent is rt.get_agent("flash")  # its id is its session id
            assert handles["pro"].agent is rt.get_agent("pro-1")
            assert await ask(rt.get_agent("flash"), "hi") == "pong: hi"
        # after a restart the same entry resumes the same session, on the loop it was bound to
        async with opened(home, config=config) as rt:
            handles = await rt.wait_configured()
            events = await handles["flash"].agent.session.read_events()
            assert read_binding(events) == Route("minimal-first", "default")
            assert [e.type for e in events].count("turn/end") == 1  # the first run's turn is there


async def test_wait_configured_returns_after_a_failure_with_its_warning(home):
    write_session(home, "taken", [(BINDING_EVENT, {BINDING_KEY: {"loop": "standard"}})])
    config = {"agents": [{"id": "taken", "loop": "minimal-first"}, {"id": "fine"}]}
    with trio.fail_after(TIMEOUT):
        async with opened(home, config=config) as rt:
            handles = await rt.wait_configured()
            assert set(handles) == {"fine"}
            assert any("'taken' failed to start" in w and "bound to loop 'standard'" in w
                       for w in rt.dock.warnings), rt.dock.warnings


def test_an_agent_without_a_session_needs_an_id_that_can_be_one():
    with pytest.raises(DockError, match=r"agents\[0\]\.id"):
        parse_config({"agents": [{"id": "has space"}]})
    assert parse_config({"agents": [{"id": "has space", "sessionId": "s-1"}]}).agents[0].id == "has space"
    with pytest.raises(DockError, match="use the same session 'a'"):
        parse_config({"agents": [{"id": "a"}, {"id": "b", "sessionId": "a"}]})
