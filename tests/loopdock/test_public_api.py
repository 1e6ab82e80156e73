"""The public face: ``loopdock`` re-exports what a user imports, explicitly, and nothing
changes it by accident."""

import ast
from pathlib import Path

import loopdock

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = {
    "Agent", "AgentBusyError", "AgentClosedError", "AgentContext", "AgentHandle", "AgentOptions",
    "AgentPassivatedError", "AgentReactivationError", "PASSIVATE_AFTER",
    "AgentReservation", "Bridge", "BridgeClosedError", "ClusterConfigError", "ClusterRequestError",
    "Approval", "ApprovalClosedError", "ApprovalPolicy",
    "ClusterUnreachableError", "ClusterUrlError", "Command", "CommandContext", "CommandResult",
    "CreateAgentOptions", "DockConfig", "DockError", "Driver", "DriverLoop", "DshAgent",
    "DshAgentClosedError", "DuplicateAdapterError", "DuplicateCommandError", "DuplicateToolError",
    "ENTER", "Enter", "Event", "EventsTrimmedError", "FakeDriver", "GC_THRESHOLD", "HomeInUseError",
    "InvalidCommandError", "InvalidMessageError", "InvalidOptionsError", "InvalidReservationError",
    "InvalidSessionIdError", "LiveEvent", "LoopInfo", "LoopdockError", "LoopxSettings", "Message",
    "MessageRefusedError", "ModelAdapter", "ModelError", "ModelRejectedError", "ModelRequest", "ModelStreamBrokenError", "NoWorkerError",
    "NotServedError", "PortInUseError", "PreStep", "Preset", "ProducerSource", "ReactDriver",
    "RegistryMismatchError", "Reject", "RemoteError", "Reply", "RequestTimeoutError", "Reservation",
    "ResumeAgentOptions", "Runtime", "RuntimeClosedError", "ScriptedAdapter", "SessionClosedError",
    "SessionExistsError", "SessionHeader", "SessionLog", "SessionNotFoundError", "Setup", "SetupError",
    "ShellPolicy", "SkillCatalog", "StoreUnusableError", "StrategyLoop", "SubscriberDroppedError",
    "TextBlock", "Tool", "ToolCall", "ToolContext", "ToolError", "TranscriptNotInMemoryError", "Turn",
    "UnknownAdapterError", "UnknownAgentError", "UnknownCommandError", "UnknownEventTypeError",
    "UnknownHookError", "UnknownPresetError", "UnknownServiceError", "UnknownToolError", "UserSource",
    "Verdict", "configure_logging", "create_with_body", "open_cluster", "read_binding",
    "resume_with_body", "user_message",
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
            assert value.__module__.split(".")[0] == "loopdock", (name, value)


def test_the_package_ships_its_type_information():
    for package in ("loopdock", "runtime", "actors", "bridge"):
        assert (ROOT / package / "py.typed").is_file(), package


# Errors no caller of the public API meets: raised and handled inside loopdock (or only
# shown as a command's one-line message), each with why.
INTERNAL_ERRORS = {
    "_Refused": "a worker's refusal, turned into ClusterRequestError or MessageRefusedError",
    "BadInboxMessageError": "a cluster inbox entry a worker drops",
    "LimitError": "a bridge cap, answered to the peer as an error frame",
    "ProtocolError": "a malformed frame, answered to the peer as an error frame",
    "NoHostError": "a DSH command with no host: MessageRefusedError for the caller",
    "HostCommandError": "a DSH command the host refused: MessageRefusedError for the caller",
    "TokenFileError": "a bad bridge.token, shown by serve and dsh-patch as one line",
    "DshLogError": "an unreadable DSH log, shown by the sessions command",
    "StoreError": "a store commit failure, retried or turned into StoreUnusableError",
    "YamlFileError": "a bad YAML file, raised to callers as DockError or ExperimentError",
    "InvalidSkillError": "a bad SKILL.md, skipped with a warning",
    "LoopxRequestError": "a LoopX CLI call the integration refuses to make",
    "TurnFailedError": "the CLI's exit status for a turn that ended in error",
    "ApprovalPendingError": "the run command's exit status for an agent waiting for a person",
    "GoalBindError": "goal bind's one-line message",
    "InstallError": "dsh-install's one-line message",
    "WorkerStoppedError": "the worker command's one-line message",
    "ExperimentError": "the experiment command's one-line message",
}


def _loopdock_errors() -> dict[str, type]:
    import importlib
    import pkgutil

    errors = {}
    for info in pkgutil.walk_packages(loopdock.__path__, "loopdock."):
        if info.name.endswith("__main__") or ".benchmarks" in info.name:
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an extra's module (coredis) where it is not installed
            assert exc.name in {"coredis"}, exc
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, loopdock.LoopdockError) and value.__module__ == info.name:
                errors[value.__name__] = value
    return errors


def test_every_error_a_user_may_catch_is_public_and_each_code_is_defined_once():
    errors = _loopdock_errors()
    assert "ClusterUnreachableError" in errors and "HomeInUseError" in errors  # the walk sees them
    missing = sorted(name for name in errors if name not in INTERNAL_ERRORS and getattr(loopdock, name, None) is not errors[name])
    assert missing == []
    codes: dict[str, list[str]] = {}
    for name, cls in errors.items():
        if isinstance(cls.__dict__.get("code"), str):  # a class of its own code, not one it inherits
            codes.setdefault(cls.__dict__["code"], []).append(name)
    assert {code: names for code, names in codes.items() if len(names) > 1} == {}
