"""An agent's approval policy (the ``approvals`` agent option): which tool calls run at
once (``always``), which are refused (``never``) and which wait for a person (``ask``).

Wire shape (camelCase or snake_case keys)::

    approvals:
      default: hints          # always (no policy at all) | never | ask | hints
      tools: {shell: ask, read_file: always}
      allowPrograms: [ls, cat]  # shell: these programs run without asking
      allowUnder: [notes]       # write_file: paths under these folders run without asking

A call's rule, first match wins:

1. ``tools[name]`` is ``always`` or ``never``: that.
2. ``shell`` with ``allow_programs`` given: ``always`` when the command's program (its
   first word's basename) is listed, else ``ask``.
3. ``write_file`` with ``allow_under`` given: ``always`` when the path resolves (against
   the agent's cwd, symlinks followed) under one of the folders, else ``ask``.
4. ``tools[name]`` is ``ask``: ``ask``.
5. ``default``; ``hints`` asks for every tool not declared read-only (``Tool.read_only``).

The policy only decides whether a call may *start*: a call that runs is still confined by
the tool itself (the shell's own allow-list, the cwd of file tools).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import attrs

from ._errors import InvalidOptionsError
from ._names import snake

Rule = Literal["always", "never", "ask"]
RULES: tuple[Rule, ...] = ("always", "never", "ask")
DEFAULTS = ("always", "never", "ask", "hints")


@attrs.frozen
class ApprovalVerdict:
    """What the policy says of one call; ``reason`` is shown to the person asked (and,
    for ``never``, to the model)."""

    rule: Rule
    reason: str


def _frozen_rules(value: Mapping[str, Rule]) -> Mapping[str, Rule]:
    return MappingProxyType(dict(value))


@attrs.frozen
class ApprovalPolicy:
    default: str = "always"
    tools: Mapping[str, Rule] = attrs.field(factory=dict, converter=_frozen_rules, hash=False)
    allow_programs: frozenset[str] | None = None
    allow_under: tuple[str, ...] | None = None

    @property
    def reads_files(self) -> bool:
        """True when a ``write_file`` verdict stats the filesystem (run it in a thread)."""
        return self.allow_under is not None

    def decide(self, tool: str, arguments: Mapping[str, Any], *, read_only: bool, cwd: Path) -> ApprovalVerdict:
        rule = self.tools.get(tool)
        if rule in ("always", "never"):
            return ApprovalVerdict(rule, f"the policy says {rule} for {tool}")
        if tool == "shell" and self.allow_programs is not None:
            program = _program(arguments)
            if program is not None and program in self.allow_programs:
                return ApprovalVerdict("always", f"{program} is an allowed program")
            return ApprovalVerdict("ask", f"shell runs {program or 'a command'}, which is not an allowed program")
        if tool == "write_file" and self.allow_under is not None:
            if _under(arguments, cwd, self.allow_under):
                return ApprovalVerdict("always", "the path is under an allowed folder")
            return ApprovalVerdict("ask", "write_file writes outside the allowed folders")
        if rule == "ask":
            return ApprovalVerdict("ask", f"the policy asks before {tool} runs")
        if self.default == "hints":
            if read_only:
                return ApprovalVerdict("always", f"{tool} is declared read-only")
            return ApprovalVerdict("ask", f"{tool} is not declared read-only")
        default: Rule = self.default  # type: ignore[assignment]  # checked by parse_approval_policy
        return ApprovalVerdict(default, f"the policy's default is {default}")


def _program(arguments: Mapping[str, Any]) -> str | None:
    command = arguments.get("command")
    if not isinstance(command, str):
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    return os.path.basename(argv[0]) if argv else None


def _under(arguments: Mapping[str, Any], cwd: Path, folders: tuple[str, ...]) -> bool:
    raw = arguments.get("path")
    if not isinstance(raw, str) or "\x00" in raw:
        return False
    root = cwd.resolve()
    # Followed through symlinks, as write_file itself resolves: a link inside an allowed
    # folder that points out of it is outside.
    target = (root / raw).resolve()
    return any(target.is_relative_to((root / folder).resolve()) for folder in folders)


def _fail(path: str, message: str) -> InvalidOptionsError:
    return InvalidOptionsError(f"{path}{message}")


def _names(value: object, path: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, frozenset, set)):
        raise _fail(path, f" must be a list of strings, got {value!r}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise _fail(f"{path}[{index}]", f" must be a non-empty string, got {item!r}")
    return tuple(value)


def parse_approval_policy(value: object, path: str = "approvals") -> ApprovalPolicy | None:
    """Validate an ``approvals`` option; None (no policy: every call runs) stays None."""
    if value is None or isinstance(value, ApprovalPolicy):
        return value
    if not isinstance(value, Mapping):
        raise _fail(path, f" must be a mapping (default, tools, allowPrograms, allowUnder), got {value!r}")
    known = {f.name for f in attrs.fields(ApprovalPolicy)}
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        name = snake(key) if isinstance(key, str) else key
        if name not in known:
            raise _fail(path, f": unknown key {key!r}; known keys: allowPrograms, allowUnder, default, tools")
        kwargs[name] = item
    default = kwargs.get("default", "always")
    if default not in DEFAULTS:
        raise _fail(f"{path}.default", f" must be one of {', '.join(DEFAULTS)}, got {default!r}")
    tools = kwargs.get("tools", {})
    if not isinstance(tools, Mapping):
        raise _fail(f"{path}.tools", f" must map tool names to always, never or ask, got {tools!r}")
    for tool, rule in tools.items():
        if not isinstance(tool, str) or not tool:
            raise _fail(f"{path}.tools", f": tool names must be non-empty strings, got {tool!r}")
        if rule not in RULES:
            raise _fail(f"{path}.tools.{tool}", f" must be one of always, never, ask, got {rule!r}")
    programs = kwargs.get("allow_programs")
    if programs is not None:
        names = _names(programs, f"{path}.allowPrograms")
        for index, name in enumerate(names):
            if "/" in name:
                raise _fail(f"{path}.allowPrograms[{index}]", f" must be a program name, not a path, got {name!r}")
        kwargs["allow_programs"] = frozenset(names)
    folders = kwargs.get("allow_under")
    if folders is not None:
        kwargs["allow_under"] = _names(folders, f"{path}.allowUnder")
    return ApprovalPolicy(**kwargs)


def approval_policy_to_value(policy: ApprovalPolicy) -> dict[str, Any]:
    """The camelCase shape ``parse_approval_policy`` reads back to an equal policy."""
    value: dict[str, Any] = {"default": policy.default}
    if policy.tools:
        value["tools"] = dict(policy.tools)
    if policy.allow_programs is not None:
        value["allowPrograms"] = sorted(policy.allow_programs)
    if policy.allow_under is not None:
        value["allowUnder"] = list(policy.allow_under)
    return value
