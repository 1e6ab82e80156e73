"""The loop dock's registries and its pure selection rules (no runtime, no I/O).

Ported from the original dock's registry, hub and selection tests; the precedence rules
are also checked with hypothesis against an oracle written from the contract.
"""

from __future__ import annotations

import re

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopdock import LoopdockError
from loopdock.actors.dock import (
    BINDING_EVENT,
    BINDING_KEY,
    DockConfig,
    DockError,
    DriverLoop,
    LoopDock,
    LoopInfo,
    Route,
    StrategyLoop,
    read_binding,
)
from loopdock.actors.dock._loops import check_driver_name, check_loop_id
from loopdock.actors.dock._selection import (
    Selection,
    binding_data,
    newest_selected_preset,
    parse_binding,
    resolve_create,
    resolve_resume,
)
from loopdock.runtime._events import Event

GRAMMAR = r"^[a-z0-9][a-z0-9._-]*$"


def noop_setup(ctx):
    return None


class Driver:
    """The smallest object a driver registry accepts."""

    async def create_agent(self, owner, options):
        raise AssertionError("not called in registry tests")

    async def resume(self, owner, options):
        raise AssertionError("not called in registry tests")


def strategy(id, **fields):
    return StrategyLoop(id=id, setup=noop_setup, **fields)


def driver_loop(id, **fields):
    return DriverLoop.from_driver(id, Driver(), **fields)


@pytest.fixture
def dock():
    # Nothing is queued, so the dock never touches its owner in these tests.
    return LoopDock(owner=None)


def raises_code(code):
    return pytest.raises(DockError, check=lambda e: e.code == code)


# -- errors -------------------------------------------------------------------------------


def test_every_dock_error_derives_from_the_one_base_and_carries_its_code():
    error = DockError("LOOP_SWITCH", "x")
    assert isinstance(error, LoopdockError)
    assert error.code == "LOOP_SWITCH"
    assert str(error) == "x"


# -- loop registry ------------------------------------------------------------------------


def test_registers_and_lists_strategy_and_driver_loops_sorted(dock):
    detach_b = dock.register(driver_loop("beta", label="Beta", description="the second"))
    detach_a = dock.register(strategy("alpha"))
    assert dock.list_loops() == [
        LoopInfo("alpha", "strategy"),
        LoopInfo("beta", "driver", "Beta", "the second"),
    ]
    assert len(dock.list_loops()) == 2
    assert dock.require("alpha").kind == "strategy"
    assert dock.get("beta").kind == "driver"
    assert dock.has("alpha") and dock.has("beta")

    detach_b()
    assert not dock.has("beta")
    detach_b()  # idempotent
    assert [info.id for info in dock.list_loops()] == ["alpha"]
    detach_a()
    assert dock.list_loops() == []


def test_list_gives_only_id_kind_label_and_description(dock):
    dock.register(strategy("pinned", driver="loop2", provider="p", model="m", label="L"))
    (info,) = dock.list_loops()
    assert [f.name for f in attrs.fields(type(info))] == ["id", "kind", "label", "description"]
    assert attrs.asdict(info) == {"id": "pinned", "kind": "strategy", "label": "L", "description": None}


def test_list_is_sorted_by_id_whatever_the_registration_order(dock):
    for id in ["zeta", "a.b", "0x", "m-1", "a_c"]:
        dock.register(strategy(id))
    ids = [info.id for info in dock.list_loops()]
    assert ids == sorted(ids) == ["0x", "a.b", "a_c", "m-1", "zeta"]


def test_a_disposer_removes_only_the_loop_it_registered(dock):
    first = strategy("slot")
    dispose_first = dock.register(first)
    dispose_first()
    second = strategy("slot", label="second")
    dock.register(second)
    dispose_first()  # a stale disposer must not remove the newer loop
    assert dock.get("slot") is second


def test_unregister_returns_whether_something_was_removed(dock):
    dock.register(strategy("alpha"))
    assert dock.unregister("alpha") is True
    assert dock.unregister("alpha") is False
    assert not dock.has("alpha")


@pytest.mark.parametrize("first, second", [("strategy", "driver"), ("driver", "strategy"), ("strategy", "strategy")])
def test_duplicate_loop_ids_are_rejected_across_kinds(dock, first, second):
    make = {"strategy": strategy, "driver": driver_loop}
    original = make[first]("pro")
    dock.register(original)
    with raises_code("DUPLICATE_LOOP") as info:
        dock.register(make[second]("pro"))
    assert "'pro'" in str(info.value)
    assert dock.get("pro") is original


def test_loop_ids_and_driver_names_are_separate_namespaces(dock):
    dock.register(strategy("loop2"))
    dock.register_driver("loop2", Driver())
    assert dock.has("loop2") and dock.has_driver("loop2")


def test_a_composite_slot_id_is_just_an_id(dock):
    loop = strategy("loop2.strategy3", driver="loop2")
    dock.register(loop)
    assert dock.require("loop2.strategy3") is loop
    assert not dock.has("strategy3")


def test_require_unknown_names_the_id_and_lists_the_registered_loops(dock):
    dock.register(strategy("beta"))
    dock.register(driver_loop("alpha"))
    with raises_code("UNKNOWN_LOOP") as info:
        dock.require("missing")
    message = str(info.value)
    assert "'missing'" in message
    assert "alpha, beta" in message


def test_require_on_an_empty_registry_says_none(dock):
    with raises_code("UNKNOWN_LOOP") as info:
        dock.require("missing")
    assert "none" in str(info.value)


@pytest.mark.parametrize("bad", ["not a loop", "Upper", "", "-lead", ".lead", "_lead", "tab\t", "a/b", None, 7])
def test_invalid_loop_ids_are_rejected_everywhere(dock, bad):
    with raises_code("INVALID_LOOP_ID"):
        StrategyLoop(id=bad, setup=noop_setup)
    with raises_code("INVALID_LOOP_ID"):
        DriverLoop.from_driver(bad, Driver())
    for lookup in (dock.has, dock.get, dock.require, dock.unregister):
        with raises_code("INVALID_LOOP_ID"):
            lookup(bad)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: StrategyLoop(id="ok", setup=None), id="strategy-without-setup"),
        pytest.param(lambda: StrategyLoop(id="ok", setup="not callable"), id="strategy-setup-not-callable"),
        pytest.param(lambda: strategy("bad-pin", provider=""), id="empty-provider-pin"),
        pytest.param(lambda: strategy("bad-pin", model=7), id="non-string-model-pin"),
        pytest.param(lambda: strategy("bad-label", label=""), id="empty-label"),
        pytest.param(lambda: strategy("bad-driver", driver="Not A Driver"), id="invalid-driver-name"),
        pytest.param(lambda: DriverLoop(id="ok", create_agent=lambda o, x: None, resume=None), id="driver-without-resume"),
        pytest.param(lambda: DriverLoop.from_driver("ok", object()), id="driver-from-an-object-without-methods"),
        pytest.param(lambda: driver_loop("bad-pin-model", model=7), id="driver-non-string-model-pin"),
        pytest.param(lambda: driver_loop("bad-description", description=""), id="driver-empty-description"),
    ],
)
def test_bad_definitions_are_rejected(build):
    with raises_code("INVALID_LOOP_DEFINITION"):
        build()


@pytest.mark.parametrize("thing", [object(), {"id": "x", "kind": "strategy", "setup": noop_setup}, "standard", None])
def test_register_refuses_anything_but_a_loop_definition(dock, thing):
    with raises_code("INVALID_LOOP_DEFINITION"):
        dock.register(thing)
    assert dock.list_loops() == []


def test_definition_errors_name_the_loop():
    with raises_code("INVALID_LOOP_DEFINITION") as info:
        strategy("bad-pin", provider="")
    assert "bad-pin" in str(info.value)


# -- driver registry ----------------------------------------------------------------------


def test_register_driver_without_a_name_registers_default(dock):
    driver = Driver()
    dock.register_driver(driver)
    assert dock.list_drivers() == ["default"]
    assert dock.has_driver("default")


def test_named_drivers_are_listed_sorted(dock):
    dock.register_driver("loop2", Driver())
    dock.register_driver("loop1", Driver())
    dock.register_driver(Driver())
    assert dock.list_drivers() == ["default", "loop1", "loop2"]


@pytest.mark.parametrize("bad", ["not a valid name", "Loop", "", "-x", None])
def test_driver_names_follow_the_loop_id_grammar(dock, bad):
    with raises_code("INVALID_DRIVER"):
        dock.register_driver(bad, Driver())
    assert dock.list_drivers() == []


class OnlyCreate:
    async def create_agent(self, owner, options):
        pass


class NotCallable:
    create_agent = "x"
    resume = "y"


@pytest.mark.parametrize("driver", [object(), OnlyCreate(), NotCallable()])
def test_a_driver_without_create_and_resume_is_invalid(dock, driver):
    with raises_code("INVALID_DRIVER") as info:
        dock.register_driver("loop1", driver)
    assert "loop1" in str(info.value)
    with raises_code("INVALID_DRIVER"):
        dock.register_driver(driver)
    assert dock.list_drivers() == []


def test_duplicate_driver_names_are_rejected(dock):
    first = Driver()
    dock.register_driver("loop1", first)
    with raises_code("DUPLICATE_DRIVER") as info:
        dock.register_driver("loop1", Driver())
    assert "loop1" in str(info.value)
    dock.register_driver(Driver())
    with raises_code("DUPLICATE_DRIVER"):
        dock.register_driver(Driver())


def test_a_driver_disposer_is_idempotent_and_removes_only_its_own_driver(dock):
    first, second = Driver(), Driver()
    dispose_first = dock.register_driver("loop1", first)
    dispose_first()
    assert not dock.has_driver("loop1")
    dispose_first()
    dock.register_driver("loop1", second)
    dispose_first()  # stale: the name now belongs to another object
    assert dock.has_driver("loop1")
    assert dock._drivers["loop1"] is second


def test_has_driver_checks_the_name(dock):
    with raises_code("INVALID_DRIVER"):
        dock.has_driver("Bad Name")


def test_the_default_driver_is_a_live_setting_falling_back_to_the_config():
    dock = LoopDock(owner=None, config=DockConfig(default_driver="cfg"))
    assert dock.default_driver == "cfg"
    dock.default_driver = "loop2"
    assert dock.default_driver == "loop2"
    dock.default_driver = None
    assert dock.default_driver == "cfg"
    with raises_code("INVALID_DRIVER"):
        dock.default_driver = "Not Valid"
    assert dock.default_driver == "cfg"
    assert LoopDock(owner=None).default_driver == "default"


def test_warnings_are_de_duplicated(dock):
    # A configured agent's failure is reported through this; the same problem is said once.
    dock._warn("configured agent 'x' failed to start: boom")
    dock._warn("configured agent 'x' failed to start: boom")
    dock._warn("configured agent 'y' failed to start: boom")
    assert dock.warnings == [
        "configured agent 'x' failed to start: boom",
        "configured agent 'y' failed to start: boom",
    ]


# -- the id grammar (hypothesis) ----------------------------------------------------------

ids = st.from_regex(re.compile(GRAMMAR[:-1] + r"\Z"), fullmatch=True)
near_ids = st.text(alphabet="az09._-AZ \n\t/:é", max_size=8)


@given(st.one_of(ids, near_ids, st.text(max_size=6)))
def test_check_loop_id_accepts_exactly_the_grammar(candidate):
    valid = re.fullmatch(GRAMMAR, candidate) is not None
    try:
        assert check_loop_id(candidate) == candidate
    except DockError as error:
        assert error.code == "INVALID_LOOP_ID"
        assert not valid, candidate
    else:
        assert valid, candidate


@given(st.one_of(ids, near_ids))
def test_check_driver_name_accepts_exactly_the_grammar(candidate):
    valid = re.fullmatch(GRAMMAR, candidate) is not None
    try:
        check_driver_name(candidate)
    except DockError as error:
        assert error.code == "INVALID_DRIVER"
        assert not valid, candidate
    else:
        assert valid, candidate


@given(st.one_of(st.none(), st.integers(), st.binary(max_size=4), st.lists(ids, max_size=1)))
def test_non_strings_are_never_ids(value):
    with raises_code("INVALID_LOOP_ID"):
        check_loop_id(value)
    with raises_code("INVALID_DRIVER"):
        check_driver_name(value)


def test_a_trailing_newline_is_not_part_of_the_grammar():
    # `$` alone would accept "abc\n"; fullmatch must not.
    with raises_code("INVALID_LOOP_ID"):
        check_loop_id("abc\n")


# -- selection: explicit values --------------------------------------------------------------


def test_selection_validates_both_values():
    assert Selection("loop2.strategy3", "loop2") == Selection(loop="loop2.strategy3", driver="loop2")
    with raises_code("INVALID_LOOP_ID"):
        Selection(loop="Bad Loop")
    with raises_code("INVALID_DRIVER"):
        Selection(driver="bad driver")


CONFIG = DockConfig(
    default_loop="default-loop",
    session_loops={"session-fixed": Route("route-loop")},
    preset_loops={"example-preset": Route("example-loop")},
)


@pytest.mark.parametrize(
    "explicit, session_id, preset, loop, source",
    [
        (Selection("explicit-loop"), "session-1", "example-preset", "explicit-loop", "explicit"),
        (Selection("explicit-loop"), "session-fixed", "example-preset", "explicit-loop", "explicit"),
        (Selection(), "session-fixed", "example-preset", "route-loop", "route"),
        (Selection(), "session-1", "example-preset", "example-loop", "preset"),
        (Selection(), "session-1", None, "default-loop", "default"),
        (Selection(), "session-1", "unmapped-preset", "default-loop", "default"),
    ],
)
def test_create_selection_precedence(explicit, session_id, preset, loop, source):
    decision = resolve_create(explicit, session_id, preset, CONFIG)
    assert (decision.loop, decision.source, decision.driver) == (loop, source, None)


def test_create_carries_an_independent_runtime_driver():
    decision = resolve_create(Selection("strategy-shared", "loop2"), "session-1", None, CONFIG)
    assert (decision.loop, decision.source, decision.driver) == ("strategy-shared", "explicit", "loop2")


def test_a_route_driver_applies_even_when_an_explicit_loop_overrides_the_route_loop():
    config = DockConfig(session_loops={"s": Route("route-loop", "loop2")})
    decision = resolve_create(Selection("mine"), "s", None, config)
    assert (decision.loop, decision.driver) == ("mine", "loop2")


# -- selection: precedence (hypothesis) ------------------------------------------------------

loop_ids = st.sampled_from(["l-explicit", "l-route", "l-preset", "l-default", "l-stored", "shared"])
driver_names = st.sampled_from(["d-explicit", "d-route", "d-preset", "d-stored", "shared"])
maybe_loop = st.none() | loop_ids
maybe_driver = st.none() | driver_names
routes = st.builds(Route, loop_ids, maybe_driver)
maybe_route = st.none() | routes


def first(*values):
    return next((v for v in values if v is not None), None)


@given(
    explicit_loop=maybe_loop,
    explicit_driver=maybe_driver,
    session_route=maybe_route,
    preset_route=maybe_route,
    default_loop=loop_ids,
    with_preset=st.booleans(),
)
def test_create_precedence_is_explicit_route_preset_default_for_loop_and_driver_independently(
    explicit_loop, explicit_driver, session_route, preset_route, default_loop, with_preset
):
    config = DockConfig(
        default_loop=default_loop,
        session_loops={"s": session_route} if session_route else {},
        preset_loops={"p": preset_route} if preset_route else {},
    )
    decision = resolve_create(Selection(explicit_loop, explicit_driver), "s", "p" if with_preset else None, config)
    route = session_route
    preset = preset_route if with_preset else None
    candidates = [
        (explicit_loop, "explicit"),
        (route.loop if route else None, "route"),
        (preset.loop if preset else None, "preset"),
        (default_loop, "default"),
    ]
    expected_loop, expected_source = next(c for c in candidates if c[0] is not None)
    assert decision.loop == expected_loop
    assert decision.source == expected_source
    assert decision.driver == first(
        explicit_driver, route.driver if route else None, preset.driver if preset else None
    )


@given(
    explicit_loop=maybe_loop,
    explicit_driver=maybe_driver,
    session_route=maybe_route,
    preset_route=maybe_route,
    persisted=maybe_route,
    default_loop=loop_ids,
)
def test_resume_raises_loop_switch_exactly_when_a_defined_choice_differs_from_a_defined_binding(
    explicit_loop, explicit_driver, session_route, preset_route, persisted, default_loop
):
    config = DockConfig(
        default_loop=default_loop,
        session_loops={"s": session_route} if session_route else {},
        preset_loops={"p": preset_route} if preset_route else {},
    )
    # The binding is merged field by field over the preset's route; persisted wins.
    stored_loop = first(persisted.loop if persisted else None, preset_route.loop if preset_route else None)
    stored_driver = first(persisted.driver if persisted else None, preset_route.driver if preset_route else None)
    asked_loops = [explicit_loop, session_route.loop if session_route else None]
    asked_drivers = [explicit_driver, session_route.driver if session_route else None]
    switch = any(a is not None and stored_loop is not None and a != stored_loop for a in asked_loops) or any(
        a is not None and stored_driver is not None and a != stored_driver for a in asked_drivers
    )
    explicit = Selection(explicit_loop, explicit_driver)
    if switch:
        with raises_code("LOOP_SWITCH") as info:
            resolve_resume(explicit, "s", persisted, "p", config)
        assert "'s'" in str(info.value)
        return
    decision = resolve_resume(explicit, "s", persisted, "p", config)
    expected_loop = first(*asked_loops, stored_loop, default_loop)
    assert decision.loop == expected_loop
    assert decision.driver == first(*asked_drivers, stored_driver)
    if explicit_loop is not None:
        assert decision.source == "explicit"
    elif session_route is not None:
        assert decision.source == "route"
    elif stored_loop is not None:
        assert decision.source == "persisted"
    else:
        assert decision.source == "default"


def test_resume_recovers_loop_and_driver_from_a_durable_binding():
    decision = resolve_resume(Selection(), "s", Route("strategy-shared", "loop2"), None, CONFIG)
    assert (decision.loop, decision.source, decision.driver) == ("strategy-shared", "persisted", "loop2")


def test_resume_refuses_a_loop_switch_and_a_driver_switch_with_the_same_loop():
    with raises_code("LOOP_SWITCH") as info:
        resolve_resume(Selection("other-loop"), "session-1", Route("persisted-loop"), None, CONFIG)
    assert "persisted-loop" in str(info.value) and "other-loop" in str(info.value)
    with raises_code("LOOP_SWITCH") as info:
        resolve_resume(Selection("strategy-shared", "loop2"), "session-1", Route("strategy-shared", "loop1"), None, CONFIG)
    assert "loop1" in str(info.value) and "loop2" in str(info.value)


def test_resume_maps_the_header_preset_when_no_binding_exists():
    config = DockConfig(preset_loops={"example-preset": Route("example-loop")})
    decision = resolve_resume(Selection(), "session-1", None, "example-preset", config)
    assert (decision.loop, decision.source) == ("example-loop", "persisted")


def test_resume_without_anything_uses_the_default_loop_and_leaves_the_driver_open():
    decision = resolve_resume(Selection(), "session-1", None, None, CONFIG)
    assert (decision.loop, decision.source, decision.driver) == ("default-loop", "default", None)


# -- the durable binding ---------------------------------------------------------------------


def event(seq, data, type=BINDING_EVENT):
    return Event(type, seq, 0, data)


def test_the_binding_is_recorded_on_the_known_event_keeping_the_preset():
    assert BINDING_EVENT == "agent-preset/selected"
    data = binding_data(Route("demo-loop", "loop2"), "standard")
    assert data == {"agentPreset": "standard", BINDING_KEY: {"loop": "demo-loop", "driver": "loop2"}}
    assert BINDING_KEY == "agentLoopDock"
    assert read_binding([event(0, data)]) == Route("demo-loop", "loop2")


def test_a_driver_loop_binding_stores_the_loop_only():
    assert binding_data(Route("pro-loop"), None) == {BINDING_KEY: {"loop": "pro-loop"}}


@pytest.mark.parametrize(
    "value",
    [
        {"loop": "not a loop id"},
        {"loop": ""},
        {"loop": None},
        {},
        {"loop": "ok", "driver": "Bad Driver"},
        {"loop": "ok", "driver": 3},
        "ok",
        ["ok"],
        None,
    ],
)
def test_a_malformed_persisted_binding_degrades_to_none(value):
    assert parse_binding(value) is None
    assert read_binding([event(0, {BINDING_KEY: value})]) is None


def test_read_binding_takes_the_newest_valid_binding_and_skips_malformed_ones():
    events = [
        event(0, {BINDING_KEY: {"loop": "old", "driver": "loop1"}}),
        event(1, {BINDING_KEY: {"loop": "newer"}}),
        event(2, {"agentPreset": "minimal"}),  # a preset change is not a binding
        event(3, {BINDING_KEY: {"loop": "NOT VALID"}}),
        event(4, {BINDING_KEY: {"loop": "fake"}}, type="session/title"),  # not the binding event
    ]
    assert read_binding(events) == Route("newer")
    assert read_binding(events[:1]) == Route("old", "loop1")
    assert read_binding([]) is None


def test_newest_selected_preset_reads_the_newest_preset_event():
    events = [
        event(0, {"agentPreset": "old-preset"}),
        event(1, {"agentPreset": "fake-example-preset"}),
        event(2, {BINDING_KEY: {"loop": "x"}}),
        event(3, {"agentPreset": ""}),
    ]
    assert newest_selected_preset(events) == "fake-example-preset"
    assert newest_selected_preset([]) is None
