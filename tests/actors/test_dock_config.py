"""Dock config: the original dock's config tests as behaviour, plus what we do better
(unknown keys, duplicate agent ids, both spellings of a key, YAML duplicate keys)."""

from __future__ import annotations

import itertools
import operator
import re
import string
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loopdock.actors.dock._config import (
    MAX_CONFIG_NODES,
    MAX_MESSAGE,
    AgentEntry,
    DockConfig,
    Route,
    config_to_dict,
    load_config,
    parse_config,
)
from loopdock.actors.dock._errors import DockError
from loopdock.runtime._yaml import _StrictLoader

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agents.example.yml"

FULL_AGENT = {
    "id": "flash",
    "sessionId": "flash-session",
    "loop": "standard",
    "driver": "loop2",
    "provider": "deepseek",
    "model": "deepseek-v4-flash",
    "maxTokens": 8192,
    "reasoningEffort": "high",
    "cwd": "/work",
}


def rejects(value: object, message: str) -> DockError:
    """parse_config(value) fails with INVALID_CONFIG and a message starting with ``message``."""
    with pytest.raises(DockError) as info:
        parse_config(value)
    assert info.value.code == "INVALID_CONFIG"
    assert str(info.value).startswith(message), str(info.value)
    return info.value


# --- defaults and normalisation -------------------------------------------------------


@pytest.mark.parametrize("value", [None, {}])
def test_defaults(value):
    config = parse_config(value)
    assert config == DockConfig()
    assert (config.default_loop, config.default_driver) == ("standard", "default")
    assert dict(config.preset_loops) == {} and dict(config.session_loops) == {}
    assert config.agents == () and config.loop_packages == ()


def test_route_maps_accept_string_and_object_forms():
    config = parse_config(
        {
            "presetLoops": {"standard": "standard", "reviewer": {"loop": "minimal-first"}},
            "sessionLoops": {"s-1": {"loop": "loop2.strategy3", "driver": "loop2"}},
        }
    )
    assert dict(config.preset_loops) == {"standard": Route("standard"), "reviewer": Route("minimal-first")}
    # A composite id is just an id: the dot is not parsed into a driver.
    assert dict(config.session_loops) == {"s-1": Route("loop2.strategy3", "loop2")}


def test_route_maps_are_read_only():
    config = parse_config({"presetLoops": {"standard": "standard"}})
    with pytest.raises(TypeError):
        config.preset_loops["other"] = Route("x")  # type: ignore[index]


def test_full_agent_entry_round_trips():
    config = parse_config({"agents": [FULL_AGENT]})
    assert config.agents == (
        AgentEntry(
            id="flash",
            session_id="flash-session",
            loop="standard",
            driver="loop2",
            provider="deepseek",
            model="deepseek-v4-flash",
            max_tokens=8192,
            reasoning_effort="high",
            cwd="/work",
        ),
    )
    assert config_to_dict(config)["agents"] == [FULL_AGENT]
    assert parse_config(config_to_dict(config)) == config


def test_agent_options_gives_only_the_set_model_fields():
    full = parse_config({"agents": [FULL_AGENT]}).agents[0]
    assert full.agent_options() == {
        "provider": "deepseek",
        "model": "deepseek-v4-flash",
        "max_tokens": 8192,
        "reasoning_effort": "high",
    }
    assert AgentEntry(id="a", model="m").agent_options() == {"model": "m"}


def test_snake_case_config_equals_camel_case():
    camel = {
        "defaultLoop": "minimal-first",
        "defaultDriver": "loop2",
        "presetLoops": {"p": "standard"},
        "sessionLoops": {"s": {"loop": "standard", "driver": "loop2"}},
        "loopPackages": ["my_loops:register"],
        "agents": [{"id": "a", "resumeSessionId": "r-1", "maxTokens": 5, "reasoningEffort": "low"}],
    }
    snake = {
        "default_loop": "minimal-first",
        "default_driver": "loop2",
        "preset_loops": {"p": "standard"},
        "session_loops": {"s": {"loop": "standard", "driver": "loop2"}},
        "loop_packages": ["my_loops:register"],
        "agents": [{"id": "a", "resume_session_id": "r-1", "max_tokens": 5, "reasoning_effort": "low"}],
    }
    assert parse_config(snake) == parse_config(camel)
    assert parse_config(camel).agents[0].resume_session_id == "r-1"


def test_empty_sections_mean_none():
    # `agents:` with every entry commented out loads as null.
    config = parse_config({"presetLoops": None, "sessionLoops": None, "agents": None, "loopPackages": None})
    assert config == DockConfig()


# --- malformed configs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "config must be a mapping"),
        ("standard", "config must be a mapping"),
        ({"defaultLoop": ""}, "defaultLoop must be a valid loop id"),
        ({"defaultLoop": None}, "defaultLoop must be a valid loop id"),
        ({"defaultLoop": "Standard"}, "defaultLoop must be a valid loop id"),
        ({"defaultDriver": "bad driver"}, "defaultDriver must be a valid driver name"),
        ({"presetLoops": []}, "presetLoops must be a mapping of routes"),
        ({"presetLoops": {"standard": 1}}, "presetLoops.standard must be a loop id or a mapping"),
        ({"presetLoops": {"standard": {}}}, "presetLoops.standard.loop is required"),
        ({"presetLoops": {"standard": {"driver": "d"}}}, "presetLoops.standard.loop is required"),
        ({"presetLoops": {"standard": {"loop": "-x"}}}, "presetLoops.standard.loop must be a valid loop id"),
        ({"presetLoops": {"standard": "UP"}}, "presetLoops.standard must be a valid loop id"),
        (
            {"sessionLoops": {"s": {"loop": "standard", "driver": "Bad"}}},
            "sessionLoops.s.driver must be a valid driver name",
        ),
        ({"sessionLoops": {"a b": "standard"}}, "sessionLoops key 'a b' must start with a letter or digit"),
        ({"presetLoops": {"": "standard"}}, "presetLoops key must be a non-empty string"),
        ({"agents": {"id": "a"}}, "agents must be a list of agent entries"),
        ({"agents": "flash"}, "agents must be a list of agent entries"),
        ({"agents": ["flash"]}, "agents[0] must be a mapping"),
        ({"agents": [{}]}, "agents[0].id is required"),
        ({"agents": [{"id": ""}]}, "agents[0].id must be a non-empty string"),
        ({"agents": [{"id": 7}]}, "agents[0].id must be a non-empty string"),
        ({"agents": [{"id": "a", "model": None}]}, "agents[0].model must be a non-empty string"),
        ({"agents": [{"id": "a", "cwd": 3}]}, "agents[0].cwd must be a non-empty string"),
        ({"agents": [{"id": "a", "loop": "No"}]}, "agents[0].loop must be a valid loop id"),
        ({"agents": [{"id": "a", "driver": ""}]}, "agents[0].driver must be a valid driver name"),
        ({"agents": [{"id": "a", "sessionId": ""}]}, "agents[0].sessionId must be a non-empty string"),
        ({"agents": [{"id": "a", "sessionId": "has space"}]}, "agents[0].sessionId 'has space' must start"),
        ({"agents": [{"id": "a", "resumeSessionId": None}]}, "agents[0].resumeSessionId must be a non-empty"),
        (
            {"agents": [{"id": "a", "sessionId": "s", "resumeSessionId": "s"}]},
            "agents[0]: sessionId and resumeSessionId are mutually exclusive",
        ),
        ({"loopPackages": "pkg"}, "loopPackages must be a list of import references"),
        ({"loopPackages": ["my loops"]}, "loopPackages[0] must be an import reference"),
        ({"loopPackages": ["pkg:"]}, "loopPackages[0] must be an import reference"),
        ({"loopPackages": [""]}, "loopPackages[0] must be an import reference"),
        ({"loopPackages": ["a", "a"]}, "loopPackages[1] repeats loopPackages[0]"),
    ],
)
def test_malformed_config_is_rejected_with_its_path(value, message):
    rejects(value, message)


@pytest.mark.parametrize("max_tokens", [0, -1, True, False, 1.5, "10", None])
def test_max_tokens_must_be_a_positive_integer(max_tokens):
    agents = [{"id": "a"}, {"id": "b"}, {"id": "c", "maxTokens": max_tokens}]
    rejects({"agents": agents}, f"agents[2].maxTokens must be a positive integer, got {max_tokens!r}")


def test_max_tokens_snake_spelling_is_named_as_written():
    rejects({"agents": [{"id": "a", "max_tokens": 0}]}, "agents[0].max_tokens must be a positive integer")


def test_duplicate_session_identity_names_both_agents_and_the_session():
    # resumeSessionId ?? sessionId is the identity, so the two spellings collide too.
    rejects(
        {"agents": [{"id": "flash", "sessionId": "shared"}, {"id": "pro", "resumeSessionId": "shared"}]},
        "agents 'flash' (agents[0]) and 'pro' (agents[1]) use the same session 'shared'",
    )


def test_agents_without_a_session_never_collide():
    assert len(parse_config({"agents": [{"id": "a"}, {"id": "b"}]}).agents) == 2


def test_duplicate_agent_id_names_the_id_and_both_indexes():
    rejects(
        {"agents": [{"id": "flash"}, {"id": "pro"}, {"id": "flash"}]},
        "agents[2].id 'flash' repeats agents[0].id",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"defaultloop": "x"}, "unknown key defaultloop; known keys: defaultLoop, defaultDriver, presetLoops"),
        ({1: "x"}, "unknown key 1; known keys:"),
        ({"agents": [{"id": "a", "name": "x"}]}, "unknown key agents[0].name; known keys: id, sessionId"),
        (
            {"presetLoops": {"p": {"loop": "x", "model": "m"}}},
            "unknown key presetLoops.p.model; known keys: loop, driver",
        ),
    ],
)
def test_unknown_keys_are_rejected_at_every_level(value, message):
    rejects(value, message)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"defaultLoop": "a", "default_loop": "a"}, "default_loop given twice (as defaultLoop and default_loop)"),
        (
            {"agents": [{"id": "a", "maxTokens": 1, "max_tokens": 1}]},
            "agents[0].max_tokens given twice (as maxTokens and max_tokens)",
        ),
    ],
)
def test_both_spellings_of_one_key_are_rejected(value, message):
    # Even equal values: which one a later edit should change would be ambiguous.
    rejects(value, message)


# --- YAML files ---------------------------------------------------------------------------


def test_example_file_parses():
    config = load_config(EXAMPLE)
    assert (config.default_loop, config.default_driver) == ("standard", "default")
    assert dict(config.preset_loops) == {"standard": Route("standard"), "minimal": Route("minimal-first")}
    assert [(a.id, a.model, a.loop, a.session_id) for a in config.agents] == [
        ("flash", "deepseek-v4-flash", "standard", None),  # its session: its id
        ("pro", "deepseek-v4-pro", "minimal-first", "pro-session"),
    ]
    # No provider in the example: the ping model's default keeps it offline.
    assert all("provider" not in a.agent_options() for a in config.agents)


def load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "dock.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DockError) as info:
        load_config(path)
    assert info.value.code == "INVALID_CONFIG"
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    return str(info.value)


def test_yaml_duplicate_keys_are_refused(tmp_path):
    message = load_error(tmp_path, "defaultLoop: standard\nagents: []\ndefaultLoop: minimal-first\n")
    assert "line 3, column 1: found duplicate key 'defaultLoop' (first given on line 1)" in message


def test_yaml_duplicate_keys_in_a_nested_mapping_are_refused(tmp_path):
    message = load_error(tmp_path, "agents:\n  - id: a\n    model: m1\n    model: m2\n")
    assert "line 4, column 5: found duplicate key 'model'" in message


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    # `<<` then an explicit key is YAML's override idiom, not a duplicate.
    path = tmp_path / "dock.yml"
    text = "presetLoops:\n  p: &r {loop: standard, driver: d1}\n  q:\n    <<: *r\n    driver: d2\n"
    path.write_text(text, encoding="utf-8")
    assert dict(load_config(path).preset_loops) == {"p": Route("standard", "d1"), "q": Route("standard", "d2")}


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    message = load_error(tmp_path, "defaultLoop: standard\nagents: [\n  {id: a\n")
    assert re.search(r"line \d+, column \d+: ", message), message


def test_yaml_syntax_error_line_is_the_bad_line(tmp_path):
    message = load_error(tmp_path, "defaultLoop: standard\npresetLoops:\n  a: b\n c: d\n")
    assert "line 4, column 2" in message, message


def test_config_errors_from_a_file_name_the_file(tmp_path):
    message = load_error(tmp_path, "agents:\n  - id: a\n    maxTokens: 0\n")
    assert message.endswith("agents[0].maxTokens must be a positive integer, got 0")


def test_non_utf8_file_is_a_config_error(tmp_path):
    path = tmp_path / "dock.yml"
    path.write_bytes(b"defaultLoop: \xff\n")
    with pytest.raises(DockError, match=re.escape(str(path))):
        load_config(path)


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.yml"
    with pytest.raises(DockError, match=f"^config file {re.escape(str(path))} not found$") as info:
        load_config(path)
    assert info.value.code == "INVALID_CONFIG"
    assert info.value.__suppress_context__  # no FileNotFoundError chained under it


@pytest.mark.parametrize("text", ["", "# only comments\n", "null\n", "~\n"])
def test_empty_or_null_file_means_defaults(tmp_path, text):
    path = tmp_path / "dock.yml"
    path.write_text(text, encoding="utf-8")
    assert load_config(path) == DockConfig()


# --- properties -------------------------------------------------------------------------------

ID_ORACLE = r"^[a-z0-9][a-z0-9._-]*$"
LOWER_DIGITS = string.ascii_lowercase + string.digits
ALNUM = string.ascii_letters + string.digits


def grammar_text(first: str, rest: str, max_rest: int):
    """What ``[first][rest]{0,max_rest}`` matches, drawn without a regex (many times faster)."""
    return st.builds(operator.add, st.sampled_from(first), st.text(rest, max_size=max_rest))


ids = grammar_text(LOWER_DIGITS, LOWER_DIGITS + "._-", 12)


@given(st.one_of(st.text(max_size=8), ids, st.text(alphabet="aZ0.-_ \n\t/", max_size=6)))
def test_default_loop_accepted_iff_it_matches_the_id_grammar(candidate):
    try:
        config = parse_config({"defaultLoop": candidate})
    except DockError as exc:
        assert exc.code == "INVALID_CONFIG"
        assert re.fullmatch(ID_ORACLE, candidate) is None
    else:
        assert re.fullmatch(ID_ORACLE, candidate) is not None
        assert config.default_loop == candidate


session_ids = grammar_text(ALNUM, ALNUM + "._:@+-", 20)
# Printable text (YAML cannot carry lone surrogates or most control characters).
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=10).filter(
    str.strip
)
routes = st.builds(Route, loop=ids, driver=st.none() | ids)
package_refs = st.from_regex(r"\A[a-z_][a-z0-9_]{0,5}(\.[a-z_][a-z0-9_]{0,5}){0,2}(:[A-Za-z_][A-Za-z0-9_]{0,5})?\Z")


@st.composite
def agent_lists(draw):
    count = draw(st.integers(0, 4))
    agent_ids = draw(st.lists(texts, min_size=count, max_size=count, unique=True))
    sessions = draw(st.lists(session_ids, min_size=count, max_size=count, unique=True))
    agents = []
    for agent_id, session in zip(agent_ids, sessions, strict=True):
        # Each agent gets a distinct session identity, under either spelling, or none: then
        # its id is its session id (so it is drawn as one).
        kind = draw(st.sampled_from(["session", "resume", "none"]))
        agents.append(
            AgentEntry(
                id=session if kind == "none" else agent_id,
                session_id=session if kind == "session" else None,
                resume_session_id=session if kind == "resume" else None,
                loop=draw(st.none() | ids),
                driver=draw(st.none() | ids),
                provider=draw(st.none() | texts),
                model=draw(st.none() | texts),
                max_tokens=draw(st.none() | st.integers(1, 2**40)),
                reasoning_effort=draw(st.none() | texts),
                cwd=draw(st.none() | texts),
            )
        )
    assume(len({agent.id for agent in agents}) == len(agents))
    return tuple(agents)


configs = st.builds(
    DockConfig,
    default_loop=ids,
    default_driver=ids,
    preset_loops=st.dictionaries(texts, routes, max_size=3),
    session_loops=st.dictionaries(session_ids, routes, max_size=3),
    agents=agent_lists(),
    loop_packages=st.lists(package_refs, unique=True, max_size=3).map(tuple),
)


# too_slow is a wall-clock check: on a busy 2-core machine drawing a config can exceed it.
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_random_configs_round_trip_through_config_to_dict(config):
    assert parse_config(config_to_dict(config)) == config


# tmp_path is shared by the examples: each one overwrites the same file.
@settings(suppress_health_check=[*settings().suppress_health_check, HealthCheck.function_scoped_fixture])
@given(config=configs)
def test_random_configs_round_trip_through_a_yaml_file(tmp_path, config):
    path = tmp_path / "dock.yml"
    path.write_text(yaml.safe_dump(config_to_dict(config), allow_unicode=True), encoding="utf-8")
    assert load_config(path) == config


# --- hostile configs: bounded work, bounded messages -------------------------------------

def alias_bomb() -> str:
    """A "billion laughs" in YAML: nine levels of nine aliases, 9**9 strings once expanded.
    The anchors sit in a field that is read after ``defaultLoop``, whose error would
    quote the whole expanded value."""
    lines = ["agents:", '  - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, cur in itertools.pairwise("abcdefghi"):
        lines.append(f"  - &{cur} [{', '.join([f'*{prev}'] * 9)}]")
    lines.append("defaultLoop: *i")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path, monkeypatch):
    bomb = alias_bomb()
    assert 400 <= len(bomb.encode()) <= 512
    path = tmp_path / "dock.yml"
    path.write_text(bomb, encoding="utf-8")

    # Built, it would yield None (defaults, no error); the graph itself stays out of
    # sight (a failing test's traceback would print it, expanded).
    built: list[bool] = []
    monkeypatch.setattr(_StrictLoader, "construct_document", lambda loader, node: built.append(True))
    tracemalloc.start()
    try:
        with pytest.raises(DockError) as info:
            load_config(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert built == []
    message = str(info.value)
    assert info.value.code == "INVALID_CONFIG"
    assert message.startswith(f"{path}: more than {MAX_CONFIG_NODES} values once its aliases are expanded")
    assert len(message) <= len(str(path)) + 200
    assert peak < 5 * 2**20, peak  # the expansion (2 GiB as a repr) never happened


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    message = load_error(tmp_path, "agents: &a [*a]\n")
    assert "an alias inside its own anchor" in message


def test_aliases_within_the_bound_still_work(tmp_path):
    # 3 ** 6 copies of one route: fine, and each is the same route.
    text = "presetLoops:\n  p0: &r0 {loop: standard}\n"
    text += "".join(f"  p{n}: &r{n} [*r{n - 1}, *r{n - 1}, *r{n - 1}]\n" for n in range(1, 7))
    path = tmp_path / "dock.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DockError, match=r"presetLoops\.p1 must be a loop id or a mapping"):
        load_config(path)  # a list is not a route: the error quotes it cut short
    path.write_text(text.replace("[*r0, *r0, *r0]", "*r0"), encoding="utf-8")
    with pytest.raises(DockError) as info:
        load_config(path)
    assert len(str(info.value)) <= MAX_MESSAGE


def test_a_too_deeply_nested_file_is_a_config_error(tmp_path):
    message = load_error(tmp_path, "defaultLoop: " + "[" * 5000 + "]" * 5000 + "\n")
    assert message.endswith("nested too deeply")


def test_an_integer_past_pythons_digit_limit_is_a_config_error(tmp_path):
    message = load_error(tmp_path, "agents: [{id: a, maxTokens: " + "9" * 5000 + "}]\n")
    assert "digits" in message and len(message) <= MAX_MESSAGE


def shared_bomb() -> list:
    """9 ** 6 strings through shared references: a repr of about 4 MB, cheap to hold."""
    value: list = ["lol"] * 9
    for _ in range(5):
        value = [value] * 9
    return value


BIG = "x" * 1_000_000


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"defaultLoop": shared_bomb()}, "defaultLoop"),
        ({"defaultLoop": BIG.upper()}, "defaultLoop"),
        ({"defaultDriver": shared_bomb()}, "defaultDriver"),
        ({"presetLoops": shared_bomb()}, "presetLoops"),
        ({"presetLoops": {"p": shared_bomb()}}, "presetLoops.p"),
        ({"presetLoops": {BIG: 1}}, "presetLoops.xxx"),
        ({"presetLoops": {"p": {"loop": "standard", "driver": shared_bomb()}}}, "presetLoops.p.driver"),
        ({"presetLoops": {"p": {BIG: 1}}}, "unknown key presetLoops.p.xxx"),
        ({"sessionLoops": {1: "standard"}}, "sessionLoops key"),
        ({"sessionLoops": {BIG: "standard"}}, "sessionLoops key"),
        ({"agents": shared_bomb()}, "agents[0]"),
        ({"agents": {"id": shared_bomb()}}, "agents"),
        ({"agents": [{"id": shared_bomb()}]}, "agents[0].id"),
        ({"agents": [{"id": BIG, "sessionId": "s1"}, {"id": BIG, "sessionId": "s2"}]}, "agents[1].id"),
        ({"agents": [{"id": BIG}]}, "agents[0].id"),  # its session id, too long for one
        ({"agents": [{"id": BIG, "sessionId": "s"}, {"id": "b", "sessionId": "s"}]}, "agents "),
        ({"agents": [{"id": "a", "sessionId": shared_bomb()}]}, "agents[0].sessionId"),
        ({"agents": [{"id": "a", "sessionId": BIG}]}, "agents[0].sessionId"),
        ({"agents": [{"id": "a", "maxTokens": shared_bomb()}]}, "agents[0].maxTokens"),
        ({"agents": [{"id": "a", "model": shared_bomb()}]}, "agents[0].model"),
        ({"agents": [{"id": "a", BIG: 1}]}, "unknown key agents[0].xxx"),
        ({"loopPackages": shared_bomb()}, "loopPackages[0]"),
        ({"loopPackages": {"a": shared_bomb()}}, "loopPackages"),
        ({"loopPackages": [f"not {BIG}"]}, "loopPackages[0]"),
        ({"loopPackages": ["a" * 10_000, "a" * 10_000]}, "loopPackages[1]"),
        ({BIG: 1}, "unknown key xxx"),
        ({(1,) * 100_000: 1}, "unknown key (1, 1"),
        ({"agents": [{"id": "a", "maxTokens": -(10**5000)}]}, "agents[0].maxTokens"),
    ],
)
def test_every_config_error_quotes_values_cut_short(config, path):
    message = str(rejects(config, ""))
    assert path in message, message
    assert len(message) <= MAX_MESSAGE, len(message)


# --- MCP servers per agent ---------------------------------------------------------------

MCP_AGENT = {
    "id": "tooled",
    "mcpServers": [
        {"name": "files", "command": ["python", "server.py", "stdio"], "env": {"ROOT": "/srv"}, "timeout": 5},
        {"name": "web", "url": "http://127.0.0.1:8000/mcp", "maxRestarts": 0},
    ],
}


def test_an_agent_s_mcp_servers_reach_its_options_and_round_trip():
    config = parse_config({"agents": [MCP_AGENT]})
    [entry] = config.agents
    files, web = entry.agent_options()["mcp_servers"]
    assert (files.name, files.command, dict(files.env), files.timeout) == ("files", ("python", "server.py", "stdio"),
                                                                           {"ROOT": "/srv"}, 5)  # fmt: skip
    assert (web.name, web.url, web.max_restarts) == ("web", "http://127.0.0.1:8000/mcp", 0)
    assert parse_config(config_to_dict(config)) == config
    assert parse_config({"agents": [{"id": "a", "mcp_servers": MCP_AGENT["mcpServers"]}]}).agents[0].mcp_servers == (
        entry.mcp_servers
    )
    assert "mcp_servers" not in AgentEntry(id="a").agent_options()


@pytest.mark.parametrize(("servers", "message"), [
    ("files", "agents[0].mcpServers must be a list of servers"),
    ([{"name": "x"}], "agents[0].mcpServers[0]: give exactly one of command (a stdio server) or url"),
    ([{"name": "x", "command": ["a"], "shell": True}], "agents[0].mcpServers[0]: unknown key 'shell'"),
    ([{"name": "x", "url": "ftp://h"}], "agents[0].mcpServers[0].url must be an http(s) URL"),
    ([{"name": "x", "url": "http://h"}, {"name": "x", "url": "http://i"}], "agents[0].mcpServers[1].name 'x' repeats"),
])
def test_a_bad_mcp_server_is_a_config_error_with_its_path(servers, message):
    rejects({"agents": [{"id": "a", "mcpServers": servers}]}, message)


# --- approval policy per agent -------------------------------------------------------------


def test_an_agent_s_approval_policy_reaches_its_options_and_round_trips():
    config = parse_config({"agents": [{"id": "careful", "approvals": {"default": "hints", "allowPrograms": ["ls"]}}]})
    [entry] = config.agents
    policy = entry.agent_options()["approvals"]
    assert (policy.default, policy.allow_programs) == ("hints", frozenset({"ls"}))
    assert parse_config(config_to_dict(config)) == config
    assert "approvals" not in AgentEntry(id="a").agent_options()


def test_a_bad_approval_policy_is_a_config_error_with_its_path():
    rejects({"agents": [{"id": "a", "approvals": {"tools": {"shell": "maybe"}}}]},
            "agents[0].approvals.tools.shell must be one of always, never, ask")  # fmt: skip
