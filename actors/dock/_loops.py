"""Loop definitions: ``StrategyLoop`` (a setup on a named driver) and ``DriverLoop``
(a full AgentFactory). Validated when constructed, so a registered loop is always whole.

    StrategyLoop(id="reviewer", setup=reviewer_setup, driver="loop2", model="deepseek-v4-pro")
    DriverLoop(id="planner-executor-critic", create_agent=create, resume=resume)
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs

from .._driver import AgentHandle, CreateAgentOptions, ResumeAgentOptions, Setup
from ._errors import DockError

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def check_loop_id(value: object) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise DockError(
            "INVALID_LOOP_ID", f"invalid loop id {value!r}: expected a non-empty string matching {ID_PATTERN.pattern}"
        )
    return value


def check_driver_name(value: object) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise DockError(
            "INVALID_DRIVER", f"invalid driver name {value!r}: expected a non-empty string matching {ID_PATTERN.pattern}"
        )
    return value


def _definition_error(loop_id: object, message: str) -> DockError:
    return DockError("INVALID_LOOP_DEFINITION", f"loop {loop_id!r}: {message}")


def _optional_text(instance: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _definition_error(instance.id, f"{attribute.name} must be a non-empty string")


def _loop_id(instance: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    check_loop_id(value)


@attrs.frozen
class StrategyLoop:
    """Composes an unpublished agent in ``setup(agent_ctx)`` and runs on a driver.

    ``driver`` prefers a named driver (an explicit runtime choice still wins); ``provider``
    and ``model`` pin the model route (and drop the caller's ``reasoning_effort``).
    """

    id: str = attrs.field(validator=_loop_id)
    setup: Setup = attrs.field()
    label: str | None = attrs.field(default=None, validator=_optional_text)
    description: str | None = attrs.field(default=None, validator=_optional_text)
    driver: str | None = attrs.field(default=None)
    provider: str | None = attrs.field(default=None, validator=_optional_text)
    model: str | None = attrs.field(default=None, validator=_optional_text)
    kind: Literal["strategy"] = attrs.field(default="strategy", init=False)

    @setup.validator
    def _check_setup(self, _: object, value: object) -> None:
        if not callable(value):
            raise _definition_error(self.id, "a strategy loop needs a callable setup(agent_ctx)")

    @driver.validator
    def _check_driver(self, _: object, value: object) -> None:
        if value is not None:
            try:
                check_driver_name(value)
            except DockError:
                raise _definition_error(self.id, f"driver {value!r} is not a valid driver name") from None


@attrs.frozen
class DriverLoop:
    """A full loop: owns the whole publication transaction of its agents."""

    id: str = attrs.field(validator=_loop_id)
    create_agent: Callable[[Any, CreateAgentOptions], Awaitable[AgentHandle]] = attrs.field()
    resume: Callable[[Any, ResumeAgentOptions], Awaitable[AgentHandle]] = attrs.field()
    label: str | None = attrs.field(default=None, validator=_optional_text)
    description: str | None = attrs.field(default=None, validator=_optional_text)
    provider: str | None = attrs.field(default=None, validator=_optional_text)
    model: str | None = attrs.field(default=None, validator=_optional_text)
    kind: Literal["driver"] = attrs.field(default="driver", init=False)

    @create_agent.validator
    @resume.validator
    def _check_callable(self, attribute: attrs.Attribute[Any], value: object) -> None:
        if not callable(value):
            raise _definition_error(self.id, f"a driver loop needs a callable {attribute.name}(owner, options)")

    @classmethod
    def from_driver(cls, id: str, driver: Any, **fields: Any) -> DriverLoop:
        """A driver loop from any object with ``create_agent`` and ``resume`` methods."""
        create: Any = getattr(driver, "create_agent", None)  # checked by the validator
        resume: Any = getattr(driver, "resume", None)
        return cls(id, create, resume, **fields)


Loop = StrategyLoop | DriverLoop


@attrs.frozen
class LoopInfo:
    """What ``list_loops()`` shows of a loop."""

    id: str
    kind: str
    label: str | None = None
    description: str | None = None
