"""The ``approvals`` agent option: parsing (errors name the path) and each rule."""

import pytest

from loopdock.runtime import AgentOptions, ApprovalPolicy, InvalidOptionsError
from loopdock.runtime import approval_policy_to_value as to_value
from loopdock.runtime import parse_approval_policy as parse


def rule(policy, tool, arguments=None, *, read_only=False, cwd="."):
    from pathlib import Path

    return policy.decide(tool, arguments or {}, read_only=read_only, cwd=Path(cwd)).rule


def test_no_policy_is_none_and_every_call_runs():
    assert AgentOptions().approvals is None
    assert AgentOptions.from_value({}).approvals is None
    assert rule(ApprovalPolicy(), "shell", {"command": "rm -rf x"}) == "always"


def test_camel_and_snake_keys_read_the_same_policy():
    camel = AgentOptions.from_value({"approvals": {"default": "hints", "allowPrograms": ["ls"], "allowUnder": ["n"]}})
    snake = AgentOptions.from_value({"approvals": {"default": "hints", "allow_programs": ["ls"], "allow_under": ["n"]}})
    assert camel.approvals == snake.approvals
    assert camel.approvals.allow_programs == frozenset({"ls"})
    assert parse(to_value(camel.approvals)) == camel.approvals


def test_per_tool_rules_win_over_the_default():
    policy = parse({"default": "ask", "tools": {"read_file": "always", "shell": "never"}})
    assert rule(policy, "read_file") == "always"
    assert rule(policy, "shell", {"command": "ls"}) == "never"
    assert rule(policy, "write_file") == "ask"


def test_hints_ask_only_for_tools_not_declared_read_only():
    policy = parse({"default": "hints"})
    assert rule(policy, "list_dir", read_only=True) == "always"
    assert rule(policy, "write_file", read_only=False) == "ask"


def test_the_builtin_file_tools_declare_what_they_change():
    from loopdock.runtime.tools import builtin_tools

    assert {t.name: t.read_only for t in builtin_tools()} == {"read_file": True, "write_file": False, "list_dir": True}


def test_shell_asks_unless_the_program_is_allowed():
    policy = parse({"allowPrograms": ["ls", "git"]})
    assert rule(policy, "shell", {"command": "ls -la"}) == "always"
    assert rule(policy, "shell", {"command": "/usr/bin/git status"}) == "always"  # by basename, as the tool
    assert rule(policy, "shell", {"command": "rm -rf ."}) == "ask"
    assert rule(policy, "shell", {"command": "'unbalanced"}) == "ask"
    assert rule(policy, "shell", {}) == "ask"
    # An explicit per-tool ``never`` still wins over the list.
    assert rule(parse({"allowPrograms": ["ls"], "tools": {"shell": "never"}}), "shell", {"command": "ls"}) == "never"


def test_write_file_asks_outside_the_allowed_folders(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "out").symlink_to(tmp_path)
    policy = parse({"allowUnder": ["notes"]})
    assert rule(policy, "write_file", {"path": "notes/a.md"}, cwd=tmp_path) == "always"
    assert rule(policy, "write_file", {"path": "notes/../a.md"}, cwd=tmp_path) == "ask"
    assert rule(policy, "write_file", {"path": "a.md"}, cwd=tmp_path) == "ask"
    assert rule(policy, "write_file", {"path": "notes/out/a.md"}, cwd=tmp_path) == "ask"  # a link out of it
    assert rule(policy, "read_file", {"path": "a.md"}, cwd=tmp_path) == "always"  # only write_file


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ask", "approvals must be a mapping"),
        ({"default": "sometimes"}, "approvals.default must be one of always, never, ask, hints"),
        ({"tools": {"shell": "maybe"}}, "approvals.tools.shell must be one of always, never, ask"),
        ({"tools": ["shell"]}, "approvals.tools must map tool names"),
        ({"allowPrograms": "ls"}, "approvals.allowPrograms must be a list of strings"),
        ({"allowPrograms": ["/bin/ls"]}, "approvals.allowPrograms[0] must be a program name"),
        ({"allowUnder": [""]}, "approvals.allowUnder[0] must be a non-empty string"),
        ({"askMe": True}, "approvals: unknown key 'askMe'"),
    ],
)
def test_bad_policies_name_the_path(value, message):
    with pytest.raises(InvalidOptionsError) as error:
        AgentOptions.from_value({"approvals": value})
    assert message in str(error.value)
