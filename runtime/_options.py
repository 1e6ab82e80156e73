"""Agent options: which model, how many tokens, where it works, which tools it sees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ._approval_policy import ApprovalPolicy, parse_approval_policy
from ._errors import InvalidOptionsError
from ._names import snake
from .mcp._spec import McpServerSpec, parse_servers


@attrs.frozen
class AgentOptions:
    """Per-agent settings. Build from a mapping (snake_case or camelCase keys) with
    ``AgentOptions.from_value``; unknown keys and bad values raise InvalidOptionsError.

    ``loop`` and ``driver`` are the loop dock's selection keys; everything else is read
    by the driver.
    """

    provider: str = "ping"
    model: str = "ping-1"
    max_tokens: int = 4096
    reasoning_effort: str | None = None
    cwd: str | None = None
    max_parallel_tool_calls: int = 10
    tools: tuple[str, ...] | None = None  # None: every registered tool
    system_prompt: str | None = None
    loop: str | None = None
    driver: str | None = None
    #: MCP servers mounted as this agent's scoped tools (runtime/mcp; ``loopdock[mcp]``).
    mcp_servers: tuple[McpServerSpec, ...] = ()
    #: Which tool calls wait for a person (runtime._approval_policy); None: all run.
    approvals: ApprovalPolicy | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("provider", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidOptionsError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("max_tokens", "max_parallel_tool_calls"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidOptionsError(f"{name} must be a positive integer, got {value!r}")
        for name in ("reasoning_effort", "cwd", "system_prompt", "loop", "driver"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidOptionsError(f"{name} must be a string, got {value!r}")
        if self.tools is not None and (
            not isinstance(self.tools, tuple) or not all(isinstance(t, str) for t in self.tools)
        ):
            raise InvalidOptionsError(f"tools must be a list of tool names, got {self.tools!r}")

    @classmethod
    def from_value(cls, value: AgentOptions | Mapping[str, Any] | None) -> AgentOptions:
        if value is None:
            return cls()
        if isinstance(value, AgentOptions):
            return value
        if not isinstance(value, Mapping):
            raise InvalidOptionsError(f"agent options must be a mapping, got {value!r}")
        known = {f.name for f in attrs.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, item in value.items():
            name = snake(key) if isinstance(key, str) else key
            if name not in known:
                raise InvalidOptionsError(
                    f"unknown agent option {key!r}; known options: {', '.join(sorted(known))}"
                )
            if name in kwargs:
                raise InvalidOptionsError(f"agent option {key!r} given twice")
            kwargs[name] = item
        if isinstance(kwargs.get("tools"), list):
            kwargs["tools"] = tuple(kwargs["tools"])
        if "mcp_servers" in kwargs:
            kwargs["mcp_servers"] = parse_servers(kwargs["mcp_servers"])
        if "approvals" in kwargs:
            kwargs["approvals"] = parse_approval_policy(kwargs["approvals"])
        return cls(**kwargs)

    def evolve(self, **changes: Any) -> AgentOptions:
        return attrs.evolve(self, **changes)
