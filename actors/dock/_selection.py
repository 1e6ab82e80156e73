"""Which loop and driver an agent gets, and the durable binding that keeps it there.

Pure functions over values: no registry, no I/O.

Create: loop = explicit > session route > preset route > default loop; the driver is
resolved on its own: explicit > session route > preset route (the registry then falls
back to the loop's own driver and the current default driver).

Resume: the newest valid binding in the session log (merged over the preset route of
the session's effective preset) is the identity. An explicit or routed loop or driver
that differs from it is a LOOP_SWITCH.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from loopdock.runtime import Event

from ._config import DockConfig, Route
from ._errors import DockError
from ._loops import check_driver_name, check_loop_id

BINDING_EVENT = "agent-preset/selected"
BINDING_KEY = "agentLoopDock"

LoopSource = Literal["explicit", "route", "preset", "persisted", "default"]


@attrs.frozen
class Selection:
    """What the caller asked for (both optional), validated."""

    loop: str | None = None
    driver: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.loop is not None:
            check_loop_id(self.loop)
        if self.driver is not None:
            check_driver_name(self.driver)


@attrs.frozen
class Decision:
    loop: str
    source: LoopSource
    driver: str | None = None  # None: the registry picks the loop's or the default driver


def _merge(*routes: Route | None) -> tuple[str | None, str | None]:
    loop = driver = None
    for route in routes:
        if route is not None:
            loop = route.loop if route.loop is not None else loop
            driver = route.driver if route.driver is not None else driver
    return loop, driver


def _first(*pairs: tuple[str | None, LoopSource]) -> tuple[str | None, LoopSource | None]:
    for value, source in pairs:
        if value is not None:
            return value, source
    return None, None


def _loop(default: str, *pairs: tuple[str | None, LoopSource]) -> tuple[str, LoopSource]:
    """The first loop given, else the config's default."""
    loop, source = _first(*pairs)
    if loop is None or source is None:
        return default, "default"
    return loop, source


def resolve_create(
    explicit: Selection, session_id: str, agent_preset: str | None, config: DockConfig
) -> Decision:
    route = config.session_loops.get(session_id)
    preset = config.preset_loops.get(agent_preset) if agent_preset else None
    loop, source = _loop(
        config.default_loop,
        (explicit.loop, "explicit"),
        (route.loop if route else None, "route"),
        (preset.loop if preset else None, "preset"),
    )
    driver, _ = _first(
        (explicit.driver, "explicit"),
        (route.driver if route else None, "route"),
        (preset.driver if preset else None, "preset"),
    )
    return Decision(loop, source, driver)


def resolve_resume(
    explicit: Selection,
    session_id: str,
    persisted: Route | None,
    session_preset: str | None,
    config: DockConfig,
) -> Decision:
    route = config.session_loops.get(session_id)
    preset = config.preset_loops.get(session_preset) if session_preset else None
    stored_loop, stored_driver = _merge(preset, persisted)
    for asked, stored, what in (
        (explicit.loop, stored_loop, "loop"),
        (route.loop if route else None, stored_loop, "loop"),
        (explicit.driver, stored_driver, "driver"),
        (route.driver if route else None, stored_driver, "driver"),
    ):
        if asked is not None and stored is not None and asked != stored:
            raise DockError(
                "LOOP_SWITCH",
                f"session {session_id!r} is bound to {what} {stored!r}; it cannot resume on "
                f"{what} {asked!r} (loop choice is creation-time identity)",
            )
    loop, source = _loop(
        config.default_loop,
        (explicit.loop, "explicit"),
        (route.loop if route else None, "route"),
        (stored_loop, "persisted"),
    )
    driver, _ = _first(
        (explicit.driver, "explicit"),
        (route.driver if route else None, "route"),
        (stored_driver, "persisted"),
    )
    return Decision(loop, source, driver)


def parse_binding(value: Any) -> Route | None:
    """A binding as stored (``{loop, driver?}``), or None if it is malformed."""
    if not isinstance(value, Mapping):
        return None
    try:
        loop = check_loop_id(value.get("loop"))
        driver = value.get("driver")
        return Route(loop, None if driver is None else check_driver_name(driver))
    except DockError:
        return None


def read_binding(events: Sequence[Event]) -> Route | None:
    """The newest valid binding in a session log; malformed ones are skipped."""
    for event in reversed(events):
        if event.type == BINDING_EVENT:
            binding = parse_binding(event.data.get(BINDING_KEY))
            if binding is not None:
                return binding
    return None


def newest_selected_preset(events: Sequence[Event]) -> str | None:
    for event in reversed(events):
        if event.type == BINDING_EVENT:
            preset = event.data.get("agentPreset")
            if isinstance(preset, str) and preset:
                return preset
    return None


def binding_data(binding: Route, agent_preset: str | None) -> dict[str, Any]:
    """The ``agent-preset/selected`` data that records a binding (and keeps the preset)."""
    dock: dict[str, Any] = {"loop": binding.loop}
    if binding.driver is not None:
        dock["driver"] = binding.driver
    data: dict[str, Any] = {BINDING_KEY: dock}
    if agent_preset:
        data["agentPreset"] = agent_preset
    return data
