"""ToolRegistry and AgentTools: registration, scoping, restriction and disposal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopdock.runtime._errors import DuplicateToolError, UnknownToolError
from loopdock.runtime.models._adapter import ToolSpec
from loopdock.runtime.tools import AgentTools, Tool, ToolRegistry


async def _noop(arguments, ctx) -> str:
    return "ok"


def make(name: str, description: str = "") -> Tool:
    return Tool(name, description or f"the {name} tool", {"type": "object"}, _noop)


def registry(*names: str) -> ToolRegistry:
    reg = ToolRegistry()
    for name in names:
        reg.register(make(name))
    return reg


def visible_names(agent: AgentTools) -> list[str]:
    return [tool.name for tool in agent.visible()]


# -- ToolRegistry ---------------------------------------------------------------------


def test_registry_register_get_names_contains():
    reg = ToolRegistry()
    b, a = make("b"), make("a")
    reg.register(b)
    reg.register(a)
    assert reg.get("a") is a
    assert reg.names() == ("a", "b")
    assert "b" in reg
    assert "c" not in reg


def test_registry_duplicate_name_is_refused_and_named():
    reg = registry("read")
    with pytest.raises(DuplicateToolError, match="'read'"):
        reg.register(make("read", "another"))
    assert reg.get("read").description == "the read tool"


def test_registry_get_unknown_names_it_and_lists_registered_sorted():
    reg = registry("zeta", "alpha")
    with pytest.raises(UnknownToolError) as info:
        reg.get("nope")
    message = str(info.value)
    assert "'nope'" in message
    assert "alpha, zeta" in message


def test_registry_disposer_is_idempotent_and_removes_only_its_registration():
    reg = ToolRegistry()
    first = make("t")
    dispose_first = reg.register(first)
    dispose_first()
    assert "t" not in reg
    dispose_first()  # second call: no error, nothing happens

    # The same Tool object registered again is a new registration: the old disposer
    # must not remove it.
    dispose_again = reg.register(first)
    dispose_first()
    assert reg.get("t") is first
    dispose_again()
    assert reg.names() == ()


def test_registry_refuses_non_tools():
    with pytest.raises(TypeError):
        ToolRegistry().register("read_file")  # type: ignore[arg-type]


def test_registries_do_not_share_state():
    one, two = ToolRegistry(), ToolRegistry()
    one.register(make("x"))
    assert "x" not in two
    two.register(make("x"))  # no duplicate across instances


# -- AgentTools: enabled ----------------------------------------------------------------


def test_enabled_none_follows_the_whole_base_registry_live():
    reg = registry("b", "a")
    agent = AgentTools(reg, None)
    assert visible_names(agent) == ["a", "b"]
    reg.register(make("c"))
    assert visible_names(agent) == ["a", "b", "c"]


def test_enabled_selects_a_subset():
    agent = AgentTools(registry("a", "b", "c"), ["c", "a"])
    assert visible_names(agent) == ["a", "c"]
    assert agent.lookup("b") is None


def test_enabled_unknown_name_fails_at_construction():
    with pytest.raises(UnknownToolError, match="'nope'"):
        AgentTools(registry("a"), ["a", "nope"])


def test_enabled_base_tool_unregistered_later_disappears():
    reg = ToolRegistry()
    dispose = reg.register(make("a"))
    agent = AgentTools(reg, ["a"])
    dispose()
    assert agent.visible() == ()
    assert agent.lookup("a") is None


def test_specs_follow_visible_order():
    agent = AgentTools(registry("b", "a"), None)
    assert agent.specs() == (
        ToolSpec("a", "the a tool", {"type": "object"}),
        ToolSpec("b", "the b tool", {"type": "object"}),
    )


# -- AgentTools: scoped registrations -------------------------------------------------


def test_scoped_tool_is_visible_only_to_its_agent():
    reg = registry("a")
    agent, other = AgentTools(reg, None), AgentTools(reg, None)
    mine = make("mine")
    agent.register(mine)
    assert agent.lookup("mine") is mine
    assert visible_names(agent) == ["a", "mine"]
    assert other.lookup("mine") is None
    assert "mine" not in reg


def test_scoped_tool_may_not_shadow_a_base_tool():
    reg = registry("a", "b")
    agent = AgentTools(reg, ["a"])
    with pytest.raises(DuplicateToolError, match="'a'"):
        agent.register(make("a", "shadow"))
    # Not enabled here, still a base name: one name means one tool.
    with pytest.raises(DuplicateToolError, match="'b'"):
        agent.register(make("b", "shadow"))
    assert agent.lookup("a") is reg.get("a")


def test_two_scoped_tools_with_one_name_are_refused():
    agent = AgentTools(ToolRegistry(), None)
    first = make("x")
    agent.register(first)
    with pytest.raises(DuplicateToolError, match="'x'"):
        agent.register(make("x", "second"))
    assert agent.lookup("x") is first


def test_scoped_disposer_is_idempotent_and_exact():
    agent = AgentTools(ToolRegistry(), None)
    tool = make("x")
    dispose = agent.register(tool)
    dispose()
    dispose()
    assert agent.lookup("x") is None
    dispose_again = agent.register(tool)
    dispose()  # stale disposer: must not remove the new registration
    assert agent.lookup("x") is tool
    dispose_again()
    assert agent.visible() == ()


# -- AgentTools: restrictions ---------------------------------------------------------


def test_restrict_allow_and_deny():
    agent = AgentTools(registry("a", "b", "c", "d"), None)
    agent.restrict(allow=["a", "b", "c"], deny=["b"])
    assert visible_names(agent) == ["a", "c"]


def test_restrictions_intersect_and_dispose_individually():
    agent = AgentTools(registry("a", "b", "c", "d"), None)
    lift_first = agent.restrict(allow=["a", "b", "c"])
    lift_second = agent.restrict(allow=["b", "c", "d"])
    lift_deny = agent.restrict(deny=["c"])
    assert visible_names(agent) == ["b"]
    lift_deny()
    assert visible_names(agent) == ["b", "c"]
    lift_first()
    assert visible_names(agent) == ["b", "c", "d"]
    lift_first()  # idempotent: must not lift the other restriction
    assert visible_names(agent) == ["b", "c", "d"]
    lift_second()
    assert visible_names(agent) == ["a", "b", "c", "d"]


def test_equal_restrictions_are_lifted_one_at_a_time():
    agent = AgentTools(registry("a", "b"), None)
    lift_one = agent.restrict(deny=["a"])
    agent.restrict(deny=["a"])
    lift_one()
    lift_one()
    assert visible_names(agent) == ["b"]


def test_restrict_applies_to_scoped_tools_too():
    agent = AgentTools(registry("a"), None)
    agent.register(make("mine"))
    agent.restrict(deny=["mine"])
    assert visible_names(agent) == ["a"]
    assert agent.lookup("mine") is None


@pytest.mark.parametrize(
    "allow, deny", [(["a", "ghost"], ()), (None, ["ghost"]), (["ghost"], ["a"])]
)
def test_restrict_unknown_name_is_refused(allow, deny):
    agent = AgentTools(registry("a", "b"), None)
    with pytest.raises(UnknownToolError, match="'ghost'"):
        agent.restrict(allow=allow, deny=deny)
    # A refused restriction leaves no trace.
    assert visible_names(agent) == ["a", "b"]


def test_restrict_accepts_a_registered_but_not_enabled_base_name():
    agent = AgentTools(registry("a", "b"), ["a"])
    agent.restrict(deny=["b"])
    assert visible_names(agent) == ["a"]


def test_restrict_refuses_a_bare_string():
    agent = AgentTools(registry("a"), None)
    with pytest.raises(TypeError):
        agent.restrict(allow="a")


def test_lookup_of_hidden_or_unknown_tool_returns_none():
    reg = registry("a", "b")
    agent = AgentTools(reg, None)
    agent.restrict(deny=["b"])
    assert agent.lookup("a") is reg.get("a")
    assert agent.lookup("b") is None
    assert agent.lookup("never-registered") is None


def test_dispose_scoped_drops_scoped_tools_and_restrictions_only():
    reg = registry("a", "b")
    agent = AgentTools(reg, None)
    dispose_tool = agent.register(make("mine"))
    agent.restrict(allow=["mine"])
    assert visible_names(agent) == ["mine"]
    agent.dispose_scoped()
    assert visible_names(agent) == ["a", "b"]
    assert reg.names() == ("a", "b")
    dispose_tool()  # a stale disposer after dispose_scoped is harmless
    assert visible_names(agent) == ["a", "b"]
    # The name is free again for a fresh scoped registration.
    agent.register(make("mine"))
    assert visible_names(agent) == ["a", "b", "mine"]


# -- property: any order of restrict / lift ------------------------------------------

BASE = ("a", "b", "c", "d", "e")
_names = st.frozensets(st.sampled_from(BASE))
_restriction = st.tuples(st.none() | _names, _names)
# An operation is either ("add", (allow, deny)) or ("lift", k): lift the k-th (mod
# count) restriction ever added, possibly one already lifted.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _restriction),
        st.tuples(st.just("lift"), st.integers(min_value=0, max_value=20)),
    ),
    max_size=25,
)


@given(ops=_ops)
def test_visible_is_base_intersect_active_allows_minus_active_denies(ops):
    agent = AgentTools(registry(*BASE), None)
    added: list[tuple[frozenset[str] | None, frozenset[str], object]] = []
    active: set[int] = set()
    for op, arg in ops:
        if op == "add":
            allow, deny = arg
            added.append((allow, deny, agent.restrict(allow=allow, deny=deny)))
            active.add(len(added) - 1)
        elif added:
            index = arg % len(added)
            added[index][2]()
            active.discard(index)

        expected = set(BASE)
        for index in active:
            allow, deny, _ = added[index]
            if allow is not None:
                expected &= allow
            expected -= deny
        assert visible_names(agent) == sorted(expected)
        assert [s.name for s in agent.specs()] == sorted(expected)

    agent.dispose_scoped()
    assert visible_names(agent) == list(BASE)


async def test_a_waiter_on_an_agent_s_tools_wakes_when_a_scoped_tool_comes_and_goes():
    import trio
    import trio.testing

    tools = AgentTools(ToolRegistry())
    seen: list[tuple[str, ...]] = []

    async def waiter(predicate) -> None:
        await tools.wait_until(predicate)
        seen.append(tools.names())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, lambda: "late" in tools.names())
            await trio.testing.wait_all_tasks_blocked()
            assert seen == []  # nothing changed yet
            tools.register(make("other"))
            await trio.testing.wait_all_tasks_blocked()
            assert seen == []  # a change, but not the one waited for
            dispose = tools.register(make("late"))
            await trio.testing.wait_all_tasks_blocked()
            assert seen == [("late", "other")]
            nursery.start_soon(waiter, lambda: "late" not in tools.names())
            await trio.testing.wait_all_tasks_blocked()
            dispose()
    assert seen[-1] == ("other",)
