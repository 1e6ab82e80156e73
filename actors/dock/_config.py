"""The dock's config: which loop each new agent runs on, and which agents start with it.

The YAML shape is the one DSH's JavaScript loop dock reads (camelCase keys); the
snake_case spelling of every key is accepted too, but not both spellings at once::

    defaultLoop: standard            # loop for an agent nothing else routes
    defaultDriver: default           # driver for a strategy loop that names none
    presetLoops: {reviewer: minimal-first}               # agent preset -> route
    sessionLoops: {s-42: {loop: standard, driver: loop2}} # session id -> route
    loopPackages: ["my_loops:LOOPS"]                   # imported; its loops are registered
    providers:                                         # model providers by name
      openrouter: {type: openai-compatible, baseUrl: "https://openrouter.ai/api/v1",
                   apiKeyEnv: OPENROUTER_API_KEY, prices: {some/model: {input: 0.2, output: 0.8}}}
    agents:                                            # session id: sessionId, else id
      - {id: flash, model: deepseek-v4-flash}
      - {id: careful, approvals: {default: hints, allowPrograms: [ls]}}  # see runtime._approval_policy

Unlike that dock, unknown keys and duplicate agent ids are errors, not silently
dropped. Every error is ``DockError("INVALID_CONFIG", ...)`` and names the field path,
e.g. ``agents[2].maxTokens must be a positive integer``.

A config is data from a file anyone may have written, so errors quote values and keys
cut short (``_quote``: a bounded repr whose work is bounded too, as a repr of aliases
repeated in aliases is not), and a YAML file is refused before it is built if its
aliases would expand it past ``MAX_CONFIG_NODES`` (a "billion laughs" of a few hundred
bytes expands to billions of values). Anchors and merge keys stay usable.

``None`` (and so an empty or ``null`` YAML file) means the defaults; an empty section
(``agents:`` with nothing under it) means none, since commenting out every entry of a
section is a common way to switch it off.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from loopdock.runtime import (
    MAX_QUOTE,
    MAX_YAML_NODES,
    ApprovalPolicy,
    InvalidOptionsError,
    InvalidSessionIdError,
    YamlFileError,
    approval_policy_to_value,
    check_session_id,
    load_yaml_file,
    parse_approval_policy,
)
from loopdock.runtime import cut as _cut
from loopdock.runtime import short_repr as _quote
from loopdock.runtime.mcp import McpServerSpec, parse_servers
from loopdock.runtime.models import ANTHROPIC_DEFAULTS, PROVIDER_TYPES, Price, ProviderSpec

from ._errors import DockError
from ._loops import ID_PATTERN

# "package.module" or "package.module:attribute.path"; checked here so a typo fails at
# load time rather than when the dock imports it.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PACKAGE_REF = re.compile(rf"{_NAME}(\.{_NAME})*(:{_NAME}(\.{_NAME})*)?")

#: The most YAML nodes a config file may hold with every alias expanded (an agent entry
#: is about 20).
MAX_CONFIG_NODES = MAX_YAML_NODES
#: The longest error message: a path of long keys plus a quoted value, cut again.
MAX_MESSAGE = 1_000


def _frozen_map(value: Mapping[str, Route]) -> Mapping[str, Route]:
    return types.MappingProxyType(dict(value))


@attrs.frozen
class Route:
    """Where a route sends an agent: a loop, and optionally the driver it runs on."""

    loop: str
    driver: str | None = None


@attrs.frozen
class AgentEntry:
    """A configured agent, started by the dock once its loop and driver are registered."""

    id: str
    session_id: str | None = None
    resume_session_id: str | None = None
    loop: str | None = None
    driver: str | None = None
    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    cwd: str | None = None
    mcp_servers: tuple[McpServerSpec, ...] = ()
    approvals: ApprovalPolicy | None = None

    def agent_options(self) -> dict[str, Any]:
        """The agent options this entry sets (unset ones are left to the defaults)."""
        names = ("provider", "model", "max_tokens", "reasoning_effort")
        options = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.mcp_servers:
            options["mcp_servers"] = self.mcp_servers
        if self.approvals is not None:
            options["approvals"] = self.approvals
        return options


def _entries(value: Iterable[AgentEntry]) -> tuple[AgentEntry, ...]:
    return tuple(value)


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class DockConfig:
    default_loop: str = "standard"
    default_driver: str = "default"
    preset_loops: Mapping[str, Route] = attrs.field(factory=dict, converter=_frozen_map)
    session_loops: Mapping[str, Route] = attrs.field(factory=dict, converter=_frozen_map)
    agents: tuple[AgentEntry, ...] = attrs.field(default=(), converter=_entries)
    loop_packages: tuple[str, ...] = attrs.field(default=(), converter=_names)
    providers: Mapping[str, ProviderSpec] = attrs.field(factory=dict, converter=types.MappingProxyType)


def _error(message: str) -> DockError:
    return DockError("INVALID_CONFIG", _cut(message, MAX_MESSAGE))


def _key(key: object) -> str:
    """A key as written, for a field path; cut like a quoted value."""
    return _cut(key, MAX_QUOTE) if isinstance(key, str) else _quote(key)


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _fields(value: object, path: str, known: tuple[str, ...]) -> dict[str, tuple[Any, str]]:
    """Read a mapping whose keys are ``known`` (camelCase) or their snake_case spellings.

    Returns ``{camel key: (value, path of the key as written)}`` so errors quote what the
    user actually wrote.
    """
    if not isinstance(value, Mapping):
        raise _error(f"{path or 'config'} must be a mapping, got {_quote(value)}")
    spellings = {spelling: camel for camel in known for spelling in (camel, _snake(camel))}
    found: dict[str, tuple[Any, str]] = {}
    for key, item in value.items():
        camel = spellings.get(key) if isinstance(key, str) else None
        where = f"{path}.{_key(key)}" if path else _key(key)
        if camel is None:
            raise _error(f"unknown key {where}; known keys: {', '.join(known)}")
        if camel in found:
            raise _error(f"{where} given twice (as {camel} and {_snake(camel)}); use one spelling")
        found[camel] = (item, where)
    return found


def _text(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _error(f"{path} must be a non-empty string, got {_quote(value)}")
    return value


# The rule of check_loop_id and check_driver_name, checked here: they quote a bad value
# whole in their own messages.


def _loop(value: object, path: str) -> str:
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    raise _error(f"{path} must be a valid loop id (matching {ID_PATTERN.pattern}), got {_quote(value)}")


def _driver(value: object, path: str) -> str:
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    raise _error(f"{path} must be a valid driver name (matching {ID_PATTERN.pattern}), got {_quote(value)}")


def _session(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _error(f"{path} must be a non-empty string, got {_quote(value)}")
    try:  # a string: its message quotes at most MAX_SESSION_ID_LENGTH characters of it
        return check_session_id(value, what=path)
    except InvalidSessionIdError as exc:
        raise _error(str(exc)) from None


def _route(value: object, path: str) -> Route:
    if isinstance(value, str):
        return Route(_loop(value, path))
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a loop id or a mapping {{loop, driver?}}, got {_quote(value)}")
    fields = _fields(value, path, ("loop", "driver"))
    if "loop" not in fields:
        raise _error(f"{path}.loop is required")
    driver = _driver(*fields["driver"]) if "driver" in fields else None
    return Route(_loop(*fields["loop"]), driver)


def _routes(value: object, path: str, *, session_keys: bool) -> dict[str, Route]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a mapping of routes, got {_quote(value)}")
    routes = {}
    for key, item in value.items():
        # Session routes are looked up by session id, so a key that cannot be one is dead.
        name = _session(key, f"{path} key") if session_keys else _text(key, f"{path} key")
        routes[name] = _route(item, f"{path}.{_key(name)}")
    return routes


def _positive_int(value: object, path: str) -> int:
    # bool is an int subclass; `maxTokens: true` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _error(f"{path} must be a positive integer, got {_quote(value)}")
    return value


def _mcp_servers(value: object, path: str) -> tuple[McpServerSpec, ...]:
    try:
        return parse_servers(value, path)
    except InvalidOptionsError as exc:
        raise _error(str(exc)) from None


def _approvals(value: object, path: str) -> ApprovalPolicy | None:
    try:
        return parse_approval_policy(value, path)
    except InvalidOptionsError as exc:
        raise _error(str(exc)) from None


_AGENT_KEYS = (
    "id", "sessionId", "resumeSessionId", "loop", "driver",
    "provider", "model", "maxTokens", "reasoningEffort", "cwd", "mcpServers", "approvals",
)  # fmt: skip
_AGENT_CHECKS = {
    "sessionId": _session,
    "resumeSessionId": _session,
    "loop": _loop,
    "driver": _driver,
    "provider": _text,
    "model": _text,
    "maxTokens": _positive_int,
    "reasoningEffort": _text,
    "cwd": _text,
    "mcpServers": _mcp_servers,
    "approvals": _approvals,
}


def _agent(value: object, path: str) -> AgentEntry:
    fields = _fields(value, path, _AGENT_KEYS)
    if "id" not in fields:
        raise _error(f"{path}.id is required")
    if "sessionId" in fields and "resumeSessionId" in fields:
        raise _error(f"{path}: sessionId and resumeSessionId are mutually exclusive; give one")
    kwargs: dict[str, Any] = {
        _snake(camel): _AGENT_CHECKS[camel](*fields[camel]) for camel in _AGENT_CHECKS if camel in fields
    }
    agent_id = _text(*fields["id"])
    if "sessionId" not in fields and "resumeSessionId" not in fields:
        _session(*fields["id"])  # it is the session id too
    return AgentEntry(id=agent_id, **kwargs)


def _agents(value: object, path: str) -> tuple[AgentEntry, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _error(f"{path} must be a list of agent entries, got {_quote(value)}")
    agents = tuple(_agent(item, f"{path}[{index}]") for index, item in enumerate(value))
    ids: dict[str, int] = {}
    sessions: dict[str, int] = {}
    for index, agent in enumerate(agents):
        if agent.id in ids:
            raise _error(
                f"{path}[{index}].id {_quote(agent.id)} repeats {path}[{ids[agent.id]}].id; agent ids must be unique"
            )
        ids[agent.id] = index
        # Two agents on one session would fight over one log: same identity, same session.
        # An agent naming no session runs on the session of its own id.
        identity = agent.resume_session_id or agent.session_id or agent.id
        if identity in sessions:
            first = agents[sessions[identity]]
            raise _error(
                f"agents {_quote(first.id)} ({path}[{sessions[identity]}]) and {_quote(agent.id)} "
                f"({path}[{index}]) "
                f"use the same session {identity!r}"
            )
        sessions[identity] = index
    return agents


def _packages(value: object, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _error(f"{path} must be a list of import references, got {_quote(value)}")
    seen: dict[str, int] = {}
    for index, ref in enumerate(value):
        if not isinstance(ref, str) or not _PACKAGE_REF.fullmatch(ref):
            raise _error(
                f"{path}[{index}] must be an import reference 'module.path' or "
                f"'module.path:attribute', got {_quote(ref)}"
            )
        if ref in seen:
            raise _error(f"{path}[{index}] repeats {path}[{seen[ref]}] ({_quote(ref)})")
        seen[ref] = index
    return tuple(value)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _number(value: object, path: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise _error(f"{path} must be a number >= 0, got {_quote(value)}")
    return float(value)


def _prices(value: object, path: str) -> dict[str, Price]:
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a mapping of model name to {{input, output}}, got {_quote(value)}")
    prices = {}
    for model, item in value.items():
        where = f"{path}.{_key(model)}"
        fields = _fields(item, where, ("input", "output"))
        for name in ("input", "output"):
            if name not in fields:
                raise _error(f"{where}.{name} is required (US dollars per million tokens)")
        prices[_text(model, f"{path} key")] = Price(_number(*fields["input"]), _number(*fields["output"]))
    return prices


def _provider(name: str, value: object, path: str) -> ProviderSpec:
    if name == "ping":
        raise _error(f"{path}: the provider name 'ping' is built in; choose another")
    fields = _fields(value, path, ("type", "baseUrl", "apiKeyEnv", "prices", "maxAttempts"))
    # A provider named after its wire format needs no type: `openai-compatible: {baseUrl: ...}`.
    kind = _text(*fields["type"]) if "type" in fields else name
    if kind not in PROVIDER_TYPES:
        where = f"{path}.type" if "type" in fields else f"{path} (no type, so its name)"
        raise _error(f"{where} must be one of {', '.join(PROVIDER_TYPES)}, got {_quote(kind)}")
    defaults = ANTHROPIC_DEFAULTS if kind == "anthropic" else {}
    if "baseUrl" not in fields and "base_url" not in defaults:
        raise _error(f"{path}.baseUrl is required")
    base_url = _text(*fields["baseUrl"]) if "baseUrl" in fields else defaults["base_url"]
    if not base_url.startswith(("http://", "https://")):
        raise _error(f"{path}.baseUrl must be an http:// or https:// URL, got {_quote(base_url)}")
    key_env = defaults.get("api_key_env")
    if "apiKeyEnv" in fields:
        key_env, where = fields["apiKeyEnv"]
        # The name of a variable, never a key: a value that is not a name is refused unquoted.
        if not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env):
            raise _error(f"{where} must name an environment variable (like OPENROUTER_API_KEY), not hold the key")
    kwargs: dict[str, Any] = {}
    if "prices" in fields:
        kwargs["prices"] = _prices(*fields["prices"])
    if "maxAttempts" in fields:
        kwargs["max_attempts"] = _positive_int(*fields["maxAttempts"])
    return ProviderSpec(kind, base_url, key_env, **kwargs)  # type: ignore[arg-type]


def _providers(value: object, path: str) -> dict[str, ProviderSpec]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a mapping of provider name to its settings, got {_quote(value)}")
    return {
        _text(name, f"{path} key"): _provider(name, item, f"{path}.{_key(name)}") for name, item in value.items()
    }


def parse_providers(value: object, path: str = "providers") -> dict[str, ProviderSpec]:
    """Validate a ``providers:`` section (the dock config's, or an experiment's)."""
    return _providers(value, path)


def parse_config(value: object) -> DockConfig:
    """Validate a config value (as loaded from YAML or JSON) into a DockConfig."""
    if value is None:
        return DockConfig()
    checks = {
        "defaultLoop": ("default_loop", _loop),
        "defaultDriver": ("default_driver", _driver),
        "presetLoops": ("preset_loops", lambda v, p: _routes(v, p, session_keys=False)),
        "sessionLoops": ("session_loops", lambda v, p: _routes(v, p, session_keys=True)),
        "agents": ("agents", _agents),
        "loopPackages": ("loop_packages", _packages),
        "providers": ("providers", _providers),
    }
    fields = _fields(value, "", tuple(checks))
    kwargs: dict[str, Any] = {name: check(*fields[key]) for key, (name, check) in checks.items() if key in fields}
    return DockConfig(**kwargs)


def _route_to_value(route: Route) -> str | dict[str, str]:
    return route.loop if route.driver is None else {"loop": route.loop, "driver": route.driver}


def config_to_dict(config: DockConfig) -> dict[str, Any]:
    """The camelCase shape ``parse_config`` reads back to an equal config."""
    agents = []
    for agent in config.agents:
        entry = {camel: getattr(agent, _snake(camel)) for camel in _AGENT_KEYS}
        entry["mcpServers"] = [_mcp_to_value(spec) for spec in agent.mcp_servers] or None
        entry["approvals"] = None if agent.approvals is None else approval_policy_to_value(agent.approvals)
        agents.append({key: item for key, item in entry.items() if item is not None})
    return {
        "defaultLoop": config.default_loop,
        "defaultDriver": config.default_driver,
        "presetLoops": {name: _route_to_value(r) for name, r in config.preset_loops.items()},
        "sessionLoops": {name: _route_to_value(r) for name, r in config.session_loops.items()},
        "agents": agents,
        "loopPackages": list(config.loop_packages),
        "providers": {name: _provider_to_value(spec) for name, spec in config.providers.items()},
    }


def _mcp_to_value(spec: McpServerSpec) -> dict[str, Any]:
    value: dict[str, Any] = {"name": spec.name, "timeout": spec.timeout, "maxRestarts": spec.max_restarts,
                             "restartWindow": spec.restart_window}  # fmt: skip
    if spec.command is not None:
        value["command"] = list(spec.command)
    if spec.url is not None:
        value["url"] = spec.url
    if spec.env:
        value["env"] = dict(spec.env)
    if spec.cwd is not None:
        value["cwd"] = spec.cwd
    return value


def _provider_to_value(spec: ProviderSpec) -> dict[str, Any]:
    value: dict[str, Any] = {"type": spec.type, "baseUrl": spec.base_url, "maxAttempts": spec.max_attempts}
    if spec.api_key_env is not None:
        value["apiKeyEnv"] = spec.api_key_env
    if spec.prices:
        value["prices"] = {m: {"input": p.input, "output": p.output} for m, p in spec.prices.items()}
    return value


def load_config(path: str | os.PathLike[str]) -> DockConfig:
    """Read a YAML config file. An empty file, or one holding only ``null``, means defaults."""
    try:
        value = load_yaml_file(path, what="config file")
    except YamlFileError as exc:
        raise _error(str(exc)) from None
    try:
        return parse_config(value)
    except DockError as exc:
        raise _error(f"{os.fspath(path)}: {exc}") from None
