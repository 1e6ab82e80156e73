"""The ``agentPresets`` service: named bundles of prompt and toolset a setup can mount.

    await agent_ctx.get("agentPresets").mount(agent_ctx, "minimal")

Mounting applies the preset to the unpublished agent (a prompt section, a tool
restriction), records it as the session's effective preset (an ``agent-preset/selected``
event, only when it changes), and never mounts twice on one agent: a caller setup that
mounted first wins. Per-agent state lives in this service instance, keyed by agent id,
and is dropped with the agent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from loopdock.runtime import LoopdockError

from .._agent_context import AgentContext
from ._selection import BINDING_EVENT, newest_selected_preset


class UnknownPresetError(LoopdockError):
    """Raised when mounting a preset id that is not registered."""

    code = "UNKNOWN_PRESET"


@attrs.frozen
class Preset:
    id: str
    prompt: str | None = None
    allow_tools: tuple[str, ...] | None = None  # None: every tool
    deny_tools: tuple[str, ...] = ()


MINIMAL_TOOLS = ("read_file", "list_dir")

BUILTIN_PRESETS = (
    Preset("standard", "Use the tools whenever they help; prefer doing over describing."),
    Preset(
        "minimal",
        "Work with the smallest toolset that can do the job.",
        allow_tools=MINIMAL_TOOLS,
    ),
)


class AgentPresets:
    def __init__(self, presets: Iterable[Preset] = BUILTIN_PRESETS) -> None:
        self._presets = {p.id: p for p in presets}
        self._mounted: dict[str, str] = {}  # agent id -> mounted preset id

    def register(self, preset: Preset) -> Callable[[], None]:
        if preset.id in self._presets:
            raise LoopdockError(f"preset {preset.id!r} is already registered")
        self._presets[preset.id] = preset

        def dispose() -> None:
            if self._presets.get(preset.id) is preset:
                del self._presets[preset.id]

        return dispose

    def names(self) -> list[str]:
        return sorted(self._presets)

    def mounted(self, ctx: AgentContext) -> str | None:
        return self._mounted.get(ctx.agent.id)

    def composed_preset(self, ctx: AgentContext) -> str | None:
        """The session's effective preset: mounted here, else the newest recorded one,
        else the one the session was created with."""
        return (
            self._mounted.get(ctx.agent.id)
            or newest_selected_preset(ctx.session.retained(BINDING_EVENT))
            or ctx.session.header.agent_preset
        )

    async def mount(self, ctx: AgentContext, preset_id: str) -> bool:
        """Apply ``preset_id`` to the agent; False (and nothing done) if one is mounted."""
        if ctx.agent.id in self._mounted:
            return False
        try:
            preset = self._presets[preset_id]
        except KeyError:
            raise UnknownPresetError(
                f"no preset {preset_id!r}; presets: {', '.join(self.names())}"
            ) from None
        if preset.prompt:
            ctx.add_prompt_section(f"preset:{preset.id}", preset.prompt)
        if preset.allow_tools is not None or preset.deny_tools:
            ctx.tools.restrict(preset.allow_tools, preset.deny_tools)
        if self.composed_preset(ctx) != preset.id:
            ctx.session.append(BINDING_EVENT, {"agentPreset": preset.id})
        self._mounted[ctx.agent.id] = preset.id
        agent_id = ctx.agent.id

        def forget() -> None:
            self._mounted.pop(agent_id, None)

        ctx.defer(forget)
        return True
