"""An MCP server an agent mounts (``mcp_servers:``): what to start or where to connect."""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from typing import Any

import attrs

from .._errors import InvalidOptionsError
from .._names import snake

#: A server's name prefixes its tools' names (``<server>__<tool>``): model APIs accept
#: only these characters in a tool name, so a dot cannot separate the two.
NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value))


@attrs.frozen
class McpServerSpec:
    """A stdio server (``command``, started under the launcher, stopped with its agent)
    or a streamable HTTP one (``url``). ``timeout``: seconds one call may take;
    ``max_restarts`` in ``restart_window`` seconds, past which its tools answer unavailable."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_env)
    cwd: str | None = None
    timeout: float = 60.0
    max_restarts: int = 3
    restart_window: float = 60.0


def _fail(path: str, message: str) -> InvalidOptionsError:
    return InvalidOptionsError(f"{path}{message}")


def parse_server(value: object, path: str) -> McpServerSpec:
    if isinstance(value, McpServerSpec):
        return value
    if not isinstance(value, Mapping):
        raise _fail(path, f" must be a mapping with a name and a command or url, got {value!r}")
    known = {f.name for f in attrs.fields(McpServerSpec)}
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        name = snake(key) if isinstance(key, str) else key
        if name not in known:
            raise _fail(path, f": unknown key {key!r}; known keys: {', '.join(sorted(known))}")
        kwargs[name] = item
    name = kwargs.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _fail(path, f".name must be 1-32 letters, digits, '_' or '-', got {name!r}")
    command, url = kwargs.get("command"), kwargs.get("url")
    if (command is None) == (url is None):
        raise _fail(path, ": give exactly one of command (a stdio server) or url (streamable HTTP)")
    if command is not None:
        if isinstance(command, str) or not isinstance(command, (list, tuple)) or not command:
            raise _fail(path, f".command must be a non-empty list of arguments, got {command!r}")
        if not all(isinstance(arg, str) for arg in command):
            raise _fail(path, f".command must hold only strings, got {command!r}")
        kwargs["command"] = tuple(command)
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise _fail(path, f".url must be an http(s) URL, got {url!r}")
    env = kwargs.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise _fail(path, f".env must map names to strings, got {env!r}")
    if kwargs.get("cwd") is not None and not isinstance(kwargs["cwd"], str):
        raise _fail(path, f".cwd must be a string, got {kwargs['cwd']!r}")
    for key in ("timeout", "restart_window"):
        item = kwargs.get(key)
        if item is not None and (not isinstance(item, (int, float)) or isinstance(item, bool) or not item > 0):
            raise _fail(path, f".{key} must be a positive number of seconds, got {item!r}")
    item = kwargs.get("max_restarts")
    if item is not None and (not isinstance(item, int) or isinstance(item, bool) or item < 0):
        raise _fail(path, f".max_restarts must be a non-negative integer, got {item!r}")
    return McpServerSpec(**kwargs)


def parse_servers(value: object, path: str = "mcp_servers") -> tuple[McpServerSpec, ...]:
    """Validate an ``mcp_servers`` list; server names must be unique."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _fail(path, f" must be a list of servers, got {value!r}")
    specs = tuple(parse_server(item, f"{path}[{index}]") for index, item in enumerate(value))
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.name in seen:
            raise _fail(f"{path}[{index}]", f".name {spec.name!r} repeats an earlier server's")
        seen.add(spec.name)
    return specs
