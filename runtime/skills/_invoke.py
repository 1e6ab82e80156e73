"""The two ways a skill reaches the model: the ``skill`` tool, and ``/name`` typed by a person.

- The model calls ``skill`` with ``{"name": ...}`` and gets the body as the tool result
  (a ``tool/call`` then its paired ``tool/result`` in the log, as in DSH).
- A person's message starting with ``/name`` keeps its place in the log and is followed
  by a ``user/message`` holding the body, with source
  ``{kind: skill-invocation, name, form: instructions}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

import attrs

from .._errors import ToolError
from .._messages import Message, SkillInvocationSource, UserSource, user_message
from ..models import ToolSpec
from ..tools import Tool, ToolContext
from ._catalog import SkillCatalog

SKILL_TOOL_NAME = "skill"
# The listing in the tool's description is bounded: a huge catalog must not fill the prompt.
MAX_LISTED_SKILLS = 100
MAX_LISTING_CHARS = 8_000
_INVOCATION = re.compile(r"\A\s*/([^\s/]+)(?:\s|\Z)")

_BASE_DESCRIPTION = (
    "Load a skill: returns the skill's instructions (its SKILL.md body) to follow for the "
    "task at hand. Call it with {\"name\": \"<skill name>\"}."
)


def _listing(catalog: SkillCatalog) -> str:
    skills = catalog.list()
    if not skills:
        return "No skills are installed."
    lines = ["Available skills:"]
    size = len(lines[0])
    for skill in skills[:MAX_LISTED_SKILLS]:
        line = f"- {skill.name}: {skill.description}" if skill.description else f"- {skill.name}"
        if size + len(line) + 1 > MAX_LISTING_CHARS:
            break
        lines.append(line)
        size += len(line) + 1
    if len(lines) - 1 < len(skills):
        lines.append(f"(and {len(skills) - (len(lines) - 1)} more)")
    return "\n".join(lines)


@attrs.frozen
class SkillTool(Tool):
    """The ``skill`` tool. Its spec lists the catalog as of its last refresh (the runtime
    refreshes it before every model step), so a skill added on disk shows up in the next
    model request without re-registering anything.

    The listing is built once per catalog generation (a rescan after a change on disk),
    not on every request.
    """

    catalog: SkillCatalog = attrs.field(eq=False, kw_only=True)
    # (catalog generation, spec) of the last listing; a one-slot cache owned by the tool.
    _cached: list[Any] = attrs.field(factory=lambda: [None, None], init=False, eq=False, repr=False)

    @property
    def spec(self) -> ToolSpec:
        generation = self.catalog.generation
        cached = self._cached
        if cached[0] != generation:
            spec = ToolSpec(self.name, f"{self.description}\n\n{_listing(self.catalog)}", self.parameters)
            cached[0], cached[1] = generation, spec
        return cast(ToolSpec, cached[1])


def skill_tool(catalog: SkillCatalog) -> Tool:
    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        if not isinstance(arguments, Mapping):
            raise ToolError("skill: arguments must be an object")
        extra = sorted(set(arguments) - {"name"})
        if extra:
            raise ToolError(f"skill: unexpected argument(s) {', '.join(extra)}; accepted: name")
        name = arguments.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError("skill: argument 'name' must be a non-empty string")
        skill = catalog.get(name)
        if skill is None:
            available = ", ".join(catalog.names()) or "none"
            raise ToolError(f"skill: unknown skill {name!r}; available skills: {available}")
        return skill.body

    return SkillTool(
        name=SKILL_TOOL_NAME,
        description=_BASE_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The skill's name."}},
            "required": ["name"],
            "additionalProperties": False,
        },
        run=run,
        read_only=True,
        catalog=catalog,
    )


def invoked_skill_name(message: Message) -> str | None:
    """The ``name`` of a leading ``/name`` token in a person's message, else None.

    Only ``user``-sourced messages count: automatic messages never invoke skills, and an
    injected skill body (``skill-invocation``) is never expanded again.
    """
    if message.role != "user" or not isinstance(message.source, UserSource):
        return None
    match = _INVOCATION.match(message.text)
    return match.group(1) if match else None


def expand_skill_invocations(message: Message, catalog: SkillCatalog) -> tuple[Message, ...]:
    """``(message, skill message)`` when a person's message starts with ``/name`` of a
    known skill; ``(message,)`` otherwise. The original message is returned unchanged."""
    name = invoked_skill_name(message)
    if name is None:
        return (message,)
    skill = catalog.get(name)
    if skill is None:  # "/etc/hosts is odd" or a typo: an ordinary message
        return (message,)
    return (message, user_message(skill.body, source=SkillInvocationSource(name=skill.name, form="instructions")))
