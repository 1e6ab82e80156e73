"""The public face: ``loopdock`` re-exports what a user imports, explicitly, and nothing
changes it by accident."""

import ast
from pathlib import Path

import loopdock

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    "Agent", "AgentActor", "AgentContext", "AgentHandle", "AgentOptions", "AgentReservation", "Bridge",
    "Command", "CommandContext", "CommandResult", "CreateAgentOptions", "DockConfig", "DockError", "Driver",
    "DriverLoop", "DshAgent",
    "ENTER", "Enter", "Event", "FakeDriver", "GC_THRESHOLD", "LiveEvent", "LoopInfo", "LoopdockError",
    "LoopxSettings", "Message", "MessageRefusedError", "ModelAdapter", "ModelRequest", "PreStep", "Preset",
    "ProducerSource", "ReactDriver", "Reject", "Reply", "Reservation", "ResumeAgentOptions",
    "Runtime", "ScriptedAdapter", "SessionHeader", "SessionLog", "Setup", "ShellPolicy", "SkillCatalog",
    "StrategyLoop", "TextBlock", "Tool", "ToolCall", "ToolContext", "Turn", "TurnBody",
    "UserSource", "Verdict", "configure_logging", "create_with_body", "read_binding",
    "resume_with_body", "user_message", "open_cluster",
}


def _reexports() -> set[str]:
    tree = ast.parse((ROOT / "loopdock" / "__init__.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                # ``from x import Name as Name``: the explicit re-export form (PEP 484).
                assert alias.asname == alias.name, f"{alias.name} is imported without 'as {alias.name}'"
                names.add(alias.name)
    return names


def test_the_public_names_are_exactly_the_listed_ones():
    assert _reexports() == PUBLIC


def test_every_public_class_and_function_is_loopdock_code():
    for name in PUBLIC:
        value = getattr(loopdock, name)
        if isinstance(value, type) or callable(value) and hasattr(value, "__code__"):
            assert value.__module__.split(".")[0] in {"loopdock", "actors", "bridge", "runtime"}, (name, value)


def test_the_package_ships_its_type_information():
    for package in ("loopdock", "runtime", "actors", "bridge"):
        assert (ROOT / package / "py.typed").is_file(), package
